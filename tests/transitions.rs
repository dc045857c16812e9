//! Transitions a user causes, on a real kube-apiserver with three real Envoys under load:
//! each must drop nothing and end Ready on the final generation (DESIGN.md I3: a rollout
//! proves only what the switch needs).

use std::time::{Duration, Instant};

use switchyard::api::TrafficRouteStatus;
use switchyard_e2e::rig::{HOST, Rig};
use switchyard_e2e::{HttpsLoad, HttpsLoadReport, pem_fingerprint};
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
        tokio::time::sleep(Duration::from_millis(300)).await;
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
    let (report, ready) = rename_in_one_sync(&["--hold", "0s"], 6).await;
    summary("rename in one sync, no hold", &report, &ready);
    assert!(
        report.non_2xx() > 0,
        "the test cannot see a rename that leaves the route without endpoints"
    );
}

/// A rename in one sync whose new Service's endpoints come `late` after the apply, on a
/// route of drain period `drain`, under load, the operator's own hold being `hold`: the
/// old Service and its slice deleted with the apply; its server stopped at once when
/// `gone`, otherwise left running. Returns the load and when (from its start) the route
/// was Ready on the new Service.
async fn rename_with_late_endpoints(
    hold: &str,
    drain: &str,
    late: Duration,
    gone: bool,
) -> (LoadReport, Duration) {
    let mut rig = Rig::start(3).await;
    rig.add_backend("old").await;
    rig.add_backend_unpublished("new", None).await;
    rig.start_operator("switchyard-1", &["--hold", hold]);
    let route = |backend: &str| {
        let spec = Rig::route_yaml(HOST, &[(backend, 1)]);
        format!("{spec}rollout: {{ drainPeriod: {drain} }}\n")
    };
    rig.apply_route("web", &route("old")).await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    let started = Instant::now();
    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    let to_new = route("new");
    tokio::join!(rig.apply_route("web", &to_new), rig.delete_service("old"));
    if gone {
        rig.stop_backend("old");
    }
    tokio::time::sleep(late).await;
    rig.publish_endpoints("new").await;
    rig.wait_ready("web", Duration::from_secs(30)).await;
    let ready = started.elapsed();
    assert_eq!(rig.answers().await, ["new", "new", "new"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    (load.finish().await, ready)
}

/// The endpoints of a deleted Service are held for the drain period of the routes that
/// use it, not the operator's hold: a route draining for 20 s moves off a Service deleted
/// in the same sync, its new endpoints 3 s late, without a failed request, though the
/// operator's own hold is 1 s.
#[tokio::test]
async fn a_deleted_services_endpoints_are_held_for_its_routes_drain_period() {
    let late = Duration::from_secs(3);
    let (report, ready) = rename_with_late_endpoints("1s", "20s", late, false).await;
    summary(
        "rename, endpoints 3 s late, route drains 20 s",
        &report,
        &[ready],
    );
    assert_eq!(report.non_2xx(), 0);
}

/// Past the hold (the route's drain period, 1 s, and the operator's, 1 s) nothing serves
/// what the route left, if its Pods are truly gone: the failures end when the new
/// configuration is served, and the rollout completes.
#[tokio::test]
async fn a_backend_gone_past_the_hold_fails_only_until_the_route_moves() {
    let late = Duration::from_secs(2);
    let (report, ready) = rename_with_late_endpoints("1s", "1s", late, true).await;
    summary(
        "rename, old Pods gone, endpoints 2 s late, route drains 1 s",
        &report,
        &[ready],
    );
    // When each failed request was sent.
    let last = (report.failures.iter())
        .map(|f| f.at.saturating_sub(f.took))
        .max();
    eprintln!("last failed request sent at {last:?}, Ready on the new Service at {ready:?}");
    let last = last.expect("requests fail past the hold: the test sees the gap");
    assert!(
        last < ready,
        "a request sent at {last:?} failed, after Ready at {ready:?}"
    );
}

#[tokio::test]
async fn a_route_whose_backend_lost_every_endpoint_still_moves() {
    let rig = Rig::serving_web(&["old", "new"], "old").await;

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

#[tokio::test]
async fn the_old_backend_scaled_to_zero_right_after_the_apply_drops_nothing() {
    let mut rig = Rig::serving_web(&["old", "new"], "old").await;

    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    let started = Instant::now();
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("new", 1)]))
        .await;
    // Scaled to zero: the Pod terminates, serving through its grace period, then goes.
    rig.set_endpoint("old", false, true, true).await;
    rig.wait_ready("web", Duration::from_secs(30)).await;
    let took = started.elapsed();
    assert_eq!(rig.answers().await, ["new", "new", "new"]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    rig.clear_endpoints("old").await;
    rig.stop_backend("old");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = load.finish().await;
    summary("old backend scaled to zero", &report, &[took]);
    assert_eq!(report.non_2xx(), 0);
}

#[tokio::test]
async fn new_pods_turning_ready_one_by_one_get_traffic_only_when_ready() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("old").await;
    rig.add_pods("new", 3).await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("old", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("new", 1)]))
        .await;
    rig.wait_status("web", Duration::from_secs(20), |s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.reason == "VerifyingEndpoints")
    })
    .await;
    // Nothing listens on the Pods that are not ready: a request sent there fails.
    rig.start_pod("new", 0).await;
    let first = Instant::now();
    rig.wait_ready("web", Duration::from_secs(30)).await;
    let took = first.elapsed();
    assert_eq!(rig.answers().await, ["new", "new", "new"]);
    for i in 1..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        rig.start_pod("new", i).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = load.finish().await;
    summary("new Pods ready one by one", &report, &[took]);
    assert_eq!(report.non_2xx(), 0);
}

/// The backend that answers `path` through Envoy `target`.
async fn backend_at(target: &str, path: &str) -> String {
    let client = reqwest::Client::new();
    let response = client
        .get(format!("{target}{path}"))
        .header("host", HOST)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {target}{path}: {e}"));
    format!(
        "{} {}",
        response.status().as_u16(),
        response
            .headers()
            .get("x-backend")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
    )
}

/// Envoy Gateway names clusters by rule index and drops requests for seconds when rules
/// are reordered; Switchyard names them by Service and port, so reordering, renaming,
/// inserting or removing rules moves no cluster at all.
#[tokio::test]
async fn rules_reordered_renamed_inserted_and_removed_drop_nothing() {
    let mut rig = Rig::start(3).await;
    for service in ["svc-a", "svc-b", "svc-rest", "svc-x"] {
        rig.add_backend(service).await;
    }
    rig.start_operator("switchyard-1", &[]);
    let rule = |name: &str, prefix: Option<&str>, service: &str| {
        let matches = prefix
            .map(|p| format!("  match: {{ pathPrefix: {p} }}\n"))
            .unwrap_or_default();
        format!("- name: {name}\n{matches}  backends: [ {{ service: {service}, port: 80 }} ]\n")
    };
    let spec = |rules: &[String]| format!("hosts: [\"{HOST}\"]\nrules:\n{}", rules.concat());
    let a = rule("a", Some("/a"), "svc-a");
    let b = rule("b", Some("/b"), "svc-b");
    let x = rule("x", Some("/x"), "svc-x");
    let rest = rule("rest", None, "svc-rest");
    rig.apply_route("web", &spec(&[a.clone(), b.clone(), rest.clone()]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    // Load on every rule's paths, through every Envoy.
    let targets: Vec<String> = rig
        .targets()
        .iter()
        .flat_map(|t| {
            [
                format!("{t}/a"),
                format!("{t}/b"),
                format!("{t}/x"),
                t.clone(),
            ]
        })
        .collect();
    let load = Load::start(targets, HOST, RATE, Duration::from_secs(300));
    let steps = [
        ("reordered", vec![b.clone(), a.clone(), rest.clone()]),
        (
            "renamed",
            vec![b.clone(), rule("alpha", Some("/a"), "svc-a"), rest.clone()],
        ),
        (
            "inserted before the catch-all",
            vec![b.clone(), a.clone(), x.clone(), rest.clone()],
        ),
        ("removed", vec![a.clone(), x.clone(), rest.clone()]),
    ];
    let mut ready = Vec::new();
    for (what, rules) in steps {
        let started = Instant::now();
        rig.apply_route("web", &spec(&rules)).await;
        rig.wait_ready("web", Duration::from_secs(30)).await;
        ready.push(started.elapsed());
        eprintln!("rules {what}: Ready in {:?}", started.elapsed());
        // Traffic on each configuration, not only across the changes.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let envoy = &rig.targets()[0];
    assert_eq!(backend_at(envoy, "/a/").await, "200 svc-a");
    assert_eq!(
        backend_at(envoy, "/b/").await,
        "200 svc-rest",
        "rule b removed"
    );
    assert_eq!(backend_at(envoy, "/x/").await, "200 svc-x");
    assert_eq!(backend_at(envoy, "/").await, "200 svc-rest");
    let report = load.finish().await;
    summary(
        "rules reordered, renamed, inserted, removed",
        &report,
        &ready,
    );
    assert_eq!(report.non_2xx(), 0);
}

#[tokio::test]
async fn a_split_whose_canary_service_is_deleted_and_recreated_drops_nothing() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("stable").await;
    rig.add_backend("canary").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route(
        "web",
        &Rig::route_yaml(HOST, &[("stable", 50), ("canary", 50)]),
    )
    .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    // Deleted by mistake (or by an uninstall and a reinstall); its Pods keep running.
    rig.delete_service("canary").await;
    let status = rig
        .wait_status("web", Duration::from_secs(20), |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Accepted" && c.status == "False")
        })
        .await;
    eprintln!(
        "canary Service deleted: {:?}",
        status.conditions.iter().find(|c| c.type_ == "Accepted")
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    rig.recreate_service("canary").await;
    let started = Instant::now();
    rig.wait_status("web", Duration::from_secs(20), |s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Accepted" && c.status == "True")
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    })
    .await;
    let took = started.elapsed();
    let seen = rig.split(300).await;
    eprintln!("after the canary Service is back: {seen:?}");
    assert!(seen.get("canary").copied().unwrap_or(0) > 60, "{seen:?}");
    let report = load.finish().await;
    summary("canary Service deleted and re-created", &report, &[took]);
    assert_eq!(report.non_2xx(), 0);
}

/// A route moved onto a Service whose EndpointSlices were just deleted (its Service going,
/// or losing its selector; its server still answering, as Pods do for a while): the
/// endpoints the operator holds for live traffic are never ready for a switch (I3). The
/// route waits on the old backend, says why, and moves once the Service has endpoints
/// again.
#[tokio::test]
async fn a_route_never_moves_onto_the_held_endpoints_of_a_deleted_slice() {
    let rig = Rig::serving_web(&["old", "new"], "old").await;
    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    rig.delete_endpoint_slices("new").await;
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("new", 1)]))
        .await;
    let status = rig
        .wait_status("web", Duration::from_secs(10), |s| {
            s.conditions.iter().any(|c| {
                c.type_ == "Ready" && c.status == "False" && c.message.contains("held endpoints")
            })
        })
        .await;
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
    eprintln!("moved onto held endpoints: {ready:?}");
    // Well past the time the switch takes (under 0.3 s here), the old backend serves.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(rig.answers().await, ["old", "old", "old"]);
    let route = rig.route("web").await;
    let status = route.status.expect("status");
    assert_eq!(status.live_generation, Some(1), "{status:#?}");

    rig.publish_endpoints("new").await;
    let took = rig.wait_ready("web", Duration::from_secs(30)).await;
    assert_eq!(rig.answers().await, ["new", "new", "new"]);
    let report = load.finish().await;
    summary("moved onto held endpoints, then back", &report, &[took]);
    assert_eq!(report.non_2xx(), 0);
}

/// A GitOps sync may apply a route before the Service it names. A TrafficRoute changed to a
/// Service that does not exist yet is not accepted (`ServiceNotFound`) and its last served
/// generation keeps serving, for as long as it takes; once the Service comes the change
/// rolls out. In the other order it rolls out at once. No request fails either way.
#[tokio::test]
async fn a_route_applied_before_its_service_keeps_serving_and_moves_once_it_comes() {
    let mut rig = Rig::serving_web(&["old"], "old").await;
    rig.add_backend_without_service("late").await;
    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("late", 1)]))
        .await;
    let status = rig
        .wait_status("web", Duration::from_secs(10), |s| {
            s.conditions.iter().any(|c| {
                c.type_ == "Accepted" && c.status == "False" && c.reason == "ServiceNotFound"
            })
        })
        .await;
    let accepted = status.conditions.iter().find(|c| c.type_ == "Accepted");
    eprintln!("route before its Service: {accepted:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(rig.answers().await, ["old", "old", "old"]);
    rig.recreate_service("late").await;
    let late = rig.wait_ready("web", Duration::from_secs(30)).await;
    assert_eq!(rig.answers().await, ["late", "late", "late"]);

    // The Service first, then the route.
    rig.add_backend("first").await;
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("first", 1)]))
        .await;
    let first = rig.wait_ready("web", Duration::from_secs(30)).await;
    assert_eq!(rig.answers().await, ["first", "first", "first"]);
    let report = load.finish().await;
    summary(
        "route before its Service, then after",
        &report,
        &[late, first],
    );
    assert_eq!(report.non_2xx(), 0);
}

// ------------------------------------------------------------------ TLS Secrets under HTTPS load

const SECRET: &str = "web-cert";

/// A rig whose route `web` serves HTTPS for [`HOST`] with the Secret [`SECRET`] (the test
/// certificate), Ready and serving that certificate on every Envoy; its fingerprint.
async fn https_rig() -> (Rig, String) {
    let mut rig = Rig::start(3).await;
    rig.add_backend("app").await;
    let (cert, key) = Rig::testdata_tls();
    rig.apply_tls_secret(SECRET, &cert, &key).await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &Rig::tls_route_yaml(HOST, SECRET, &[("app", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    let fingerprint = pem_fingerprint(&cert);
    rig.wait_certificate(HOST, &fingerprint, Duration::from_secs(10))
        .await;
    (rig, fingerprint)
}

fn https_summary(name: &str, report: &HttpsLoadReport, what: &str, took: &[Duration]) {
    let ms: Vec<String> = took
        .iter()
        .map(|d| format!("{:.0}", d.as_secs_f64() * 1000.0))
        .collect();
    let requests = &report.requests;
    eprintln!(
        "{name}: {} HTTPS requests in {:.1}s ({} new connections), non-2xx {}, by status {:?}; {what} (ms): [{}]",
        requests.sent,
        requests.elapsed.as_secs_f64(),
        report.connections,
        requests.non_2xx(),
        requests.by_status,
        ms.join(", ")
    );
    for ((target, fingerprint, fresh), seen) in &report.certificates {
        let how = if *fresh { "new" } else { "kept-alive" };
        eprintln!(
            "  {target} {fingerprint} on {how} connections: {} answers, {:.2}s..{:.2}s",
            seen.count,
            seen.first.as_secs_f64(),
            seen.last.as_secs_f64()
        );
    }
    for failure in requests.failures.iter().take(5) {
        eprintln!("  {failure:?}");
    }
}

/// Every Envoy's new connections showed `fingerprint` under the load, and no other
/// certificate after it.
fn assert_switched(report: &HttpsLoadReport, rig: &Rig, fingerprint: &str) {
    for address in rig.https_targets() {
        let target = format!("https://{address}");
        let (last_other, first) = report.switch(&target, fingerprint);
        let first = first.unwrap_or_else(|| {
            panic!("{target}: no new connection was served {fingerprint} under the load")
        });
        // Handshakes in flight when the certificate changed may end a moment later.
        assert!(
            last_other.is_none_or(|other| other < first + Duration::from_millis(100)),
            "{target}: an older certificate at {last_other:?}, after {fingerprint} at {first:?}"
        );
    }
}

/// The route's conditions that name `what`.
fn conditions_naming(status: &TrafficRouteStatus, what: &str) -> Vec<String> {
    status
        .conditions
        .iter()
        .filter(|c| c.message.contains(what))
        .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
        .collect()
}

fn is_ready(status: &TrafficRouteStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// cert-manager renews a certificate: the Secret's tls.crt and tls.key change in place.
/// Envoy takes the new certificate for new handshakes; nothing fails, not even on
/// connections kept alive across the change.
#[tokio::test]
async fn a_tls_secret_rotated_under_https_load_drops_nothing() {
    let (rig, first) = https_rig().await;
    let load = HttpsLoad::start(rig.https_targets(), HOST, RATE, Duration::from_secs(300));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut took = Vec::new();
    let mut latest = first.clone();
    for _ in 0..3 {
        let (cert, key) = Rig::new_certificate(HOST);
        let fingerprint = pem_fingerprint(&cert);
        assert_ne!(fingerprint, latest);
        let started = Instant::now();
        rig.apply_tls_secret(SECRET, &cert, &key).await;
        rig.wait_certificate(HOST, &fingerprint, Duration::from_secs(10))
            .await;
        took.push(started.elapsed());
        // Traffic on each certificate, not only across the changes.
        tokio::time::sleep(Duration::from_secs(1)).await;
        latest = fingerprint;
    }
    let report = load.finish().await;
    https_summary(
        "TLS Secret rotated 3 times",
        &report,
        "change → new certificate on every Envoy",
        &took,
    );
    assert_eq!(report.requests.non_2xx(), 0);
    assert_switched(&report, &rig, &latest);
    let status = rig.route("web").await.status.unwrap_or_default();
    assert!(is_ready(&status), "{status:#?}");
    assert_eq!(conditions_naming(&status, SECRET), Vec::<String>::new());
}

/// `kubectl delete secret` on a Secret a route serves: failing closed would break every
/// HTTPS client of the route for one command. The last good certificate keeps serving, the
/// route's status names the missing Secret, and a Secret created again is served.
#[tokio::test]
async fn a_deleted_tls_secret_keeps_the_last_good_certificate_and_says_so() {
    let (rig, old) = https_rig().await;
    let secret = format!("{}/{SECRET}", rig.namespace);
    let load = HttpsLoad::start(rig.https_targets(), HOST, RATE, Duration::from_secs(300));
    tokio::time::sleep(Duration::from_secs(1)).await;

    let deleted = Instant::now();
    rig.delete_secret(SECRET).await;
    let status = rig
        .wait_status("web", Duration::from_secs(20), |s| {
            !conditions_naming(s, &secret).is_empty()
        })
        .await;
    let said = deleted.elapsed();
    eprintln!(
        "Secret deleted, status after {:.0} ms: {:?}",
        said.as_secs_f64() * 1000.0,
        conditions_naming(&status, &secret)
    );
    assert!(
        is_ready(&status),
        "still served by every Envoy: {status:#?}"
    );
    // Serving goes on with the last good certificate, on new connections too.
    for _ in 0..10 {
        assert_eq!(rig.served_certificates(HOST).await, [old.as_str(); 3]);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let (cert, key) = Rig::new_certificate(HOST);
    let new = pem_fingerprint(&cert);
    let recreated = Instant::now();
    rig.apply_tls_secret(SECRET, &cert, &key).await;
    rig.wait_certificate(HOST, &new, Duration::from_secs(10))
        .await;
    let served = recreated.elapsed();
    rig.wait_status("web", Duration::from_secs(20), |s| {
        is_ready(s) && conditions_naming(s, &secret).is_empty()
    })
    .await;
    let cleared = recreated.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = load.finish().await;
    https_summary(
        "TLS Secret deleted and created again",
        &report,
        "delete → status names it; create → new certificate everywhere; create → status clean",
        &[said, served, cleared],
    );
    assert_eq!(report.requests.non_2xx(), 0);
    assert_switched(&report, &rig, &new);
}

/// A Secret updated with content Envoy cannot load (here tls.crt is not PEM): Envoy would
/// reject it, and an Envoy that starts meanwhile would never open its HTTPS listener. The
/// last good certificate keeps serving, on every Envoy, the restarted one included, and
/// the status names the Secret.
#[tokio::test]
async fn a_tls_secret_with_content_envoy_cannot_load_keeps_the_last_good_certificate() {
    let (mut rig, old) = https_rig().await;
    let secret = format!("{}/{SECRET}", rig.namespace);
    let load = HttpsLoad::start(rig.https_targets(), HOST, RATE, Duration::from_secs(300));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, key) = Rig::testdata_tls();
    let broken = Instant::now();
    rig.apply_secret_data(
        SECRET,
        &[
            ("tls.crt", b"not a certificate".as_slice()),
            ("tls.key", key.as_bytes()),
        ],
    )
    .await;
    let status = rig
        .wait_status("web", Duration::from_secs(20), |s| {
            !conditions_naming(s, &secret).is_empty()
        })
        .await;
    let said = broken.elapsed();
    eprintln!("Secret broken: {:?}", conditions_naming(&status, &secret));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(rig.served_certificates(HOST).await, [old.as_str(); 3]);
    let report = load.finish().await;
    https_summary(
        "TLS Secret with a tls.crt that is not PEM",
        &report,
        "change → status names it",
        &[said],
    );
    assert_eq!(report.requests.non_2xx(), 0);
    // Nothing Envoy would refuse was sent.
    let nodes = rig.operators[0].nodes().await;
    let nacks: Vec<String> = nodes["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|n| {
            n["status"]["types"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(_, t)| !t["last_nack"].is_null())
                .map(|(kind, t)| format!("{} {kind}: {}", n["node_id"], t["last_nack"]["error"]))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(nacks, Vec::<String>::new());

    // An Envoy that starts now gets the last good certificate, and serves HTTPS.
    rig.restart_envoy(0);
    let took = rig
        .wait_certificate(HOST, &old, Duration::from_secs(30))
        .await;
    eprintln!(
        "restarted Envoy serves the last good certificate after {:.0} ms",
        took.as_secs_f64() * 1000.0
    );
}

/// A host moved from route "one" to route "two": one deleted and two created in the same
/// sync (`delete_first`), or two created first (held back by the host conflict) and one
/// deleted after. Either way the host never lacks a virtual host.
async fn move_a_host(delete_first: bool) -> (LoadReport, Duration) {
    let mut rig = Rig::start(3).await;
    rig.add_backend("one-svc").await;
    rig.add_backend("two-svc").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("one", &Rig::route_yaml(HOST, &[("one-svc", 1)]))
        .await;
    rig.wait_ready("one", Duration::from_secs(60)).await;

    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    let two = Rig::route_yaml(HOST, &[("two-svc", 1)]);
    let started = Instant::now();
    if delete_first {
        rig.delete_route("one").await;
        rig.apply_route("two", &two).await;
    } else {
        rig.apply_route("two", &two).await;
        rig.wait_status("two", Duration::from_secs(20), |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Accepted" && c.reason == "HostConflict")
        })
        .await;
        rig.delete_route("one").await;
    }
    rig.wait_ready("two", Duration::from_secs(30)).await;
    let took = started.elapsed();
    assert_eq!(rig.answers().await, ["two-svc"; 3]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    (load.finish().await, took)
}

#[tokio::test]
async fn a_host_moved_to_another_route_deleted_first_drops_nothing() {
    let (report, took) = move_a_host(true).await;
    summary("host moved, old route deleted first", &report, &[took]);
    assert_eq!(report.non_2xx(), 0);
}

#[tokio::test]
async fn a_host_moved_to_another_route_created_first_drops_nothing() {
    let (report, took) = move_a_host(false).await;
    summary("host moved, new route created first", &report, &[took]);
    assert_eq!(report.non_2xx(), 0);
}

#[tokio::test]
async fn a_route_deleted_and_created_again_under_its_name_drops_nothing() {
    let rig = Rig::serving_web(&["svc-a", "svc-b"], "svc-a").await;

    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    let started = Instant::now();
    rig.delete_route("web").await;
    // Let the operator see it gone first (its ProxyConfigs collected), as a replace would.
    tokio::time::sleep(Duration::from_secs(1)).await;
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("svc-b", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(30)).await;
    let took = started.elapsed();
    assert_eq!(rig.answers().await, ["svc-b"; 3]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = load.finish().await;
    summary("route deleted and created again", &report, &[took]);
    assert_eq!(report.non_2xx(), 0);
}

/// A rollout to a Service whose Pods fail their active health checks does not switch: the
/// probe asks each Envoy for a healthy host of the new cluster, and a host that fails its
/// checks is not one. The old backend keeps every request until the new Pods pass; then
/// the switch goes through (DESIGN.md I3).
#[tokio::test]
async fn a_rollout_waits_for_new_pods_to_pass_their_health_checks() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("old").await;
    rig.add_backend("new").await;
    rig.backends["new"].set_unhealthy(true);
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("old", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    let checked = format!(
        "{}  healthCheck: {{ path: /healthz, interval: 200ms, unhealthyThreshold: 1, healthyThreshold: 1 }}\n",
        Rig::route_yaml(HOST, &[("new", 1)])
    );
    rig.apply_route("web", &checked).await;
    rig.wait_status("web", Duration::from_secs(20), |s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.reason == "VerifyingEndpoints")
    })
    .await;
    // Several rounds of checks fail meanwhile; the route stays where it was.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(rig.backends["new"].health_checks_seen() >= 3);
    let status = rig.route("web").await.status.unwrap_or_default();
    assert!(!is_ready(&status), "{status:#?}");
    assert_eq!(rig.answers().await, ["old", "old", "old"]);

    rig.backends["new"].set_unhealthy(false);
    let passed = Instant::now();
    rig.wait_ready("web", Duration::from_secs(30)).await;
    let took = passed.elapsed();
    assert_eq!(rig.answers().await, ["new", "new", "new"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = load.finish().await;
    summary(
        "new Pods failing health checks, then passing",
        &report,
        &[took],
    );
    assert_eq!(report.non_2xx(), 0);
}
