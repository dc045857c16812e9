//! The one RouteConfiguration, "switchyard": every served virtual host, user and probe;
//! and the same in parts (see `xds::vhds`).

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::route::v3::{
    self as envoy_route, DirectResponseAction, HeaderMatcher, QueryParameterMatcher,
    RedirectAction, RetryPolicy, RouteAction, RouteConfiguration, RouteMatch, Vhds,
    WeightedCluster, header_matcher::HeaderMatchSpecifier,
    query_parameter_matcher::QueryParameterMatchSpecifier, redirect_action,
    retry_policy::RetryBackOff, route::Action, route_action::ClusterSpecifier,
    route_action::HashPolicy, route_action::UpgradeConfig,
    route_action::hash_policy::ConnectionProperties, route_action::hash_policy::Cookie,
    route_action::hash_policy::Header, route_action::hash_policy::PolicySpecifier,
    route_match::PathSpecifier, virtual_host::TlsRequirementType, weighted_cluster::ClusterWeight,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    RegexMatchAndSubstitute, RegexMatcher, StringMatcher, string_matcher::MatchPattern,
};

use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use super::{Inputs, http_filters, proto, validate};
use crate::model;

/// The domains of a virtual host as served: lower-cased (Envoy matches hosts
/// case-insensitively and rejects duplicates after lower-casing), sorted, deduplicated.
pub fn normalized_hosts(vh: &model::VirtualHost) -> Vec<String> {
    let mut hosts: Vec<String> = vh.hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// Every reason why this virtual host cannot be served (empty when it can), apart from
/// conflicts with other virtual hosts.
pub fn validate_virtual_host(vh: &model::VirtualHost, inputs: &Inputs<'_>) -> Vec<String> {
    let mut errors = Vec::new();
    if vh.name.is_empty() {
        errors.push("virtual host name is empty".to_owned());
    }
    if vh.hosts.is_empty() {
        errors.push("virtual host has no hosts".to_owned());
    }
    for host in normalized_hosts(vh) {
        // On a Gateway's HTTPS listener, "*" is the filter chain for every SNI name.
        let sni = vh.tls.is_some() && !(vh.listener.is_some() && host == "*");
        if let Err(e) = validate::host(&host, sni) {
            errors.push(e);
        }
    }
    if let Some(tls) = &vh.tls {
        match inputs.secrets.get(tls.secret.as_str()) {
            None => errors.push(format!("TLS secret {:?} is not defined", tls.secret)),
            Some(secret) => {
                if let Err(e) = super::secret::validate(secret) {
                    errors.push(format!("TLS secret {:?} is invalid: {e}", tls.secret));
                }
            }
        }
    }
    errors.extend(validate_routes(&vh.routes, inputs));
    errors
}

/// Every reason why these routes cannot be served, each labeled with its route: a virtual
/// host's, or the routes on trial of a version probe.
pub fn validate_routes(routes: &[model::Route], inputs: &Inputs<'_>) -> Vec<String> {
    let mut errors = Vec::new();
    for (i, route) in routes.iter().enumerate() {
        let label = if route.name.is_empty() {
            format!("route #{}", i + 1)
        } else {
            format!("route {:?}", route.name)
        };
        errors.extend(
            validate_route(route, inputs)
                .into_iter()
                .map(|e| format!("{label}: {e}")),
        );
    }
    errors
}

fn validate_route(route: &model::Route, inputs: &Inputs<'_>) -> Vec<String> {
    let mut errors = Vec::new();
    if let model::PathMatch::Regex(pattern) = &route.path
        && let Err(e) = validate::regex(pattern)
    {
        errors.push(format!("path {e}"));
    }
    for h in &route.headers {
        if let Err(e) = validate::header_name(&h.name) {
            errors.push(format!("header match: {e}"));
        }
        let value = match &h.value {
            model::HeaderValueMatch::Exact(v) => validate::header_value(v),
            model::HeaderValueMatch::Prefix(v) if v.is_empty() => {
                Err("prefix is empty (match on presence instead)".to_owned())
            }
            model::HeaderValueMatch::Prefix(v) => validate::header_value(v),
            model::HeaderValueMatch::Regex(pattern) => validate::regex(pattern),
            model::HeaderValueMatch::Present => Ok(()),
        };
        if let Err(e) = value {
            errors.push(format!("header match on {:?}: {e}", h.name));
        }
    }
    if let Some(method) = &route.method
        && (method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()))
    {
        errors.push(format!("method {method:?} is not an HTTP method"));
    }
    for q in &route.query {
        if q.name.is_empty() {
            errors.push("query parameter match: the name is empty".to_owned());
        }
        if let model::QueryValueMatch::Regex(pattern) = &q.value
            && let Err(e) = validate::regex(pattern)
        {
            errors.push(format!("query parameter match on {:?}: {e}", q.name));
        }
    }
    for (edits, direction) in [
        (&route.request_headers, "request"),
        (&route.response_headers, "response"),
    ] {
        let names = edits
            .set
            .iter()
            .chain(&edits.add)
            .map(|(n, _)| n)
            .chain(&edits.remove);
        for name in names {
            if let Err(e) = validate::modifiable_header(name) {
                errors.push(format!("{direction} header edit: {e}"));
            }
        }
        for (name, value) in edits.set.iter().chain(&edits.add) {
            if let Err(e) = validate::header_value(value) {
                errors.push(format!("{direction} header edit of {name:?}: value {e}"));
            }
        }
    }
    if let model::RouteAction::Redirect(redirect) = &route.action {
        errors.extend(redirect_errors(redirect));
    }
    if let model::RouteAction::Respond(status) = route.action
        && !(200..=599).contains(&status)
    {
        errors.push(format!("status {status} is not an HTTP status"));
    }
    if let model::RouteAction::Forward(forward) = &route.action {
        if forward.backends.is_empty() {
            errors.push("forward action has no backends".to_owned());
        } else {
            let total: u64 = forward.backends.iter().map(|b| u64::from(b.weight)).sum();
            if total == 0 {
                errors.push("backend weights sum to 0".to_owned());
            } else if total > u64::from(u32::MAX) {
                errors.push(format!(
                    "backend weights sum to {total}, more than {}",
                    u32::MAX
                ));
            }
        }
        for backend in &forward.backends {
            if let Some(e) = inputs.cluster_error(&backend.cluster) {
                errors.push(e);
            }
        }
        let mut durations = vec![
            ("timeout", forward.timeout),
            ("idle timeout", forward.idle_timeout),
        ];
        if let Some(retry) = &forward.retry {
            durations.push(("per-try timeout", retry.per_try_timeout));
            durations.push(("retry backoff", retry.backoff));
            if retry.backoff == Some(std::time::Duration::ZERO) {
                errors.push("retry backoff must be more than 0s".to_owned());
            }
            for code in &retry.retriable_status_codes {
                if !(100..=599).contains(code) {
                    errors.push(format!(
                        "retriable status code {code} is not within 100..599"
                    ));
                }
            }
            for condition in &retry.retry_on {
                if condition.is_empty() || condition.contains(',') {
                    errors.push(format!("retry condition {condition:?} is invalid"));
                }
            }
        }
        for (what, d) in durations {
            if let Some(Err(e)) = d.map(|d| proto::check_duration(what, d)) {
                errors.push(e);
            }
        }
        let rewrites = [
            ("prefix", &forward.prefix_rewrite),
            ("path", &forward.path_rewrite),
            ("host", &forward.host_rewrite),
        ];
        for (what, rewrite) in rewrites {
            if let Some(Err(e)) = rewrite.as_deref().map(validate::header_value) {
                errors.push(format!("{what} rewrite {e}"));
            }
        }
        if forward.prefix_rewrite.is_some() && forward.path_rewrite.is_some() {
            errors.push("a route rewrites either the prefix or the whole path".to_owned());
        }
        errors.extend(http_filters::forward_errors(forward));
        // A hash policy on a cluster that does not hash is ignored by Envoy, not
        // refused: lowering pairs them, and nothing here depends on a cluster's settings.
        if let Some(affinity) = &forward.affinity {
            errors.extend(affinity_errors(affinity));
        }
    }
    errors
}

fn affinity_errors(affinity: &model::Affinity) -> Vec<String> {
    let mut errors = Vec::new();
    match affinity {
        model::Affinity::Cookie { name, ttl, path } => {
            if let Err(e) = validate::header_name(name) {
                errors.push(format!("affinity cookie: {e}"));
            }
            if let Err(e) = proto::check_duration("affinity cookie ttl", *ttl) {
                errors.push(e);
            }
            if let Some(Err(e)) = path.as_deref().map(validate::header_value) {
                errors.push(format!("affinity cookie path {e}"));
            }
        }
        model::Affinity::Header(name) => {
            if let Err(e) = validate::header_name(name) {
                errors.push(format!("affinity header: {e}"));
            }
        }
        model::Affinity::SourceIp => {}
    }
    errors
}

fn redirect_errors(redirect: &model::Redirect) -> Vec<String> {
    let mut errors = Vec::new();
    if !matches!(redirect.status, 301 | 302 | 303 | 307 | 308) {
        errors.push(format!(
            "redirect status {} is not a redirect",
            redirect.status
        ));
    }
    if let Some(scheme) = &redirect.scheme
        && scheme != "http"
        && scheme != "https"
    {
        errors.push(format!("redirect scheme {scheme:?} is not http or https"));
    }
    let path = redirect.path.as_ref().map(|p| match p {
        model::RedirectPath::Full(p) | model::RedirectPath::Prefix(p) => p,
    });
    for (what, value) in [("host", redirect.host.as_ref()), ("path", path)] {
        if let Some(Err(e)) = value.map(|v| validate::header_value(v)) {
            errors.push(format!("redirect {what} {e}"));
        }
    }
    errors
}

/// The clusters a (valid) virtual host routes to.
pub fn referenced_clusters(vh: &model::VirtualHost) -> impl Iterator<Item = &str> {
    routed_clusters(&vh.routes)
}

/// The clusters these routes send to.
pub fn routed_clusters(routes: &[model::Route]) -> impl Iterator<Item = &str> {
    routes.iter().flat_map(|r| match &r.action {
        model::RouteAction::Forward(f) => f.backends.iter().map(|b| b.cluster.as_str()).collect(),
        model::RouteAction::RedirectHttps
        | model::RouteAction::Redirect(_)
        | model::RouteAction::Respond(_) => Vec::new(),
    })
}

/// A validated virtual host, with its normalized hosts.
pub fn virtual_host(vh: &model::VirtualHost, hosts: &[String]) -> envoy_route::VirtualHost {
    let redirect = vh.tls.as_ref().is_some_and(|t| t.redirect_http);
    envoy_route::VirtualHost {
        name: vh.name.clone(),
        domains: hosts.to_vec(),
        routes: vh.routes.iter().map(route).collect(),
        require_tls: if redirect {
            TlsRequirementType::All
        } else {
            TlsRequirementType::None
        } as i32,
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
        [single] => ClusterSpecifier::Cluster(single.cluster.clone()),
        several => ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: several
                .iter()
                .map(|b| ClusterWeight {
                    name: b.cluster.clone(),
                    weight: proto::u32_value(b.weight),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
    };
    RouteAction {
        cluster_specifier: Some(cluster_specifier),
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
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use super::*;
    use crate::translate::Inputs;

    fn cluster(name: &str) -> model::Cluster {
        model::Cluster {
            name: name.into(),
            service: model::ServiceRef {
                namespace: "ns".into(),
                name: name.into(),
                port: 80,
            },
            settings: Default::default(),
            endpoints: vec![],
        }
    }

    fn forward(backends: &[(&str, u32)]) -> model::RouteAction {
        model::RouteAction::Forward(model::Forward {
            backends: backends
                .iter()
                .map(|(c, w)| model::WeightedCluster {
                    cluster: c.to_string(),
                    weight: *w,
                })
                .collect(),
            ..Default::default()
        })
    }

    fn simple_route(action: model::RouteAction) -> model::Route {
        model::Route {
            name: "r".into(),
            path: model::PathMatch::Prefix("/".into()),
            headers: vec![],
            method: None,
            query: Vec::new(),
            action,
            request_headers: Default::default(),
            response_headers: Default::default(),
        }
    }

    fn vhost(routes: Vec<model::Route>) -> model::VirtualHost {
        model::VirtualHost {
            listener: None,
            leaving: false,
            created: None,
            name: "ns/vh".into(),
            hosts: vec![
                "Example.com".into(),
                "example.com".into(),
                "a.example.com".into(),
            ],
            tls: None,
            routes,
        }
    }

    fn check(vh: &model::VirtualHost) -> Vec<String> {
        let clusters = [cluster("a"), cluster("b")];
        let mut bad = cluster("bad");
        bad.settings.connect_timeout = Duration::ZERO;
        let clusters: HashMap<String, model::Cluster> = clusters
            .into_iter()
            .chain([bad])
            .map(|c| (c.name.clone(), c))
            .collect();
        let invalid_clusters =
            HashMap::from([("bad".to_owned(), "connect timeout must be positive".into())]);
        let secrets = HashMap::new();
        let inputs = Inputs {
            clusters: &clusters,
            invalid_clusters: &invalid_clusters,
            secrets: &secrets,
        };
        validate_virtual_host(vh, &inputs)
    }

    #[test]
    fn hosts_are_lowercased_sorted_and_deduplicated() {
        let vh = vhost(vec![]);
        assert_eq!(normalized_hosts(&vh), ["a.example.com", "example.com"]);
    }

    #[test]
    fn valid_virtual_host() {
        let vh = vhost(vec![
            simple_route(forward(&[("a", 1)])),
            simple_route(forward(&[("a", 0), ("b", 5)])),
            simple_route(model::RouteAction::RedirectHttps),
        ]);
        assert_eq!(check(&vh), Vec::<String>::new());
    }

    #[test]
    fn invalid_forward_actions() {
        let vh = vhost(vec![
            simple_route(forward(&[])),
            simple_route(forward(&[("a", 0), ("b", 0)])),
            simple_route(forward(&[("missing", 1)])),
            simple_route(forward(&[("bad", 1)])),
            simple_route(forward(&[("a", u32::MAX), ("b", 1)])),
        ]);
        assert_eq!(
            check(&vh),
            [
                "route \"r\": forward action has no backends",
                "route \"r\": backend weights sum to 0",
                "route \"r\": cluster \"missing\" is not defined",
                "route \"r\": cluster \"bad\" is invalid: connect timeout must be positive",
                "route \"r\": backend weights sum to 4294967296, more than 4294967295",
            ]
        );
    }

    #[test]
    fn invalid_matches_and_edits() {
        let mut r = simple_route(forward(&[("a", 1)]));
        r.name = String::new();
        r.path = model::PathMatch::Regex("(".into());
        r.headers = vec![
            model::HeaderMatch {
                name: "x-a".into(),
                value: model::HeaderValueMatch::Prefix(String::new()),
                invert: false,
            },
            model::HeaderMatch {
                name: String::new(),
                value: model::HeaderValueMatch::Present,
                invert: false,
            },
        ];
        r.request_headers.set = vec![(":path".into(), "/x".into())];
        r.response_headers.add = vec![("x-b".into(), "a\r\nb".into())];
        r.response_headers.remove = vec!["host".into()];
        let errors = check(&vhost(vec![r]));
        assert_eq!(errors.len(), 6, "{errors:#?}");
        assert!(
            errors.iter().all(|e| e.starts_with("route #1: ")),
            "{errors:#?}"
        );
    }

    #[test]
    fn empty_hosts_and_tls_wildcards() {
        let mut vh = vhost(vec![]);
        vh.hosts.clear();
        assert_eq!(check(&vh), ["virtual host has no hosts"]);
        vh.hosts = vec!["*".into()];
        vh.tls = Some(model::VirtualHostTls {
            secret: "missing".into(),
            redirect_http: true,
        });
        let errors = check(&vh);
        assert_eq!(errors.len(), 2, "{errors:#?}");
        assert!(errors[0].contains("leading \"*.\""));
        assert_eq!(errors[1], "TLS secret \"missing\" is not defined");
    }

    #[test]
    fn a_virtual_host_with_filter_configs_encodes_to_the_same_bytes_every_time() {
        let mut policed = model::Forward {
            cors: Some(Box::new(model::Cors {
                allow_origins: vec!["*".into()],
                ..Default::default()
            })),
            rate_limit: Some(model::RateLimit {
                requests: 1,
                per: Duration::from_secs(1),
                burst: 0,
            }),
            max_request_bytes: Some(10),
            ..Default::default()
        };
        policed.backends = vec![model::WeightedCluster {
            cluster: "a".into(),
            weight: 1,
        }];
        let routes = vec![
            simple_route(model::RouteAction::Forward(policed)),
            simple_route(forward(&[("b", 1)])),
        ];
        let vh = vhost(routes);
        let hosts = normalized_hosts(&vh);
        let first = encode_virtual_host(virtual_host(&vh, &hosts));
        // Each encoding builds new maps, each with an iteration order of its own.
        for _ in 0..20 {
            assert_eq!(encode_virtual_host(virtual_host(&vh, &hosts)), first);
        }
        let decoded = envoy_route::VirtualHost::decode(first.as_slice()).unwrap();
        assert_eq!(decoded, virtual_host(&vh, &hosts));
        assert_eq!(decoded.routes[0].typed_per_filter_config.len(), 3);
    }

    #[test]
    fn route_translation() {
        let mut r = simple_route(forward(&[("a", 90), ("b", 10)]));
        r.path = model::PathMatch::Regex("^/v[0-9]+/".into());
        r.headers = vec![model::HeaderMatch {
            name: "x-canary".into(),
            value: model::HeaderValueMatch::Present,
            invert: true,
        }];
        r.request_headers = model::HeaderEdits {
            set: vec![("x-s".into(), "1".into())],
            add: vec![("x-a".into(), "2".into())],
            remove: vec!["x-r".into()],
        };
        let out = route(&r);
        let m = out.r#match.as_ref().unwrap();
        assert!(
            matches!(&m.path_specifier, Some(PathSpecifier::SafeRegex(re)) if re.regex == "^/v[0-9]+/")
        );
        assert!(m.headers[0].invert_match);
        assert_eq!(
            m.headers[0].header_match_specifier,
            Some(HeaderMatchSpecifier::PresentMatch(true))
        );
        let actions: Vec<i32> = out
            .request_headers_to_add
            .iter()
            .map(|h| h.append_action)
            .collect();
        assert_eq!(
            actions,
            [
                HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
                HeaderAppendAction::AppendIfExistsOrAdd as i32
            ]
        );
        assert_eq!(out.request_headers_to_remove, ["x-r"]);
        let Some(Action::Route(action)) = out.action else {
            panic!()
        };
        let Some(ClusterSpecifier::WeightedClusters(w)) = action.cluster_specifier else {
            panic!()
        };
        assert_eq!(
            w.clusters
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
    }

    #[test]
    fn single_backend_uses_cluster() {
        let out = route(&simple_route(forward(&[("a", 3)])));
        let Some(Action::Route(action)) = out.action else {
            panic!()
        };
        assert_eq!(
            action.cluster_specifier,
            Some(ClusterSpecifier::Cluster("a".into()))
        );
    }

    #[test]
    fn redirect_and_require_tls() {
        let mut vh = vhost(vec![simple_route(model::RouteAction::RedirectHttps)]);
        vh.tls = Some(model::VirtualHostTls {
            secret: "s".into(),
            redirect_http: true,
        });
        let out = virtual_host(&vh, &normalized_hosts(&vh));
        assert_eq!(out.require_tls, TlsRequirementType::All as i32);
        let Some(Action::Redirect(redirect)) = &out.routes[0].action else {
            panic!()
        };
        assert_eq!(
            redirect.scheme_rewrite_specifier,
            Some(redirect_action::SchemeRewriteSpecifier::HttpsRedirect(true))
        );
    }
}
