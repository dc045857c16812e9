//! Full translation time and peak memory, in a child process per size.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use switchyard::translate::translate;
use switchyard_e2e::synthetic;

#[derive(Serialize, Deserialize)]
pub struct TranslationResult {
    pub routes: usize,
    pub clusters: usize,
    pub endpoints: usize,
    pub resources: usize,
    pub best_ms: f64,
    pub median_ms: f64,
    pub peak_rss_mib: f64,
}

pub fn measure_translation(routes: usize) -> TranslationResult {
    let config = synthetic::config(routes, 42);
    let mut times = Vec::new();
    let mut resources = 0;
    for _ in 0..5 {
        let started = Instant::now();
        let translation = translate(&config);
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        resources = translation.snapshot.len();
    }
    times.sort_by(f64::total_cmp);
    TranslationResult {
        routes,
        clusters: config.clusters.len(),
        endpoints: config.clusters.iter().map(|c| c.endpoints.len()).sum(),
        resources,
        best_ms: times[0],
        median_ms: times[times.len() / 2],
        peak_rss_mib: peak_rss_mib(),
    }
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
