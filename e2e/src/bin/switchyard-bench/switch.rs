//! One make-before-break switch on one real Envoy: push → all ACKs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use prometheus_client::registry::Registry;
use serde::Serialize;
use switchyard::bootstrap::Bootstrap;
use switchyard::metrics::Metrics;
use switchyard::model::{
    ClusterSettings, RouteAction, ServiceRef, VersionProbe, WeightedCluster, cluster_name,
};
use switchyard::translate::translate;
use switchyard::xds::{AdsServer, Desired, Nodes, Ordering, Protocol};
use switchyard_e2e::synthetic;

#[derive(Serialize)]
pub struct SwitchResult {
    pub protocol: String,
    pub routes: usize,
    pub switches: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub max_ms: f64,
}

/// Two route targets alternate, each switch to a brand-new cluster; the time is from
/// publishing the snapshot to the node holding it (all steps ACKed). With `routes` beyond
/// one, the first route switches among that many, each with its live version probe, and
/// a delta Envoy takes virtual hosts one by one: Envoy applies the change to a route
/// table of that size, as it does for the operator.
pub async fn measure_switches(
    protocol: Protocol,
    switches: usize,
    routes: usize,
) -> anyhow::Result<SwitchResult> {
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

    let mut config = synthetic::config(routes, 7);
    if routes > 1 {
        config.listeners.virtual_host_discovery = true;
        config.version_probes = config
            .virtual_hosts
            .iter()
            .map(|v| VersionProbe {
                id: v.name.clone(),
                version: "1-live".into(),
                listener: None,
                routes: Vec::new(),
            })
            .collect();
    }
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
                request_headers: Default::default(),
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
        // (The first sync of 10k routes takes Envoy a while on two shared cores.)
        let deadline = Duration::from_secs(if i == 0 { 120 } else { 30 });
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
        routes,
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
