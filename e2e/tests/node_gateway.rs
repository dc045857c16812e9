//! The Gateway API on a real node, installed with the chart (`gatewayAPI.enabled`,
//! `gatewayAPI.installCRDs`): transitions a user causes through an HTTPRoute, under bounded
//! load from inside the node's namespace through the Gateway's address, zero non-2xx each.
//!
//! - update conformance: 10 header-only changes, then 10 switches, each to a fresh Service
//!   whose Deployment Kubernetes schedules, marks ready and writes EndpointSlices for;
//! - rules reordered (clusters are named by Service and port, never by rule index);
//! - a rename in one sync: the route deleted and the same one created under another name.

use std::time::{Duration, Instant};

use serde_json::Value;
use switchyard_e2e::node::Node;
use switchyard_e2e::node::workloads::backend_yaml;
use switchyard_e2e::{Load, LoadReport};

const APPS: &str = "apps";
const HOST: &str = "web.example.com";
const RATE: u32 = 100;
const SERVED: &str = "switchyard.dev/Served";

fn summary(name: &str, report: &LoadReport, ready: &[Duration]) {
    let mut ms: Vec<f64> = ready.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        ms.get(((ms.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    eprintln!(
        "{name}: {} requests in {:.1}s, non-2xx {}, by status {:?}; change to Served p50 {:.0} ms, max {:.0} ms ({} changes)",
        report.sent,
        report.elapsed.as_secs_f64(),
        report.non_2xx(),
        report.by_status,
        pick(0.5),
        pick(1.0),
        ms.len()
    );
    for failure in report.failures.iter().take(5) {
        eprintln!("  {failure:?}");
    }
}

fn gateway_yaml() -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{ name: switchyard }}
spec: {{ controllerName: switchyard.dev/gateway-controller }}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge, namespace: {APPS} }}
spec:
  gatewayClassName: switchyard
  listeners: [ {{ name: http, port: 80, protocol: HTTP }} ]
"#
    )
}

/// HTTPRoute `name` for HOST: `rules` as YAML list items.
fn route_yaml(name: &str, rules: &str) -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name}, namespace: {APPS} }}
spec:
  parentRefs: [ {{ name: edge }} ]
  hostnames: [ {HOST} ]
  rules:
{rules}"#
    )
}

/// A rule sending everything to `service`, with a response-header sentinel.
fn rule(service: &str, sentinel: usize) -> String {
    format!(
        r#"    - backendRefs: [ {{ name: {service}, port: 80 }} ]
      filters:
        - type: ResponseHeaderModifier
          responseHeaderModifier: {{ set: [ {{ name: x-sentinel, value: "{sentinel}" }} ] }}
"#
    )
}

/// A rule for requests with `x-canary: 1` only (the load never sends it).
fn canary_rule(service: &str) -> String {
    format!(
        r#"    - matches: [ {{ headers: [ {{ name: x-canary, value: "1" }} ] }} ]
      backendRefs: [ {{ name: {service}, port: 80 }} ]
"#
    )
}

/// Waits until the route's Served condition is True for its current generation.
async fn wait_served(node: &Node, name: &str, within: Duration) -> Duration {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < within {
        let out = node
            .api()
            .kubectl([
                "get",
                "-n",
                APPS,
                &format!("httproute/{name}"),
                "-o",
                "json",
            ])
            .await;
        let json = String::from_utf8_lossy(&out.stdout);
        if let Ok(route) = serde_json::from_str::<Value>(&json) {
            let generation = route.pointer("/metadata/generation").cloned();
            let served = route
                .pointer("/status/parents/0/conditions")
                .and_then(Value::as_array)
                .and_then(|c| c.iter().find(|c| c["type"] == SERVED))
                .cloned();
            if let Some(served) = &served
                && served["status"] == "True"
                && Some(&served["observedGeneration"]) == generation.as_ref()
            {
                return started.elapsed();
            }
            last = format!("{served:?} at generation {generation:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "httproute/{name} not Served within {within:?}: {last}\n{}",
        node.diagnostics().await
    );
}

/// `http://<the Gateway's address>:80`, once it is Programmed.
async fn gateway_url(node: &Node) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let programmed = node
            .get(
                APPS,
                "gateway/edge",
                "{.status.conditions[?(@.type==\"Programmed\")].status}",
            )
            .await;
        let address = node
            .get(APPS, "gateway/edge", "{.status.addresses[0].value}")
            .await;
        if programmed == "True" && !address.is_empty() {
            return format!("http://{address}:80");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "gateway/edge not Programmed with an address\n{}",
        node.diagnostics().await
    );
}

/// The fleet port the Gateway's port 80 maps to on every Envoy Pod.
async fn fleet_port(node: &Node) -> String {
    let out = node
        .api()
        .kubectl([
            "get",
            "-n",
            switchyard_e2e::node::SWITCHYARD_NAMESPACE,
            "services",
            "-l",
            "switchyard.dev/gateway-name=edge",
            "-o",
            "jsonpath={.items[0].spec.ports[0].targetPort}",
        ])
        .await;
    let port = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(!port.is_empty(), "no Service for gateway/edge");
    port
}

/// What each Ready Envoy Pod answers for HOST on the Gateway's port: (x-backend,
/// x-sentinel).
async fn answers(node: &Node, port: &str) -> Vec<(String, String)> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a client");
    let mut out = Vec::new();
    for (name, url) in node.envoy_pods().await {
        let url = url.replace(":8080", &format!(":{port}"));
        let response = client
            .get(format!("{url}/"))
            .header("host", HOST)
            .send()
            .await
            .unwrap_or_else(|e| panic!("Envoy {name} at {url}: {e}"));
        let header = |h: &str| {
            response
                .headers()
                .get(h)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string()
        };
        out.push((header("x-backend"), header("x-sentinel")));
    }
    out
}

async fn installed_node() -> Node {
    let node = Node::start().await;
    node.install_switchyard_with_gateway_api().await;
    node.api().kubectl_ok(["create", "namespace", APPS]).await;
    node.apply(&gateway_yaml()).await;
    node
}

#[tokio::test]
async fn node_httproute_update_conformance_reorder_and_rename_drop_nothing() {
    let node = installed_node().await;
    node.apply(&backend_yaml(APPS, "svc-0", 1, "v1", 0)).await;
    node.apply(&backend_yaml(APPS, "canary", 1, "v1", 0)).await;
    for d in ["deployment/svc-0", "deployment/canary"] {
        node.wait_rollout(APPS, d, Duration::from_secs(60)).await;
    }
    node.apply(&route_yaml("web", &rule("svc-0", 0))).await;
    wait_served(&node, "web", Duration::from_secs(60)).await;
    let url = gateway_url(&node).await;
    let port = fleet_port(&node).await;

    // Update conformance.
    let load = Load::start(vec![url.clone()], HOST, RATE, Duration::from_secs(240));
    let mut ready = Vec::new();
    for i in 1..=10 {
        node.apply(&route_yaml("web", &rule("svc-0", i))).await;
        ready.push(wait_served(&node, "web", Duration::from_secs(30)).await);
        for (_, sentinel) in answers(&node, &port).await {
            assert_eq!(
                sentinel,
                i.to_string(),
                "after Served, every Envoy serves it"
            );
        }
    }
    for i in 1..=10 {
        let service = format!("svc-{i}");
        // The Deployment and the route together: the route waits for the Pods.
        node.apply(&backend_yaml(APPS, &service, 1, "v1", 0)).await;
        let changed = Instant::now();
        node.apply(&route_yaml("web", &rule(&service, 10))).await;
        wait_served(&node, "web", Duration::from_secs(60)).await;
        ready.push(changed.elapsed());
        for (backend, _) in answers(&node, &port).await {
            assert!(
                backend.starts_with(&format!("{service}-")),
                "after Served, every Envoy sends to {service}: {backend}"
            );
        }
        let previous = format!("svc-{}", i - 1);
        node.api()
            .kubectl_ok([
                "delete",
                "-n",
                APPS,
                "deployment,service",
                &previous,
                "--wait=false",
            ])
            .await;
    }
    let report = load.finish().await;
    summary("node HTTPRoute update conformance", &report, &ready);
    assert!(report.sent >= 1000, "load too thin: {report:?}");
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);

    // Rules reordered, back and forth.
    let last = "svc-10";
    let load = Load::start(vec![url.clone()], HOST, RATE, Duration::from_secs(60));
    let mut ready = Vec::new();
    for i in 0..6 {
        let rules = if i % 2 == 0 {
            format!("{}{}", canary_rule("canary"), rule(last, 20))
        } else {
            format!("{}{}", rule(last, 20), canary_rule("canary"))
        };
        node.apply(&route_yaml("web", &rules)).await;
        ready.push(wait_served(&node, "web", Duration::from_secs(30)).await);
    }
    let report = load.finish().await;
    summary("node HTTPRoute rules reordered", &report, &ready);
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);

    // A rename in one sync: the same route under a new name, the old one deleted.
    let load = Load::start(vec![url], HOST, RATE, Duration::from_secs(60));
    let renamed = Instant::now();
    let renamed_route = route_yaml("web-renamed", &rule(last, 30));
    let (_, _) = tokio::join!(
        node.apply(&renamed_route),
        node.api()
            .kubectl_ok(["delete", "-n", APPS, "httproute", "web", "--wait=false"]),
    );
    wait_served(&node, "web-renamed", Duration::from_secs(30)).await;
    let took = renamed.elapsed();
    // The old route's hold (10 s) would hide a gap: keep the load on past it.
    tokio::time::sleep(Duration::from_secs(12)).await;
    for (backend, sentinel) in answers(&node, &port).await {
        assert!(backend.starts_with(&format!("{last}-")), "{backend}");
        assert_eq!(sentinel, "30");
    }
    let report = load.finish().await;
    summary("node HTTPRoute renamed in one sync", &report, &[took]);
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}
