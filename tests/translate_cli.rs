//! `switchyard translate`, as a user runs it: each case of `tests/golden/cli/<case>/` runs
//! the binary with the arguments in `args.txt` (paths from the repository root) and gives
//! exactly `stdout.txt`, and `stderr.txt` (the problems, then the exit status).
//! `UPDATE_GOLDEN=1` rewrites them.

use std::process::Command;

use serde_json::{Value, json};

use switchyard_e2e::golden;

const STAGE: &str = "cli";

#[test]
fn translate_prints_what_would_be_served_and_the_problems() {
    let cases = golden::cases(STAGE);
    assert!(cases.len() >= 3, "{cases:?}");
    for case in cases {
        let dir = golden::stage_dir(STAGE).join(&case);
        let args = std::fs::read_to_string(dir.join("args.txt")).expect("args.txt");
        let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .arg("translate")
            .args(args.split_whitespace())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("RUST_BACKTRACE")
            .output()
            .expect("switchyard translate runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = format!(
            "{}exit {}\n",
            String::from_utf8_lossy(&out.stderr),
            out.status.code().unwrap_or(-1)
        );
        golden::check(&dir.join("stdout.txt"), &stdout);
        golden::check(&dir.join("stderr.txt"), &stderr);
    }
}

fn translate(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("translate")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("switchyard translate runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The resources printed, by the short name of their type, without their `"@type"` (a
/// bootstrap's fields are typed: Envoy refuses it there).
fn printed(json: &Value, short: &str) -> Vec<Value> {
    json.as_array()
        .expect("a list")
        .iter()
        .map(|entry| entry["resource"].clone())
        .filter(|r| {
            r["@type"]
                .as_str()
                .is_some_and(|t| t.ends_with(&format!(".{short}")))
        })
        .map(|mut r| {
            r.as_object_mut().map(|r| r.remove("@type"));
            r
        })
        .collect()
}

/// What a user diffs against Envoy's config_dump is what Envoy reads: the printed
/// listeners, clusters, route configuration and endpoints of a case, in a bootstrap that
/// `envoy --mode validate` accepts (a validation without the `Any`s, field names or enum
/// names Envoy knows would fail). The YAML says the same as the JSON.
#[test]
fn envoy_accepts_what_translate_prints() {
    const INPUT: &str = "tests/golden/cli/manifests/input.yaml";
    let json: Value =
        serde_json::from_str(&translate(&["-f", INPUT, "--output", "json"])).expect("JSON");
    let yaml: Value = serde_saphyr::from_str(&translate(&["-f", INPUT])).expect("YAML");
    assert_eq!(yaml, json);

    let routes = printed(&json, "RouteConfiguration");
    assert_eq!(routes.len(), 1);
    let mut listeners = printed(&json, "Listener");
    // The route configuration comes over RDS: inline in one more listener, Envoy checks it.
    listeners.push(json!({
        "name": "routes",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 18001}},
        "filter_chains": [{"filters": [{
            "name": "hcm",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "routes",
                "route_config": routes[0],
                "http_filters": [{"name": "router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                }}],
            },
        }]}],
    }));
    let mut clusters = printed(&json, "Cluster");
    // The EDS clusters' source: ADS, from a cluster that validation never connects to.
    clusters.push(json!({
        "name": "xds",
        "type": "STATIC",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }},
        "load_assignment": {"cluster_name": "xds", "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 18000}},
        }}]}]},
    }));
    // The endpoints come over EDS: each in a static cluster of its own, Envoy checks them.
    for mut assignment in printed(&json, "ClusterLoadAssignment") {
        let name = format!(
            "static-{}",
            assignment["cluster_name"].as_str().expect("a name")
        );
        assignment["cluster_name"] = json!(name);
        clusters.push(json!({"name": name, "type": "STATIC", "load_assignment": assignment}));
    }
    assert!(clusters.len() > 4 && listeners.len() == 4);
    let bootstrap = json!({
        "node": {"id": "translate", "cluster": "translate"},
        "dynamic_resources": {"ads_config": {
            "api_type": "GRPC",
            "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "xds"}}],
        }},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    });
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("bootstrap.json");
    std::fs::write(&path, bootstrap.to_string()).expect("write the bootstrap");
    let out = Command::new(switchyard_e2e::envoy_binary())
        .args(["--mode", "validate", "-c"])
        .arg(&path)
        .output()
        .expect("run envoy");
    assert!(
        out.status.success(),
        "envoy --mode validate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
