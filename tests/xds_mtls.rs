//! Mutual TLS between Envoy and the xDS server, with real Envoys on 127.0.0.x: certificates
//! from `switchyard certgen`, a standalone Switchyard started with the TLS flags. An Envoy
//! with the client certificate is served; one without a client certificate, or with one
//! from another CA, never gets configuration and never shows up as a node.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use switchyard::bootstrap::XdsTls;
use switchyard::xds::Protocol;
use switchyard_e2e::{Backend, Envoy, Switchyard, free_port, write_route};

/// How long a refused Envoy is watched: far longer than an accepted one takes to connect.
const REFUSED_FOR: Duration = Duration::from_secs(5);

struct Rig {
    _dir: tempfile::TempDir,
    work: PathBuf,
    config: PathBuf,
    certs: PathBuf,
    http_port: u16,
    probe_port: u16,
    switchyard: Switchyard,
}

impl Rig {
    /// Certificates into `certs/`, a route to `backend`, and Switchyard serving xDS with
    /// mutual TLS.
    fn start(backend: &Backend) -> Rig {
        let dir = tempfile::tempdir().expect("temp dir");
        let work = dir.path().to_path_buf();
        let config = work.join("config");
        std::fs::create_dir(&config).expect("config dir");
        let certs = work.join("certs");
        certgen(&certs);
        let (http_port, probe_port) = (free_port(), free_port());
        write_route(
            &config,
            "web.test",
            http_port,
            probe_port,
            &[("web", backend)],
        );
        let file = |name: &str| certs.join(name).display().to_string();
        let switchyard = Switchyard::start_standalone(
            &work,
            &config,
            &[
                "--xds-tls-cert",
                &file("server.crt"),
                "--xds-tls-key",
                &file("server.key"),
                "--xds-client-ca",
                &file("ca.crt"),
            ],
        );
        Rig {
            _dir: dir,
            work,
            config,
            certs,
            http_port,
            probe_port,
            switchyard,
        }
    }

    /// Client certificate and key from `dir`, and this rig's CA to trust the server with.
    fn client_tls(&self, dir: &Path) -> XdsTls {
        XdsTls {
            cert: dir.join("client.crt").display().to_string(),
            key: dir.join("client.key").display().to_string(),
            ca: self.certs.join("ca.crt").display().to_string(),
        }
    }

    /// Watches `envoy` for [`REFUSED_FOR`] once Switchyard has configuration to give: no
    /// listener ever appears on it and Switchyard never lists a node. Envoy kept trying
    /// all along, and every attempt failed in TLS.
    async fn assert_refused(&self, envoy: &Envoy) {
        let started = Instant::now();
        while self.switchyard.desired_version().await.is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "Switchyard never loaded its configuration\n--- switchyard ---\n{}",
                self.switchyard.process.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let started = Instant::now();
        while started.elapsed() < REFUSED_FOR {
            let nodes = self.switchyard.nodes().await;
            assert_eq!(
                nodes["nodes"].as_array().map(Vec::len),
                Some(0),
                "a refused Envoy became a node: {nodes:#}"
            );
            let listeners = envoy.admin("/listeners?format=json").await;
            assert!(
                !listeners.contains("\"name\""),
                "a refused Envoy got listeners: {listeners}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let stats = envoy
            .admin("/stats?filter=^cluster\\.switchyard-xds\\.")
            .await;
        let stat = |name: &str| -> u64 {
            stats
                .lines()
                .find_map(|l| l.strip_prefix(&format!("cluster.switchyard-xds.{name}: ")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name} in Envoy's stats:\n{stats}"))
        };
        let attempts = stat("upstream_cx_total");
        assert!(attempts >= 2, "Envoy hardly tried:\n{stats}");
        assert_eq!(
            stat("ssl.connection_error"),
            attempts,
            "every attempt failed in TLS:\n{stats}"
        );
        assert_eq!(stat("ssl.handshake"), 0, "no handshake completed:\n{stats}");
        eprintln!(
            "{} refused for {REFUSED_FOR:?}: {attempts} TLS connections failed",
            envoy.process.name
        );
    }
}

/// `switchyard certgen --out dir`, through the binary.
fn certgen(dir: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["certgen", "--days", "1", "--out"])
        .arg(dir)
        .output()
        .expect("switchyard certgen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "certgen: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("PRIVATE KEY"), "keys are never printed");
    assert!(stdout.contains("127.0.0.1"), "{stdout}");
}

async fn get(url: &str, host: &str) -> Result<(u16, String), String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| e.to_string())?;
    let response = client
        .get(url)
        .header("host", host)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    Ok((status, response.text().await.unwrap_or_default()))
}

#[tokio::test]
async fn envoy_with_the_client_certificate_is_served() {
    let ip = "127.0.0.71";
    let backend = Backend::start("web", ip).await;
    let rig = Rig::start(&backend);
    let envoy = Envoy::start_with_tls(
        &rig.work,
        "envoy-mtls",
        ip,
        rig.switchyard.xds_port,
        Protocol::Delta,
        rig.client_tls(&rig.certs),
    );
    rig.switchyard.wait_synced(1, Duration::from_secs(20)).await;
    let url = format!("http://{ip}:{}/", rig.http_port);
    let started = Instant::now();
    let mut last = Err("no request yet".to_string());
    while started.elapsed() < Duration::from_secs(5) {
        last = get(&url, "web.test").await;
        if matches!(&last, Ok((200, body)) if body == "web") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        matches!(&last, Ok((200, body)) if body == "web"),
        "{last:?}\n--- envoy ---\n{}",
        envoy.process.log_tail()
    );
    // It really is TLS: Envoy's xDS connection went through a handshake.
    let stats = envoy
        .admin("/stats?filter=^cluster\\.switchyard-xds\\.ssl\\.handshake$")
        .await;
    assert!(
        stats
            .trim()
            .strip_prefix("cluster.switchyard-xds.ssl.handshake: ")
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n >= 1),
        "{stats}"
    );
    // And it keeps following changes.
    let other = Backend::start("other", ip).await;
    write_route(
        &rig.config,
        "web.test",
        rig.http_port,
        rig.probe_port,
        &[("other", &other)],
    );
    let started = Instant::now();
    while !matches!(get(&url, "web.test").await, Ok((200, body)) if body == "other") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the change never reached Envoy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn envoy_without_a_client_certificate_is_refused() {
    let ip = "127.0.0.72";
    let backend = Backend::start("web", ip).await;
    let rig = Rig::start(&backend);
    let tls = rig.client_tls(&rig.certs);
    let envoy = Envoy::start_with_bootstrap(
        &rig.work,
        "envoy-no-cert",
        ip,
        &[rig.switchyard.xds_port],
        Protocol::Delta,
        |mut bootstrap| {
            bootstrap.tls = Some(tls);
            // TLS that trusts the server, but without a certificate of its own.
            let yaml = bootstrap.to_yaml();
            let without: String = yaml
                .lines()
                .filter(|l| {
                    !["tls_certificates", "certificate_chain", "private_key"]
                        .iter()
                        .any(|key| l.contains(key))
                })
                .map(|l| format!("{l}\n"))
                .collect();
            assert!(!without.contains("client.key"), "{without}");
            without
        },
    );
    rig.assert_refused(&envoy).await;
}

#[tokio::test]
async fn envoy_with_a_certificate_from_another_ca_is_refused() {
    let ip = "127.0.0.73";
    let backend = Backend::start("web", ip).await;
    let rig = Rig::start(&backend);
    let other = rig.work.join("other-ca");
    certgen(&other);
    // It trusts the right server, but its own certificate was signed by another CA.
    let envoy = Envoy::start_with_tls(
        &rig.work,
        "envoy-other-ca",
        ip,
        rig.switchyard.xds_port,
        Protocol::Sotw,
        rig.client_tls(&other),
    );
    rig.assert_refused(&envoy).await;
}

#[test]
fn tls_flags_go_together() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["standalone", "--config"])
        .arg(dir.path())
        .args(["--xds-address", &format!("127.0.0.1:{}", free_port())])
        .args(["--admin-address", &format!("127.0.0.1:{}", free_port())])
        .args(["--xds-tls-cert", "server.crt"])
        .output()
        .expect("run switchyard");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("go together"), "{stderr}");
}
