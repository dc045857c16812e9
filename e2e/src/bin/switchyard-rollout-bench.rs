//! Time from a TrafficRoute change to Ready on every Envoy, on a real kube-apiserver with
//! three real Envoys: each rollout switches to a freshly created Service. Two-phase (the
//! default) and the direct one-phase path, side by side; then where the time goes, step by
//! step, from the operator's `switchyard_rollout_step_seconds`.
//!
//! Run by `e2e/bench.sh`, which provisions the binaries and builds the release
//! `switchyard` it starts.

use std::collections::BTreeMap;
use std::time::Duration;

use switchyard_e2e::rig::{HOST, Rig};

/// The rollouts' times to Ready (ms, sorted) and the mean time of each rollout step (ms).
async fn measure(extra: &[&str], rollouts: usize) -> (Vec<f64>, Vec<(String, f64)>) {
    let mut rig = Rig::start(3).await;
    rig.add_backend("svc-0").await;
    rig.start_operator("switchyard-bench", extra);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("svc-0", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    let before = step_totals(&rig.operator_metrics("switchyard-bench").await);
    let mut times = Vec::new();
    for i in 1..=rollouts {
        let service = format!("svc-{i}");
        rig.add_backend(&service).await;
        rig.apply_route("web", &Rig::route_yaml(HOST, &[(&service, 1)]))
            .await;
        times.push(
            rig.wait_ready("web", Duration::from_secs(30))
                .await
                .as_secs_f64()
                * 1000.0,
        );
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
    times.sort_by(f64::total_cmp);
    (times, steps)
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
    println!(
        "| rollout path (3 Envoys, fresh Service each time) | rollouts | p50 ms | p95 ms | p99 ms | max ms |"
    );
    println!("|---|---|---|---|---|---|");
    let mut breakdowns = Vec::new();
    for (name, extra) in [
        ("two-phase (default)", &[][..]),
        ("direct, one phase (diagnostic)", &["--one-phase"][..]),
    ] {
        let (times, steps) = measure(extra, rollouts).await;
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        breakdowns.push((mean, steps));
        println!(
            "| {name} | {rollouts} | {:.0} | {:.0} | {:.0} | {:.0} |",
            pick(&times, 0.5),
            pick(&times, 0.95),
            pick(&times, 0.99),
            pick(&times, 1.0)
        );
    }
    println!();
    print_breakdown(&breakdowns);
}

/// Mean ms per step, for each path: each step from the one before, then what is left of
/// apply → Ready (the watch delivering the change, the status write, the bench's poll).
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
        "| the rest: watch → first pass, status write, poll | {} |",
        rest.join(" | ")
    );
    let totals: Vec<String> = paths.iter().map(|(mean, _)| format!("{mean:.1}")).collect();
    println!("| apply → Ready seen (mean) | {} |", totals.join(" | "));
}
