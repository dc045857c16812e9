//! The fleet changing under a rollout, on a real node, under bounded load through the
//! Envoy Service: zero non-2xx in each.
//!
//! - an Envoy Pod deleted mid-rollout (the Deployment replaces it; the replacement must be
//!   proven before Ready), and the Envoy Deployment scaled up mid-rollout (a late joiner);
//! - an operator Pod deleted mid-rollout, the leader's Pod killed (failover through the
//!   Lease), and `helm upgrade` of the operator mid-load (a rolling restart);
//! - evictions, as `kubectl drain` makes them, refused by the PodDisruptionBudget while
//!   one Envoy is already away.

use std::time::{Duration, Instant};

use switchyard_e2e::node::workloads::{backend_yaml, route_yaml};
use switchyard_e2e::node::{
    ENVOY_SELECTOR, Node, OPERATOR_SELECTOR, RELEASE, SWITCHYARD_NAMESPACE,
};
use switchyard_e2e::{Load, LoadReport};

const APPS: &str = "apps";
const HOST: &str = "web.example.com";
const RATE: u32 = 100;

fn summary(name: &str, report: &LoadReport, ready: &[(&str, Duration)]) {
    eprintln!(
        "{name}: {} requests in {:.1}s, non-2xx {}, by status {:?}",
        report.sent,
        report.elapsed.as_secs_f64(),
        report.non_2xx(),
        report.by_status,
    );
    for (what, took) in ready {
        eprintln!("  {what}: {:.0} ms", took.as_secs_f64() * 1000.0);
    }
    for failure in report.failures.iter().take(5) {
        eprintln!("  {failure:?}");
    }
}

async fn installed_node() -> Node {
    let node = Node::start().await;
    node.install_switchyard(&[]).await;
    node.api().kubectl_ok(["create", "namespace", APPS]).await;
    node.apply(&backend_yaml(APPS, "svc-0", 1, "v1", 0)).await;
    node.wait_rollout(APPS, "deployment/svc-0", Duration::from_secs(60))
        .await;
    node.apply(&route_yaml(APPS, "web", HOST, &[("svc-0", 1)]))
        .await;
    node.wait_route_ready(APPS, "web", Duration::from_secs(60))
        .await;
    node
}

/// Starts a switch of the route to a fresh Deployment `svc-<i>` (its Pods not yet
/// started), the way a user applies both at once.
async fn start_switch(node: &Node, i: usize) -> Instant {
    let service = format!("svc-{i}");
    node.apply(&backend_yaml(APPS, &service, 1, "v1", 500))
        .await;
    let changed = Instant::now();
    node.apply(&route_yaml(APPS, "web", HOST, &[(&service, 1)]))
        .await;
    changed
}

/// Waits for the switch to be Ready, then checks that every Ready Envoy Pod sends to the
/// new Service.
async fn finish_switch(node: &Node, i: usize, changed: Instant) -> Duration {
    node.wait_route_ready(APPS, "web", Duration::from_secs(90))
        .await;
    let took = changed.elapsed();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a client");
    for (name, url) in node.envoy_pods().await {
        let response = client
            .get(format!("{url}/"))
            .header("host", HOST)
            .send()
            .await
            .unwrap_or_else(|e| panic!("Envoy {name}: {e}"));
        let backend = response
            .headers()
            .get("x-backend")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string();
        assert!(
            backend.starts_with(&format!("svc-{i}-")),
            "after Ready, Envoy {name} sends to {backend}, not svc-{i}"
        );
    }
    took
}

async fn pods(node: &Node, selector: &str) -> Vec<String> {
    node.ready_pods(SWITCHYARD_NAMESPACE, selector)
        .await
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

async fn delete_pod(node: &Node, name: &str) {
    node.api()
        .kubectl_ok([
            "delete",
            "pod",
            "-n",
            SWITCHYARD_NAMESPACE,
            name,
            "--wait=false",
        ])
        .await;
}

/// The Pod that holds the leader Lease.
async fn leader_pod(node: &Node) -> String {
    node.get(
        SWITCHYARD_NAMESPACE,
        &format!("lease/{RELEASE}-leader"),
        "{.spec.holderIdentity}",
    )
    .await
}

/// Until both operator replicas are back and Ready.
async fn wait_operators(node: &Node) {
    node.wait_rollout(
        SWITCHYARD_NAMESPACE,
        &format!("deployment/{RELEASE}"),
        Duration::from_secs(90),
    )
    .await;
}

fn load(url: String) -> Load {
    Load::start(vec![url], HOST, RATE, Duration::from_secs(240))
}

#[tokio::test]
async fn node_envoy_pod_deleted_and_fleet_scaled_up_mid_rollout_drop_nothing() {
    let node = installed_node().await;
    let load = load(node.envoy_service_url().await);
    let mut ready = Vec::new();

    let changed = start_switch(&node, 1).await;
    let envoys = pods(&node, ENVOY_SELECTOR).await;
    delete_pod(&node, &envoys[0]).await;
    ready.push((
        "Envoy Pod deleted: switch to Ready",
        finish_switch(&node, 1, changed).await,
    ));
    // The replacement is in the fleet once Ready, and serves the route as it stands.
    node.wait_rollout(
        SWITCHYARD_NAMESPACE,
        &format!("deployment/{RELEASE}-envoy"),
        Duration::from_secs(90),
    )
    .await;
    finish_switch(&node, 1, changed).await;

    let changed = start_switch(&node, 2).await;
    node.api()
        .kubectl_ok([
            "scale",
            "-n",
            SWITCHYARD_NAMESPACE,
            &format!("deployment/{RELEASE}-envoy"),
            "--replicas=3",
        ])
        .await;
    ready.push((
        "fleet scaled 2 → 3: switch to Ready",
        finish_switch(&node, 2, changed).await,
    ));
    node.wait_rollout(
        SWITCHYARD_NAMESPACE,
        &format!("deployment/{RELEASE}-envoy"),
        Duration::from_secs(90),
    )
    .await;
    let envoys = node.envoy_pods().await;
    assert_eq!(envoys.len(), 3, "{envoys:?}");
    finish_switch(&node, 2, changed).await;

    // The deleted Envoy keeps serving through its preStop sleep, then exits: let the load
    // run past that.
    let report = load.finish_after(Duration::from_secs(25)).await;
    summary("node Envoy fleet changes", &report, &ready);
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}

#[tokio::test]
async fn node_operator_pods_deleted_killed_and_upgraded_mid_rollout_drop_nothing() {
    let node = installed_node().await;
    let load = load(node.envoy_service_url().await);
    let mut ready = Vec::new();

    // A replica that is not the leader, deleted as a user or an autoscaler would.
    let leader = leader_pod(&node).await;
    let operators = pods(&node, OPERATOR_SELECTOR).await;
    let follower = operators
        .iter()
        .find(|p| **p != leader)
        .expect("a replica that is not the leader")
        .clone();
    let changed = start_switch(&node, 1).await;
    delete_pod(&node, &follower).await;
    ready.push((
        "follower deleted: switch to Ready",
        finish_switch(&node, 1, changed).await,
    ));

    // The leader's process killed outright (SIGKILL: no release of the Lease): the
    // other replica, or the restarted one under the same name, leads once it runs out.
    wait_operators(&node).await;
    let leader = leader_pod(&node).await;
    let changed = start_switch(&node, 2).await;
    let killed = node.kill_containers(SWITCHYARD_NAMESPACE, &leader).await;
    assert!(killed > 0, "no process of {leader} found to kill");
    ready.push((
        "leader killed: switch to Ready",
        finish_switch(&node, 2, changed).await,
    ));

    // helm upgrade with a changed value: the operator Deployment rolls its replicas.
    wait_operators(&node).await;
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/switchyard");
    let upgrade_args = [
        "upgrade",
        RELEASE,
        chart,
        "-n",
        SWITCHYARD_NAMESPACE,
        "--reuse-values",
        "--set",
        "logLevel=debug",
        "--wait",
        "--timeout",
        "3m",
    ];
    let upgrade = node.helm(&upgrade_args);
    let changed = start_switch(&node, 3).await;
    let (upgraded, took) = tokio::join!(upgrade, finish_switch(&node, 3, changed));
    assert!(
        upgraded.status.success(),
        "helm upgrade: {}",
        String::from_utf8_lossy(&upgraded.stderr)
    );
    ready.push(("during helm upgrade: switch to Ready", took));
    let changed = start_switch(&node, 4).await;
    ready.push((
        "after helm upgrade: switch to Ready",
        finish_switch(&node, 4, changed).await,
    ));

    let report = load.finish().await;
    summary("node operator changes", &report, &ready);
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}

/// What the eviction API says of evicting this Envoy Pod, as `kubectl drain` asks it:
/// `Ok` when it was evicted, `Err` with the API server's words when it was refused. (Not
/// through a kube client, whose retry policy waits out a 429.)
async fn evict(node: &Node, pod: &str) -> Result<(), String> {
    let eviction = format!(
        r#"{{"apiVersion":"policy/v1","kind":"Eviction","metadata":{{"name":"{pod}","namespace":"{SWITCHYARD_NAMESPACE}"}}}}"#
    );
    let path = format!("/api/v1/namespaces/{SWITCHYARD_NAMESPACE}/pods/{pod}/eviction");
    let out = node
        .api()
        .kubectl_input(["create", "--raw", &path, "-f", "-"], &eviction)
        .await;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Evicts both Pods of `selector` as `kubectl drain` would: the first at once, the second
/// refused by the PodDisruptionBudget (maxUnavailable 1) until the first's replacement is
/// Ready, then allowed.
async fn evict_both_within_budget(node: &Node, selector: &str) {
    let pods = pods(node, selector).await;
    assert_eq!(pods.len(), 2, "{pods:?}");
    evict(node, &pods[0])
        .await
        .unwrap_or_else(|e| panic!("the first eviction is allowed: {e}"));
    let refused = evict(node, &pods[1]).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.contains("disruption budget")),
        "the second eviction must wait for the budget: {refused:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    while let Err(e) = evict(node, &pods[1]).await {
        assert!(e.contains("disruption budget"), "evicting {}: {e}", pods[1]);
        assert!(
            Instant::now() < deadline,
            "the second eviction was never allowed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn node_evictions_respect_the_disruption_budgets_and_drop_nothing() {
    let node = installed_node().await;
    let load = load(node.envoy_service_url().await);

    let started = Instant::now();
    evict_both_within_budget(&node, ENVOY_SELECTOR).await;
    let envoys_evicted = started.elapsed();
    let started = Instant::now();
    evict_both_within_budget(&node, OPERATOR_SELECTOR).await;
    let operators_evicted = started.elapsed();
    let changed = start_switch(&node, 1).await;
    let took = finish_switch(&node, 1, changed).await;

    let report = load.finish_after(Duration::from_secs(25)).await;
    summary(
        "node evictions",
        &report,
        &[
            ("both Envoys evicted", envoys_evicted),
            ("both operators evicted", operators_evicted),
            ("switch to Ready after", took),
        ],
    );
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}
