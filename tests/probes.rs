//! The probe mechanism on real Envoy: endpoint readiness via the health_check filter on
//! the probe listener, and the live version via the secret version host.

use std::time::Duration;

use switchyard::prober::Prober;
use switchyard::standalone::{build::build, load_dir};
use switchyard::xds::Protocol;
use switchyard_e2e::{Backend, Envoy, Switchyard, free_port, write_route};

/// A standalone Switchyard serving `web.test` from a backend `blue` on `ip`, and one delta
/// Envoy on `ip` connected to it, synced.
struct OneEnvoy {
    _dir: tempfile::TempDir,
    config: std::path::PathBuf,
    probe_port: u16,
    blue: Backend,
    switchyard: Switchyard,
    envoy: Envoy,
}

async fn one_envoy(ip: &str, name: &str) -> OneEnvoy {
    let dir = tempfile::tempdir().expect("temp dir");
    let work = dir.path().to_path_buf();
    let config = work.join("config");
    std::fs::create_dir(&config).expect("config dir");
    let (http_port, probe_port) = (free_port(), free_port());
    let blue = Backend::start("blue", ip).await;
    write_route(
        &config,
        "web.test",
        http_port,
        probe_port,
        &[("blue", &blue)],
    );
    let switchyard = Switchyard::start_standalone(&work, &config, &[]);
    let envoy = Envoy::start(&work, name, ip, switchyard.xds_port, Protocol::Delta);
    switchyard.wait_synced(1, Duration::from_secs(20)).await;
    OneEnvoy {
        _dir: dir,
        config,
        probe_port,
        blue,
        switchyard,
        envoy,
    }
}

#[tokio::test]
async fn probes_tell_ready_clusters_and_live_versions_apart() {
    let ip = "127.0.0.16";
    let OneEnvoy {
        _dir,
        config,
        probe_port,
        blue,
        switchyard,
        envoy: _envoy,
    } = one_envoy(ip, "envoy-probe").await;

    let prober = Prober::new(probe_port, "test-token".into()).expect("prober");
    let envoys = vec![ip.to_string()];
    let version = |dir: &std::path::Path| {
        let loaded = load_dir(dir).expect("config loads");
        build(&loaded.file, &loaded.secrets, "test-token")
            .config
            .version_probes[0]
            .version
            .clone()
    };

    // Eventually ready (the listener turns active a moment after its ACK).
    let mut result = prober.check_endpoints(&envoys, "default/web").await;
    for _ in 0..100 {
        if result.all_ready() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
        result = prober.check_endpoints(&envoys, "default/web").await;
    }
    assert!(result.all_ready(), "{result:?}");
    assert!(
        prober
            .check_version(&envoys, "default/web", &version(&config))
            .await
            .all_ready()
    );
    assert!(
        !prober
            .check_version(&envoys, "default/web", "not-this-one")
            .await
            .all_ready()
    );

    // A probe nobody installed: 404, "not installed yet".
    let unknown = Prober::new(probe_port, "test-token".into()).expect("prober");
    let result = unknown.check_endpoints(&envoys, "default/nothing").await;
    assert_eq!(result.lagging.len(), 1);
    assert!(result.lagging[0].1.contains("not installed"), "{result:?}");

    // A wrong token is not a probe: never 200.
    let intruder = Prober::new(probe_port, "guess".into()).expect("prober");
    assert!(
        !intruder
            .check_endpoints(&envoys, "default/web")
            .await
            .all_ready()
    );
    assert!(
        !intruder
            .check_version(&envoys, "default/web", &version(&config))
            .await
            .all_ready()
    );

    // A service without endpoints: the cluster exists, the probe says 503.
    let text = std::fs::read_to_string(config.join("routes.yaml")).expect("read");
    let previous = switchyard.desired_version().await;
    std::fs::write(
        config.join("routes.yaml"),
        text.replace(
            &format!(
                "  endpoints:\n  - {{ address: \"{ip}\", port: {} }}\n",
                blue.address.port()
            ),
            "  endpoints: []\n",
        ),
    )
    .expect("write");
    switchyard
        .wait_for_new_version(previous.as_deref(), Duration::from_secs(10))
        .await;
    switchyard.wait_synced(1, Duration::from_secs(10)).await;
    let fresh = Prober::new(probe_port, "test-token".into()).expect("prober");
    let mut result = fresh.check_endpoints(&envoys, "default/web").await;
    for _ in 0..40 {
        if result
            .lagging
            .first()
            .is_some_and(|l| l.1.contains("without ready endpoints"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let again = Prober::new(probe_port, "test-token".into()).expect("prober");
        result = again.check_endpoints(&envoys, "default/web").await;
    }
    assert!(
        result
            .lagging
            .first()
            .is_some_and(|l| l.1.contains("without ready endpoints")),
        "{result:?}"
    );
}

/// The fleet's readiness probe (the chart's `readinessProbe`, `GET /ready` on the probe
/// port) on real Envoy: 200 while it runs, 503 while it fails its health check (as it does
/// draining), and no answer at all once the process hangs (SIGSTOP), where a TCP connect
/// still succeeds: so a hung Envoy stops being ready and leaves the fleet a rollout waits
/// for. Back once thawed.
#[tokio::test]
async fn the_readiness_path_answers_while_envoy_runs_and_not_once_it_hangs() {
    use switchyard::translate::READINESS_PATH;

    let ip = "127.0.0.17";
    let OneEnvoy {
        _dir,
        probe_port,
        envoy,
        blue: _blue,
        switchyard: _switchyard,
        ..
    } = one_envoy(ip, "envoy-ready").await;

    // As a kubelet asks: a second to answer.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .expect("a client");
    let url = format!("http://{ip}:{probe_port}{READINESS_PATH}");
    let ready = || async {
        match client.get(&url).send().await {
            Ok(answer) => Some(answer.status().as_u16()),
            Err(_) => None,
        }
    };
    let wait_for = |want: Option<u16>| async move {
        for _ in 0..100 {
            if ready().await == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("GET {READINESS_PATH}: {:?}, not {want:?}", ready().await);
    };

    // The probe listener is active a moment after its ACK.
    wait_for(Some(200)).await;
    assert_eq!(envoy.admin_post("/healthcheck/fail").await, Some(200));
    wait_for(Some(503)).await;
    assert_eq!(envoy.admin_post("/healthcheck/ok").await, Some(200));
    wait_for(Some(200)).await;

    envoy.freeze();
    let connects = tokio::net::TcpStream::connect((ip, probe_port))
        .await
        .is_ok();
    let frozen = ready().await;
    envoy.thaw();
    assert!(
        connects,
        "a TCP connect to a frozen Envoy succeeds (the kernel accepts)"
    );
    assert_eq!(frozen, None, "a frozen Envoy answered its readiness probe");
    wait_for(Some(200)).await;
}
