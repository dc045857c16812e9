//! Golden tests of the Gateway API front-end: `tests/golden/gateway/<case>/input.yaml`
//! (GatewayClasses, Gateways, ListenerSets, HTTPRoutes, GRPCRoutes, TLSRoutes, TCPRoutes,
//! ReferenceGrants and the Services, Namespaces,
//! Secrets and ConfigMaps they name) gives exactly `expected.yaml`: the status of every object of
//! Switchyard's and what each Gateway serves, in the route vocabulary; and `units.yaml`:
//! the units the Gateways roll out, with the version and clusters each one's ProxyConfigs
//! carry (they name ProxyConfigs in running clusters: a changed version re-rolls the unit).
//! `UPDATE_GOLDEN=1` rewrites them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use switchyard::gateway::api::backendtlspolicies::BackendTlsPolicy;
use switchyard::gateway::api::gatewayclasses::GatewayClass;
use switchyard::gateway::api::gateways::Gateway;
use switchyard::gateway::api::grpcroutes::GrpcRoute;
use switchyard::gateway::api::httproutes::HttpRoute;
use switchyard::gateway::api::listenersets::ListenerSet;
use switchyard::gateway::api::referencegrants::ReferenceGrant;
use switchyard::gateway::api::tcproutes::TcpRoute;
use switchyard::gateway::api::tlsroutes::TlsRoute;
use switchyard::gateway::api::udproutes::UdpRoute;
use switchyard::gateway::controller::{known, known_ca};
use switchyard::gateway::translate::{
    CONTROLLER_NAME, Inputs, KnownCaBundle, KnownSecret, Translation, translate,
};
use switchyard::gateway::unit::units;
use switchyard_core::route::ResolvedCluster;
use switchyard_e2e::golden;

const STAGE: &str = "gateway";

fn translated(case: &str) -> Translation {
    let docs = golden::documents(&golden::stage_dir(STAGE).join(case).join("input.yaml"));
    let classes: Vec<GatewayClass> = golden::of_kind(&docs, "GatewayClass");
    let gateways: Vec<Gateway> = golden::of_kind(&docs, "Gateway");
    let listener_sets: Vec<ListenerSet> = golden::of_kind(&docs, "ListenerSet");
    let routes: Vec<HttpRoute> = golden::of_kind(&docs, "HTTPRoute");
    let grpc_routes: Vec<GrpcRoute> = golden::of_kind(&docs, "GRPCRoute");
    let tls_routes: Vec<TlsRoute> = golden::of_kind(&docs, "TLSRoute");
    let tcp_routes: Vec<TcpRoute> = golden::of_kind(&docs, "TCPRoute");
    let udp_routes: Vec<UdpRoute> = golden::of_kind(&docs, "UDPRoute");
    let grants: Vec<ReferenceGrant> = golden::of_kind(&docs, "ReferenceGrant");
    let services: Vec<Service> = golden::of_kind(&docs, "Service");
    let namespaces: Vec<Namespace> = golden::of_kind(&docs, "Namespace");
    let secrets: Vec<KnownSecret> = golden::of_kind::<Secret>(&docs, "Secret")
        .iter()
        .map(known)
        .collect();
    let ca_bundles: Vec<KnownCaBundle> = golden::of_kind::<ConfigMap>(&docs, "ConfigMap")
        .iter()
        .map(known_ca)
        .collect();
    let backend_tls_policies: Vec<BackendTlsPolicy> = golden::of_kind(&docs, "BackendTLSPolicy");
    translate(&Inputs {
        controller_name: CONTROLLER_NAME,
        crd_version: None,
        classes: &classes,
        gateways: &gateways,
        listener_sets: &listener_sets,
        routes: &routes,
        grpc_routes: &grpc_routes,
        tls_routes: &tls_routes,
        tcp_routes: &tcp_routes,
        udp_routes: &udp_routes,
        grants: &grants,
        services: &services,
        namespaces: &namespaces,
        secrets: &secrets,
        ca_bundles: &ca_bundles,
        backend_tls_policies: &backend_tls_policies,
    })
}

#[test]
fn gateway_api_objects_translate_as_the_golden_files_say() {
    let cases = golden::cases(STAGE);
    assert!(!cases.is_empty(), "no cases under tests/golden/{STAGE}");
    for case in cases {
        let actual = golden::to_yaml(&translated(&case));
        golden::check(
            &golden::stage_dir(STAGE).join(&case).join("expected.yaml"),
            &actual,
        );
    }
}

/// What a unit's ProxyConfigs carry that the rollout compares: its version and clusters.
#[derive(serde::Serialize)]
struct UnitVersion {
    name: String,
    version: String,
    clusters: Vec<ResolvedCluster>,
}

#[test]
fn gateway_units_keep_their_versions() {
    for case in golden::cases(STAGE) {
        let translation = translated(&case);
        // Each port of each Gateway on a fleet port of its own, in order: what the
        // controller assigns depends on the cluster, the versions must not.
        let mut next = 20000;
        let fleet_ports: BTreeMap<_, _> = translation
            .gateways
            .iter()
            .map(|g| {
                let ports = g
                    .ports
                    .iter()
                    .map(|p| {
                        next += 1;
                        (p.port, next)
                    })
                    .collect::<Vec<_>>();
                ((g.namespace.clone(), g.name.clone()), ports)
            })
            .collect();
        let versions: Vec<UnitVersion> = units(&translation.gateways, &fleet_ports)
            .into_iter()
            .map(|u| UnitVersion {
                name: u.name,
                version: u.resolved.version,
                clusters: u.resolved.clusters,
            })
            .collect();
        golden::check(
            &golden::stage_dir(STAGE).join(&case).join("units.yaml"),
            &golden::to_yaml(&versions),
        );
    }
}
