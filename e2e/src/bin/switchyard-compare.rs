//! Switchyard side by side with Envoy Gateway and Contour on one real node: run by
//! `e2e/compare.sh`, which provisions the node's parts, builds the peers from their Go
//! modules and makes every image first. Prints one table per scenario and one per scale
//! size and, with `--json`, writes every figure.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Parser;
use switchyard_e2e::compare::scale::{self, ScaleOutcome};
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
    /// Only these phases: the scenarios (changes under load, a node per system), the
    /// scale rows (N HTTPRoutes at once, a node per system and size). Both by default.
    #[arg(long, value_delimiter = ',', default_values = ["scenarios", "scale"])]
    only: Vec<Phase>,
    /// The sizes of the scale rows, in HTTPRoutes.
    #[arg(long, value_delimiter = ',', default_values_t = scale::DEFAULT_SIZES)]
    routes: Vec<usize>,
    /// Write every figure here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Phase {
    /// The changes under load, one table per scenario.
    Scenarios,
    /// N HTTPRoutes at once, one table per size.
    Scale,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let systems = chosen(&args.systems).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        args.routes.iter().all(|&n| n > 0),
        "--routes: every size must be at least 1"
    );
    // One thread: Node::start moves it into the node's network namespace, and every
    // request and process of the run starts from there.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(systems, args))
}

/// Where Switchyard's Envoys were connected (its replicas' latencies depend on it).
async fn tell_envoys_by_replica(node: &Node, system: System) {
    if system == System::Switchyard {
        let by_replica = systems::switchyard_envoys_by_replica(node).await;
        eprintln!("   Envoys connected, by replica: {by_replica}");
    }
}

/// Each system on a node of its own, started afresh (and again for each scale size):
/// nothing of the one before runs beside it, and a control plane's peak memory is its
/// own at that size.
async fn run(systems: Vec<System>, args: Args) -> anyhow::Result<()> {
    let mut outcomes = Vec::new();
    let mut scaled: Vec<ScaleOutcome> = Vec::new();
    let mut not_measured = Vec::new();
    let mut fleets: BTreeMap<&'static str, (System, usize)> = BTreeMap::new();
    for &system in &systems {
        eprintln!("== {} {}", system.name(), system.version());
        if args.only.contains(&Phase::Scenarios) {
            let (node, url) = installed(system).await;
            let envoys = system.envoy_pods(&node).await;
            eprintln!("   serving at {url} through {envoys} Envoy Pods");
            fleets.insert(system.key(), (system, envoys));
            let measured = scenarios::run_all(&node, system, &url).await;
            tell_envoys_by_replica(&node, system).await;
            for outcome in &measured {
                eprintln!(
                    "   {}: {} requests, {} non-2xx {:?}",
                    outcome.scenario, outcome.requests, outcome.non_2xx, outcome.failures
                );
            }
            outcomes.extend(measured);
            drop(node);
        }
        if !args.only.contains(&Phase::Scale) {
            continue;
        }
        for &routes in &args.routes {
            eprintln!("== {}: {routes} HTTPRoutes", system.name());
            let (node, url) = installed(system).await;
            let envoys = system.envoy_pods(&node).await;
            fleets.insert(system.key(), (system, envoys));
            let measured = scale::run(&node, system, &url, routes).await;
            tell_envoys_by_replica(&node, system).await;
            match measured {
                Ok(outcome) => {
                    eprintln!("   {}", scale::to_json(&outcome));
                    scaled.push(outcome);
                }
                Err(error) => {
                    let what = format!("{}, {routes} HTTPRoutes: {error:#}", system.name());
                    eprintln!("   not measured: {what}");
                    not_measured.push(what);
                }
            }
            drop(node);
        }
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
    let load = if outcomes.is_empty() {
        String::new()
    } else {
        format!("; {} requests/s per scenario", scenarios::RATE)
    };
    println!(
        "# Side by side, {date}: {}; the same Envoy for all ({envoy}); each on a node of its own; {cpus} cores{load}",
        versions.join(", "),
    );
    let shown: Vec<String> = (systems.iter())
        .filter_map(|system| fleets.get(system.key()))
        .map(|(system, envoys)| format!("{}: {envoys}", system.name()))
        .collect();
    println!(
        "Envoy Pods per Gateway (each system's default): {}",
        shown.join(", ")
    );
    if !outcomes.is_empty() {
        println!("{}", tables(&outcomes));
    }
    if !scaled.is_empty() {
        println!("{}", scale::tables(&scaled));
    }
    for what in &not_measured {
        println!("Not measured: {what}");
    }
    if let Some(path) = args.json {
        let all: Vec<serde_json::Value> = outcomes.iter().map(scenarios::to_json).collect();
        let scale: Vec<serde_json::Value> = scaled.iter().map(scale::to_json).collect();
        let document = serde_json::json!({
            "date": date,
            "versions": versions,
            "envoy": envoy,
            "cores": cpus,
            "rate": scenarios::RATE,
            "outcomes": all,
            "scale": scale,
            "not_measured": not_measured,
            "envoy_pods": fleets.iter().map(|(key, (_, n))| (*key, *n)).collect::<BTreeMap<_, _>>(),
        });
        std::fs::write(&path, serde_json::to_string_pretty(&document)?)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// A fresh node with `system` installed from its release and its Gateway `edge` serving
/// route `web`; the Gateway's URL.
async fn installed(system: System) -> (Node, String) {
    let node = Node::start().await;
    systems::install_gateway_api(&node).await;
    system.install(&node).await;
    let url = scenarios::prepare(&node, system).await;
    (node, url)
}
