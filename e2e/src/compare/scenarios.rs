//! The scenarios every system goes through, through the same Gateway API objects (its own
//! GatewayClass, Gateway `edge`, HTTPRoute `web`), the same backends (Deployments of the
//! `backend` image) and the same load, from inside the node's namespace to the Gateway's
//! address. Each change is timed three ways: to the first answer that shows it, to the
//! first after which every answer shows it, and to the system's own "done" on the route
//! ([`System::done_condition`]).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::Value;
use switchyard::gateway::api::httproutes::HttpRoute;

use super::observe::{Observer, Seen, failures, moments};
use super::systems::System;
use crate::node::Node;
use crate::node::workloads::backend_yaml;

pub const HOST: &str = "web.example.com";
/// Requests per second of every scenario's load.
pub const RATE: u32 = 100;

/// What an answer shows once a change is served.
#[derive(Clone, Debug)]
pub enum Expect {
    /// The route's response header `x-sentinel` has this value.
    Sentinel(String),
    /// A Pod of this Service answered.
    Backend(String),
    /// Nothing a client sees changes: the sentinel stays this value and a Pod of this
    /// Service answers (a change is timed only to the system's done).
    Unchanged { sentinel: String, service: String },
}

impl Expect {
    fn shown_by(&self, seen: &Seen) -> bool {
        seen.ok()
            && match self {
                Expect::Sentinel(value) => &seen.sentinel == value,
                Expect::Backend(service) => seen.backend.starts_with(&format!("{service}-")),
                Expect::Unchanged { sentinel, service } => {
                    &seen.sentinel == sentinel && seen.backend.starts_with(&format!("{service}-"))
                }
            }
    }
}

/// One change: when it was applied (from the load's start), what it should show, and how
/// long the system took to say it was done.
struct Change {
    at: Duration,
    expect: Expect,
    done: Option<Duration>,
}

/// What one scenario measured on one system.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub scenario: &'static str,
    pub system: System,
    pub requests: usize,
    pub non_2xx: usize,
    /// Non-2xx answers by kind (status and Envoy response flag, see
    /// [`super::observe::failure_kind`]).
    pub failures: std::collections::BTreeMap<String, usize>,
    /// 2xx answers from what a change should not have touched (another rule's backend,
    /// say), where nothing a client sees should change.
    pub misrouted: usize,
    /// Per change: to the first new answer, to all answers new (none where a change shows
    /// nothing new), to the system's done.
    pub first_new: Vec<Option<Duration>>,
    pub all_new: Vec<Option<Duration>>,
    /// Per change, the last answer that did not show it.
    pub last_old: Vec<Option<Duration>>,
    /// 2xx answers that did not show a change although the request was sent after the
    /// system said it was done: what a user who waits for that status still gets.
    pub old_after_done: usize,
    /// Requests sent after the system said a change was done that failed.
    pub failed_after_done: usize,
    /// Changes after which the answers did not all show the change within 15 s.
    pub unsettled: usize,
    pub done: Vec<Option<Duration>>,
}

/// The scenarios, in the order they run.
pub const SCENARIOS: [&str; 5] = [
    "header-only changes",
    "moves, endpoints on time",
    "moves, endpoints 100 ms late",
    "rules reordered",
    "rename in one sync",
];

/// One system's Gateway, route and first backend, served; returns the Gateway's URL.
pub async fn prepare(node: &Node, system: System) -> String {
    let namespace = system.namespace();
    node.api()
        .kubectl_ok(["create", "namespace", &namespace])
        .await;
    node.apply(&system.gateway_yaml()).await;
    for backend in ["svc-0", "canary"] {
        node.apply(&backend_yaml(&namespace, backend, 1, "v1", 0))
            .await;
        let deployment = format!("deployment/{backend}");
        node.wait_rollout(&namespace, &deployment, Duration::from_secs(120))
            .await;
    }
    node.apply(&route_yaml(&namespace, "web", &rule("svc-0", "0")))
        .await;
    let url = system.gateway_url(node, Duration::from_secs(180)).await;
    // Served through it: the first 200 with the route's sentinel.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a client");
    let started = Instant::now();
    loop {
        let answer = client
            .get(format!("{url}/"))
            .header("host", HOST)
            .send()
            .await;
        if answer.is_ok_and(|r| r.status().is_success()) {
            return url;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "{}: {url} never answered for {HOST}\n{}",
            system.name(),
            node.diagnostics().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs every scenario on `system` (prepared), in order.
pub async fn run_all(node: &Node, system: System, url: &str) -> Vec<Outcome> {
    let client = node.api().client().await;
    let mut run = Run {
        node,
        system,
        url,
        routes: Api::namespaced(client.clone(), &system.namespace()),
        services: Api::namespaced(client, &system.namespace()),
        service: 0,
    };
    vec![
        run.header_only().await,
        run.moves(false).await,
        run.moves(true).await,
        run.reordered().await,
        run.renamed().await,
    ]
}

struct Run<'a> {
    node: &'a Node,
    system: System,
    url: &'a str,
    routes: Api<HttpRoute>,
    services: Api<Service>,
    /// The Service the route sends to now: `svc-<n>`.
    service: usize,
}

impl Run<'_> {
    fn namespace(&self) -> String {
        self.system.namespace()
    }

    /// Applies `yaml` (a change of route `name`) and waits for the system's done on it.
    async fn change(&self, observer: &Observer, name: &str, yaml: &str, expect: Expect) -> Change {
        let route = parse_route(yaml);
        let at = observer.started().elapsed();
        self.apply_route(&route).await;
        let done = self.wait_done(name, Duration::from_secs(60)).await;
        let done = done.map(|_| observer.started().elapsed() - at);
        Change { at, expect, done }
    }

    /// Applies an HTTPRoute as `kubectl apply --server-side` would, through the API
    /// directly: a change is timed from before this call, and a kubectl process would add
    /// its own start to every figure.
    async fn apply_route(&self, route: &HttpRoute) {
        let name = route.metadata.name.clone().unwrap_or_default();
        let params = PatchParams::apply("compare").force();
        if let Err(error) = self
            .routes
            .patch(&name, &params, &Patch::Apply(route))
            .await
        {
            panic!("{}: apply httproute/{name}: {error}", self.system.name());
        }
    }

    /// How long from now until the route's done condition is True for its generation;
    /// None if not within `within`.
    async fn wait_done(&self, name: &str, within: Duration) -> Option<Duration> {
        let started = Instant::now();
        let condition = self.system.done_condition();
        while started.elapsed() < within {
            if let Ok(route) = self.routes.get(name).await
                && is_done(&route, condition)
            {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Lets the load run until every answer since `change` was applied shows what it
    /// should for a second (at most 15 s), so that the next change starts from a settled
    /// route and every change has a second of answers of its own.
    async fn settle(observer: &Observer, change: &Change) -> bool {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(15) {
            let seen = observer.seen();
            let now = observer.started().elapsed();
            let recent: Vec<&Seen> = (seen.iter())
                .filter(|s| s.at >= change.at && s.at + Duration::from_secs(1) >= now)
                .collect();
            let long_enough = now >= change.at + Duration::from_secs(1);
            if long_enough && !recent.is_empty() && recent.iter().all(|s| change.expect.shown_by(s))
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    async fn header_only(&mut self) -> Outcome {
        let observer = self.observe().await;
        let mut unsettled = 0;
        let mut changes = Vec::new();
        for i in 1..=10 {
            let sentinel = format!("h{i}");
            let service = format!("svc-{}", self.service);
            let yaml = route_yaml(&self.namespace(), "web", &rule(&service, &sentinel));
            let expect = Expect::Sentinel(sentinel);
            let change = self.change(&observer, "web", &yaml, expect).await;
            if !Self::settle(&observer, &change).await {
                unsettled += 1;
            }
            changes.push(change);
        }
        self.outcome(SCENARIOS[0], observer, changes, unsettled)
            .await
    }

    /// Ten moves, each to a fresh Service whose Pods are ready: `late`, its Service
    /// selects them only 100 ms after the route changed. The previous Service goes once
    /// every answer comes from the new one.
    async fn moves(&mut self, late: bool) -> Outcome {
        let namespace = self.namespace();
        let observer = self.observe().await;
        let mut unsettled = 0;
        let mut changes = Vec::new();
        for _ in 0..10 {
            let previous = format!("svc-{}", self.service);
            self.service += 1;
            let service = format!("svc-{}", self.service);
            let mut backend = backend_yaml(&namespace, &service, 1, "v1", 0);
            if late {
                let selector = format!("  selector: {{app: {service}}}\n  ports:");
                assert!(backend.contains(&selector), "{backend}");
                let held = format!("  selector: {{app: {service}-held}}\n  ports:");
                backend = backend.replace(&selector, &held);
            }
            self.node.apply(&backend).await;
            let deployment = format!("deployment/{service}");
            (self.node)
                .wait_rollout(&namespace, &deployment, Duration::from_secs(120))
                .await;
            let yaml = route_yaml(&namespace, "web", &rule(&service, "m"));
            let expect = Expect::Backend(service.clone());
            let change = if late {
                let route = parse_route(&yaml);
                let selector = serde_json::json!({ "spec": { "selector": { "app": service } } });
                let at = observer.started().elapsed();
                self.apply_route(&route).await;
                // The endpoints come 100 ms after the change was applied, whatever the
                // system says meanwhile: its done is watched from the start.
                let endpoints = async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let params = PatchParams::default();
                    let patched = (self.services)
                        .patch(&service, &params, &Patch::Merge(&selector))
                        .await;
                    if let Err(error) = patched {
                        panic!("{}: patch service/{service}: {error}", self.system.name());
                    }
                };
                let (done, ()) =
                    tokio::join!(self.wait_done("web", Duration::from_secs(60)), endpoints);
                let done = done.map(|_| observer.started().elapsed() - at);
                Change { at, expect, done }
            } else {
                self.change(&observer, "web", &yaml, expect).await
            };
            if !Self::settle(&observer, &change).await {
                unsettled += 1;
            }
            changes.push(change);
            (self.node.api())
                .kubectl_ok([
                    "delete",
                    "-n",
                    &namespace,
                    "deployment,service",
                    &previous,
                    "--wait=false",
                ])
                .await;
        }
        let name = if late { SCENARIOS[2] } else { SCENARIOS[1] };
        self.outcome(name, observer, changes, unsettled).await
    }

    /// Six reorders of two rules (one matches a header the load never sends): nothing a
    /// client sees should change (Envoy Gateway #9029).
    async fn reordered(&mut self) -> Outcome {
        let namespace = self.namespace();
        let service = format!("svc-{}", self.service);
        // The rules in their first order, with the sentinel the reorders keep, before the
        // load starts: only the reorders are measured.
        let first = format!("{}{}", rule(&service, "r"), canary_rule());
        self.apply_route(&parse_route(&route_yaml(&namespace, "web", &first)))
            .await;
        self.wait_done("web", Duration::from_secs(60)).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let observer = self.observe().await;
        let mut unsettled = 0;
        let mut changes = Vec::new();
        for i in 0..6 {
            let rules = if i % 2 == 0 {
                format!("{}{}", canary_rule(), rule(&service, "r"))
            } else {
                format!("{}{}", rule(&service, "r"), canary_rule())
            };
            let yaml = route_yaml(&namespace, "web", &rules);
            let expect = Expect::Unchanged {
                sentinel: "r".into(),
                service: service.clone(),
            };
            let change = self.change(&observer, "web", &yaml, expect).await;
            if !Self::settle(&observer, &change).await {
                unsettled += 1;
            }
            changes.push(change);
        }
        self.outcome(SCENARIOS[3], observer, changes, unsettled)
            .await
    }

    /// The route renamed in one sync: the same rules under a new name, the old route
    /// deleted at the same time. The load goes on past the old route's hold (10 s in
    /// Switchyard) so that a gap after it would show.
    async fn renamed(&mut self) -> Outcome {
        let namespace = self.namespace();
        let service = format!("svc-{}", self.service);
        let observer = self.observe().await;
        let yaml = route_yaml(&namespace, "web-renamed", &rule(&service, "renamed"));
        let route = parse_route(&yaml);
        let params = DeleteParams::default();
        let at = observer.started().elapsed();
        let delete = self.routes.delete("web", &params);
        let (_, deleted) = tokio::join!(self.apply_route(&route), delete);
        if let Err(error) = deleted {
            panic!("{}: delete httproute/web: {error}", self.system.name());
        }
        let done = self.wait_done("web-renamed", Duration::from_secs(60)).await;
        let done = done.map(|_| observer.started().elapsed() - at);
        tokio::time::sleep(Duration::from_secs(12)).await;
        let expect = Expect::Sentinel("renamed".into());
        let changes = vec![Change { at, expect, done }];
        self.outcome(SCENARIOS[4], observer, changes, 0).await
    }

    /// Starts the load, and lets it run for a second before the first change (the
    /// connections open, the API client's too).
    async fn observe(&self) -> Observer {
        let observer = Observer::start(self.url, HOST, RATE, Duration::from_secs(600));
        let _ = self.routes.get_opt("web").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        observer
    }

    async fn outcome(
        &self,
        scenario: &'static str,
        observer: Observer,
        changes: Vec<Change>,
        unsettled: usize,
    ) -> Outcome {
        if unsettled > 0 {
            eprintln!(
                "   {}, {scenario}: {unsettled} changes did not settle within 15 s",
                self.system.name()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let seen = observer.finish().await;
        let end = seen
            .last()
            .map(|s| s.at + Duration::from_millis(1))
            .unwrap_or_default();
        let mut outcome = Outcome {
            scenario,
            system: self.system,
            requests: seen.len(),
            non_2xx: seen.iter().filter(|s| !s.ok()).count(),
            failures: failures(&seen),
            misrouted: 0,
            first_new: Vec::new(),
            all_new: Vec::new(),
            last_old: Vec::new(),
            old_after_done: 0,
            failed_after_done: 0,
            unsettled,
            done: Vec::new(),
        };
        for (i, change) in changes.iter().enumerate() {
            outcome.done.push(change.done);
            let until = changes.get(i + 1).map(|c| c.at).unwrap_or(end);
            if let Expect::Unchanged { .. } = change.expect {
                outcome.misrouted += (seen.iter())
                    .filter(|s| s.at >= change.at && s.at < until)
                    .filter(|s| s.ok() && !change.expect.shown_by(s))
                    .count();
                continue;
            }
            let shown = moments(&seen, change.at, until, |s| change.expect.shown_by(s));
            if let Some(done) = change.done {
                // Sent after the system said it was done.
                let after: Vec<&Seen> = (seen.iter())
                    .filter(|s| s.sent >= change.at + done && s.at < until)
                    .collect();
                outcome.old_after_done += (after.iter())
                    .filter(|s| s.ok() && !change.expect.shown_by(s))
                    .count();
                outcome.failed_after_done += after.iter().filter(|s| !s.ok()).count();
            }
            outcome.first_new.push(shown.first_new);
            outcome.all_new.push(shown.all_new);
            outcome.last_old.push(shown.last_old);
        }
        outcome
    }
}

/// Whether a parent of the route has `condition` True for the route's generation.
pub fn is_done(route: &HttpRoute, condition: &str) -> bool {
    let generation = route.metadata.generation;
    let status = serde_json::to_value(&route.status).unwrap_or_default();
    let parents = status["parents"].as_array().cloned().unwrap_or_default();
    parents.iter().any(|parent| {
        (parent["conditions"].as_array().into_iter().flatten()).any(|c| {
            c["type"] == condition
                && c["status"] == "True"
                && c["observedGeneration"].as_i64() == generation
        })
    })
}

/// An HTTPRoute of [`route_yaml`], as the API takes it.
fn parse_route(yaml: &str) -> HttpRoute {
    serde_saphyr::from_str(yaml).expect("an HTTPRoute")
}

/// HTTPRoute `name` for [`HOST`] on Gateway `edge`: `rules` as YAML list items.
fn route_yaml(namespace: &str, name: &str, rules: &str) -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name}, namespace: {namespace} }}
spec:
  parentRefs: [ {{ name: edge }} ]
  hostnames: [ {HOST} ]
  rules:
{rules}"#
    )
}

/// A rule sending everything to `service`, with a response-header sentinel.
fn rule(service: &str, sentinel: &str) -> String {
    format!(
        r#"    - backendRefs: [ {{ name: {service}, port: 80 }} ]
      filters:
        - type: ResponseHeaderModifier
          responseHeaderModifier: {{ set: [ {{ name: x-sentinel, value: "{sentinel}" }} ] }}
"#
    )
}

/// A rule for requests with `x-canary: 1` only (the load never sends it).
fn canary_rule() -> String {
    r#"    - matches: [ { headers: [ { name: x-canary, value: "1" } ] } ]
      backendRefs: [ { name: canary, port: 80 } ]
"#
    .to_owned()
}

/// The value at quantile `q` of the durations that came (in ms), and how many did not.
pub fn quantile(values: &[Option<Duration>], q: f64) -> (Option<f64>, usize) {
    let mut ms: Vec<f64> = values
        .iter()
        .flatten()
        .map(|d| d.as_secs_f64() * 1000.0)
        .collect();
    ms.sort_by(f64::total_cmp);
    let missing = values.len() - ms.len();
    if ms.is_empty() {
        return (None, missing);
    }
    let i = ((ms.len() - 1) as f64 * q).round() as usize;
    (ms.get(i).copied(), missing)
}

/// The outcome as JSON, durations in ms.
pub fn to_json(outcome: &Outcome) -> Value {
    let ms = |v: &[Option<Duration>]| -> Vec<Value> {
        v.iter()
            .map(|d| {
                d.map(|d| Value::from(d.as_secs_f64() * 1000.0))
                    .unwrap_or(Value::Null)
            })
            .collect()
    };
    serde_json::json!({
        "scenario": outcome.scenario,
        "system": outcome.system.key(),
        "requests": outcome.requests,
        "non_2xx": outcome.non_2xx,
        "failures": outcome.failures,
        "misrouted": outcome.misrouted,
        "first_new_ms": ms(&outcome.first_new),
        "all_new_ms": ms(&outcome.all_new),
        "last_old_ms": ms(&outcome.last_old),
        "old_after_done": outcome.old_after_done,
        "failed_after_done": outcome.failed_after_done,
        "unsettled": outcome.unsettled,
        "done_ms": ms(&outcome.done),
        "done_condition": outcome.system.done_condition(),
    })
}
