//! HTTPS clients that record which certificate each Envoy serves, and HTTPS load.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::load::{Answer, Turns, WORKERS};
use crate::{LoadReport, error_chain, traffic_runtime};

/// A short fingerprint of a certificate (DER): the first 16 hex digits of its SHA-256.
pub fn certificate_fingerprint(der: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The [`certificate_fingerprint`] of the first certificate in a PEM chain.
pub fn pem_fingerprint(pem: &str) -> String {
    use base64::Engine;
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .map(str::trim)
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .expect("a PEM certificate");
    certificate_fingerprint(&der)
}

/// Accepts whatever certificate the server shows (the rig's are self-signed), checking
/// only that the server holds its key. Tests only.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The TLS client of the HTTPS load: HTTP/1.1 by ALPN, any server certificate accepted,
/// no session resumption, so that every new connection is a full handshake and shows the
/// certificate the server holds now; with `identity`, it presents that client
/// certificate when the server asks for one.
pub fn tls_client(identity: Option<&ClientIdentity>) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)));
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(id) => builder
            .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
            .expect("a client certificate and its key"),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// [`tls_client`] without a client certificate, made once.
fn anonymous_client() -> Arc<rustls::ClientConfig> {
    static CONFIG: std::sync::OnceLock<Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();
    CONFIG.get_or_init(|| tls_client(None)).clone()
}

/// A client certificate (with its chain) and its private key.
pub struct ClientIdentity {
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
}

impl ClientIdentity {
    /// From PEM: the certificate chain and the private key.
    pub fn from_pem(chain: &str, key: &str) -> ClientIdentity {
        use rustls::pki_types::pem::PemObject;
        ClientIdentity {
            chain: rustls::pki_types::CertificateDer::pem_slice_iter(chain.as_bytes())
                .collect::<Result<_, _>>()
                .expect("PEM certificates"),
            key: rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())
                .expect("a PEM private key"),
        }
    }
}

/// One HTTPS connection (HTTP/1.1, kept alive until dropped) and the certificate it was
/// served.
pub struct HttpsConnection {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Empty<hyper::body::Bytes>>,
    /// [`certificate_fingerprint`] of the server's certificate.
    pub certificate: String,
}

/// One answer over HTTPS.
#[derive(Clone, Debug)]
pub struct HttpsAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpsAnswer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl HttpsConnection {
    /// Connects to `address` with SNI `host` (TCP and TLS handshake, at most 2 s).
    pub async fn connect(address: SocketAddr, host: &str) -> Result<HttpsConnection, String> {
        Self::connect_with(address, host, anonymous_client()).await
    }

    /// [`HttpsConnection::connect`] with the TLS client `client` ([`tls_client`]).
    pub async fn connect_with(
        address: SocketAddr,
        host: &str,
        client: Arc<rustls::ClientConfig>,
    ) -> Result<HttpsConnection, String> {
        let connecting = async {
            let tcp = tokio::net::TcpStream::connect(address)
                .await
                .map_err(|e| format!("connect {address}: {e}"))?;
            let _ = tcp.set_nodelay(true);
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| format!("server name {host:?}: {e}"))?;
            let tls = tokio_rustls::TlsConnector::from(client)
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS handshake with {address}: {}", error_chain(&e)))?;
            let certificate = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map_or_else(|| "-".to_string(), |c| certificate_fingerprint(c));
            let (sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                    .await
                    .map_err(|e| format!("HTTP/1.1 over TLS: {}", error_chain(&e)))?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok(HttpsConnection {
                sender,
                certificate,
            })
        };
        tokio::time::timeout(Duration::from_secs(2), connecting)
            .await
            .unwrap_or_else(|_| Err(format!("connect {address}: timed out")))
    }

    /// Whether the server closed the connection (or said it would).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// GET `path` for `host` on this connection (at most 2 s). `Err((sent, why))`: `sent`
    /// is false when the request never left (the connection was already closing), which a
    /// client may retry on a new connection.
    pub async fn get(&mut self, host: &str, path: &str) -> Result<HttpsAnswer, (bool, String)> {
        let exchange = async {
            self.sender
                .ready()
                .await
                .map_err(|e| (false, error_chain(&e)))?;
            let request = http::Request::get(path)
                .header(http::header::HOST, host)
                .body(http_body_util::Empty::new())
                .expect("a request");
            let response = self
                .sender
                .send_request(request)
                .await
                .map_err(|e| (!e.is_canceled(), error_chain(&e)))?;
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_string()))
                .collect();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .map_err(|e| (true, error_chain(&e)))?
                .to_bytes();
            Ok(HttpsAnswer {
                status,
                headers,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        };
        tokio::time::timeout(Duration::from_secs(2), exchange)
            .await
            .unwrap_or_else(|_| Err((true, "timed out".to_string())))
    }
}

/// One GET over a new HTTPS connection: the certificate served and the answer.
pub async fn https_get(
    address: SocketAddr,
    host: &str,
    path: &str,
) -> Result<(String, HttpsAnswer), String> {
    let mut connection = HttpsConnection::connect(address, host).await?;
    let answer = connection.get(host, path).await.map_err(|(_, e)| e)?;
    Ok((connection.certificate, answer))
}

/// Where and when the HTTPS load saw one certificate.
#[derive(Clone, Debug)]
pub struct CertificateSeen {
    /// Answers on connections that showed it.
    pub count: usize,
    /// The first and the last of them, from the start of the load.
    pub first: Duration,
    pub last: Duration,
}

/// Key of [`HttpsLoadReport::certificates`]: (target, fingerprint, on a new connection).
pub type CertificateKey = (String, String, bool);

/// What an HTTPS load saw: the answers, as for HTTP, and the certificates.
#[derive(Clone, Debug, Default)]
pub struct HttpsLoadReport {
    pub requests: LoadReport,
    pub certificates: BTreeMap<CertificateKey, CertificateSeen>,
    /// New connections opened (one per request on the fresh workers, one per connection
    /// lost on the kept-alive ones).
    pub connections: usize,
}

impl HttpsLoadReport {
    /// When `target` last showed another certificate than `fingerprint` on a new
    /// connection, and when it first showed `fingerprint` there.
    pub fn switch(&self, target: &str, fingerprint: &str) -> (Option<Duration>, Option<Duration>) {
        let mut last_other = None;
        let mut first_this = None;
        for ((t, f, fresh), seen) in &self.certificates {
            if t != target || !fresh {
                continue;
            }
            if f == fingerprint {
                first_this = Some(seen.first);
            } else {
                last_other = last_other.max(Some(seen.last));
            }
        }
        (last_other, first_this)
    }
}

/// Bounded HTTPS load: `rate` requests per second in total over every Envoy's HTTPS
/// listener in `targets` (SNI and Host `host`), for at most `duration`. Half the workers
/// open a new connection (a full handshake) for every request, so they see a new
/// certificate as soon as Envoy serves it; the other half keep one connection per target
/// alive as browsers do, and open a new one only when the server closes theirs. A request
/// that never left a closing kept-alive connection is sent again on a new one, as HTTP
/// clients do; every other error or non-2xx answer is a failure.
pub struct HttpsLoad {
    started: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
    report: Arc<Mutex<HttpsLoadReport>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl HttpsLoad {
    pub fn start(targets: Vec<SocketAddr>, host: &str, rate: u32, duration: Duration) -> HttpsLoad {
        Self::start_with(targets, host, rate, duration, anonymous_client())
    }

    /// [`HttpsLoad::start`] with the TLS client `client` ([`tls_client`]).
    pub fn start_with(
        targets: Vec<SocketAddr>,
        host: &str,
        rate: u32,
        duration: Duration,
        client: Arc<rustls::ClientConfig>,
    ) -> HttpsLoad {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let report = Arc::new(Mutex::new(HttpsLoadReport::default()));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..WORKERS {
            let mut turns = Turns::new(w, rate, started, duration, stop.clone());
            let report = report.clone();
            let targets = targets.clone();
            let host = host.to_string();
            let fresh = w % 2 == 0;
            let client = client.clone();
            tasks.push(traffic_runtime().spawn(async move {
                let mut kept: Vec<Option<HttpsConnection>> = targets.iter().map(|_| None).collect();
                while let Some(i) = turns.next().await {
                    let t = i % targets.len();
                    let address = targets[t];
                    let target = format!("https://{address}");
                    let sent = Instant::now();
                    let mut opened = 0;
                    // At most one new connection for a request that never left.
                    let mut result = Err("not sent".to_string());
                    let mut certificate = None;
                    for _attempt in 0..2 {
                        let slot = &mut kept[t];
                        if fresh || slot.as_ref().is_none_or(HttpsConnection::is_closed) {
                            *slot = None;
                            opened += 1;
                            match HttpsConnection::connect_with(address, &host, client.clone())
                                .await
                            {
                                Ok(c) => *slot = Some(c),
                                Err(e) => {
                                    result = Err(e);
                                    break;
                                }
                            }
                        }
                        let Some(connection) = slot.as_mut() else {
                            break;
                        };
                        certificate = Some(connection.certificate.clone());
                        match connection.get(&host, "/").await {
                            Ok(answer) => {
                                result = Ok(answer);
                                break;
                            }
                            Err((sent, e)) => {
                                *slot = None;
                                result = Err(e);
                                if sent || fresh {
                                    break;
                                }
                            }
                        }
                    }
                    if fresh {
                        kept[t] = None;
                    }
                    let at = started.elapsed();
                    let mut report = report.lock().unwrap_or_else(|p| p.into_inner());
                    report.connections += opened;
                    let (status, backend, headers, body) = match result {
                        Ok(a) => {
                            let backend = a.header("x-backend").unwrap_or("-").to_string();
                            (Some(a.status), backend, a.headers, a.body)
                        }
                        Err(e) => (None, "-".to_string(), Vec::new(), e),
                    };
                    let ok = report.requests.record(Answer {
                        at,
                        took: sent.elapsed(),
                        target: target.clone(),
                        status,
                        backend,
                        headers,
                        body,
                    });
                    if let Some(fingerprint) = certificate.filter(|_| ok) {
                        report
                            .certificates
                            .entry((target, fingerprint, fresh))
                            .and_modify(|s| {
                                s.count += 1;
                                s.last = at;
                            })
                            .or_insert(CertificateSeen {
                                count: 1,
                                first: at,
                                last: at,
                            });
                    }
                }
            }));
        }
        HttpsLoad {
            started,
            stop,
            report,
            tasks,
        }
    }

    /// When the load started: [`Failure::at`] and [`CertificateSeen`] count from here.
    pub fn started(&self) -> Instant {
        self.started
    }

    pub fn snapshot(&self) -> HttpsLoadReport {
        self.report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub async fn finish(self) -> HttpsLoadReport {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
        let mut report = self
            .report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        report.requests.elapsed = self.started.elapsed();
        report
    }
}
