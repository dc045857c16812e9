//! The listeners of UDP Gateway ports: each datagram goes to the backends of the port's one
//! virtual host. Envoy keeps a session per client address and port, on one backend picked
//! when the session opens.
//!
//! Envoy's UDP proxy sends a session to one cluster, never to several by weight, so a
//! virtual host with more than one backend (or a share of backends the front-end could not
//! use) is served by a **blend**: a cluster of its own whose endpoints are its backends'
//! endpoints, one locality per backend weighted as the backend is. The blend is made from
//! its backends' clusters, which the rollout has proven ready like any other; Envoy has it,
//! warm, before the listener names it (make before break), and drops it late.
//!
//! Version probes: a UDP listener cannot answer an HTTP request, and its filters cannot be
//! told apart by port (each takes every datagram), so no address of it can answer from its
//! own configuration. Its probes are answered by a TCP listener of their own on the probe
//! port, whose name sorts right after the UDP listener's: Envoy takes the listeners of one
//! LDS response in order on its main thread and hands them to its workers in that order,
//! so a worker answering version V there already forwards datagrams by V.

use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster, cluster::ClusterDiscoveryType, cluster::CommonLbConfig, cluster::DiscoveryType,
    cluster::EdsClusterConfig, cluster::common_lb_config::LocalityConfigSpecifier,
    cluster::common_lb_config::LocalityWeightedLbConfig,
};
use envoy_types::pb::envoy::config::core::v3::{
    Address, HealthStatus, Locality, SocketAddress, address, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::config::listener::v3::{
    Listener, ListenerFilter, UdpListenerConfig, listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::udp::udp_proxy::v3::{
    Route as UdpRoute, UdpProxyConfig, udp_proxy_config::RouteSpecifier,
};
use envoy_types::pb::xds::core::v3::TypedExtensionConfig;
use envoy_types::pb::xds::r#type::matcher::v3::{Matcher, matcher::OnMatch, matcher::on_match};
use prost::Message;

use super::{access_log, cluster, endpoint, proto, stream};
use crate::model;

pub const UDP_PROXY_FILTER: &str = "envoy.filters.udp_listener.udp_proxy";
/// Blends are named under the project's own prefix, like [`model::UNAVAILABLE_CLUSTER`].
pub const BLEND_PREFIX: &str = "switchyard/blend/";
/// Where a blend sends the share of backends the front-end could not use: the discard
/// port of the Envoy's own loopback (nothing answers; the datagrams go no further).
const DISCARD: (&str, u16) = ("127.0.0.1", 9);

/// The name of the TCP listener answering a UDP listener's version probes: right after
/// the UDP listener's in name order (and so in any response that carries both).
pub fn probe_listener_name(udp_listener: &str) -> String {
    format!("{udp_listener}/probe")
}

/// The cluster a virtual host's sessions go to: its one backend, a blend of several, or
/// none ([`model::UNAVAILABLE_CLUSTER`], which Envoy does not have: every datagram is
/// dropped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Cluster(String),
    Blend(Blend),
}

/// Backends by weight (the unavailable share under [`model::UNAVAILABLE_CLUSTER`]), each
/// weight above 0, sorted: a blend's name is made from them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blend {
    pub name: String,
    pub members: Vec<(String, u32)>,
}

impl Blend {
    /// The clusters whose endpoints it is made of.
    pub fn clusters(&self) -> impl Iterator<Item = &str> {
        (self.members.iter())
            .map(|(name, _)| name.as_str())
            .filter(|name| *name != model::UNAVAILABLE_CLUSTER)
    }
}

/// Where the sessions of a virtual host with these backends (from [`stream::backends`]) go.
pub fn target(backends: &[(String, u32)]) -> Target {
    let mut members: Vec<(String, u32)> = (backends.iter())
        .filter(|(_, weight)| *weight > 0)
        .cloned()
        .collect();
    // A backend named twice gets both its weights.
    members.sort();
    members.dedup_by(|later, first| {
        let same = later.0 == first.0;
        if same {
            first.1 = first.1.saturating_add(later.1);
        }
        same
    });
    match members.as_slice() {
        [] => Target::Cluster(model::UNAVAILABLE_CLUSTER.to_owned()),
        [(one, _)] => Target::Cluster(one.clone()),
        _ => {
            let text: Vec<String> = (members.iter())
                .map(|(name, weight)| format!("{name}={weight}"))
                .collect();
            let digest = crate::hash::digest(text.join("\n").as_bytes());
            Target::Blend(Blend {
                name: format!("{BLEND_PREFIX}{digest}"),
                members,
            })
        }
    }
}

impl Target {
    pub fn cluster(&self) -> &str {
        match self {
            Self::Cluster(name) => name,
            Self::Blend(blend) => &blend.name,
        }
    }
}

/// The listener of a UDP Gateway port: every datagram to the cluster of its served virtual
/// host (`served`: its name and [`Target`]'s cluster). The route is named after the
/// virtual host.
pub fn udp_listener(
    settings: &model::ListenerSettings,
    gateway: &model::GatewayListener,
    (virtual_host, cluster): (&str, &str),
) -> Listener {
    let route = UdpRoute {
        cluster: cluster.to_owned(),
    };
    let proxy = UdpProxyConfig {
        stat_prefix: gateway.name.clone(),
        route_specifier: Some(RouteSpecifier::Matcher(Matcher {
            on_no_match: Some(Box::new(OnMatch {
                on_match: Some(on_match::OnMatch::Action(TypedExtensionConfig {
                    name: virtual_host.to_owned(),
                    typed_config: Some(proto::pack(&route)),
                })),
                ..Default::default()
            })),
            ..Default::default()
        })),
        access_log: access_log::connection_access_logs(&settings.access_log),
        ..Default::default()
    };
    Listener {
        name: gateway.name.clone(),
        address: Some(udp_address(&settings.address, gateway.port)),
        udp_listener_config: Some(UdpListenerConfig::default()),
        listener_filters: vec![ListenerFilter {
            name: UDP_PROXY_FILTER.to_owned(),
            config_type: Some(listener_filter::ConfigType::TypedConfig(proto::pack(
                &proxy,
            ))),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The TCP listener on a UDP port's probe port: plain HTTP, routed with the probe virtual
/// hosts of the port's route configuration, inline.
pub fn probe_listener(
    settings: &model::ListenerSettings,
    gateway: &model::GatewayListener,
    probe_routes: RouteConfiguration,
) -> Listener {
    let mut chain = stream::probe_chain(&gateway.name, gateway.probe_port, probe_routes);
    // The listener has one address: every connection is a probe.
    chain.filter_chain_match = None;
    Listener {
        name: probe_listener_name(&gateway.name),
        address: Some(super::listener::socket_address(
            &settings.address,
            gateway.probe_port,
        )),
        filter_chains: vec![chain],
        ..Default::default()
    }
}

fn udp_address(host: &str, port: u16) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            protocol: socket_address::Protocol::Udp as i32,
            address: host.to_owned(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
            ..Default::default()
        })),
    }
}

/// A blend's cluster: EDS, one locality per member picked by weight, then an endpoint in it.
pub fn blend_cluster(blend: &Blend) -> Cluster {
    Cluster {
        name: blend.name.clone(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(proto::ads()),
            service_name: String::new(),
        }),
        circuit_breakers: Some(cluster::unlimited_sessions()),
        common_lb_config: Some(CommonLbConfig {
            locality_config_specifier: Some(LocalityConfigSpecifier::LocalityWeightedLbConfig(
                LocalityWeightedLbConfig::default(),
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A blend's endpoints: each member cluster's as one locality named after it, with the
/// member's weight; the unavailable share is the discard port. A member `clusters` does
/// not know adds nothing.
pub fn blend_load_assignment<'a>(
    blend: &Blend,
    clusters: impl Fn(&str) -> Option<&'a model::Cluster>,
) -> ClusterLoadAssignment {
    let endpoints = (blend.members.iter())
        .map(|(name, weight)| {
            let lb_endpoints = if name == model::UNAVAILABLE_CLUSTER {
                vec![discard_endpoint()]
            } else {
                (clusters(name))
                    .map(|c| endpoint::encoded_load_assignment(c).0)
                    .and_then(|bytes| ClusterLoadAssignment::decode(bytes.as_slice()).ok())
                    .map(|cla| {
                        (cla.endpoints.into_iter())
                            .flat_map(|l| l.lb_endpoints)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            LocalityLbEndpoints {
                locality: Some(Locality {
                    sub_zone: name.clone(),
                    ..Default::default()
                }),
                lb_endpoints,
                load_balancing_weight: proto::u32_value(*weight),
                ..Default::default()
            }
        })
        .collect();
    ClusterLoadAssignment {
        cluster_name: blend.name.clone(),
        endpoints,
        ..Default::default()
    }
}

fn discard_endpoint() -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
            address: Some(udp_address(DISCARD.0, DISCARD.1)),
            ..Default::default()
        })),
        health_status: HealthStatus::Healthy as i32,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
