//! Listeners: "http", "https" (only when a virtual host has TLS) and the internal "probe"
//! listener, which route with the shared route configuration; and for each Gateway
//! listener, its public listener and its internal probe twin, which route with its own.
//! Every route configuration comes over RDS.

use envoy_types::pb::envoy::config::common::mutation_rules::v3::{HeaderMutation, header_mutation};
use envoy_types::pb::envoy::config::core::v3::{
    Address, HeaderValue, HeaderValueOption, SocketAddress, TransportSocket, TypedExtensionConfig,
    address, header_value_option::HeaderAppendAction, socket_address, transport_socket,
};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter, listener_filter,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::proxy_protocol::v3::ProxyProtocol;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager::CodecType,
    http_connection_manager::RouteSpecifier, http_filter,
};
use envoy_types::pb::envoy::extensions::http::early_header_mutation::header_mutation::v3::HeaderMutation as EarlyHeaderMutation;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext,
    certificate_validation_context::TrustChainVerification, common_tls_context,
};

use envoy_types::pb::envoy::config::accesslog::v3::AccessLog;

use super::route::LISTENER_HEADER;
use super::{
    HTTP_LISTENER, HTTPS_LISTENER, PROBE_LISTENER, ROUTE_CONFIG_NAME, access_log, http_filters,
    probe, proto,
};
use crate::model;

pub const HCM_FILTER: &str = "envoy.filters.network.http_connection_manager";
pub const ROUTER_FILTER: &str = "envoy.filters.http.router";
pub const TLS_INSPECTOR_FILTER: &str = "envoy.filters.listener.tls_inspector";
pub const PROXY_PROTOCOL_FILTER: &str = "envoy.filters.listener.proxy_protocol";
pub const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";
pub const EARLY_HEADER_MUTATION: &str = "envoy.http.early_header_mutation.header_mutation";

/// A served virtual host with TLS: its own filter chain on the HTTPS listener (its Gateway
/// listener's, when it has one).
pub struct TlsHost<'a> {
    pub virtual_host: &'a str,
    /// Normalized (sorted, lower-case) hosts; they become SNI `server_names`.
    pub hosts: &'a [String],
    pub secret: &'a str,
    /// The Gateway listener the chain serves, when its port has several: every request
    /// is tagged with it ([`LISTENER_HEADER`]), for its virtual host to check.
    pub listener_hostname: Option<&'a str>,
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
        Side::Public,
    )];
    if !tls_hosts.is_empty() {
        out.push(tls_listener(
            HTTPS_LISTENER,
            settings,
            settings.https_port,
            ROUTE_CONFIG_NAME,
            tls_hosts,
            None,
            None,
        ));
    }
    let health_checks = std::iter::once(probe::readiness_filter())
        .chain(
            probes
                .iter()
                .map(|p| probe::health_check_filter(p, &settings.probe_token)),
        )
        .collect();
    out.push(plain_listener(
        PROBE_LISTENER,
        settings,
        settings.probe_port,
        ROUTE_CONFIG_NAME,
        health_checks,
        Side::Probe,
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
            Side::Public,
        ));
    } else if !tls_hosts.is_empty() || default_secret.is_some() {
        out.push(tls_listener(
            name,
            settings,
            gateway.port,
            name,
            tls_hosts,
            default_secret,
            gateway.client_validation.as_ref(),
        ));
    }
    out.push(plain_listener(
        &gateway_probe_listener(name),
        settings,
        gateway.probe_port,
        name,
        Vec::new(),
        Side::Probe,
    ));
    out
}

/// Whom a listener faces: clients (access-logged, behind the proxies the client IP
/// settings trust), or the prober.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Public,
    Probe,
}

/// What the connection managers of a listener add to the common ones.
#[derive(Clone, Default)]
struct ManagerExtras {
    access_log: Vec<AccessLog>,
    xff_num_trusted_hops: u32,
    /// The Gateway listener the connection came in on, to tag each request with.
    listener_hostname: Option<String>,
}

fn manager_extras(settings: &model::ListenerSettings, side: Side) -> ManagerExtras {
    match side {
        Side::Public => ManagerExtras {
            access_log: access_log::access_logs(&settings.access_log),
            xff_num_trusted_hops: settings.client_ip.xff_trusted_hops,
            listener_hostname: None,
        },
        Side::Probe => ManagerExtras::default(),
    }
}

/// The PROXY protocol filter, when the public listeners read one. Connections without
/// the header are served too, with their own source address: so it can be turned on
/// before the load balancer sends it, and off after it stops, dropping nothing.
pub(super) fn proxy_protocol(
    settings: &model::ListenerSettings,
    side: Side,
) -> Option<ListenerFilter> {
    (side == Side::Public && settings.client_ip.proxy_protocol).then(|| ListenerFilter {
        name: PROXY_PROTOCOL_FILTER.to_owned(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(proto::pack(
            &ProxyProtocol {
                allow_requests_without_proxy_protocol: true,
                ..Default::default()
            },
        ))),
        ..Default::default()
    })
}

/// A plain-HTTP listener: `http_filters` (health checks), then the router.
fn plain_listener(
    name: &str,
    settings: &model::ListenerSettings,
    port: u16,
    route_config: &str,
    http_filters: Vec<HttpFilter>,
    side: Side,
) -> Listener {
    let extras = manager_extras(settings, side);
    let mut plain = listener(
        name,
        settings,
        port,
        vec![FilterChain {
            filters: vec![hcm_filter(name, route_config, http_filters, extras)],
            ..Default::default()
        }],
    );
    plain.listener_filters = proxy_protocol(settings, side).into_iter().collect();
    plain
}

/// An HTTPS listener: one filter chain per TLS host, chosen by SNI, and the default chain
/// (for any other name) with `default_secret`; every chain checks client certificates
/// as `client_validation` says.
fn tls_listener(
    name: &str,
    settings: &model::ListenerSettings,
    port: u16,
    route_config: &str,
    tls_hosts: &[TlsHost<'_>],
    default_secret: Option<&str>,
    client_validation: Option<&model::ClientValidation>,
) -> Listener {
    let extras = manager_extras(settings, Side::Public);
    let chains = tls_hosts
        .iter()
        .map(|h| tls_filter_chain(name, route_config, h, client_validation, &extras))
        .collect();
    let mut https = listener(name, settings, port, chains);
    https.default_filter_chain = default_secret.map(|secret| {
        let any = TlsHost {
            virtual_host: "default",
            hosts: &[],
            secret,
            listener_hostname: None,
        };
        FilterChain {
            filter_chain_match: None,
            ..tls_filter_chain(name, route_config, &any, client_validation, &extras)
        }
    });
    // The PROXY header comes before the TLS handshake the inspector reads.
    https.listener_filters = proxy_protocol(settings, Side::Public)
        .into_iter()
        .chain([ListenerFilter {
            name: TLS_INSPECTOR_FILTER.to_owned(),
            config_type: Some(listener_filter::ConfigType::TypedConfig(proto::pack(
                &TlsInspector::default(),
            ))),
            ..Default::default()
        }])
        .collect();
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
        address: Some(socket_address(&settings.address, port)),
        filter_chains,
        ..Default::default()
    }
}

/// The address `host`:`port` (TCP).
pub(super) fn socket_address(host: &str, port: u16) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: host.to_owned(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
            ..Default::default()
        })),
    }
}

fn tls_filter_chain(
    listener: &str,
    route_config: &str,
    host: &TlsHost<'_>,
    client_validation: Option<&model::ClientValidation>,
    extras: &ManagerExtras,
) -> FilterChain {
    let tls = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: vec![proto::sds(host.secret)],
            alpn_protocols: vec!["h2".to_owned(), "http/1.1".to_owned()],
            validation_context_type: client_validation.map(validation_context),
            ..Default::default()
        }),
        require_client_certificate: client_validation
            .map(|v| proto::bool_value(!v.insecure_fallback))
            .unwrap_or_default(),
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
            ManagerExtras {
                listener_hostname: host.listener_hostname.map(str::to_owned),
                ..extras.clone()
            },
        )],
        transport_socket: Some(TransportSocket {
            name: TLS_TRANSPORT_SOCKET.to_owned(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(proto::pack(&tls))),
        }),
        ..Default::default()
    }
}

/// The authorities a client certificate must chain to, inline. With the insecure
/// fallback, a certificate that does not verify is let through as if none were sent
/// (`ACCEPT_UNTRUSTED`); without it, the handshake fails.
fn validation_context(
    validation: &model::ClientValidation,
) -> common_tls_context::ValidationContextType {
    let verification = if validation.insecure_fallback {
        TrustChainVerification::AcceptUntrusted
    } else {
        TrustChainVerification::VerifyTrustChain
    };
    common_tls_context::ValidationContextType::ValidationContext(CertificateValidationContext {
        trusted_ca: Some(proto::inline(&validation.ca_certificates)),
        trust_chain_verification: verification as i32,
        ..Default::default()
    })
}

/// The HTTP connection manager: `filters` (health checks), the filters routes can turn on
/// (disabled until they do), then the router, routes from
/// `route_config` over ADS, each request logged to `access_log`.
fn hcm_filter(
    stat_prefix: &str,
    route_config: &str,
    mut http_filters: Vec<HttpFilter>,
    extras: ManagerExtras,
) -> Filter {
    http_filters.extend(http_filters::disabled_filters());
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
        access_log: extras.access_log,
        // Of the addresses in X-Forwarded-For, the one this many hops from the right is
        // the client's (0: the connection's peer, or what a PROXY header says).
        xff_num_trusted_hops: extras.xff_num_trusted_hops,
        // The connection itself says whether the request came over TLS (x-forwarded-proto),
        // which require_tls relies on.
        use_remote_address: proto::bool_value(true),
        normalize_path: proto::bool_value(true),
        early_header_mutation_extensions: extras
            .listener_hostname
            .iter()
            .map(|l| listener_tag(l))
            .collect(),
        ..Default::default()
    };
    Filter {
        name: HCM_FILTER.to_owned(),
        config_type: Some(filter::ConfigType::TypedConfig(proto::pack(&hcm))),
    }
}

/// Tags each request with the Gateway listener its connection came in on, before any
/// route is chosen, overwriting what the client sent under that name.
fn listener_tag(listener_hostname: &str) -> TypedExtensionConfig {
    let tag = HeaderMutation {
        action: Some(header_mutation::Action::Append(HeaderValueOption {
            header: Some(HeaderValue {
                key: LISTENER_HEADER.to_owned(),
                value: listener_hostname.to_owned(),
                ..Default::default()
            }),
            append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
            ..Default::default()
        })),
    };
    TypedExtensionConfig {
        name: EARLY_HEADER_MUTATION.to_owned(),
        typed_config: Some(proto::pack(&EarlyHeaderMutation {
            mutations: vec![tag],
        })),
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
    use std::collections::BTreeMap;

    use envoy_types::pb::envoy::extensions::filters::http::buffer::v3::Buffer;
    use envoy_types::pb::envoy::extensions::filters::http::cors::v3::Cors;
    use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck;
    use envoy_types::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit;
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

    /// `first`, then the filters routes can turn on, then the router.
    fn after(first: &[String]) -> Vec<String> {
        let mut types = first.to_vec();
        types.extend([
            Cors::type_url(),
            LocalRateLimit::type_url(),
            Buffer::type_url(),
            Router::type_url(),
        ]);
        types
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
            // The probe listener answers the fleet's readiness probe, always.
            let own = if l.name == "probe" {
                vec![HealthCheck::type_url()]
            } else {
                Vec::new()
            };
            assert_eq!(filter_types(&h), after(&own));
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
                listener_hostname: None,
            },
            TlsHost {
                virtual_host: "ns/b",
                hosts: &b,
                secret: "ns/b-cert",
                listener_hostname: None,
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

    /// Gateway listener `gw/web/https` on 20001, default secret `web/cert`.
    fn https_gateway(client_validation: Option<model::ClientValidation>) -> model::GatewayListener {
        model::GatewayListener {
            name: "gw/web/https".into(),
            port: 20001,
            probe_port: 10001,
            tls: true,
            default_secret: Some("web/cert".into()),
            client_validation,
            protocol: model::ListenerProtocol::Http,
        }
    }

    #[test]
    fn a_gateway_chain_of_one_listener_tags_its_requests_before_routing() {
        let settings = model::ListenerSettings::default();
        let gateway = https_gateway(None);
        let any = vec!["*".to_owned()];
        let hosts = [TlsHost {
            virtual_host: "gw/web/any",
            hosts: &any,
            secret: "web/cert",
            listener_hostname: Some("*"),
        }];
        let ls = gateway_listeners(&settings, &gateway, &hosts, Some("web/cert"));
        let tags = |chain: &FilterChain| -> Vec<String> {
            hcm(chain)
                .early_header_mutation_extensions
                .iter()
                .map(|e| {
                    let any = e.typed_config.as_ref().unwrap();
                    let m = EarlyHeaderMutation::decode(any.value.as_slice()).unwrap();
                    let Some(header_mutation::Action::Append(add)) = &m.mutations[0].action else {
                        panic!("{m:?}")
                    };
                    let header = add.header.as_ref().unwrap();
                    assert_eq!(
                        add.append_action,
                        HeaderAppendAction::OverwriteIfExistsOrAdd as i32
                    );
                    format!("{}={}", header.key, header.value)
                })
                .collect()
        };
        assert_eq!(tags(&ls[0].filter_chains[0]), ["x-switchyard-listener=*"]);
        // Nothing tags the default chain's requests, nor the probe twin's.
        assert!(tags(ls[0].default_filter_chain.as_ref().unwrap()).is_empty());
        assert!(tags(&ls[1].filter_chains[0]).is_empty());
    }

    fn downstream_tls(chain: &FilterChain) -> DownstreamTlsContext {
        let socket = chain.transport_socket.as_ref().unwrap();
        let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
            panic!("{socket:?}")
        };
        DownstreamTlsContext::decode(any.value.as_slice()).unwrap()
    }

    #[test]
    fn every_chain_of_a_port_checks_client_certificates_as_its_validation_says() {
        let settings = model::ListenerSettings::default();
        let host = vec!["a.example.com".to_owned()];
        let hosts = [TlsHost {
            virtual_host: "gw/web/a",
            hosts: &host,
            secret: "web/cert",
            listener_hostname: None,
        }];
        for insecure_fallback in [false, true] {
            let gateway = https_gateway(Some(model::ClientValidation {
                ca_certificates: "CA PEM".into(),
                insecure_fallback,
            }));
            let ls = gateway_listeners(&settings, &gateway, &hosts, Some("web/cert"));
            let chains = [
                &ls[0].filter_chains[0],
                ls[0].default_filter_chain.as_ref().unwrap(),
            ];
            for chain in chains {
                let tls = downstream_tls(chain);
                // Without the fallback a client must present a certificate that verifies.
                assert_eq!(
                    tls.require_client_certificate,
                    proto::bool_value(!insecure_fallback)
                );
                let common = tls.common_tls_context.unwrap();
                let Some(common_tls_context::ValidationContextType::ValidationContext(v)) =
                    common.validation_context_type
                else {
                    panic!("no validation context")
                };
                let Some(Specifier::InlineString(ca)) = v.trusted_ca.unwrap().specifier else {
                    panic!("CA not inline")
                };
                assert_eq!(ca, "CA PEM");
                let verification = if insecure_fallback {
                    TrustChainVerification::AcceptUntrusted
                } else {
                    TrustChainVerification::VerifyTrustChain
                };
                assert_eq!(v.trust_chain_verification, verification as i32);
            }
        }
        // Without one, no chain asks for a client certificate.
        let gateway = https_gateway(None);
        let ls = gateway_listeners(&settings, &gateway, &hosts, Some("web/cert"));
        let tls = downstream_tls(&ls[0].filter_chains[0]);
        assert_eq!(tls.require_client_certificate, None);
        assert!(
            tls.common_tls_context
                .unwrap()
                .validation_context_type
                .is_none()
        );
    }

    #[test]
    fn only_public_listeners_trust_proxies_for_the_client_address() {
        let settings = model::ListenerSettings {
            client_ip: model::ClientIp {
                xff_trusted_hops: 2,
                proxy_protocol: true,
            },
            ..Default::default()
        };
        let host = vec!["a.example.com".to_owned()];
        let tls = [TlsHost {
            virtual_host: "ns/a",
            hosts: &host,
            secret: "ns/a-cert",
            listener_hostname: None,
        }];
        let ls = listeners(&settings, &tls, &[]);
        let filters = |l: &Listener| -> Vec<String> {
            l.listener_filters.iter().map(|f| f.name.clone()).collect()
        };
        assert_eq!(ls[0].name, "http");
        assert_eq!(filters(&ls[0]), [PROXY_PROTOCOL_FILTER]);
        assert_eq!(hcm(&ls[0].filter_chains[0]).xff_num_trusted_hops, 2);
        assert_eq!(ls[1].name, "https");
        assert_eq!(
            filters(&ls[1]),
            [PROXY_PROTOCOL_FILTER, TLS_INSPECTOR_FILTER]
        );
        assert_eq!(hcm(&ls[1].filter_chains[0]).xff_num_trusted_hops, 2);
        let Some(listener_filter::ConfigType::TypedConfig(any)) =
            &ls[0].listener_filters[0].config_type
        else {
            panic!()
        };
        let proxy = ProxyProtocol::decode(any.value.as_slice()).unwrap();
        assert!(proxy.allow_requests_without_proxy_protocol);
        // The prober connects directly and sends no PROXY header.
        assert_eq!(ls[2].name, "probe");
        assert!(filters(&ls[2]).is_empty());
        assert_eq!(hcm(&ls[2].filter_chains[0]).xff_num_trusted_hops, 0);
        // By default: neither.
        let ls = listeners(&model::ListenerSettings::default(), &[], &[]);
        assert!(filters(&ls[0]).is_empty());
        assert_eq!(hcm(&ls[0].filter_chains[0]).xff_num_trusted_hops, 0);
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
        // Readiness first, then one per endpoint probe.
        assert_eq!(
            filter_types(&h),
            after(&[
                HealthCheck::type_url(),
                HealthCheck::type_url(),
                HealthCheck::type_url()
            ])
        );
        // The public listener never answers probes.
        assert_eq!(filter_types(&hcm(&ls[0].filter_chains[0])), after(&[]));
    }
}
