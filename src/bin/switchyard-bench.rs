//! Benchmarks that print a table: translation time and peak memory at 1k and 10k routes,
//! and push → ACK latency of one make-before-break switch on a real Envoy (SotW, delta).
//!
//! `cargo run --release --bin switchyard-bench` (add `-- --json FILE` to also write JSON).
//! Inputs are generated from a fixed seed. Peak memory is measured in a child process per
//! size, so one size's peak does not hide another's.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use prometheus_client::registry::Registry;
use serde::Serialize;

use switchyard::bootstrap::Bootstrap;
use switchyard::metrics::Metrics;
use switchyard::model::{
    Cluster, ClusterSettings, Config, Endpoint, EndpointCondition, Forward, HeaderEdits,
    ListenerSettings, PathMatch, Route, RouteAction, ServiceRef, VirtualHost, WeightedCluster,
    cluster_name,
};
use switchyard::translate::translate;
use switchyard::xds::{AdsServer, Desired, Nodes, Ordering, Protocol};

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

#[derive(Serialize, serde::Deserialize)]
struct TranslationResult {
    routes: usize,
    clusters: usize,
    endpoints: usize,
    resources: usize,
    best_ms: f64,
    median_ms: f64,
    peak_rss_mib: f64,
}

#[derive(Serialize)]
struct SwitchResult {
    protocol: String,
    switches: usize,
    p50_ms: f64,
    p90_ms: f64,
    max_ms: f64,
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
        let result = measure_translation(routes);
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
                .push(runtime.block_on(measure_switches(protocol, args.switches))?);
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

/// A seeded, synthetic configuration: `routes` virtual hosts, one service each (every
/// tenth route splits between two), ten endpoints per service.
fn synthetic(routes: usize, seed: u64) -> Config {
    let mut rng = seed;
    let mut next = move || {
        // xorshift: deterministic and good enough to vary paths and addresses.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let settings = ClusterSettings::default();
    let mut clusters = Vec::new();
    let mut virtual_hosts = Vec::new();
    for i in 0..routes {
        let service = ServiceRef {
            namespace: format!("ns-{}", i % 50),
            name: format!("svc-{i}"),
            port: 8080,
        };
        let name = cluster_name(&service, &settings);
        let endpoints = (0..10)
            .map(|e| Endpoint {
                address: format!("10.{}.{}.{}", (i >> 8) & 255, i & 255, e + 1),
                port: 8080,
                condition: EndpointCondition::READY,
                zone: Some(format!("zone-{}", next() % 3)),
            })
            .collect();
        clusters.push(Cluster {
            name: name.clone(),
            service,
            settings: settings.clone(),
            endpoints,
        });
        let mut backends = vec![WeightedCluster {
            cluster: name,
            weight: 90,
        }];
        if i % 10 == 9 {
            let other = clusters[i - 1].name.clone();
            backends.push(WeightedCluster {
                cluster: other,
                weight: 10,
            });
        }
        virtual_hosts.push(VirtualHost {
            name: format!("ns-{}/route-{i}", i % 50),
            hosts: vec![format!("r{i}.example.test")],
            tls: None,
            routes: vec![Route {
                name: "main".into(),
                path: PathMatch::Prefix(format!("/{}", next() % 1000)),
                headers: vec![],
                action: RouteAction::Forward(Forward {
                    backends,
                    timeout: Some(Duration::from_secs(5)),
                    idle_timeout: None,
                    retry: None,
                    prefix_rewrite: None,
                }),
                request_headers: HeaderEdits::default(),
                response_headers: HeaderEdits::default(),
            }],
        });
    }
    Config {
        listeners: ListenerSettings {
            probe_token: "bench".into(),
            ..ListenerSettings::default()
        },
        virtual_hosts,
        clusters,
        ..Config::default()
    }
}

fn measure_translation(routes: usize) -> TranslationResult {
    let config = synthetic(routes, 42);
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

/// Two route targets alternate, each switch to a brand-new cluster; the time is from
/// publishing the snapshot to the node holding it (all steps ACKed).
async fn measure_switches(protocol: Protocol, switches: usize) -> anyhow::Result<SwitchResult> {
    let envoy = envoy_binary()?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let desired = Arc::new(Desired::new());
    let nodes = Nodes::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let xds_port = listener.local_addr()?.port();
    let server = AdsServer::new(
        desired.clone(),
        nodes.clone(),
        metrics,
        Ordering::MakeBeforeBreak,
    );
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server.into_service())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let work = std::env::temp_dir().join(format!("switchyard-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let bootstrap = Bootstrap {
        node_id: "bench".into(),
        node_cluster: "bench".into(),
        xds: vec![("127.0.0.1".into(), xds_port)],
        protocol,
        admin_address: "127.0.0.1".into(),
        admin_port: 0,
        listen_address: Some("127.0.0.31".into()),
        tls: None,
    };
    let bootstrap_path = work.join("envoy.yaml");
    std::fs::write(&bootstrap_path, bootstrap.to_yaml())?;
    let mut child = tokio::process::Command::new(envoy)
        .arg("-c")
        .arg(&bootstrap_path)
        .args(["--disable-hot-restart", "--concurrency", "1", "-l", "error"])
        .kill_on_drop(true)
        .spawn()
        .context("starting Envoy")?;

    let mut config = synthetic(1, 7);
    config.listeners.address = "127.0.0.31".into();
    config.listeners.http_port = 0;
    let mut times = Vec::new();
    for i in 0..=switches {
        let service = ServiceRef {
            namespace: "bench".into(),
            name: format!("fresh-{i}"),
            port: 8080,
        };
        let name = cluster_name(&service, &ClusterSettings::default());
        config.clusters[0].name = name.clone();
        config.clusters[0].service = service;
        if let RouteAction::Forward(forward) = &mut config.virtual_hosts[0].routes[0].action {
            forward.backends = vec![WeightedCluster {
                cluster: name,
                weight: 1,
            }];
        }
        let snapshot = Arc::new(translate(&config).snapshot);
        let version = snapshot.version().to_string();
        let mut changes = nodes.changes();
        let started = Instant::now();
        desired.publish(snapshot);
        if i == 0 {
            desired.open();
        }
        let deadline = Duration::from_secs(if i == 0 { 30 } else { 10 });
        loop {
            let synced = nodes.list().iter().any(|n| {
                n.status.synced && n.status.desired_version.as_deref() == Some(version.as_str())
            });
            if synced {
                break;
            }
            if started.elapsed() > deadline {
                bail!("Envoy did not ACK switch {i} within {deadline:?}");
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), changes.changed()).await;
        }
        if i > 0 {
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&work);
    times.sort_by(f64::total_cmp);
    let pick = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    Ok(SwitchResult {
        protocol: format!("{protocol:?}"),
        switches,
        p50_ms: pick(0.5),
        p90_ms: pick(0.9),
        max_ms: pick(1.0),
    })
}

fn envoy_binary() -> anyhow::Result<PathBuf> {
    if let Ok(path) = std::env::var("SWITCHYARD_ENVOY") {
        return Ok(PathBuf::from(path));
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let cache = std::env::var("SWITCHYARD_E2E_CACHE")
        .unwrap_or_else(|_| format!("{home}/.cache/switchyard-e2e"));
    let path = PathBuf::from(cache).join("bin/envoy");
    if !path.exists() {
        bail!(
            "no Envoy at {}: run `e2e/provision.sh --only envoy` or pass --no-envoy",
            path.display()
        );
    }
    Ok(path)
}

fn print_table(results: &Results) {
    println!("machine: {}", results.machine);
    println!();
    println!(
        "| translation | clusters | endpoints | resources | best ms | median ms | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for t in &results.translation {
        println!(
            "| {} routes | {} | {} | {} | {:.1} | {:.1} | {:.1} |",
            t.routes, t.clusters, t.endpoints, t.resources, t.best_ms, t.median_ms, t.peak_rss_mib
        );
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
