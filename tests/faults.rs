//! Faults mid-rollout, on a real kube-apiserver with three real Envoys under load: the
//! operator SIGKILLed and replaced, an Envoy SIGKILLed and restarted, the leader of two
//! replicas SIGKILLed, the leader stopped as a rolling update stops it (DESIGN.md
//! "Restart-safe", I3, I4). Every rollout must still
//! complete (Ready for the latest generation, then every Envoy answers from the new
//! backend) and no request may get a non-2xx answer.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use switchyard::api::TrafficRouteStatus;
use switchyard_e2e::rig::{HOST, Rig, SHORT_LEASE as LEASE};
use switchyard_e2e::{Failure, Load, LoadReport, free_port};

const RATE: u32 = 240;
const LEASE_DURATION: Duration = Duration::from_secs(4);

fn spec(service: &str, drain: &str) -> String {
    format!(
        "{}rollout: {{ drainPeriod: {drain} }}\n",
        Rig::route_yaml(HOST, &[(service, 1)])
    )
}

fn summary(name: &str, report: &LoadReport) {
    eprintln!(
        "{name}: {} requests in {:.1}s ({:.0}/s), non-2xx {}, by status {:?}, by backend {:?}",
        report.sent,
        report.elapsed.as_secs_f64(),
        report.sent as f64 / report.elapsed.as_secs_f64().max(0.001),
        report.non_2xx(),
        report.by_status,
        report.by_backend
    );
    for failure in report.failures.iter().take(5) {
        eprintln!("  {failure:?}");
    }
}

/// Where the rollout of the route stands, from the API server alone.
async fn rollout_state(rig: &Rig) -> String {
    let route = rig.route("web").await;
    let probe = rig.proxy_config("web", "probe").await;
    let live = rig.proxy_config("web", "live").await;
    let status = route.status.unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| {
            format!(
                "{} ({}, gen {:?})",
                c.status, c.reason, c.observed_generation
            )
        });
    format!(
        "generation {:?}: probe ProxyConfig gen {:?}, live ProxyConfig gen {:?}, phase {:?}, Ready {}",
        route.metadata.generation,
        probe.map(|p| p.spec.generation),
        live.map(|l| l.spec.generation),
        status.phase,
        ready.unwrap_or_else(|| "-".into())
    )
}

/// True when `status` says Ready for `generation`.
fn is_ready(status: &TrafficRouteStatus, generation: i64) -> bool {
    status.observed_generation == Some(generation)
        && status.conditions.iter().any(|c| {
            c.type_ == "Ready" && c.status == "True" && c.observed_generation == Some(generation)
        })
}

/// Waits until `check` holds for the route's ProxyConfigs and status.
async fn wait_for<F>(rig: &Rig, what: &str, within: Duration, check: F)
where
    F: Fn(Option<i64>, Option<i64>, &TrafficRouteStatus) -> bool,
{
    let started = Instant::now();
    loop {
        let probe = rig.proxy_config("web", "probe").await;
        let live = rig.proxy_config("web", "live").await;
        let status = rig.route("web").await.status.unwrap_or_default();
        if check(
            probe.map(|p| p.spec.generation),
            live.map(|l| l.spec.generation),
            &status,
        ) {
            return;
        }
        assert!(
            started.elapsed() < within,
            "{what}: not within {within:?}; {}",
            rollout_state(rig).await
        );
        // Close polling catches a step that passes quickly (a config staged for a moment);
        // after a second, poll gently: three GETs a time, beside Envoys under load.
        let poll = if started.elapsed() < Duration::from_secs(1) {
            2
        } else {
            20
        };
        tokio::time::sleep(Duration::from_millis(poll)).await;
    }
}

/// The rollout is over: Ready for `generation`, the probe config collected, nothing left
/// in progress; and one request through every Envoy reaches `service`.
async fn wait_complete(rig: &Rig, generation: i64, service: &str, within: Duration) {
    rig.wait_ready("web", within).await;
    assert_eq!(
        rig.answers().await,
        vec![service.to_string(); rig.envoy_addresses.len()],
        "after Ready, every Envoy serves the new backend"
    );
    wait_for(rig, "probe config collected", within, |probe, live, s| {
        probe.is_none()
            && live == Some(generation)
            && is_ready(s, generation)
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Progressing" && c.status == "False")
    })
    .await;
}

/// Round 1 kills the operator the moment the probe ProxyConfig of the new generation exists
/// (whatever step it then is in); round 2 while it waits for endpoints of a new Service
/// that has none ready yet; round 3 after promotion, during the drain period, before the
/// probe config is collected. Each time a new process (new identity, as a new pod) takes
/// over, on the other of two xDS ports the Envoys list, so they must reconnect: rounds 1
/// and 3 to the other port, round 2 to the port of the first, killed, process.
#[tokio::test]
async fn switchyard_killed_mid_rollout_and_restarted() {
    let mut rig = Rig::start(3).await;
    let replicas = [free_port(), free_port()];
    rig.connect_envoys_to(&replicas);
    rig.add_backend("svc-0").await;
    rig.start_operator_on("switchyard-1", replicas[0], &LEASE);
    rig.start_envoys();
    rig.apply_route("web", &spec("svc-0", "1s")).await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    assert_eq!(rig.answers().await, ["svc-0", "svc-0", "svc-0"]);

    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    let mut results = Vec::new();

    // Round 1: killed as soon as the new generation is staged.
    rig.add_backend("svc-1").await;
    let applied = Instant::now();
    let generation = rig.apply_route("web", &spec("svc-1", "1s")).await;
    wait_for(
        &rig,
        "probe config staged",
        Duration::from_secs(20),
        |probe, _, _| probe == Some(generation),
    )
    .await;
    rig.kill_operator("switchyard-1");
    let killed = Instant::now();
    let at_kill = rollout_state(&rig).await;
    eprintln!(
        "round 1: killed {:?} after apply; {at_kill}",
        applied.elapsed()
    );
    rig.start_operator_on("switchyard-2", replicas[1], &LEASE);
    wait_complete(&rig, generation, "svc-1", Duration::from_secs(30)).await;
    results.push(("staged", killed.elapsed(), at_kill));
    rig.remove_backend("svc-0").await;

    // Round 2: killed while the new Service has no ready endpoint (verification waits).
    rig.add_backend("svc-2").await;
    rig.set_ready("svc-2", false).await;
    let generation = rig.apply_route("web", &spec("svc-2", "1s")).await;
    rig.wait_status("web", Duration::from_secs(20), |s| {
        s.observed_generation == Some(generation)
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "VerifyingEndpoints")
    })
    .await;
    rig.kill_operator("switchyard-2");
    let killed = Instant::now();
    let at_kill = rollout_state(&rig).await;
    eprintln!("round 2: {at_kill}");
    assert!(rig.proxy_config("web", "probe").await.is_some());
    rig.start_operator_on("switchyard-3", replicas[0], &LEASE);
    let (_, took) = rig
        .wait_lease_holder(Duration::from_secs(20), |h| h == Some("switchyard-3"))
        .await;
    eprintln!("round 2: the new process leads {took:?} after it started");
    assert_eq!(
        rig.answers().await,
        ["svc-1", "svc-1", "svc-1"],
        "traffic stays where it was"
    );
    rig.set_ready("svc-2", true).await;
    wait_complete(&rig, generation, "svc-2", Duration::from_secs(30)).await;
    results.push(("verifying endpoints", killed.elapsed(), at_kill));
    rig.remove_backend("svc-1").await;

    // Round 3: killed after promotion, while the old cluster drains.
    let drain = Duration::from_secs(5);
    rig.add_backend("svc-3").await;
    let generation = rig.apply_route("web", &spec("svc-3", "5s")).await;
    wait_for(
        &rig,
        "promoted",
        Duration::from_secs(20),
        |probe, live, _| probe.is_some() && live == Some(generation),
    )
    .await;
    rig.kill_operator("switchyard-3");
    let killed = Instant::now();
    let at_kill = rollout_state(&rig).await;
    eprintln!("round 3: {at_kill}");
    let live = rig.proxy_config("web", "live").await.expect("live config");
    let promoted_at: k8s_openapi::jiff::Timestamp =
        live.metadata.annotations.as_ref().unwrap()["switchyard.dev/promoted-at"]
            .parse()
            .expect("promotion time");
    rig.start_operator_on("switchyard-4", replicas[1], &LEASE);
    wait_complete(&rig, generation, "svc-3", Duration::from_secs(30)).await;
    let collected_after = k8s_openapi::jiff::Timestamp::now().duration_since(promoted_at);
    let collected_after = Duration::try_from(collected_after).unwrap_or_default();
    eprintln!("round 3: probe config collected {collected_after:?} after the promotion");
    assert!(
        collected_after >= drain,
        "old clusters collected before the drain period ended"
    );
    results.push(("draining", killed.elapsed(), at_kill));

    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = load.finish().await;
    summary("operator killed mid-rollout", &report);
    for (round, (at, took, state)) in results.iter().enumerate() {
        eprintln!(
            "  round {} (killed while {at}): complete {took:?} after the kill; at the kill {state}",
            round + 1
        );
    }
    assert!(
        report.sent as f64 / report.elapsed.as_secs_f64() >= 200.0,
        "load too thin"
    );
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}

/// Waits until `target` answers HTTP at all (any status), returning that status and
/// when; connection errors mean the restarted Envoy has no listener yet.
async fn first_answer(target: &str, within: Duration) -> (u16, Instant) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    let started = Instant::now();
    loop {
        if let Ok(r) = client
            .get(format!("{target}/"))
            .header("host", HOST)
            .send()
            .await
        {
            return (r.status().as_u16(), Instant::now());
        }
        assert!(
            started.elapsed() < within,
            "{target} did not come back within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Cluster names an Envoy holds (admin `/clusters`), without the static xDS cluster.
async fn clusters(rig: &Rig, envoy: usize) -> Vec<String> {
    let text = rig.envoys[envoy].admin("/clusters").await;
    let mut names: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_once("::").map(|(name, _)| name.to_string()))
        .filter(|n| n != "switchyard-xds")
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Round 1 kills Envoy 1 (delta) the moment the new generation is staged; round 2 kills
/// Envoy 2 (state of the world) while the rollout waits for the new Service's endpoints,
/// which become ready while it is down: the rollout then cannot complete until it is
/// back. Each comes back on the same address with a fresh process and must get the full
/// state; its address stays in the fleet Service throughout (as a restarting pod's would
/// until its readiness probe fails).
///
/// The load runs through all three Envoys. Connections to a dead Envoy are refused:
/// those, and only those, are tolerated, and only for the Envoy that is down and only
/// between its kill and its first answer; any HTTP non-2xx, through any Envoy, fails
/// the test.
#[tokio::test]
async fn envoy_restarted_mid_rollout() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("svc-0").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &spec("svc-0", "1s")).await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    let targets = rig.targets();
    let load = Load::start(targets.clone(), HOST, RATE, Duration::from_secs(300));
    let load_started = load.started();
    // Per victim: (target, killed at, first answer at), relative to the load's start.
    let mut down = Vec::new();
    let mut ready_after = Vec::new();

    for (round, victim) in [(1usize, 1usize), (2, 2)] {
        let service = format!("svc-{round}");
        rig.add_backend(&service).await;
        let gated = round == 2;
        if gated {
            rig.set_ready(&service, false).await;
        }
        let applied = Instant::now();
        let generation = rig.apply_route("web", &spec(&service, "1s")).await;
        if gated {
            rig.wait_status("web", Duration::from_secs(20), |s| {
                s.observed_generation == Some(generation)
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.reason == "VerifyingEndpoints")
            })
            .await;
        } else {
            wait_for(
                &rig,
                "probe config staged",
                Duration::from_secs(20),
                |probe, _, _| probe == Some(generation),
            )
            .await;
        }
        // Before the kill: the load runs on its own threads and may see the refusal at once.
        let killed = load_started.elapsed();
        rig.kill_envoy(victim);
        eprintln!(
            "round {round}: envoy-{victim} killed; {}",
            rollout_state(&rig).await
        );
        if gated {
            rig.set_ready(&service, true).await;
            // Everything but the dead Envoy can be verified; the rollout must wait for it.
            let status = rig
                .wait_status("web", Duration::from_secs(20), |s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == "Ready"
                            && c.status == "False"
                            && c.message.contains("Envoys ready 2/3")
                            && c.message.contains(&rig.envoy_addresses[victim])
                    })
                })
                .await;
            let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
            eprintln!("round {round}: while envoy-{victim} is down: {ready:?}");
            // The status says which Envoy holds the rollout back, and stays put while that
            // does not change: no rewrite on every check.
            let mut versions = BTreeSet::new();
            // What each rewrite said, to tell what changed if there are too many.
            let mut seen = Vec::new();
            for _ in 0..20 {
                let route = rig.route("web").await;
                if versions.insert(route.metadata.resource_version.clone()) {
                    seen.push(route.status);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(
                versions.len() <= 3,
                "the route was rewritten {} times in a second while envoy-{victim} was down: \
                 {seen:#?}",
                versions.len() - 1
            );
            let route = rig.route("web").await;
            assert!(
                !is_ready(&route.status.unwrap_or_default(), generation),
                "Ready although envoy-{victim} cannot have proven anything"
            );
        } else {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        rig.restart_envoy(victim);
        let (status, back) = first_answer(&targets[victim], Duration::from_secs(30)).await;
        assert!(
            (200..300).contains(&status),
            "envoy-{victim}'s first answer after its restart: {status}"
        );
        down.push((
            targets[victim].clone(),
            killed,
            back.duration_since(load_started),
        ));
        let took = rig.wait_ready("web", Duration::from_secs(30)).await;
        let took = took.max(applied.elapsed());
        ready_after.push(took);
        assert_eq!(rig.answers().await, vec![service.clone(); 3]);
        // The full state: what every other Envoy has.
        let peer = (victim + 1) % 3;
        let started = Instant::now();
        while clusters(&rig, victim).await != clusters(&rig, peer).await {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "envoy-{victim} holds {:?}, envoy-{peer} {:?}",
                clusters(&rig, victim).await,
                clusters(&rig, peer).await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        rig.operators[0]
            .wait_synced(3, Duration::from_secs(10))
            .await;
        eprintln!(
            "round {round}: envoy-{victim} down {:?}, first answer {status}; Ready {took:?} after apply; clusters {:?}",
            down.last()
                .map(|(_, k, b)| b.saturating_sub(*k))
                .unwrap_or_default(),
            clusters(&rig, victim).await
        );
        rig.remove_backend(&format!("svc-{}", round - 1)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = load.finish().await;
    summary("envoy restarted mid-rollout", &report);
    let tolerated = |f: &Failure| {
        f.status.is_none()
            && down.iter().any(|(target, killed, back)| {
                f.target == *target && f.at >= *killed && f.at <= *back
            })
    };
    let (refused, failed): (Vec<&Failure>, Vec<&Failure>) =
        report.failures.iter().partition(|f| tolerated(f));
    eprintln!(
        "  requests to a dead Envoy (refused, tolerated): {}; any other non-2xx: {}; Ready after apply: {ready_after:?}",
        refused.len(),
        failed.len()
    );
    assert!(
        report.sent as f64 / report.elapsed.as_secs_f64() >= 200.0,
        "load too thin"
    );
    assert!(failed.is_empty(), "{failed:#?}");
}

/// Two replicas behind every Envoy; the first is the leader and Envoys 0 and 2 are
/// connected to it, Envoy 1 to the other. The leader is SIGKILLed and a new generation
/// applied at once: the other replica must take the Lease over — at most the lease
/// duration after the kill (the lease was renewed at most then), plus up to two of the
/// follower's reads of the Lease (0.6 s apart with this lease), plus slack — complete the rollout,
/// and the killed leader's Envoys, now failed over to it, keep serving.
#[tokio::test]
async fn leader_failover_with_two_replicas() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("blue").await;
    rig.add_backend("green").await;
    let replicas = [free_port(), free_port()];
    rig.connect_envoys_to(&replicas);
    rig.start_operator_on("switchyard-1", replicas[0], &LEASE);
    rig.wait_lease_holder(Duration::from_secs(30), |h| h.is_some())
        .await;
    rig.start_operator_on("switchyard-2", replicas[1], &LEASE);
    // Both serve xDS before the Envoys start, so that the fleet spreads over both.
    for operator in &rig.operators {
        let started = Instant::now();
        while operator.desired_version().await.is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{}",
                operator.process.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    rig.start_envoys();
    rig.apply_route("web", &spec("blue", "1s")).await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    assert_eq!(rig.answers().await, ["blue", "blue", "blue"]);

    let leader = rig.lease_holder().await.expect("a leader");
    let (leader_index, survivor_index) = if leader == "switchyard-1" {
        (0, 1)
    } else {
        (1, 0)
    };
    let node_ids = |view: serde_json::Value| -> Vec<String> {
        let mut ids: Vec<String> = view["nodes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|n| n["node_id"].as_str().map(str::to_string))
            .collect();
        ids.sort();
        ids
    };
    let on_leader = node_ids(rig.operators[leader_index].nodes().await);
    let on_survivor = node_ids(rig.operators[survivor_index].nodes().await);
    eprintln!("leader {leader}: Envoys {on_leader:?}; the other replica: {on_survivor:?}");
    assert!(
        !on_leader.is_empty() && !on_survivor.is_empty(),
        "the fleet should be spread over both replicas"
    );
    let leader_targets: Vec<String> = on_leader
        .iter()
        .map(|id| {
            let i: usize = id.trim_start_matches("envoy-").parse().expect("envoy-<i>");
            rig.targets()[i].clone()
        })
        .collect();

    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    tokio::time::sleep(Duration::from_millis(500)).await;
    rig.kill_operator(&leader);
    let killed = Instant::now();
    let lease = rig.lease_holder().await;
    assert_eq!(lease.as_deref(), Some(leader.as_str()));
    let renewed = {
        let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube::Api::namespaced(rig.client.clone(), "default");
        leases
            .get(&rig.lease_name())
            .await
            .expect("lease")
            .spec
            .and_then(|s| s.renew_time)
            .map(|t| t.0)
            .expect("renew time")
    };
    let renewed_before_kill =
        Duration::try_from(k8s_openapi::jiff::Timestamp::now().duration_since(renewed))
            .unwrap_or_default();
    let applied = Instant::now();
    let generation = rig.apply_route("web", &spec("green", "1s")).await;
    let (holder, _) = rig
        .wait_lease_holder(Duration::from_secs(20), |h| h.is_some_and(|h| h != leader))
        .await;
    let takeover = killed.elapsed();
    let after_expiry = (renewed_before_kill + takeover).saturating_sub(LEASE_DURATION);
    eprintln!(
        "takeover by {holder:?} {takeover:?} after the kill (lease last renewed {renewed_before_kill:?} before it; {after_expiry:?} after it expired)"
    );
    assert!(
        takeover <= LEASE_DURATION + Duration::from_secs(2),
        "takeover took {takeover:?}"
    );
    rig.wait_ready("web", Duration::from_secs(30)).await;
    let ready = applied.elapsed();
    let ready_after_kill = killed.elapsed();
    assert_eq!(rig.answers().await, ["green", "green", "green"]);
    wait_complete(&rig, generation, "green", Duration::from_secs(30)).await;
    // The killed leader's Envoys failed over: the survivor serves all three, synced.
    rig.operators[survivor_index]
        .wait_synced(3, Duration::from_secs(10))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = load.finish().await;
    summary("leader failover", &report);
    let through_leaders_envoys: usize = leader_targets
        .iter()
        .map(|t| report.by_target.get(t).copied().unwrap_or(0))
        .sum();
    eprintln!(
        "  through the killed leader's Envoys {leader_targets:?}: {through_leaders_envoys} requests, non-2xx {}; Ready {ready:?} after apply, {ready_after_kill:?} after the kill",
        report
            .failures
            .iter()
            .filter(|f| leader_targets.contains(&f.target))
            .count()
    );
    assert!(through_leaders_envoys > 0);
    assert!(
        report.sent as f64 / report.elapsed.as_secs_f64() >= 200.0,
        "load too thin"
    );
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}

/// A new leader must verify against the whole fleet even when listing the fleet Service's
/// EndpointSlices takes a while: here 100 extra slices of 1000 not-ready endpoints each (a
/// large fleet mid-rollout, say). The first leader stalls in VerifyingEndpoints because the
/// new Service has no ready endpoint; it is killed and a new process takes over. Until the
/// Service gets endpoints, the route must not become Ready and traffic must stay put.
///
/// Fails today: `controller::run` starts reconciling before its Service and fleet stores
/// have their initial lists, and an empty fleet verifies vacuously (`envoys.is_empty()`),
/// so the new leader promotes at once ("served by every Envoy (0/0)").
#[tokio::test]
async fn a_new_leader_verifies_against_a_slowly_listed_fleet() {
    use std::collections::BTreeMap;

    use k8s_openapi::api::discovery::v1::{
        Endpoint, EndpointConditions, EndpointPort, EndpointSlice,
    };
    use kube::api::{ObjectMeta, PostParams};
    use switchyard_e2e::rig::FLEET_NAMESPACE;

    let mut rig = Rig::start(3).await;
    let slices: kube::Api<EndpointSlice> =
        kube::Api::namespaced(rig.client.clone(), FLEET_NAMESPACE);
    for n in 0..100 {
        let endpoints = (0..1000)
            .map(|i| Endpoint {
                addresses: vec![format!("198.19.{}.{}", i / 250, i % 250 + 1)],
                conditions: Some(EndpointConditions {
                    ready: Some(false),
                    serving: Some(false),
                    terminating: Some(false),
                }),
                ..Default::default()
            })
            .collect();
        let slice = EndpointSlice {
            metadata: ObjectMeta {
                name: Some(format!("{}-not-ready-{n}", rig.fleet_service())),
                labels: Some(BTreeMap::from([(
                    "kubernetes.io/service-name".to_string(),
                    rig.fleet_service(),
                )])),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: Some(endpoints),
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                port: Some(i32::from(rig.ports.probe)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
        };
        slices
            .create(&PostParams::default(), &slice)
            .await
            .expect("not-ready fleet slice");
    }
    let replicas = [free_port(), free_port()];
    rig.connect_envoys_to(&replicas);
    rig.add_backend("svc-0").await;
    rig.start_operator_on("switchyard-1", replicas[0], &LEASE);
    rig.start_envoys();
    rig.apply_route("web", &spec("svc-0", "1s")).await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    // Every Envoy serves it (this too fails when the first leader verified vacuously).
    assert_eq!(rig.answers().await, ["svc-0", "svc-0", "svc-0"]);

    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    rig.add_backend("svc-1").await;
    rig.set_ready("svc-1", false).await;
    let generation = rig.apply_route("web", &spec("svc-1", "1s")).await;
    rig.wait_status("web", Duration::from_secs(20), |s| {
        s.observed_generation == Some(generation)
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "VerifyingEndpoints")
    })
    .await;
    rig.kill_operator("switchyard-1");
    rig.start_operator_on("switchyard-2", replicas[1], &LEASE);
    rig.wait_lease_holder(Duration::from_secs(20), |h| h == Some("switchyard-2"))
        .await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let status = rig.route("web").await.status.unwrap_or_default();
        assert!(
            !is_ready(&status, generation),
            "Ready although svc-1 has no ready endpoint: {:?}",
            status.conditions.iter().find(|c| c.type_ == "Ready")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        rig.answers().await,
        ["svc-0", "svc-0", "svc-0"],
        "traffic stays on the old backend"
    );
    rig.set_ready("svc-1", true).await;
    wait_complete(&rig, generation, "svc-1", Duration::from_secs(30)).await;
    let report = load.finish().await;
    summary("new leader, slowly listed fleet", &report);
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}

#[tokio::test]
async fn a_rollout_goes_on_within_a_second_or_two_of_the_api_server_being_back() {
    let mut rig = Rig::start(3).await;
    let Some(relay) = relay_in_front_of_the_api(&rig).await else {
        eprintln!("skipped: needs the rig's own API server to put a relay in front of");
        return;
    };
    rig.connect_operators_via(relay.address);
    rig.add_backend("svc-0").await;
    rig.add_backend("svc-1").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &spec("svc-0", "1s")).await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(300));
    // Long enough for kube-runtime's default watch backoff to reach 6.4 s (its next retry
    // ~5 s after the API is back), well short of the 15 s lease: the operator keeps
    // leading and must notice the API is back by itself.
    relay.cut();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let generation = rig.apply_route("web", &spec("svc-1", "1s")).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    relay.restore();
    let took = rig.wait_ready("web", Duration::from_secs(60)).await;
    wait_complete(&rig, generation, "svc-1", Duration::from_secs(60)).await;
    let report = load.finish().await;
    summary("API server away for 7 s", &report);
    eprintln!(
        "Ready for the change made while the API was away: {:.0} ms after it was back",
        took.as_secs_f64() * 1000.0
    );
    assert_eq!(report.non_2xx(), 0);
    // A watch retries within a second; the rollout itself takes ~100 ms.
    assert!(
        took < Duration::from_secs(2),
        "Ready {took:?} after the API server was back"
    );
}

/// A rolling update stops the leader with SIGTERM: it releases the Lease before it exits,
/// so the other replica leads at once instead of when the Lease runs out.
#[tokio::test]
async fn a_leader_stopped_with_sigterm_hands_the_lease_over_before_it_exits() {
    // A Lease far longer than the test waits: only a release lets the other take over.
    const LONG_LEASE: [&str; 4] = [
        "--lease-duration-seconds",
        "60",
        "--lease-grace-seconds",
        "5",
    ];
    let mut rig = Rig::start(1).await;
    let replicas = [free_port(), free_port()];
    rig.connect_envoys_to(&replicas);
    rig.add_backend("svc-0").await;
    rig.start_operator_on("switchyard-1", replicas[0], &LONG_LEASE);
    rig.wait_lease_holder(Duration::from_secs(20), |h| h == Some("switchyard-1"))
        .await;
    rig.start_operator_on("switchyard-2", replicas[1], &LONG_LEASE);
    rig.start_envoys();
    rig.apply_route("web", &spec("svc-0", "1s")).await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    assert!(
        rig.stop_operator("switchyard-1", Duration::from_secs(10)),
        "the leader did not exit on SIGTERM"
    );
    let holder = rig.lease_holder().await;
    assert_ne!(
        holder.as_deref(),
        Some("switchyard-1"),
        "the stopped leader still holds the Lease"
    );
    let (_, took) = rig
        .wait_lease_holder(Duration::from_secs(30), |h| h == Some("switchyard-2"))
        .await;
    eprintln!("the other replica leads {took:?} after the leader exited");
    // And it leads: a new generation becomes Ready.
    rig.add_backend("svc-1").await;
    rig.apply_route("web", &spec("svc-1", "1s")).await;
    rig.wait_ready("web", Duration::from_secs(30)).await;
}

/// Three replicas started at the same moment, 20 times: exactly one leads each time. (All
/// of them once wrote the Lease as the same field manager, so a second server-side apply
/// of holderIdentity did not conflict: two replicas led for a lease period.)
#[tokio::test]
async fn replicas_started_together_never_both_lead() {
    for round in 0..20 {
        let mut rig = Rig::start(0).await;
        let names: Vec<String> = (0..3).map(|i| format!("replica-{round}-{i}")).collect();
        for name in &names {
            rig.start_operator(name, &LEASE);
        }
        let (holder, _) = rig
            .wait_lease_holder(Duration::from_secs(20), |h| {
                h.is_some_and(|h| names.iter().any(|n| n == h))
            })
            .await;
        // Past the moment a second replica would have taken the Lease too (each take is
        // conditional on the version it read: of two at once, one is refused).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let leaders: Vec<&String> = names
            .iter()
            .filter(|name| {
                std::fs::read_to_string(&rig.operator(name).process.log)
                    .unwrap_or_default()
                    .contains("became the leader")
            })
            .collect();
        assert_eq!(
            leaders,
            [holder.as_ref().expect("a holder")],
            "round {round}: exactly the Lease's holder leads"
        );
    }
}

/// The time of the first log line of `process` containing `needle` (tracing's RFC 3339
/// timestamp at the start of the line).
fn logged_at(log: &std::path::Path, needle: &str) -> Option<k8s_openapi::jiff::Timestamp> {
    std::fs::read_to_string(log)
        .ok()?
        .lines()
        .find(|l| l.contains(needle))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A leader cut off from the API server (its own connections only) stops writing before
/// its Lease can run out, so it has stopped when the other replica takes over: never two
/// writers, although it cannot learn that it lost.
#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_stops_before_another_can_lead() {
    let mut rig = Rig::start(0).await;
    let Some(relay) = relay_in_front_of_the_api(&rig).await else {
        eprintln!("skipped: needs the rig's own API server to put a relay in front of");
        return;
    };
    rig.connect_operators_via(relay.address);
    rig.start_operator("switchyard-1", &LEASE);
    rig.wait_lease_holder(Duration::from_secs(20), |h| h == Some("switchyard-1"))
        .await;
    rig.connect_operators_directly();
    rig.start_operator("switchyard-2", &LEASE);
    tokio::time::sleep(Duration::from_secs(1)).await;

    relay.cut();
    let cut = Instant::now();
    let (_, took) = rig
        .wait_lease_holder(Duration::from_secs(20), |h| h == Some("switchyard-2"))
        .await;
    eprintln!("the other replica leads {:?} after the cut", cut.elapsed());
    assert!(
        took >= LEASE_DURATION / 2,
        "taken over too soon to be an expiry: {took:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fenced = logged_at(&rig.operator("switchyard-1").process.log, "stopping writes");
    let took_over = logged_at(
        &rig.operator("switchyard-2").process.log,
        "became the leader",
    );
    let (Some(fenced), Some(took_over)) = (fenced, took_over) else {
        panic!("missing log lines: fenced {fenced:?}, took over {took_over:?}");
    };
    eprintln!(
        "the cut-off leader stopped {:?} before the other led",
        took_over.duration_since(fenced)
    );
    assert!(
        fenced < took_over,
        "the cut-off leader stopped writing at {fenced}, after the other led at {took_over}"
    );
}

/// A relay in front of the rig's own API server (`None` for an existing cluster).
async fn relay_in_front_of_the_api(rig: &Rig) -> Option<switchyard_e2e::relay::Relay> {
    if !rig.api.is_local() {
        return None;
    }
    let server = rig
        .api
        .server
        .trim_start_matches("https://")
        .parse()
        .expect("the API server's address");
    Some(switchyard_e2e::relay::Relay::start(server).await)
}
