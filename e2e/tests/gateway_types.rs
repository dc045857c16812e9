//! `src/gateway/api` is what kopium makes of the Gateway API CRDs of the release
//! `e2e/provision.sh` downloads (GATEWAY_API_VERSION): regenerating must change nothing.
//! `UPDATE_GATEWAY_TYPES=1` rewrites the files, for review in the diff.
//!
//! HTTPRoute's, Gateway's and ListenerSet's types come from the experimental channel, a
//! superset of the standard one: an object that sets an experimental field (a route's
//! `sessionPersistence` or `ExternalAuth`, a listener's `filters`, an address's
//! `routability`) is then either served with it or refused naming it, never served without
//! it.

use std::path::{Path, PathBuf};
use std::process::Command;

use switchyard_e2e::golden;
use switchyard_e2e::kube::tool;

/// (CRD plural, the version the types are of, the channel: the provisioned folder of its
/// CRDs). ReferenceGrant's v1 is served since v1.5.
const KINDS: [(&str, &str, &str); 10] = [
    ("backendtlspolicies", "v1", "gateway-api"),
    ("gatewayclasses", "v1", "gateway-api"),
    ("gateways", "v1", "gateway-api-experimental"),
    ("grpcroutes", "v1", "gateway-api-experimental"),
    ("httproutes", "v1", "gateway-api-experimental"),
    ("listenersets", "v1", "gateway-api-experimental"),
    ("referencegrants", "v1", "gateway-api"),
    ("tcproutes", "v1", "gateway-api"),
    ("tlsroutes", "v1", "gateway-api"),
    ("udproutes", "v1", "gateway-api"),
];

fn api_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../src/gateway/api")
}

/// kopium's output for one CRD, run in the CRDs' folder so that the command it records
/// in the file's header names no path of this machine.
fn generate(crds: &Path, plural: &str, version: &str) -> String {
    let file = format!("gateway.networking.k8s.io_{plural}.yaml");
    let out = Command::new(tool("kopium"))
        .current_dir(crds)
        .args(["-f", &file, "--api-version", version])
        .args(["--derive", "Default", "--derive", "PartialEq"])
        .arg("--smart-derive-elision")
        .output()
        .unwrap_or_else(|e| panic!("cannot run kopium: {e}"));
    assert!(
        out.status.success(),
        "kopium failed on {file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    rustfmt(&out.stdout)
}

/// The code as `cargo fmt` leaves it, so that formatting the tree changes no generated file.
fn rustfmt(code: &[u8]) -> String {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new("rustfmt")
        .args(["--edition", "2024", "--emit", "stdout"])
        .current_dir(api_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run rustfmt: {e}"));
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(code)
        .expect("rustfmt reads the code");
    let out = child.wait_with_output().expect("rustfmt runs");
    assert!(out.status.success(), "rustfmt failed on kopium's output");
    String::from_utf8(out.stdout).expect("rustfmt writes UTF-8")
}

#[test]
fn gateway_api_types_are_what_kopium_makes_of_the_crds() {
    let update = std::env::var_os("UPDATE_GATEWAY_TYPES").is_some();
    for (plural, version, channel) in KINDS {
        let actual = generate(&tool(channel), plural, version);
        let path = api_dir().join(format!("{plural}.rs"));
        if update {
            std::fs::write(&path, &actual)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
            continue;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            expected == actual,
            "{} is stale (rerun with UPDATE_GATEWAY_TYPES=1 to regenerate)\n{}",
            path.display(),
            golden::diff(&expected, &actual)
        );
    }
}
