//! Transitions a user causes on a real node, under bounded load from inside the node's
//! namespace through the Envoy Service: zero non-2xx in each.
//!
//! - update conformance (Knative's TestUpdate shape): 10 header-only changes, then 10
//!   switches, each to a fresh Service whose Deployment Kubernetes schedules, marks ready
//!   and writes EndpointSlices for;
//! - a backend Deployment rolled (a new env) while traffic flows, and again while a route
//!   shifts onto it: new Pods start slowly (readiness delayed), old ones terminate.

use std::time::{Duration, Instant};

use switchyard_e2e::node::Node;
use switchyard_e2e::node::workloads::{backend_yaml, route_yaml};
use switchyard_e2e::{Load, LoadReport};

const APPS: &str = "apps";
const HOST: &str = "web.example.com";
const RATE: u32 = 100;

fn summary(name: &str, report: &LoadReport, ready: &[Duration]) {
    let mut ms: Vec<f64> = ready.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        ms.get(((ms.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    eprintln!(
        "{name}: {} requests in {:.1}s, non-2xx {}, by status {:?}; change to Ready p50 {:.0} ms, max {:.0} ms ({} changes)",
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

/// The route's spec with a response-header sentinel and a short drain.
fn route(service: &str, sentinel: usize) -> String {
    format!(
        "{}    responseHeaders: {{ set: {{ x-sentinel: \"{sentinel}\" }} }}\n  rollout: {{ drainPeriod: 1s }}\n",
        route_yaml(APPS, "web", HOST, &[(service, 1)])
    )
}

/// What each Ready Envoy Pod answers for HOST: (x-backend, x-sentinel, x-version).
async fn answers(node: &Node) -> Vec<(String, String, String)> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a client");
    let mut out = Vec::new();
    for (name, url) in node.envoy_pods().await {
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
        out.push((
            header("x-backend"),
            header("x-sentinel"),
            header("x-version"),
        ));
    }
    out
}

async fn installed_node() -> Node {
    let node = Node::start().await;
    node.install_switchyard(&[]).await;
    node.api().kubectl_ok(["create", "namespace", APPS]).await;
    node
}

#[tokio::test]
async fn node_update_conformance_with_deployments_drops_nothing() {
    let node = installed_node().await;
    node.apply(&backend_yaml(APPS, "svc-0", 1, "v1", 0)).await;
    node.wait_rollout(APPS, "deployment/svc-0", Duration::from_secs(60))
        .await;
    node.apply(&route("svc-0", 0)).await;
    node.wait_route_ready(APPS, "web", Duration::from_secs(60))
        .await;

    let load = Load::start(
        vec![node.envoy_service_url().await],
        HOST,
        RATE,
        Duration::from_secs(240),
    );
    let mut ready = Vec::new();
    for i in 1..=10 {
        node.apply(&route("svc-0", i)).await;
        ready.push(
            node.wait_route_ready(APPS, "web", Duration::from_secs(30))
                .await,
        );
        for (_, sentinel, _) in answers(&node).await {
            assert_eq!(
                sentinel,
                i.to_string(),
                "after Ready, every Envoy serves it"
            );
        }
    }
    for i in 1..=10 {
        let service = format!("svc-{i}");
        // The Deployment and the route together: the route waits for the Pods.
        node.apply(&backend_yaml(APPS, &service, 1, "v1", 0)).await;
        let changed = Instant::now();
        node.apply(&route(&service, 10)).await;
        node.wait_route_ready(APPS, "web", Duration::from_secs(60))
            .await;
        ready.push(changed.elapsed());
        for (backend, _, _) in answers(&node).await {
            assert!(
                backend.starts_with(&format!("{service}-")),
                "after Ready, every Envoy sends to {service}: {backend}"
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
    summary("node update conformance", &report, &ready);
    assert!(report.sent >= 1000, "load too thin: {report:?}");
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}

#[tokio::test]
async fn node_rolling_a_backend_drops_nothing_also_while_a_route_shifts_onto_it() {
    let node = installed_node().await;
    // Two replicas each; new Pods turn ready 1.5 s after they start.
    node.apply(&backend_yaml(APPS, "blue", 2, "v1", 1500)).await;
    node.apply(&backend_yaml(APPS, "green", 2, "v1", 1500))
        .await;
    node.wait_rollout(APPS, "deployment/blue", Duration::from_secs(60))
        .await;
    node.wait_rollout(APPS, "deployment/green", Duration::from_secs(60))
        .await;
    node.apply(&route("blue", 0)).await;
    node.wait_route_ready(APPS, "web", Duration::from_secs(60))
        .await;

    let load = Load::start(
        vec![node.envoy_service_url().await],
        HOST,
        RATE,
        Duration::from_secs(120),
    );
    // A rolling update of the backend the route is on.
    node.apply(&backend_yaml(APPS, "blue", 2, "v2", 1500)).await;
    node.wait_rollout(APPS, "deployment/blue", Duration::from_secs(90))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (backend, _, version) in answers(&node).await {
        assert_eq!(version, "v2", "blue's new Pods serve ({backend})");
    }

    // A rolling update of green while the route shifts onto it.
    node.apply(&backend_yaml(APPS, "green", 2, "v2", 1500))
        .await;
    let changed = Instant::now();
    node.apply(&route("green", 0)).await;
    node.wait_route_ready(APPS, "web", Duration::from_secs(60))
        .await;
    let shifted = changed.elapsed();
    node.wait_rollout(APPS, "deployment/green", Duration::from_secs(90))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (backend, _, version) in answers(&node).await {
        assert!(
            backend.starts_with("green-") && version == "v2",
            "green's new Pods serve: {backend} {version}"
        );
    }
    let report = load.finish().await;
    summary("node rolling backends", &report, &[shifted]);
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}
