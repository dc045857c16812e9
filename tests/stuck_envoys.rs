//! One stuck Envoy of three never freezes the fleet (issue #37), on a real kube-apiserver
//! with real Envoys under load: a rollout waits for it only as long as the bound that
//! docs/concepts.md states, its status names it the whole time, an Event names it once it
//! has held the rollout back for a while, and requests through the Envoys keep answering.
//! So for TrafficRoutes, and for an HTTPRoute through its Gateway.

use std::time::{Duration, Instant};

use kube::Api;
use serde_json::Value;
use switchyard::api::TrafficRouteStatus;
use switchyard::gateway::api::httproutes::HttpRoute;
use switchyard_e2e::gateway::{edge_gateway, edge_targets, install_crds, select_fleet};
use switchyard_e2e::kube::{self as k};
use switchyard_e2e::kubelet_probes::KubeletProbes;
use switchyard_e2e::relay::Relay;
use switchyard_e2e::rig::{HOST, Rig};
use switchyard_e2e::{Load, LoadReport, free_port};

const RATE: u32 = 200;
/// The stuck Envoy (a SotW one: every third Envoy of the rig is).
const STUCK: usize = 2;

/// Ready's message, whatever its status.
fn ready_message(status: &TrafficRouteStatus) -> Option<(String, String)> {
    (status.conditions.iter())
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.message.clone()))
}

/// Once the route's status says it waits for the Envoy at `stuck`: its Ready condition.
async fn waiting_for(rig: &Rig, stuck: &str) -> (String, String) {
    let status = rig
        .wait_status("web", Duration::from_secs(10), |s| {
            ready_message(s)
                .is_some_and(|(status, message)| status == "False" && message.contains(stuck))
        })
        .await;
    ready_message(&status).unwrap_or_default()
}

fn assert_none_failed(name: &str, report: &LoadReport) {
    eprintln!(
        "{name}: {} requests, by status {:?}, by backend {:?}",
        report.sent, report.by_status, report.by_backend
    );
    let shown: Vec<_> = report.failures.iter().take(5).collect();
    assert_eq!(report.non_2xx(), 0, "{name}: requests failed: {shown:#?}");
}

/// A hung Envoy (SIGSTOP) mid-rollout: the change waits for it, saying so, until its
/// readiness probe fails and it leaves the fleet (within 5 s: two probes 2 s apart, a
/// second each), then goes on without it, woken by the fleet's change. Thawed, it is ready
/// again and serves the route as it is now.
#[tokio::test]
async fn a_frozen_envoy_holds_a_rollout_back_only_until_it_stops_being_ready() {
    let rig = Rig::serving_web(&["blue", "green"], "blue").await;
    let probes = KubeletProbes::start(&rig);
    let healthy: Vec<String> = rig.targets().into_iter().take(2).collect();
    let load = Load::start(healthy, HOST, RATE, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_millis(300)).await;

    rig.envoys[STUCK].freeze();
    let stuck = rig.envoy_addresses[STUCK].clone();
    let changed = Instant::now();
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("green", 1)]))
        .await;
    let waiting = waiting_for(&rig, &stuck).await;
    eprintln!("while frozen: {waiting:?}");
    rig.wait_ready("web", Duration::from_secs(30)).await;
    let ready = changed.elapsed();
    let Some(left) = probes.marked(STUCK, false) else {
        panic!("Ready before the frozen Envoy left the fleet");
    };
    let after_it_left = Instant::now().saturating_duration_since(left);
    eprintln!(
        "frozen: Ready {ready:?} after the change; the Envoy left the fleet {:?} after the change, \
         Ready {after_it_left:?} after that",
        left.saturating_duration_since(changed)
    );

    rig.envoys[STUCK].thaw();
    let thawed = Instant::now();
    while probes.marked(STUCK, true).is_none_or(|at| at < thawed) {
        assert!(
            thawed.elapsed() < Duration::from_secs(20),
            "the thawed Envoy never became ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        rig.answers_for(HOST).await,
        ["green", "green", "green"],
        "the thawed Envoy serves the route as it is now"
    );
    assert_none_failed("frozen Envoy", &load.finish().await);
}

/// An Envoy whose xDS connection goes on being open but carries nothing, while it still
/// serves and Kubernetes counts it ready: the rollout waits for it (its routes would lose
/// their backends otherwise), its status names it the whole time and an Event does after
/// 10 s. Its connection is dropped by Envoy's keepalive (10 s) and opened again; once the
/// new one gets through, the rollout completes.
#[tokio::test]
async fn an_envoy_whose_xds_stream_is_stuck_is_named_until_its_connection_is_replaced() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("blue").await;
    rig.add_backend("green").await;
    let xds = free_port();
    let relay = Relay::start(std::net::SocketAddr::from(([127, 0, 0, 1], xds))).await;
    rig.connect_envoys_to(&[xds]);
    rig.connect_envoy_to(STUCK, &[relay.address.port()]);
    rig.start_operator_on("switchyard-1", xds, &[]);
    rig.start_envoys();
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("blue", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Every connection through the relay, the open one and any new one, carries nothing.
    relay.stall();
    let stuck = rig.envoy_addresses[STUCK].clone();
    let changed = Instant::now();
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("green", 1)]))
        .await;
    let waiting = waiting_for(&rig, &stuck).await;
    eprintln!("while stuck: {waiting:?}");
    let started = Instant::now();
    while !rig
        .event_reasons("web")
        .await
        .contains(&"EnvoysLagging".into())
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no Event named the stuck Envoy: {:?}",
            rig.event_reasons("web").await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let named = changed.elapsed();
    let still = rig.route("web").await;
    let status = still.status.as_ref().and_then(ready_message);
    assert!(
        status
            .as_ref()
            .is_some_and(|(ready, message)| ready == "False" && message.contains(&stuck)),
        "status no longer names the stuck Envoy: {status:?}"
    );

    // A new connection gets through: Envoy drops the stuck one and is served on it.
    relay.carry_new_connections();
    let freed = Instant::now();
    rig.wait_ready("web", Duration::from_secs(30)).await;
    let ready = freed.elapsed();
    eprintln!(
        "stuck xDS: an Event named it {named:?} after the change; Ready {ready:?} after a \
         new connection could get through ({:?} after the change)",
        changed.elapsed()
    );
    assert_eq!(rig.answers_for(HOST).await, ["green", "green", "green"]);
    assert_none_failed("stuck xDS stream", &load.finish().await);
    relay.unstall();
}

/// An Envoy connected to a replica that hangs (SIGSTOP: its connections stay open and
/// nothing answers), not the leader: the rollout waits for that Envoy, naming it, until
/// Envoy's keepalive drops the connection (10 s) and it connects to the other replica,
/// which serves it the change.
#[tokio::test]
async fn an_envoy_of_a_hung_replica_moves_to_another_and_the_rollout_completes() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("blue").await;
    rig.add_backend("green").await;
    let (leader, other) = (free_port(), free_port());
    rig.connect_envoys_to(&[leader, other]);
    rig.start_operator_on("switchyard-1", leader, &[]);
    rig.wait_lease_holder(Duration::from_secs(30), |h| h == Some("switchyard-1"))
        .await;
    rig.start_operator_on("switchyard-2", other, &[]);
    rig.start_envoys();
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("blue", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    // Envoy 1 lists the other replica first.
    let on_other = rig.operator("switchyard-2").nodes().await;
    let connected: Vec<&str> = (on_other["nodes"].as_array().into_iter().flatten())
        .filter_map(|n| n["node_id"].as_str())
        .collect();
    assert!(connected.contains(&"envoy-1"), "{on_other:#}");
    let load = Load::start(rig.targets(), HOST, RATE, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_millis(300)).await;

    rig.operator("switchyard-2").process.freeze();
    let stuck = rig.envoy_addresses[1].clone();
    let changed = Instant::now();
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("green", 1)]))
        .await;
    let waiting = waiting_for(&rig, &stuck).await;
    eprintln!("replica hung: {waiting:?}");
    rig.wait_ready("web", Duration::from_secs(40)).await;
    let ready = changed.elapsed();
    let on_leader = rig.operator("switchyard-1").nodes().await;
    let moved = (on_leader["nodes"].as_array().into_iter().flatten())
        .any(|n| n["node_id"].as_str() == Some("envoy-1"));
    eprintln!("replica hung: Ready {ready:?} after the change; envoy-1 on the leader: {moved}");
    assert!(
        moved,
        "envoy-1 did not move to the other replica: {on_leader:#}"
    );
    assert_eq!(rig.answers_for(HOST).await, ["green", "green", "green"]);
    assert_none_failed("hung replica", &load.finish().await);
    rig.operator("switchyard-2").process.thaw();
}

/// An Envoy that refuses what it is sent (as one too old for the configuration would:
/// here, one built without the HTTP router, which every listener uses) never gets its
/// probe listener, so it never turns ready; the rollout waits for it only until its
/// readiness probe has failed (it restarted: within 4 s), and status and `switchyard
/// status` say what it refused.
#[tokio::test]
async fn an_envoy_that_refuses_its_configuration_never_holds_the_fleet_back() {
    let mut rig = Rig::serving_web(&["blue", "green"], "blue").await;
    let probes = KubeletProbes::start(&rig);
    let healthy: Vec<String> = rig.targets().into_iter().take(2).collect();
    let load = Load::start(healthy, HOST, RATE, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let restarted = Instant::now();
    rig.restart_envoy_with_args(
        STUCK,
        &[
            "--disable-extensions",
            "envoy.filters.http/envoy.filters.http.router",
        ],
    );
    let stuck = rig.envoy_addresses[STUCK].clone();
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("green", 1)]))
        .await;
    let waiting = waiting_for(&rig, &stuck).await;
    eprintln!("refusing: {waiting:?}");
    assert!(
        waiting.1.contains("envoy-2 rejected Listener"),
        "status does not say what the Envoy refused: {waiting:?}"
    );
    rig.wait_ready("web", Duration::from_secs(30)).await;
    let ready = restarted.elapsed();
    let Some(left) = probes.marked(STUCK, false) else {
        panic!("Ready before the refusing Envoy left the fleet");
    };
    eprintln!(
        "refusing: left the fleet {:?} and Ready {ready:?} after its restart",
        left.saturating_duration_since(restarted)
    );
    let nodes = rig.operator("switchyard-1").nodes().await;
    let refused = (nodes["nodes"].as_array().into_iter().flatten())
        .find(|n| n["node_id"].as_str() == Some("envoy-2"))
        .map(|n| n["status"]["types"]["Listener"]["last_nack"].clone());
    eprintln!("refusing: what it refused: {refused:?}");
    assert!(
        refused
            .as_ref()
            .and_then(|nack| nack["error"].as_str())
            .is_some_and(|error| error.contains("envoy.filters.http.router")),
        "the refusal is not on record: {nodes:#}"
    );
    let events = rig.event_reasons("web").await;
    assert!(events.contains(&"EnvoyRejected".into()), "{events:?}");
    assert_none_failed("refusing Envoy", &load.finish().await);
}

/// HTTPRoute `web` for `HOST` on Gateway `edge`, to `backend`.
fn http_route(namespace: &str, backend: &str) -> String {
    http_route_for(namespace, ("web", HOST), backend)
}

/// HTTPRoute `name` for `host` on Gateway `edge`, to `backend`.
fn http_route_for(namespace: &str, (name, host): (&str, &str), backend: &str) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name}, namespace: {namespace} }}
spec:
  parentRefs: [ {{ name: edge }} ]
  hostnames: [ {host} ]
  rules: [ {{ backendRefs: [ {{ name: {backend}, port: 80 }} ] }} ]
"#
    )
}

/// The status and message of the HTTPRoute's Served condition (its first parent's) at
/// `generation`, once `check` holds of them.
async fn wait_served_condition(
    routes: &Api<HttpRoute>,
    generation: i64,
    within: Duration,
    check: impl Fn(&str, &str) -> bool,
) -> (String, String) {
    let started = Instant::now();
    let mut last = Value::Null;
    while started.elapsed() < within {
        if let Ok(route) = routes.get("web").await {
            last = serde_json::to_value(&route).unwrap_or_default()["status"].clone();
            let served = (last.pointer("/parents/0/conditions"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|c| {
                    c["type"] == "switchyard.dev/Served" && c["observedGeneration"] == generation
                });
            if let Some(c) = served {
                let (status, message) = (c["status"].as_str(), c["message"].as_str());
                let (status, message) = (status.unwrap_or_default(), message.unwrap_or_default());
                if check(status, message) {
                    return (status.to_owned(), message.to_owned());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "HTTPRoute web: Served at generation {generation} not as asked within {within:?}: {last:#}"
    );
}

/// The same bounds for an HTTPRoute, rolled out through its Gateway: an Envoy whose xDS
/// stream carries nothing holds the route's change back, named in the route's Served
/// condition the whole time and, after 10 s, in an `EnvoysLagging` Event on the Gateway
/// for each hostname held back (two routes change here), until a new connection gets
/// through. Then a frozen Envoy holds the next change back
/// only until it stops being ready, and a fleet check in flight when it leaves is dropped.
#[tokio::test]
async fn an_httproutes_change_waits_for_a_stuck_envoy_only_while_it_is_counted() {
    let mut rig = Rig::start(3).await;
    install_crds(&rig).await;
    select_fleet(&rig).await;
    rig.add_backend("blue").await;
    rig.add_backend("green").await;
    rig.add_backend("yellow").await;
    let xds = free_port();
    let relay = Relay::start(std::net::SocketAddr::from(([127, 0, 0, 1], xds))).await;
    rig.connect_envoys_to(&[xds]);
    rig.connect_envoy_to(STUCK, &[relay.address.port()]);
    let controller = format!("switchyard.dev/test-{}-stuck", std::process::id());
    let class = k::unique_name("switchyard");
    let args = ["--gateway-api", "--gateway-controller-name", &controller];
    rig.start_operator_on("switchyard-1", xds, &args);
    rig.start_envoys();
    let probes = KubeletProbes::start(&rig);
    let ns = rig.namespace.clone();
    let routes: Api<HttpRoute> = Api::namespaced(rig.client.clone(), &ns);
    let gateway = edge_gateway(&class, &controller, &ns);
    let shop = ("shop", "shop.test");
    let routes_to = |backend: &str| {
        let web = http_route(&ns, backend);
        format!("{web}---{}", http_route_for(&ns, shop, backend))
    };
    apply(&rig, &format!("{gateway}{}", routes_to("blue"))).await;
    let within = Duration::from_secs(60);
    wait_served_condition(&routes, 1, within, |status, _| status == "True").await;
    let targets = edge_targets(&rig).await;
    let load = Load::start(targets.clone(), HOST, RATE, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A stuck xDS stream: waited for, named, told in an Event, until it is replaced.
    relay.stall();
    let stuck = rig.envoy_addresses[STUCK].clone();
    let changed = Instant::now();
    apply(&rig, &routes_to("green")).await;
    let waiting = wait_served_condition(&routes, 2, Duration::from_secs(10), |status, message| {
        status == "False" && message.contains(&stuck)
    })
    .await;
    eprintln!("HTTPRoute, xDS stuck: {waiting:?}");
    // One Event per hostname held back, each in its own words.
    let named_each = |messages: &[String]| {
        [HOST, shop.1].iter().all(|host| {
            (messages.iter())
                .any(|m| m.contains(&format!("hostname {host}:")) && m.contains(&stuck))
        })
    };
    let mut messages = Vec::new();
    while !named_each(&messages) {
        assert!(
            changed.elapsed() < Duration::from_secs(25),
            "no Event on the Gateway named the stuck Envoy for each hostname: {messages:#?}",
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        messages = rig.event_messages("edge", "EnvoysLagging").await;
    }
    let named = changed.elapsed();
    eprintln!("HTTPRoute, xDS stuck: Events on the Gateway: {messages:#?}");
    wait_served_condition(&routes, 2, Duration::from_secs(1), |status, message| {
        status == "False" && message.contains(&stuck)
    })
    .await;
    relay.carry_new_connections();
    let freed = Instant::now();
    wait_served_condition(&routes, 2, Duration::from_secs(30), |status, _| {
        status == "True"
    })
    .await;
    eprintln!(
        "HTTPRoute, xDS stuck: an Event on the Gateway named it {named:?} after the change; \
         Served {:?} after a new connection could get through",
        freed.elapsed()
    );
    assert_eq!(answers(&targets).await, ["green", "green", "green"]);
    assert_none_failed("HTTPRoute, stuck xDS stream", &load.finish().await);

    // A frozen Envoy: waited for only until it leaves the fleet.
    let healthy: Vec<String> = targets.iter().take(2).cloned().collect();
    let load = Load::start(healthy, HOST, RATE, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig.envoys[STUCK].freeze();
    let changed = Instant::now();
    apply(&rig, &http_route(&ns, "yellow")).await;
    wait_served_condition(&routes, 3, Duration::from_secs(10), |status, message| {
        status == "False" && message.contains(&stuck)
    })
    .await;
    wait_served_condition(&routes, 3, Duration::from_secs(30), |status, _| {
        status == "True"
    })
    .await;
    let served = changed.elapsed();
    let Some(left) = probes.marked(STUCK, false) else {
        panic!("Served before the frozen Envoy left the fleet");
    };
    eprintln!(
        "HTTPRoute, frozen Envoy: Served {served:?} after the change; the Envoy left the fleet \
         {:?} after the change, Served {:?} after that",
        left.saturating_duration_since(changed),
        Instant::now().saturating_duration_since(left),
    );
    assert_none_failed("HTTPRoute, frozen Envoy", &load.finish().await);
    rig.envoys[STUCK].thaw();
    relay.unstall();
}

/// What each of `targets` answers for `HOST` (the backend's name).
async fn answers(targets: &[String]) -> Vec<String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    let mut out = Vec::new();
    for target in targets {
        let answer = client
            .get(format!("{target}/"))
            .header("host", HOST)
            .send()
            .await;
        out.push(match answer {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => format!("error {e}"),
        });
    }
    out
}

async fn apply(rig: &Rig, yaml: &str) {
    let out = (rig.api)
        .kubectl_input(["apply", "--server-side", "-f", "-"], yaml)
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl apply: {stderr}");
}
