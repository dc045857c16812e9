//! Golden files, for every stage of the data flow (like Envoy Gateway's testdata):
//! TrafficRoute + Services → ProxyConfig specs (`tests/resolve_golden.rs`), ProxyConfigs +
//! EndpointSlices → model and standalone files → model (`tests/model_golden.rs`), model →
//! xDS (`tests/translate_golden.rs`). A case is a folder under `tests/golden/<stage>/`;
//! `UPDATE_GOLDEN=1` rewrites what the code produces, for review in the diff.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// `tests/golden/<stage>` of the workspace root.
pub fn stage_dir(stage: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/golden")
        .join(stage)
}

/// The case folders of a stage, sorted.
pub fn cases(stage: &str) -> Vec<String> {
    let dir = stage_dir(stage);
    let mut cases: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    cases.sort();
    cases
}

/// Compares `actual` with the golden file `path`, or writes it under `UPDATE_GOLDEN`.
pub fn check(path: &Path, actual: &str) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, actual)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_default();
    if expected != actual {
        panic!(
            "{} differs (rerun with UPDATE_GOLDEN=1 to accept)\n{}",
            path.display(),
            diff(&expected, actual)
        );
    }
}

/// Every document of a multi-document YAML file, by `kind`.
pub fn documents(path: &Path) -> Vec<(String, serde_json::Value)> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("{}: invalid YAML: {e}", path.display()));
    docs.into_iter()
        .filter(|d| !d.is_null())
        .map(|d| {
            let kind = d["kind"].as_str().unwrap_or_default().to_owned();
            (kind, d)
        })
        .collect()
}

/// The documents of `kind`, deserialized.
pub fn of_kind<T: DeserializeOwned>(docs: &[(String, serde_json::Value)], kind: &str) -> Vec<T> {
    docs.iter()
        .filter(|(k, _)| k == kind)
        .map(|(_, d)| serde_json::from_value(d.clone()).unwrap_or_else(|e| panic!("a {kind}: {e}")))
        .collect()
}

/// YAML, as the golden files hold it.
pub fn to_yaml<T: serde::Serialize>(value: &T) -> String {
    serde_saphyr::to_string(value).unwrap_or_else(|e| panic!("cannot render YAML: {e}"))
}

/// A short diff: the first differing region with a few lines of context.
pub fn diff(expected: &str, actual: &str) -> String {
    let e: Vec<&str> = expected.lines().collect();
    let a: Vec<&str> = actual.lines().collect();
    let prefix = e.iter().zip(&a).take_while(|(x, y)| x == y).count();
    let suffix = e[prefix..]
        .iter()
        .rev()
        .zip(a[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let mut out = String::new();
    let start = prefix.saturating_sub(3);
    let _ = writeln!(out, "@@ line {} @@", prefix + 1);
    for line in &e[start..prefix] {
        let _ = writeln!(out, "  {line}");
    }
    const MAX: usize = 40;
    let removed = &e[prefix..e.len() - suffix];
    let added = &a[prefix..a.len() - suffix];
    for line in removed.iter().take(MAX) {
        let _ = writeln!(out, "- {line}");
    }
    if removed.len() > MAX {
        let _ = writeln!(out, "- ... {} more", removed.len() - MAX);
    }
    for line in added.iter().take(MAX) {
        let _ = writeln!(out, "+ {line}");
    }
    if added.len() > MAX {
        let _ = writeln!(out, "+ ... {} more", added.len() - MAX);
    }
    for line in e[e.len() - suffix..].iter().take(3) {
        let _ = writeln!(out, "  {line}");
    }
    out
}
