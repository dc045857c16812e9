//! The Gateway API kinds of some manifests, as the Gateway controller would serve them:
//! translated, cut into units, and each unit's live ProxyConfig as its rollout would leave
//! it. What the controller would write into a status as not accepted, not resolved or not
//! valid is a problem here.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};

use crate::api::{ProxyConfig, ProxyConfigRole};
use crate::gateway::api::backendtlspolicies::BackendTlsPolicy;
use crate::gateway::api::gatewayclasses::GatewayClass;
use crate::gateway::api::gateways::Gateway;
use crate::gateway::api::grpcroutes::GrpcRoute;
use crate::gateway::api::httproutes::HttpRoute;
use crate::gateway::api::listenersets::ListenerSet;
use crate::gateway::api::referencegrants::ReferenceGrant;
use crate::gateway::api::tcproutes::TcpRoute;
use crate::gateway::api::tlsroutes::TlsRoute;
use crate::gateway::api::udproutes::UdpRoute;
use crate::gateway::controller::{known, known_ca};
use crate::gateway::service::FLEET_PORTS;
use crate::gateway::translate::{
    CONTROLLER_NAME, Cond, Inputs, KnownCaBundle, KnownSecret, Translation, translate,
};
use crate::gateway::unit::units;
use crate::rollout::spec::{live_name, proxy_config_spec};

/// The kinds read.
pub struct Objects {
    pub classes: Vec<GatewayClass>,
    pub gateways: Vec<Gateway>,
    pub listener_sets: Vec<ListenerSet>,
    pub routes: Vec<HttpRoute>,
    pub grpc_routes: Vec<GrpcRoute>,
    pub tls_routes: Vec<TlsRoute>,
    pub tcp_routes: Vec<TcpRoute>,
    pub udp_routes: Vec<UdpRoute>,
    pub grants: Vec<ReferenceGrant>,
    pub services: Vec<Service>,
    pub namespaces: Vec<Namespace>,
    pub secrets: Vec<Secret>,
    pub config_maps: Vec<ConfigMap>,
    pub backend_tls_policies: Vec<BackendTlsPolicy>,
}

/// The live ProxyConfig of every unit of every Gateway of the GatewayClasses of
/// Switchyard's controller name, and the problems. A Gateway's ports get fleet ports in
/// order from the first (20000), as on a fresh installation: a running one keeps those it
/// gave.
pub fn live_proxy_configs(objects: &Objects) -> (Vec<ProxyConfig>, Vec<String>) {
    let secrets: Vec<KnownSecret> = objects.secrets.iter().map(known).collect();
    let ca_bundles: Vec<KnownCaBundle> = objects.config_maps.iter().map(known_ca).collect();
    let translation = translate(&Inputs {
        controller_name: CONTROLLER_NAME,
        crd_version: None,
        classes: &objects.classes,
        gateways: &objects.gateways,
        listener_sets: &objects.listener_sets,
        routes: &objects.routes,
        grpc_routes: &objects.grpc_routes,
        tls_routes: &objects.tls_routes,
        tcp_routes: &objects.tcp_routes,
        udp_routes: &objects.udp_routes,
        grants: &objects.grants,
        services: &objects.services,
        namespaces: &objects.namespaces,
        secrets: &secrets,
        ca_bundles: &ca_bundles,
        backend_tls_policies: &objects.backend_tls_policies,
    });
    let mut fleet = FLEET_PORTS;
    let fleet_ports: BTreeMap<_, _> = (translation.gateways.iter())
        .map(|g| {
            let ports = (g.ports.iter())
                .filter_map(|p| Some((p.port, fleet.next()?)))
                .collect();
            ((g.namespace.clone(), g.name.clone()), ports)
        })
        .collect();
    let live = units(&translation.gateways, &fleet_ports)
        .into_iter()
        .map(|unit| {
            let spec = proxy_config_spec(
                &unit.name,
                1,
                ProxyConfigRole::Live,
                &unit.resolved,
                &[],
                None,
            );
            let mut pc = ProxyConfig::new(&live_name(&unit.name), spec);
            pc.metadata.namespace = Some(unit.gateway.0.clone());
            pc
        })
        .collect();
    (live, problems(&translation))
}

/// Every condition of the translation that says something is not served, or not all of
/// it: `<Kind> <namespace>/<name>[ <where>]: <type> <reason>: <message>`.
fn problems(translation: &Translation) -> Vec<String> {
    let mut out = Vec::new();
    let mut add = |subject: String, conditions: &[Cond]| {
        out.extend(
            (conditions.iter())
                .filter(|c| c.is_true() == (c.type_ == "Conflicted"))
                .map(|c| format!("{subject}: {} {}: {}", c.type_, c.reason, c.message)),
        );
    };
    for class in &translation.classes {
        add(format!("GatewayClass {}", class.name), &class.conditions);
    }
    for g in &translation.gateways {
        let subject = format!("Gateway {}/{}", g.namespace, g.name);
        add(subject.clone(), &g.conditions);
        for listener in &g.listeners {
            add(
                format!("{subject} listener {}", listener.name),
                &listener.conditions,
            );
        }
    }
    for set in &translation.listener_sets {
        let subject = format!("ListenerSet {}/{}", set.namespace, set.name);
        add(subject.clone(), &set.conditions);
        for listener in &set.listeners {
            add(
                format!("{subject} listener {}", listener.name),
                &listener.conditions,
            );
        }
    }
    let routes = (translation.routes.iter()).map(|r| ("HTTPRoute", r));
    let grpc_routes = (translation.grpc_routes.iter()).map(|r| ("GRPCRoute", r));
    let tls_routes = (translation.tls_routes.iter()).map(|r| ("TLSRoute", r));
    let tcp_routes = (translation.tcp_routes.iter()).map(|r| ("TCPRoute", r));
    let udp_routes = (translation.udp_routes.iter()).map(|r| ("UDPRoute", r));
    let all = routes
        .chain(grpc_routes)
        .chain(tls_routes)
        .chain(tcp_routes)
        .chain(udp_routes);
    for (kind, route) in all {
        for parent in &route.parents {
            let on = match &parent.listener_set {
                Some((namespace, name)) => format!("ListenerSet {namespace}/{name}"),
                None => format!("Gateway {}/{}", parent.gateway_namespace, parent.gateway),
            };
            let subject = format!("{kind} {}/{} on {on}", route.namespace, route.name);
            add(subject, &parent.conditions);
        }
    }
    out
}
