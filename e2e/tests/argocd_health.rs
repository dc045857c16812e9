//! `docs/argocd/health.lua` and `docs/argocd/httproute-health.lua`, the Argo CD health
//! checks of TrafficRoute and HTTPRoute, run the way Argo CD runs them: a fresh Lua state per object with the object as the global `obj` (nulls are
//! nil, lists are plain tables), the script's returned table read as `{status, message}`.
//! Every case of `health_test.yaml` and `httproute_health_test.yaml` (Argo CD's test
//! format) must pass, in an
//! embedded Lua set up as Argo CD sets up its own, and through Argo CD's own Lua health
//! code (`e2e/argocd-health`, a provisioned tool).

use std::path::{Path, PathBuf};

use mlua::{Lua, LuaOptions, LuaSerdeExt, StdLib, Table};
use serde::Deserialize;
use serde_json::{Value, json};

/// The statuses Argo CD accepts from a health check.
const STATUSES: &[&str] = &["Healthy", "Progressing", "Degraded", "Suspended", "Missing"];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HealthTests {
    tests: Vec<HealthTest>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HealthTest {
    health_status: HealthStatus,
    input_path: String,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
struct HealthStatus {
    status: String,
    message: String,
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/argocd")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn yaml<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// Runs health.lua on `obj` as Argo CD does.
fn health(script: &str, obj: &Value) -> HealthStatus {
    // Argo CD's interpreter (util/lua) opens base, package, table and a reduced os: no
    // string, math or coroutine library (a script that calls string.format fails there).
    let lua =
        Lua::new_with(StdLib::TABLE | StdLib::PACKAGE, LuaOptions::default()).expect("a Lua state");
    let options = mlua::serde::SerializeOptions::new()
        .serialize_none_to_null(false)
        .serialize_unit_to_null(false)
        .set_array_metatable(false);
    let value = lua.to_value_with(obj, options).expect("obj as Lua");
    lua.globals().set("obj", value).expect("set obj");
    let hs: Table = lua
        .load(script)
        .set_name("health.lua")
        .eval()
        .unwrap_or_else(|e| panic!("health.lua failed on {obj}: {e}"));
    HealthStatus {
        status: hs.get("status").expect("hs.status is a string"),
        message: hs
            .get::<Option<String>>("message")
            .expect("hs.message is a string or nil")
            .unwrap_or_default(),
    }
}

/// Each health check with its cases: TrafficRoute's, HTTPRoute's.
const CHECKS: &[(&str, &str)] = &[
    ("health.lua", "health_test.yaml"),
    ("httproute-health.lua", "httproute_health_test.yaml"),
];

#[test]
fn every_case_of_health_test_yaml() {
    let mut failures = Vec::new();
    let mut used = Vec::new();
    println!("\n| fixture | expected | actual |\n| --- | --- | --- |");
    for (script, cases) in CHECKS {
        let script = read(&dir().join(script));
        let tests: HealthTests = yaml(&dir().join(cases));
        assert!(tests.tests.len() >= 4, "{tests:?}");
        failures.extend(failed_cases(&script, &tests));
        used.extend(tests.tests.into_iter().map(|t| t.input_path));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Every fixture is used by a case.
    for entry in std::fs::read_dir(dir().join("testdata")).expect("testdata") {
        let name = entry.expect("an entry").file_name();
        let path = format!("testdata/{}", name.to_string_lossy());
        assert!(used.contains(&path), "{path} is not used by any test file");
    }
}

fn failed_cases(script: &str, tests: &HealthTests) -> Vec<String> {
    let mut failures = Vec::new();
    for test in &tests.tests {
        let obj: Value = yaml(&dir().join(&test.input_path));
        let got = health(script, &obj);
        println!(
            "| `{}` | {}: {} | {}: {} |",
            test.input_path,
            test.health_status.status,
            test.health_status.message,
            got.status,
            got.message
        );
        if got != test.health_status {
            failures.push(format!(
                "{}: expected {:?}, got {got:?}",
                test.input_path, test.health_status
            ));
        }
    }
    failures
}

/// The healthy fixture with its Ready condition set to False for `reason`.
fn not_ready(reason: &str) -> Value {
    let mut obj: Value = yaml(&dir().join("testdata/healthy.yaml"));
    let conditions = obj["status"]["conditions"]
        .as_array_mut()
        .expect("conditions");
    let ready = conditions
        .iter_mut()
        .find(|c| c["type"] == "Ready")
        .expect("a Ready condition");
    ready["status"] = json!("False");
    ready["reason"] = json!(reason);
    ready["message"] = json!(format!("because {reason}"));
    obj
}

#[test]
fn rollout_reasons_progress_and_every_other_reason_degrades() {
    let script = read(&dir().join("health.lua"));
    for reason in [
        "Staging",
        "VerifyingEndpoints",
        "Promoting",
        "VerifyingLive",
        "Draining",
        "Progressing",
    ] {
        let got = health(&script, &not_ready(reason));
        assert_eq!(got.status, "Progressing", "{reason}: {got:?}");
        assert_eq!(got.message, format!("because {reason}"));
    }
    for reason in [
        "ServiceNotFound",
        "PortNotFound",
        "InvalidSpec",
        "Rejected",
        "EnvoyRejected",
        "ProbeDeadlineExceeded",
        "SomethingNew",
    ] {
        let got = health(&script, &not_ready(reason));
        assert_eq!(got.status, "Degraded", "{reason}: {got:?}");
        assert_eq!(got.message, format!("because {reason}"));
    }
}

#[test]
fn odd_objects_still_get_a_status() {
    let script = read(&dir().join("health.lua"));
    let healthy: Value = yaml(&dir().join("testdata/healthy.yaml"));
    let mut cases: Vec<(&str, Value, &str)> = Vec::new();

    // Ready Unknown: still deciding.
    let mut obj = healthy.clone();
    for c in obj["status"]["conditions"]
        .as_array_mut()
        .expect("conditions")
    {
        if c["type"] == "Ready" {
            c["status"] = json!("Unknown");
        }
    }
    cases.push(("Ready Unknown", obj, "Progressing"));
    // A status without conditions (observed, not judged yet).
    let mut obj = healthy.clone();
    obj["status"]["conditions"] = json!([]);
    cases.push(("no conditions", obj, "Progressing"));
    // A status without observedGeneration.
    let mut obj = healthy.clone();
    obj["status"]
        .as_object_mut()
        .expect("status")
        .remove("observedGeneration");
    cases.push(("no observedGeneration", obj, "Progressing"));
    // An explicit null status, as a client may send.
    let mut obj = healthy.clone();
    obj["status"] = Value::Null;
    cases.push(("status: null", obj, "Progressing"));
    // An empty message falls back to the reason.
    let mut obj = not_ready("EnvoyRejected");
    for c in obj["status"]["conditions"]
        .as_array_mut()
        .expect("conditions")
    {
        if c["type"] == "Ready" {
            c["message"] = json!("");
        }
    }
    cases.push(("empty message", obj, "Degraded"));

    for (what, obj, expected) in cases {
        let got = health(&script, &obj);
        assert!(STATUSES.contains(&got.status.as_str()), "{what}: {got:?}");
        assert_eq!(got.status, expected, "{what}: {got:?}");
        assert!(!got.message.is_empty(), "{what}: {got:?}");
        if what == "empty message" {
            assert_eq!(got.message, "EnvoyRejected");
        }
    }
}

/// The ConfigMap key in the README is the one Argo CD looks up for TrafficRoute
/// (`resource.customizations.health.<group>_<kind>`), and the example Application installs
/// the chart into switchyard-system with server-side apply.
#[test]
fn install_docs_match_the_crd() {
    use kube::Resource;
    use switchyard::api::TrafficRoute;
    let key = format!(
        "resource.customizations.health.{}_{}",
        TrafficRoute::group(&()),
        TrafficRoute::kind(&())
    );
    assert_eq!(
        key,
        "resource.customizations.health.switchyard.dev_TrafficRoute"
    );
    let readme = read(&dir().join("README.md"));
    assert!(
        readme.contains(&format!("{key}: |")),
        "README.md lacks {key}"
    );

    // The HTTPRoute check's key, and the condition it reads is the one the controller writes.
    let key = "resource.customizations.health.gateway.networking.k8s.io_HTTPRoute";
    assert!(
        readme.contains(&format!("{key}: |")),
        "README.md lacks {key}"
    );
    let script = read(&dir().join("httproute-health.lua"));
    let served = switchyard::gateway::controller::SERVED;
    assert!(
        script.contains(&format!("local SERVED = \"{served}\"")),
        "httproute-health.lua does not read {served}"
    );

    let app: Value = yaml(&dir().join("application.yaml"));
    assert_eq!(app["kind"], "Application");
    assert_eq!(app["spec"]["source"]["path"], "charts/switchyard");
    assert_eq!(app["spec"]["destination"]["namespace"], "switchyard-system");
    let options = app["spec"]["syncPolicy"]["syncOptions"]
        .as_array()
        .expect("syncOptions");
    assert!(
        options.contains(&json!("ServerSideApply=true")),
        "{options:?}"
    );
}

#[test]
fn argo_cds_own_lua_health_code_agrees_with_every_case() {
    let tool = switchyard_e2e::kube::tool("argocd-health");
    for (script, cases) in CHECKS {
        let out = std::process::Command::new(&tool)
            .arg(dir().join(script))
            .arg(dir().join(cases))
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", tool.display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprintln!("{stdout}");
        assert!(
            out.status.success(),
            "{script}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cases = yaml::<HealthTests>(&dir().join(cases)).tests.len();
        assert_eq!(
            stdout.lines().filter(|l| l.starts_with("ok ")).count(),
            cases,
            "{script}"
        );
    }
}
