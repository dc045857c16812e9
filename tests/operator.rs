//! The operator on a real kube-apiserver with real Envoys: a TrafficRoute becomes Ready
//! only when every Envoy serves it, and traffic shifts without a failed request.

use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use switchyard_e2e::Load;
use switchyard_e2e::rig::{HOST, Rig};

#[tokio::test]
async fn a_route_becomes_ready_and_shifts_to_a_new_service_without_drops() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("blue").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("blue", 1)]))
        .await;
    let took = rig.wait_ready("web", Duration::from_secs(60)).await;
    eprintln!("first generation Ready in {took:?}");
    assert_eq!(rig.answers().await, ["blue", "blue", "blue"]);

    let load = Load::start(rig.targets(), HOST, 240, Duration::from_secs(60));
    for (i, color) in ["green", "yellow", "purple"].iter().enumerate() {
        rig.add_backend(color).await;
        rig.apply_route("web", &Rig::route_yaml(HOST, &[(color, 1)]))
            .await;
        let took = rig.wait_ready("web", Duration::from_secs(30)).await;
        eprintln!("shift {} to {color}: Ready in {took:?}", i + 1);
        // Ready means every Envoy serves it.
        assert_eq!(rig.answers().await, [*color; 3]);
    }
    let report = load.finish().await;
    eprintln!(
        "load: {} requests, by status {:?}, by backend {:?}",
        report.sent, report.by_status, report.by_backend
    );
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}

fn condition<'a>(
    status: &'a switchyard::api::TrafficRouteStatus,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

#[tokio::test]
async fn bad_routes_are_reported_and_contained_and_status_does_not_churn() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("blue").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("blue", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    let cases = [
        (
            "no-service",
            "hosts: [\"a.test\"]\nrules:\n- backends: [ { service: missing, port: 80 } ]\n",
            "ServiceNotFound",
            "Service \"missing\" does not exist",
        ),
        (
            "no-port",
            "hosts: [\"b.test\"]\nrules:\n- backends: [ { service: blue, portName: admin } ]\n",
            "PortNotFound",
            "no port named \"admin\"",
        ),
        (
            "thief",
            &format!(
                "hosts: [\"{HOST}\"]\nrules:\n- backends: [ {{ service: blue, port: 80 }} ]\n"
            ),
            "HostConflict",
            "already served by route",
        ),
        (
            "lookahead",
            "hosts: [\"c.test\"]\nrules:\n- match: { pathRegex: \"/(?=x)\" }\n  backends: [ { service: blue, port: 80 } ]\n",
            "Rejected",
            "cannot be served",
        ),
    ];
    for (name, spec, _, _) in &cases {
        rig.apply_route(name, spec).await;
    }
    for (name, _, reason, message) in &cases {
        let status = rig
            .wait_status(name, Duration::from_secs(20), |s| {
                condition(s, "Accepted").is_some_and(|c| c.status == "False")
            })
            .await;
        let accepted = condition(&status, "Accepted").expect("Accepted");
        let ready = condition(&status, "Ready").expect("Ready");
        eprintln!(
            "{name}: Accepted=False {} \"{}\"",
            accepted.reason, accepted.message
        );
        assert_eq!(accepted.reason, *reason);
        assert!(accepted.message.contains(message), "{}", accepted.message);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", *reason)
        );
    }
    // Every other route keeps serving, still Ready.
    assert_eq!(rig.answers().await, ["blue", "blue", "blue"]);
    rig.wait_ready("web", Duration::from_secs(1)).await;
    // An Event for each rejection, under its reason.
    for (name, _, reason, _) in &cases {
        let reasons = rig.event_reasons(name).await;
        assert!(
            reasons.iter().any(|r| r == reason),
            "no {reason} Event for {name}: {reasons:?}"
        );
    }

    // Hands off user intent: only the user manages the spec; Switchyard only the status.
    let web = rig.route("web").await;
    let managers: Vec<(String, String)> = web
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.subresource.clone().unwrap_or_default(),
            )
        })
        .collect();
    eprintln!("managed fields of web: {managers:?}");
    for (manager, subresource) in &managers {
        assert!(
            manager == "rig-user" || subresource == "status",
            "{manager} manages more than status: {managers:?}"
        );
    }

    // No status churn: a reconcile that changes nothing writes nothing.
    let before = rig.route("web").await.metadata.resource_version;
    rig.add_backend("noise").await; // a Service change reconciles every route of the namespace
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        rig.route("web").await.metadata.resource_version,
        before,
        "status rewritten without a change"
    );

    // Fixing the cause completes the rollout by itself.
    rig.add_backend("missing").await;
    rig.wait_ready("no-service", Duration::from_secs(30)).await;
}

#[tokio::test]
async fn an_operator_held_to_a_few_api_requests_a_second_still_rolls_out_without_drops() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("blue").await;
    rig.add_backend("green").await;
    // Its watches alone take the first burst: everything after is paced.
    rig.start_operator("switchyard-1", &["--api-qps", "5", "--api-burst", "5"]);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("blue", 1)]))
        .await;
    let took = rig.wait_ready("web", Duration::from_secs(60)).await;
    eprintln!("at 5 API requests/s: first generation Ready in {took:?}");
    let load = Load::start(rig.targets(), HOST, 240, Duration::from_secs(60));
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("green", 1)]))
        .await;
    let took = rig.wait_ready("web", Duration::from_secs(60)).await;
    eprintln!("at 5 API requests/s: shift Ready in {took:?}");
    assert_eq!(rig.answers().await, ["green"; 3]);
    let report = load.finish().await;
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}

/// Hundreds of rejected routes, whose statuses take the writer's 20 writes a second for
/// many seconds, next to a route shifting: its Ready is written first (I9).
#[tokio::test]
async fn a_flood_of_rejected_routes_does_not_hold_back_another_routes_ready() {
    const BAD: usize = 300;
    let mut rig = Rig::start(3).await;
    rig.add_backend("blue").await;
    rig.add_backend("green").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("blue", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;

    let routes: kube::Api<switchyard::api::TrafficRoute> =
        kube::Api::namespaced(rig.client.clone(), &rig.namespace);
    futures::stream::iter(0..BAD)
        .map(|i| {
            let routes = routes.clone();
            async move {
                let spec = serde_json::from_value(serde_json::json!({
                    "hosts": [format!("bad{i}.test")],
                    "rules": [{ "backends": [{ "service": "missing", "port": 80 }] }],
                }))
                .expect("spec");
                routes
                    .create(
                        &Default::default(),
                        &switchyard::api::TrafficRoute::new(&format!("bad-{i}"), spec),
                    )
                    .await
                    .expect("create route");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;

    let load = Load::start(rig.targets(), HOST, 240, Duration::from_secs(120));
    let mut ready = Vec::new();
    for color in ["green", "blue", "green"] {
        rig.apply_route("web", &Rig::route_yaml(HOST, &[(color, 1)]))
            .await;
        ready.push(rig.wait_ready("web", Duration::from_secs(60)).await);
        assert_eq!(rig.answers().await, [color; 3]);
    }
    let rejected = routes
        .list(&Default::default())
        .await
        .expect("list routes")
        .items
        .iter()
        .filter(|r| r.status.is_some() && r.name_any().starts_with("bad-"))
        .count();
    let report = load.finish().await;
    eprintln!(
        "{BAD} rejected routes: web's change → Ready {ready:?}; {rejected}/{BAD} rejections written by then; {} requests, non-2xx {}",
        report.sent,
        report.non_2xx()
    );
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
    assert!(
        rejected < BAD,
        "the rejections were written before the test could see them queue"
    );
    // Before, Ready waited behind the queued rejections: seconds at 20 writes/s.
    for took in &ready {
        assert!(*took < Duration::from_secs(3), "Ready after {took:?}");
    }
}

/// The API server takes this route but refuses its ProxyConfig (here an admission policy
/// of the cluster does): the route says so at once, instead of retrying silently.
#[tokio::test]
async fn a_route_whose_proxy_config_the_api_server_refuses_says_so() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("blue").await;
    let policy = format!("refuse-proxy-configs-{}", rig.namespace);
    let manifest = format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{ name: {policy} }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: ["switchyard.dev"]
      apiVersions: ["v1alpha1"]
      operations: ["CREATE", "UPDATE"]
      resources: ["proxyconfigs"]
  validations:
  - expression: "object.spec.route != 'refused'"
    message: "this cluster takes no ProxyConfig of route refused"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{ name: {policy} }}
spec:
  policyName: {policy}
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {{ kubernetes.io/metadata.name: {namespace} }}
"#,
        namespace = rig.namespace
    );
    let out = rig.api.kubectl_input(["apply", "-f", "-"], &manifest).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The policy takes effect once the API server's informer has it.
    let probe = format!(
        "apiVersion: switchyard.dev/v1alpha1\nkind: ProxyConfig\nmetadata: {{ name: probe-policy, namespace: {} }}\nspec: {{ role: live, route: refused, generation: 1, version: v }}\n",
        rig.namespace
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while rig
        .api
        .kubectl_input(["create", "--dry-run=server", "-f", "-"], &probe)
        .await
        .status
        .success()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the policy never took effect"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("refused", &Rig::route_yaml("refused.test", &[("blue", 1)]))
        .await;
    let status = rig
        .wait_status("refused", Duration::from_secs(20), |s| {
            condition(s, "Accepted").is_some_and(|c| c.status == "False")
        })
        .await;
    let accepted = condition(&status, "Accepted").expect("Accepted");
    eprintln!("{}: {}", accepted.reason, accepted.message);
    assert_eq!(accepted.reason, "WriteRefused");
    assert!(
        accepted.message.contains("ProxyConfig refused-")
            && accepted
                .message
                .contains("this cluster takes no ProxyConfig"),
        "{}",
        accepted.message
    );
    let _ = rig
        .api
        .kubectl_input(
            [
                "delete",
                "validatingadmissionpolicybinding,validatingadmissionpolicy",
                &policy,
            ],
            "",
        )
        .await;
}

#[tokio::test]
async fn header_values_are_sent_as_written_percent_signs_included() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("blue").await;
    rig.start_operator("switchyard-1", &[]);
    // Envoy would read %...% as a command and refuse the whole route configuration.
    let value = "50% off, %NOT_A_COMMAND% and %REQ(x-a";
    let spec = format!(
        "{}  responseHeaders: {{ set: {{ x-offer: \"{value}\" }} }}\n",
        Rig::route_yaml(HOST, &[("blue", 1)])
    );
    rig.apply_route("web", &spec).await;
    rig.wait_ready("web", Duration::from_secs(30)).await;
    for target in rig.targets() {
        let response = reqwest::Client::new()
            .get(format!("{target}/"))
            .header("host", HOST)
            .send()
            .await
            .expect("a response");
        assert_eq!(
            response
                .headers()
                .get("x-offer")
                .and_then(|v| v.to_str().ok()),
            Some(value),
            "through {target}"
        );
    }
}

/// What the live (or probe) batches of the rig's namespace hold: member names.
async fn batch_members(rig: &Rig, role: &str) -> Vec<String> {
    let api =
        kube::Api::<switchyard::api::ProxyConfig>::namespaced(rig.client.clone(), &rig.namespace);
    let selector = format!("{}={role}", switchyard::api::proxy_config::BATCH_LABEL);
    let batches = api
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .unwrap_or_else(|e| panic!("list {role} batches: {e}"));
    let mut names: Vec<String> = batches
        .items
        .iter()
        .flat_map(|b| b.spec.members.iter().map(|m| m.name.clone()))
        .collect();
    names.sort();
    names
}

/// Waits until `role`'s batches hold exactly `expected`.
async fn wait_batch_members(rig: &Rig, role: &str, expected: &[String], within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let members = batch_members(rig, role).await;
        if members == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{role} batches hold {members:?}, not {expected:?}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn first_rollouts_that_coincide_are_written_in_batches_and_each_route_leaves_its_own() {
    const ROUTES: usize = 8;
    let mut rig = Rig::start(2).await;
    rig.add_backend("blue").await;
    rig.add_backend("green").await;
    // The routes are there before the operator starts: their first rollouts coincide
    // (a window long enough for a slow machine to bring every one in).
    let hosts: Vec<String> = (0..ROUTES).map(|i| format!("r{i}.test")).collect();
    for (i, host) in hosts.iter().enumerate() {
        rig.apply_route(&format!("r{i}"), &Rig::route_yaml(host, &[("blue", 1)]))
            .await;
    }
    rig.start_operator("switchyard-1", &["--batch-window", "1s"]);
    for i in 0..ROUTES {
        rig.wait_ready(&format!("r{i}"), Duration::from_secs(60))
            .await;
    }
    // Every step of each route happened (Ready: its live version served by every Envoy),
    // and every route answers from its backend.
    for host in &hosts {
        assert_eq!(rig.answers_for(host).await, ["blue", "blue"], "{host}");
    }
    // Written as batches: no route has a ProxyConfig of its own; the probe batches are
    // collected once their routes are served.
    let live: Vec<String> = (0..ROUTES).map(|i| format!("r{i}-live")).collect();
    assert_eq!(batch_members(&rig, "live").await, live);
    assert!(rig.proxy_config("r0", "live").await.is_none());
    wait_batch_members(&rig, "probe", &[], Duration::from_secs(10)).await;

    // A later generation is the route's own ProxyConfig, and moves without a failed
    // request; the member it took over has left its batch by the time it is Ready.
    let load = Load::start(rig.targets(), &hosts[0], 200, Duration::from_secs(60));
    rig.apply_route("r0", &Rig::route_yaml(&hosts[0], &[("green", 1)]))
        .await;
    rig.wait_ready("r0", Duration::from_secs(30)).await;
    assert_eq!(rig.answers_for(&hosts[0]).await, ["green", "green"]);
    let report = load.finish().await;
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
    let own = rig.proxy_config("r0", "live").await;
    assert_eq!(own.map(|pc| pc.spec.generation), Some(2));
    assert_eq!(batch_members(&rig, "live").await, live[1..]);

    // A route deleted leaves its batch too; the others keep answering.
    rig.delete_route("r1").await;
    wait_batch_members(&rig, "live", &live[2..], Duration::from_secs(10)).await;
    for host in &hosts[2..] {
        assert_eq!(rig.answers_for(host).await, ["blue", "blue"], "{host}");
    }
}
