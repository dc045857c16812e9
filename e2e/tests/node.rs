//! End to end on a real node (e2e/src/node): Switchyard installed with `helm install` as
//! the README says, its operator and Envoys as Pods, backends as Deployments whose
//! EndpointSlices Kubernetes writes, and the test's load from inside the node's network
//! namespace. One node per test binary: the load's runtime lives in the namespace of the
//! node that first used it.

use std::time::Duration;

use switchyard_e2e::Load;
use switchyard_e2e::node::workloads::{backend_yaml, route_yaml};
use switchyard_e2e::node::{Node, image, netns};

const NAMESPACE: &str = "switchyard-system";
const APPS: &str = "apps";
const HOST: &str = "web.example.com";

/// The values a local node needs, and nothing else (README, "Install with Helm").
fn local_values() -> Vec<String> {
    let (operator, envoy) = (image("switchyard"), image("envoy"));
    let (operator_repo, operator_tag) = operator.rsplit_once(':').expect("a tag");
    let (envoy_repo, envoy_tag) = envoy.rsplit_once(':').expect("a tag");
    [
        format!("image.repository={operator_repo}"),
        format!("image.tag={operator_tag}"),
        "image.pullPolicy=Never".to_string(),
        format!("envoy.image.repository={envoy_repo}"),
        format!("envoy.image.tag={envoy_tag}"),
        "envoy.image.pullPolicy=Never".to_string(),
        "envoy.service.type=ClusterIP".to_string(),
    ]
    .into_iter()
    .flat_map(|v| ["--set".to_string(), v])
    .collect()
}

fn assert_no_way_out(node: &Node) {
    let links = node.netns.links().expect("the node's interfaces");
    for link in &links {
        assert!(
            link == "lo" || link == netns::BRIDGE || link.starts_with("veth"),
            "the node's namespace has an interface {link:?} (all: {links:?}): only lo, the \
             Pod bridge and the Pods' veths may be there"
        );
    }
    let routes = node.netns.routes().expect("the node's routes");
    for route in routes.lines() {
        let words: Vec<&str> = route.split_whitespace().collect();
        let destination = match words.first() {
            Some(&"local" | &"broadcast" | &"multicast" | &"anycast") => words.get(1),
            other => other,
        };
        let destination = destination.copied().unwrap_or("");
        let inside = destination.starts_with("127.")
            || destination.starts_with("198.18.")
            || destination.starts_with("198.19.")
            || destination == "::1"
            || destination.starts_with("fe80:")
            || destination.starts_with("ff00:");
        assert!(
            inside && destination != "default",
            "the node's namespace has a route out: {route:?}\n{routes}"
        );
    }
}

async fn kubectl_ok(node: &Node, args: &[&str]) -> String {
    node.api().kubectl_ok(args).await
}

#[tokio::test]
async fn helm_install_serves_routes_through_envoy_pods() {
    let node = Node::start().await;
    assert_no_way_out(&node);

    // The README's install, verbatim but for the values a local node needs.
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/");
    kubectl_ok(&node, &["apply", "--server-side", "-f", crds]).await;
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/switchyard");
    let mut install = vec![
        "install",
        "switchyard",
        chart,
        "-n",
        NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "3m",
    ];
    let values = local_values();
    install.extend(values.iter().map(String::as_str));
    let started = std::time::Instant::now();
    node.helm_ok(&install).await;
    eprintln!("helm install --wait: {:.1?}", started.elapsed());

    kubectl_ok(&node, &["create", "namespace", APPS]).await;
    node.apply(&backend_yaml(APPS, "blue", 2, "v1", 0)).await;
    node.wait_rollout(APPS, "deployment/blue", Duration::from_secs(60))
        .await;
    node.apply(&route_yaml(APPS, "web", HOST, &[("blue", 1)]))
        .await;
    let took = node
        .wait_route_ready(APPS, "web", Duration::from_secs(60))
        .await;
    eprintln!("route web Ready in {took:.1?}");

    let envoy_ip = node
        .get(NAMESPACE, "service/switchyard-envoy", "{.spec.clusterIP}")
        .await;
    let load = Load::start(
        vec![format!("http://{envoy_ip}:80")],
        HOST,
        50,
        Duration::from_secs(5),
    );
    let report = load.finish_after(Duration::from_secs(5)).await;
    eprintln!("{report:?}");
    assert!(report.sent > 100, "too few requests: {report:?}");
    assert_eq!(report.non_2xx(), 0, "{report:?}");
    assert!(
        report.by_backend.keys().all(|b| b.starts_with("blue-")),
        "answers from elsewhere than blue's Pods: {:?}",
        report.by_backend
    );

    node.helm_ok(&["uninstall", "switchyard", "-n", NAMESPACE, "--wait"])
        .await;
}
