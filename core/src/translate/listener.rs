//! Listeners: "http", "https" (only when a virtual host has TLS) and the internal "probe"
//! listener, which route with the shared route configuration; and for each Gateway
//! listener, its public listener and its internal probe twin, which route with its own.
//! Every route configuration comes over RDS.

use envoy_types::pb::envoy::config::core::v3::{
    Address, SocketAddress, TransportSocket, address, socket_address, transport_socket,
};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter, listener_filter,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager::CodecType,
    http_connection_manager::RouteSpecifier, http_filter,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, SdsSecretConfig,
};

use envoy_types::pb::envoy::config::accesslog::v3::AccessLog;

use super::{
    HTTP_LISTENER, HTTPS_LISTENER, PROBE_LISTENER, ROUTE_CONFIG_NAME, access_log, probe, proto,
};
use crate::model;

pub const HCM_FILTER: &str = "envoy.filters.network.http_connection_manager";
pub const ROUTER_FILTER: &str = "envoy.filters.http.router";
pub const TLS_INSPECTOR_FILTER: &str = "envoy.filters.listener.tls_inspector";
pub const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";

/// A served virtual host with TLS: its own filter chain on the HTTPS listener (its Gateway
/// listener's, when it has one).
pub struct TlsHost<'a> {
    pub virtual_host: &'a str,
    /// Normalized (sorted, lower-case) hosts; they become SNI `server_names`.
    pub hosts: &'a [String],
    pub secret: &'a str,
}

/// The shared listeners; `tls_hosts` sorted by virtual host name, `probes` by id.
pub fn listeners(
    settings: &model::ListenerSettings,
    tls_hosts: &[TlsHost<'_>],
    probes: &[&model::EndpointProbe],
) -> Vec<Listener> {
    let mut out = vec![plain_listener(
        HTTP_LISTENER,
        settings,
        settings.http_port,
        ROUTE_CONFIG_NAME,
        Vec::new(),
        Logged::Yes,
    )];
    if !tls_hosts.is_empty() {
        out.push(tls_listener(
            HTTPS_LISTENER,
            settings,
            settings.https_port,
            ROUTE_CONFIG_NAME,
            tls_hosts,
            None,
        ));
    }
    let health_checks = probes
        .iter()
        .map(|p| probe::health_check_filter(p, &settings.probe_token))
        .collect();
    out.push(plain_listener(
        PROBE_LISTENER,
        settings,
        settings.probe_port,
        ROUTE_CONFIG_NAME,
        health_checks,
        Logged::No,
    ));
    out
}

/// The name of a Gateway listener's internal probe twin.
pub fn gateway_probe_listener(name: &str) -> String {
    format!("{PROBE_LISTENER}/{name}")
}

/// A Gateway listener's listeners: the public one (HTTPS only with a TLS virtual host or
/// a default secret to serve: a listener needs a filter chain), and the probe twin on its
/// internal port, both routing with the route configuration of its name. `tls_hosts` are
/// its own; `default_secret`, when usable, serves every other name.
pub fn gateway_listeners(
    settings: &model::ListenerSettings,
    gateway: &model::GatewayListener,
    tls_hosts: &[TlsHost<'_>],
    default_secret: Option<&str>,
) -> Vec<Listener> {
    let name = gateway.name.as_str();
    let mut out = Vec::new();
    if !gateway.tls {
        out.push(plain_listener(
            name,
            settings,
            gateway.port,
            name,
            Vec::new(),
            Logged::Yes,
        ));
    } else if !tls_hosts.is_empty() || default_secret.is_some() {
        out.push(tls_listener(
            name,
            settings,
            gateway.port,
            name,
            tls_hosts,
            default_secret,
        ));
    }
    out.push(plain_listener(
        &gateway_probe_listener(name),
        settings,
        gateway.probe_port,
        name,
        Vec::new(),
        Logged::No,
    ));
    out
}

/// Whether a listener's requests are access-logged: the public listeners', not the
/// probes'.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Logged {
    Yes,
    No,
}

fn access_logs(settings: &model::ListenerSettings, logged: Logged) -> Vec<AccessLog> {
    match logged {
        Logged::Yes => access_log::access_logs(&settings.access_log),
        Logged::No => Vec::new(),
    }
}

/// A plain-HTTP listener: `http_filters` (health checks), then the router.
fn plain_listener(
    name: &str,
    settings: &model::ListenerSettings,
    port: u16,
    route_config: &str,
    http_filters: Vec<HttpFilter>,
    logged: Logged,
) -> Listener {
    let logs = access_logs(settings, logged);
    listener(
        name,
        settings,
        port,
        vec![FilterChain {
            filters: vec![hcm_filter(name, route_config, http_filters, logs)],
            ..Default::default()
        }],
    )
}

/// An HTTPS listener: one filter chain per TLS host, chosen by SNI, and the default chain
/// (for any other name) with `default_secret`.
fn tls_listener(
    name: &str,
    settings: &model::ListenerSettings,
    port: u16,
    route_config: &str,
    tls_hosts: &[TlsHost<'_>],
    default_secret: Option<&str>,
) -> Listener {
    let logs = access_logs(settings, Logged::Yes);
    let chains = tls_hosts
        .iter()
        .map(|h| tls_filter_chain(name, route_config, h, &logs))
        .collect();
    let mut https = listener(name, settings, port, chains);
    https.default_filter_chain = default_secret.map(|secret| {
        let any = TlsHost {
            virtual_host: "default",
            hosts: &[],
            secret,
        };
        FilterChain {
            filter_chain_match: None,
            ..tls_filter_chain(name, route_config, &any, &logs)
        }
    });
    https.listener_filters = vec![ListenerFilter {
        name: TLS_INSPECTOR_FILTER.to_owned(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(proto::pack(
            &TlsInspector::default(),
        ))),
        ..Default::default()
    }];
    https
}

fn listener(
    name: &str,
    settings: &model::ListenerSettings,
    port: u16,
    filter_chains: Vec<FilterChain>,
) -> Listener {
    Listener {
        name: name.to_owned(),
        address: Some(Address {
            address: Some(address::Address::SocketAddress(SocketAddress {
                address: settings.address.clone(),
                port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
                ..Default::default()
            })),
        }),
        filter_chains,
        ..Default::default()
    }
}

fn tls_filter_chain(
    listener: &str,
    route_config: &str,
    host: &TlsHost<'_>,
    logs: &[AccessLog],
) -> FilterChain {
    let tls = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: vec![SdsSecretConfig {
                name: host.secret.to_owned(),
                sds_config: Some(proto::ads()),
            }],
            alpn_protocols: vec!["h2".to_owned(), "http/1.1".to_owned()],
            ..Default::default()
        }),
        ..Default::default()
    };
    FilterChain {
        name: host.virtual_host.to_owned(),
        filter_chain_match: Some(FilterChainMatch {
            // "*" (a Gateway listener's): every name, and none.
            server_names: host.hosts.iter().filter(|h| *h != "*").cloned().collect(),
            ..Default::default()
        }),
        filters: vec![hcm_filter(
            listener,
            route_config,
            Vec::new(),
            logs.to_vec(),
        )],
        transport_socket: Some(TransportSocket {
            name: TLS_TRANSPORT_SOCKET.to_owned(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(proto::pack(&tls))),
        }),
        ..Default::default()
    }
}

/// The HTTP connection manager: `filters` (health checks), then the router, routes from
/// `route_config` over ADS, each request logged to `access_log`.
fn hcm_filter(
    stat_prefix: &str,
    route_config: &str,
    mut http_filters: Vec<HttpFilter>,
    access_log: Vec<AccessLog>,
) -> Filter {
    http_filters.push(HttpFilter {
        name: ROUTER_FILTER.to_owned(),
        config_type: Some(http_filter::ConfigType::TypedConfig(proto::pack(
            &Router::default(),
        ))),
        ..Default::default()
    });
    let hcm = HttpConnectionManager {
        codec_type: CodecType::Auto as i32,
        stat_prefix: stat_prefix.to_owned(),
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: Some(proto::ads()),
            route_config_name: route_config.to_owned(),
        })),
        http_filters,
        access_log,
        // The connection itself says whether the request came over TLS (x-forwarded-proto),
        // which require_tls relies on.
        use_remote_address: proto::bool_value(true),
        normalize_path: proto::bool_value(true),
        ..Default::default()
    };
    Filter {
        name: HCM_FILTER.to_owned(),
        config_type: Some(filter::ConfigType::TypedConfig(proto::pack(&hcm))),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck;
    use prost::{Message, Name};

    use super::*;

    fn hcm(chain: &FilterChain) -> HttpConnectionManager {
        let Some(filter::ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
            panic!()
        };
        assert_eq!(any.type_url, HttpConnectionManager::type_url());
        HttpConnectionManager::decode(any.value.as_slice()).unwrap()
    }

    fn filter_types(hcm: &HttpConnectionManager) -> Vec<String> {
        hcm.http_filters
            .iter()
            .map(|f| match &f.config_type {
                Some(http_filter::ConfigType::TypedConfig(any)) => any.type_url.clone(),
                _ => panic!(),
            })
            .collect()
    }

    #[test]
    fn plain_listeners_without_tls() {
        let settings = model::ListenerSettings::default();
        let ls = listeners(&settings, &[], &[]);
        let names: Vec<_> = ls.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["http", "probe"]);
        for l in &ls {
            let h = hcm(&l.filter_chains[0]);
            assert_eq!(h.stat_prefix, l.name);
            assert!(h.use_remote_address.unwrap().value);
            assert!(h.normalize_path.unwrap().value);
            let Some(RouteSpecifier::Rds(rds)) = &h.route_specifier else {
                panic!()
            };
            assert_eq!(rds.route_config_name, ROUTE_CONFIG_NAME);
            assert_eq!(filter_types(&h), [Router::type_url()]);
        }
        let Some(address::Address::SocketAddress(sa)) = &ls[1].address.as_ref().unwrap().address
        else {
            panic!()
        };
        assert_eq!(
            sa.port_specifier,
            Some(socket_address::PortSpecifier::PortValue(8090))
        );
    }

    #[test]
    fn https_has_one_chain_per_tls_host() {
        let settings = model::ListenerSettings::default();
        let a = vec!["a.example.com".to_owned()];
        let b = vec!["*.b.example.com".to_owned(), "b.example.com".to_owned()];
        let hosts = [
            TlsHost {
                virtual_host: "ns/a",
                hosts: &a,
                secret: "ns/a-cert",
            },
            TlsHost {
                virtual_host: "ns/b",
                hosts: &b,
                secret: "ns/b-cert",
            },
        ];
        let ls = listeners(&settings, &hosts, &[]);
        let https = &ls[1];
        assert_eq!(https.name, "https");
        assert_eq!(https.listener_filters[0].name, TLS_INSPECTOR_FILTER);
        assert_eq!(https.filter_chains.len(), 2);
        let chain = &https.filter_chains[1];
        assert_eq!(chain.filter_chain_match.as_ref().unwrap().server_names, b);
        let socket = chain.transport_socket.as_ref().unwrap();
        let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
            panic!()
        };
        let tls = DownstreamTlsContext::decode(any.value.as_slice()).unwrap();
        let sds = &tls
            .common_tls_context
            .unwrap()
            .tls_certificate_sds_secret_configs[0];
        assert_eq!(sds.name, "ns/b-cert");
        assert!(sds.sds_config.is_some());
    }

    #[test]
    fn probe_listener_has_health_checks_before_the_router() {
        let settings = model::ListenerSettings {
            probe_token: "tok".into(),
            ..Default::default()
        };
        let p1 = model::EndpointProbe {
            id: "a".into(),
            clusters: BTreeMap::from([("c".into(), 1)]),
        };
        let p2 = model::EndpointProbe {
            id: "b".into(),
            clusters: BTreeMap::new(),
        };
        let ls = listeners(&settings, &[], &[&p1, &p2]);
        let h = hcm(&ls[1].filter_chains[0]);
        assert_eq!(
            filter_types(&h),
            [
                HealthCheck::type_url(),
                HealthCheck::type_url(),
                Router::type_url()
            ]
        );
        // The public listener never answers probes.
        assert_eq!(
            filter_types(&hcm(&ls[0].filter_chains[0])),
            [Router::type_url()]
        );
    }
}
