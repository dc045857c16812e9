//! Time from a TrafficRoute change to Ready on every Envoy, on a real kube-apiserver with
//! three real Envoys: rollouts to a freshly created Service (until Ready, and until every
//! Envoy answers from the new Service), and header-only changes. Two-phase (the default)
//! and the direct one-phase path, side by side, each row with its target; the same two
//! changes of an HTTPRoute through a Gateway, until `switchyard.dev/Served`; then where the
//! time goes, step by step, from the operator's `switchyard_rollout_step_seconds`.
//!
//! Run by `e2e/bench.sh`, which provisions the binaries and builds the release
//! `switchyard` it starts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use switchyard::api::TrafficRoute;
use switchyard::gateway::api::httproutes::HttpRoute;
use switchyard_e2e::gateway;
use switchyard_e2e::rig::{HOST, Rig};

/// What one rollout path measured: times in ms, sorted.
struct Measured {
    /// apply → Ready, switching to a fresh Service.
    ready: Vec<f64>,
    /// apply → every Envoy answers from the fresh Service.
    traffic: Vec<f64>,
    /// apply → Ready, a response header changed.
    header_only: Vec<f64>,
    /// Mean ms of each rollout step (fresh Services only).
    steps: Vec<(String, f64)>,
}

/// `rollouts` switches to fresh Services timed to Ready, as many timed to traffic, then
/// `rollouts` header-only changes.
async fn measure(extra: &[&str], rollouts: usize) -> Measured {
    let mut rig = Rig::start(3).await;
    rig.add_backend("svc-0").await;
    rig.start_operator("switchyard-bench", extra);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("svc-0", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    let before = step_totals(&rig.operator_metrics("switchyard-bench").await);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .expect("an HTTP client");
    let targets = rig.targets();
    let mut ready = Vec::new();
    let mut traffic = Vec::new();
    // Ready and traffic timed on alternate switches: asking the Envoys for traffic loads
    // the cores the rollout runs on.
    for i in 1..=2 * rollouts {
        let service = format!("svc-{i}");
        rig.add_backend(&service).await;
        let started = Instant::now();
        apply(&rig, &service, None).await;
        if i % 2 == 1 {
            let applied = started.elapsed();
            let took = rig.wait_ready("web", Duration::from_secs(30)).await;
            ready.push(ms(applied + took));
        } else {
            let answered = all_answer_from(&client, &targets, &service, started).await;
            traffic.push(ms(answered));
            rig.wait_ready("web", Duration::from_secs(30)).await;
        }
    }
    let after = step_totals(&rig.operator_metrics("switchyard-bench").await);
    let steps = after
        .iter()
        .filter_map(|(step, (sum, count))| {
            let (sum0, count0) = before.get(step).copied().unwrap_or_default();
            let n = count - count0;
            (n > 0.0).then(|| (step.clone(), (sum - sum0) / n * 1000.0))
        })
        .collect();
    let last = format!("svc-{}", 2 * rollouts);
    let mut header_only = Vec::new();
    for i in 1..=rollouts {
        let started = Instant::now();
        apply(&rig, &last, Some(i)).await;
        let applied = started.elapsed();
        let took = rig.wait_ready("web", Duration::from_secs(30)).await;
        header_only.push(ms(applied + took));
    }
    for times in [&mut ready, &mut traffic, &mut header_only] {
        times.sort_by(f64::total_cmp);
    }
    Measured {
        ready,
        traffic,
        header_only,
        steps,
    }
}

/// Route `web` for [`HOST`] to `service`, answers carrying `x-round: <round>` when given:
/// one server-side apply through the API (kubectl's own start-up would count otherwise).
async fn apply(rig: &Rig, service: &str, round: Option<usize>) {
    let mut rule = json!({ "backends": [ { "service": service, "port": 80, "weight": 1 } ] });
    if let Some(round) = round {
        rule["responseHeaders"] = json!({ "set": { "x-round": round.to_string() } });
    }
    let route = json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "TrafficRoute",
        "metadata": { "name": "web", "namespace": rig.namespace },
        "spec": { "hosts": [HOST], "rules": [rule] },
    });
    Api::<TrafficRoute>::namespaced(rig.client.clone(), &rig.namespace)
        .patch(
            "web",
            &PatchParams::apply("rig-user").force(),
            &Patch::Apply(&route),
        )
        .await
        .expect("apply route web");
}

/// An HTTPRoute's two changes, each timed from the start of its apply to Served on its
/// Gateway: a move to a fresh Service, and a header-only change.
struct MeasuredRoute {
    ready: Vec<f64>,
    header_only: Vec<f64>,
}

/// `rollouts` moves of HTTPRoute `web` to fresh Services, then `rollouts` header-only
/// changes, each timed to `switchyard.dev/Served` at the new generation.
async fn measure_httproute(rollouts: usize) -> MeasuredRoute {
    let mut rig = Rig::start(3).await;
    gateway::install_crds(&rig).await;
    gateway::select_fleet(&rig).await;
    rig.add_backend("svc-0").await;
    let controller = format!("switchyard.dev/bench-{}", std::process::id());
    let class = format!("bench-{}", std::process::id());
    let args = ["--gateway-api", "--gateway-controller-name", &controller];
    rig.start_operator("switchyard-bench", &args);
    let gateway = gateway::edge_gateway(&class, &controller, &rig.namespace);
    let applied = rig
        .api
        .kubectl_input(["apply", "--server-side", "-f", "-"], &gateway)
        .await;
    assert!(applied.status.success(), "apply the Gateway");
    let mut generation = apply_httproute(&rig, "svc-0", None).await;
    wait_served(&rig, generation).await;
    let mut ready = Vec::new();
    for i in 1..=rollouts {
        let service = format!("svc-{i}");
        rig.add_backend(&service).await;
        let started = Instant::now();
        generation = apply_httproute(&rig, &service, None).await;
        wait_served(&rig, generation).await;
        ready.push(ms(started.elapsed()));
    }
    let last = format!("svc-{rollouts}");
    let mut header_only = Vec::new();
    for i in 1..=rollouts {
        let started = Instant::now();
        generation = apply_httproute(&rig, &last, Some(i)).await;
        wait_served(&rig, generation).await;
        header_only.push(ms(started.elapsed()));
    }
    for times in [&mut ready, &mut header_only] {
        times.sort_by(f64::total_cmp);
    }
    MeasuredRoute { ready, header_only }
}

/// HTTPRoute `web` for [`HOST`] on Gateway `edge` to `service`, answers carrying
/// `x-round: <round>` when given: one server-side apply. Returns its generation.
async fn apply_httproute(rig: &Rig, service: &str, round: Option<usize>) -> i64 {
    let mut rule = json!({ "backendRefs": [ { "name": service, "port": 80 } ] });
    if let Some(round) = round {
        rule["filters"] = json!([{
            "type": "ResponseHeaderModifier",
            "responseHeaderModifier": { "set": [ { "name": "x-round", "value": round.to_string() } ] },
        }]);
    }
    let route = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": { "name": "web", "namespace": rig.namespace },
        "spec": { "parentRefs": [ { "name": "edge" } ], "hostnames": [HOST], "rules": [rule] },
    });
    let written = Api::<HttpRoute>::namespaced(rig.client.clone(), &rig.namespace)
        .patch(
            "web",
            &PatchParams::apply("rig-user").force(),
            &Patch::Apply(&route),
        )
        .await
        .expect("apply HTTPRoute web");
    written.metadata.generation.unwrap_or_default()
}

/// Until HTTPRoute `web`'s first parent says Served at `generation` (asked every 5 ms, as
/// [`Rig::wait_ready`] asks for a TrafficRoute's Ready; at most 30 s).
async fn wait_served(rig: &Rig, generation: i64) {
    let routes = Api::<HttpRoute>::namespaced(rig.client.clone(), &rig.namespace);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let route = routes.get("web").await.expect("read HTTPRoute web");
        let status = serde_json::to_value(&route.status).unwrap_or_default();
        let served = status["parents"][0]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "switchyard.dev/Served"
                    && c["status"] == "True"
                    && c["observedGeneration"] == generation
            });
        if served {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "HTTPRoute web not Served at generation {generation} within 30 s: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// How long after `started` every target answered for [`HOST`] from `service`, asking
/// each every 2 ms (at most 30 s): more often, the asking would load the two cores the
/// rig shares with the operator, the API server and the Envoys.
async fn all_answer_from(
    client: &reqwest::Client,
    targets: &[String],
    service: &str,
    started: Instant,
) -> Duration {
    let one = |target: String| async move {
        let deadline = started + Duration::from_secs(30);
        while Instant::now() < deadline {
            let answer = client
                .get(format!("{target}/"))
                .header("host", HOST)
                .send()
                .await;
            if let Ok(answer) = answer
                && answer.status().is_success()
                && answer.text().await.is_ok_and(|body| body == service)
            {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("{target} never answered from {service}");
    };
    let all = futures::future::join_all(targets.iter().cloned().map(one)).await;
    all.into_iter().max().unwrap_or_default()
}

/// The steps in the order a rollout takes them.
const STEPS: [&str; 4] = ["staged", "endpoints_verified", "promoted", "live_verified"];

/// Per step of `switchyard_rollout_step_seconds`: (sum in seconds, count).
fn step_totals(metrics: &str) -> BTreeMap<String, (f64, f64)> {
    let mut totals: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("switchyard_rollout_step_seconds_") else {
            continue;
        };
        let (kind, rest) = rest.split_once("{step=\"").unwrap_or_default();
        let (step, value) = rest.split_once("\"} ").unwrap_or_default();
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        match kind {
            "sum" => totals.entry(step.to_owned()).or_default().0 = value,
            "count" => totals.entry(step.to_owned()).or_default().1 = value,
            _ => {}
        }
    }
    totals
}

fn pick(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[tokio::main]
async fn main() {
    let rollouts: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(20)
        .max(1);
    let two_phase = measure(&[], rollouts).await;
    let one_phase = measure(&["--one-phase"], rollouts).await;
    let httproute = measure_httproute(rollouts).await;
    println!(
        "| 3 Envoys, times from the start of the apply | path | n | p50 ms | p95 ms | p99 ms | max ms | target |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let rows = [
        (
            "new Service → Ready",
            "two-phase (default)",
            &two_phase.ready,
            "p50 ≤ 25, p99 ≤ 100",
        ),
        (
            "new Service → every Envoy answers from it",
            "two-phase (default)",
            &two_phase.traffic,
            "p50 ≤ 35",
        ),
        (
            "header-only change → Ready",
            "two-phase (default)",
            &two_phase.header_only,
            "p50 ≤ 15",
        ),
        (
            "HTTPRoute: new Service → Served",
            "two-phase (default)",
            &httproute.ready,
            "≤ 1.2 × TrafficRoute's",
        ),
        (
            "HTTPRoute: header-only change → Served",
            "two-phase (default)",
            &httproute.header_only,
            "≤ 1.2 × TrafficRoute's",
        ),
        (
            "new Service → Ready",
            "direct, one phase (diagnostic)",
            &one_phase.ready,
            "—",
        ),
        (
            "new Service → every Envoy answers from it",
            "direct, one phase (diagnostic)",
            &one_phase.traffic,
            "—",
        ),
        (
            "header-only change → Ready",
            "direct, one phase (diagnostic)",
            &one_phase.header_only,
            "—",
        ),
    ];
    for (what, path, times, target) in rows {
        println!(
            "| {what} | {path} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {target} |",
            times.len(),
            pick(times, 0.5),
            pick(times, 0.95),
            pick(times, 0.99),
            pick(times, 1.0)
        );
    }
    println!();
    print_breakdown(&[
        (mean(&two_phase.ready), two_phase.steps),
        (mean(&one_phase.ready), one_phase.steps),
    ]);
}

fn mean(times: &[f64]) -> f64 {
    times.iter().sum::<f64>() / times.len() as f64
}

/// Mean ms per step of the switches to fresh Services, for each path: each step from the
/// one before (the first from the start of the pass), then what is left of apply → Ready
/// (the apply's round trip, the watch delivering the change, the status write, the
/// bench's poll).
fn print_breakdown(paths: &[(f64, Vec<(String, f64)>)]) {
    println!("| step (mean ms, from the step before) | two-phase | one phase |");
    println!("|---|---|---|");
    let of = |steps: &[(String, f64)], step: &str| {
        steps.iter().find(|(s, _)| s == step).map(|(_, ms)| *ms)
    };
    let cell = |ms: Option<f64>| ms.map_or("—".to_owned(), |ms| format!("{ms:.1}"));
    for step in STEPS {
        let cells: Vec<String> = paths.iter().map(|(_, s)| cell(of(s, step))).collect();
        println!("| {step} | {} |", cells.join(" | "));
    }
    let rest: Vec<String> = paths
        .iter()
        .map(|(mean, steps)| {
            let in_steps: f64 = steps.iter().map(|(_, ms)| ms).sum();
            format!("{:.1}", mean - in_steps)
        })
        .collect();
    println!(
        "| the rest: apply, watch → first pass, status write, poll | {} |",
        rest.join(" | ")
    );
    let totals: Vec<String> = paths.iter().map(|(mean, _)| format!("{mean:.1}")).collect();
    println!("| apply → Ready seen (mean) | {} |", totals.join(" | "));
}
