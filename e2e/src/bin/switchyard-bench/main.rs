//! Benchmarks that print a table: translation time and peak memory at 1k and 10k routes,
//! and push → ACK latency of one make-before-break switch on a real Envoy (SotW, delta).
//!
//! `e2e/bench.sh`, or `cargo run --release -p switchyard-e2e --bin switchyard-bench` (add
//! `-- --json FILE` to also write JSON).
//! Inputs are generated from a fixed seed. Peak memory is measured in a child process per
//! size, so one size's peak does not hide another's.

mod switch;
mod translation;

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};
use clap::Parser;
use serde::Serialize;

use switch::SwitchResult;
use switchyard::xds::Protocol;
use translation::TranslationResult;

#[derive(Parser)]
struct Args {
    /// Internal: translate one size and print its measurements as JSON.
    #[arg(long, hide = true)]
    translate_only: Option<usize>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Switches per protocol for the push → ACK measurement.
    #[arg(long, default_value_t = 30)]
    switches: usize,
    /// Skip the real-Envoy measurements.
    #[arg(long)]
    no_envoy: bool,
}

#[derive(Serialize)]
struct Results {
    machine: String,
    translation: Vec<TranslationResult>,
    switch: Vec<SwitchResult>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(routes) = args.translate_only {
        let result = translation::measure_translation(routes);
        println!("{}", serde_json::to_string(&result)?);
        return Ok(());
    }
    let mut results = Results {
        machine: machine(),
        translation: Vec::new(),
        switch: Vec::new(),
    };
    for routes in [1_000, 10_000] {
        let output = Command::new(std::env::current_exe()?)
            .args(["--translate-only", &routes.to_string()])
            .output()
            .context("running the translation child")?;
        if !output.status.success() {
            bail!(
                "translation bench failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        results
            .translation
            .push(serde_json::from_slice(&output.stdout)?);
    }
    if !args.no_envoy {
        let runtime = tokio::runtime::Runtime::new()?;
        for protocol in [Protocol::Sotw, Protocol::Delta] {
            results
                .switch
                .push(runtime.block_on(switch::measure_switches(protocol, args.switches))?);
        }
    }
    print_table(&results);
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_string_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} cores, {model}")
}

fn print_table(results: &Results) {
    println!("machine: {}", results.machine);
    println!();
    if !results.translation.is_empty() {
        translation::print_table(&results.translation);
    }
    if !results.switch.is_empty() {
        println!();
        println!(
            "| one switch, push → all ACKs (real Envoy) | switches | p50 ms | p90 ms | max ms |"
        );
        println!("|---|---|---|---|---|");
        for s in &results.switch {
            println!(
                "| {} | {} | {:.2} | {:.2} | {:.2} |",
                s.protocol, s.switches, s.p50_ms, s.p90_ms, s.max_ms
            );
        }
    }
}
