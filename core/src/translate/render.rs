//! A readable rendering of a snapshot, for golden tests and debugging: every resource with
//! its type, name and version, pretty-printed, with the nested `Any`s the translator packs
//! (HTTP connection manager, filters, TLS contexts, protocol options) decoded too.
//!
//! Fields at their protobuf default (absent on the wire: `None`, `[]`, `{}`, `""`, `false`,
//! `0`) are left out, except the `value` of wrapper types. Deterministic: maps are printed
//! in key order. Private keys are redacted.

use std::collections::BTreeMap;
use std::fmt::Write;

use envoy_types::pb::envoy::config::accesslog::v3::access_log;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{
    data_source::Specifier, substitution_format_string, transport_socket,
};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::{
    FilterChain, Listener, filter, listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::access_loggers::stream::v3::{
    StdoutAccessLog, stdout_access_log,
};
use envoy_types::pb::envoy::extensions::filters::http::buffer::v3::{Buffer, BufferPerRoute};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::{Cors, CorsPolicy};
use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck;
use envoy_types::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::proxy_protocol::v3::ProxyProtocol;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_filter,
};
use envoy_types::pb::envoy::extensions::http::early_header_mutation::header_mutation::v3::HeaderMutation as EarlyHeaderMutation;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, Secret, secret,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};

use crate::xds::{Resource, Snapshot};

/// Every resource of the snapshot, by type then name.
pub fn render_snapshot(snapshot: &Snapshot) -> String {
    let mut out = String::new();
    for (type_url, resources) in snapshot.types() {
        for resource in resources.values() {
            out.push_str(&render_resource(type_url, resource));
            out.push('\n');
        }
    }
    out
}

pub fn render_resource(type_url: &str, resource: &Resource) -> String {
    let short = type_url.rsplit('.').next().unwrap_or(type_url);
    format!(
        "=== {short} {:?} version {}\n{}",
        resource.name,
        resource.version,
        render_any(&resource.body)
    )
}

/// What a message prints after itself: nested `Any`s (decoded in turn) and sorted maps.
enum Nested {
    Any(Any),
    Text(String),
}

/// A decoded, pretty-printed `Any`, followed by its nested parts, each indented.
pub fn render_any(any: &Any) -> String {
    let mut nested: Vec<(String, Nested)> = Vec::new();
    let body = match any.type_url.as_str() {
        t if t == Listener::type_url() => decoded::<Listener>(any, |mut l| {
            for (i, f) in l.listener_filters.iter_mut().enumerate() {
                if let Some(listener_filter::ConfigType::TypedConfig(a)) = &mut f.config_type {
                    take(
                        a,
                        format!("listener_filters[{i}] {:?}", f.name),
                        &mut nested,
                    );
                }
            }
            for (i, chain) in l.filter_chains.iter_mut().enumerate() {
                take_chain(chain, &format!("filter_chains[{i}]"), &mut nested);
            }
            if let Some(chain) = &mut l.default_filter_chain {
                take_chain(chain, "default_filter_chain", &mut nested);
            }
            format!("{l:#?}")
        }),
        t if t == HttpConnectionManager::type_url() => {
            decoded::<HttpConnectionManager>(any, |mut h| {
                for (i, f) in h.http_filters.iter_mut().enumerate() {
                    if let Some(http_filter::ConfigType::TypedConfig(a)) = &mut f.config_type {
                        take(a, format!("http_filters[{i}] {:?}", f.name), &mut nested);
                    }
                }
                for (i, log) in h.access_log.iter_mut().enumerate() {
                    if let Some(access_log::ConfigType::TypedConfig(a)) = &mut log.config_type {
                        take(a, format!("access_log[{i}] {:?}", log.name), &mut nested);
                    }
                }
                for (i, e) in h.early_header_mutation_extensions.iter_mut().enumerate() {
                    if let Some(a) = &mut e.typed_config {
                        let at = format!("early_header_mutation_extensions[{i}] {:?}", e.name);
                        take(a, at, &mut nested);
                    }
                }
                format!("{h:#?}")
            })
        }
        t if t == HealthCheck::type_url() => decoded::<HealthCheck>(any, |mut h| {
            let map: BTreeMap<_, _> = std::mem::take(&mut h.cluster_min_healthy_percentages)
                .into_iter()
                .map(|(k, v)| (k, v.value))
                .collect();
            nested.push((
                "cluster_min_healthy_percentages (sorted)".to_owned(),
                Nested::Text(format!("{map:#?}")),
            ));
            format!("{h:#?}")
        }),
        t if t == Cluster::type_url() => decoded::<Cluster>(any, |mut c| {
            let map: BTreeMap<_, _> = std::mem::take(&mut c.typed_extension_protocol_options)
                .into_iter()
                .collect();
            for (key, a) in map {
                nested.push((
                    format!("typed_extension_protocol_options[{key:?}]"),
                    Nested::Any(a),
                ));
            }
            if let Some(socket) = &mut c.transport_socket
                && let Some(transport_socket::ConfigType::TypedConfig(a)) = &mut socket.config_type
            {
                take(a, "transport_socket".to_owned(), &mut nested);
            }
            format!("{c:#?}")
        }),
        t if t == Secret::type_url() => decoded::<Secret>(any, |mut s| {
            if let Some(secret::Type::TlsCertificate(cert)) = &mut s.r#type
                && let Some(key) = &mut cert.private_key
                && let Some(Specifier::InlineString(pem)) = &mut key.specifier
            {
                *pem = format!("<redacted: {} bytes>", pem.len());
            }
            format!("{s:#?}")
        }),
        t if t == RouteConfiguration::type_url() => decoded::<RouteConfiguration>(any, |mut m| {
            // Filter configurations per route are a map: printed sorted, after.
            for (i, vhost) in m.virtual_hosts.iter_mut().enumerate() {
                for (j, route) in vhost.routes.iter_mut().enumerate() {
                    let map: BTreeMap<_, _> = std::mem::take(&mut route.typed_per_filter_config)
                        .into_iter()
                        .collect();
                    for (key, a) in map {
                        nested.push((
                            format!(
                                "virtual_hosts[{i}] {:?} routes[{j}] {:?} typed_per_filter_config[{key:?}]",
                                vhost.name, route.name
                            ),
                            Nested::Any(a),
                        ));
                    }
                }
            }
            format!("{m:#?}")
        }),
        t if t == ClusterLoadAssignment::type_url() => {
            decoded::<ClusterLoadAssignment>(any, |m| format!("{m:#?}"))
        }
        t if t == DownstreamTlsContext::type_url() => {
            decoded::<DownstreamTlsContext>(any, |m| format!("{m:#?}"))
        }
        t if t == StdoutAccessLog::type_url() => decoded::<StdoutAccessLog>(any, |mut l| {
            // A JSON format's fields are a map: printed sorted, after.
            if let Some(stdout_access_log::AccessLogFormat::LogFormat(format)) =
                &mut l.access_log_format
                && let Some(substitution_format_string::Format::JsonFormat(json)) =
                    &mut format.format
            {
                let map: BTreeMap<_, _> = std::mem::take(&mut json.fields)
                    .into_iter()
                    .map(|(k, v)| (k, v.kind))
                    .collect();
                nested.push((
                    "json_format (sorted)".to_owned(),
                    Nested::Text(format!("{map:#?}")),
                ));
            }
            format!("{l:#?}")
        }),
        t if t == Router::type_url() => decoded::<Router>(any, |m| format!("{m:#?}")),
        t if t == EarlyHeaderMutation::type_url() => {
            decoded::<EarlyHeaderMutation>(any, |m| format!("{m:#?}"))
        }
        t if t == Cors::type_url() => decoded::<Cors>(any, |m| format!("{m:#?}")),
        t if t == CorsPolicy::type_url() => decoded::<CorsPolicy>(any, |m| format!("{m:#?}")),
        t if t == LocalRateLimit::type_url() => {
            decoded::<LocalRateLimit>(any, |m| format!("{m:#?}"))
        }
        t if t == Buffer::type_url() => decoded::<Buffer>(any, |m| format!("{m:#?}")),
        t if t == BufferPerRoute::type_url() => {
            decoded::<BufferPerRoute>(any, |m| format!("{m:#?}"))
        }
        t if t == TlsInspector::type_url() => decoded::<TlsInspector>(any, |m| format!("{m:#?}")),
        t if t == ProxyProtocol::type_url() => decoded::<ProxyProtocol>(any, |m| format!("{m:#?}")),
        t if t == HttpProtocolOptions::type_url() => {
            decoded::<HttpProtocolOptions>(any, |m| format!("{m:#?}"))
        }
        _ => format!("{any:#?}"),
    };
    let mut out = compact(&body);
    for (path, part) in nested {
        let text = match part {
            Nested::Any(a) => format!("{}: {}\n{}", path, a.type_url, render_any(&a)),
            Nested::Text(t) => format!("{path}:\n{t}\n"),
        };
        let _ = write!(out, "{}", indent(&format!("--- {text}")));
    }
    out
}

/// Drops the lines of a `{:#?}` rendering that show a field at its default value.
fn compact(debug: &str) -> String {
    let mut out = String::new();
    for line in debug.lines() {
        let is_default = line
            .trim_start()
            .split_once(": ")
            .is_some_and(|(field, value)| {
                let default = matches!(
                    value,
                    "None," | "[]," | "{}," | "\"\"," | "false," | "0," | "0.0,"
                );
                default && (field != "value" || value == "[],")
            });
        if !is_default {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn decoded<M: Message + Default>(any: &Any, print: impl FnOnce(M) -> String) -> String {
    match M::decode(any.value.as_slice()) {
        Ok(m) => print(m),
        Err(e) => format!("<cannot decode {}: {e}>", any.type_url),
    }
}

/// Moves a nested `Any` out (its bytes replaced by nothing) to print it decoded after.
fn take(any: &mut Any, path: String, nested: &mut Vec<(String, Nested)>) {
    let value = std::mem::take(&mut any.value);
    nested.push((
        path,
        Nested::Any(Any {
            type_url: any.type_url.clone(),
            value,
        }),
    ));
}

fn take_chain(chain: &mut FilterChain, path: &str, nested: &mut Vec<(String, Nested)>) {
    for (j, f) in chain.filters.iter_mut().enumerate() {
        if let Some(filter::ConfigType::TypedConfig(a)) = &mut f.config_type {
            take(a, format!("{path}.filters[{j}] {:?}", f.name), nested);
        }
    }
    if let Some(socket) = &mut chain.transport_socket
        && let Some(transport_socket::ConfigType::TypedConfig(a)) = &mut socket.config_type
    {
        take(
            a,
            format!("{path}.transport_socket {:?}", socket.name),
            nested,
        );
    }
}

fn indent(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        if line.is_empty() {
            out.push('\n');
        } else {
            let _ = writeln!(out, "    {line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model;
    use crate::translate::translate;

    #[test]
    fn renders_nested_configuration_and_redacts_keys() {
        let config = model::Config {
            gateway_listeners: Vec::new(),
            listeners: model::ListenerSettings {
                probe_token: "tok".into(),
                ..Default::default()
            },
            virtual_hosts: vec![model::VirtualHost {
                listener: None,
                leaving: false,
                created: None,
                name: "ns/vh".into(),
                hosts: vec!["a.example.com".into()],
                tls: Some(model::VirtualHostTls {
                    secret: "ns/cert".into(),
                    redirect_http: true,
                    listener_hostname: None,
                }),
                routes: vec![model::Route {
                    name: "redirect".into(),
                    path: model::PathMatch::Prefix("/".into()),
                    headers: vec![],
                    method: None,
                    query: Vec::new(),
                    action: model::RouteAction::RedirectHttps,
                    request_headers: Default::default(),
                    response_headers: Default::default(),
                }],
            }],
            clusters: vec![],
            secrets: vec![model::TlsSecret {
                name: "ns/cert".into(),
                certificate_chain: "CERT".into(),
                private_key: "TOPSECRET".into(),
            }],
            endpoint_probes: vec![],
            version_probes: vec![],
        };
        let text = render_snapshot(&translate(&config).snapshot);
        assert!(!text.contains("TOPSECRET"), "{text}");
        assert!(text.contains("<redacted: 9 bytes>"), "{text}");
        assert!(text.contains("route_config_name: \"switchyard\""), "{text}");
        assert!(
            text.contains("tls_certificate_sds_secret_configs"),
            "{text}"
        );
        assert!(text.contains("TlsInspector"), "{text}");
        assert_eq!(text, render_snapshot(&translate(&config).snapshot));
    }
}
