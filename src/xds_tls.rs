//! The xDS server's mutual TLS, taken up again whenever its files change: the server
//! certificate and key, and the client CA bundle (a Secret mounted as files, which the
//! kubelet updates in place; cert-manager renews it). Each new handshake uses what the
//! files hold now; connections already open keep theirs, so no Envoy's xDS stream is cut
//! by a rotation. Files that do not load (half written, a key that does not match its
//! certificate) leave the last good ones in use, and say so in the log and a metric.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use prometheus_client::metrics::counter::Counter;
use rustls::RootCertStore;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::{debug, info, warn};

/// How often the files are read for a change.
const RELOAD_EVERY: Duration = Duration::from_secs(1);
/// A client that has not completed its handshake by then is dropped.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

/// Where the server's certificate, its key and the client CA bundle are read from.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// The three files' bytes, to tell a change.
type Contents = [Vec<u8>; 3];

impl TlsFiles {
    fn read(&self) -> anyhow::Result<Contents> {
        let read = |path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))
        };
        Ok([read(&self.cert)?, read(&self.key)?, read(&self.client_ca)?])
    }
}

/// A server configuration from the files' contents: the certificate chain and its key,
/// and a client certificate required, signed by one of the CAs of the bundle.
fn server_config(files: &TlsFiles, [cert, key, ca]: &Contents) -> anyhow::Result<ServerConfig> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{}: not PEM certificates", files.cert.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "{}: no certificate",
        files.cert.display()
    );
    let key = PrivateKeyDer::from_pem_slice(key)
        .with_context(|| format!("{}: no PEM private key", files.key.display()))?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca) {
        let ca =
            ca.with_context(|| format!("{}: not PEM certificates", files.client_ca.display()))?;
        roots
            .add(ca)
            .with_context(|| format!("{}: a CA that cannot be used", files.client_ca.display()))?;
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "{}: no CA certificate",
        files.client_ca.display()
    );
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .context("the client CA bundle")?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .with_context(|| {
            format!(
                "{} and {}: the key does not match the certificate",
                files.cert.display(),
                files.key.display()
            )
        })?;
    // gRPC is HTTP/2.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The configuration new handshakes use, replaced when the files change.
#[derive(Clone)]
pub struct ReloadingTls {
    files: TlsFiles,
    current: Arc<RwLock<Arc<ServerConfig>>>,
    /// Contents of the last good load.
    loaded: Arc<RwLock<Contents>>,
}

impl ReloadingTls {
    /// Loads the files; an error here stops the server from starting.
    pub fn load(files: TlsFiles) -> anyhow::Result<ReloadingTls> {
        let contents = files.read()?;
        let config = server_config(&files, &contents)?;
        Ok(ReloadingTls {
            files,
            current: Arc::new(RwLock::new(Arc::new(config))),
            loaded: Arc::new(RwLock::new(contents)),
        })
    }

    fn config(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads the files again; takes them up when they changed and load. Ok(true) when
    /// they were taken up.
    pub fn reload(&self) -> anyhow::Result<bool> {
        let contents = self.files.read()?;
        if *self.loaded.read().unwrap_or_else(|p| p.into_inner()) == contents {
            return Ok(false);
        }
        let config = server_config(&self.files, &contents)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = contents;
        Ok(true)
    }

    /// Reloads every RELOAD_EVERY until dropped; a failure is told once per content.
    pub async fn keep_reloading(self, failures: Counter) {
        let mut last_error: Option<String> = None;
        loop {
            tokio::time::sleep(RELOAD_EVERY).await;
            match self.reload() {
                Ok(true) => {
                    last_error = None;
                    info!("the xDS TLS files changed: new connections use them");
                }
                Ok(false) => last_error = None,
                Err(error) => {
                    let text = format!("{error:#}");
                    if last_error.as_ref() != Some(&text) {
                        failures.inc();
                        warn!(error = %text, "the xDS TLS files do not load; the last good ones stay in use");
                        last_error = Some(text);
                    }
                }
            }
        }
    }

    /// Accepts connections on `address` and completes their handshakes (each on its own,
    /// with the configuration of that moment), for the gRPC server to serve.
    pub async fn incoming(
        &self,
        address: SocketAddr,
    ) -> anyhow::Result<impl futures::Stream<Item = io::Result<TlsStream<TcpStream>>> + use<>> {
        let listener = TcpListener::bind(address)
            .await
            .with_context(|| format!("binding the xDS address {address}"))?;
        let (tx, rx) = mpsc::channel(64);
        let tls = self.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of descriptors, say: the next accept may do.
                        warn!(%error, "accepting an xDS connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                if tx.is_closed() {
                    return;
                }
                let acceptor = TlsAcceptor::from(tls.config());
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send(Ok(stream)).await;
                        }
                        // An Envoy without the right certificate retries without end.
                        Ok(Err(error)) => debug!(%peer, %error, "xDS TLS handshake failed"),
                        Err(_) => debug!(%peer, "xDS TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|stream| (stream, rx))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &std::path::Path, bundle: &crate::certgen::Bundle) -> TlsFiles {
        let files = TlsFiles {
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
            client_ca: dir.join("ca.crt"),
        };
        std::fs::write(&files.cert, &bundle.server.cert_pem).expect("write");
        std::fs::write(&files.key, &bundle.server.key_pem).expect("write");
        std::fs::write(&files.client_ca, &bundle.ca.cert_pem).expect("write");
        files
    }

    fn bundle() -> crate::certgen::Bundle {
        crate::certgen::generate(&["127.0.0.1".to_string()], 1).expect("certgen")
    }

    #[test]
    fn unchanged_files_are_not_taken_up_again_and_changed_ones_are() {
        let dir = tempfile::tempdir().expect("dir");
        let files = write(dir.path(), &bundle());
        let tls = ReloadingTls::load(files.clone()).expect("load");
        let first = tls.config();
        assert!(!tls.reload().expect("reload"));
        assert!(Arc::ptr_eq(&first, &tls.config()));
        write(dir.path(), &bundle());
        assert!(tls.reload().expect("reload"));
        assert!(!Arc::ptr_eq(&first, &tls.config()));
    }

    #[test]
    fn files_that_do_not_load_leave_the_last_good_ones() {
        let dir = tempfile::tempdir().expect("dir");
        let first = bundle();
        let files = write(dir.path(), &first);
        let tls = ReloadingTls::load(files.clone()).expect("load");
        let good = tls.config();
        // Half written, then a key of another certificate.
        std::fs::write(&files.cert, "-----BEGIN CERTIFICATE-----\nMII").expect("write");
        assert!(tls.reload().is_err());
        std::fs::write(&files.cert, &first.server.cert_pem).expect("write");
        std::fs::write(&files.key, &bundle().server.key_pem).expect("write");
        let error = tls.reload().expect_err("a key of another certificate");
        assert!(format!("{error:#}").contains("does not match"), "{error:#}");
        std::fs::write(&files.client_ca, "").expect("write");
        assert!(tls.reload().is_err());
        assert!(Arc::ptr_eq(&good, &tls.config()));
    }

    #[test]
    fn a_bundle_of_two_cas_is_taken() {
        let dir = tempfile::tempdir().expect("dir");
        let files = write(dir.path(), &bundle());
        let both = format!("{}{}", bundle().ca.cert_pem, bundle().ca.cert_pem);
        std::fs::write(&files.client_ca, both).expect("write");
        ReloadingTls::load(files).expect("two CAs");
    }
}
