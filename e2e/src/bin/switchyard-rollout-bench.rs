//! Time from a TrafficRoute change to Ready on every Envoy, on a real kube-apiserver with
//! three real Envoys: each rollout switches to a freshly created Service. Two-phase (the
//! default) and the direct one-phase path, side by side.
//!
//! Run by `e2e/bench.sh`, which provisions the binaries and builds the release
//! `switchyard` it starts.

use std::time::Duration;

use switchyard_e2e::rig::{HOST, Rig};

async fn measure(extra: &[&str], rollouts: usize) -> Vec<f64> {
    let mut rig = Rig::start(3).await;
    rig.add_backend("svc-0").await;
    rig.start_operator("switchyard-bench", extra);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("svc-0", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
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
    times.sort_by(f64::total_cmp);
    times
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
    for (name, extra) in [
        ("two-phase (default)", &[][..]),
        ("direct, one phase (diagnostic)", &["--one-phase"][..]),
    ] {
        let times = measure(extra, rollouts).await;
        println!(
            "| {name} | {rollouts} | {:.0} | {:.0} | {:.0} | {:.0} |",
            pick(&times, 0.5),
            pick(&times, 0.95),
            pick(&times, 0.99),
            pick(&times, 1.0)
        );
    }
}
