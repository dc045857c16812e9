//! The API client's transport: a client's requests but its watches share one HTTP/2
//! connection, and a watch keeps a connection of its own (HTTP/1.1, as kube's client makes
//! every connection).
//!
//! kube's client speaks HTTP/1.1 only, so each request in flight holds a TLS connection of
//! its own, with its buffers, its dispatch channel and a place in the pool after. A leader
//! rolling out thousands of routes keeps hundreds of reads and writes in flight (256
//! reconciles at once, two reads each): the connections they opened held ≈ 13 MiB of the
//! operator's 105 MiB peak heap through a cold start of 2000 routes. client-go multiplexes
//! its requests on HTTP/2 (its watches too); here the requests do.
//!
//! Watches stay as they were: each lasts as long as the watch, and an API server caps the
//! streams of one HTTP/2 connection (`--http2-max-streams-per-connection`), so watches of
//! many namespaces on one connection could leave no stream for a write. hyper's pool
//! opens no second HTTP/2 connection when one is full.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper_rustls::FixedServerNameResolver;
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::{Client as HyperClient, connect::HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody, retry::RetryPolicy};
use tower::retry::RetryLayer;
use tower::util::{BoxCloneService, BoxService};
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};

/// What kube's client stack is: a request in, a response with a boxed body out.
pub type Transport = BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// The same, for the requests' stack, which every client built from it shares.
type Requests = BoxCloneService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// How often the HTTP/2 connection is pinged, requests in flight or not: a connection whose
/// peer stopped answering without closing it is found out (20 s after a ping, hyper's
/// default), and fails its requests instead of leaving them waiting; a load balancer
/// that drops idle connections keeps this one while hyper's pool does (90 s idle).
/// client-go pings after 30 s too.
const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// kube's client for `config`, with every request but a watch sent over HTTP/2.
pub fn builder(config: kube::Config) -> anyhow::Result<ClientBuilder<Split>> {
    let requests = requests_transport(&config)?;
    let builder = ClientBuilder::try_from(config).context("building the API client")?;
    Ok(builder.with_layer(&SplitLayer(requests)))
}

/// kube's own stack (base URI, retries of 429, 503 and 504, authentication, extra headers)
/// on a hyper client that offers HTTP/2 by ALPN and keeps what the API server accepts.
/// kube's per-request tracing span is left out: a failed request's error reaches its
/// caller, which reports it with its own context.
fn requests_transport(config: &kube::Config) -> anyhow::Result<Requests> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    // A request is several frames (headers, data, window updates), each its own write:
    // with Nagle's algorithm, the second waits for the API server's delayed ACK of the
    // first, ≈ 40 ms on each write (it doubled a route change's time to Ready).
    http.set_nodelay(true);
    // kube's TLS settings: its roots, client identity and reloading CA verifier.
    let tls = config
        .rustls_client_config()
        .context("TLS settings of the API client")?;
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name
            .clone()
            .try_into()
            .with_context(|| format!("tls-server-name {name:?} of the API client"))?;
        https = https.with_server_name_resolver(FixedServerNameResolver::new(name));
    }
    let mut connector = TimeoutConnector::new(https.enable_all_versions().wrap_connector(http));
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let client: HyperClient<_, Body> = HyperClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(KEEP_ALIVE)
        .http2_keep_alive_while_idle(true)
        .build(connector);
    let retry = config
        .default_retry
        .then(|| RetryLayer::new(RetryPolicy::server_retry()));
    let stack = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer().context("API client authentication")?)
        .layer(config.extra_headers_layer().context("API client headers")?)
        .map_err(BoxError::from)
        .service(client)
        .map_response(|response| {
            response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)
        });
    Ok(BoxCloneService::new(Opening::new(BoxCloneService::new(
        stack,
    ))))
}

/// Until a request was answered, the connection is still to be opened: the requests that
/// come meanwhile wait for that answer instead of each starting a connection of its own.
/// hyper starts a connect per request until one of them has negotiated HTTP/2, then drops
/// the others: at a leader's start, hundreds of TLS handshakes for one connection kept.
/// A request that fails (no connection, or a broken one) leaves the next to go alone
/// again.
#[derive(Clone)]
struct Opening {
    inner: Requests,
    /// A request was answered, and none failed since.
    open: Arc<AtomicBool>,
    /// Held by the one request that may open the connection.
    first: Arc<tokio::sync::Mutex<()>>,
}

impl Opening {
    fn new(inner: Requests) -> Self {
        Self {
            inner,
            open: Arc::default(),
            first: Arc::default(),
        }
    }
}

impl Service<Request<Body>> for Opening {
    type Response = Response<Box<DynBody>>;
    type Error = BoxError;
    type Future = <Requests as Service<Request<Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if self.open.load(Ordering::Acquire) {
            return answered(self.inner.call(request), self.open.clone());
        }
        let (inner, open, first) = (self.inner.clone(), self.open.clone(), self.first.clone());
        Box::pin(async move {
            let alone = first.lock().await;
            if open.load(Ordering::Acquire) {
                // Opened while this one waited: no need to go alone.
                drop(alone);
            }
            answered(inner.oneshot(request), open).await
        })
    }
}

/// `response`, noting in `open` whether the connection answered.
fn answered(
    response: impl Future<Output = Result<Response<Box<DynBody>>, BoxError>> + Send + 'static,
    open: Arc<AtomicBool>,
) -> <Requests as Service<Request<Body>>>::Future {
    Box::pin(async move {
        let response = response.await;
        open.store(response.is_ok(), Ordering::Release);
        response
    })
}

/// Puts [`Split`] under kube's client layers: what it is given is the stack kube built,
/// for the watches.
pub struct SplitLayer(Requests);

impl Layer<Transport> for SplitLayer {
    type Service = Split;

    fn layer(&self, watches: Transport) -> Split {
        Split {
            watches,
            requests: self.0.clone(),
        }
    }
}

/// Sends a watch on `watches` and any other request on `requests`.
pub struct Split {
    watches: Transport,
    requests: Requests,
}

impl Service<Request<Body>> for Split {
    type Response = Response<Box<DynBody>>;
    type Error = BoxError;
    type Future = <Transport as Service<Request<Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Either may take the next request: both must be ready (hyper's clients always are).
        match self.watches.poll_ready(cx)? {
            Poll::Ready(()) => self.requests.poll_ready(cx),
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        match is_watch(request.uri()) {
            true => self.watches.call(request),
            false => self.requests.call(request),
        }
    }
}

/// True for a watch (`?watch=true`, or `1` as the API server also takes): a request whose
/// response lasts as long as the watch.
pub fn is_watch(uri: &http::Uri) -> bool {
    let query = uri.query().unwrap_or_default();
    query
        .split('&')
        .any(|pair| matches!(pair, "watch=true" | "watch=1"))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use http_body_util::{Full, StreamBody};
    use hyper::body::{Bytes, Frame, Incoming};
    use hyper_util::rt::TokioIo;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, WatchParams};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    use tokio::net::TcpListener;
    use tokio_rustls::TlsAcceptor;

    use super::*;

    /// The protocol of every connection a fake API server accepted.
    type Accepted = Arc<Mutex<Vec<Option<Vec<u8>>>>>;

    /// A TLS server that offers HTTP/2 and HTTP/1.1, as the API server does: a GET of a
    /// ConfigMap answers one; a watch answers its headers and then nothing, for ever.
    async fn fake_api_server() -> (kube::Config, Accepted) {
        let bundle = crate::certgen::generate(&["127.0.0.1".to_owned()], 1).expect("certificates");
        let key = PrivateKeyDer::from_pem_slice(bundle.server.key_pem.as_bytes()).expect("key");
        let cert = CertificateDer::from(bundle.server.cert_der.clone());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .expect("server certificate");
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let accepted = Accepted::default();
        let seen = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    continue;
                };
                let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                seen.lock().expect("lock").push(alpn.clone());
                let io = TokioIo::new(stream);
                let service = hyper::service::service_fn(answer);
                tokio::spawn(async move {
                    let _ = match alpn.as_deref() {
                        Some(b"h2") => {
                            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                .serve_connection(io, service)
                                .await
                        }
                        _ => {
                            hyper::server::conn::http1::Builder::new()
                                .serve_connection(io, service)
                                .await
                        }
                    };
                });
            }
        });
        let url = format!("https://{address}").parse().expect("URL");
        let mut config = kube::Config::new(url);
        config.root_cert = Some(vec![bundle.ca.cert_der.clone()]);
        (config, accepted)
    }

    type ServerBody = http_body_util::Either<
        Full<Bytes>,
        StreamBody<futures::stream::Pending<Result<Frame<Bytes>, std::io::Error>>>,
    >;

    async fn answer(request: Request<Incoming>) -> Result<Response<ServerBody>, std::io::Error> {
        let body = match is_watch(request.uri()) {
            true => http_body_util::Either::Right(StreamBody::new(futures::stream::pending())),
            false => {
                let map = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}"#;
                http_body_util::Either::Left(Full::new(Bytes::from_static(map.as_bytes())))
            }
        };
        Ok(Response::new(body))
    }

    /// A fake connection: the first request fails, the others are answered after a while;
    /// counts the requests in flight at most, before any was answered and after.
    #[derive(Clone, Default)]
    struct Counted {
        calls: Arc<std::sync::atomic::AtomicUsize>,
        in_flight: Arc<std::sync::atomic::AtomicUsize>,
        answered: Arc<AtomicBool>,
        /// (in flight at most before any request was answered, at most after)
        most: Arc<Mutex<(usize, usize)>>,
    }

    impl Counted {
        async fn call(self) -> Result<Response<Box<DynBody>>, BoxError> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            {
                let mut most = self.most.lock().expect("lock");
                match self.answered.load(Ordering::SeqCst) {
                    false => most.0 = most.0.max(now),
                    true => most.1 = most.1.max(now),
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            if call == 0 {
                return Err("no connection".into());
            }
            self.answered.store(true, Ordering::SeqCst);
            let body = Full::new(Bytes::new()).map_err(BoxError::from);
            Ok(Response::new(Box::new(body) as Box<DynBody>))
        }
    }

    #[tokio::test]
    async fn until_a_request_is_answered_requests_go_one_at_a_time() {
        let counted = Counted::default();
        let fake = counted.clone();
        let inner = tower::service_fn(move |_: Request<Body>| fake.clone().call());
        let opening = Opening::new(BoxCloneService::new(inner));
        let send = |opening: &Opening| {
            let opening = opening.clone();
            async move { opening.oneshot(Request::new(Body::empty())).await }
        };
        let sent = futures::future::join_all((0..10).map(|_| send(&opening))).await;
        // The first failed; the second went alone too, and was answered; the rest went on
        // together: until one was answered, none started beside another.
        assert_eq!(sent.iter().filter(|s| s.is_err()).count(), 1);
        let most = *counted.most.lock().expect("lock");
        assert_eq!(most.0, 1, "before any answer: {most:?}");
        assert!(most.1 > 1, "after one: {most:?}");
    }

    #[tokio::test]
    async fn requests_share_one_http2_connection_and_each_watch_has_its_own() {
        let (config, accepted) = fake_api_server().await;
        let client = builder(config).expect("client").build();
        let maps: Api<ConfigMap> = Api::namespaced(client, "a");
        // From cold: the first of them opens the connection, the others wait for it.
        let gets = (0..50).map(|_| maps.get("a"));
        for got in futures::future::join_all(gets).await {
            assert_eq!(got.expect("a GET").metadata.name.as_deref(), Some("a"));
        }
        let mut watches = Vec::new();
        for _ in 0..3 {
            watches.push(
                maps.watch(&WatchParams::default(), "0")
                    .await
                    .expect("a watch"),
            );
        }
        maps.get("a").await.expect("a GET beside the watches");
        let accepted = accepted.lock().expect("lock").clone();
        // kube's connector offers no ALPN: the server speaks HTTP/1.1, as the API server does.
        let h2 = accepted
            .iter()
            .filter(|a| a.as_deref() == Some(b"h2"))
            .count();
        let h1 = accepted.iter().filter(|a| a.is_none()).count();
        assert_eq!((h2, h1, accepted.len()), (1, 3, 4), "{accepted:?}");
    }

    #[test]
    fn a_watch_is_told_by_its_query() {
        let watch = |uri: &str| is_watch(&uri.parse().expect("a URI"));
        assert!(watch(
            "/api/v1/services?watch=true&resourceVersion=5&timeoutSeconds=290"
        ));
        assert!(watch(
            "/apis/switchyard.dev/v1/proxyconfigs?labelSelector=a&watch=1"
        ));
        assert!(!watch("/api/v1/services?resourceVersion=5"));
        assert!(!watch("/api/v1/namespaces/a/services/watch"));
        assert!(!watch("/api/v1/services?allowWatchBookmarks=true"));
        assert!(!watch("/api/v1/services?watch=false"));
        assert!(!watch("/api/v1/services"));
    }
}
