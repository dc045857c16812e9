//! The Gateway API controller against a real API server with the Gateway API CRDs of the
//! release Switchyard speaks (experimental channel): a GatewayClass naming it is accepted, its Gateway's
//! listeners and the HTTPRoutes attached to them get the conditions the specification
//! gives (and their rules take WebSockets), and a status follows a change of what it depends on (a Service created, a
//! route's new generation). Each accepted Gateway gets a Service of its own in the fleet's
//! namespace, selecting the fleet, its address in the Gateway's status; two Gateways on
//! one port get different fleet ports; a deleted Gateway's Service goes. Through 3 real
//! Envoys, an HTTPRoute moved between Services drops nothing (and a backendRef that cannot
//! be used keeps its share, answered 500), nor do its mirrors added, moved and removed,
//! listeners added and removed, client certificate validation added, changed and removed
//! (over HTTPS), or TLS to backends (BackendTLSPolicy) added, changed and removed; and
//! the same moves without the two phases and the xDS ordering do drop requests (the test
//! can see what the rollout guards against).

use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use kube::api::DeleteParams;
use kube::api::{Patch, PatchParams};
use rustls::ClientConfig;
use serde_json::{Value, json};
use switchyard::gateway::api::gateways::Gateway;
use switchyard::gateway::api::grpcroutes::GrpcRoute;
use switchyard::gateway::api::httproutes::HttpRoute;
use switchyard::gateway::api::listenersets::ListenerSet;
use switchyard::gateway::api::tcproutes::TcpRoute;
use switchyard::gateway::api::tlsroutes::TlsRoute;
use switchyard::gateway::api::udproutes::UdpRoute;
use switchyard_e2e::LoadReport;
use switchyard_e2e::gateway::{
    edge_gateway, edge_targets, gateway_services, install_crds, select_fleet,
};
use switchyard_e2e::kube::{self as k};
use switchyard_e2e::rig::Rig;
use switchyard_e2e::{ClientIdentity, HttpConnection, HttpsConnection, HttpsLoad, tls_client};

const WITHIN: Duration = Duration::from_secs(30);

/// Starts operator `switchyard-1` with the Gateway API controller, under a controller name
/// of this test's (`tag`) and with `extra` flags: (controller name, a GatewayClass name of
/// its own).
fn start_gateway_controller(rig: &mut Rig, tag: &str, extra: &[&str]) -> (String, String) {
    let controller = format!("switchyard.dev/test-{}-{tag}", std::process::id());
    let mut args = vec![
        "--gateway-api",
        "--gateway-controller-name",
        controller.as_str(),
    ];
    args.extend_from_slice(extra);
    rig.start_operator("switchyard-1", &args);
    (controller, k::unique_name("switchyard"))
}

async fn apply(rig: &Rig, yaml: &str) {
    let out = rig
        .api
        .kubectl_input(["apply", "--server-side", "-f", "-"], yaml)
        .await;
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The condition `type_` in the list at `pointer` of the object's status.
fn condition<'a>(status: &'a Value, pointer: &str, type_: &str) -> Option<&'a Value> {
    status
        .pointer(pointer)?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Polls until `check` holds of the object's status (as JSON), or panics with the last one.
async fn wait_status<K, F>(api: &Api<K>, name: &str, what: &str, check: F) -> Value
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    F: Fn(&Value) -> bool,
{
    wait_status_within(api, name, what, WITHIN, check).await
}

/// [`wait_status`], for at most `within`.
async fn wait_status_within<K, F>(
    api: &Api<K>,
    name: &str,
    what: &str,
    within: Duration,
    check: F,
) -> Value
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    F: Fn(&Value) -> bool,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut last = Value::Null;
    while tokio::time::Instant::now() < deadline {
        if let Ok(object) = api.get(name).await {
            last = serde_json::to_value(&object).unwrap_or_default()["status"].clone();
            if check(&last) {
                return last;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name}: {what} not within {within:?}; status: {last:#}");
}

#[tokio::test]
async fn gateway_api_objects_get_the_status_the_specification_gives() {
    let mut rig = Rig::start(0).await;
    install_crds(&rig).await;
    let (controller, class) = start_gateway_controller(&mut rig, "status", &[]);
    let ns = rig.namespace.clone();
    rig.add_backend("app").await;
    apply(
        &rig,
        &format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{ name: {class} }}
spec: {{ controllerName: {controller} }}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge, namespace: {ns} }}
spec:
  gatewayClassName: {class}
  listeners:
    - {{ name: http, port: 80, protocol: HTTP }}
    - {{ name: https, port: 443, protocol: HTTPS, tls: {{ certificateRefs: [ {{ name: absent }} ] }} }}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: shop, namespace: {ns} }}
spec:
  parentRefs: [ {{ name: edge }} ]
  hostnames: [ shop.example.com ]
  rules: [ {{ backendRefs: [ {{ name: app, port: 80 }} ] }} ]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: later, namespace: {ns} }}
spec:
  parentRefs: [ {{ name: edge, sectionName: http }} ]
  rules: [ {{ backendRefs: [ {{ name: not-yet, port: 80 }} ] }} ]
"#
        ),
    )
    .await;

    let classes: Api<switchyard::gateway::api::gatewayclasses::GatewayClass> =
        Api::all(rig.client.clone());
    wait_status(
        &classes,
        &class,
        "Accepted, and the CRDs' release supported",
        |s| {
            condition(s, "/conditions", "Accepted").is_some_and(|c| c["status"] == "True")
                && condition(s, "/conditions", "SupportedVersion")
                    .is_some_and(|c| c["status"] == "True")
        },
    )
    .await;

    let gateways: Api<Gateway> = Api::namespaced(rig.client.clone(), &ns);
    let status = wait_status(&gateways, "edge", "both routes attached", |s| {
        s.pointer("/listeners/0/attachedRoutes") == Some(&json!(2))
    })
    .await;
    let accepted = condition(&status, "/conditions", "Accepted").expect("Accepted");
    assert_eq!(
        (&accepted["status"], &accepted["reason"]),
        (&json!("True"), &json!("ListenersNotValid")),
        "one listener is not valid: {status:#}"
    );
    let https = condition(&status, "/listeners/1/conditions", "ResolvedRefs").expect("https");
    assert_eq!(
        (&https["status"], &https["reason"]),
        (&json!("False"), &json!("InvalidCertificateRef"))
    );
    // Routes attach to a listener whose certificate does not resolve (and count there),
    // though nothing is served on it.
    assert_eq!(
        status.pointer("/listeners/1/attachedRoutes"),
        Some(&json!(1))
    );
    let programmed = condition(&status, "/conditions", "Programmed").expect("Programmed");
    assert_eq!(programmed["status"], "False", "not served yet: {status:#}");

    let routes: Api<HttpRoute> = Api::namespaced(rig.client.clone(), &ns);
    let resolved =
        |status: &Value| condition(status, "/parents/0/conditions", "ResolvedRefs").cloned();
    let status = wait_status(&routes, "later", "BackendNotFound", |s| {
        resolved(s).is_some_and(|c| c["reason"] == "BackendNotFound")
    })
    .await;
    assert_eq!(
        status.pointer("/parents/0/controllerName"),
        Some(&json!(controller))
    );
    assert_eq!(
        condition(&status, "/parents/0/conditions", "Accepted").map(|c| c["status"].clone()),
        Some(json!("True"))
    );
    let shop = wait_status(&routes, "shop", "ResolvedRefs", |s| {
        resolved(s).is_some_and(|c| c["status"] == "True")
    })
    .await;

    // The missing Service appears: the route's status follows without any change to it,
    // woken by the Service's event (the controller's resync is 30 s away: a Service's event
    // that a route's reference does not make count would show here).
    rig.add_backend("not-yet").await;
    wait_status_within(
        &routes,
        "later",
        "ResolvedRefs after the Service came",
        Duration::from_secs(15),
        |s| resolved(s).is_some_and(|c| c["status"] == "True"),
    )
    .await;

    // A new generation of a route is observed; the condition whose status did not change
    // keeps its lastTransitionTime.
    let before = condition(&shop, "/parents/0/conditions", "Accepted")
        .map(|c| c["lastTransitionTime"].clone())
        .expect("a transition time");
    routes
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "spec": { "hostnames": ["shop.example.com", "www.example.com"] } }),
            ),
        )
        .await
        .expect("patch the route");
    let status = wait_status(&routes, "shop", "observedGeneration 2", |s| {
        condition(s, "/parents/0/conditions", "Accepted")
            .is_some_and(|c| c["observedGeneration"] == 2)
    })
    .await;
    let after = condition(&status, "/parents/0/conditions", "Accepted")
        .map(|c| c["lastTransitionTime"].clone())
        .expect("a transition time");
    assert_eq!(before, after, "Accepted stayed True: {status:#}");
}

#[tokio::test]
async fn each_gateway_gets_a_service_of_its_own_and_its_address() {
    let mut rig = Rig::start(0).await;
    install_crds(&rig).await;
    // The fleet's Pods are what a Gateway's Service selects (none run here).
    select_fleet(&rig).await;
    let (controller, class) = start_gateway_controller(&mut rig, "services", &[]);
    let ns = rig.namespace.clone();
    let gateway = |name: &str| {
        format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: {name}, namespace: {ns} }}
spec:
  gatewayClassName: {class}
  listeners:
    - {{ name: http, port: 80, protocol: HTTP }}
    - {{ name: alt, port: 8080, protocol: HTTP }}
    - {{ name: bad, port: 9000, protocol: TCP }}
"#
        )
    };
    apply(
        &rig,
        &format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{ name: {class} }}\nspec: {{ controllerName: {controller} }}\n---{}---{}",
            gateway("one"),
            gateway("two")
        ),
    )
    .await;

    let gateways: Api<Gateway> = Api::namespaced(rig.client.clone(), &ns);
    let mut fleet_ports = Vec::new();
    for name in ["one", "two"] {
        let status = wait_status(&gateways, name, "an address", |s| {
            s.pointer("/addresses/0/value")
                .and_then(Value::as_str)
                .is_some_and(|v| !v.is_empty())
        })
        .await;
        let services = gateway_services(&rig, &ns, name).await;
        let [service] = services.as_slice() else {
            panic!("{name}: one Service, not {}", services.len());
        };
        let spec = service.spec.clone().unwrap_or_default();
        assert_eq!(
            status.pointer("/addresses/0/value").and_then(Value::as_str),
            spec.cluster_ip.as_deref(),
            "{name}: the address is its Service's"
        );
        assert_eq!(
            spec.selector
                .unwrap_or_default()
                .get("app")
                .map(String::as_str),
            Some("envoy-fleet"),
            "{name}: the Service selects the fleet"
        );
        let ports: Vec<(i32, String)> = spec
            .ports
            .unwrap_or_default()
            .iter()
            .map(|p| (p.port, format!("{:?}", p.target_port)))
            .collect();
        // The invalid listener's port too: no Envoy listens on its fleet port, so a client
        // there is refused at once rather than left to its connect timeout.
        assert_eq!(
            ports.iter().map(|p| p.0).collect::<Vec<_>>(),
            [80, 8080, 9000],
            "{name}: the ports of its listeners"
        );
        fleet_ports.extend(ports.into_iter().map(|p| p.1));
    }
    let distinct: std::collections::BTreeSet<&String> = fleet_ports.iter().collect();
    assert_eq!(
        distinct.len(),
        6,
        "every port of every Gateway has its own: {fleet_ports:?}"
    );

    gateways
        .delete("one", &DeleteParams::default())
        .await
        .expect("delete a Gateway");
    let deadline = tokio::time::Instant::now() + WITHIN;
    while !gateway_services(&rig, &ns, "one").await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the deleted Gateway's Service is still there"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(gateway_services(&rig, &ns, "two").await.len(), 1);
}

/// One request through each target for `host`: the backend that answered, or the status.
async fn answers(targets: &[String], host: &str) -> Vec<String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let mut out = Vec::new();
    for target in targets {
        let answer = match client
            .get(format!("{target}/"))
            .header("host", host)
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
            Ok(r) => format!("status {}", r.status().as_u16()),
            Err(e) => format!("error {e}"),
        };
        out.push(answer);
    }
    out
}

/// The route's Served condition on its first parent, once it is True for `generation`.
async fn wait_served<K>(routes: &Api<K>, name: &str, generation: i64) -> Value
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    wait_status(
        routes,
        name,
        &format!("Served at generation {generation}"),
        |s| {
            condition(s, "/parents/0/conditions", "switchyard.dev/Served")
                .is_some_and(|c| c["status"] == "True" && c["observedGeneration"] == generation)
        },
    )
    .await
}

#[tokio::test]
async fn an_httproute_is_served_through_its_gateway_and_moves_between_services_without_a_drop() {
    let mut rig = Rig::start(3).await;
    install_crds(&rig).await;
    select_fleet(&rig).await;
    for backend in ["svc-0", "other"] {
        rig.add_backend(backend).await;
    }
    let (controller, class) = start_gateway_controller(&mut rig, "served", &[]);
    let ns = rig.namespace.clone();
    let route = |backend: &str, header: &str| {
        format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: web, namespace: {ns} }}
spec:
  parentRefs: [ {{ name: edge }} ]
  hostnames: [ web.test ]
  rules:
    - backendRefs: [ {{ name: {backend}, port: 80 }} ]
      filters:
        - type: ResponseHeaderModifier
          responseHeaderModifier: {{ set: [ {{ name: x-round, value: "{header}" }} ] }}
"#
        )
    };
    apply(
        &rig,
        &format!(
            r#"{}
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: other, namespace: {ns} }}
spec:
  parentRefs: [ {{ name: edge }} ]
  hostnames: [ other.test ]
  rules: [ {{ backendRefs: [ {{ name: other, port: 80 }} ] }} ]
---{}"#,
            edge_gateway(&class, &controller, &ns),
            route("svc-0", "0")
        ),
    )
    .await;

    let gateways: Api<Gateway> = Api::namespaced(rig.client.clone(), &ns);
    let routes: Api<HttpRoute> = Api::namespaced(rig.client.clone(), &ns);
    let status = wait_status(&gateways, "edge", "Programmed", |s| {
        condition(s, "/conditions", "Programmed").is_some_and(|c| c["status"] == "True")
            && condition(s, "/listeners/0/conditions", "Programmed")
                .is_some_and(|c| c["status"] == "True")
    })
    .await;
    assert_eq!(
        condition(&status, "/conditions", "Programmed").map(|c| c["reason"].clone()),
        Some(json!("Programmed"))
    );
    wait_served(&routes, "web", 1).await;
    let targets = edge_targets(&rig).await;
    assert_eq!(answers(&targets, "web.test").await, ["svc-0"; 3]);
    assert_eq!(answers(&targets, "other.test").await, ["other"; 3]);
    // A hostname no route has is not found there; the shared listener does not serve
    // the Gateway's routes.
    assert_eq!(answers(&targets, "nobody.test").await, ["status 404"; 3]);
    assert_eq!(
        rig.answers_for("web.test").await,
        ["status 404 Not Found"; 3]
    );
    // An HTTPRoute's rules let WebSocket upgrades through.
    let mut socket = switchyard_e2e::WebSocket::connect(&targets[0], "web.test")
        .await
        .expect("a WebSocket through the Gateway");
    assert_eq!(socket.echo("hello").await.as_deref(), Ok("svc-0: hello"));

    // Under load: header-only changes, and moves to Services created just before.
    let load =
        switchyard_e2e::Load::start(targets.clone(), "web.test", 150, Duration::from_secs(120));
    let mut generation = 1;
    for i in 1..=3 {
        generation += 1;
        apply(&rig, &route(&format!("svc-{}", i - 1), &format!("{i}h"))).await;
        wait_served(&routes, "web", generation).await;
        let new = format!("svc-{i}");
        rig.add_backend(&new).await;
        generation += 1;
        apply(&rig, &route(&new, &format!("{i}"))).await;
        wait_served(&routes, "web", generation).await;
        assert_eq!(
            answers(&targets, "web.test").await,
            [new.clone(), new.clone(), new]
        );
    }
    let report = load.finish().await;
    eprintln!(
        "gateway: {} requests in {:.1}s, non-2xx {}, by status {:?}, by backend {:?}",
        report.sent,
        report.elapsed.as_secs_f64(),
        report.non_2xx(),
        report.by_status,
        report.by_backend
    );
    assert!(report.sent > 0);
    assert_eq!(report.non_2xx(), 0, "failures: {:#?}", report.failures);
    assert_eq!(answers(&targets, "other.test").await, ["other"; 3]);

    // A backendRef that cannot be used keeps its share of the weight, answered 500 (the
    // HTTPRoute spec), next to the one that can.
    generation += 1;
    apply(
        &rig,
        &web_route_with(
            &ns,
            "    - backendRefs: [ { name: svc-3, port: 80 }, { name: nowhere, port: 80 } ]\n",
        ),
    )
    .await;
    wait_served(&routes, "web", generation).await;
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..20 {
        for answer in answers(&targets, "web.test").await {
            *seen.entry(answer).or_default() += 1;
        }
    }
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        ["status 500", "svc-3"],
        "a share of 500s next to svc-3's answers: {seen:?}"
    );

    // The route gone: its hostname is no longer served, the other one still is.
    routes
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete the route");
    let deadline = tokio::time::Instant::now() + WITHIN;
    while answers(&targets, "web.test").await != ["status 404"; 3] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "web.test still served after its route went"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(answers(&targets, "other.test").await, ["other"; 3]);
}

/// How long each change of a test took, from its apply to every Envoy serving it (the
/// route's Served, or what the test waits for instead): reported, never asserted.
#[derive(Default)]
struct Changes(Vec<Duration>);

impl Changes {
    /// Times `change` (an apply and the wait for its effect).
    async fn timed<F: std::future::Future>(&mut self, change: F) -> F::Output {
        let started = tokio::time::Instant::now();
        let out = change.await;
        self.0.push(started.elapsed());
        out
    }

    fn summary(&self) -> String {
        let mut sorted = self.0.clone();
        sorted.sort();
        match (
            sorted.get(sorted.len().saturating_sub(1) / 2),
            sorted.last(),
        ) {
            (Some(p50), Some(max)) => format!(
                "{} changes → served by every Envoy: p50 {} ms, max {} ms",
                sorted.len(),
                p50.as_millis(),
                max.as_millis()
            ),
            _ => "no change timed".to_owned(),
        }
    }
}

/// Ends `load`, says what it saw under `what` and how long the `changes` took, and
/// asserts that it sent requests and every one got a 2xx.
async fn finished_without_a_drop(
    load: switchyard_e2e::Load,
    what: &str,
    changes: &Changes,
) -> LoadReport {
    let report = load.finish().await;
    eprintln!(
        "{what}: {} requests in {:.1}s, non-2xx {}, by backend {:?}; {}",
        report.sent,
        report.elapsed.as_secs_f64(),
        report.non_2xx(),
        report.by_backend,
        changes.summary()
    );
    assert!(report.sent > 0);
    assert_eq!(report.non_2xx(), 0, "failures: {:#?}", report.failures);
    report
}

async fn wait_more(what: &str, before: usize, seen: impl Fn() -> usize) -> usize {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let now = seen();
        if now > before {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: no copy came within {WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn mirrors_are_added_moved_and_removed_under_load_without_a_drop() {
    let mut rig = Rig::start(3).await;
    install_crds(&rig).await;
    select_fleet(&rig).await;
    rig.add_backend("web").await;
    // A mirror whose only Pod is not ready yet: a rule copies to it without waiting for it.
    rig.add_pods("starting", 1).await;
    let (controller, class) = start_gateway_controller(&mut rig, "mirrors", &[]);
    let ns = rig.namespace.clone();
    let route = |mirrors: &[String]| {
        web_route_with(
            &ns,
            &format!(
                "    - backendRefs: [ {{ name: web, port: 80 }} ]\n      filters: [ {} ]\n",
                mirrors.join(", ")
            ),
        )
    };
    let mirror = |service: &str, share: &str| {
        format!(
            "{{ type: RequestMirror, requestMirror: {{ backendRef: {{ name: {service}, port: 80 }}{share} }} }}"
        )
    };
    apply(
        &rig,
        &format!("{}{}", edge_gateway(&class, &controller, &ns), route(&[])),
    )
    .await;
    let routes: Api<HttpRoute> = Api::namespaced(rig.client.clone(), &ns);
    wait_served(&routes, "web", 1).await;
    let targets = edge_targets(&rig).await;
    let load =
        switchyard_e2e::Load::start(targets.clone(), "web.test", 150, Duration::from_secs(120));

    let mut changes = Changes::default();
    // Added, to a Service created just before: every request is copied there.
    rig.add_backend("shadow-1").await;
    changes
        .timed(async {
            apply(&rig, &route(&[mirror("shadow-1", "")])).await;
            wait_served(&routes, "web", 2).await;
        })
        .await;
    wait_more("shadow-1", 0, || rig.backends["shadow-1"].requests_seen()).await;

    // Moved to another fresh Service with half of the requests, and a second mirror to
    // the Service whose Pod is not ready: Served all the same.
    rig.add_backend("shadow-2").await;
    changes
        .timed(async {
            let two = [mirror("shadow-2", ", percent: 50"), mirror("starting", "")];
            apply(&rig, &route(&two)).await;
            wait_served(&routes, "web", 3).await;
        })
        .await;
    wait_more("shadow-2", 0, || rig.backends["shadow-2"].requests_seen()).await;

    // Removed: the copies stop.
    changes
        .timed(async {
            apply(&rig, &route(&[])).await;
            wait_served(&routes, "web", 4).await;
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let copies = |name: &str| rig.backends[name].requests_seen();
    let stopped = (copies("shadow-1"), copies("shadow-2"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        (copies("shadow-1"), copies("shadow-2")),
        stopped,
        "copies went on after the mirrors were removed"
    );

    eprintln!("mirrors: copies {stopped:?}");
    let report = finished_without_a_drop(load, "mirrors", &changes).await;
    // The clients get the route's backend's answers only.
    assert_eq!(report.by_backend.keys().collect::<Vec<_>>(), ["web"]);
}

/// The route's Served condition on its parent of `kind` (Gateway or ListenerSet), once it
/// is True for `generation`.
async fn wait_served_on(routes: &Api<HttpRoute>, name: &str, kind: &str, generation: i64) {
    let what = format!("Served on its {kind} at generation {generation}");
    wait_status(routes, name, &what, |s| {
        (s["parents"].as_array().into_iter().flatten())
            .filter(|p| p["parentRef"]["kind"] == kind)
            .any(|p| {
                condition(p, "/conditions", "switchyard.dev/Served")
                    .is_some_and(|c| c["status"] == "True" && c["observedGeneration"] == generation)
            })
    })
    .await;
}

#[tokio::test]
async fn listeners_are_added_and_removed_under_load_without_a_drop() {
    let mut rig = Rig::start(3).await;
    install_crds(&rig).await;
    select_fleet(&rig).await;
    for backend in ["web", "own"] {
        rig.add_backend(backend).await;
    }
    let (controller, class) = start_gateway_controller(&mut rig, "listeners", &[]);
    let ns = rig.namespace.clone();
    // Gateway `edge` with the listener for every host, and more; ListenerSets of its
    // namespace may attach.
    let gateway = |more: &str| {
        let mut yaml = edge_gateway(&class, &controller, &ns);
        let one = "listeners: [ { name: http, port: 80, protocol: HTTP } ]";
        assert!(yaml.contains(one));
        yaml = yaml.replace(
            one,
            &format!(
                "allowedListeners: {{ namespaces: {{ from: Same }} }}\n  \
                 listeners: [ {{ name: http, port: 80, protocol: HTTP }}{more} ]"
            ),
        );
        yaml
    };
    // `web` through the listener for every host; `own` through a listener of web.test's.
    let route = |name: &str, section: &str| {
        format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name}, namespace: {ns} }}
spec:
  parentRefs: [ {{ name: edge, sectionName: {section} }} ]
  hostnames: [ web.test ]
  rules: [ {{ backendRefs: [ {{ name: {name}, port: 80 }} ] }} ]
---"#
        )
    };
    apply(&rig, &format!("{}{}", gateway(""), route("web", "http"))).await;
    let routes: Api<HttpRoute> = Api::namespaced(rig.client.clone(), &ns);
    wait_served(&routes, "web", 1).await;
    let targets = edge_targets(&rig).await;
    let load =
        switchyard_e2e::Load::start(targets.clone(), "web.test", 150, Duration::from_secs(120));
    let seen = |name: &str| rig.backends[name].requests_seen();
    let web_only = seen("web");
    wait_more("web", web_only, || seen("web")).await;
    // A connection to port 80 of every Envoy, kept open across every change: none of them
    // redefines port 80's listener, so none may close it.
    let mut kept = Vec::new();
    for target in &targets {
        let address = (target.trim_start_matches("http://").parse())
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        let connection = HttpConnection::connect(address).await;
        kept.push(connection.unwrap_or_else(|e| panic!("{target}: {e}")));
    }
    let still_open = async |kept: &mut Vec<HttpConnection>, after: &str| {
        for (i, connection) in kept.iter_mut().enumerate() {
            let answer = connection.get("web.test", "/").await;
            assert_eq!(
                answer,
                Ok(200),
                "Envoy {i}'s kept connection, after {after}"
            );
            assert!(
                !connection.is_closed(),
                "Envoy {i} closes its connection, after {after}"
            );
        }
    };
    still_open(&mut kept, "nothing").await;

    // A listener for web.test on the same port: it takes web.test over (isolation), and
    // the route attached there answers. The route comes first: a listener with no route
    // answers 404 for its hostname, as the Gateway API says, from the moment it is
    // there (docs/gateway-api.md).
    apply(&rig, &route("own", "own")).await;
    let own = ", { name: own, port: 80, protocol: HTTP, hostname: web.test }";
    let mut changes = Changes::default();
    changes
        .timed(async {
            apply(&rig, &gateway(own)).await;
            wait_served(&routes, "own", 1).await;
        })
        .await;
    wait_more("own", 0, || seen("own")).await;
    still_open(&mut kept, "web.test's own listener").await;

    // A listener on a port of its own, added, replaced by one on another port in one
    // apply, and removed: port 80 is not disturbed. The replaced listener's fleet port is
    // still held while its old configuration drains, so the new one gets another, and is
    // programmed as soon as every Envoy listens there (not once the hold is over).
    let gateways: Api<Gateway> = Api::namespaced(rig.client.clone(), &ns);
    // The Gateway's listener `alt` Programmed at the Gateway's generation as it is now.
    let alt_programmed = async || {
        let gateway = gateways.get("edge").await.expect("Gateway edge");
        let generation = json!(gateway.metadata.generation);
        let what = format!("listener alt Programmed at generation {generation}");
        wait_status(&gateways, "edge", &what, |s| {
            (s["listeners"].as_array().into_iter().flatten())
                .filter(|l| l["name"] == "alt")
                .any(|l| {
                    condition(l, "/conditions", "Programmed").is_some_and(|c| {
                        c["status"] == "True" && c["observedGeneration"] == generation
                    })
                })
        })
        .await;
    };
    let alt = |port: u16| format!(", {{ name: alt, port: {port}, protocol: HTTP }}");
    apply(&rig, &gateway(&format!("{own}{}", alt(8080)))).await;
    let replaced = switchyard_e2e::gateway::fleet_port(&rig, &ns, "edge", 8080).await;
    alt_programmed().await;
    changes
        .timed(async {
            apply(&rig, &gateway(&format!("{own}{}", alt(9090)))).await;
            alt_programmed().await;
        })
        .await;
    if let Some(took) = changes.0.last() {
        eprintln!(
            "listener replaced in one apply → Programmed: {} ms",
            took.as_millis()
        );
    }
    let replacing = switchyard_e2e::gateway::fleet_port(&rig, &ns, "edge", 9090).await;
    assert_ne!(
        replacing, replaced,
        "the replacing listener got the fleet port of the one it replaced, still held"
    );
    apply(&rig, &gateway(own)).await;
    still_open(&mut kept, "port 8080's and 9090's listeners").await;

    // web.test's listener moved to a ListenerSet, in the order that loses nothing: the
    // ListenerSet's copy first (the Gateway's, of higher precedence, keeps serving: it is
    // in conflict), the route attached to both, then the Gateway's removed.
    let sets: Api<ListenerSet> = Api::namespaced(rig.client.clone(), &ns);
    apply(
        &rig,
        &format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {{ name: team, namespace: {ns} }}
spec:
  parentRef: {{ name: edge }}
  listeners: [ {{ name: own, port: 80, protocol: HTTP, hostname: web.test }} ]
---"#
        ),
    )
    .await;
    wait_status(&sets, "team", "in conflict with the Gateway's", |s| {
        condition(s, "/listeners/0/conditions", "Conflicted").is_some_and(|c| c["status"] == "True")
            && condition(s, "/conditions", "Accepted")
                .is_some_and(|c| c["reason"] == "ListenersNotValid")
    })
    .await;
    let both = route("own", "own").replace(
        "parentRefs: [ { name: edge, sectionName: own } ]",
        "parentRefs: [ { name: edge, sectionName: own }, { kind: ListenerSet, name: team } ]",
    );
    changes
        .timed(async {
            apply(&rig, &both).await;
            wait_served_on(&routes, "own", "Gateway", 2).await;
        })
        .await;
    changes
        .timed(async {
            apply(&rig, &gateway("")).await;
            wait_status(&sets, "team", "Programmed", |s| {
                condition(s, "/conditions", "Programmed").is_some_and(|c| c["status"] == "True")
            })
            .await;
            wait_served_on(&routes, "own", "ListenerSet", 2).await;
        })
        .await;
    wait_status(&gateways, "edge", "one ListenerSet attached", |s| {
        s["attachedListenerSets"] == 1
    })
    .await;
    let before = seen("own");
    wait_more("own through the ListenerSet", before, || seen("own")).await;
    still_open(&mut kept, "the move to a ListenerSet").await;

    // web.test's listener removed (its ListenerSet deleted): the listener for every host
    // answers for it again.
    sets.delete("team", &DeleteParams::default())
        .await
        .expect("ListenerSet team deleted");
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let before = (seen("own"), seen("web"));
        tokio::time::sleep(Duration::from_millis(500)).await;
        if seen("own") == before.0 && seen("web") > before.1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "web.test not back on `web` within {WITHIN:?}"
        );
    }

    still_open(&mut kept, "the ListenerSet's removal").await;
    let report = finished_without_a_drop(load, "listeners", &changes).await;
    assert_eq!(report.by_backend.keys().collect::<Vec<_>>(), ["own", "web"]);
}

/// The HTTPRoute `web` for web.test on Gateway `edge`, to `backend`.
fn web_route(namespace: &str, backend: &str) -> String {
    web_route_with(
        namespace,
        &format!("    - backendRefs: [ {{ name: {backend}, port: 80 }} ]\n"),
    )
}

/// The HTTPRoute `web` for web.test on Gateway `edge`, with `rules` (YAML list items,
/// indented by four).
fn web_route_with(namespace: &str, rules: &str) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: web, namespace: {namespace} }}
spec:
  parentRefs: [ {{ name: edge }} ]
  hostnames: [ web.test ]
  rules:
{rules}"#
    )
}

/// The Served condition of the route's first parent, once `check` holds of it and of its
/// ResolvedRefs.
async fn wait_parent(
    routes: &Api<HttpRoute>,
    name: &str,
    what: &str,
    check: impl Fn(&Value, &Value) -> bool,
) -> Value {
    let status = wait_status(routes, name, what, |s| {
        let resolved = condition(s, "/parents/0/conditions", "ResolvedRefs");
        let served = condition(s, "/parents/0/conditions", "switchyard.dev/Served");
        resolved.zip(served).is_some_and(|(r, s)| check(r, s))
    })
    .await;
    condition(&status, "/parents/0/conditions", "switchyard.dev/Served")
        .cloned()
        .unwrap_or_default()
}

/// Waits until generation `generation` of route `web` waits for an object (ResolvedRefs
/// False for `reason`), generation `kept` serving meanwhile.
async fn wait_waiting(routes: &Api<HttpRoute>, generation: i64, reason: &str, kept: i64) {
    let served = wait_parent(
        routes,
        "web",
        &format!("generation {generation} waiting"),
        |r, s| {
            r["status"] == "False"
                && r["reason"] == reason
                && r["observedGeneration"] == generation
                && s["status"] == "True"
                && s["observedGeneration"] == kept
        },
    )
    .await;
    eprintln!("generation {generation} waits: {}", served["message"]);
    let message = served["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("generation {generation} waits")),
        "{message}"
    );
}

/// A GitOps sync applies objects in its own order. A served HTTPRoute changed to a backend
/// whose ReferenceGrant, or whose Service, comes a second after the route waits for it, its
/// last generation serving (ResolvedRefs False on the new generation, Served on the old one
/// saying why), then moves; in the other order it moves at once; no request fails either
/// way. A change whose Service never comes is served as the specification asks, with 500s,
/// once the grace is over; a route never served answers 500 at once.
#[tokio::test]
async fn a_served_httproutes_change_waits_for_the_objects_it_names_in_either_order() {
    let mut rig = Rig::start(3).await;
    install_crds(&rig).await;
    select_fleet(&rig).await;
    rig.add_backend("svc-0").await;
    let ns = rig.namespace.clone();
    let far = format!("{ns}-far");
    k::create_namespace(&rig.client, &far).await;
    let flags = ["--gateway-reference-grace", "3s", "--namespaces", &far];
    let (controller, class) = start_gateway_controller(&mut rig, "grace", &flags);
    rig.add_backend_in(&far, "far").await;
    apply(
        &rig,
        &format!(
            "{}{}",
            edge_gateway(&class, &controller, &ns),
            web_route(&ns, "svc-0")
        ),
    )
    .await;
    let routes: Api<HttpRoute> = Api::namespaced(rig.client.clone(), &ns);
    wait_served(&routes, "web", 1).await;
    let targets = edge_targets(&rig).await;
    let load =
        switchyard_e2e::Load::start(targets.clone(), "web.test", 150, Duration::from_secs(120));

    // The route first, its ReferenceGrant a second later.
    let to_far = format!("    - backendRefs: [ {{ name: far, namespace: {far}, port: 80 }} ]\n");
    apply(&rig, &web_route_with(&ns, &to_far)).await;
    wait_waiting(&routes, 2, "RefNotPermitted", 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(answers(&targets, "web.test").await, ["svc-0"; 3]);
    let grant = format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {{ name: from-web, namespace: {far} }}
spec:
  from: [ {{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: {ns} }} ]
  to: [ {{ group: "", kind: Service }} ]
"#
    );
    apply(&rig, &grant).await;
    wait_served(&routes, "web", 2).await;
    assert_eq!(answers(&targets, "web.test").await, ["far"; 3]);

    // The route first, its Service a second later.
    rig.add_backend_without_service("late").await;
    apply(&rig, &web_route(&ns, "late")).await;
    wait_waiting(&routes, 3, "BackendNotFound", 2).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(answers(&targets, "web.test").await, ["far"; 3]);
    rig.recreate_service("late").await;
    wait_served(&routes, "web", 3).await;
    assert_eq!(answers(&targets, "web.test").await, ["late"; 3]);

    // The Service first, then the route: no wait.
    rig.add_backend("first").await;
    apply(&rig, &web_route(&ns, "first")).await;
    wait_served(&routes, "web", 4).await;
    assert_eq!(answers(&targets, "web.test").await, ["first"; 3]);
    let report = load.finish().await;
    eprintln!(
        "objects in either order: {} requests in {:.1}s, non-2xx {}, by backend {:?}",
        report.sent,
        report.elapsed.as_secs_f64(),
        report.non_2xx(),
        report.by_backend
    );
    assert_eq!(report.non_2xx(), 0, "failures: {:#?}", report.failures);

    // A Service that never comes: the grace ends, and the change is served with its 500s.
    apply(&rig, &web_route(&ns, "nowhere")).await;
    wait_waiting(&routes, 5, "BackendNotFound", 4).await;
    wait_served(&routes, "web", 5).await;
    assert_eq!(answers(&targets, "web.test").await, ["status 500"; 3]);

    // A route never served has nothing to keep: 500 at once.
    let fresh = web_route(&ns, "nowhere")
        .replace("name: web,", "name: fresh,")
        .replace("web.test", "fresh.test");
    apply(&rig, &fresh).await;
    let served = wait_served(&routes, "fresh", 1).await;
    assert!(!served.to_string().contains("waits"), "{served}");
    assert_eq!(answers(&targets, "fresh.test").await, ["status 500"; 3]);
}

#[tokio::test]
async fn without_two_phases_and_ordering_the_same_httproute_moves_drop_requests() {
    let mut rig = Rig::start(3).await;
    install_crds(&rig).await;
    select_fleet(&rig).await;
    rig.add_backend("svc-0").await;
    let (controller, class) =
        start_gateway_controller(&mut rig, "naive", &["--one-phase", "--unordered-xds"]);
    let ns = rig.namespace.clone();
    apply(
        &rig,
        &format!(
            "{}{}",
            edge_gateway(&class, &controller, &ns),
            web_route(&ns, "svc-0")
        ),
    )
    .await;
    let routes: Api<HttpRoute> = Api::namespaced(rig.client.clone(), &ns);
    wait_served(&routes, "web", 1).await;
    let targets = edge_targets(&rig).await;

    // More switches than the zero-drop test: a naive rollout fails on some, not all, and
    // this test must see it every time.
    let load =
        switchyard_e2e::Load::start(targets.clone(), "web.test", 150, Duration::from_secs(240));
    for i in 1..=25 {
        let new = format!("svc-{i}");
        rig.add_backend(&new).await;
        apply(&rig, &web_route(&ns, &new)).await;
        wait_served(&routes, "web", 1 + i).await;
    }
    let report = load.finish().await;
    eprintln!(
        "gateway, one phase and unordered xDS: {} requests in {:.1}s, non-2xx {}, by status {:?}",
        report.sent,
        report.elapsed.as_secs_f64(),
        report.non_2xx(),
        report.by_status
    );
    assert!(
        report.non_2xx() > 0,
        "the test cannot see what the rollout guards against"
    );
}

/// The GRPCRoute `echo` for grpc.test on Gateway `edge`: every call to `backend`.
fn echo_grpc_route(namespace: &str, backend: &str) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{ name: echo, namespace: {namespace} }}
spec:
  parentRefs: [ {{ name: edge }} ]
  hostnames: [ grpc.test ]
  rules:
    - matches: [ {{ method: {{ service: {service} }} }} ]
      backendRefs: [ {{ name: {backend}, port: 80 }} ]
"#,
        service = switchyard_e2e::grpc::SERVICE
    )
}

/// The endpoints of a Service a GRPCRoute moves to come this long after the move: each
/// of 0 to 200 ms, the move's index picking it (the same every run).
fn endpoints_late(move_index: u64) -> Duration {
    Duration::from_millis(move_index * 37 % 201)
}

/// Moves the GRPCRoute `echo` to fresh Services `moves` times under a load of unary calls
/// and long-lived streams, each Service's endpoints published 0–200 ms after the move;
/// returns what the load saw and how long each move took to be Served.
async fn grpc_moves(rig: &mut Rig, moves: usize) -> (switchyard_e2e::grpc::GrpcReport, Changes) {
    let ns = rig.namespace.clone();
    let routes: Api<GrpcRoute> = Api::namespaced(rig.client.clone(), &ns);
    let targets = edge_targets(rig).await;
    // A stream lasts 1.5 s: most are open across a move, and each ends well within the
    // drain period (10 s), which keeps the cluster it was opened to.
    let streams = switchyard_e2e::grpc::Streams {
        open: 6,
        count: 30,
        interval: Duration::from_millis(50),
    };
    let load = switchyard_e2e::grpc::GrpcLoad::start(
        targets,
        "grpc.test",
        150,
        streams,
        Duration::from_secs(180),
    );
    let mut changes = Changes::default();
    for i in 1..=moves {
        let new = format!("grpc-{i}");
        rig.add_grpc_backend(&new).await;
        let late = endpoints_late(i as u64);
        changes
            .timed(async {
                apply(rig, &echo_grpc_route(&ns, &new)).await;
                tokio::time::sleep(late).await;
                rig.publish_grpc_endpoints(&new).await;
                wait_served(&routes, "echo", 1 + i as i64).await;
            })
            .await;
    }
    // Streams opened before the last move end on their backend.
    tokio::time::sleep(streams.interval * streams.count).await;
    (load.finish().await, changes)
}

/// Starts a rig of three Envoys serving the GRPCRoute `echo` on Gateway `edge`, with the
/// operator's `extra` flags.
async fn serving_grpc(tag: &str, extra: &[&str]) -> Rig {
    let mut rig = Rig::start(3).await;
    install_crds(&rig).await;
    select_fleet(&rig).await;
    rig.add_grpc_backend("grpc-0").await;
    rig.publish_grpc_endpoints("grpc-0").await;
    let (controller, class) = start_gateway_controller(&mut rig, tag, extra);
    let ns = rig.namespace.clone();
    apply(
        &rig,
        &format!(
            "{}{}",
            edge_gateway(&class, &controller, &ns),
            echo_grpc_route(&ns, "grpc-0")
        ),
    )
    .await;
    let routes: Api<GrpcRoute> = Api::namespaced(rig.client.clone(), &ns);
    wait_served(&routes, "echo", 1).await;
    rig
}

/// A GRPCRoute served through three Envoys: unary calls and server streams answered by
/// its backend, a call for a host no route has answered UNIMPLEMENTED; moved to fresh
/// Services ten times under load, their endpoints late, without a failed call or stream.
#[tokio::test]
async fn a_grpcroute_moves_between_services_under_load_without_a_failed_call() {
    let mut rig = serving_grpc("grpc", &[]).await;
    let targets = edge_targets(&rig).await;
    for target in &targets {
        let mut client = switchyard_e2e::grpc::client(target, "grpc.test");
        let answer = switchyard_e2e::grpc::unary(&mut client).await;
        assert_eq!(answer.ok().as_deref(), Some("grpc-0"));
        let stream = switchyard_e2e::grpc::stream(&mut client, 3, Duration::from_millis(10)).await;
        assert_eq!(stream.as_deref(), Ok("grpc-0"));
        // Another host: no route, which a gRPC client reads as UNIMPLEMENTED.
        let mut elsewhere = switchyard_e2e::grpc::client(target, "other.test");
        let code = switchyard_e2e::grpc::unary(&mut elsewhere)
            .await
            .map_err(|s| s.code());
        assert_eq!(code, Err(tonic::Code::Unimplemented));
    }
    let (report, changes) = grpc_moves(&mut rig, 10).await;
    eprintln!(
        "grpcroute: {} unary calls and {} streams, failed {}, by backend {:?}; {}",
        report.calls,
        report.streams,
        report.failures.len(),
        report.by_backend,
        changes.summary()
    );
    assert!(report.calls > 0 && report.streams > 0);
    assert!(
        report.failures.is_empty(),
        "failures: {:#?}",
        report.failures
    );
    assert!(report.by_backend.contains_key("grpc-10"));
}

/// The same moves without the two phases and xDS ordering fail calls: what the rollout
/// guards against is visible to the test above.
#[tokio::test]
async fn without_two_phases_and_ordering_the_same_grpcroute_moves_fail_calls() {
    let mut rig = serving_grpc("grpc-naive", &["--one-phase", "--unordered-xds"]).await;
    let (report, changes) = grpc_moves(&mut rig, 10).await;
    eprintln!(
        "grpcroute, one phase and unordered xDS: {} unary calls and {} streams, failed {}; {}",
        report.calls,
        report.streams,
        report.failures.len(),
        changes.summary()
    );
    assert!(
        !report.failures.is_empty(),
        "the test cannot see what the rollout guards against"
    );
}

/// What a TCP or TLS listener forwards, on Gateway `connections`: port 5432 (TCP) to the
/// TCPRoute `db`, port 443 (TLS, passed through) to the TLSRoute `secure` for tls.test.
#[derive(Clone, Copy)]
enum Stream {
    Tcp,
    Passthrough,
}

impl Stream {
    fn kind(self) -> &'static str {
        match self {
            Stream::Tcp => "tcp",
            Stream::Passthrough => "tls",
        }
    }

    fn port(self) -> i32 {
        match self {
            Stream::Tcp => 5432,
            Stream::Passthrough => 443,
        }
    }

    /// The route sending every connection to `backend`.
    fn route(self, namespace: &str, backend: &str) -> String {
        match self {
            Stream::Tcp => format!(
                r#"
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {{ name: db, namespace: {namespace} }}
spec:
  parentRefs: [ {{ name: connections, sectionName: db }} ]
  rules: [ {{ backendRefs: [ {{ name: {backend}, port: 80 }} ] }} ]
"#
            ),
            Stream::Passthrough => format!(
                r#"
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {{ name: secure, namespace: {namespace} }}
spec:
  parentRefs: [ {{ name: connections, sectionName: secure }} ]
  hostnames: [ tls.test ]
  rules: [ {{ backendRefs: [ {{ name: {backend}, port: 80 }} ] }} ]
"#
            ),
        }
    }

    async fn wait_served(self, rig: &Rig, generation: i64) {
        let ns = &rig.namespace;
        match self {
            Stream::Tcp => {
                let routes: Api<TcpRoute> = Api::namespaced(rig.client.clone(), ns);
                wait_served(&routes, "db", generation).await;
            }
            Stream::Passthrough => {
                let routes: Api<TlsRoute> = Api::namespaced(rig.client.clone(), ns);
                wait_served(&routes, "secure", generation).await;
            }
        }
    }

    fn opening(self) -> switchyard_e2e::connections::Opening {
        match self {
            Stream::Tcp => switchyard_e2e::connections::Opening::Plain("db.test".into()),
            Stream::Passthrough => switchyard_e2e::connections::Opening::Tls("tls.test".into()),
        }
    }
}

/// GatewayClass `class` of `controller`, and Gateway `connections` with a TCP listener on
/// 5432 and a TLS one on 443 that passes connections through.
fn connections_gateway(class: &str, controller: &str, namespace: &str) -> String {
    switchyard_e2e::gateway::class_and_gateway(
        (class, controller),
        (namespace, "connections"),
        "\n    - { name: db, port: 5432, protocol: TCP }\n    - { name: secure, port: 443, protocol: TLS, tls: { mode: Passthrough } }",
    )
}

/// A backend for `stream`: plain HTTP for TCP, HTTPS with its own certificate for tls.test
/// when passed through (the client's TLS is the backend's); its endpoints not published.
async fn add_stream_backend(rig: &mut Rig, stream: Stream, name: &str) {
    match stream {
        Stream::Tcp => rig.add_backend_unpublished(name, None).await,
        Stream::Passthrough => {
            let (cert, key) = Rig::new_certificate("tls.test");
            rig.add_backend_unpublished(name, Some((&cert, &key))).await;
        }
    }
}

/// Starts a rig of three Envoys whose Gateway `connections` forwards `stream` to its first
/// backend, with the operator's `extra` flags; the listener's address on every Envoy.
async fn serving_stream(
    stream: Stream,
    tag: &str,
    extra: &[&str],
) -> (Rig, Vec<std::net::SocketAddr>) {
    let mut rig = Rig::start(3).await;
    install_crds(&rig).await;
    select_fleet(&rig).await;
    let first = format!("{}-0", stream.kind());
    add_stream_backend(&mut rig, stream, &first).await;
    rig.publish_endpoints(&first).await;
    let (controller, class) = start_gateway_controller(&mut rig, tag, extra);
    let ns = rig.namespace.clone();
    let manifests = format!(
        "{}{}",
        connections_gateway(&class, &controller, &ns),
        stream.route(&ns, &first)
    );
    apply(&rig, &manifests).await;
    stream.wait_served(&rig, 1).await;
    let port = switchyard_e2e::gateway::fleet_port(&rig, &ns, "connections", stream.port()).await;
    let targets = (rig.envoy_addresses.iter())
        .map(|a| std::net::SocketAddr::new(a.parse().expect("an Envoy address"), port))
        .collect();
    (rig, targets)
}

/// Moves `stream`'s route to fresh Services `moves` times under a load of new connections,
/// each Service's endpoints published 0–200 ms after the move; returns what the load saw
/// and how long each move took to be Served.
async fn stream_moves(
    rig: &mut Rig,
    stream: Stream,
    targets: Vec<std::net::SocketAddr>,
    moves: usize,
) -> (LoadReport, Changes) {
    let ns = rig.namespace.clone();
    let load = switchyard_e2e::connections::ConnectionLoad::start(
        targets,
        stream.opening(),
        150,
        Duration::from_secs(180),
    );
    let mut changes = Changes::default();
    for i in 1..=moves {
        let new = format!("{}-{i}", stream.kind());
        add_stream_backend(rig, stream, &new).await;
        let late = endpoints_late(i as u64);
        changes
            .timed(async {
                apply(rig, &stream.route(&ns, &new)).await;
                tokio::time::sleep(late).await;
                rig.publish_endpoints(&new).await;
                stream.wait_served(rig, 1 + i as i64).await;
            })
            .await;
    }
    (load.finish().await, changes)
}

/// A TCPRoute and a TLSRoute (passed through) served through three Envoys: each
/// connection reaches the route's backend (over TLS, the backend's own certificate);
/// moved to fresh Services ten times under a load of new connections, their endpoints
/// late, without a connection refused, reset or unanswered.
#[tokio::test]
async fn tcp_and_tls_routes_move_between_services_under_load_without_a_failed_connection() {
    for stream in [Stream::Tcp, Stream::Passthrough] {
        let (mut rig, targets) =
            serving_stream(stream, &format!("{}-moves", stream.kind()), &[]).await;
        let (report, changes) = stream_moves(&mut rig, stream, targets, 10).await;
        eprintln!(
            "{}route: {} connections, failed {}, by backend {:?}; {}",
            stream.kind(),
            report.sent,
            report.non_2xx(),
            report.by_backend,
            changes.summary()
        );
        assert!(report.sent > 0);
        assert!(
            report.failures.is_empty(),
            "failures: {:#?}",
            report.failures
        );
        let last = format!("{}-10", stream.kind());
        assert!(
            report.by_backend.contains_key(&last),
            "{:?}",
            report.by_backend
        );
    }
}

/// The same moves without the two phases and xDS ordering fail connections: what the
/// rollout guards against is visible to the test above.
#[tokio::test]
async fn without_two_phases_and_ordering_the_same_tcp_and_tls_moves_fail_connections() {
    for stream in [Stream::Tcp, Stream::Passthrough] {
        let tag = format!("{}-naive", stream.kind());
        let (mut rig, targets) =
            serving_stream(stream, &tag, &["--one-phase", "--unordered-xds"]).await;
        let (report, changes) = stream_moves(&mut rig, stream, targets, 10).await;
        eprintln!(
            "{}route, one phase and unordered xDS: {} connections, failed {}; {}",
            stream.kind(),
            report.sent,
            report.non_2xx(),
            changes.summary()
        );
        assert!(
            report.non_2xx() > 0,
            "the test cannot see what the rollout guards against"
        );
    }
}

/// GatewayClass `class` of `controller`, Gateway `datagrams` with a UDP listener on 53,
/// and the UDPRoute `dns` sending every datagram to `backend`.
fn datagrams_manifests(class: &str, controller: &str, namespace: &str, backend: &str) -> String {
    let gateway = switchyard_e2e::gateway::class_and_gateway(
        (class, controller),
        (namespace, "datagrams"),
        "[ { name: dns, port: 53, protocol: UDP } ]",
    );
    format!("{gateway}{}", dns_route(namespace, backend))
}

/// The UDPRoute `dns` sending every datagram to Service `backend`'s UDP port 80.
fn dns_route(namespace: &str, backend: &str) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: UDPRoute
metadata: {{ name: dns, namespace: {namespace} }}
spec:
  parentRefs: [ {{ name: datagrams, sectionName: dns }} ]
  rules: [ {{ backendRefs: [ {{ name: {backend}, port: 80 }} ] }} ]
"#
    )
}

/// Starts a rig of three Envoys whose Gateway `datagrams` sends UDP to backend `udp-0`,
/// with the operator's `extra` flags; the listener's address on every Envoy.
async fn serving_datagrams(tag: &str, extra: &[&str]) -> (Rig, Vec<std::net::SocketAddr>) {
    let mut rig = Rig::start(3).await;
    install_crds(&rig).await;
    select_fleet(&rig).await;
    rig.add_udp_backend_unpublished("udp-0").await;
    rig.publish_udp_endpoints("udp-0").await;
    let (controller, class) = start_gateway_controller(&mut rig, tag, extra);
    let ns = rig.namespace.clone();
    apply(
        &rig,
        &datagrams_manifests(&class, &controller, &ns, "udp-0"),
    )
    .await;
    let routes: Api<UdpRoute> = Api::namespaced(rig.client.clone(), &ns);
    wait_served(&routes, "dns", 1).await;
    let port = switchyard_e2e::gateway::fleet_port(&rig, &ns, "datagrams", 53).await;
    let targets = (rig.envoy_addresses.iter())
        .map(|a| std::net::SocketAddr::new(a.parse().expect("an Envoy address"), port))
        .collect();
    (rig, targets)
}

/// What a load of datagrams saw across moves of the UDPRoute.
struct DatagramMoves {
    report: LoadReport,
    changes: Changes,
    /// Datagrams that never reached a backend (Envoy dropped them on their way there):
    /// those sent while a move was on its way (from its apply until it was seen Served),
    /// and those sent once it was.
    dropped_during: usize,
    dropped_after: usize,
    /// Datagrams a backend answered whose answer never came back (a session Envoy closed
    /// as it replaced the listener): sent while a move was on its way, and after.
    answers_lost_during: usize,
    answers_lost_after: usize,
}

impl DatagramMoves {
    fn summary(&self) -> String {
        format!(
            "{} datagrams, unanswered {}: never reached a backend {} while a move was on its way and {} after it was Served, answer lost {} while a move was on its way and {} after; by backend {:?}; {}",
            self.report.sent,
            self.report.non_2xx(),
            self.dropped_during,
            self.dropped_after,
            self.answers_lost_during,
            self.answers_lost_after,
            self.report.by_backend,
            self.changes.summary()
        )
    }
}

/// Moves the UDPRoute `dns` to fresh Services `moves` times under a load of datagrams,
/// each Service's endpoints published 0–200 ms after the move.
async fn datagram_moves(
    rig: &mut Rig,
    targets: Vec<std::net::SocketAddr>,
    moves: usize,
) -> DatagramMoves {
    let ns = rig.namespace.clone();
    let routes: Api<UdpRoute> = Api::namespaced(rig.client.clone(), &ns);
    let load =
        switchyard_e2e::datagrams::DatagramLoad::start(targets, 150, Duration::from_secs(180));
    let mut changes = Changes::default();
    let mut windows = Vec::new();
    for i in 1..=moves {
        let new = format!("udp-{i}");
        rig.add_udp_backend_unpublished(&new).await;
        let late = endpoints_late(i as u64);
        let applied = load.started().elapsed();
        let served = changes
            .timed(async {
                apply(rig, &dns_route(&ns, &new)).await;
                // Served is watched while the endpoints are on their way: a rollout that
                // says Served before they arrive is seen doing so.
                let publish = async {
                    tokio::time::sleep(late).await;
                    rig.publish_udp_endpoints(&new).await;
                };
                let served = async {
                    wait_served(&routes, "dns", 1 + i as i64).await;
                    load.started().elapsed()
                };
                tokio::join!(publish, served).1
            })
            .await;
        windows.push(applied..served);
    }
    let seen = load.finish().await;
    let (dropped, lost): (Vec<_>, Vec<_>) =
        (seen.unanswered.iter()).partition(|u| !u.reached_a_backend);
    let during = |unanswered: &[&switchyard_e2e::datagrams::Unanswered]| {
        (unanswered.iter())
            .filter(|u| windows.iter().any(|w| w.contains(&u.at)))
            .count()
    };
    let (dropped_during, lost_during) = (during(&dropped), during(&lost));
    DatagramMoves {
        dropped_during,
        dropped_after: dropped.len() - dropped_during,
        answers_lost_during: lost_during,
        answers_lost_after: lost.len() - lost_during,
        report: seen.report,
        changes,
    }
}

/// A UDPRoute served through three Envoys, moved to fresh Services ten times under a load
/// of datagrams (each from a socket of its own), their endpoints late: Envoy drops no
/// datagram on its way to a backend, neither while a move is on its way (the old backend
/// answers until the new one is proven ready) nor once it is Served. (An answer in flight
/// when an Envoy replaces the listener can be lost with its session: counted, not
/// asserted.)
#[tokio::test]
async fn a_udp_route_moves_between_services_under_load_without_an_unanswered_datagram() {
    let (mut rig, targets) = serving_datagrams("udp-moves", &[]).await;
    let moved = datagram_moves(&mut rig, targets, 10).await;
    eprintln!("udproute: {}", moved.summary());
    assert!(moved.report.sent > 0);
    assert_eq!(
        (moved.dropped_during, moved.dropped_after),
        (0, 0),
        "dropped on the way to a backend: {:#?}",
        moved.report.failures
    );
    assert!(
        moved.report.by_backend.contains_key("udp-10"),
        "{:?}",
        moved.report.by_backend
    );
}

/// The same moves without the two phases and xDS ordering drop datagrams on their way to
/// a backend, some sent after the route says Served (the listener sends them to a Service
/// whose endpoints Envoy does not have yet): what the rollout guards against is visible to
/// the test above.
#[tokio::test]
async fn without_two_phases_and_ordering_the_same_udp_moves_leave_datagrams_unanswered() {
    let (mut rig, targets) =
        serving_datagrams("udp-naive", &["--one-phase", "--unordered-xds"]).await;
    let moved = datagram_moves(&mut rig, targets, 10).await;
    eprintln!("udproute, one phase and unordered xDS: {}", moved.summary());
    assert!(
        moved.dropped_after > 0,
        "the test cannot see what the rollout guards against"
    );
}

/// `retry` (standard since v1.7) and the experimental channel's `sessionPersistence` through
/// real Envoys: a rule
/// retrying 503s hands the client the next answer, where a rule without retries passes the
/// 503 on; a session cookie is set on the first answer and keeps the requests that carry
/// it on one Pod of two; putting both on and taking them off under load drops nothing.
#[tokio::test]
async fn an_httproutes_retries_and_session_cookie_are_served() {
    let mut rig = Rig::start(2).await;
    install_crds(&rig).await;
    select_fleet(&rig).await;
    rig.add_pods("app", 2).await;
    rig.start_pod("app", 0).await;
    rig.start_pod("app", 1).await;
    let (controller, class) = start_gateway_controller(&mut rig, "experimental", &[]);
    let ns = rig.namespace.clone();
    let route = |rule_options: &str| {
        web_route_with(
            &ns,
            &format!(
                "    - matches: [ {{ path: {{ type: PathPrefix, value: /plain }} }} ]
      backendRefs: [ {{ name: app, port: 80 }} ]
    - backendRefs: [ {{ name: app, port: 80 }} ]
{rule_options}"
            ),
        )
    };
    let both = "      retry: { attempts: 3, codes: [ 503 ], backoff: 10ms }\n      \
                sessionPersistence: { type: Cookie, cookie: { name: cart } }\n";
    apply(
        &rig,
        &format!("{}{}", edge_gateway(&class, &controller, &ns), route(both)),
    )
    .await;
    let routes: Api<HttpRoute> = Api::namespaced(rig.client.clone(), &ns);
    wait_served(&routes, "web", 1).await;
    let targets = edge_targets(&rig).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    let get = |path: &str, cookie: Option<&str>| {
        let mut request = client
            .get(format!("{}{path}", targets[0]))
            .header("host", "web.test");
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        request.send()
    };

    // Every Pod fails its next request: 3 retries reach a 200 wherever they go.
    for i in 0..2 {
        rig.pod("app", i).fail_next(1, 503);
    }
    let retried = get("/cart", None).await.expect("answered");
    assert_eq!(retried.status(), 200, "503s retried");
    for i in 0..2 {
        rig.pod("app", i).fail_next(1, 503);
    }
    let plain = get("/plain", None).await.expect("answered");
    assert_eq!(
        plain.status(),
        503,
        "the rule without retry passes the 503 on"
    );
    for i in 0..2 {
        rig.pod("app", i).fail_next(0, 503);
    }

    // A session cookie (no Max-Age: the route asks for none) for every path of the host,
    // and one Pod for the requests that carry it.
    let set_cookie = retried
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        set_cookie.starts_with("cart=") && set_cookie.contains("Path=/"),
        "{set_cookie:?}"
    );
    assert!(!set_cookie.contains("Max-Age"), "{set_cookie:?}");
    let cookie = set_cookie.split(';').next().unwrap_or_default().to_owned();
    let mut pods = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let answer = get("/cart", Some(&cookie)).await.expect("answered");
        assert_eq!(answer.status(), 200);
        pods.insert(
            answer
                .headers()
                .get("x-backend-address")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
        );
    }
    assert_eq!(pods.len(), 1, "one Pod for the session: {pods:?}");
    let mut without = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let answer = get("/plain", None).await.expect("answered");
        if let Some(at) = answer.headers().get("x-backend-address") {
            without.insert(at.to_str().unwrap_or_default().to_owned());
        }
    }
    assert_eq!(without.len(), 2, "both Pods without a session: {without:?}");

    // Taken off, changed and put back under load: each a switch through the two phases.
    let load =
        switchyard_e2e::Load::start(targets.clone(), "web.test", 150, Duration::from_secs(120));
    let steps = [
        "",
        "      retry: { attempts: 1 }\n",
        "      sessionPersistence: { type: Cookie, absoluteTimeout: 1h, cookie: { lifetimeType: Permanent } }\n",
        both,
    ];
    for (i, options) in steps.iter().enumerate() {
        apply(&rig, &route(options)).await;
        wait_served(&routes, "web", 2 + i as i64).await;
    }
    let report = load.finish().await;
    eprintln!(
        "retry and sessionPersistence changed {} times under load: {} requests, by status {:?}",
        steps.len(),
        report.sent,
        report.by_status
    );
    assert!(report.sent > 0);
    assert_eq!(report.non_2xx(), 0, "failures: {:#?}", report.failures);
}

/// What the API server's audit log keeps: the start and the end of every watch, and
/// nothing else.
const AUDIT_WATCHES: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, Panic]
rules:
  - level: Metadata
    verbs: [watch]
  - level: None
"#;

/// Each kind the operator needs is watched once per process (once per namespace of its
/// scope: the API has no watch over a list of namespaces), however many parts read it —
/// the snapshot builder, the TrafficRoute and Gateway controllers, the rollout engine, the
/// fleet drain, leader election and the fleet reports — with a TrafficRoute and an
/// HTTPRoute each served, so every reader has read. Counted in the API server's audit log:
/// the watch requests with Switchyard's User-Agent open at once, at most, per kind and
/// namespace (a watch the API server ends is started again: that is still one watch).
#[tokio::test]
async fn each_kind_is_watched_once_per_process_with_both_front_ends_serving() {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use switchyard_e2e::kube::{ApiServerOptions, KubeApi};
    use switchyard_e2e::rig::FLEET_NAMESPACE;

    let dir = tempfile::tempdir().expect("a temp dir");
    let policy = dir.path().join("audit-policy.yaml");
    std::fs::write(&policy, AUDIT_WATCHES).expect("write the audit policy");
    let log = dir.path().join("audit.log");
    let options = ApiServerOptions {
        extra_args: vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", log.display()),
        ],
        ..ApiServerOptions::loopback()
    };
    let api = Arc::new(KubeApi::start_with(dir.path(), &options).await);
    let mut rig = Rig::start_on(api, 3).await;
    install_crds(&rig).await;
    select_fleet(&rig).await;
    rig.add_backend("web").await;
    let (controller, class) = start_gateway_controller(&mut rig, "watches", &[]);
    let ns = rig.namespace.clone();
    rig.apply_route("shop", &Rig::route_yaml("shop.test", &[("web", 100)]))
        .await;
    rig.wait_ready("shop", WITHIN).await;
    apply(
        &rig,
        &format!(
            r#"{}
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: web, namespace: {ns} }}
spec:
  parentRefs: [ {{ name: edge }} ]
  hostnames: [ web.test ]
  rules: [ {{ backendRefs: [ {{ name: web, port: 80 }} ] }} ]
"#,
            edge_gateway(&class, &controller, &ns),
        ),
    )
    .await;
    let routes: Api<HttpRoute> = Api::namespaced(rig.client.clone(), &ns);
    wait_served(&routes, "web", 1).await;

    let text = std::fs::read_to_string(&log).expect("the audit log");
    let mut open: BTreeMap<(String, String), u32> = BTreeMap::new();
    let mut watches: BTreeMap<(String, String), u32> = BTreeMap::new();
    let mut started: BTreeMap<String, (String, String)> = BTreeMap::new();
    for line in text.lines() {
        let event: Value = serde_json::from_str(line).expect("an audit event");
        let agent = event["userAgent"].as_str().unwrap_or_default();
        if !agent.starts_with("switchyard/") {
            continue;
        }
        let id = event["auditID"].as_str().unwrap_or_default().to_string();
        let resource = event["objectRef"]["resource"].as_str().unwrap_or_default();
        let namespace = event["objectRef"]["namespace"].as_str().unwrap_or("*");
        let key = (resource.to_string(), namespace.to_string());
        match event["stage"].as_str() {
            Some("ResponseStarted") => {
                started.insert(id, key.clone());
                let now = open.entry(key.clone()).or_default();
                *now += 1;
                let most = watches.entry(key).or_default();
                *most = (*most).max(*now);
            }
            // Ended (or refused before it started: then it was never open).
            Some("ResponseComplete") => {
                if let Some(key) = started.remove(&id) {
                    *open.entry(key).or_default() -= 1;
                }
            }
            _ => {}
        }
    }
    let once = |resource: &str, namespace: &str| ((resource.to_string(), namespace.to_string()), 1);
    // The rig's operators watch the test's namespace; the fleet's namespace too for
    // Services (each Gateway's is there) and EndpointSlices (the fleet's).
    let expected: BTreeMap<(String, String), u32> = [
        once("backendtlspolicies", &ns),
        once("configmaps", &ns),
        once("endpointslices", &ns),
        once("endpointslices", FLEET_NAMESPACE),
        once("gatewayclasses", "*"),
        once("gateways", &ns),
        once("grpcroutes", &ns),
        once("httproutes", &ns),
        once("leases", "default"),
        once("listenersets", &ns),
        once("namespaces", "*"),
        once("proxyconfigs", &ns),
        once("referencegrants", &ns),
        once("secrets", &ns),
        once("services", &ns),
        once("services", FLEET_NAMESPACE),
        once("tcproutes", &ns),
        once("tlsroutes", &ns),
        once("trafficroutes", &ns),
        once("udproutes", &ns),
    ]
    .into();
    assert_eq!(
        watches, expected,
        "watches open at once, at most, by (resource, namespace)"
    );
}

/// Whether a GET of web.test through every one of `targets` gets a 2xx, over a new
/// connection as `client`.
async fn https_answers(targets: &[std::net::SocketAddr], client: &Arc<ClientConfig>) -> Vec<bool> {
    let mut out = Vec::new();
    for target in targets {
        let answer = match HttpsConnection::connect_with(*target, "web.test", client.clone()).await
        {
            Ok(mut connection) => connection.get("web.test", "/").await.ok(),
            Err(_) => None,
        };
        out.push(answer.is_some_and(|a| (200..300).contains(&a.status)));
    }
    out
}

/// Until every Envoy answers `client` as `served` says (all served, or all refused).
async fn wait_clients(
    what: &str,
    targets: &[std::net::SocketAddr],
    client: &Arc<ClientConfig>,
    served: bool,
) {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let answers = https_answers(targets, client).await;
        if answers.iter().all(|a| *a == served) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: served {answers:?} within {WITHIN:?}, wanted {served}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn client_certificate_validation_is_added_changed_and_removed_under_load_without_a_drop() {
    let mut rig = Rig::start(3).await;
    install_crds(&rig).await;
    select_fleet(&rig).await;
    rig.add_backend("web").await;
    let (controller, class) = start_gateway_controller(&mut rig, "client-certs", &[]);
    let ns = rig.namespace.clone();
    let (cert, key) = Rig::new_certificate("web.test");
    rig.apply_tls_secret("edge-cert", &cert, &key).await;
    // Two authorities, each with a client certificate it signed.
    let (a, b) = (
        switchyard::certgen::generate(&["web.test".to_owned()], 1).expect("certgen"),
        switchyard::certgen::generate(&["web.test".to_owned()], 1).expect("certgen"),
    );
    let as_a = tls_client(Some(&ClientIdentity::from_pem(
        &a.client.cert_pem,
        &a.client.key_pem,
    )));
    let as_b = tls_client(Some(&ClientIdentity::from_pem(
        &b.client.cert_pem,
        &b.client.key_pem,
    )));
    let anonymous = tls_client(None);
    let config_map = |pem: &str| {
        let pem = pem.trim_end().replace('\n', "\n    ");
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{ name: client-ca, namespace: {ns} }}\n\
             data:\n  ca.crt: |\n    {pem}\n---\n"
        )
    };
    // Gateway `edge`, one HTTPS listener, with `frontend` as its spec.tls.frontend.
    let gateway = |frontend: &str| {
        let tls = match frontend {
            "" => String::new(),
            f => format!("  tls: {{ frontend: {f} }}\n"),
        };
        let listener = "listeners: [ { name: http, port: 80, protocol: HTTP } ]";
        let https = "listeners: [ { name: https, port: 443, protocol: HTTPS, \
                     tls: { certificateRefs: [ { name: edge-cert } ] } } ]";
        let yaml = edge_gateway(&class, &controller, &ns).replace(listener, https);
        yaml.replace("  listeners:", &format!("{tls}  listeners:"))
    };
    let validation = |mode: &str| {
        format!(
            "{{ default: {{ validation: {{ mode: {mode}, caCertificateRefs: \
             [ {{ group: '', kind: ConfigMap, name: client-ca }} ] }} }} }}"
        )
    };
    let route = web_route(&ns, "web");
    apply(
        &rig,
        &format!("{}{}{route}", config_map(&a.ca.cert_pem), gateway("")),
    )
    .await;
    let routes: Api<HttpRoute> = Api::namespaced(rig.client.clone(), &ns);
    wait_served(&routes, "web", 1).await;
    let port = switchyard_e2e::gateway::fleet_port(&rig, &ns, "edge", 443).await;
    let targets: Vec<std::net::SocketAddr> = (rig.envoy_addresses.iter())
        .map(|a| std::net::SocketAddr::new(a.parse().expect("an Envoy address"), port))
        .collect();
    wait_clients("before validation", &targets, &anonymous, true).await;
    // Client A throughout: every setting below lets it through.
    let load = HttpsLoad::start_with(
        targets.clone(),
        "web.test",
        150,
        Duration::from_secs(120),
        as_a.clone(),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Each change: when every Envoy answered as it says, then a second of traffic on it.
    let mut took = Changes::default();
    let mut settle = async |changed: tokio::time::Instant| {
        took.0.push(changed.elapsed());
        tokio::time::sleep(Duration::from_secs(1)).await;
    };

    // Validation against A's authority: a client without a certificate is refused.
    let changed = tokio::time::Instant::now();
    apply(&rig, &gateway(&validation("AllowValidOnly"))).await;
    wait_clients("A only: anonymous", &targets, &anonymous, false).await;
    wait_clients("A only: B", &targets, &as_b, false).await;
    settle(changed).await;

    // The insecure fallback: anyone is served again, and the Gateway says so.
    let changed = tokio::time::Instant::now();
    apply(&rig, &gateway(&validation("AllowInsecureFallback"))).await;
    wait_clients("fallback: anonymous", &targets, &anonymous, true).await;
    let gateways: Api<Gateway> = Api::namespaced(rig.client.clone(), &ns);
    wait_status(&gateways, "edge", "InsecureFrontendValidationMode", |s| {
        condition(s, "/conditions", "InsecureFrontendValidationMode")
            .is_some_and(|c| c["status"] == "True" && c["reason"] == "ConfigurationChanged")
    })
    .await;
    settle(changed).await;

    // Both authorities, valid clients only: B is let in, the fallback's condition goes.
    let changed = tokio::time::Instant::now();
    apply(
        &rig,
        &format!(
            "{}{}",
            config_map(&format!("{}{}", a.ca.cert_pem, b.ca.cert_pem)),
            gateway(&validation("AllowValidOnly"))
        ),
    )
    .await;
    wait_clients("A and B: anonymous", &targets, &anonymous, false).await;
    wait_clients("A and B: B", &targets, &as_b, true).await;
    wait_status(
        &gateways,
        "edge",
        "no InsecureFrontendValidationMode",
        |s| condition(s, "/conditions", "InsecureFrontendValidationMode").is_none(),
    )
    .await;
    settle(changed).await;

    // Validation removed: anyone is served.
    let changed = tokio::time::Instant::now();
    apply(&rig, &gateway("")).await;
    wait_clients("no validation: anonymous", &targets, &anonymous, true).await;
    settle(changed).await;

    let report = load.finish().await;
    eprintln!(
        "client certificates: {} requests in {:.1}s over {} connections, non-2xx {}; {}",
        report.requests.sent,
        report.requests.elapsed.as_secs_f64(),
        report.connections,
        report.requests.non_2xx(),
        took.summary(),
    );
    assert!(report.requests.sent > 0);
    assert_eq!(
        report.requests.non_2xx(),
        0,
        "failures: {:#?}",
        report.requests.failures
    );
}

/// The names of the clusters of Service `service` that every Envoy's routes send to.
async fn routed_clusters(rig: &Rig, service: &str) -> Vec<std::collections::BTreeSet<String>> {
    fn strings(value: &Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
        match value {
            Value::String(s) if s.starts_with(prefix) => {
                out.insert(s.clone());
            }
            Value::Array(items) => items.iter().for_each(|v| strings(v, prefix, out)),
            Value::Object(fields) => fields.values().for_each(|v| strings(v, prefix, out)),
            _ => {}
        }
    }
    let prefix = format!("{}/{service}/", rig.namespace);
    let mut out = Vec::new();
    for envoy in &rig.envoys {
        let dump = envoy
            .admin("/config_dump?resource=dynamic_route_configs")
            .await;
        let json: Value = serde_json::from_str(&dump).unwrap_or_default();
        let mut found = std::collections::BTreeSet::new();
        strings(&json, &prefix, &mut found);
        out.push(found);
    }
    out
}

/// Until every Envoy routes to other clusters of `service` than `before`, or panics
/// naming `what` after [`WITHIN`].
async fn wait_rerouted(
    rig: &Rig,
    service: &str,
    before: &[std::collections::BTreeSet<String>],
    what: &str,
) {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let now = routed_clusters(rig, service).await;
        if now.iter().zip(before).all(|(n, b)| !n.is_empty() && n != b) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} not routed to within {WITHIN:?}: {now:?} (before {before:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn backend_tls_is_added_changed_and_removed_under_load_without_a_drop() {
    let mut rig = Rig::start(3).await;
    install_crds(&rig).await;
    select_fleet(&rig).await;
    rig.add_backend("web").await;
    // Two HTTPS backends, each with a certificate of an authority of its own; B serves only
    // clients with a certificate of its authority.
    let issue = |name: &str| switchyard::certgen::generate(&[name.to_owned()], 1).expect("certgen");
    let (a, b) = (issue("a.backend.test"), issue("b.backend.test"));
    let (a_id, b_id) = (
        (a.server.cert_pem.as_str(), a.server.key_pem.as_str()),
        (b.server.cert_pem.as_str(), b.server.key_pem.as_str()),
    );
    rig.add_tls_backend("secure-a", a_id, None).await;
    rig.add_tls_backend("secure-b", b_id, Some(&b.ca.cert_pem))
        .await;
    // The certificate the fleet presents to B, once the Gateway names it.
    rig.apply_tls_secret("fleet-client", &b.client.cert_pem, &b.client.key_pem)
        .await;
    let (controller, class) = start_gateway_controller(&mut rig, "backend-tls", &[]);
    let ns = rig.namespace.clone();
    let config_map = |name: &str, pem: &str| {
        let pem = pem.trim_end().replace('\n', "\n    ");
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{ name: {name}, namespace: {ns} }}\n\
             data:\n  ca.crt: |\n    {pem}\n---\n"
        )
    };
    let policy = |service: &str, hostname: &str, ca: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\n\
             metadata: {{ name: {service}, namespace: {ns} }}\nspec:\n  \
             targetRefs: [ {{ group: '', kind: Service, name: {service} }} ]\n  \
             validation: {{ hostname: {hostname}, caCertificateRefs: \
             [ {{ group: '', kind: ConfigMap, name: {ca} }} ] }}\n---\n"
        )
    };
    // A route to both HTTPS backends first: their policies get a status once a Gateway
    // sends to them, so the test knows the controller has them before `web` moves.
    let check = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
         metadata: {{ name: check, namespace: {ns} }}\nspec:\n  parentRefs: [ {{ name: edge }} ]\n  \
         hostnames: [ check.test ]\n  rules: [ {{ backendRefs: [ {{ name: secure-a, port: 80 }}, \
         {{ name: secure-b, port: 80 }} ] }} ]\n---\n"
    );
    apply(
        &rig,
        &format!(
            "{}{}---\n{}{}{}{}{check}",
            edge_gateway(&class, &controller, &ns),
            web_route(&ns, "web"),
            config_map("ca-a", &a.ca.cert_pem),
            config_map("ca-b", &b.ca.cert_pem),
            policy("secure-a", "a.backend.test", "ca-a"),
            policy("secure-b", "b.backend.test", "ca-b"),
        ),
    )
    .await;
    let routes: Api<HttpRoute> = Api::namespaced(rig.client.clone(), &ns);
    wait_served(&routes, "web", 1).await;
    wait_served(&routes, "check", 1).await;
    let policies: Api<switchyard::gateway::api::backendtlspolicies::BackendTlsPolicy> =
        Api::namespaced(rig.client.clone(), &ns);
    for name in ["secure-a", "secure-b"] {
        wait_status(&policies, name, "Accepted", |s| {
            condition(s, "/ancestors/0/conditions", "Accepted")
                .is_some_and(|c| c["status"] == "True")
        })
        .await;
    }
    let targets = edge_targets(&rig).await;
    let load =
        switchyard_e2e::Load::start(targets.clone(), "web.test", 150, Duration::from_secs(120));
    let seen = |name: &str| rig.backends[name].requests_seen();
    wait_more("web", 0, || seen("web")).await;

    // `web` moves to the HTTPS backend A: its cluster speaks TLS, checked against A's CA.
    let mut changes = Changes::default();
    changes
        .timed(async {
            apply(&rig, &web_route(&ns, "secure-a")).await;
            wait_served(&routes, "web", 2).await;
        })
        .await;
    wait_more("secure-a", seen("secure-a"), || seen("secure-a")).await;
    // A second of traffic on each setting, not only across the changes.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A's policy trusts both authorities now: a cluster of its own, rolled out as any.
    let before = routed_clusters(&rig, "secure-a").await;
    changes
        .timed(async {
            let both = format!("{}{}", a.ca.cert_pem, b.ca.cert_pem);
            apply(&rig, &config_map("ca-a", &both)).await;
            wait_rerouted(&rig, "secure-a", &before, "the new CA").await;
        })
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The Gateway presents a client certificate to its TLS backends: its clusters are its
    // own now, rolled out as any (A does not ask for one, B will).
    let presenting = edge_gateway(&class, &controller, &ns).replace(
        "  listeners:",
        "  tls: { backend: { clientCertificateRef: { name: fleet-client } } }\n  listeners:",
    );
    let before = routed_clusters(&rig, "secure-a").await;
    let gateways: Api<Gateway> = Api::namespaced(rig.client.clone(), &ns);
    changes
        .timed(async {
            apply(&rig, &presenting).await;
            wait_status(&gateways, "edge", "ResolvedRefs", |s| {
                condition(s, "/conditions", "ResolvedRefs").is_some_and(|c| c["status"] == "True")
            })
            .await;
            wait_rerouted(&rig, "secure-a", &before, "the presenting cluster").await;
        })
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // To B (which asks for the certificate), then back to the plain backend with the
    // policies gone.
    changes
        .timed(async {
            apply(&rig, &web_route(&ns, "secure-b")).await;
            wait_served(&routes, "web", 3).await;
        })
        .await;
    wait_more("secure-b", seen("secure-b"), || seen("secure-b")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    changes
        .timed(async {
            apply(&rig, &web_route(&ns, "web")).await;
            wait_served(&routes, "web", 4).await;
        })
        .await;
    for name in ["secure-a", "secure-b"] {
        policies
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete a BackendTLSPolicy");
    }
    wait_more("web", seen("web"), || seen("web")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let report = finished_without_a_drop(load, "backend TLS", &changes).await;
    for backend in ["web", "secure-a", "secure-b"] {
        assert!(
            report.by_backend.contains_key(backend),
            "{:?}",
            report.by_backend
        );
    }
}
