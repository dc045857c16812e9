//! The one RouteConfiguration, "switchyard": every served virtual host, user and probe;
//! and the same in parts (see `xds::vhds`). What Envoy would refuse of a virtual host is
//! found first, in [`validation`]; this encodes what passed.

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::route::v3::{
    self as envoy_route, DirectResponseAction, HeaderMatcher, QueryParameterMatcher,
    RedirectAction, RetryPolicy, RouteAction, RouteConfiguration, RouteMatch, Vhds,
    WeightedCluster, header_matcher::HeaderMatchSpecifier,
    query_parameter_matcher::QueryParameterMatchSpecifier, redirect_action,
    retry_policy::RetryBackOff, route::Action, route_action::ClusterNotFoundResponseCode,
    route_action::ClusterSpecifier, route_action::HashPolicy, route_action::RequestMirrorPolicy,
    route_action::UpgradeConfig, route_action::hash_policy::ConnectionProperties,
    route_action::hash_policy::Cookie, route_action::hash_policy::Header,
    route_action::hash_policy::PolicySpecifier, route_match::PathSpecifier,
    virtual_host::TlsRequirementType, weighted_cluster::ClusterWeight,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    RegexMatchAndSubstitute, RegexMatcher, StringMatcher, string_matcher::MatchPattern,
};

use envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent;
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent::DenominatorType};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use super::{http_filters, proto};
use crate::model;

mod validation;

pub use validation::{validate_routes, validate_virtual_host};

/// The domains of a virtual host as served: lower-cased (Envoy matches hosts
/// case-insensitively and rejects duplicates after lower-casing), sorted, deduplicated.
pub fn normalized_hosts(vh: &model::VirtualHost) -> Vec<String> {
    let mut hosts: Vec<String> = vh.hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
    hosts.sort();
    hosts.dedup();
    hosts
}
/// The clusters a (valid) virtual host routes to.
pub fn referenced_clusters(vh: &model::VirtualHost) -> impl Iterator<Item = &str> {
    routed_clusters(&vh.routes)
}

/// The clusters these routes send to.
pub fn routed_clusters(routes: &[model::Route]) -> impl Iterator<Item = &str> {
    routes.iter().flat_map(|r| match &r.action {
        model::RouteAction::Forward(f) => (f.backends.iter().map(|b| b.cluster.as_str()))
            .chain(f.mirrors.iter().map(|m| m.cluster.as_str()))
            .collect(),
        model::RouteAction::RedirectHttps
        | model::RouteAction::Redirect(_)
        | model::RouteAction::Respond(_) => Vec::new(),
    })
}

/// The request header a Gateway port's TLS filter chains tag each request with: the
/// hostname of the listener whose certificate the connection was made with (`*`: the
/// listener without one; [`NO_LISTENER`]: none). Removed before any upstream sees it.
pub const LISTENER_HEADER: &str = "x-switchyard-listener";

/// The [`LISTENER_HEADER`] value of a connection no listener's hostname claims.
pub const NO_LISTENER: &str = "-";

/// The name of the route answering 421 to a request that came in on another listener.
pub const MISDIRECTED_ROUTE: &str = "switchyard/misdirected";

/// A validated virtual host, with its normalized hosts.
pub fn virtual_host(vh: &model::VirtualHost, hosts: &[String]) -> envoy_route::VirtualHost {
    let redirect = vh.tls.as_ref().is_some_and(|t| t.redirect_http);
    let listener = vh.tls.as_ref().and_then(|t| t.listener_hostname.as_deref());
    envoy_route::VirtualHost {
        name: vh.name.clone(),
        domains: hosts.to_vec(),
        routes: (listener.map(misdirected).into_iter())
            .chain(vh.routes.iter().map(route))
            .collect(),
        require_tls: if redirect {
            TlsRequirementType::All
        } else {
            TlsRequirementType::None
        } as i32,
        request_headers_to_remove: listener
            .map(|_| LISTENER_HEADER.to_owned())
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

/// 421 Misdirected Request for a request tagged with another listener than `listener`:
/// a client reusing a connection (HTTP/2 coalescing) made for another listener's
/// hostname, whose certificate may not be this one's. An untagged request (the probe
/// listener's) is routed as usual.
fn misdirected(listener: &str) -> envoy_route::Route {
    let tag = |specifier, invert_match| HeaderMatcher {
        name: LISTENER_HEADER.to_owned(),
        invert_match,
        header_match_specifier: Some(specifier),
        ..Default::default()
    };
    envoy_route::Route {
        name: MISDIRECTED_ROUTE.to_owned(),
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::Prefix("/".to_owned())),
            headers: vec![
                tag(HeaderMatchSpecifier::PresentMatch(true), false),
                tag(
                    HeaderMatchSpecifier::StringMatch(StringMatcher {
                        match_pattern: Some(MatchPattern::Exact(listener.to_owned())),
                        ..Default::default()
                    }),
                    true,
                ),
            ],
            ..Default::default()
        }),
        action: Some(Action::DirectResponse(DirectResponseAction {
            status: 421,
            ..Default::default()
        })),
        ..Default::default()
    }
}

pub fn route(r: &model::Route) -> envoy_route::Route {
    let path_specifier = match &r.path {
        model::PathMatch::Prefix(p) => PathSpecifier::Prefix(p.clone()),
        model::PathMatch::SegmentPrefix(p) => PathSpecifier::PathSeparatedPrefix(p.clone()),
        model::PathMatch::Exact(p) => PathSpecifier::Path(p.clone()),
        model::PathMatch::Regex(p) => PathSpecifier::SafeRegex(regex_matcher(p)),
    };
    let action = match &r.action {
        model::RouteAction::Forward(f) => Action::Route(route_action(f, &r.path)),
        model::RouteAction::RedirectHttps => Action::Redirect(RedirectAction {
            scheme_rewrite_specifier: Some(redirect_action::SchemeRewriteSpecifier::HttpsRedirect(
                true,
            )),
            ..Default::default()
        }),
        model::RouteAction::Redirect(r) => Action::Redirect(redirect_action(r)),
        model::RouteAction::Respond(status) => Action::DirectResponse(DirectResponseAction {
            status: u32::from(*status),
            ..Default::default()
        }),
    };
    envoy_route::Route {
        name: r.name.clone(),
        r#match: Some(RouteMatch {
            headers: r
                .headers
                .iter()
                .map(header_matcher)
                .chain(r.method.as_deref().map(method_matcher))
                .collect(),
            query_parameters: r.query.iter().map(query_matcher).collect(),
            path_specifier: Some(path_specifier),
            ..Default::default()
        }),
        request_headers_to_add: headers_to_add(&r.request_headers),
        request_headers_to_remove: r.request_headers.remove.clone(),
        response_headers_to_add: headers_to_add(&r.response_headers),
        response_headers_to_remove: r.response_headers.remove.clone(),
        action: Some(action),
        typed_per_filter_config: match &r.action {
            model::RouteAction::Forward(f) => http_filters::per_route(f),
            _ => Default::default(),
        },
        ..Default::default()
    }
}

/// A virtual host's encoding, the same bytes for the same host: each route's
/// `typed_per_filter_config` (a `HashMap`) is encoded in key order. The host without its
/// routes, then each route as a further entry of `routes` (field 3), in order.
pub fn encode_virtual_host(mut vhost: envoy_route::VirtualHost) -> Vec<u8> {
    let routes = std::mem::take(&mut vhost.routes);
    let mut bytes = vhost.encode_to_vec();
    for route in routes {
        let encoded = proto::encode_with_sorted_map(route, |r| &mut r.typed_per_filter_config);
        prost::encoding::encode_key(3, prost::encoding::WireType::LengthDelimited, &mut bytes);
        prost::encoding::encode_varint(encoded.len() as u64, &mut bytes);
        bytes.extend_from_slice(&encoded);
    }
    bytes
}

fn redirect_action(r: &model::Redirect) -> RedirectAction {
    use redirect_action::{PathRewriteSpecifier, RedirectResponseCode, SchemeRewriteSpecifier};
    let code = match r.status {
        301 => RedirectResponseCode::MovedPermanently,
        303 => RedirectResponseCode::SeeOther,
        307 => RedirectResponseCode::TemporaryRedirect,
        308 => RedirectResponseCode::PermanentRedirect,
        _ => RedirectResponseCode::Found,
    };
    RedirectAction {
        scheme_rewrite_specifier: r.scheme.clone().map(SchemeRewriteSpecifier::SchemeRedirect),
        host_redirect: r.host.clone().unwrap_or_default(),
        port_redirect: r.port.map(u32::from).unwrap_or(0),
        path_rewrite_specifier: r.path.as_ref().map(|p| match p {
            model::RedirectPath::Full(p) => PathRewriteSpecifier::PathRedirect(p.clone()),
            model::RedirectPath::Prefix(p) => PathRewriteSpecifier::PrefixRewrite(p.clone()),
        }),
        response_code: code as i32,
        strip_query: false,
    }
}

fn regex_matcher(pattern: &str) -> RegexMatcher {
    // No engine_type: Envoy's default engine is RE2.
    RegexMatcher {
        regex: pattern.to_owned(),
        ..Default::default()
    }
}

/// Envoy matches the method as the `:method` pseudo-header.
fn method_matcher(method: &str) -> HeaderMatcher {
    header_matcher(&model::HeaderMatch {
        name: ":method".to_owned(),
        value: model::HeaderValueMatch::Exact(method.to_owned()),
        invert: false,
    })
}

fn query_matcher(q: &model::QueryMatch) -> QueryParameterMatcher {
    let string = |pattern| {
        QueryParameterMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(pattern),
            ..Default::default()
        })
    };
    let specifier = match &q.value {
        model::QueryValueMatch::Exact(v) => string(MatchPattern::Exact(v.clone())),
        model::QueryValueMatch::Regex(v) => string(MatchPattern::SafeRegex(regex_matcher(v))),
        model::QueryValueMatch::Present => QueryParameterMatchSpecifier::PresentMatch(true),
    };
    QueryParameterMatcher {
        name: q.name.clone(),
        query_parameter_match_specifier: Some(specifier),
    }
}

fn header_matcher(h: &model::HeaderMatch) -> HeaderMatcher {
    let string = |pattern| {
        HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(pattern),
            ..Default::default()
        })
    };
    let specifier = match &h.value {
        model::HeaderValueMatch::Exact(v) => string(MatchPattern::Exact(v.clone())),
        model::HeaderValueMatch::Prefix(v) => string(MatchPattern::Prefix(v.clone())),
        model::HeaderValueMatch::Regex(v) => string(MatchPattern::SafeRegex(regex_matcher(v))),
        model::HeaderValueMatch::Present => HeaderMatchSpecifier::PresentMatch(true),
    };
    HeaderMatcher {
        name: h.name.clone(),
        invert_match: h.invert,
        header_match_specifier: Some(specifier),
        ..Default::default()
    }
}

fn headers_to_add(
    edits: &model::HeaderEdits,
) -> Vec<envoy_types::pb::envoy::config::core::v3::HeaderValueOption> {
    let set = edits
        .set
        .iter()
        .map(|(k, v)| proto::header(k, &literal(v), HeaderAppendAction::OverwriteIfExistsOrAdd));
    let add = edits
        .add
        .iter()
        .map(|(k, v)| proto::header(k, &literal(v), HeaderAppendAction::AppendIfExistsOrAdd));
    set.chain(add).collect()
}

/// The rewrite of a prefix ending in `/` after a segment prefix: the slashes after the
/// matched segments go with it, so `/api/x` becomes `/x` for `/`, never `//x` (Envoy's
/// prefix_rewrite replaces the matched characters only).
fn segment_prefix_rewrite(
    f: &model::Forward,
    path: &model::PathMatch,
) -> Option<RegexMatchAndSubstitute> {
    let model::PathMatch::SegmentPrefix(prefix) = path else {
        return None;
    };
    let replacement = f.prefix_rewrite.as_ref().filter(|r| r.ends_with('/'))?;
    Some(RegexMatchAndSubstitute {
        pattern: Some(regex_matcher(&format!("^{}/*", regex_literal(prefix)))),
        substitution: replacement.clone(),
    })
}

/// `text` as a regular expression that matches exactly it.
fn regex_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn route_action(f: &model::Forward, path: &model::PathMatch) -> RouteAction {
    let segment_rewrite = segment_prefix_rewrite(f, path);
    let cluster_specifier = match f.backends.as_slice() {
        [single] if single.request_headers.is_empty() && f.unavailable_weight == 0 => {
            ClusterSpecifier::Cluster(single.cluster.clone())
        }
        // Edits of a backend's own are the weighted cluster's, even when it is the only one;
        // so is the share of 500s.
        several => ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: several
                .iter()
                .map(|b| ClusterWeight {
                    name: b.cluster.clone(),
                    weight: proto::u32_value(b.weight),
                    request_headers_to_add: headers_to_add(&b.request_headers),
                    request_headers_to_remove: b.request_headers.remove.clone(),
                    ..Default::default()
                })
                .chain((f.unavailable_weight > 0).then(|| ClusterWeight {
                    name: model::UNAVAILABLE_CLUSTER.to_owned(),
                    weight: proto::u32_value(f.unavailable_weight),
                    ..Default::default()
                }))
                .collect(),
            ..Default::default()
        }),
    };
    // Only the share of 500s names a cluster Envoy lacks: every other cluster a route
    // names is on the Envoy before the route (I1), so this answers nothing else. A gRPC
    // client gets a 503 as UNAVAILABLE, what the Gateway API asks of GRPCRoutes.
    let cluster_not_found_response_code = if f.unavailable_weight > 0 && !f.grpc {
        ClusterNotFoundResponseCode::InternalServerError
    } else {
        ClusterNotFoundResponseCode::ServiceUnavailable
    };
    RouteAction {
        cluster_specifier: Some(cluster_specifier),
        cluster_not_found_response_code: cluster_not_found_response_code.into(),
        timeout: f.timeout.map(proto::duration),
        idle_timeout: f.idle_timeout.map(proto::duration),
        // A gRPC client's deadline (`grpc-timeout`) takes the place of the timeout, up to
        // it: a client may shorten the rule's timeout, never lengthen it. The deprecated
        // field, not its successor `max_stream_duration`: a route with that one loses its
        // `timeout` for every request, gRPC or not.
        #[allow(deprecated)]
        max_grpc_timeout: Some(proto::duration(f.timeout.unwrap_or(ENVOY_ROUTE_TIMEOUT))),
        retry_policy: f.retry.as_ref().map(|r| RetryPolicy {
            retry_on: r.retry_on.join(","),
            num_retries: proto::u32_value(r.num_retries),
            per_try_timeout: r.per_try_timeout.map(proto::duration),
            retriable_status_codes: r.retriable_status_codes.clone(),
            retry_back_off: r.backoff.map(|base| RetryBackOff {
                base_interval: Some(proto::duration(base)),
                max_interval: None,
            }),
            ..Default::default()
        }),
        prefix_rewrite: match segment_rewrite {
            Some(_) => String::new(),
            None => f.prefix_rewrite.clone().unwrap_or_default(),
        },
        // The whole path: one match of everything (Envoy keeps the query apart).
        regex_rewrite: f
            .path_rewrite
            .as_ref()
            .map(|p| RegexMatchAndSubstitute {
                pattern: Some(regex_matcher("^.*$")),
                substitution: p.clone(),
            })
            .or(segment_rewrite),
        host_rewrite_specifier: f
            .host_rewrite
            .clone()
            .map(envoy_route::route_action::HostRewriteSpecifier::HostRewriteLiteral),
        hash_policy: f.affinity.iter().map(hash_policy).collect(),
        request_mirror_policies: f.mirrors.iter().map(mirror_policy).collect(),
        // On the route alone: the listener enables no upgrade, so no other route has one.
        upgrade_configs: if f.websocket {
            vec![UpgradeConfig {
                upgrade_type: WEBSOCKET.to_owned(),
                ..Default::default()
            }]
        } else {
            Vec::new()
        },
        ..Default::default()
    }
}

const WEBSOCKET: &str = "websocket";

/// A copy of the route's requests to another cluster, for a share of them. Envoy sends it
/// with `-shadow` appended to its Host, and drops its answer.
fn mirror_policy(m: &model::Mirror) -> RequestMirrorPolicy {
    RequestMirrorPolicy {
        cluster: m.cluster.clone(),
        runtime_fraction: m.per_million.map(|numerator| RuntimeFractionalPercent {
            default_value: Some(FractionalPercent {
                numerator,
                denominator: DenominatorType::Million.into(),
            }),
            runtime_key: String::new(),
        }),
        ..Default::default()
    }
}

/// Envoy's route timeout when a route sets none.
const ENVOY_ROUTE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// What the clusters' ring hash or Maglev hashes: the same value, the same endpoint.
fn hash_policy(affinity: &model::Affinity) -> HashPolicy {
    let specifier = match affinity {
        model::Affinity::Cookie { name, ttl, path } => PolicySpecifier::Cookie(Cookie {
            name: name.clone(),
            // Given (zero: a session cookie), Envoy sets the cookie on an answer to a
            // request without one.
            ttl: Some(proto::duration(*ttl)),
            path: path.clone().unwrap_or_default(),
            ..Default::default()
        }),
        model::Affinity::Header(name) => PolicySpecifier::Header(Header {
            header_name: name.clone(),
            ..Default::default()
        }),
        model::Affinity::SourceIp => {
            PolicySpecifier::ConnectionProperties(ConnectionProperties { source_ip: true })
        }
    };
    HashPolicy {
        policy_specifier: Some(specifier),
        terminal: false,
    }
}

/// The route configuration from its virtual hosts, each already encoded, in order, so that
/// a change re-encodes only the virtual hosts it touched. Protobuf reads a message written
/// in parts as the whole: the name, then each virtual host (field 2), then the rest.
pub fn route_configuration<'a>(name: &str, virtual_hosts: impl Iterator<Item = &'a [u8]>) -> Any {
    let mut value = RouteConfiguration {
        name: name.to_owned(),
        ..Default::default()
    }
    .encode_to_vec();
    for vhost in virtual_hosts {
        prost::encoding::encode_key(2, prost::encoding::WireType::LengthDelimited, &mut value);
        prost::encoding::encode_varint(vhost.len() as u64, &mut value);
        value.extend_from_slice(vhost);
    }
    value.extend_from_slice(&settings().encode_to_vec());
    proto::pack_bytes::<RouteConfiguration>(value)
}

/// A route configuration whose virtual hosts are served one by one, over the ADS stream
/// (see `xds::vhds`); otherwise the same as the whole one.
pub fn parts_configuration(name: &str) -> Any {
    let config = RouteConfiguration {
        name: name.to_owned(),
        vhds: Some(Vhds {
            config_source: Some(proto::ads()),
        }),
        ..settings()
    };
    proto::pack(&config)
}

/// What every route configuration sets besides its name and virtual hosts.
fn settings() -> RouteConfiguration {
    RouteConfiguration {
        // The probe token authenticates probes to the health-check filters, which run
        // before the router; no backend ever gets to see it.
        request_headers_to_remove: vec![super::PROBE_TOKEN_HEADER.to_owned()],
        // "shop.example.com:8080" is served as shop.example.com; the backend still gets
        // the Host as sent.
        ignore_port_in_host_matching: true,
        ..Default::default()
    }
}

/// A header value exactly as written: Envoy reads `%...%` in added headers as a command
/// (`%REQ(x)%`), refusing the whole route configuration for an unknown or unclosed one
/// ("50%", "%NOT_A_COMMAND%"); `%%` is its literal percent sign.
fn literal(value: &str) -> String {
    value.replace('%', "%%")
}

#[cfg(test)]
mod tests;
