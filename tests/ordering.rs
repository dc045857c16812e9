//! Per-Envoy make-before-break ordering (I1, I2) under load, on real Envoy.
//!
//! A route is repointed to a brand-new cluster over and over while bounded load runs.
//! With the ordering on, not one request may fail. With it off (everything pushed at
//! once, like a naive control plane) the same test must see failures: proof that it
//! can see what it guards against.

use std::time::Duration;

use switchyard::xds::Protocol;
use switchyard_e2e::{Backend, Envoy, Load, Switchyard, free_port, write_route};

const SWITCHES: usize = 30;
const RATE: u32 = 400;

async fn repoint_under_load(
    protocol: Protocol,
    ordered: bool,
    ip: &str,
) -> switchyard_e2e::LoadReport {
    let dir = tempfile::tempdir().expect("temp dir");
    let work = dir.path().to_path_buf();
    let config = work.join("config");
    std::fs::create_dir(&config).expect("config dir");
    let (http_port, probe_port) = (free_port(), free_port());
    let backends = [
        Backend::start("blue", ip).await,
        Backend::start("green", ip).await,
    ];
    write_route(
        &config,
        "web.test",
        http_port,
        probe_port,
        &[("svc-0", &backends[0])],
    );
    let extra: &[&str] = if ordered { &[] } else { &["--unordered-xds"] };
    let switchyard = Switchyard::start_standalone(&work, &config, extra);
    let _envoy = Envoy::start(&work, "envoy-order", ip, switchyard.xds_port, protocol);
    switchyard.wait_synced(1, Duration::from_secs(20)).await;
    // The listener turns active a moment after Envoy ACKs it: wait for a first answer.
    wait_for_ok(&format!("http://{ip}:{http_port}/"), "web.test").await;

    let load = Load::start(
        vec![format!("http://{ip}:{http_port}")],
        "web.test",
        RATE,
        Duration::from_secs(30),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 1..=SWITCHES {
        // A brand-new service (so a brand-new cluster) every time.
        let service = format!("svc-{i}");
        write_route(
            &config,
            "web.test",
            http_port,
            probe_port,
            &[(&service, &backends[i % 2])],
        );
        switchyard.wait_synced(1, Duration::from_secs(10)).await;
        tokio::time::sleep(Duration::from_millis(330)).await;
    }
    let report = load.finish().await;
    eprintln!(
        "{protocol:?} ordered={ordered}: sent {} in {:?}, by status {:?} by backend {:?}; first failures: {:?}",
        report.sent,
        report.elapsed,
        report.by_status,
        report.by_backend,
        report.failures.iter().take(5).collect::<Vec<_>>()
    );
    assert!(
        report.elapsed >= Duration::from_secs(10)
            && report.sent as f64 / report.elapsed.as_secs_f64() >= 200.0,
        "load too thin to mean anything: {} in {:?}",
        report.sent,
        report.elapsed
    );
    report
}

async fn wait_for_ok(url: &str, host: &str) {
    let client = reqwest::Client::new();
    for _ in 0..200 {
        if let Ok(r) = client.get(url).header("host", host).send().await
            && r.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{url} never answered 200");
}

#[tokio::test]
async fn sotw_make_before_break_drops_nothing() {
    let report = repoint_under_load(Protocol::Sotw, true, "127.0.0.21").await;
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}

#[tokio::test]
async fn delta_make_before_break_drops_nothing() {
    let report = repoint_under_load(Protocol::Delta, true, "127.0.0.22").await;
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}

#[tokio::test]
async fn sotw_without_ordering_drops_requests() {
    let report = repoint_under_load(Protocol::Sotw, false, "127.0.0.23").await;
    assert!(
        report.non_2xx() > 0,
        "the test cannot see what ordering guards against"
    );
}

#[tokio::test]
async fn delta_without_ordering_drops_requests() {
    let report = repoint_under_load(Protocol::Delta, false, "127.0.0.24").await;
    assert!(
        report.non_2xx() > 0,
        "the test cannot see what ordering guards against"
    );
}
