//! Benchmarks that print a table: translation time and peak memory at 1k and 10k routes,
//! push → ACK latency of one make-before-break switch on a real Envoy (SotW, delta), and
//! the ADS server at fleet scale with simulated Envoys: one change fanned out to 1000
//! clients, bytes per Envoy per change, and the server's memory at 10k routes.
//!
//! `e2e/bench.sh`, or `cargo run --release -p switchyard-e2e --bin switchyard-bench` (add
//! `-- --json FILE` to also write JSON, `-- --only fanout,bytes` for some sections).
//! Inputs are generated from a fixed seed. Peak memory is measured in a child process per
//! size, so one size's peak does not hide another's.

mod fanout;
mod switch;
mod targets;
mod translation;

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use serde::Serialize;

use fanout::{FanoutResult, MemoryResult};
use switch::SwitchResult;
use switchyard::xds::Protocol;
use switchyard_e2e::change_bytes::{self, BytesResult};
use translation::TranslationResult;

#[derive(Parser)]
struct Args {
    /// Internal: translate one size and print its measurements as JSON.
    #[arg(long, hide = true)]
    translate_only: Option<usize>,
    /// Translate this many routes once, and nothing else: for a profiler, e.g.
    /// `valgrind --tool=callgrind --toggle-collect='*translate*'`.
    #[arg(long)]
    translate_once: Option<usize>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Switches per protocol for the push → ACK measurement.
    #[arg(long, default_value_t = 30)]
    switches: usize,
    /// Routes in the push → ACK measurement's configurations (comma-separated). Beyond
    /// one, each route has its live version probe and delta Envoys take virtual hosts one
    /// by one, as the operator serves them: the time Envoy takes to apply one change to a
    /// route table of that size.
    #[arg(long, value_delimiter = ',', default_values_t = [1])]
    switch_routes: Vec<usize>,
    /// Skip the real-Envoy measurements.
    #[arg(long)]
    no_envoy: bool,
    /// Run only these sections (comma-separated); all by default.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Section>,
    /// Internal: serve this many synthetic routes, print the port, then the memory.
    #[arg(long, hide = true)]
    serve_only: Option<usize>,
    /// Simulated clients for the fan-out measurement.
    #[arg(long, default_value_t = 1000)]
    fanout_clients: usize,
    /// Routes in the fan-out measurement's configurations (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [100, 1000])]
    fanout_routes: Vec<usize>,
    /// Simulated clients of each protocol for the memory measurement.
    #[arg(long, default_value_t = 10)]
    memory_clients: usize,
    /// Protocols of the fan-out measurement (comma-separated); all three by default.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [FanoutProtocol::Sotw, FanoutProtocol::Delta, FanoutProtocol::DeltaVhds])]
    fanout_protocols: Vec<FanoutProtocol>,
    /// Changes per protocol for the fan-out measurement.
    #[arg(long, default_value_t = 5)]
    fanout_changes: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Section {
    Translation,
    Switch,
    Fanout,
    Bytes,
    Memory,
}

/// How the simulated clients of the fan-out measurement take their configuration.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FanoutProtocol {
    Sotw,
    Delta,
    /// Delta, with route configurations in parts (VHDS).
    DeltaVhds,
}

impl FanoutProtocol {
    fn protocol_and_parts(self) -> (Protocol, bool) {
        match self {
            Self::Sotw => (Protocol::Sotw, false),
            Self::Delta => (Protocol::Delta, false),
            Self::DeltaVhds => (Protocol::Delta, true),
        }
    }
}

impl Args {
    fn runs(&self, section: Section) -> bool {
        self.only.is_empty() || self.only.contains(&section)
    }
}

#[derive(Serialize)]
struct Results {
    machine: String,
    translation: Vec<TranslationResult>,
    switch: Vec<SwitchResult>,
    fanout: Vec<FanoutResult>,
    bytes: Vec<BytesResult>,
    memory: Option<MemoryResult>,
}

/// The operator's allocator (src/main.rs): the xDS server measured here runs in this process.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(routes) = args.translate_once {
        println!("{}", translation::translate_once(routes));
        return Ok(());
    }
    if let Some(routes) = args.translate_only {
        let result = translation::measure_translation(routes);
        println!("{}", serde_json::to_string(&result)?);
        return Ok(());
    }
    if let Some(routes) = args.serve_only {
        return tokio::runtime::Runtime::new()?.block_on(fanout::serve_only(routes));
    }
    let mut results = Results {
        machine: machine(),
        translation: Vec::new(),
        switch: Vec::new(),
        fanout: Vec::new(),
        bytes: Vec::new(),
        memory: None,
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let translation_routes: &[usize] = if args.runs(Section::Translation) {
        &[1_000, 10_000]
    } else {
        &[]
    };
    for &routes in translation_routes {
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
    if !args.no_envoy && args.runs(Section::Switch) {
        for &routes in &args.switch_routes {
            for protocol in [Protocol::Sotw, Protocol::Delta] {
                let result = switch::measure_switches(protocol, args.switches, routes);
                results.switch.push(runtime.block_on(result)?);
            }
        }
    }
    if args.runs(Section::Fanout) {
        for &routes in &args.fanout_routes {
            // SotW Envoys always take route configurations whole; delta Envoys take them
            // in parts by default (VHDS), whole with `--virtual-host-discovery=false`.
            for (protocol, in_parts) in args.fanout_protocols.iter().map(|p| p.protocol_and_parts())
            {
                results.fanout.push(runtime.block_on(fanout::measure_fanout(
                    protocol,
                    in_parts,
                    args.fanout_clients,
                    routes,
                    args.fanout_changes,
                ))?);
            }
        }
    }
    if args.runs(Section::Bytes) {
        results.bytes = runtime.block_on(change_bytes::measure_bytes(10_000))?;
    }
    if args.runs(Section::Memory) {
        results.memory = Some(runtime.block_on(fanout::measure_memory(
            10_000,
            args.memory_clients,
            args.memory_clients,
        ))?);
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
    targets::print_table(results);
    if !results.translation.is_empty() {
        translation::print_table(&results.translation);
    }
    if !results.switch.is_empty() {
        println!();
        println!(
            "| one switch, push → all ACKs (real Envoy) | routes | switches | p50 ms | p90 ms | max ms |"
        );
        println!("|---|---|---|---|---|---|");
        for s in &results.switch {
            println!(
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} |",
                s.protocol, s.routes, s.switches, s.p50_ms, s.p90_ms, s.max_ms
            );
        }
    }
    if !results.fanout.is_empty() {
        println!();
        println!(
            "| one route change → N simulated clients, in-process | clients | routes | changes | first sync ms | all hold it p50 ms | max ms | server has all ACKs p50 ms | max ms | CPU ms/change: all | of it the server |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for f in &results.fanout {
            println!(
                "| {} | {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} |",
                f.protocol,
                f.clients,
                f.routes,
                f.changes,
                f.initial_sync_ms,
                f.p50_ms,
                f.max_ms,
                f.server_p50_ms,
                f.server_max_ms,
                f.cpu_ms_per_change,
                f.server_cpu_ms_per_change
            );
        }
    }
    if !results.bytes.is_empty() {
        println!();
        println!(
            "| bytes one Envoy receives, 10k routes | protocol | responses | Cluster | ClusterLoadAssignment | Listener | RouteConfiguration | VirtualHost | total |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for b in &results.bytes {
            let of = |t: &str| b.bytes.get(t).copied().unwrap_or(0);
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                b.change,
                b.protocol,
                b.responses,
                of("Cluster"),
                of("ClusterLoadAssignment"),
                of("Listener"),
                of("RouteConfiguration"),
                of("VirtualHost"),
                b.total_bytes
            );
        }
    }
    if let Some(m) = &results.memory {
        println!();
        println!(
            "| server memory, serving | resources | clients | peak RSS MiB | RSS when synced MiB |"
        );
        println!("|---|---|---|---|---|");
        println!(
            "| {} routes | {} | {} SotW + {} delta | {:.1} | {:.1} |",
            m.routes, m.resources, m.sotw_clients, m.delta_clients, m.peak_rss_mib, m.rss_mib
        );
    }
}
