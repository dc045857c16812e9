//! Switchyard side by side with Envoy Gateway and Contour on one real node: run by
//! `e2e/compare.sh`, which provisions the node's parts, builds the peers from their Go
//! modules and makes every image first. Prints one table per scenario and, with `--json`,
//! writes every figure.

use std::path::PathBuf;

use clap::Parser;
use switchyard_e2e::compare::systems::{self, System};
use switchyard_e2e::compare::{chosen, scenarios, tables};
use switchyard_e2e::node::Node;

#[derive(Parser)]
#[command(about = "Switchyard, Envoy Gateway and Contour side by side on one real node")]
struct Args {
    /// Only these systems (switchyard, envoy-gateway, contour); all by default, in that
    /// order.
    #[arg(long = "system")]
    systems: Vec<String>,
    /// Write every figure here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let systems = chosen(&args.systems).map_err(anyhow::Error::msg)?;
    // One thread: Node::start moves it into the node's network namespace, and every
    // request and process of the run starts from there.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(systems, args.json))
}

/// Each system on a node of its own, started afresh: nothing of the one before runs
/// beside it.
async fn run(systems: Vec<System>, json: Option<PathBuf>) -> anyhow::Result<()> {
    let mut outcomes = Vec::new();
    let mut fleets = Vec::new();
    for &system in &systems {
        eprintln!("== {} {}", system.name(), system.version());
        let node = Node::start().await;
        systems::install_gateway_api(&node).await;
        system.install(&node).await;
        let url = scenarios::prepare(&node, system).await;
        let envoys = system.envoy_pods(&node).await;
        eprintln!("   serving at {url} through {envoys} Envoy Pods");
        fleets.push((system, envoys));
        let measured = scenarios::run_all(&node, system, &url).await;
        for outcome in &measured {
            eprintln!(
                "   {}: {} requests, {} non-2xx {:?}",
                outcome.scenario, outcome.requests, outcome.non_2xx, outcome.failures
            );
        }
        outcomes.extend(measured);
        drop(node);
    }
    let date = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let versions: Vec<String> = systems
        .iter()
        .map(|s| format!("{} {}", s.name(), s.version()))
        .collect();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let envoy = std::process::Command::new(switchyard_e2e::kube::tool("envoy"))
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    // "<path>  version: <commit>/<version>/Clean/RELEASE/BoringSSL"
    let envoy = (envoy.split_whitespace().nth(2))
        .and_then(|v| v.split('/').nth(1))
        .map_or_else(|| "Envoy".to_owned(), |v| format!("Envoy {v}"));
    println!(
        "# Side by side, {date}: {}; the same Envoy for all ({envoy}); each on a node of its own; {cpus} cores; {} requests/s per scenario",
        versions.join(", "),
        scenarios::RATE
    );
    let shown: Vec<String> = (fleets.iter())
        .map(|(system, envoys)| format!("{}: {envoys}", system.name()))
        .collect();
    println!(
        "Envoy Pods per Gateway (each system's default): {}",
        shown.join(", ")
    );
    println!("{}", tables(&outcomes));
    if let Some(path) = json {
        let all: Vec<serde_json::Value> = outcomes.iter().map(scenarios::to_json).collect();
        let document = serde_json::json!({
            "date": date,
            "versions": versions,
            "envoy": envoy,
            "cores": cpus,
            "rate": scenarios::RATE,
            "outcomes": all,
            "envoy_pods": fleets.iter().map(|(s, n)| (s.key(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
        });
        std::fs::write(&path, serde_json::to_string_pretty(&document)?)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
