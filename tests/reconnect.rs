//! Make-before-break across reconnects (issue #37): an Envoy cut off from xDS while a
//! route moves and its old cluster is removed, then let back to the same server or to
//! another replica, SotW and delta. Under load through it the whole time, nothing fails:
//! the old cluster stays until the routes that used it are replaced, and the Envoy is
//! served at once on its new stream, without waiting for its initial-fetch timeout.
//! All on 127.0.0.x, through a relay the test cuts and points elsewhere.

use std::time::{Duration, Instant};

use switchyard::xds::Protocol;
use switchyard_e2e::relay::Relay;
use switchyard_e2e::{Backend, Envoy, Load, StandaloneDir, Switchyard};

/// Far below Envoy's 15 s initial-fetch timeout, which a stream answered late waits for.
const SERVED_WITHIN: Duration = Duration::from_secs(5);

/// Bytes per second from the server to the reconnected Envoy.
const SLOW_LINK: u32 = 32 * 1024;

/// `web.test` to `web`'s backend, `shop.test` to green: green's cluster is held by the
/// Envoy before `web` moves to it, so the move adds no cluster and only removes blue's.
fn config(dir: &StandaloneDir, web: &Backend, blue: &Backend, green: &Backend) -> String {
    let mut services = vec![green];
    if web.name == blue.name {
        services.push(blue);
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

async fn move_while_cut_off(ip: &str, protocol: Protocol, to_another_replica: bool) {
    let dir = StandaloneDir::new();
    let blue = Backend::start("blue", ip).await;
    let green = Backend::start("green", ip).await;
    dir.write("routes.yaml", &config(&dir, &blue, &blue, &green));
    let first = Switchyard::start_standalone(&dir.work, &dir.config, &[]);
    let Ok(first_address) = format!("127.0.0.1:{}", first.xds_port).parse() else {
        panic!("an xDS address");
    };
    // Another replica serves the same configuration all along, as replicas do.
    let other = to_another_replica.then(|| {
        let work = dir.work.join("other");
        std::fs::create_dir(&work).expect("a work folder");
        Switchyard::start_standalone(&work, &dir.config, &[])
    });
    let relay = Relay::start(first_address).await;
    let envoy = Envoy::start(&dir.work, "envoy", ip, relay.address.port(), protocol);
    first.wait_synced(1, Duration::from_secs(30)).await;
    let url = format!("http://{ip}:{}/", dir.http_port);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("an HTTP client");
    let started = Instant::now();
    while web_backend(&client, &url).await.as_deref() != Some("blue") {
        assert!(started.elapsed() < Duration::from_secs(20), "not serving");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let load = Load::start(
        vec![format!("http://{ip}:{}", dir.http_port)],
        "web.test",
        200,
        Duration::from_secs(60),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.cut();
    wait_connected(&first, 0, Duration::from_secs(10)).await;
    // The route moves to green and blue's cluster goes, while the Envoy hears nothing.
    let before = first.desired_version().await;
    dir.write("routes.yaml", &config(&dir, &green, &blue, &green));
    first
        .wait_for_new_version(before.as_deref(), Duration::from_secs(10))
        .await;
    let server = match &other {
        Some(other) => {
            other
                .wait_for_new_version(before.as_deref(), Duration::from_secs(10))
                .await;
            let Ok(address) = format!("127.0.0.1:{}", other.xds_port).parse() else {
                panic!("an xDS address");
            };
            relay.redirect(address);
            other
        }
        None => &first,
    };
    // Responses sent a moment apart arrive a good while apart, as over a congested link:
    // a cluster removed before the routes that send to it are replaced fails requests
    // for that while, not for a millisecond that a load might miss.
    relay.slow_to_client(SLOW_LINK);
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.restore();
    wait_connected(server, 1, Duration::from_secs(40)).await;
    let reconnected = Instant::now();
    server.wait_synced(1, SERVED_WITHIN).await;
    let synced = reconnected.elapsed();
    while web_backend(&client, &url).await.as_deref() != Some("green") {
        assert!(
            reconnected.elapsed() < SERVED_WITHIN,
            "still not served by green {:?} after reconnecting",
            reconnected.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let served = reconnected.elapsed();
    // The load runs on for a while after the reconnect, so that requests cross it.
    tokio::time::sleep(Duration::from_secs(1).saturating_sub(reconnected.elapsed())).await;
    let report = load.finish().await;
    let stats = envoy
        .admin("/stats?filter=cluster_manager.cluster_removed")
        .await;
    eprintln!(
        "{protocol:?}, {}: synced {synced:?} and served by green {served:?} after \
         reconnecting; {} requests, {:?} by status, {:?} by backend; {}",
        if to_another_replica {
            "another replica"
        } else {
            "same server"
        },
        report.sent,
        report.by_status,
        report.by_backend,
        stats.trim()
    );
    let shown: Vec<_> = report.failures.iter().take(5).collect();
    assert_eq!(
        report.non_2xx(),
        0,
        "requests failed across the reconnect: {shown:#?}\n--- envoy log ---\n{}",
        envoy.process.log_tail()
    );
    assert!(
        report.by_backend.get("green").copied().unwrap_or(0) > 20,
        "too few answers after the move to tell: {report:?}"
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
