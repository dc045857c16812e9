//! The hand-written ADS gRPC service over real HTTP/2 on loopback: responses far larger
//! than one encoding chunk and than HTTP/2's windows arrive whole, and what is not ADS is
//! refused with a gRPC status.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use switchyard::translate::translate;
use switchyard::xds::Ordering;
use switchyard::xds::snapshot::{CLUSTER, ENDPOINT};
use switchyard_e2e::InProcessServer;
use switchyard_e2e::ads_client::{Target, spawn_fleet, wait_all};
use switchyard_e2e::synthetic;
use tonic::Code;
use tonic::codegen::http::uri::PathAndQuery;
use tonic_prost::ProstCodec;

const TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_responses_arrive_whole_in_both_protocols() {
    let server = InProcessServer::start(Ordering::MakeBeforeBreak).await;
    let snapshot = std::sync::Arc::new(translate(&synthetic::config(4000, 3)).snapshot);
    let endpoints = snapshot.resources(ENDPOINT).expect("endpoints");
    let eds_bytes: usize = endpoints.values().map(|r| r.body.value.len()).sum();
    assert!(
        eds_bytes > 1 << 20,
        "EDS alone spans many chunks: {eds_bytes} bytes"
    );
    server.desired.publish(snapshot.clone());
    assert!(server.desired.open());

    let clients = spawn_fleet(server.port, 2, 2).await.expect("connecting");
    wait_all(&clients, &Target::of(&snapshot), TIMEOUT)
        .await
        .expect("every client syncs");
    for client in &clients {
        assert_eq!(client.failure(), None);
        for (type_url, held) in client.state() {
            let resources = snapshot.resources(&type_url).expect("a served type");
            assert_eq!(held.len(), resources.len(), "{type_url}");
            for (name, resource) in resources {
                let body = held.get(name).map(|h| h.body.as_slice());
                assert!(
                    body == Some(resource.body.value.as_slice()),
                    "{} holds another {type_url} {name}",
                    client.node_id()
                );
            }
        }
    }
}

/// A raw gRPC client of `server`, ready.
async fn grpc_to(server: &InProcessServer) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", server.port))
            .expect("endpoint")
            .connect()
            .await
            .expect("connecting");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    grpc
}

#[tokio::test]
async fn other_methods_are_unimplemented() {
    let server = InProcessServer::start(Ordering::MakeBeforeBreak).await;
    let mut grpc = grpc_to(&server).await;
    let status = grpc
        .unary::<DiscoveryRequest, DiscoveryResponse, _>(
            tonic::Request::new(DiscoveryRequest::default()),
            PathAndQuery::from_static(
                "/envoy.service.discovery.v3.AggregatedDiscoveryService/FetchEverything",
            ),
            ProstCodec::default(),
        )
        .await
        .expect_err("no such method");
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
}

/// A stream whose client answers no response is closed after the answer timeout, with
/// UNAVAILABLE, so that the client (Envoy) connects again; a client that answers keeps its
/// stream.
#[tokio::test]
async fn a_stream_left_unanswered_is_closed_so_that_the_client_connects_again() {
    let timeout = Duration::from_secs(1);
    let server = InProcessServer::start_with(Ordering::MakeBeforeBreak, timeout).await;
    let snapshot = std::sync::Arc::new(translate(&synthetic::config(2, 1)).snapshot);
    server.desired.publish(snapshot);
    assert!(server.desired.open());

    let answering = spawn_fleet(server.port, 1, 0).await.expect("connecting");
    let mut grpc = grpc_to(&server).await;
    let (requests, mut outgoing) = tokio::sync::mpsc::channel::<DiscoveryRequest>(4);
    let sent = std::time::Instant::now();
    requests
        .send(DiscoveryRequest {
            node: Some(Node {
                id: "silent".into(),
                ..Node::default()
            }),
            type_url: CLUSTER.into(),
            ..DiscoveryRequest::default()
        })
        .await
        .expect("a request");
    let mut responses = grpc
        .streaming::<_, DiscoveryRequest, DiscoveryResponse, _>(
            tonic::Request::new(futures::stream::poll_fn(move |cx| outgoing.poll_recv(cx))),
            PathAndQuery::from_static(
                "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
            ),
            ProstCodec::default(),
        )
        .await
        .expect("a stream")
        .into_inner();
    let first = responses.message().await.expect("a response");
    assert!(first.is_some_and(|r| r.type_url == CLUSTER));
    // Never answered: the stream ends.
    let end = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .expect("the stream ends");
    // (Timed from before the request: the response went out after it.)
    let closed_after = sent.elapsed();
    let Err(status) = end else {
        panic!("the stream went on: {end:?}");
    };
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(closed_after >= timeout, "closed after {closed_after:?}");
    assert!(
        server
            .metrics_text()
            .contains("switchyard_xds_streams_unanswered_total 1"),
        "{}",
        server.metrics_text()
    );
    drop(requests);
    // The client that answers is still connected, and its stream open.
    for client in &answering {
        assert_eq!(client.failure(), None);
    }
    assert_eq!(server.nodes.list().len(), 1, "only the answering client");
}
