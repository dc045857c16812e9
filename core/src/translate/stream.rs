//! The listeners of Gateway ports that forward connections, not requests: TCP (each
//! connection to the backends of its one virtual host) and TLS (each connection to those
//! of the virtual host its server name chooses: passed through as it is, or decrypted
//! with the virtual host's certificate). A served virtual host is one filter chain, a
//! `tcp_proxy` to its clusters by weight.
//!
//! Such a listener answers its own version probes: the probe port is a second address of
//! the same listener, whose filter chain (chosen by that port) routes with the listener's
//! route configuration, inline. A probe that reads version V there has reached the very
//! resource that forwards by V: Envoy takes a listener whole or not at all, so no answer
//! can run ahead of the forwarding it speaks for, as an answer over RDS could.

use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::config::listener::v3::{
    AdditionalAddress, Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter,
    listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_connection_manager::CodecType,
    http_connection_manager::RouteSpecifier, http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    TcpProxy,
    tcp_proxy::{ClusterSpecifier, WeightedCluster, weighted_cluster::ClusterWeight},
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext,
};

use super::listener::{
    self, HCM_FILTER, ROUTER_FILTER, Side, TLS_INSPECTOR_FILTER, TLS_TRANSPORT_SOCKET,
    socket_address,
};
use super::{access_log, proto};
use crate::model;

pub const TCP_PROXY_FILTER: &str = "envoy.filters.network.tcp_proxy";
/// The name of the probe port's filter chain (a virtual host's chain is named after it;
/// no virtual host has this name, which has no `/`).
pub const PROBE_CHAIN: &str = "probe";
/// The transport protocol the TLS inspector gives a connection that opens with a TLS
/// handshake.
const TLS_TRANSPORT: &str = "tls";

/// A served virtual host of a connection-forwarding listener.
pub struct StreamHost<'a> {
    pub virtual_host: &'a str,
    /// Normalized hosts: server names on a TLS listener (`*`: every name, and none).
    pub hosts: &'a [String],
    /// TLS listener: decrypt with this secret (else the connection passes as it is).
    pub secret: Option<&'a str>,
    /// Cluster names and weights; a cluster Envoy does not have closes the connection
    /// (the share of backends the front-end could not use, [`model::UNAVAILABLE_CLUSTER`]).
    pub backends: &'a [(String, u32)],
}

/// The listener of a TCP or TLS Gateway port: `hosts` sorted by virtual host name,
/// `probe_routes` its route configuration (the version probes of its units).
pub fn stream_listener(
    settings: &model::ListenerSettings,
    gateway: &model::GatewayListener,
    hosts: &[StreamHost<'_>],
    probe_routes: RouteConfiguration,
) -> Listener {
    let tls = gateway.protocol == model::ListenerProtocol::Tls;
    let mut chains: Vec<FilterChain> = hosts
        .iter()
        .map(|h| forwarding_chain(settings, &gateway.name, h, tls))
        .collect();
    chains.push(probe_chain(&gateway.name, gateway.probe_port, probe_routes));
    Listener {
        name: gateway.name.clone(),
        address: Some(socket_address(&settings.address, gateway.port)),
        additional_addresses: vec![AdditionalAddress {
            address: Some(socket_address(&settings.address, gateway.probe_port)),
            ..Default::default()
        }],
        filter_chains: chains,
        // The PROXY header, when the load balancer sends one, comes first; then server
        // names are read from the handshake (the probe port's plain HTTP is told apart at
        // once, as not TLS).
        listener_filters: listener::proxy_protocol(settings, Side::Public)
            .into_iter()
            .chain(tls.then(|| ListenerFilter {
                name: TLS_INSPECTOR_FILTER.to_owned(),
                config_type: Some(listener_filter::ConfigType::TypedConfig(proto::pack(
                    &TlsInspector::default(),
                ))),
                ..Default::default()
            }))
            .collect(),
        ..Default::default()
    }
}

/// A virtual host's chain: on a TLS listener, for its server names (and TLS only); on a
/// TCP listener, for every connection.
fn forwarding_chain(
    settings: &model::ListenerSettings,
    listener: &str,
    host: &StreamHost<'_>,
    tls: bool,
) -> FilterChain {
    let any_name = host.hosts.iter().any(|h| h == "*");
    let filter_chain_match = tls.then(|| FilterChainMatch {
        // "*": every name, and none.
        server_names: if any_name {
            Vec::new()
        } else {
            host.hosts.to_vec()
        },
        transport_protocol: TLS_TRANSPORT.to_owned(),
        ..Default::default()
    });
    let transport_socket = host.secret.filter(|_| tls).map(|secret| {
        let context = DownstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                tls_certificate_sds_secret_configs: vec![proto::sds(secret)],
                ..Default::default()
            }),
            ..Default::default()
        };
        TransportSocket {
            name: TLS_TRANSPORT_SOCKET.to_owned(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(proto::pack(
                &context,
            ))),
        }
    });
    FilterChain {
        name: host.virtual_host.to_owned(),
        filter_chain_match,
        filters: vec![tcp_proxy(settings, listener, host.backends)],
        transport_socket,
        ..Default::default()
    }
}

/// Each connection to one of `backends`, picked by weight.
fn tcp_proxy(
    settings: &model::ListenerSettings,
    listener: &str,
    backends: &[(String, u32)],
) -> Filter {
    let weighted: Vec<ClusterWeight> = backends
        .iter()
        .filter(|(_, weight)| *weight > 0)
        .map(|(name, weight)| ClusterWeight {
            name: name.clone(),
            weight: *weight,
            ..Default::default()
        })
        .collect();
    let cluster_specifier = match weighted.as_slice() {
        [] => ClusterSpecifier::Cluster(model::UNAVAILABLE_CLUSTER.to_owned()),
        [one] => ClusterSpecifier::Cluster(one.name.clone()),
        _ => ClusterSpecifier::WeightedClusters(WeightedCluster { clusters: weighted }),
    };
    let proxy = TcpProxy {
        stat_prefix: listener.to_owned(),
        cluster_specifier: Some(cluster_specifier),
        access_log: access_log::connection_access_logs(&settings.access_log),
        ..Default::default()
    };
    Filter {
        name: TCP_PROXY_FILTER.to_owned(),
        config_type: Some(filter::ConfigType::TypedConfig(proto::pack(&proxy))),
    }
}

/// Why a virtual host cannot be served on `listener`, a TCP, TLS or UDP one: each
/// connection (or session) goes whole to the backends of its one route.
pub fn check_virtual_host(
    listener: &model::GatewayListener,
    vh: &model::VirtualHost,
) -> Vec<String> {
    let mut errors = Vec::new();
    let kind = match listener.protocol {
        model::ListenerProtocol::Tcp => "TCP",
        model::ListenerProtocol::Udp => "UDP",
        _ => "TLS",
    };
    let name = &listener.name;
    let what = match listener.protocol {
        model::ListenerProtocol::Udp => "datagrams have",
        _ => "connections have",
    };
    if listener.protocol != model::ListenerProtocol::Tls {
        if vh.tls.is_some() {
            errors.push(format!(
                "Gateway listener {name:?} is {kind}: the virtual host cannot have TLS"
            ));
        }
        if vh.hosts.iter().any(|h| h != "*") {
            errors.push(format!(
                "Gateway listener {name:?} is {kind}: {what} no host name, the virtual host's only host is \"*\""
            ));
        }
    }
    let forwards_all = |r: &model::Route| {
        r.path == model::PathMatch::Prefix("/".to_owned())
            && r.headers.is_empty()
            && r.method.is_none()
            && r.query.is_empty()
            && matches!(
                r.action,
                model::RouteAction::Forward(_) | model::RouteAction::Respond(_)
            )
    };
    // No route: every connection is refused (a name a listener keeps from a less
    // specific one).
    if !matches!(vh.routes.as_slice(), [] | [_] if vh.routes.iter().all(forwards_all)) {
        errors.push(format!(
            "Gateway listener {name:?} is {kind}: the virtual host has at most one route, for every path, that forwards (or refuses) each connection"
        ));
    }
    errors
}

/// The cluster names and weights a virtual host on a TCP or TLS listener forwards to: its
/// one route's backends, and the share the front-end could not use (a cluster Envoy does
/// not have: the connection is closed). A route that answers instead closes every one.
pub fn backends(vh: &model::VirtualHost) -> Vec<(String, u32)> {
    match vh.routes.first().map(|r| &r.action) {
        Some(model::RouteAction::Forward(f)) => f
            .backends
            .iter()
            .map(|b| (b.cluster.clone(), b.weight))
            .chain(
                (f.unavailable_weight > 0)
                    .then(|| (model::UNAVAILABLE_CLUSTER.to_owned(), f.unavailable_weight)),
            )
            .collect(),
        _ => Vec::new(),
    }
}

/// The probe port's chain: plain HTTP, routed with the probe virtual hosts of the
/// listener's route configuration, inline (they answer by themselves: no cluster to check).
pub(super) fn probe_chain(
    listener: &str,
    probe_port: u16,
    mut routes: RouteConfiguration,
) -> FilterChain {
    routes.validate_clusters = proto::bool_value(false);
    let hcm = HttpConnectionManager {
        codec_type: CodecType::Auto as i32,
        stat_prefix: listener.to_owned(),
        route_specifier: Some(RouteSpecifier::RouteConfig(routes)),
        http_filters: vec![HttpFilter {
            name: ROUTER_FILTER.to_owned(),
            config_type: Some(http_filter::ConfigType::TypedConfig(proto::pack(
                &Router::default(),
            ))),
            ..Default::default()
        }],
        ..Default::default()
    };
    FilterChain {
        name: PROBE_CHAIN.to_owned(),
        filter_chain_match: Some(FilterChainMatch {
            destination_port: proto::u32_value(u32::from(probe_port)),
            ..Default::default()
        }),
        filters: vec![Filter {
            name: HCM_FILTER.to_owned(),
            config_type: Some(filter::ConfigType::TypedConfig(proto::pack(&hcm))),
        }],
        ..Default::default()
    }
}

#[cfg(test)]
pub(super) mod tests;
