//! The measures that have a target, each with its figure and whether it was met: the
//! first table a reader looks at. Rows whose section did not run are left out.

use crate::Results;

/// One route change at 10k routes, bytes per delta Envoy (#17).
const BYTES_PER_ROUTE_CHANGE: u64 = 10 * 1024;
/// Full translation at 10k routes, milliseconds.
const FULL_TRANSLATION_MS: f64 = 50.0;
/// Every incremental path at 10k routes, milliseconds (median).
const INCREMENTAL_MS: f64 = 1.0;
/// One change fanned out to 1000 delta clients at 1000 routes, all ACKed, milliseconds.
const FANOUT_MS: f64 = 1000.0;
/// Peak RSS of a process holding and serving 10k routes.
const SERVING_RSS_MIB: f64 = 150.0;
/// One switch on one real Envoy, push → all ACKs: twice the raw ACK chain.
const SWITCH_MS: f64 = 5.0;

struct Row {
    measure: String,
    figure: String,
    target: String,
    met: Option<bool>,
}

fn row(measure: impl Into<String>, figure: String, target: &str, met: Option<bool>) -> Row {
    Row {
        measure: measure.into(),
        figure,
        target: target.to_owned(),
        met,
    }
}

fn rows(results: &Results) -> Vec<Row> {
    let mut rows = Vec::new();
    for t in results.translation.iter().filter(|t| t.routes == 10_000) {
        rows.push(row(
            "full translation, 10k routes / 10k Services / 100k endpoints",
            format!("best {:.1} ms, median {:.1} ms", t.best_ms, t.median_ms),
            "≤ 50 ms",
            Some(t.median_ms <= FULL_TRANSLATION_MS),
        ));
        // The paths a change takes; the "update" and "before" rows are references.
        let incremental = t
            .incremental
            .iter()
            .filter(|i| i.change.contains("(apply)") || i.change.contains("(model cache"));
        if let Some(slowest) = incremental.max_by(|a, b| a.median_ms.total_cmp(&b.median_ms)) {
            rows.push(row(
                "slowest incremental path, 10k routes (median)",
                format!("{:.3} ms: {}", slowest.median_ms, slowest.change),
                "≤ 1 ms",
                Some(slowest.median_ms <= INCREMENTAL_MS),
            ));
        }
    }
    // The target is the ACK chain's: Envoy's own work on a large table is reported below.
    for s in results.switch.iter().filter(|s| s.routes == 1) {
        rows.push(row(
            format!(
                "one switch on one real Envoy, push → all ACKs, {}",
                s.protocol
            ),
            format!("p50 {:.2} ms", s.p50_ms),
            "≤ 2× raw ACK chain (≈ 5 ms)",
            Some(s.p50_ms <= SWITCH_MS),
        ));
    }
    for f in results.fanout.iter().filter(|f| f.routes == 1000) {
        // Both delta rows: in parts is the default, whole the opt-out.
        let delta = f.protocol.starts_with("Delta");
        rows.push(row(
            format!(
                "one change → {} {} clients at 1000 routes, all ACKed",
                f.clients, f.protocol
            ),
            format!(
                "p50 {:.0} ms (server CPU {:.0} ms)",
                f.server_p50_ms, f.server_cpu_ms_per_change
            ),
            if delta { "≤ 1 s" } else { "reported" },
            delta.then_some(f.server_p50_ms <= FANOUT_MS),
        ));
    }
    for b in results
        .bytes
        .iter()
        .filter(|b| b.change == "route → new cluster")
    {
        let in_parts = b.protocol.contains("VHDS");
        rows.push(row(
            format!(
                "one route change at 10k routes, bytes per Envoy, {}",
                b.protocol
            ),
            format!("{} B", b.total_bytes),
            if in_parts {
                "delta ≤ 10 KB"
            } else {
                "reported"
            },
            in_parts.then_some(b.total_bytes <= BYTES_PER_ROUTE_CHANGE),
        ));
    }
    if let Some(m) = &results.memory {
        rows.push(row(
            format!(
                "peak RSS holding and serving {} routes to {} clients",
                m.routes,
                m.sotw_clients + m.delta_clients
            ),
            format!("{:.0} MiB", m.peak_rss_mib),
            "≤ 150 MiB",
            Some(m.peak_rss_mib <= SERVING_RSS_MIB),
        ));
    }
    rows
}

pub fn print_table(results: &Results) {
    let rows = rows(results);
    if rows.is_empty() {
        return;
    }
    println!("| measure with a target | figure | target | |");
    println!("|---|---|---|---|");
    for r in rows {
        let verdict = match r.met {
            Some(true) => "met",
            Some(false) => "missed",
            None => "",
        };
        println!(
            "| {} | {} | {} | {verdict} |",
            r.measure, r.figure, r.target
        );
    }
    println!();
}
