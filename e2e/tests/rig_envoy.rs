//! The rig's Envoy side counts right: a backend told to fail yields exactly that many
//! non-2xx, each recorded with its Envoy, status, body and headers; a slow backend is slow.

use std::time::{Duration, Instant};

use switchyard::xds::Protocol;
use switchyard_e2e::{Backend, Envoy, Load, Switchyard, free_port, write_route};

#[tokio::test]
async fn a_backend_told_to_fail_yields_exactly_the_expected_non_2xx() {
    let dir = tempfile::tempdir().expect("temp dir");
    let work = dir.path().to_path_buf();
    let config = work.join("config");
    std::fs::create_dir(&config).expect("config dir");
    let (http_port, probe_port) = (free_port(), free_port());
    let backend = Backend::start("flaky", "127.0.0.61").await;
    write_route(
        &config,
        "rig.test",
        http_port,
        probe_port,
        &[("flaky", &backend)],
    );
    let switchyard = Switchyard::start_standalone(&work, &config, &[]);
    let envoys: Vec<Envoy> = ["127.0.0.62", "127.0.0.63"]
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            Envoy::start(
                &work,
                &format!("envoy-rig-{i}"),
                ip,
                switchyard.xds_port,
                Protocol::Delta,
            )
        })
        .collect();
    switchyard.wait_synced(2, Duration::from_secs(20)).await;
    let targets: Vec<String> = envoys
        .iter()
        .map(|e| format!("http://{}:{http_port}", e.address))
        .collect();
    let client = reqwest::Client::new();
    for target in &targets {
        for _ in 0..100 {
            if client
                .get(format!("{target}/"))
                .header("host", "rig.test")
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    backend.fail_next(7, 503);
    let report = Load::start(targets.clone(), "rig.test", 100, Duration::from_secs(2))
        .finish_after(Duration::from_secs(2))
        .await;
    assert_eq!(report.non_2xx(), 7, "{:?}", report.by_status);
    assert_eq!(report.by_status.get("503"), Some(&7));
    assert_eq!(report.sent, report.by_status.values().sum::<usize>());
    for failure in &report.failures {
        assert_eq!(failure.status, Some(503));
        assert_eq!(failure.body, "flaky");
        assert!(targets.contains(&failure.target));
        let names: Vec<&str> = failure.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert!(
            names.contains(&"x-backend") && names.contains(&"x-envoy-upstream-service-time"),
            "{names:?}"
        );
    }

    backend.slow_down(Duration::from_millis(300));
    let started = Instant::now();
    let response = client
        .get(format!("{}/", targets[0]))
        .header("host", "rig.test")
        .send()
        .await
        .expect("slow answer");
    assert!(response.status().is_success());
    assert!(started.elapsed() >= Duration::from_millis(300));
}
