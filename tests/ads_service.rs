//! The hand-written ADS gRPC service over real HTTP/2 on loopback: responses far larger
//! than one encoding chunk and than HTTP/2's windows arrive whole, and what is not ADS is
//! refused with a gRPC status.

use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use switchyard::translate::translate;
use switchyard::xds::Ordering;
use switchyard::xds::snapshot::ENDPOINT;
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

#[tokio::test]
async fn other_methods_are_unimplemented() {
    let server = InProcessServer::start(Ordering::MakeBeforeBreak).await;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", server.port))
            .expect("endpoint")
            .connect()
            .await
            .expect("connecting");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
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
