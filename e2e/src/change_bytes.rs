//! Bytes one simulated Envoy (`crate::ads_client`) receives per change: the first sync of
//! a synthetic configuration, one route moved to a brand-new cluster, one endpoint moved;
//! for a SotW client, a delta client, and a delta client of a server that serves route
//! configurations in parts (VHDS). A figure a code change can lose without anyone
//! noticing, so `switchyard-bench` prints it at 10k routes and `e2e/tests/change_bytes.rs`
//! holds it to a record at 1000.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use switchyard::model::{
    ClusterSettings, Config, RouteAction, ServiceRef, WeightedCluster, cluster_name,
};
use switchyard::translate::translate;
use switchyard::xds::{Ordering, Protocol, Snapshot};

use crate::InProcessServer;
use crate::ads_client::{AdsClient, Counts, Target, connect_channels, received_since};
use crate::synthetic;

/// Bounds a client's sync: a first sync of 10k routes is slow but not this slow.
const SYNC_TIMEOUT: Duration = Duration::from_secs(300);
/// Bounds the server's view of a change reaching every node.
pub const CHANGE_TIMEOUT: Duration = Duration::from_secs(60);

/// Waits until the server's registry has every node synced on `snapshot`; returns the
/// time since `started` at which it saw that.
pub async fn wait_server_synced(
    server: &InProcessServer,
    nodes: usize,
    snapshot: &Snapshot,
    started: Instant,
) -> anyhow::Result<Duration> {
    let mut changes = server.nodes.changes();
    loop {
        let synced = server
            .nodes
            .list()
            .iter()
            .filter(|n| {
                n.status.synced && n.status.desired_version.as_deref() == Some(snapshot.version())
            })
            .count();
        if synced == nodes {
            return Ok(started.elapsed());
        }
        if started.elapsed() > CHANGE_TIMEOUT {
            bail!("the server saw {synced} of {nodes} nodes synced after {CHANGE_TIMEOUT:?}");
        }
        // Polled at most every few milliseconds: listing a thousand nodes on every one of
        // their ACKs would cost more than the server's own work.
        let _ = tokio::time::timeout(Duration::from_millis(100), changes.changed()).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Points the first route of virtual host `host` at a brand-new cluster (a copy of the
/// host's cluster under a new service name).
pub fn repoint_to_new_cluster(config: &mut Config, host: usize, service: &str) {
    let service = ServiceRef {
        namespace: "bench".into(),
        name: service.into(),
        port: 8080,
    };
    let name = cluster_name(&service, &ClusterSettings::default());
    let mut cluster = config.clusters[host].clone();
    cluster.name = name.clone();
    cluster.service = service;
    config.clusters.push(cluster);
    if let RouteAction::Forward(forward) = &mut config.virtual_hosts[host].routes[0].action {
        forward.backends = vec![WeightedCluster {
            cluster: name,
            weight: 1,
            request_headers: Default::default(),
        }];
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BytesResult {
    pub change: String,
    pub protocol: String,
    /// Encoded bytes of the responses received, by short type name.
    pub bytes: BTreeMap<String, u64>,
    pub responses: u64,
    pub total_bytes: u64,
}

/// The changes the bytes measurement makes, in the order the table lists them.
const BYTE_CHANGES: [&str; 3] = [
    "first sync",
    "route → new cluster",
    "one cluster's endpoints",
];

/// Bytes one SotW and one delta client receive for the first sync of `routes` routes,
/// then for one route change and one endpoint change; and one delta client of a server
/// that also serves route configurations in parts (VHDS).
pub async fn measure_bytes(routes: usize) -> anyhow::Result<Vec<BytesResult>> {
    let config = synthetic::config(routes, 42);
    let mut results = bytes_per_change(
        config.clone(),
        &[(Protocol::Sotw, "SotW"), (Protocol::Delta, "delta")],
    )
    .await?;
    let mut in_parts = config;
    in_parts.listeners.virtual_host_discovery = true;
    results.extend(bytes_per_change(in_parts, &[(Protocol::Delta, "delta + VHDS")]).await?);
    // Grouped by change, each group in the order measured (stable sort).
    results.sort_by_key(|r| BYTE_CHANGES.iter().position(|c| *c == r.change));
    Ok(results)
}

/// The [`BYTE_CHANGES`] made to `config` on a server of its own, with one client of each
/// of `clients` (protocol, label).
async fn bytes_per_change(
    mut config: Config,
    clients: &[(Protocol, &str)],
) -> anyhow::Result<Vec<BytesResult>> {
    let [first_sync, rerouting, moving] = BYTE_CHANGES;
    let server = InProcessServer::start(Ordering::MakeBeforeBreak).await;
    let first = Arc::new(translate(&config).snapshot);
    server.desired.publish(first.clone());
    server.desired.open();
    let channels = connect_channels(server.port, 1).await?;
    let fleet: Vec<(AdsClient, Protocol, &str)> = clients
        .iter()
        .enumerate()
        .map(|(i, &(protocol, label))| {
            let client = AdsClient::spawn(channels[0].clone(), protocol, format!("bytes-{i}"));
            (client, protocol, label)
        })
        .collect();
    let mut results = Vec::new();
    let none = vec![Counts::new(); fleet.len()];
    let marks = sync_and_count(&server, &fleet, &first, &none, first_sync, &mut results).await?;

    repoint_to_new_cluster(&mut config, 0, "fresh-bytes");
    let rerouted = Arc::new(translate(&config).snapshot);
    server.desired.publish(rerouted.clone());
    let marks = sync_and_count(&server, &fleet, &rerouted, &marks, rerouting, &mut results).await?;

    // One endpoint of one cluster moves.
    config.clusters[1].endpoints[0].address = "10.250.0.1".into();
    let moved = Arc::new(translate(&config).snapshot);
    server.desired.publish(moved.clone());
    sync_and_count(&server, &fleet, &moved, &marks, moving, &mut results).await?;
    Ok(results)
}

/// Waits for the clients to hold `snapshot` (as their protocol serves it) and the server
/// to have all their ACKs (a SotW client holds the new state before the last, redundant,
/// response of a switch arrives), records what each received since its mark, and
/// returns the new marks.
async fn sync_and_count(
    server: &InProcessServer,
    clients: &[(AdsClient, Protocol, &str)],
    snapshot: &Snapshot,
    marks: &[Counts],
    change: &str,
    results: &mut Vec<BytesResult>,
) -> anyhow::Result<Vec<Counts>> {
    for (client, protocol, label) in clients {
        client
            .wait_for(&Target::for_protocol(snapshot, *protocol), SYNC_TIMEOUT)
            .await
            .with_context(|| format!("{change}, {label}"))?;
    }
    wait_server_synced(server, clients.len(), snapshot, Instant::now()).await?;
    let mut now = Vec::new();
    for ((client, _, label), mark) in clients.iter().zip(marks) {
        let received = client.received();
        let since = received_since(&received, mark);
        let bytes: BTreeMap<String, u64> = since
            .iter()
            .map(|(t, r)| (short_type(t).to_string(), r.bytes))
            .collect();
        results.push(BytesResult {
            change: change.to_string(),
            protocol: label.to_string(),
            total_bytes: bytes.values().sum(),
            responses: since.values().map(|r| r.responses).sum(),
            bytes,
        });
        now.push(received);
    }
    Ok(now)
}

fn short_type(type_url: &str) -> &str {
    type_url.rsplit('.').next().unwrap_or(type_url)
}
