//! Two-phase rollouts on a real kube-apiserver with three real Envoys, under load
//! (DESIGN.md I3, I4). Every scenario must see zero failed requests, except the
//! sensitivity run, which must see some: proof that the tests can see what they guard
//! against.

use std::time::Duration;

use switchyard_e2e::rig::{HOST, Rig};
use switchyard_e2e::{Load, LoadReport};

const RATE: u32 = 240;

fn summary(name: &str, report: &LoadReport, ready: &[Duration]) {
    let mut ms: Vec<f64> = ready.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        ms.get(((ms.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    eprintln!(
        "{name}: {} requests in {:.1}s, non-2xx {}, by status {:?}; time to Ready p50 {:.0} ms, p95 {:.0} ms, max {:.0} ms",
        report.sent,
        report.elapsed.as_secs_f64(),
        report.non_2xx(),
        report.by_status,
        pick(0.5),
        pick(0.95),
        pick(1.0)
    );
    for failure in report.failures.iter().take(5) {
        eprintln!("  {failure:?}");
    }
}

/// Knative's TestUpdate, on Switchyard: 10 changes of a response-header sentinel, then 10
/// switches each to a freshly created Service, the previous one torn down after each
/// rollout; after each Ready every Envoy already serves the change.
async fn update_conformance(
    extra: &[&str],
    header_rounds: usize,
    switch_rounds: usize,
) -> (LoadReport, Vec<Duration>) {
    let mut rig = Rig::start(3).await;
    rig.add_backend("svc-0").await;
    rig.start_operator("switchyard-1", extra);
    let spec = |service: &str, sentinel: usize| {
        format!(
            "{}  responseHeaders: {{ set: {{ x-sentinel: \"{sentinel}\" }} }}\nrollout: {{ drainPeriod: 1s }}\n",
            Rig::route_yaml(HOST, &[(service, 1)])
        )
    };
    rig.apply_route("web", &spec("svc-0", 0)).await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    let mut ready = Vec::new();
    for i in 1..=header_rounds {
        rig.apply_route("web", &spec("svc-0", i)).await;
        ready.push(rig.wait_ready("web", Duration::from_secs(30)).await);
        assert_eq!(
            rig.sentinels().await,
            vec![i.to_string(); 3],
            "after Ready, every Envoy serves the change"
        );
    }
    for i in 1..=switch_rounds {
        let service = format!("svc-{i}");
        rig.add_backend(&service).await;
        rig.apply_route("web", &spec(&service, header_rounds)).await;
        ready.push(rig.wait_ready("web", Duration::from_secs(30)).await);
        assert_eq!(
            rig.answers().await,
            [service.clone(), service.clone(), service.clone()]
        );
        rig.remove_backend(&format!("svc-{}", i - 1)).await;
    }
    (load.finish().await, ready)
}

#[tokio::test]
async fn update_conformance_drops_nothing() {
    let (report, ready) = update_conformance(&[], 10, 10).await;
    summary("update conformance", &report, &ready);
    assert!(
        report.sent as f64 / report.elapsed.as_secs_f64() >= 200.0,
        "load too thin: {report:?}"
    );
    assert_eq!(report.non_2xx(), 0);
}

#[tokio::test]
async fn without_two_phases_and_ordering_the_same_updates_drop_requests() {
    // More switches than the conformance run: a naive rollout fails on some switches, not
    // all, and the test must see it every time.
    let (report, ready) = update_conformance(&["--one-phase", "--unordered-xds"], 0, 25).await;
    summary("sensitivity (one phase, unordered xDS)", &report, &ready);
    assert!(
        report.non_2xx() > 0,
        "the test cannot see what the rollout guards against"
    );
}

#[tokio::test]
async fn canary_weights_split_traffic_within_tolerance() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("stable").await;
    rig.add_backend("canary").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route(
        "web",
        &Rig::route_yaml(HOST, &[("stable", 100), ("canary", 0)]),
    )
    .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    for (canary, stable) in [(0, 100), (10, 90), (50, 50), (100, 0)] {
        let backends = [("stable", stable), ("canary", canary)];
        rig.apply_route("web", &Rig::route_yaml(HOST, &backends))
            .await;
        rig.wait_ready("web", Duration::from_secs(60)).await;
        let seen = rig.split(600).await;
        let share = *seen.get("canary").unwrap_or(&0) as f64 / 600.0;
        eprintln!(
            "canary {canary}%: observed {:.1}% ({seen:?})",
            share * 100.0
        );
        assert!(
            (share - canary as f64 / 100.0).abs() <= 0.06,
            "canary {canary}%: observed {share}"
        );
    }
    let report = load.finish().await;
    summary("canary", &report, &[]);
    assert_eq!(report.non_2xx(), 0);
}

#[tokio::test]
async fn rapid_fire_generations_supersede_each_other_without_drops() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("svc-0").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("svc-0", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    for i in 1..=10 {
        rig.add_backend(&format!("svc-{i}")).await;
    }
    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    for i in 1..=10 {
        // No waiting: each generation lands while the previous one is rolling out.
        rig.apply_route("web", &Rig::route_yaml(HOST, &[(&format!("svc-{i}"), 1)]))
            .await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let took = rig.wait_ready("web", Duration::from_secs(60)).await;
    assert_eq!(rig.answers().await, ["svc-10", "svc-10", "svc-10"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = load.finish().await;
    summary("rapid fire", &report, &[took]);
    assert_eq!(report.non_2xx(), 0);
}

#[tokio::test]
async fn a_service_without_endpoints_keeps_traffic_on_the_old_one_until_it_has_some() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("old").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("old", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    // The new Service exists but has no ready endpoint yet.
    rig.add_backend("new").await;
    rig.set_ready("new", false).await;
    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    let deadline = "rollout: { probeDeadline: 3s }\n";
    let applied = std::time::Instant::now();
    rig.apply_route(
        "web",
        &format!("{}{deadline}", Rig::route_yaml(HOST, &[("new", 1)])),
    )
    .await;
    let status = rig
        .wait_status("web", Duration::from_secs(20), |s| {
            s.conditions.iter().any(|c| {
                c.type_ == "Ready"
                    && c.status == "False"
                    && c.reason == "VerifyingEndpoints"
                    && c.message.contains("Envoys ready 0/3")
                    && c.message.contains("without ready endpoints")
            })
        })
        .await;
    eprintln!(
        "while the new Service has no endpoints: {:?}",
        status.conditions.iter().find(|c| c.type_ == "Ready")
    );
    // Past its probe deadline the status says so, and names what it waits for.
    let status = rig
        .wait_status("web", Duration::from_secs(20), |s| {
            s.conditions.iter().any(|c| {
                c.type_ == "Ready"
                    && c.status == "False"
                    && c.reason == "ProbeDeadlineExceeded"
                    && c.message.contains("without ready endpoints")
            })
        })
        .await;
    let told = applied.elapsed();
    eprintln!(
        "past the probe deadline, {told:?} after the change: {:?}",
        status.conditions.iter().find(|c| c.type_ == "Ready")
    );
    assert!(told >= Duration::from_secs(3), "told after {told:?}");
    assert_eq!(
        rig.answers().await,
        ["old", "old", "old"],
        "traffic stays on the old backend"
    );

    // By now the rollout's retry backoff is at its cap (2 s): the endpoints appearing must
    // wake it, not the timer.
    rig.set_ready("new", true).await;
    let took = rig.wait_ready("web", Duration::from_secs(30)).await;
    assert_eq!(rig.answers().await, ["new", "new", "new"]);
    let report = load.finish().await;
    summary("no endpoints yet", &report, &[took]);
    assert_eq!(report.non_2xx(), 0);
    assert!(
        took < Duration::from_secs(1),
        "Ready {took:?} after the endpoints appeared: the rollout waited for its timer"
    );
}

/// `switchyard_rollout_step_seconds_count{step}` in the operator's metrics.
fn steps_timed(metrics: &str, step: &str) -> u64 {
    let prefix = format!("switchyard_rollout_step_seconds_count{{step=\"{step}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn every_step_of_a_rollout_is_timed() {
    let mut rig = Rig::start(1).await;
    rig.add_backend("svc-0").await;
    rig.add_backend("svc-1").await;
    rig.start_operator("switchyard-1", &[]);
    for service in ["svc-0", "svc-1"] {
        rig.apply_route("web", &Rig::route_yaml(HOST, &[(service, 1)]))
            .await;
        rig.wait_ready("web", Duration::from_secs(60)).await;
    }
    let metrics = rig.operator_metrics("switchyard-1").await;
    for step in ["staged", "endpoints_verified", "promoted", "live_verified"] {
        assert_eq!(
            steps_timed(&metrics, step),
            2,
            "two rollouts, each timed once at {step}:\n{metrics}"
        );
    }
}

/// The rollout engine writes and deletes a unit's ProxyConfigs only as it read them, for
/// every front-end: a write or delete decided on a stale read (another writer got there
/// first, or the store lagged) is refused by the API server, and the retry reads afresh.
#[tokio::test]
async fn a_proxy_config_write_decided_on_a_stale_read_is_refused_and_retried() {
    use kube::Api;
    use kube::api::{Patch, PatchParams};
    use kube::runtime::watcher;
    use switchyard::api::{ProxyConfig, ProxyConfigSpec};
    use switchyard::k8s::watched::Watched;
    use switchyard::rollout::{ProxyConfigs, UnitRef};
    use switchyard_e2e::kube::{KubeApi, create_namespace, delete_namespace, unique_name};

    let api = KubeApi::shared().await;
    api.install_crds().await;
    let client = api.client().await;
    let ns = unique_name("engine");
    create_namespace(&client, &ns).await;
    let store = Watched::start(
        vec![Api::<ProxyConfig>::namespaced(client.clone(), &ns)],
        watcher::Config::default(),
    );
    assert!(store.ready().await, "the ProxyConfig watch lists");
    let engine = ProxyConfigs::new(client.clone(), store, None);
    let spec = |version: &str| -> ProxyConfigSpec {
        serde_json::from_value(serde_json::json!({
            "role": "probe", "route": "web", "generation": 1, "version": version,
            "clusters": [],
        }))
        .expect("a ProxyConfig spec")
    };
    let unit = UnitRef {
        namespace: &ns,
        name: "web",
        owner: Default::default(),
    };
    let apply = |version: &'static str, current: Option<ProxyConfig>| {
        let (engine, unit) = (&engine, &unit);
        async move {
            let current = current.as_ref();
            (engine.apply(unit, "web-probe", spec(version), None, current)).await
        }
    };

    let first = apply("p1", None).await.expect("created");
    // Another writer moves it on.
    Api::<ProxyConfig>::namespaced(client.clone(), &ns)
        .patch(
            "web-probe",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "version": "theirs" } })),
        )
        .await
        .expect("another writer's patch");

    // What was decided on the first read is refused: a write, and a delete.
    let stale = apply("p2", Some(first.clone())).await;
    assert!(
        stale.as_ref().is_err_and(|e| e.is_conflict()),
        "a stale write: {stale:?}"
    );
    let stale = engine.delete(&ns, "web-probe", Some(&first)).await;
    assert!(
        stale.as_ref().is_err_and(|e| e.is_conflict()),
        "a stale delete: {stale:?}"
    );

    // The retry reads afresh (from the API server: the store's copy is no longer known to
    // be current) and its write holds.
    let fresh = engine.read(&ns, "web-probe").await.expect("read");
    let fresh = fresh.expect("still there");
    assert_eq!(fresh.spec.version, "theirs");
    let written = apply("p2", Some(fresh)).await.expect("the retried write");
    assert_eq!(written.spec.version, "p2");
    engine
        .delete(&ns, "web-probe", Some(&written))
        .await
        .expect("a delete as read");
    let gone = engine.read(&ns, "web-probe").await.expect("read");
    assert!(gone.is_none(), "deleted: {gone:?}");
    delete_namespace(&client, &ns).await;
}

/// A Gateway's Service is written and deleted only as it was read: a write or delete
/// decided before another writer changed it is refused (409); one decided on a fresh read
/// holds. Real API server.
#[tokio::test]
async fn a_gateway_service_write_decided_on_a_stale_read_is_refused() {
    use k8s_openapi::api::core::v1::Service;
    use kube::Api;
    use kube::api::{Patch, PatchParams};
    use switchyard::gateway::service_writes::{apply_as_read, delete_as_read};
    use switchyard_e2e::kube::{KubeApi, create_namespace, delete_namespace, unique_name};

    let api = KubeApi::shared().await;
    let client = api.client().await;
    let ns = unique_name("gwsvc");
    create_namespace(&client, &ns).await;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let desired = |port: i32| -> Service {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": "gw", "namespace": ns },
            "spec": { "selector": { "app": "envoy" }, "ports": [{ "name": "p", "port": port }] },
        }))
        .expect("a Service")
    };

    apply_as_read(&services, &desired(80), None)
        .await
        .expect("created");
    let first = services.get("gw").await.expect("read");
    // Another writer changes it.
    services
        .patch(
            "gw",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "labels": { "team": "a" } } })),
        )
        .await
        .expect("another writer's patch");

    let stale = apply_as_read(&services, &desired(81), Some(&first)).await;
    assert!(
        matches!(&stale, Err(kube::Error::Api(e)) if e.code == 409),
        "a stale write: {stale:?}"
    );
    let stale = delete_as_read(&services, &first).await;
    assert!(
        matches!(&stale, Err(kube::Error::Api(e)) if e.code == 409),
        "a stale delete: {stale:?}"
    );
    let port = |s: &Service| {
        s.spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .map(|p| p[0].port)
    };
    assert_eq!(port(&services.get("gw").await.expect("read")), Some(80));

    let fresh = services.get("gw").await.expect("read");
    apply_as_read(&services, &desired(81), Some(&fresh))
        .await
        .expect("a write as read");
    let written = services.get("gw").await.expect("read");
    assert_eq!(port(&written), Some(81));
    delete_as_read(&services, &written)
        .await
        .expect("a delete as read");
    assert!(services.get_opt("gw").await.expect("read").is_none());
    delete_namespace(&client, &ns).await;
}

/// The one status writer writes on the object as it was read: a status decided before
/// someone else changed the object is refused and dropped (that change brings a newer
/// one); one decided after it is written. Real API server.
#[tokio::test]
async fn a_status_decided_on_a_stale_read_is_not_written() {
    use std::sync::Arc;

    use kube::Api;
    use kube::api::{Patch, PatchParams};
    use switchyard::api::TrafficRoute;
    use switchyard::k8s::status::{StatusKind, StatusUpdate, StatusWriter, Write};
    use switchyard_e2e::kube::{KubeApi, create_namespace, delete_namespace, unique_name};

    let api = KubeApi::shared().await;
    api.install_crds().await;
    let client = api.client().await;
    let ns = unique_name("status");
    create_namespace(&client, &ns).await;
    let routes: Api<TrafficRoute> = Api::namespaced(client.clone(), &ns);
    let route: TrafficRoute = serde_json::from_value(serde_json::json!({
        "apiVersion": "switchyard.dev/v1alpha1", "kind": "TrafficRoute",
        "metadata": { "name": "web" },
        "spec": {
            "hosts": ["web.test"],
            "rules": [{ "backends": [{ "service": "web", "port": 80, "weight": 100 }] }],
        },
    }))
    .expect("a TrafficRoute");
    let read = routes
        .create(&Default::default(), &route)
        .await
        .expect("created")
        .metadata
        .resource_version;
    // Someone else changes it after the read.
    let changed = routes
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "labels": { "team": "a" } } })),
        )
        .await
        .expect("another writer's patch")
        .metadata
        .resource_version;
    let kind = Arc::new(StatusKind::namespaced::<TrafficRoute>(
        Write::Apply,
        &["Accepted", "Ready"],
    ));
    let writer = StatusWriter::start(client.clone(), 100.0, Default::default());
    let update = |phase: &str, read: Option<String>| StatusUpdate {
        kind: kind.clone(),
        namespace: ns.clone(),
        name: "web".into(),
        status: serde_json::json!({ "phase": phase }),
        shown: None,
        read,
    };
    let phase = || async {
        let route = routes.get("web").await.expect("the route");
        route.status.and_then(|s| s.phase).unwrap_or_default()
    };

    writer.set(update("Stale", read));
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(phase().await, "", "a status decided on a stale read");

    writer.set(update("Fresh", changed));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while phase().await != "Fresh" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a status decided on the object as it is was not written"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    delete_namespace(&client, &ns).await;
}
