//! Make-before-break across reconnects (issue #37): an Envoy cut off from xDS while a
//! route moves and its old cluster is removed, then let back to the same server or to
//! another replica, SotW and delta. Under load through it the whole time, nothing fails:
//! the old cluster stays until the routes that used it are replaced, and the Envoy is
//! served at once on its new stream, without waiting for its initial-fetch timeout.
//! All on 127.0.0.x, through a relay the test cuts and points elsewhere.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use switchyard::xds::Protocol;
use switchyard_e2e::relay::Relay;
use switchyard_e2e::{Backend, Envoy, Load, LoadReport, StandaloneDir, Switchyard};

/// Far below Envoy's 15 s initial-fetch timeout, which a stream answered late waits for.
const SERVED_WITHIN: Duration = Duration::from_secs(5);

/// Bytes per second from the server to the reconnected Envoy.
const SLOW_LINK: u32 = 32 * 1024;
/// Slower still: a small response takes a tenth of a second or more.
const CRAWLING_LINK: u32 = 2 * 1024;

/// `web.test` to `web`, `shop.test` to green: green's cluster is held by the Envoy
/// before `web` moves to it, so such a move adds no cluster and only removes the old one.
fn config(dir: &StandaloneDir, web: &Backend, green: &Backend) -> String {
    let mut services = vec![green];
    if web.name != green.name {
        services.push(web);
    }
    let services: String = services
        .iter()
        .map(|b| {
            format!(
                "- name: {}\n  endpoints: [ {{ address: \"{}\", port: {} }} ]\n",
                b.name,
                b.address.ip(),
                b.address.port()
            )
        })
        .collect();
    format!(
        "listeners:\n  httpPort: {http}\n  httpsPort: {https}\n  probePort: {probe}\n\
         routes:\n\
         - name: web\n  spec:\n    hosts: [\"web.test\"]\n    rules:\n    \
         - backends: [ {{ service: {web}, port: {wp} }} ]\n\
         - name: shop\n  spec:\n    hosts: [\"shop.test\"]\n    rules:\n    \
         - backends: [ {{ service: green, port: {gp} }} ]\n\
         services:\n{services}",
        http = dir.http_port,
        https = dir.http_port + 1,
        probe = dir.probe_port,
        web = web.name,
        wp = web.address.port(),
        gp = green.address.port(),
    )
}

/// Until `switchyard` has `count` connected nodes.
async fn wait_connected(switchyard: &Switchyard, count: usize, within: Duration) {
    let started = Instant::now();
    loop {
        let nodes = switchyard.nodes().await;
        if nodes["nodes"].as_array().map_or(0, Vec::len) == count {
            return;
        }
        assert!(
            started.elapsed() < within,
            "not {count} nodes within {within:?}: {nodes:#}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Which backend answers `web.test` through `envoy`, if one does.
async fn web_backend(client: &reqwest::Client, url: &str) -> Option<String> {
    let response = client
        .get(url)
        .header("host", "web.test")
        .send()
        .await
        .ok()?;
    let backend = response.headers().get("x-backend")?.to_str().ok()?;
    Some(backend.to_string())
}

/// One Envoy serving `web.test` from blue through a relay to a standalone server, under
/// no load yet.
struct Rig {
    dir: StandaloneDir,
    green: Backend,
    _blue: Backend,
    server: Switchyard,
    relay: Relay,
    envoy: Envoy,
    ip: &'static str,
    client: reqwest::Client,
}

impl Rig {
    async fn start(ip: &'static str, protocol: Protocol) -> Rig {
        let dir = StandaloneDir::new();
        let blue = Backend::start("blue", ip).await;
        let green = Backend::start("green", ip).await;
        dir.write("routes.yaml", &config(&dir, &blue, &green));
        let server = Switchyard::start_standalone(&dir.work, &dir.config, &[]);
        let relay = Relay::start(xds_address(&server)).await;
        let envoy = Envoy::start(&dir.work, "envoy", ip, relay.address.port(), protocol);
        server.wait_synced(1, Duration::from_secs(30)).await;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("an HTTP client");
        let rig = Rig {
            dir,
            green,
            _blue: blue,
            server,
            relay,
            envoy,
            ip,
            client,
        };
        rig.wait_served_by("blue", Instant::now(), Duration::from_secs(20))
            .await;
        rig
    }

    /// Until `web.test` is answered by `backend`, at most `within` after `since`.
    async fn wait_served_by(&self, backend: &str, since: Instant, within: Duration) -> Duration {
        let url = format!("http://{}:{}/", self.ip, self.dir.http_port);
        while web_backend(&self.client, &url).await.as_deref() != Some(backend) {
            assert!(
                since.elapsed() < within,
                "web.test not served by {backend} within {within:?}\n--- envoy log ---\n{}",
                self.envoy.process.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        since.elapsed()
    }

    fn load(&self) -> Load {
        Load::start(
            vec![format!("http://{}:{}", self.ip, self.dir.http_port)],
            "web.test",
            200,
            Duration::from_secs(60),
        )
    }

    /// The load's report, once it ran on for a second after `reconnected`, so that
    /// requests cross the reconnect; asserting that none failed and enough reached `to`.
    async fn finish(&self, load: Load, reconnected: Instant, to: &str) -> LoadReport {
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(reconnected.elapsed())).await;
        let report = load.finish().await;
        let shown: Vec<_> = report.failures.iter().take(5).collect();
        assert_eq!(
            report.non_2xx(),
            0,
            "requests failed across the reconnect: {shown:#?}\n--- envoy log ---\n{}",
            self.envoy.process.log_tail()
        );
        assert!(
            report.by_backend.get(to).copied().unwrap_or(0) > 20,
            "too few answers after the move to tell: {report:?}"
        );
        report
    }
}

fn xds_address(server: &Switchyard) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], server.xds_port))
}

async fn move_while_cut_off(ip: &'static str, protocol: Protocol, to_another_replica: bool) {
    let rig = Rig::start(ip, protocol).await;
    // Another replica serves the same configuration all along, as replicas do.
    let other = to_another_replica.then(|| {
        let work = rig.dir.work.join("other");
        std::fs::create_dir(&work).expect("a work folder");
        Switchyard::start_standalone(&work, &rig.dir.config, &[])
    });
    let load = rig.load();
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig.relay.cut();
    wait_connected(&rig.server, 0, Duration::from_secs(10)).await;
    // The route moves to green and blue's cluster goes, while the Envoy hears nothing.
    let before = rig.server.desired_version().await;
    rig.dir
        .write("routes.yaml", &config(&rig.dir, &rig.green, &rig.green));
    rig.server
        .wait_for_new_version(before.as_deref(), Duration::from_secs(10))
        .await;
    let server = match &other {
        Some(other) => {
            other
                .wait_for_new_version(before.as_deref(), Duration::from_secs(10))
                .await;
            rig.relay.redirect(xds_address(other));
            other
        }
        None => &rig.server,
    };
    // Responses sent a moment apart arrive a good while apart, as over a congested link:
    // a cluster removed before the routes that send to it are replaced fails requests
    // for that while, not for a millisecond that a load might miss.
    rig.relay.slow_to_client(Some(SLOW_LINK));
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig.relay.restore();
    wait_connected(server, 1, Duration::from_secs(40)).await;
    let reconnected = Instant::now();
    server.wait_synced(1, SERVED_WITHIN).await;
    let synced = reconnected.elapsed();
    let served = rig
        .wait_served_by("green", reconnected, SERVED_WITHIN)
        .await;
    let report = rig.finish(load, reconnected, "green").await;
    eprintln!(
        "{protocol:?}, {}: synced {synced:?} and served by green {served:?} after \
         reconnecting; {} requests, {:?} by status, {:?} by backend",
        if to_another_replica {
            "another replica"
        } else {
            "same server"
        },
        report.sent,
        report.by_status,
        report.by_backend,
    );
}

#[tokio::test]
async fn a_sotw_envoy_reconnecting_after_a_move_loses_no_request() {
    move_while_cut_off("127.0.0.131", Protocol::Sotw, false).await;
}

#[tokio::test]
async fn a_delta_envoy_reconnecting_after_a_move_loses_no_request() {
    move_while_cut_off("127.0.0.132", Protocol::Delta, false).await;
}

#[tokio::test]
async fn a_sotw_envoy_reconnecting_to_another_replica_after_a_move_loses_no_request() {
    move_while_cut_off("127.0.0.133", Protocol::Sotw, true).await;
}

#[tokio::test]
async fn a_delta_envoy_reconnecting_to_another_replica_after_a_move_loses_no_request() {
    move_while_cut_off("127.0.0.134", Protocol::Delta, true).await;
}

/// An Envoy cut off while a new cluster of it is warming (it has the cluster, not yet its
/// endpoints) holds its cluster request back on the new stream until that cluster is
/// warm. It is served its endpoints without that request, and does not wait for its
/// initial-fetch timeout.
#[tokio::test]
async fn an_envoy_reconnecting_while_a_cluster_warms_is_served_without_waiting() {
    let rig = Rig::start("127.0.0.135", Protocol::Delta).await;
    let red = Backend::start("red", rig.ip).await;
    // Over a crawling link, a new cluster's endpoints come a good while after it.
    rig.relay.slow_to_client(Some(CRAWLING_LINK));
    rig.relay.cut();
    wait_connected(&rig.server, 0, Duration::from_secs(10)).await;
    rig.relay.restore();
    wait_connected(&rig.server, 1, Duration::from_secs(40)).await;
    rig.server.wait_synced(1, Duration::from_secs(30)).await;

    let load = rig.load();
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig.dir
        .write("routes.yaml", &config(&rig.dir, &red, &rig.green));
    let started = Instant::now();
    loop {
        let warming = rig
            .envoy
            .admin("/stats?filter=cluster_manager.warming_clusters")
            .await;
        if warming.trim().ends_with(": 1") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "red's cluster never warming: {warming}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    rig.relay.cut();
    wait_connected(&rig.server, 0, Duration::from_secs(10)).await;
    let warming = rig
        .envoy
        .admin("/stats?filter=cluster_manager.warming_clusters")
        .await;
    assert!(
        warming.trim().ends_with(": 1"),
        "cut off after red's endpoints came: {warming}"
    );
    rig.relay.slow_to_client(None);
    rig.relay.restore();
    wait_connected(&rig.server, 1, Duration::from_secs(40)).await;
    let reconnected = Instant::now();
    rig.server.wait_synced(1, SERVED_WITHIN).await;
    let synced = reconnected.elapsed();
    let served = rig.wait_served_by("red", reconnected, SERVED_WITHIN).await;
    let report = rig.finish(load, reconnected, "red").await;
    eprintln!(
        "reconnected while red's cluster warmed: synced {synced:?} and served by red \
         {served:?} after reconnecting; {} requests, {:?} by status, {:?} by backend",
        report.sent, report.by_status, report.by_backend,
    );
}
