//! Mutual TLS between Envoy and the xDS server, with real Envoys on 127.0.0.x: certificates
//! from `switchyard certgen`, a standalone Switchyard started with the TLS flags. An Envoy
//! with the client certificate is served; one without a client certificate, or with one
//! from another CA, never gets configuration and never shows up as a node.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard::bootstrap::XdsTls;
use switchyard::xds::Protocol;
use switchyard_e2e::{Backend, Envoy, Load, Switchyard, free_port, write_route};

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

    /// Routes web.test to `backend` (named `service`) from now on.
    fn route_to(&self, service: &str, backend: &Backend) {
        write_route(
            &self.config,
            "web.test",
            self.http_port,
            self.probe_port,
            &[(service, backend)],
        );
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
    rig.route_to("other", &other);
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

/// Writes `text` to `path` as the kubelet updates a mounted Secret: a new file renamed
/// over the old, so that a reader never sees half of it.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).expect("read")
}

/// The certificate the xDS server presents to a new connection from a client with the
/// certificate and key in `client` (a certgen directory) that trusts `trust` (PEM); an
/// error when the handshake fails.
async fn presented_certificate(port: u16, trust: &str, client: &Path) -> Result<Vec<u8>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(trust.as_bytes()) {
        roots
            .add(ca.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(client.join("client.crt"))
            .map_err(|e| e.to_string())?
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_file(client.join("client.key")).map_err(|e| e.to_string())?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .map_err(|e| e.to_string())?;
    let mut config = config;
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let mut tls = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timed out".to_string())?
        .map_err(|e| e.to_string())?;
    // TLS 1.3 tells a refused client certificate after the handshake: read until the
    // server speaks (HTTP/2 settings) or closes.
    use tokio::io::AsyncReadExt;
    let mut first = [0u8; 1];
    match tokio::time::timeout(Duration::from_secs(2), tls.read(&mut first)).await {
        Ok(Ok(n)) if n > 0 => {}
        Ok(Ok(_)) => return Err("closed by the server".into()),
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err("the server said nothing".into()),
    }
    let (_, session) = tls.get_ref();
    session
        .peer_certificates()
        .and_then(|certs| certs.first())
        .map(|c| c.to_vec())
        .ok_or_else(|| "no server certificate".to_string())
}

fn der(pem_path: &Path) -> Vec<u8> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    CertificateDer::from_pem_file(pem_path)
        .expect("a PEM certificate")
        .to_vec()
}

/// Polls `check` every 100 ms for up to 10 s; panics with `what` if it never holds.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < Duration::from_secs(10), "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("{what}: after {:?}", started.elapsed());
}

/// A CA rotation, as cert-manager and the kubelet perform it, under load through a real
/// Envoy and without a restart: first the client CA bundle takes the new CA beside the old,
/// then the server certificate is replaced by one the new CA signed (its key written a
/// moment later, as two files are). New connections see each step within a couple of
/// seconds; the Envoy's xDS stream from before stays open throughout and keeps following
/// changes; files that do not load leave the last good ones serving; no request fails.
#[tokio::test]
async fn certificates_rotated_under_load_are_taken_up_without_a_restart() {
    let (ip, other_ip) = ("127.0.0.74", "127.0.0.75");
    let backend = Backend::start("web", ip).await;
    let rig = Rig::start(&backend);
    let port = rig.switchyard.xds_port;
    let next = rig.work.join("next");
    certgen(&next);
    // Envoys trust both CAs for the server, as the first step of a CA rotation asks.
    let trust = rig.work.join("trust.crt");
    let both_cas = format!(
        "{}{}",
        read(&rig.certs.join("ca.crt")),
        read(&next.join("ca.crt"))
    );
    std::fs::write(&trust, &both_cas).expect("write");
    let client_tls = |dir: &Path| XdsTls {
        cert: dir.join("client.crt").display().to_string(),
        key: dir.join("client.key").display().to_string(),
        ca: trust.display().to_string(),
    };
    let envoy = Envoy::start_with_tls(
        &rig.work,
        "envoy-before",
        ip,
        port,
        Protocol::Delta,
        client_tls(&rig.certs),
    );
    rig.switchyard.wait_synced(1, Duration::from_secs(20)).await;
    let url = format!("http://{ip}:{}/", rig.http_port);
    eventually("served through the Envoy", || async {
        matches!(get(&url, "web.test").await, Ok((200, body)) if body == "web")
    })
    .await;
    let stream_of = |nodes: serde_json::Value| nodes["nodes"][0]["stream"].as_u64();
    let stream = stream_of(rig.switchyard.nodes().await);
    assert!(stream.is_some());
    let load = Load::start(
        vec![format!("http://{ip}:{}", rig.http_port)],
        "web.test",
        200,
        Duration::from_secs(120),
    );

    // Before: the new CA's clients are refused, the old server certificate is presented.
    let old_server = der(&rig.certs.join("server.crt"));
    assert_eq!(
        presented_certificate(port, &both_cas, &rig.certs).await,
        Ok(old_server.clone())
    );
    assert!(presented_certificate(port, &both_cas, &next).await.is_err());

    // Step 1: the client CA bundle holds both CAs.
    replace(&rig.certs.join("ca.crt"), &both_cas);
    eventually("a client of the new CA is accepted", || async {
        presented_certificate(port, &both_cas, &next).await.is_ok()
    })
    .await;
    // Step 2: the server certificate of the new CA, its key a moment later.
    replace(
        &rig.certs.join("server.crt"),
        &read(&next.join("server.crt")),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        presented_certificate(port, &both_cas, &rig.certs).await,
        Ok(old_server),
        "a certificate without its key is not taken: the last good pair serves"
    );
    replace(
        &rig.certs.join("server.key"),
        &read(&next.join("server.key")),
    );
    let new_server = der(&next.join("server.crt"));
    eventually("the new server certificate is presented", || async {
        presented_certificate(port, &both_cas, &next).await == Ok(new_server.clone())
    })
    .await;
    // A broken bundle is not taken either.
    replace(
        &rig.certs.join("ca.crt"),
        "-----BEGIN CERTIFICATE-----\nMII",
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        presented_certificate(port, &both_cas, &next).await,
        Ok(new_server.clone())
    );

    // A new Envoy with a certificate of the new CA is served.
    let newcomer = Envoy::start_with_tls(
        &rig.work,
        "envoy-after",
        other_ip,
        port,
        Protocol::Sotw,
        client_tls(&next),
    );
    rig.switchyard.wait_synced(2, Duration::from_secs(20)).await;
    let other_url = format!("http://{other_ip}:{}/", rig.http_port);
    eventually("served through the new Envoy", || async {
        matches!(get(&other_url, "web.test").await, Ok((200, body)) if body == "web")
    })
    .await;
    // The first Envoy's stream is the one it opened before the rotation, and it follows a
    // change made after it.
    let nodes = rig.switchyard.nodes().await;
    let before = nodes["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["node_id"] == "envoy-before")
        .and_then(|n| n["stream"].as_u64());
    assert_eq!(
        before, stream,
        "the xDS stream from before the rotation: {nodes:#}"
    );
    let other = Backend::start("other", ip).await;
    rig.route_to("other", &other);
    eventually(
        "the change after the rotation reaches both Envoys",
        || async {
            matches!(get(&url, "web.test").await, Ok((200, body)) if body == "other")
                && matches!(get(&other_url, "web.test").await, Ok((200, body)) if body == "other")
        },
    )
    .await;
    let report = load.finish().await;
    eprintln!(
        "rotation under load: {} requests, by status {:?}",
        report.sent, report.by_status
    );
    assert!(report.sent > 0);
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
    let stats = envoy
        .admin("/stats?filter=^cluster\\.switchyard-xds\\.upstream_cx_total$")
        .await;
    assert_eq!(
        stats.trim(),
        "cluster.switchyard-xds.upstream_cx_total: 1",
        "the first Envoy never reconnected"
    );
    drop(newcomer);
}
