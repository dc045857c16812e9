//! The tonic ADS service: a thin loop per stream around a [`Session`].

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Instant, SystemTime};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status, Streaming};
use tracing::{Instrument, debug, info, info_span, warn};

use super::session::{Event, Ordering, Protocol, Response, Session, SessionStatus};
use super::{Desired, NodeReport, Nodes, snapshot::short_type};
use crate::metrics::{Metrics, TypeLabel};

#[derive(Clone)]
pub struct AdsServer {
    desired: Arc<Desired>,
    nodes: Nodes,
    metrics: Metrics,
    ordering: Ordering,
    next_stream: Arc<AtomicU64>,
}

enum Incoming {
    Sotw(DiscoveryRequest),
    Delta(DeltaDiscoveryRequest),
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

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
            next_stream: Arc::new(AtomicU64::new(1)),
        }
    }

    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<Self> {
        AggregatedDiscoveryServiceServer::new(self)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(256 << 20)
    }

    /// Spawns the loop of one stream; responses come out of the returned channel.
    fn start<S>(&self, protocol: Protocol, peer: String, inbound: S) -> mpsc::Receiver<Response>
    where
        S: Stream<Item = Result<Incoming, Status>> + Send + Unpin + 'static,
    {
        let (tx, rx) = mpsc::channel(16);
        let stream = self.next_stream.fetch_add(1, AtomicOrdering::Relaxed);
        let span = info_span!("xds_stream", stream, ?protocol, %peer, node = tracing::field::Empty);
        let session = Session::new(protocol, self.ordering);
        let this = self.clone();
        tokio::spawn(
            async move {
                this.metrics.connected_nodes.inc();
                let connected_at = SystemTime::now();
                let result = this
                    .run(session, stream, &peer, connected_at, inbound, tx)
                    .await;
                this.metrics.connected_nodes.dec();
                this.nodes.remove(stream);
                match result {
                    Ok(()) => info!("stream closed"),
                    Err(status) => {
                        info!(code = ?status.code(), message = status.message(), "stream ended")
                    }
                }
            }
            .instrument(span),
        );
        rx
    }

    async fn run<S>(
        &self,
        mut session: Session,
        stream: u64,
        peer: &str,
        connected_at: SystemTime,
        mut inbound: S,
        tx: mpsc::Sender<Response>,
    ) -> Result<(), Status>
    where
        S: Stream<Item = Result<Incoming, Status>> + Send + Unpin,
    {
        let mut desired = self.desired.subscribe();
        let mut sent_at: HashMap<String, Instant> = HashMap::new();
        let mut named = false;
        // What the registry last heard from this stream: most messages change nothing
        // the rest of the program looks at, and every update wakes its watchers.
        let mut reported: Option<SessionStatus> = None;
        // The gate may already be open.
        let mut initial = desired.borrow_and_update().clone();
        loop {
            let responses = if let Some(snapshot) = initial.take() {
                session.set_desired(snapshot, Instant::now())
            } else {
                tokio::select! {
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
                }
            };
            let mut just_named = false;
            if !named && let Some(node) = session.node() {
                tracing::Span::current().record("node", node.id.as_str());
                info!(cluster = %node.cluster, "node connected");
                named = true;
                just_named = true;
            }
            self.record(session.take_events(), &mut sent_at);
            for response in responses {
                if tx.send(response).await.is_err() {
                    return Ok(());
                }
            }
            let status = session.status();
            if just_named || reported.as_ref() != Some(&status) {
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

    fn record(&self, events: Vec<Event>, sent_at: &mut HashMap<String, Instant>) {
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
                } => {
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
                } => {
                    warn!(r#type = short_type(&type_url), %nonce, %version, %error, "Envoy rejected configuration; it keeps its last good one");
                    let label = TypeLabel::of(&type_url);
                    self.metrics.nacks.get_or_create(&label).inc();
                    if let Some(at) = sent_at.remove(&nonce) {
                        self.metrics
                            .push_ack_seconds
                            .get_or_create(&label)
                            .observe(at.elapsed().as_secs_f64());
                    }
                }
                Event::StaleNonce { type_url, nonce } => {
                    debug!(r#type = short_type(&type_url), %nonce, "ignored request with a stale nonce");
                }
            }
        }
    }
}

fn peer_of<T>(request: &Request<T>) -> String {
    request
        .remote_addr()
        .map_or_else(|| "unknown".to_string(), |a| a.to_string())
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsServer {
    type StreamAggregatedResourcesStream = ResponseStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamAggregatedResourcesStream>, Status> {
        let peer = peer_of(&request);
        let inbound = request.into_inner().map(|r| r.map(Incoming::Sotw));
        let rx = self.start(Protocol::Sotw, peer, inbound);
        let outbound = ReceiverStream::new(rx).filter_map(|response| async move {
            match response {
                Response::Sotw(r) => Some(Ok(r)),
                Response::Delta(_) => None,
            }
        });
        Ok(tonic::Response::new(Box::pin(outbound)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let peer = peer_of(&request);
        let inbound = request.into_inner().map(|r| r.map(Incoming::Delta));
        let rx = self.start(Protocol::Delta, peer, inbound);
        let outbound = ReceiverStream::new(rx).filter_map(|response| async move {
            match response {
                Response::Delta(r) => Some(Ok(r)),
                Response::Sotw(_) => None,
            }
        });
        Ok(tonic::Response::new(Box::pin(outbound)))
    }
}
