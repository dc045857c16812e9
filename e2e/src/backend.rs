//! HTTP backends that answer with their name, and can fail or slow down on demand.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::traffic_runtime;

/// The path of a backend's health endpoint: 200, or 503 once told it is unhealthy.
pub const HEALTH_PATH: &str = "/healthz";

/// The path where a backend takes WebSocket upgrades: it answers each text message with
/// its name and the message, "name: message".
pub const WEBSOCKET_PATH: &str = "/ws";

/// An HTTP server on `address` that answers every request with its name (and
/// [`HEALTH_PATH`] with its health, [`WEBSOCKET_PATH`] with a WebSocket).
pub struct Backend {
    pub name: String,
    pub address: SocketAddr,
    behaviour: Arc<Behaviour>,
    task: tokio::task::JoinHandle<()>,
    /// Set when the backend stops: its WebSockets close, as a stopped process's would.
    stopped: tokio::sync::watch::Sender<bool>,
}

/// How a backend answers: told to fail a number of requests, or to be slow.
#[derive(Default)]
struct Behaviour {
    /// Requests still to answer with `fail_status`.
    fail_next: std::sync::atomic::AtomicUsize,
    fail_status: std::sync::atomic::AtomicU16,
    delay_ms: std::sync::atomic::AtomicU64,
    /// `GET /healthz` answers 503 (a health check endpoint that fails).
    unhealthy: std::sync::atomic::AtomicBool,
    /// Requests for `/healthz` seen so far.
    health_checks: std::sync::atomic::AtomicUsize,
    /// Other requests seen so far (answered or failed).
    requests: std::sync::atomic::AtomicUsize,
}

impl Backend {
    pub async fn start(name: &str, ip: &str) -> Backend {
        let ip: std::net::IpAddr = ip.parse().expect("a backend IP");
        Self::start_on(name, SocketAddr::new(ip, 0)).await
    }

    /// A backend on `address` (port 0: any free one).
    pub async fn start_on(name: &str, address: SocketAddr) -> Backend {
        Self::serve(name, address, None).await
    }

    /// [`Backend::start`] over TLS, with the certificate chain and key `identity` (PEM):
    /// HTTP/1.1 inside.
    /// With `client_ca` (PEM), only a client presenting a certificate of that authority
    /// completes the handshake.
    pub async fn start_tls(
        name: &str,
        ip: &str,
        identity: (&str, &str),
        client_ca: Option<&str>,
    ) -> Backend {
        let ip: std::net::IpAddr = ip.parse().expect("a backend IP");
        let acceptor = tls_acceptor(identity, client_ca);
        Self::serve(name, SocketAddr::new(ip, 0), Some(acceptor)).await
    }

    async fn serve(
        name: &str,
        address: SocketAddr,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Backend {
        let listener = std::net::TcpListener::bind(address)
            .unwrap_or_else(|e| panic!("bind backend {name} on {address}: {e}"));
        listener.set_nonblocking(true).expect("nonblocking backend");
        let listener = {
            let _runtime = traffic_runtime().enter();
            tokio::net::TcpListener::from_std(listener).expect("backend listener")
        };
        let address = listener.local_addr().expect("backend address");
        let behaviour = Arc::new(Behaviour::default());
        let (stopped, stopping) = tokio::sync::watch::channel(false);
        let app = app(name, address, &behaviour, stopping);
        let task = match tls {
            None => traffic_runtime().spawn(async move {
                let _ = axum::serve(listener, app).await;
            }),
            Some(acceptor) => traffic_runtime().spawn(serve_tls(listener, acceptor, app)),
        };
        Backend {
            name: name.to_string(),
            address,
            behaviour,
            task,
            stopped,
        }
    }

    /// The next `count` requests get `status` (then it answers 200 again).
    pub fn fail_next(&self, count: usize, status: u16) {
        use std::sync::atomic::Ordering::SeqCst;
        self.behaviour.fail_status.store(status, SeqCst);
        self.behaviour.fail_next.store(count, SeqCst);
    }

    /// Makes `GET /healthz` answer 503 (true) or 200 (false).
    pub fn set_unhealthy(&self, unhealthy: bool) {
        self.behaviour
            .unhealthy
            .store(unhealthy, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many `GET /healthz` the backend has answered.
    pub fn health_checks_seen(&self) -> usize {
        self.behaviour
            .health_checks
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many requests other than health checks and WebSockets the backend has seen.
    pub fn requests_seen(&self) -> usize {
        self.behaviour
            .requests
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Every answer waits this long first (zero: answer at once).
    pub fn slow_down(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.behaviour
            .delay_ms
            .store(ms, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The backend's routes: its health, its WebSocket echo, and its name for anything else.
fn app(
    name: &str,
    address: SocketAddr,
    behaviour: &Arc<Behaviour>,
    stopping: tokio::sync::watch::Receiver<bool>,
) -> axum::Router {
    let body = name.to_string();
    // Which Pod answered, when the Pods of a Service share its name.
    let at = address.to_string();
    let state = behaviour.clone();
    let health = behaviour.clone();
    let app = axum::Router::new().route(
        HEALTH_PATH,
        axum::routing::get(move || {
            let health = health.clone();
            async move {
                use std::sync::atomic::Ordering::SeqCst;
                health.health_checks.fetch_add(1, SeqCst);
                if health.unhealthy.load(SeqCst) {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                } else {
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    let ws_name = name.to_string();
    let app = app.route(
        WEBSOCKET_PATH,
        axum::routing::get(move |upgrade: axum::extract::ws::WebSocketUpgrade| {
            let (name, stopping) = (ws_name.clone(), stopping.clone());
            async move { upgrade.on_upgrade(move |socket| echo_with_name(socket, name, stopping)) }
        }),
    );
    app.fallback(move || {
        let body = body.clone();
        let at = at.clone();
        let state = state.clone();
        async move {
            use std::sync::atomic::Ordering::SeqCst;
            state.requests.fetch_add(1, SeqCst);
            let delay = state.delay_ms.load(SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let failing = state
                .fail_next
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok();
            let status = if failing {
                axum::http::StatusCode::from_u16(state.fail_status.load(SeqCst))
                    .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR)
            } else {
                axum::http::StatusCode::OK
            };
            let headers = [
                ("x-backend", body.clone()),
                ("x-backend-address", at.clone()),
            ];
            (status, headers, body)
        }
    })
}

/// Answers each text message with "name: message" until the client closes or the backend
/// stops (then the connection just ends, as when a process exits).
async fn echo_with_name(
    mut socket: axum::extract::ws::WebSocket,
    name: String,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    use axum::extract::ws::Message;
    loop {
        // Biased, the stop first: a message that arrives after the backend stopped must
        // find it stopped (unbiased, select! may pick the message when both are ready).
        let message = tokio::select! {
            biased;
            _ = stopping.wait_for(|stopped| *stopped) => return,
            message = socket.recv() => message,
        };
        let Some(Ok(message)) = message else {
            return;
        };
        if let Message::Text(text) = message {
            let answer = format!("{name}: {}", text.as_str());
            if socket.send(Message::Text(answer.into())).await.is_err() {
                return;
            }
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stopped.send_replace(true);
        self.task.abort();
    }
}

/// A TLS server configuration with the certificate chain and key `identity` (PEM),
/// HTTP/1.1 by ALPN; with `client_ca`, requiring a client certificate it issued.
fn tls_acceptor((chain, key): (&str, &str), client_ca: Option<&str>) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    let certificates = |pem: &str| {
        rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("PEM certificates")
    };
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("a PEM key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("TLS versions");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in certificates(ca) {
                roots.add(certificate).expect("a CA certificate");
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .expect("a client certificate verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certificates(chain), key)
        .expect("a certificate and its key");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// Serves `app` over TLS on `listener`: a task per connection, a failed handshake ends
/// only its own.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    app: axum::Router,
) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .with_upgrades()
                .await;
        });
    }
}
