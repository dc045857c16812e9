//! The Gateway API conformance suite (v1.7.0, `e2e/conformance`, built by
//! `e2e/provision.sh`) against Switchyard on a real node, installed with the chart: the
//! GATEWAY-HTTP, GATEWAY-GRPC, GATEWAY-TLS, GATEWAY-TCP and GATEWAY-UDP profiles in one run:
//! their core features (Gateway, HTTPRoute, GRPCRoute, TLSRoute, TCPRoute, UDPRoute,
//! ReferenceGrant) and the extended ones Switchyard claims ([`FEATURES`]). Its echo
//! backend is imported under the references its manifests name (`e2e/images.sh`); the
//! suite runs inside the node's network namespace and reaches each Gateway at its address.
//!
//! The report it writes must equal `conformance/report.yaml` but for its date: every test
//! that passes, fails or is skipped is listed there. `UPDATE_CONFORMANCE=1` rewrites it.
//! `SWITCHYARD_CONFORMANCE_TESTS=<regex>` runs only the tests it matches (no report
//! compared), with the features of `SWITCHYARD_CONFORMANCE_FEATURES` claimed too; the
//! suite's whole log is copied to `$TMPDIR/switchyard-conformance.log`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use switchyard_e2e::kube::tool;
use switchyard_e2e::node::Node;

/// The features claimed: the core ones of the profiles, and the extended ones Switchyard
/// serves (each has its tests in the suite, all passing).
const FEATURES: &[&str] = &[
    "Gateway",
    "HTTPRoute",
    "GRPCRoute",
    "ReferenceGrant",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteMethodMatching",
    "HTTPRouteResponseHeaderModification",
    "HTTPRoutePortRedirect",
    "HTTPRouteSchemeRedirect",
    "HTTPRoutePathRedirect",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteHostRewrite",
    "HTTPRoutePathRewrite",
    "HTTPRouteRequestTimeout",
    "HTTPRouteBackendTimeout",
    "HTTPRouteRetryCodes",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteCORS",
    "HTTPRouteRetryConnectionError",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendURLRewrite",
    "GatewayPort8080",
    "GatewayHTTPListenerIsolation",
    "GatewayRouteHostnameIntersectionPrecedence",
    "GatewayHTTPSListenerDetectMisdirectedRequests",
    "GatewayAddressEmpty",
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "BackendTLSPolicy",
    "BackendTLSPolicySANValidation",
    "GatewayBackendClientCertificate",
    "ListenerSet",
    "TLSRoute",
    "TLSRouteModeTerminate",
    "TLSRouteModeMixed",
    "TCPRoute",
    "UDPRoute",
    // In no profile (the suite runs their tests all the same).
    "GRPCRouteNamedRouteRule",
    "GRPCRouteRequestHeaderModifier",
];

/// The profiles run, sharing the node and the suite's base resources.
const PROFILES: &str = "GATEWAY-HTTP,GATEWAY-GRPC,GATEWAY-TLS,GATEWAY-TCP,GATEWAY-UDP";

/// How long the whole suite may take: every core test passing takes a few minutes; each
/// failing one waits out its timeouts.
const SUITE_WITHIN: Duration = Duration::from_secs(50 * 60);

fn checked_in() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../conformance/report.yaml"
    ))
}

/// The report without what changes from one run to the next: its date, and the order of
/// its profiles (the suite lists them in no fixed order).
fn comparable(report: &str) -> Value {
    let mut value: Value = serde_saphyr::from_str(report).expect("a ConformanceReport");
    if let Some(object) = value.as_object_mut() {
        object.remove("date");
        if let Some(Value::Array(profiles)) = object.get_mut("profiles") {
            profiles.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        }
    }
    value
}

#[test]
fn the_order_of_the_profiles_is_no_difference() {
    let report = |profiles: &[&str]| {
        let listed: String = (profiles.iter())
            .map(|p| format!("- name: {p}\n  summary: of {p}\n"))
            .collect();
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\ndate: \"2026-12-05T08:00:00Z\"\n\
             profiles:\n{listed}"
        )
    };
    let written = comparable(&report(&["GATEWAY-TLS", "GATEWAY-HTTP"]));
    assert_eq!(
        written,
        comparable(&report(&["GATEWAY-HTTP", "GATEWAY-TLS"]))
    );
    // What a profile says still counts.
    let mut other = written.clone();
    other["profiles"][0]["summary"] = Value::from("else");
    assert_ne!(written, other);
}

#[tokio::test]
async fn node_gateway_api_conformance_profiles() {
    let node = Node::start().await;
    node.import_image("conformance-echo-basic").await;
    node.install_switchyard_with_gateway_api().await;
    node.apply(
        "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: { name: switchyard }
spec: { controllerName: switchyard.dev/gateway-controller }
",
    )
    .await;

    let report = node.dir.join("conformance-report.yaml");
    let output = node.dir.join("logs/conformance.log");
    let log = std::fs::File::create(&output).expect("the suite's log");
    let only = std::env::var("SWITCHYARD_CONFORMANCE_TESTS").ok();
    // More features to try with SWITCHYARD_CONFORMANCE_TESTS (not claimed by the report).
    let mut features: Vec<String> = FEATURES.iter().map(|f| f.to_string()).collect();
    if only.is_some()
        && let Ok(more) = std::env::var("SWITCHYARD_CONFORMANCE_FEATURES")
    {
        features.extend(more.split(',').map(str::to_owned));
    }
    let run = match &only {
        Some(tests) => format!("TestConformance/({tests})$"),
        None => "TestConformance".to_owned(),
    };
    let mut suite = tokio::process::Command::new(tool("gateway-conformance"));
    suite
        .args(["-test.run", &run])
        .args([
            "-test.v",
            "-test.timeout",
            "50m",
            "-gateway-class=switchyard",
            "-cleanup-base-resources=false",
            "-organization=switchyard",
            "-project=switchyard",
            "-url=https://switchyard.dev",
            "-contact=switchyard maintainers",
        ])
        .arg(format!("-conformance-profiles={PROFILES}"))
        .arg(format!("-supported-features={}", features.join(",")))
        .arg(format!("-version=v{}", env!("CARGO_PKG_VERSION")))
        .arg(format!("-report-output={}", report.display()))
        .env("KUBECONFIG", node.kubeconfig())
        .stdout(Stdio::from(log.try_clone().expect("the log again")))
        .stderr(Stdio::from(log))
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child = suite.spawn().expect("start the conformance suite");
    let status = tokio::time::timeout(SUITE_WITHIN, child.wait())
        .await
        .unwrap_or_else(|_| panic!("the suite ran over {SUITE_WITHIN:?}"))
        .expect("the suite's exit status");
    let log = std::fs::read_to_string(&output).unwrap_or_default();
    let kept = std::env::temp_dir().join("switchyard-conformance.log");
    let _ = std::fs::write(&kept, &log);
    let results: Vec<&str> = log
        .lines()
        .filter(|l| l.trim_start().starts_with("--- "))
        .collect();
    eprintln!(
        "conformance suite: {status} after {:.0?} (log: {})\n{}",
        started.elapsed(),
        kept.display(),
        results.join("\n")
    );
    if only.is_some() {
        return;
    }
    let Ok(written) = std::fs::read_to_string(&report) else {
        let tail: Vec<&str> = log.lines().rev().take(60).collect();
        panic!(
            "the suite wrote no report ({status}); its last lines:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    };
    if std::env::var_os("UPDATE_CONFORMANCE").is_some() {
        std::fs::write(checked_in(), &written).expect("write conformance/report.yaml");
        return;
    }
    let expected = std::fs::read_to_string(checked_in()).unwrap_or_default();
    assert_eq!(
        comparable(&written),
        comparable(&expected),
        "the suite's report differs from conformance/report.yaml (UPDATE_CONFORMANCE=1 rewrites it):\n{written}"
    );
}
