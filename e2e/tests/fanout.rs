//! Correctness at scale: a thousand simulated Envoys (half SotW, half delta) on the
//! in-process ADS server follow a route change and an endpoint change, and each ends
//! holding exactly the desired snapshot; so do 500 delta Envoys taking virtual hosts one
//! by one (VHDS). Loopback only; every wait has a timeout.

use std::sync::Arc;
use std::time::Duration;

use switchyard::model::{
    ClusterSettings, Config, RouteAction, ServiceRef, WeightedCluster, cluster_name,
};
use switchyard::translate::translate;
use switchyard::xds::snapshot::{CLUSTER, ENDPOINT, VIRTUAL_HOST};
use switchyard::xds::{Ordering, Protocol, Snapshot};
use switchyard_e2e::InProcessServer;
use switchyard_e2e::ads_client::{AdsClient, Target, spawn_fleet, wait_all};
use switchyard_e2e::synthetic;

/// Generous for a debug build on two shared cores.
const SYNC_TIMEOUT: Duration = Duration::from_secs(180);

fn snapshot_of(config: &Config) -> Arc<Snapshot> {
    Arc::new(translate(config).snapshot)
}

/// Points the first route of virtual host `host` at a brand-new cluster named after
/// `service`; returns the cluster's name.
fn repoint_to_new_cluster(config: &mut Config, host: usize, service: &str) -> String {
    let service = ServiceRef {
        namespace: "fanout".into(),
        name: service.into(),
        port: 8080,
    };
    let settings = ClusterSettings::default();
    let name = cluster_name(&service, &settings);
    let mut cluster = config.clusters[host].clone();
    cluster.name = name.clone();
    cluster.service = service;
    config.clusters.push(cluster);
    let RouteAction::Forward(forward) = &mut config.virtual_hosts[host].routes[0].action else {
        panic!("synthetic routes forward");
    };
    forward.backends = vec![WeightedCluster {
        cluster: name.clone(),
        weight: 1,
        request_headers: Default::default(),
    }];
    name
}

/// Moves one endpoint of cluster `index` to another address.
fn move_endpoint(config: &mut Config, index: usize) {
    config.clusters[index].endpoints[0].address = "10.250.0.1".into();
}

/// Every client holds `target` (names and versions per type), and SotW and delta clients
/// hold the same bodies too.
async fn expect_all_hold(clients: &[AdsClient], target: &Target, what: &str) {
    wait_all(clients, target, SYNC_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:#}"));
    let reference = clients[0].state();
    for client in clients {
        assert!(
            client.state() == reference,
            "{what}: {} holds something else than {}",
            client.node_id(),
            clients[0].node_id()
        );
    }
}

/// The server sees every node synced on `snapshot` (its view, from the ACKs).
async fn expect_server_sees_synced(server: &InProcessServer, nodes: usize, snapshot: &Snapshot) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut changes = server.nodes.changes();
    loop {
        let list = server.nodes.list();
        let synced = list
            .iter()
            .filter(|n| {
                n.status.synced && n.status.desired_version.as_deref() == Some(snapshot.version())
            })
            .count();
        if synced == nodes && list.len() == nodes {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server sees {synced} of {} nodes synced, expected {nodes}",
            list.len()
        );
        let _ = tokio::time::timeout(Duration::from_millis(200), changes.changed()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_clients_follow_a_route_change_and_an_endpoint_change() {
    follow_a_route_change_and_an_endpoint_change(false, 500, 500).await;
}

/// The operator's default: delta clients take route configurations in parts (VHDS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_taking_virtual_hosts_one_by_one_follow_the_same_changes() {
    follow_a_route_change_and_an_endpoint_change(true, 0, 500).await;
}

/// `sotw` and `delta` clients, with route configurations also in parts when `in_parts`,
/// follow a route change and an endpoint change and end holding alike.
async fn follow_a_route_change_and_an_endpoint_change(in_parts: bool, sotw: usize, delta: usize) {
    let server = InProcessServer::start(Ordering::MakeBeforeBreak).await;
    let mut config = synthetic::config(200, 42);
    config.listeners.virtual_host_discovery = in_parts;
    // What a client holds depends on its protocol where configurations come in parts;
    // with one protocol only, every client holds the same.
    let target = |snapshot: &Snapshot| {
        if in_parts {
            Target::for_protocol(snapshot, Protocol::Delta)
        } else {
            Target::of(snapshot)
        }
    };
    let first = snapshot_of(&config);
    server.desired.publish(first.clone());
    assert!(server.desired.open());
    let clients = spawn_fleet(server.port, sotw, delta)
        .await
        .expect("connecting the clients");

    expect_all_hold(&clients, &target(&first), "initial state").await;
    expect_server_sees_synced(&server, clients.len(), &first).await;

    // Route 3 is the only user of its cluster: the old cluster goes, the new one comes.
    let new_cluster = repoint_to_new_cluster(&mut config, 3, "brand-new");
    let rerouted = snapshot_of(&config);
    for type_url in [CLUSTER, ENDPOINT] {
        let resources = rerouted.resources(type_url).expect("every type is present");
        assert!(resources.contains_key(&new_cluster), "{type_url}");
        assert_eq!(
            resources.len(),
            first.resources(type_url).map_or(0, |r| r.len())
        );
    }
    if in_parts {
        assert!(
            rerouted
                .resources(VIRTUAL_HOST)
                .is_some_and(|v| v.len() >= 200),
            "every virtual host is a resource of its own"
        );
    }
    server.desired.publish(rerouted.clone());
    expect_all_hold(&clients, &target(&rerouted), "after the route change").await;
    expect_server_sees_synced(&server, clients.len(), &rerouted).await;

    move_endpoint(&mut config, 7);
    let moved = snapshot_of(&config);
    server.desired.publish(moved.clone());
    expect_all_hold(&clients, &target(&moved), "after the endpoint change").await;
    expect_server_sees_synced(&server, clients.len(), &moved).await;

    for client in &clients {
        assert_eq!(client.failure(), None, "{}", client.node_id());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_connecting_after_a_change_gets_the_full_state() {
    let server = InProcessServer::start(Ordering::MakeBeforeBreak).await;
    let mut config = synthetic::config(50, 7);
    let first = snapshot_of(&config);
    server.desired.publish(first.clone());
    assert!(server.desired.open());
    let early = spawn_fleet(server.port, 1, 1)
        .await
        .expect("connecting the early clients");
    expect_all_hold(&early, &Target::of(&first), "early clients").await;

    repoint_to_new_cluster(&mut config, 0, "late");
    move_endpoint(&mut config, 1);
    let changed = snapshot_of(&config);
    server.desired.publish(changed.clone());
    let target = Target::of(&changed);
    expect_all_hold(&early, &target, "early clients after the change").await;

    let late = spawn_fleet(server.port, 1, 1)
        .await
        .expect("connecting the late clients");
    expect_all_hold(&late, &target, "late clients").await;
    assert!(
        late[0].state() == early[0].state(),
        "late and early clients hold the same"
    );
    let resources: usize = late[1].state().values().map(|t| t.len()).sum();
    assert_eq!(resources, changed.len(), "the whole snapshot, nothing more");
}
