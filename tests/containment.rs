//! A route that Envoy rejects holds back no other route (I8), on a real kube-apiserver with
//! real Envoys (two delta, one SotW).
//!
//! The bad input is one no check of ours catches: a regex within RE2's repeat limit whose
//! compiled program exceeds Envoy's default program size (100), which Envoy finds only
//! when it compiles it, refusing the whole route configuration.

use std::time::{Duration, Instant};

use futures::StreamExt;

use switchyard_e2e::rig::{HOST, Rig};
use switchyard_e2e::{Load, free_port};

const BIG_PROGRAM: &str = "^/[a-z]{200}[0-9]{200}$";

fn condition<'a>(
    status: &'a switchyard::api::TrafficRouteStatus,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

fn bad_route_yaml(host: &str, regex: &str) -> String {
    format!(
        "hosts: [\"{host}\"]\nrules:\n- match: {{ pathRegex: \"{regex}\" }}\n  backends: [ {{ service: blue, port: 80 }} ]\n"
    )
}

async fn wait_rejected_by_envoy(rig: &Rig, name: &str) -> String {
    let status = rig
        .wait_status(name, Duration::from_secs(30), |s| {
            condition(s, "Ready")
                .is_some_and(|c| c.status == "False" && c.reason == "EnvoyRejected")
        })
        .await;
    condition(&status, "Ready")
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// Prints a load's outcome; every request must have succeeded.
fn assert_no_failures(host: &str, report: &switchyard_e2e::LoadReport) {
    eprintln!(
        "{host}: {} requests, by status {:?}, by backend {:?}",
        report.sent, report.by_status, report.by_backend
    );
    assert_eq!(report.non_2xx(), 0, "{host}: {:?}", report.failures);
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The NACKs a replica's xDS server counted, of every type (a delta Envoy that takes
/// virtual hosts one by one rejects a route as a VirtualHost, one over SotW as a
/// RouteConfiguration).
fn nacks(text: &str) -> f64 {
    (text.lines())
        .filter(|l| l.starts_with("switchyard_xds_nacks_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Shifts route web between blue and green four times; how long each took to be Ready.
async fn shift_web(rig: &Rig) -> Vec<Duration> {
    let mut shifts = Vec::new();
    for color in ["green", "blue", "green", "blue"] {
        let started = Instant::now();
        rig.apply_route("web", &Rig::route_yaml(HOST, &[(color, 1)]))
            .await;
        rig.wait_ready("web", Duration::from_secs(30)).await;
        shifts.push(started.elapsed());
        assert_eq!(
            rig.answers().await,
            [color; 3],
            "Ready means every Envoy serves it"
        );
    }
    shifts
}

/// A serving route changed to routes Envoy rejects, and a new route Envoy rejects, next to
/// a route shifting under load: the shifts go on as usual, the rejected change never
/// reaches traffic (its route keeps serving what it served), and both say why.
#[tokio::test]
async fn a_route_envoy_rejects_holds_back_no_other_route() {
    let mut rig = Rig::serving_web(&["blue", "green"], "blue").await;
    rig.apply_route("victim", &Rig::route_yaml("victim.test", &[("blue", 1)]))
        .await;
    rig.wait_ready("victim", Duration::from_secs(30)).await;

    let load = Load::start(rig.targets(), HOST, 240, Duration::from_secs(90));
    let victim_load = Load::start(rig.targets(), "victim.test", 60, Duration::from_secs(90));
    let shifts = shift_web(&rig).await;
    eprintln!("shifts of web, change → Ready: {shifts:?}");

    rig.apply_route("victim", &bad_route_yaml("victim.test", BIG_PROGRAM))
        .await;
    rig.apply_route("newcomer", &bad_route_yaml("newcomer.test", BIG_PROGRAM))
        .await;
    let shifts = shift_web(&rig).await;
    eprintln!("shifts of web next to the rejected routes, change → Ready: {shifts:?}");

    for name in ["victim", "newcomer"] {
        let message = wait_rejected_by_envoy(&rig, name).await;
        eprintln!("{name}: Ready=False EnvoyRejected \"{message}\"");
        assert!(message.contains("RE2 program size"), "{message}");
        let events = rig.event_reasons(name).await;
        assert_eq!(
            events.iter().filter(|r| *r == "EnvoyRejected").count(),
            1,
            "{name}: one EnvoyRejected Event: {events:?}"
        );
    }
    // The rejected change never reached traffic: victim serves its last good routes.
    assert_eq!(rig.answers_for("victim.test").await, ["blue"; 3]);
    let victim = rig.proxy_config("victim", "live").await.expect("live");
    assert_eq!(
        victim.spec.generation, 1,
        "the rejected generation was not promoted"
    );
    let metrics = rig.operator_metrics("switchyard-1").await;
    assert_eq!(metric(&metrics, "switchyard_trials_left_out"), Some(2.0));
    assert!(
        metric(
            &metrics,
            "switchyard_xds_nacks_total{type=\"RouteConfiguration\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "the NACKs are counted"
    );

    // A brand-new route becomes Ready next to them.
    rig.apply_route("fresh", &Rig::route_yaml("fresh.test", &[("green", 1)]))
        .await;
    let took = rig.wait_ready("fresh", Duration::from_secs(30)).await;
    eprintln!("a new route next to the rejected ones: Ready in {took:?}");

    // A restarted operator has none of the verdicts, only the rejected trials in the API.
    let xds_port = rig.operator("switchyard-1").xds_port;
    rig.kill_operator("switchyard-1");
    rig.start_operator_on("switchyard-2", xds_port, &[]);
    let started = Instant::now();
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("green", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    eprintln!(
        "shift after an operator restart, change → Ready: {:?}",
        started.elapsed()
    );
    wait_rejected_by_envoy(&rig, "victim").await;

    // Fixing the route completes its rollout.
    rig.apply_route("victim", &Rig::route_yaml("victim.test", &[("green", 1)]))
        .await;
    rig.wait_ready("victim", Duration::from_secs(30)).await;
    assert_eq!(rig.answers_for("victim.test").await, ["green"; 3]);

    for (host, report) in [
        (HOST, load.finish().await),
        ("victim.test", victim_load.finish().await),
    ] {
        assert_no_failures(host, &report);
    }
}

/// Good and bad routes created together: the bad ones are found among them, one by one,
/// and every good one becomes Ready. The delta Envoys take virtual hosts one by one (VHDS,
/// the default): they refuse a response of virtual hosts, not a route configuration, and
/// that counts the same.
#[tokio::test]
async fn rejected_routes_arriving_with_good_ones_are_found_among_them() {
    rejected_routes_are_found_among_good_ones(&[]).await;
}

/// The same with every Envoy taking the whole route configuration.
#[tokio::test]
async fn rejected_routes_in_whole_route_configurations_are_found_among_good_ones() {
    rejected_routes_are_found_among_good_ones(&["--virtual-host-discovery=false"]).await;
}

async fn rejected_routes_are_found_among_good_ones(operator_args: &[&str]) {
    let mut rig = Rig::start(3).await;
    rig.add_backend("blue").await;
    rig.start_operator("switchyard-1", operator_args);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("blue", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    let started = Instant::now();
    let bad: Vec<String> = (0..3).map(|i| format!("bad-{i}")).collect();
    let good: Vec<String> = (0..6).map(|i| format!("good-{i}")).collect();
    for (i, name) in bad.iter().enumerate() {
        let regex = format!("^/[a-z]{{200}}[0-9]{{{}}}$", 200 + i);
        rig.apply_route(name, &bad_route_yaml(&format!("{name}.test"), &regex))
            .await;
    }
    for name in &good {
        rig.apply_route(
            name,
            &Rig::route_yaml(&format!("{name}.test"), &[("blue", 1)]),
        )
        .await;
    }
    for name in &good {
        rig.wait_ready(name, Duration::from_secs(60)).await;
    }
    eprintln!(
        "{} good routes created with {} rejected ones: all Ready in {:?}",
        good.len(),
        bad.len(),
        started.elapsed()
    );
    for name in &bad {
        let message = wait_rejected_by_envoy(&rig, name).await;
        assert!(message.contains("RE2 program size"), "{name}: {message}");
    }
    for name in &good {
        assert_eq!(
            rig.answers_for(&format!("{name}.test")).await,
            ["blue"; 3],
            "{name}"
        );
    }
}

async fn wait_conflict_with(rig: &Rig, name: &str, winner: &str) {
    let holder = format!("{}/{winner}", rig.namespace);
    let status = rig
        .wait_status(name, Duration::from_secs(30), |s| {
            condition(s, "Accepted").is_some_and(|c| {
                c.status == "False" && c.reason == "HostConflict" && c.message.contains(&holder)
            })
        })
        .await;
    let ready = condition(&status, "Ready").expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "HostConflict")
    );
}

/// Routes asking for one host: the oldest gets it (creationTimestamp, then namespace/name),
/// whatever their names, whichever arrives first, across restarts; deleting the winner
/// hands the host over, and an older route asking for it later takes it, while the
/// younger one keeps serving its other hosts, with no failed request.
#[tokio::test]
async fn the_oldest_route_gets_a_shared_host() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("blue").await;
    rig.add_backend("green").await;
    // Created while no operator runs, oldest first; names sort the other way.
    rig.apply_route("y-oldest", &Rig::route_yaml("y.test", &[("blue", 1)]))
        .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    rig.apply_route("z-old", &Rig::route_yaml("shared.test", &[("blue", 1)]))
        .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let young = "hosts: [\"shared.test\", \"a.test\"]\nrules:\n- backends: [ { service: green, port: 80 } ]\n";
    rig.apply_route("a-young", young).await;

    rig.start_operator("switchyard-1", &[]);
    rig.wait_ready("y-oldest", Duration::from_secs(60)).await;
    rig.wait_ready("z-old", Duration::from_secs(30)).await;
    wait_conflict_with(&rig, "a-young", "z-old").await;
    assert_eq!(rig.answers_for("shared.test").await, ["blue"; 3]);

    // A restarted operator comes to the same answer.
    let xds_port = rig.operator("switchyard-1").xds_port;
    rig.kill_operator("switchyard-1");
    rig.start_operator_on("switchyard-2", xds_port, &[]);
    rig.wait_lease_holder(Duration::from_secs(60), |h| h == Some("switchyard-2"))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    rig.wait_ready("z-old", Duration::from_secs(1)).await;
    wait_conflict_with(&rig, "a-young", "z-old").await;

    let shared = Load::start(rig.targets(), "shared.test", 200, Duration::from_secs(90));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The winner is deleted: the host goes to the next in line.
    let started = Instant::now();
    rig.delete_route("z-old").await;
    rig.wait_ready("a-young", Duration::from_secs(30)).await;
    eprintln!("winner deleted → next route Ready: {:?}", started.elapsed());
    assert_eq!(rig.answers_for("shared.test").await, ["green"; 3]);

    // An older route asks for the host: it takes it; the younger keeps its other host.
    let other = Load::start(rig.targets(), "a.test", 60, Duration::from_secs(60));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    let oldest = "hosts: [\"y.test\", \"shared.test\"]\nrules:\n- backends: [ { service: blue, port: 80 } ]\n";
    rig.apply_route("y-oldest", oldest).await;
    rig.wait_ready("y-oldest", Duration::from_secs(30)).await;
    eprintln!(
        "older route takes the host: Ready in {:?}",
        started.elapsed()
    );
    wait_conflict_with(&rig, "a-young", "y-oldest").await;
    assert_eq!(rig.answers_for("shared.test").await, ["blue"; 3]);
    assert_eq!(rig.answers_for("a.test").await, ["green"; 3]);
    tokio::time::sleep(Duration::from_secs(1)).await;

    for (host, report) in [
        ("shared.test", shared.finish().await),
        ("a.test", other.finish().await),
    ] {
        assert_no_failures(host, &report);
    }
}

/// Hundreds of bad routes of every kind next to a route shifting under load (the closing
/// numbers of I8): what the API server refuses, what the operator rejects, what Envoy
/// rejects; the shifting route never fails a request and its rollouts complete.
/// `SWITCHYARD_E2E_FLOOD` sets how many bad routes the operator gets (default 300, a third
/// of each kind), plus a tenth of that which the API server refuses.
#[tokio::test]
async fn a_flood_of_bad_routes_of_every_kind_holds_back_no_other_route() {
    let flood: usize = std::env::var("SWITCHYARD_E2E_FLOOD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let per_kind = flood / 3;
    let rig = Rig::serving_web(&["blue", "green"], "blue").await;
    let baseline = shift_web(&rig).await;

    let routes: kube::Api<switchyard::api::TrafficRoute> =
        kube::Api::namespaced(rig.client.clone(), &rig.namespace);
    let mut specs: Vec<(String, serde_json::Value)> = Vec::new();
    for i in 0..per_kind {
        let rule = |extra: serde_json::Value| {
            let mut rule = serde_json::json!({ "backends": [{ "service": "blue", "port": 80 }] });
            if let (Some(rule), Some(extra)) = (rule.as_object_mut(), extra.as_object()) {
                rule.extend(extra.clone());
            }
            rule
        };
        specs.push((
            format!("missing-{i}"),
            serde_json::json!({ "hosts": [format!("missing{i}.test")],
                "rules": [{ "backends": [{ "service": "missing", "port": 80 }] }] }),
        ));
        specs.push((
            format!("lookahead-{i}"),
            serde_json::json!({ "hosts": [format!("lookahead{i}.test")],
                "rules": [rule(serde_json::json!({ "match": { "pathRegex": "/(?=x)" } }))] }),
        ));
        specs.push((
            format!("program-{i}"),
            serde_json::json!({ "hosts": [format!("program{i}.test")],
                "rules": [rule(serde_json::json!({ "match": { "pathRegex": BIG_PROGRAM } }))] }),
        ));
    }
    let refused_kinds = [
        serde_json::json!({ "requestHeaders": { "set": { "bad header": "x" } } }),
        serde_json::json!({ "requestHeaders": { "set": { "host": "evil.test" } } }),
        serde_json::json!({ "responseHeaders": { "add": { "x-a": "a\r\nb" } } }),
        serde_json::json!({ "timeout": "99999999999999h" }),
    ];
    for i in 0..flood / 10 {
        let mut rule = serde_json::json!({ "backends": [{ "service": "blue", "port": 80 }] });
        if let (Some(rule), Some(extra)) = (
            rule.as_object_mut(),
            refused_kinds[i % refused_kinds.len()].as_object(),
        ) {
            rule.extend(extra.clone());
        }
        specs.push((
            format!("refused-{i}"),
            serde_json::json!({ "hosts": [format!("refused{i}.test")], "rules": [rule] }),
        ));
    }

    let load = Load::start(rig.targets(), HOST, 240, Duration::from_secs(300));
    let flood_started = Instant::now();
    let created: Vec<(String, bool)> = futures::stream::iter(specs)
        .map(|(name, spec)| {
            let routes = routes.clone();
            async move {
                let spec = serde_json::from_value(spec).expect("spec");
                let route = switchyard::api::TrafficRoute::new(&name, spec);
                let ok = routes.create(&Default::default(), &route).await.is_ok();
                (name, ok)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let api_refused: Vec<&str> = created
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| n.as_str())
        .collect();
    eprintln!(
        "{} routes sent in {:?}: the API server refused {}",
        created.len(),
        flood_started.elapsed(),
        api_refused.len()
    );
    assert!(
        api_refused.iter().all(|n| n.starts_with("refused-")),
        "{api_refused:?}"
    );
    assert_eq!(
        api_refused.len(),
        flood / 10,
        "every invalid one is refused"
    );

    let during = shift_web(&rig).await;

    // Every bad route the API server took is reported, under its reason.
    let expected = [
        ("missing-", "ServiceNotFound"),
        ("lookahead-", "Rejected"),
        ("program-", "EnvoyRejected"),
    ];
    let deadline = Instant::now() + Duration::from_secs(180);
    let counts = loop {
        let list = routes.list(&Default::default()).await.expect("list routes");
        let mut counts = std::collections::BTreeMap::new();
        for route in &list.items {
            let name = route.metadata.name.as_deref().unwrap_or_default();
            let reason = route
                .status
                .as_ref()
                .and_then(|s| condition(s, "Ready"))
                .filter(|c| c.status == "False")
                .map(|c| c.reason.clone());
            if let Some((prefix, want)) = expected.iter().find(|(p, _)| name.starts_with(p))
                && reason.as_deref() == Some(*want)
            {
                *counts.entry(*prefix).or_insert(0usize) += 1;
            }
        }
        if counts.values().sum::<usize>() == 3 * per_kind {
            break counts;
        }
        assert!(
            Instant::now() < deadline,
            "not every bad route reported in time: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let reported_in = flood_started.elapsed();
    let after = shift_web(&rig).await;
    let memory = rig.operator("switchyard-1").process.memory_mib();
    let metrics = rig.operator_metrics("switchyard-1").await;
    let report = load.finish().await;
    eprintln!("web's shifts, change → Ready: before the flood {baseline:?}");
    eprintln!("  while the flood was reported: {during:?}");
    eprintln!("  after: {after:?}");
    eprintln!(
        "operator reported {counts:?} within {reported_in:?}; trials left out {:?}; RSS now/peak MiB {memory:?}",
        metric(&metrics, "switchyard_trials_left_out")
    );
    eprintln!(
        "web: {} requests, by status {:?}",
        report.sent, report.by_status
    );
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
    assert_eq!(
        metric(&metrics, "switchyard_trials_left_out"),
        Some(per_kind as f64)
    );
}

/// Each input Envoy 1.40 was found to refuse, applied next to a route shifting under load:
/// the API server refuses it, the operator rejects it, it is served as written, or its
/// trial is left out; never does it hold the shifting route back.
#[tokio::test]
async fn every_input_envoy_was_seen_to_refuse_is_contained() {
    let rig = Rig::serving_web(&["blue", "green"], "blue").await;
    let rule = |fields: &str| {
        format!("rules:\n- backends: [ {{ service: blue, port: 80 }} ]\n  {fields}\n")
    };
    let big_value = "v".repeat(20_000);
    let inputs: Vec<(&str, String, &str)> = vec![
        (
            "program-size",
            format!("match: {{ pathRegex: \"{BIG_PROGRAM}\" }}"),
            "EnvoyRejected",
        ),
        (
            "repeat",
            "match: { pathRegex: \"/a{1001}\" }".into(),
            "Rejected",
        ),
        (
            "percent",
            "responseHeaders: { set: { x-a: \"50%\" } }".into(),
            "Ready",
        ),
        (
            "command",
            "responseHeaders: { set: { x-a: \"%NOT_A_COMMAND%\" } }".into(),
            "Ready",
        ),
        (
            "unclosed",
            "responseHeaders: { set: { x-a: \"%REQ(x-a\" } }".into(),
            "Ready",
        ),
        (
            "big-value",
            format!("responseHeaders: {{ set: {{ x-a: {big_value} }} }}"),
            "refused",
        ),
        ("ten-years", "timeout: 87660000h".into(), "refused"),
        ("fraction", "timeout: 315576000000.5s".into(), "refused"),
        (
            "bad-name",
            "responseHeaders: { set: { \"bad header\": x } }".into(),
            "refused",
        ),
    ];
    let load = Load::start(rig.targets(), HOST, 240, Duration::from_secs(120));
    let colors = ["green", "blue"];
    let mut outcomes = Vec::new();
    for (i, (name, fields, want)) in inputs.iter().enumerate() {
        let host = format!("{name}.test");
        let spec = format!("hosts: [\"{host}\"]\n{}", rule(fields));
        let created = rig.try_apply_route(name, &spec).await;
        let color = colors[i % 2];
        let started = Instant::now();
        rig.apply_route("web", &Rig::route_yaml(HOST, &[(color, 1)]))
            .await;
        rig.wait_ready("web", Duration::from_secs(30)).await;
        let shift = started.elapsed();
        assert_eq!(rig.answers().await, [color; 3]);
        let outcome = match created {
            Err(message) => {
                assert_eq!(
                    *want, "refused",
                    "{name}: the API server refused it: {message}"
                );
                "refused by the API server".to_string()
            }
            Ok(()) if *want == "Ready" => {
                rig.wait_ready(name, Duration::from_secs(30)).await;
                let literal = rig.header_for(&host, "x-a").await;
                let value = fields.split('"').nth(1).unwrap_or_default();
                assert_eq!(literal, [value; 3], "{name}: sent as written");
                "served as written".to_string()
            }
            Ok(()) => {
                let status = rig
                    .wait_status(name, Duration::from_secs(30), |s| {
                        condition(s, "Ready")
                            .is_some_and(|c| c.status == "False" && c.reason == *want)
                    })
                    .await;
                let message = condition(&status, "Ready")
                    .map(|c| c.message.clone())
                    .unwrap_or_default();
                format!("{want}: {}", message.chars().take(120).collect::<String>())
            }
        };
        eprintln!("{name}: {outcome}; web's shift next to it: {shift:?}");
        outcomes.push(outcome);
    }
    let report = load.finish().await;
    eprintln!(
        "web: {} requests, by status {:?}",
        report.sent, report.by_status
    );
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}

/// With three replicas, Envoys' NACKs reach the route's status whichever replica each
/// Envoy is connected to: here the Envoys are split between the two replicas that do not
/// lead, each of which reports what its own Envoys rejected in its own Lease for the
/// leader to read. The status names an Envoy and its error, one Event is recorded, the
/// leader's metrics count one refused route, the route next to it stays Ready, and all of
/// it clears once the route is fixed and the Envoys take it.
#[tokio::test]
async fn nacks_from_envoys_of_other_replicas_reach_status() {
    let mut rig = Rig::start(2).await;
    rig.add_backend("blue").await;
    let (leader_port, followers) = (free_port(), [free_port(), free_port()]);
    // envoy-0 on the first follower, envoy-1 on the second.
    rig.connect_envoys_to(&followers);
    rig.start_operator_on("switchyard-1", leader_port, &[]);
    rig.wait_lease_holder(Duration::from_secs(30), |h| h == Some("switchyard-1"))
        .await;
    let names = ["switchyard-2", "switchyard-3"];
    for (name, port) in names.iter().zip(followers) {
        rig.start_operator_on(name, port, &[]);
    }
    for name in names {
        let started = Instant::now();
        while rig.operator(name).desired_version().await.is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{name} not serving"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    rig.start_envoys();
    for name in names {
        rig.operator(name)
            .wait_synced(1, Duration::from_secs(30))
            .await;
    }
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("blue", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(30)).await;

    rig.apply_route("bad", &bad_route_yaml("bad.test", BIG_PROGRAM))
        .await;
    let message = wait_rejected_by_envoy(&rig, "bad").await;
    assert!(message.contains("RE2 program size"), "{message}");
    // Each follower's Envoy, as its follower reports it, named in the one status.
    let status = rig
        .wait_status("bad", Duration::from_secs(30), |s| {
            condition(s, "Ready").is_some_and(|c| {
                c.reason == "EnvoyRejected"
                    && c.message.contains("Envoy envoy-0 ")
                    && c.message.contains("Envoy envoy-1 ")
            })
        })
        .await;
    let message = condition(&status, "Ready").map(|c| c.message.clone());
    eprintln!("bad: Ready=False EnvoyRejected {message:?}");
    let events = rig.event_reasons("bad").await;
    assert_eq!(
        events.iter().filter(|r| *r == "EnvoyRejected").count(),
        1,
        "one EnvoyRejected Event: {events:?}"
    );
    let metrics = rig.operator_metrics("switchyard-1").await;
    assert_eq!(
        metric(&metrics, "switchyard_fleet_routes_refused"),
        Some(1.0)
    );
    assert_eq!(nacks(&metrics), 0.0, "no Envoy is connected to the leader");
    for name in names {
        let metrics = rig.operator_metrics(name).await;
        assert!(nacks(&metrics) >= 1.0, "{name}'s Envoy rejected the route");
    }
    rig.wait_ready("web", Duration::from_secs(5)).await;

    // Fixed: Ready, and nothing of the refusal is left.
    rig.apply_route("bad", &Rig::route_yaml("bad.test", &[("blue", 1)]))
        .await;
    rig.wait_ready("bad", Duration::from_secs(30)).await;
    let started = Instant::now();
    loop {
        let metrics = rig.operator_metrics("switchyard-1").await;
        if metric(&metrics, "switchyard_fleet_routes_refused") == Some(0.0) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the refusal is still counted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(rig.answers_for("bad.test").await, ["blue"; 2]);
    assert_eq!(rig.lease_holder().await.as_deref(), Some("switchyard-1"));
}
