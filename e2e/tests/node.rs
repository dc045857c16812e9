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

/// A process of the node (a container's, seen from the host) frozen with SIGSTOP until
/// dropped.
struct FrozenProcess {
    pid: libc::pid_t,
}

impl FrozenProcess {
    /// Freezes the one process whose command line contains `pattern`.
    fn of(pattern: &str) -> FrozenProcess {
        let found = std::process::Command::new("pgrep")
            .args(["-f", "--", pattern])
            .output()
            .expect("pgrep");
        let text = String::from_utf8_lossy(&found.stdout);
        let pids: Vec<libc::pid_t> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        assert_eq!(pids.len(), 1, "processes matching {pattern:?}: {text}");
        // SAFETY: kill(2) on a process of the node this test started.
        let sent = unsafe { libc::kill(pids[0], libc::SIGSTOP) };
        assert_eq!(sent, 0, "SIGSTOP to {}", pids[0]);
        FrozenProcess { pid: pids[0] }
    }
}

impl Drop for FrozenProcess {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe {
            libc::kill(self.pid, libc::SIGCONT);
        }
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

    // A hung Envoy Pod (its process frozen from the node, SIGSTOP) holds a rollout back
    // only until the kubelet's readiness probe takes it out of the fleet (two failed
    // probes 2 s apart, a second each): the change is Ready within the bound, and the
    // Envoy that stayed healthy answers every request meanwhile.
    node.apply(&backend_yaml(APPS, "green", 1, "v1", 0)).await;
    node.wait_rollout(APPS, "deployment/green", Duration::from_secs(60))
        .await;
    let (frozen, healthy) = (&envoys[1].0, envoys[0].1.clone());
    let envoy = FrozenProcess::of(&format!("--service-node {frozen}"));
    let load = Load::start(vec![healthy], HOST, 50, Duration::from_secs(40));
    let changed = Instant::now();
    node.apply(&route_yaml(APPS, "web", HOST, &[("green", 1)]))
        .await;
    let took = node
        .wait_route_ready(APPS, "web", Duration::from_secs(20))
        .await;
    let left = node.envoy_pods().await;
    drop(envoy);
    let report = load.finish().await;
    eprintln!(
        "{frozen} frozen: the change Ready in {took:.1?} ({:.1?} after the change); ready \
         Envoys meanwhile {left:?}; through the other: {report:?}",
        changed.elapsed()
    );
    assert!(
        left.iter().all(|(pod, _)| pod != frozen),
        "the frozen Envoy is still ready: {left:?}"
    );
    assert_eq!(report.non_2xx(), 0, "{report:?}");
    assert!(
        report.by_backend.keys().any(|b| b.starts_with("green-")),
        "the healthy Envoy never served the change: {:?}",
        report.by_backend
    );
    // Thawed, it is ready again.
    let thawed = Instant::now();
    while node.envoy_pods().await.len() < 2 {
        assert!(
            thawed.elapsed() < Duration::from_secs(30),
            "the thawed Envoy is not ready again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

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
    // (The Envoy thawed above may take a moment to be in sync again.)
    let asked = Instant::now();
    loop {
        let status = tokio::process::Command::new(switchyard_e2e::kube::tool("kubectl"))
            .args(["switchyard", "status", "--kubernetes"])
            .args(["--namespace", SWITCHYARD_NAMESPACE])
            .env("KUBECONFIG", &node.api().kubeconfig)
            .env("PATH", &path)
            .output();
        let status = tokio::time::timeout(Duration::from_secs(30), status)
            .await
            .expect("switchyard status answers within 30 s")
            .expect("switchyard status runs");
        let text = String::from_utf8_lossy(&status.stdout);
        assert!(
            status.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&status.stderr)
        );
        let out_of_sync: Vec<&String> = (envoys.iter().map(|(envoy, _)| envoy))
            .filter(|envoy| {
                let row = text.lines().find(|l| l.starts_with(envoy.as_str()));
                !row.is_some_and(|r| {
                    r.contains("SYNCED")
                        && operators.iter().any(|(pod, _)| r.contains(pod.as_str()))
                })
            })
            .collect();
        if out_of_sync.is_empty() {
            eprintln!("{text}");
            break;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(15),
            "{out_of_sync:?} not shown in sync on an operator Pod:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
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
