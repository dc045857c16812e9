//! Golden tests of the last stage, the translator: `tests/golden/xds/<case>/config.yaml` (a
//! `model::Config`) translates to exactly `tests/golden/xds/<case>/expected.txt` (problems,
//! then every resource rendered readably). Regenerate with
//! `UPDATE_GOLDEN=1 cargo test --test translate_golden` and review the diff.

use std::fmt::Write;
use std::path::PathBuf;

use switchyard::model::Config;
use switchyard::translate::{check_consistency, envoy_json, render, translate};
use switchyard_e2e::golden;

const CASES: &[&str] = &[
    "basic_http",
    "canary_routing",
    "tls_sni_redirect",
    "probes",
    "endpoints_zones",
    "bad_input",
    "redirects_and_segments",
    "gateway_listeners",
    "mirrors_and_backends",
];

fn golden_dir() -> PathBuf {
    golden::stage_dir("xds")
}

fn render_case(config: &Config) -> String {
    let t = translate(config);
    let mut out = String::new();
    let _ = writeln!(out, "# snapshot version {}", t.snapshot.version());
    let _ = writeln!(out, "# problems: {}", t.problems.len());
    for p in &t.problems {
        let _ = writeln!(out, "#   {p}");
    }
    match check_consistency(&t.snapshot) {
        Ok(()) => out.push_str("# consistency: ok\n"),
        Err(e) => {
            let _ = writeln!(out, "# consistency: FAILED\n{e}");
        }
    }
    out.push('\n');
    out.push_str(&render::render_snapshot(&t.snapshot));
    out
}

fn run_case(case: &str) {
    let dir = golden_dir().join(case);
    let yaml = std::fs::read_to_string(dir.join("config.yaml"))
        .unwrap_or_else(|e| panic!("{case}: cannot read config.yaml: {e}"));
    let config: Config = serde_saphyr::from_str(&yaml)
        .unwrap_or_else(|e| panic!("{case}: invalid config.yaml: {e}"));
    let actual = render_case(&config);
    // The rendering, like the translation, must not depend on anything but the input.
    assert_eq!(
        actual,
        render_case(&config),
        "{case}: rendering is not deterministic"
    );

    golden::check(&dir.join("expected.txt"), &actual);
}

macro_rules! golden {
    ($($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                run_case(stringify!($case));
            }
        )*
    };
}

golden!(
    basic_http,
    canary_routing,
    tls_sni_redirect,
    probes,
    endpoints_zones,
    bad_input,
    redirects_and_segments,
    gateway_listeners,
    mirrors_and_backends
);

/// What `switchyard translate` prints (Envoy's JSON) covers every type these cases make:
/// each resource and each `Any` nested in it has its descriptor, and the printing is
/// deterministic.
#[test]
fn every_case_prints_as_envoy_json() {
    for case in CASES {
        let yaml = std::fs::read_to_string(golden_dir().join(case).join("config.yaml"))
            .unwrap_or_else(|e| panic!("{case}: cannot read config.yaml: {e}"));
        let config: Config = serde_saphyr::from_str(&yaml)
            .unwrap_or_else(|e| panic!("{case}: invalid config.yaml: {e}"));
        let snapshot = translate(&config).snapshot;
        let json = envoy_json::snapshot_json(&snapshot)
            .unwrap_or_else(|e| panic!("{case}: {e}"))
            .to_string();
        let again = envoy_json::snapshot_json(&snapshot).map(|j| j.to_string());
        assert_eq!(again.ok(), Some(json), "{case}: not deterministic");
    }
}

#[test]
fn every_case_directory_is_tested() {
    let mut dirs: Vec<String> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    let mut cases: Vec<String> = CASES.iter().map(|c| c.to_string()).collect();
    cases.sort();
    assert_eq!(dirs, cases);
}

#[test]
fn golden_problems_are_what_each_case_is_about() {
    // Guards the intent of the cases, in addition to the exact text.
    let load = |case: &str| -> Config {
        let yaml = std::fs::read_to_string(golden_dir().join(case).join("config.yaml")).unwrap();
        serde_saphyr::from_str(&yaml).unwrap()
    };
    for case in [
        "basic_http",
        "canary_routing",
        "tls_sni_redirect",
        "probes",
        "redirects_and_segments",
    ] {
        assert_eq!(translate(&load(case)).problems, [], "{case}");
    }
    // Only the Gateway listener on a taken port is left out, with its virtual host.
    let gateway: Vec<String> = translate(&load("gateway_listeners"))
        .problems
        .iter()
        .map(|p| p.subject().to_string())
        .collect();
    assert_eq!(
        gateway,
        ["gateway-listener/gw/other/http", "gw/other/http/any"]
    );
    let bad = translate(&load("bad_input"));
    let subjects: Vec<String> = bad
        .problems
        .iter()
        .map(|p| p.subject().to_string())
        .collect();
    for expected in [
        "bad/unknown-cluster",
        "bad/zero-weights",
        "bad/no-backends",
        "bad/missing-secret",
        "bad/regex",
        "later/host-conflict",
        "bad/header-edit",
        "bad/tls-wildcard",
        "bad/slow-cluster",
        "bad/no-hosts",
        "probe/bad-probe",
    ] {
        assert!(
            subjects.iter().any(|s| s == expected),
            "{expected} not reported: {subjects:?}"
        );
    }
    check_consistency(&bad.snapshot).unwrap();
    // A mirror to a cluster the config lacks leaves its virtual host out; the other's
    // mirrors are served.
    let mirrors: Vec<String> = translate(&load("mirrors_and_backends"))
        .problems
        .iter()
        .map(|p| p.subject().to_string())
        .collect();
    assert_eq!(mirrors, ["shop/broken"]);
}
