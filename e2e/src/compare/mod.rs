//! Switchyard side by side with Envoy Gateway and Contour on the rig's real node
//! (`e2e/compare.sh`, a benchmark, not a test): each system installed from its own
//! release ([`systems`]), the same scenarios through the same Gateway API objects
//! ([`scenarios`]) under the same load ([`observe`]), one table per scenario with the
//! systems side by side; and the scale rows ([`scale`]): N HTTPRoutes at once, each
//! control plane's CPU and memory ([`usage`]) and the time to every route served.

pub mod observe;
pub mod scale;
pub mod scenarios;
pub mod systems;
pub mod usage;

use std::fmt::Write as _;

use scenarios::{Outcome, quantile};
use systems::System;

/// One table per scenario, the systems side by side, as Markdown.
pub fn tables(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    for scenario in scenarios::SCENARIOS {
        let rows: Vec<&Outcome> = outcomes.iter().filter(|o| o.scenario == scenario).collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n### {scenario}\n");
        let _ = writeln!(
            out,
            "| system | changes | requests | non-2xx | by kind | change → first new answer p50 / max ms | → every answer new p50 / max ms | → the system's done p50 / max ms (condition) | sent after done: 2xx not new / failed |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
        for o in rows {
            let mut kinds: Vec<String> = o
                .failures
                .iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect();
            if o.misrouted > 0 {
                kinds.push(format!("2xx from the wrong backend: {}", o.misrouted));
            }
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} |",
                o.system.name(),
                o.done.len(),
                o.requests,
                o.non_2xx,
                if kinds.is_empty() {
                    "—".into()
                } else {
                    kinds.join(", ")
                },
                p50_max(&o.first_new),
                p50_max(&o.all_new),
                p50_max(&o.done),
                o.system.done_condition(),
                if o.first_new.is_empty() {
                    "n/a".to_owned()
                } else {
                    format!("{} / {}", o.old_after_done, o.failed_after_done)
                },
            );
        }
    }
    out
}

/// "p50 / max" in ms, and how many never came.
fn p50_max(values: &[Option<std::time::Duration>]) -> String {
    if values.is_empty() {
        return "n/a".into();
    }
    let (p50, missing) = quantile(values, 0.5);
    let (max, _) = quantile(values, 1.0);
    let shown = match (p50, max) {
        (Some(p50), Some(max)) => format!("{p50:.0} / {max:.0}"),
        _ => "—".into(),
    };
    if missing > 0 {
        format!("{shown} ({missing} never)")
    } else {
        shown
    }
}

/// The systems named (by [`System::key`]), all when none is.
pub fn chosen(keys: &[String]) -> Result<Vec<System>, String> {
    if keys.is_empty() {
        return Ok(System::ALL.to_vec());
    }
    keys.iter()
        .map(|k| {
            System::ALL
                .into_iter()
                .find(|s| s.key() == k)
                .ok_or_else(|| {
                    format!("unknown system {k:?} (known: switchyard, envoy-gateway, contour)")
                })
        })
        .collect()
}
