//! One writer, when the leader can still write but its renewals of the Lease are refused
//! (an admission policy on the rig's real API server refuses them; every other write goes
//! through): it stops writing before the Lease can run out for the others, nobody writes
//! until another replica leads, and a leader that renews again with nobody else having led
//! goes on where it stopped (DESIGN.md "Restart-safe", I6).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::watcher;
use switchyard::api::ProxyConfig;
use switchyard_e2e::rig::{HOST, Rig, SHORT_LEASE as LEASE};

const LEASE_DURATION: Duration = Duration::from_secs(4);
/// What the admission policy says when it refuses a write of the Lease.
const REFUSAL: &str = "Lease writes refused by the test";

fn spec(service: &str) -> String {
    format!(
        "{}rollout: {{ drainPeriod: 1s }}\n",
        Rig::route_yaml(HOST, &[(service, 1)])
    )
}

/// The wall-clock time of each line of `log` that contains `needle` (tracing's RFC 3339
/// timestamp leads every line).
fn logged(log: &std::path::Path, needle: &str) -> Vec<Timestamp> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Waits (bounded) for a line of `log` containing `needle`, logged after `since`; its time.
async fn wait_logged(
    log: &std::path::Path,
    needle: &str,
    since: Timestamp,
    within: Duration,
) -> Timestamp {
    let started = Instant::now();
    loop {
        if let Some(at) = logged(log, needle).into_iter().find(|at| *at >= since) {
            return at;
        }
        assert!(
            started.elapsed() < within,
            "no {needle:?} in {} within {within:?}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A validating admission policy of the API server that refuses every write of the rig's
/// Lease while `identity` holds it (a renewal, a release), as when its writes of the Lease
/// are refused; another replica taking it over, and every other write, go through.
/// Removed by [`allow_renewals`].
async fn refuse_renewals(rig: &Rig, identity: &str) -> String {
    let name = format!("refuse-renewals-{}", rig.namespace);
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": { "name": name },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": [{
                "apiGroups": ["coordination.k8s.io"],
                "apiVersions": ["v1"],
                "operations": ["UPDATE"],
                "resources": ["leases"],
                "resourceNames": [rig.lease_name()],
            }]},
            "validations": [{
                "expression": format!(
                    "!(has(oldObject.spec.holderIdentity) && oldObject.spec.holderIdentity == '{identity}' \
                     && (!has(object.spec.holderIdentity) || object.spec.holderIdentity == '{identity}' \
                         || object.spec.holderIdentity == ''))"
                ),
                "message": REFUSAL,
            }],
        },
    }))
    .expect("a policy");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": { "name": name },
        "spec": { "policyName": name, "validationActions": ["Deny"] },
    }))
    .expect("a binding");
    Api::<ValidatingAdmissionPolicy>::all(rig.client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the policy");
    Api::<ValidatingAdmissionPolicyBinding>::all(rig.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create the binding");
    name
}

/// Waits (bounded) until the API server refuses a renewal by the Lease's holder (tried
/// as a dry run); the Lease's last renewal then, which no later one changes.
async fn wait_refused(rig: &Rig) -> Timestamp {
    let leases = Api::<Lease>::namespaced(rig.client.clone(), "default");
    let started = Instant::now();
    loop {
        let lease = leases.get(&rig.lease_name()).await.expect("the Lease");
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        // Only the policy's own refusal counts (a renewal landing in between gives a 409).
        let refused = match leases.replace(&rig.lease_name(), &dry_run, &lease).await {
            Err(kube::Error::Api(e)) => e.message.contains(REFUSAL),
            _ => false,
        };
        if refused {
            // Read again: a renewal that went through just before is the last one.
            let lease = leases.get(&rig.lease_name()).await.expect("the Lease");
            let spec = lease.spec.expect("a spec");
            return spec.renew_time.expect("renewed").0;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the admission policy never refused a renewal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn allow_renewals(rig: &Rig, name: &str) {
    let _ = Api::<ValidatingAdmissionPolicyBinding>::all(rig.client.clone())
        .delete(name, &DeleteParams::default())
        .await;
    let _ = Api::<ValidatingAdmissionPolicy>::all(rig.client.clone())
        .delete(name, &DeleteParams::default())
        .await;
}

/// When each write of a ProxyConfig of the rig's namespace was seen (only the operator
/// writes them), on the wall clock.
fn record_proxy_config_writes(rig: &Rig) -> Arc<Mutex<Vec<Timestamp>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let api: Api<ProxyConfig> = Api::namespaced(rig.client.clone(), &rig.namespace);
    let record = seen.clone();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
        let mut listed = false;
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::InitDone) => listed = true,
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) if listed => {
                    record.lock().expect("writes").push(Timestamp::now());
                }
                _ => {}
            }
        }
    });
    seen
}

/// Two replicas; the leader's renewals are refused while its writes go through, and a
/// route keeps changing. The leader writes until it fences itself, which is before its
/// Lease can run out; from then on nobody writes until the other replica leads, which
/// then completes the last change.
#[tokio::test]
async fn a_leader_whose_renewals_are_refused_stops_writing_before_its_lease_runs_out() {
    let mut rig = Rig::start(1).await;
    rig.add_backend("svc-0").await;
    rig.add_backend("svc-1").await;
    rig.start_operator("switchyard-1", &LEASE);
    rig.wait_lease_holder(Duration::from_secs(20), |h| h == Some("switchyard-1"))
        .await;
    rig.start_operator("switchyard-2", &LEASE);
    rig.apply_route("web", &spec("svc-0")).await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    let writes = record_proxy_config_writes(&rig);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let policy = refuse_renewals(&rig, "switchyard-1").await;
    let last_renewal = wait_refused(&rig).await;
    let refused = Timestamp::now();
    let log_1 = rig.operator("switchyard-1").process.log.clone();
    let log_2 = rig.operator("switchyard-2").process.log.clone();
    // A change every ~300 ms, until the other replica has led for a second: each one the
    // leader would write at once.
    let mut generation = 0;
    let mut led_at: Option<Instant> = None;
    for round in 0..120 {
        generation = rig
            .apply_route("web", &spec(["svc-1", "svc-0"][round % 2]))
            .await;
        if led_at.is_none() && rig.lease_holder().await.as_deref() == Some("switchyard-2") {
            led_at = Some(Instant::now());
        }
        if led_at.is_some_and(|at| at.elapsed() > Duration::from_secs(1)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let writes = writes.lock().expect("writes").clone();
    allow_renewals(&rig, &policy).await;

    let fenced = wait_logged(
        &log_1,
        "stopping writes before it can run out",
        last_renewal,
        Duration::ZERO,
    )
    .await;
    // Until switchyard-2 led (or the end, if it never did).
    let took_over = logged(&log_2, "became the leader")
        .first()
        .copied()
        .unwrap_or_else(Timestamp::now);
    // Refused renewals leave the Lease as it was until switchyard-2 takes it.
    let expiry = last_renewal + LEASE_DURATION;
    let before_fence = writes
        .iter()
        .filter(|w| (refused..fenced).contains(*w))
        .count();
    let while_nobody_leads: Vec<&Timestamp> = writes
        .iter()
        // A write sent just before the fence may land (and be seen) a little later.
        .filter(|w| **w > fenced + Duration::from_millis(700) && **w < took_over)
        .collect();
    eprintln!(
        "renewals refused from {refused}; fenced {fenced}; switchyard-2 led {took_over}; \
         the Lease could run out {expiry}; writes between the refusal and the fence: \
         {before_fence}; writes after the fence before the other led: {}; last generation \
         {generation}",
        while_nobody_leads.len()
    );
    assert!(
        fenced < expiry,
        "fenced at {fenced}, after the Lease could run out ({expiry})"
    );
    assert!(
        before_fence > 0,
        "no write went through between the refusal and the fence"
    );
    assert!(
        while_nobody_leads.is_empty(),
        "{} writes after the fence, before the other replica led, the first {:?}",
        while_nobody_leads.len(),
        &while_nobody_leads[..while_nobody_leads.len().min(5)]
    );
    assert!(fenced < took_over);
    assert!(led_at.is_some(), "switchyard-2 never led");
    rig.wait_ready("web", Duration::from_secs(60)).await;
    // switchyard-1 never led again.
    assert_eq!(logged(&log_1, "became the leader").len(), 1);
}

/// One replica: its renewals are refused for twice the lease duration, then allowed again.
/// It stops writing at the fence (a change made meanwhile waits: no ProxyConfig of it, no
/// status), and once a renewal goes through, nobody else having led, it goes on where it
/// stopped in the same term: the change completes, and it never became the leader anew.
#[tokio::test]
async fn a_fenced_leader_whose_renewals_go_through_again_goes_on_where_it_stopped() {
    let mut rig = Rig::start(1).await;
    rig.add_backend("svc-0").await;
    rig.add_backend("svc-1").await;
    rig.start_operator("switchyard-1", &LEASE);
    rig.apply_route("web", &spec("svc-0")).await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    let log = rig.operator("switchyard-1").process.log.clone();

    let policy = refuse_renewals(&rig, "switchyard-1").await;
    let last_renewal = wait_refused(&rig).await;
    let fenced = wait_logged(
        &log,
        "stopping writes before it can run out",
        last_renewal,
        Duration::from_secs(15),
    )
    .await;
    eprintln!("fenced {fenced}, last renewal {last_renewal}");
    assert!(
        fenced < last_renewal + LEASE_DURATION,
        "fenced after the Lease could run out"
    );
    let writes = record_proxy_config_writes(&rig);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let generation = rig.apply_route("web", &spec("svc-1")).await;
    tokio::time::sleep(LEASE_DURATION * 2).await;
    let route = rig.route("web").await;
    let observed = route.status.as_ref().and_then(|s| s.observed_generation);
    assert!(
        observed < Some(generation),
        "the change was handled while fenced: status observed generation {observed:?}"
    );
    assert!(
        writes.lock().expect("writes").is_empty(),
        "ProxyConfigs written while fenced"
    );

    allow_renewals(&rig, &policy).await;
    let renewed_again = Instant::now();
    wait_logged(
        &log,
        "writes go on where they stopped",
        fenced,
        Duration::from_secs(15),
    )
    .await;
    rig.wait_ready("web", Duration::from_secs(30)).await;
    eprintln!(
        "the change of generation {generation} is Ready {:?} after renewals were allowed again",
        renewed_again.elapsed()
    );
    assert_eq!(rig.answers().await, ["svc-1"]);
    assert_eq!(
        logged(&log, "became the leader").len(),
        1,
        "the leader took the Lease anew instead of going on"
    );
}
