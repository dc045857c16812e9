//! End to end on a real node (e2e/src/node): Switchyard installed with `helm install` as
//! the README says, its operator and Envoys as Pods, backends as Deployments whose
//! EndpointSlices Kubernetes writes, and the test's load from inside the node's network
//! namespace. One node per test binary: the load's runtime lives in the namespace of the
//! node that first used it.

use std::time::{Duration, Instant};

use switchyard_e2e::node::workloads::{backend_yaml, route_yaml};
use switchyard_e2e::node::{Node, OPERATOR_SELECTOR, RELEASE, SWITCHYARD_NAMESPACE, netns};
use switchyard_e2e::{Load, switchyard_binary};

const APPS: &str = "apps";
const HOST: &str = "web.example.com";

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
    let took = node.install_switchyard(&[]).await;
    eprintln!("helm install --wait: {took:.1?}");
    let envoys = node.envoy_pods().await;
    let operators = node
        .ready_pods(SWITCHYARD_NAMESPACE, OPERATOR_SELECTOR)
        .await;
    assert_eq!(
        (envoys.len(), operators.len()),
        (2, 2),
        "{envoys:?} {operators:?}"
    );

    // The Lease requests' FlowSchema points at a priority level the API server has: not
    // dangling (a dangling one would be ignored).
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    let dangling = r#"{.items[*].status.conditions[?(@.type=="Dangling")].status}"#;
    let started = Instant::now();
    loop {
        let status = kubectl_ok(
            &node,
            &[
                "get",
                "flowschemas",
                "-l",
                &selector,
                "-o",
                &format!("jsonpath={dangling}"),
            ],
        )
        .await;
        if status.trim() == "False" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the chart's FlowSchema: Dangling {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

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

    let load = Load::start(
        vec![node.envoy_service_url().await],
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

    // `kubectl switchyard status --kubernetes` (the binary as a kubectl plugin) finds both
    // replicas through the API server (their Pods, asked through its Pod proxy) and shows
    // both Envoys in sync.
    let plugins = tempfile::tempdir().expect("a folder for the plugin");
    std::os::unix::fs::symlink(
        switchyard_binary(),
        plugins.path().join("kubectl-switchyard"),
    )
    .expect("link the plugin");
    let path = format!(
        "{}:{}",
        plugins.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let status = tokio::process::Command::new(switchyard_e2e::kube::tool("kubectl"))
        .args(["switchyard", "status", "--kubernetes"])
        .args(["--namespace", SWITCHYARD_NAMESPACE])
        .env("KUBECONFIG", &node.api().kubeconfig)
        .env("PATH", path)
        .output();
    let status = tokio::time::timeout(Duration::from_secs(30), status)
        .await
        .expect("switchyard status answers within 30 s")
        .expect("switchyard status runs");
    let text = String::from_utf8_lossy(&status.stdout);
    eprintln!("{text}");
    assert!(
        status.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    for (envoy, _) in &envoys {
        let row = text.lines().find(|l| l.starts_with(envoy.as_str()));
        assert!(
            row.is_some_and(|r| r.contains("SYNCED")
                && operators.iter().any(|(pod, _)| r.contains(pod.as_str()))),
            "{envoy} is not shown in sync on an operator Pod:\n{text}"
        );
    }

    let (own, pods) = node.memory_mib();
    eprintln!(
        "memory: node processes {own:.0} MiB, containers {pods:.0} MiB ({} Pods)",
        node.api()
            .kubectl_ok(["get", "pods", "-A", "--no-headers"])
            .await
            .lines()
            .count()
    );

    node.helm_ok(&["uninstall", RELEASE, "-n", SWITCHYARD_NAMESPACE, "--wait"])
        .await;
    // The Pods terminate after: the Envoys keep serving through their preStop sleep.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let left = node
            .api()
            .kubectl_ok([
                "get",
                "pods,services,configmaps,secrets",
                "-n",
                SWITCHYARD_NAMESPACE,
                "-o",
                "name",
            ])
            .await;
        let left: Vec<String> = left
            .lines()
            .filter(|l| !l.contains("kube-root-ca.crt"))
            .map(str::to_string)
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "helm uninstall left {left:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Teardown leaves nothing: processes, mounts, cgroups, the namespace, the folder.
    let (id, dir) = (node.id.clone(), node.dir.clone());
    drop(node);
    assert!(!netns::exists(&id), "the namespace {id} is still there");
    assert!(!dir.exists(), "{} is still there", dir.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    assert!(!mounts.contains(&id), "mounts of {id} are left:\n{mounts}");
    for hierarchy in ["memory", "cpu", "pids", "unified"] {
        let cgroup = std::path::Path::new("/sys/fs/cgroup")
            .join(hierarchy)
            .join(&id);
        assert!(!cgroup.exists(), "{} is still there", cgroup.display());
    }
    let processes = std::process::Command::new("pgrep")
        .args(["-f", &id])
        .output()
        .expect("pgrep");
    assert!(
        processes.stdout.is_empty(),
        "processes of {id} are left: {}",
        String::from_utf8_lossy(&processes.stdout)
    );
}
