//! The ADS gRPC service: a thin loop per stream around a [`Session`], and the response
//! body that encodes the session's responses as the stream takes them.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{Ready, ready};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use futures::{Stream, StreamExt};
use http_body::Frame;
use tokio::sync::mpsc;
use tonic::Status;
use tonic::body::Body;
use tonic::codec::{Codec, Streaming};
use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic_prost::ProstCodec;
use tracing::{Instrument, debug, info, info_span, warn};

use super::session::{Event, Ordering, Protocol, Response, Session, SessionStatus};
use super::snapshot::{CLUSTER, ROUTE, short_type};
use super::wire::Frames;
use super::{Desired, NodeReport, Nodes, RouteVerdict};
use crate::metrics::{Metrics, TypeLabel};

fn is_draining(
    draining: &std::collections::BTreeSet<String>,
    node: Option<&envoy_types::pb::envoy::config::core::v3::Node>,
) -> bool {
    node.is_some_and(|n| draining.contains(&n.id))
}

#[derive(Clone)]
pub struct AdsServer {
    desired: Arc<Desired>,
    nodes: Nodes,
    metrics: Metrics,
    ordering: Ordering,
    /// A stream whose Envoy answers no response for this long is closed (see
    /// [`AdsServer::with_answer_timeout`]).
    answer_timeout: Duration,
    next_stream: Arc<AtomicU64>,
}

/// How long an Envoy may leave a response unanswered by default: longer than it holds the
/// ACK of a cluster response while a new cluster warms (its initial-fetch timeout, 15 s).
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

enum Incoming {
    Sotw(DiscoveryRequest),
    Delta(DeltaDiscoveryRequest),
}

type Inbound = Pin<Box<dyn Stream<Item = Result<Incoming, Status>> + Send>>;
/// What a stream's loop hands to its response body: a response, or the status it ended with.
type Outbound = Result<Response, Status>;

impl AdsServer {
    pub fn new(desired: Arc<Desired>, nodes: Nodes, metrics: Metrics, ordering: Ordering) -> Self {
        if ordering == Ordering::AllAtOnce {
            warn!("make-before-break ordering is OFF: Envoys will drop requests during switches");
        }
        Self {
            desired,
            nodes,
            metrics,
            ordering,
            answer_timeout: DEFAULT_ANSWER_TIMEOUT,
            next_stream: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Closes a stream whose Envoy has answered (ACK or NACK) nothing for `timeout` while
    /// a response waits for its answer (counted from when the response was handed to the
    /// stream, or from the last answer if that came later): a stream that makes no
    /// progress, whatever holds it (a stuck connection, a proxy on the way). Envoy
    /// connects again, to another replica if its Service picks one, and is served afresh.
    pub fn with_answer_timeout(mut self, timeout: Duration) -> Self {
        self.answer_timeout = timeout;
        self
    }

    pub fn into_service(self) -> AdsService {
        AdsService(self)
    }

    /// Spawns the loop of one stream; responses come out of the returned channel.
    fn start(
        &self,
        protocol: Protocol,
        peer: String,
        inbound: Inbound,
    ) -> mpsc::Receiver<Outbound> {
        let (tx, rx) = mpsc::channel(16);
        let stream = self.next_stream.fetch_add(1, AtomicOrdering::Relaxed);
        let span = info_span!("xds_stream", stream, ?protocol, %peer, node = tracing::field::Empty);
        let session = Session::new(protocol, self.ordering)
            .with_accepted(self.desired.accepted().clone())
            .with_in_parts(self.desired.in_parts().clone());
        let this = self.clone();
        tokio::spawn(
            async move {
                this.metrics.connected_nodes.inc();
                let connected_at = SystemTime::now();
                let result = this
                    .run(session, stream, &peer, connected_at, inbound, &tx)
                    .await;
                this.metrics.connected_nodes.dec();
                this.nodes.remove(stream);
                match result {
                    Ok(()) => info!("stream closed"),
                    Err(status) => {
                        info!(code = ?status.code(), message = status.message(), "stream ended");
                        // Envoy sees why; it is gone already if the send fails.
                        let _ = tx.send(Err(status)).await;
                    }
                }
            }
            .instrument(span),
        );
        rx
    }

    async fn run(
        &self,
        mut session: Session,
        stream: u64,
        peer: &str,
        connected_at: SystemTime,
        mut inbound: Inbound,
        tx: &mpsc::Sender<Outbound>,
    ) -> Result<(), Status> {
        let mut desired = self.desired.subscribe();
        let mut draining = self.nodes.draining();
        let mut sent_at: HashMap<String, Instant> = HashMap::new();
        let mut last_answer = Instant::now();
        let mut named = false;
        // What the registry last heard from this stream: most messages change nothing
        // the rest of the program looks at, and every update wakes its watchers.
        let mut reported: Option<Arc<SessionStatus>> = None;
        // The gate may already be open.
        let mut initial = desired.borrow_and_update().clone();
        loop {
            // Since when Envoy has answered nothing although a response waits for it: the
            // oldest unanswered response, or its last answer if that came later.
            let unanswered_since = session
                .pending_nonces()
                .filter_map(|nonce| sent_at.get(nonce))
                .min()
                .map(|oldest| (*oldest).max(last_answer));
            let stalled = async {
                match unanswered_since {
                    Some(since) => {
                        tokio::time::sleep_until((since + self.answer_timeout).into()).await
                    }
                    None => std::future::pending().await,
                }
            };
            let responses = if let Some(snapshot) = initial.take() {
                session.set_desired(snapshot, Instant::now())
            } else {
                tokio::select! {
                    () = stalled => {
                        self.metrics.streams_unanswered.inc();
                        warn!(timeout = ?self.answer_timeout, "Envoy answered no response in time: closing the stream so that it connects again");
                        return Err(Status::unavailable(format!(
                            "no answer to a response for {:?}: connect again",
                            self.answer_timeout
                        )));
                    }
                    message = inbound.next() => match message {
                        None => return Ok(()),
                        Some(Err(status)) => return Err(status),
                        Some(Ok(Incoming::Sotw(request))) => session.on_sotw_request(request, Instant::now()),
                        Some(Ok(Incoming::Delta(request))) => session.on_delta_request(request, Instant::now()),
                    },
                    changed = desired.changed() => {
                        if changed.is_err() {
                            return Err(Status::unavailable("control plane shutting down"));
                        }
                        match desired.borrow_and_update().clone() {
                            Some(snapshot) => session.set_desired(snapshot, Instant::now()),
                            None => Vec::new(),
                        }
                    }
                    Ok(()) = draining.changed() => {
                        let drain = is_draining(&draining.borrow_and_update(), session.node());
                        session.set_draining(drain, Instant::now())
                    }
                }
            };
            let mut responses = responses;
            if !named && session.node().is_some() {
                // The node's name is known now: it may be one that is draining already.
                let drain = is_draining(&draining.borrow(), session.node());
                responses.extend(session.set_draining(drain, Instant::now()));
            }
            let mut just_named = false;
            if !named && let Some(node) = session.node() {
                tracing::Span::current().record("node", node.id.as_str());
                info!(cluster = %node.cluster, "node connected");
                named = true;
                just_named = true;
            }
            let events = session.take_events();
            let answered = events.iter().any(|e| {
                matches!(
                    e,
                    Event::Acked { .. } | Event::Nacked { .. } | Event::RoutesInParts { .. }
                )
            });
            if answered {
                last_answer = Instant::now();
            }
            if !events.is_empty() {
                let node = session.node().map(|n| n.id.as_str()).unwrap_or_default();
                self.record(node, session.protocol(), events, &mut sent_at);
            }
            for response in responses {
                if tx.send(Ok(response)).await.is_err() {
                    return Ok(());
                }
            }
            let status = session.status();
            if just_named || reported.as_deref() != Some(&status) {
                let status = Arc::new(status);
                reported = Some(status.clone());
                self.nodes.update(NodeReport {
                    stream,
                    node_id: session.node().map(|n| n.id.clone()).unwrap_or_default(),
                    cluster: session
                        .node()
                        .map(|n| n.cluster.clone())
                        .unwrap_or_default(),
                    peer: peer.to_string(),
                    connected_at,
                    status,
                });
            }
        }
    }

    fn record(
        &self,
        node: &str,
        protocol: Protocol,
        events: Vec<Event>,
        sent_at: &mut HashMap<String, Instant>,
    ) {
        for event in events {
            match event {
                Event::Sent {
                    type_url,
                    nonce,
                    version,
                    resources,
                    removed,
                } => {
                    debug!(r#type = short_type(&type_url), %nonce, %version, resources, removed, "sent");
                    self.metrics
                        .pushes
                        .get_or_create(&TypeLabel::of(&type_url))
                        .inc();
                    sent_at.insert(nonce, Instant::now());
                }
                Event::Acked {
                    type_url,
                    nonce,
                    version,
                    resources,
                } => {
                    if type_url == ROUTE {
                        for config in resources.values().filter(|r| r.has_content()) {
                            self.nodes
                                .report_verdict(RouteVerdict::Accepted(config.clone()));
                        }
                    }
                    // (A delta node's set may hold entries without content, named by its
                    // initial versions: no SotW response could carry them.)
                    if type_url == CLUSTER && protocol == Protocol::Sotw {
                        self.desired.accepted().remember(&version, &resources);
                    }
                    debug!(r#type = short_type(&type_url), %nonce, %version, "acked");
                    let label = TypeLabel::of(&type_url);
                    self.metrics.acks.get_or_create(&label).inc();
                    if let Some(at) = sent_at.remove(&nonce) {
                        self.metrics
                            .push_ack_seconds
                            .get_or_create(&label)
                            .observe(at.elapsed().as_secs_f64());
                    }
                }
                Event::Nacked {
                    type_url,
                    nonce,
                    version,
                    error,
                    resources,
                } => {
                    warn!(r#type = short_type(&type_url), %nonce, %version, %error, "Envoy rejected configuration; it keeps its last good one");
                    if type_url == ROUTE {
                        for config in resources.values().filter(|r| r.has_content()) {
                            self.nodes.report_verdict(RouteVerdict::Refused {
                                config: config.clone(),
                                node: node.to_owned(),
                                error: error.clone(),
                            });
                        }
                    }
                    let label = TypeLabel::of(&type_url);
                    self.metrics.nacks.get_or_create(&label).inc();
                    if let Some(at) = sent_at.remove(&nonce) {
                        self.metrics
                            .push_ack_seconds
                            .get_or_create(&label)
                            .observe(at.elapsed().as_secs_f64());
                    }
                }
                Event::RoutesInParts {
                    route_configs,
                    refused,
                } => {
                    for config in route_configs {
                        self.nodes.report_verdict(match &refused {
                            None => RouteVerdict::Accepted(config),
                            Some(error) => RouteVerdict::Refused {
                                config,
                                node: node.to_owned(),
                                error: error.clone(),
                            },
                        });
                    }
                }
                Event::Recalled { version, clusters } => {
                    debug!(%version, clusters, "the node holds clusters from before this stream");
                }
                Event::NotRecalled { version } => warn!(
                    %version,
                    "the node holds clusters of a version not known here: those gone since are removed with the first cluster response"
                ),
                Event::StaleNonce { type_url, nonce } => {
                    debug!(r#type = short_type(&type_url), %nonce, "ignored request with a stale nonce");
                }
            }
        }
    }
}

/// The peer's address, with or without TLS.
fn peer_of<B>(request: &http::Request<B>) -> String {
    let extensions = request.extensions();
    extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|info| info.get_ref().remote_addr())
        })
        .map_or_else(|| "unknown".to_string(), |a| a.to_string())
}

/// Decodes a stream of requests of type `T` from the HTTP/2 request body.
fn decode<T>(body: Body) -> Streaming<T>
where
    T: prost::Message + Default + Send + 'static,
{
    let mut codec = ProstCodec::<T, T>::default();
    Streaming::new_request(codec.decoder(), body, None, Some(MAX_REQUEST_BYTES))
}

/// The ADS gRPC service. Written by hand rather than generated so that responses are
/// encoded from the snapshot's shared resources as the stream takes them (see
/// [`super::wire`]) instead of being copied whole into a message per Envoy.
#[derive(Clone)]
pub struct AdsService(AdsServer);

impl NamedService for AdsService {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
const MAX_REQUEST_BYTES: usize = 64 << 20;

impl tower_service::Service<http::Request<Body>> for AdsService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        ready(Ok(self.0.handle(request)))
    }
}

impl AdsServer {
    fn handle(&self, request: http::Request<Body>) -> http::Response<Body> {
        let protocol = match request.uri().path() {
            SOTW_PATH => Protocol::Sotw,
            DELTA_PATH => Protocol::Delta,
            path => return Status::unimplemented(format!("no method {path}")).into_http(),
        };
        if let Some(encoding) = request.headers().get("grpc-encoding")
            && encoding != "identity"
        {
            return Status::unimplemented(format!(
                "request compression {encoding:?} is not supported"
            ))
            .into_http();
        }
        let peer = peer_of(&request);
        let body = request.into_body();
        let inbound: Inbound = match protocol {
            Protocol::Sotw => Box::pin(decode(body).map(|r| r.map(Incoming::Sotw))),
            Protocol::Delta => Box::pin(decode(body).map(|r| r.map(Incoming::Delta))),
        };
        let rx = self.start(protocol, peer, inbound);
        let mut response = http::Response::new(Body::new(ResponseBody {
            rx,
            current: None,
            finished: false,
        }));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        response
    }
}

/// The response side of one stream: the session's responses, each encoded when HTTP/2
/// asks for more data, then the gRPC status as trailers.
struct ResponseBody {
    rx: mpsc::Receiver<Outbound>,
    current: Option<Frames>,
    finished: bool,
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        loop {
            if this.finished {
                return Poll::Ready(None);
            }
            if let Some(chunk) = this.current.as_mut().and_then(Frames::next_chunk) {
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            this.current = None;
            let end = match std::task::ready!(this.rx.poll_recv(cx)) {
                Some(Ok(response)) => match Frames::new(response) {
                    Ok(frames) => {
                        this.current = Some(frames);
                        continue;
                    }
                    Err(too_large) => {
                        warn!(error = %too_large, "ending the stream");
                        Status::resource_exhausted(too_large.to_string())
                    }
                },
                Some(Err(status)) => status,
                None => Status::ok(""),
            };
            this.finished = true;
            return Poll::Ready(Some(Ok(Frame::trailers(trailers(&end)))));
        }
    }
}

fn trailers(status: &Status) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        // Only a message that cannot be a header value gets here; the code still can.
        map.insert("grpc-status", http::HeaderValue::from(status.code() as i32));
    }
    map
}
