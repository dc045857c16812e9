//! Transitions a user causes, on a real kube-apiserver with three real Envoys under load:
//! each must drop nothing and end Ready on the final generation (DESIGN.md I3: a rollout
//! proves only what the switch needs).

use std::time::{Duration, Instant};

use switchyard_e2e::rig::{HOST, Rig};
use switchyard_e2e::{Load, LoadReport};

const RATE: u32 = 240;

fn summary(name: &str, report: &LoadReport, ready: &[Duration]) {
    let ms: Vec<String> = ready
        .iter()
        .map(|d| format!("{:.0}", d.as_secs_f64() * 1000.0))
        .collect();
    eprintln!(
        "{name}: {} requests in {:.1}s, non-2xx {}, by status {:?}; change → Ready (ms): [{}]",
        report.sent,
        report.elapsed.as_secs_f64(),
        report.non_2xx(),
        report.by_status,
        ms.join(", ")
    );
    for failure in report.failures.iter().take(5) {
        eprintln!("  {failure:?}");
    }
}

/// A Helm upgrade or Argo CD sync that renames a Service: the route is repointed to the new
/// Service and the old Service with its EndpointSlice is deleted at the same instant. The
/// old Pods keep running a while, as Pods do, then stop.
async fn rename_in_one_sync(extra: &[&str], rounds: usize) -> (LoadReport, Vec<Duration>) {
    let mut rig = Rig::start(3).await;
    rig.add_backend("svc-0").await;
    rig.start_operator("switchyard-1", extra);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("svc-0", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    let mut ready = Vec::new();
    for i in 1..=rounds {
        let (old, new) = (format!("svc-{}", i - 1), format!("svc-{i}"));
        rig.add_backend(&new).await;
        let spec = Rig::route_yaml(HOST, &[(&new, 1)]);
        let started = Instant::now();
        tokio::join!(rig.apply_route("web", &spec), rig.delete_service(&old),);
        rig.wait_ready("web", Duration::from_secs(30)).await;
        ready.push(started.elapsed());
        assert_eq!(rig.answers().await, [new.clone(), new.clone(), new.clone()]);
        // The old Pods terminate once nothing sends them traffic any more.
        rig.stop_backend(&old);
    }
    (load.finish().await, ready)
}

#[tokio::test]
async fn a_rename_in_one_sync_drops_nothing() {
    let (report, ready) = rename_in_one_sync(&[], 6).await;
    summary("rename in one sync", &report, &ready);
    assert_eq!(report.non_2xx(), 0);
}

#[tokio::test]
async fn without_the_endpoint_hold_a_rename_in_one_sync_drops_requests() {
    // Proof that the test above can see what the hold guards against: the live route is
    // left without endpoints between the delete and the switch.
    let (report, ready) = rename_in_one_sync(&["--endpoint-hold", "0s"], 6).await;
    summary("rename in one sync, no hold", &report, &ready);
    assert!(
        report.non_2xx() > 0,
        "the test cannot see a rename that leaves the route without endpoints"
    );
}

#[tokio::test]
async fn a_route_whose_backend_lost_every_endpoint_still_moves() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("old").await;
    rig.add_backend("new").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("old", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    // The current backend has no ready endpoint left: the route is down, and moving it is
    // the most urgent rollout there is. It must not wait for the old backend's health.
    rig.set_ready("old", false).await;
    let started = Instant::now();
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("new", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(30)).await;
    let took = started.elapsed();
    eprintln!(
        "moved off a backend without endpoints in {:.0} ms",
        took.as_secs_f64() * 1000.0
    );
    assert_eq!(rig.answers().await, ["new", "new", "new"]);
}

#[tokio::test]
async fn a_change_supersedes_a_generation_that_waits_for_endpoints_forever() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("svc-0").await;
    rig.add_backend("never").await;
    rig.set_ready("never", false).await;
    rig.add_backend("svc-1").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("svc-0", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("never", 1)]))
        .await;
    rig.wait_status("web", Duration::from_secs(20), |s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.reason == "VerifyingEndpoints")
    })
    .await;
    // The next generation must not wait for the abandoned one.
    let started = Instant::now();
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("svc-1", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(30)).await;
    let took = started.elapsed();
    assert_eq!(rig.answers().await, ["svc-1", "svc-1", "svc-1"]);
    let report = load.finish().await;
    summary("superseding a stuck generation", &report, &[took]);
    assert_eq!(report.non_2xx(), 0);
}
