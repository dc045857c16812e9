//! Lowering: resolved routes (and the endpoints a front-end found for their clusters) →
//! the routing model. Shared by every mode; pure.
//!
//! A route contributes in one of two roles (see DESIGN.md, two-phase rollout): `live`,
//! its virtual host and the version probe that says it is served; or `probe`, the
//! clusters that must be ready on every Envoy before a switch and the routes on trial.
//! Standalone files serve every route live.

use std::time::Duration;

use super::resolved::{
    ResolvedCluster, ResolvedListener, ResolvedRule, ResolvedVirtualHost, SubjectAltName,
    UpstreamTls,
};
use super::spec::{
    self, Affinity as SpecAffinity, Cors as SpecCors, DEFAULT_RETRY_ON,
    HeaderEdits as SpecHeaderEdits, HeaderMatch as SpecHeaderMatch,
    QueryParamMatch as SpecQueryMatch, RATE_LIMIT_UNITS, RateLimit as SpecRateLimit,
    Redirect as SpecRedirect,
};
use crate::duration;
use crate::model::{
    self, Affinity, ClusterSettings, Cors, EndpointProbe, Forward, GatewayListener, HeaderEdits,
    HeaderMatch, HeaderValueMatch, LbPolicy, Mirror, PathMatch, QueryMatch, QueryValueMatch,
    RateLimit, Redirect, RedirectPath, RetryPolicy, Route, RouteAction, ServiceRef, VersionProbe,
    VirtualHost, VirtualHostTls, WeightedCluster, trial_id,
};
use crate::translate::Problem;

/// What one role of one route adds to the model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Contribution {
    /// Its clusters: model name, namespace, and the resolved cluster; the front-end adds
    /// their endpoints.
    pub clusters: Vec<(String, String, ResolvedCluster)>,
    pub virtual_host: Option<VirtualHost>,
    /// The Gateway listener its virtual host is served on.
    pub gateway_listener: Option<model::GatewayListener>,
    /// It is a Gateway port's own unit: its listener is the one that port defines. While
    /// a change of the listener rolls out, the units of the port's virtual hosts still
    /// carry the definition before; this one is served.
    pub defines_listener: bool,
    pub version_probe: Option<VersionProbe>,
    pub endpoint_probe: Option<EndpointProbe>,
    /// (namespace, name) of the TLS secret its virtual host serves.
    pub secret: Option<(String, String)>,
    /// (namespace, name) of the TLS secrets its clusters present to their backends.
    pub client_secrets: Vec<(String, String)>,
    pub problems: Vec<Problem>,
}

/// A route's identity in the model: `namespace/name`.
pub fn route_id(namespace: &str, route: &str) -> String {
    format!("{namespace}/{route}")
}

/// The live role: the virtual host, its clusters, and the version probe that answers
/// `version` once an Envoy serves it. `created` (seconds since the Unix epoch) decides
/// who gets a host that several routes ask for; a `leaving` virtual host yields it.
pub struct Live<'a> {
    pub namespace: &'a str,
    pub route: &'a str,
    pub version: &'a str,
    pub virtual_host: &'a ResolvedVirtualHost,
    pub clusters: &'a [ResolvedCluster],
    pub created: Option<i64>,
    pub leaving: bool,
    /// The Gateway listener it is served on; None: the shared listeners.
    pub listener: Option<&'a model::GatewayListener>,
    /// Of a Gateway port's own unit: (namespace, name) of its listener's default Secret.
    pub default_secret: Option<(&'a str, &'a str)>,
}

pub fn live(live: &Live<'_>) -> Contribution {
    let namespace = live.namespace;
    let id = route_id(namespace, live.route);
    let mut out = Contribution {
        clusters: named_clusters(namespace, live.clusters),
        client_secrets: client_secrets(live.clusters),
        ..Contribution::default()
    };
    let vh = live.virtual_host;
    if vh.hosts.is_empty()
        && let Some(listener) = live.listener
    {
        // A Gateway port as such: its listener (and the Secret of its default filter
        // chain), and the version probe that proves every Envoy listens there, answering
        // through its route configuration.
        out.gateway_listener = Some(listener.clone());
        out.defines_listener = true;
        out.secret = live
            .default_secret
            .map(|(ns, name)| (ns.to_owned(), name.to_owned()));
        out.version_probe = Some(VersionProbe {
            id,
            version: live.version.to_owned(),
            listener: Some(listener.name.clone()),
            ..Default::default()
        });
        return out;
    }
    let routes = match routes(namespace, &vh.rules) {
        Ok(routes) => routes,
        Err(e) => {
            out.problems.push(Problem::new(&id, e));
            return out;
        }
    };
    let tls = vh.tls.as_ref().map(|t| {
        let secret_namespace = t.namespace.as_deref().unwrap_or(namespace);
        out.secret = Some((secret_namespace.to_owned(), t.secret_name.clone()));
        VirtualHostTls {
            secret: secret_name(secret_namespace, &t.secret_name),
            redirect_http: t.redirect_http,
            listener_hostname: t.listener_hostname.clone(),
        }
    });
    out.virtual_host = Some(VirtualHost {
        created: live.created,
        leaving: live.leaving,
        name: id.clone(),
        listener: live.listener.map(|l| l.name.clone()),
        hosts: vh.hosts.clone(),
        tls,
        routes,
    });
    out.version_probe = Some(VersionProbe {
        id,
        version: live.version.to_owned(),
        listener: live.listener.map(|l| l.name.clone()),
        ..Default::default()
    });
    out.gateway_listener = live.listener.cloned();
    out
}

/// The probe role: every cluster in `clusters` must be on every Envoy, and those not in
/// `kept` (the live ones, kept through the switch) must have a ready endpoint (I3). The
/// routes to be promoted go on trial: every Envoy has to accept them first (I8).
pub struct Probe<'a> {
    pub namespace: &'a str,
    pub route: &'a str,
    pub version: &'a str,
    pub trial: Option<&'a ResolvedVirtualHost>,
    pub clusters: &'a [ResolvedCluster],
    pub kept: &'a [ResolvedCluster],
}

pub fn probe(probe: &Probe<'_>) -> Contribution {
    let namespace = probe.namespace;
    let id = route_id(namespace, probe.route);
    let mut out = Contribution {
        clusters: named_clusters(namespace, probe.clusters),
        client_secrets: client_secrets(probe.clusters),
        ..Contribution::default()
    };
    if let Some(vh) = probe.trial {
        match routes(namespace, &vh.rules) {
            Ok(routes) => {
                out.version_probe = Some(VersionProbe {
                    id: trial_id(&id),
                    version: probe.version.to_owned(),
                    // Trials are answered by the shared route configuration.
                    listener: None,
                    routes,
                });
            }
            Err(e) => out.problems.push(Problem::new(&id, e)),
        }
    }
    out.endpoint_probe = Some(EndpointProbe {
        id: endpoint_probe_id(namespace, probe.route, probe.version),
        clusters: probe
            .clusters
            .iter()
            .map(|c| {
                let pct = u32::from(!probe.kept.contains(c));
                (cluster_name(namespace, c), pct)
            })
            .collect(),
    });
    out
}

/// The id of a probe role's endpoint probe; the prober sends it.
pub fn endpoint_probe_id(namespace: &str, route: &str, version: &str) -> String {
    format!("{namespace}/{route}/{version}")
}

/// Each cluster with its model name and namespace.
pub fn named_clusters(
    namespace: &str,
    clusters: &[ResolvedCluster],
) -> Vec<(String, String, ResolvedCluster)> {
    clusters
        .iter()
        .map(|c| {
            let namespace = service_namespace(namespace, c);
            (cluster_name(namespace, c), namespace.to_owned(), c.clone())
        })
        .collect()
}

/// (namespace, name) of the TLS secrets `clusters` present to their backends, sorted.
fn client_secrets(clusters: &[ResolvedCluster]) -> Vec<(String, String)> {
    let mut secrets: Vec<(String, String)> = (clusters.iter())
        .filter_map(|c| c.tls.as_ref()?.client_certificate.as_ref())
        .map(|s| (s.namespace.clone(), s.name.clone()))
        .collect();
    secrets.sort();
    secrets.dedup();
    secrets
}

/// The model's name of a resolved cluster in `namespace`.
pub fn cluster_name(namespace: &str, cluster: &ResolvedCluster) -> String {
    model::cluster_name(&service_ref(namespace, cluster), &settings(cluster))
}

/// The model's cluster, with the endpoints the front-end found for it.
pub fn cluster(
    name: String,
    namespace: &str,
    cluster: &ResolvedCluster,
    endpoints: Vec<model::Endpoint>,
) -> model::Cluster {
    model::Cluster {
        name,
        service: service_ref(namespace, cluster),
        settings: settings(cluster),
        endpoints,
    }
}

/// The model's Gateway listener of `listener`; None when a port is out of range.
pub fn gateway_listener(listener: &ResolvedListener) -> Option<GatewayListener> {
    Some(GatewayListener {
        name: listener.name.clone(),
        port: u16::try_from(listener.port).ok()?,
        probe_port: u16::try_from(listener.probe_port).ok()?,
        tls: listener.tls,
        default_secret: (listener.default_certificate.as_ref())
            .map(|s| secret_name(&s.namespace, &s.name)),
        client_validation: (listener.client_validation.as_ref()).map(|v| model::ClientValidation {
            ca_certificates: v.ca_certificates.clone(),
            insecure_fallback: v.insecure_fallback,
        }),
        protocol: listener.protocol,
    })
}

/// The model's name of the TLS secret `name` in `namespace`.
pub fn secret_name(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The namespace of the cluster's service: its own, or else the route's.
fn service_namespace<'a>(route_namespace: &'a str, cluster: &'a ResolvedCluster) -> &'a str {
    cluster.namespace.as_deref().unwrap_or(route_namespace)
}

fn service_ref(namespace: &str, cluster: &ResolvedCluster) -> ServiceRef {
    ServiceRef {
        namespace: service_namespace(namespace, cluster).to_owned(),
        name: cluster.service.clone(),
        // Resolution bounds ports to 1..=65535.
        port: u16::try_from(cluster.port).unwrap_or(0),
    }
}

fn settings(cluster: &ResolvedCluster) -> ClusterSettings {
    ClusterSettings {
        http2: cluster.http2,
        // Resolution writes only names the spec's check admits.
        lb_policy: cluster
            .lb_policy
            .as_deref()
            .and_then(LbPolicy::named)
            .unwrap_or_default(),
        circuit_breakers: cluster.circuit_breaker.as_deref().map(circuit_breakers),
        outlier_detection: cluster.outlier_detection.as_deref().map(outlier_detection),
        health_check: cluster.health_check.as_deref().map(health_check),
        tls: cluster.tls.as_deref().map(upstream_tls),
        udp: cluster.udp,
        ..ClusterSettings::default()
    }
}

fn upstream_tls(tls: &UpstreamTls) -> model::UpstreamTls {
    model::UpstreamTls {
        client_certificate: (tls.client_certificate.as_ref())
            .map(|s| secret_name(&s.namespace, &s.name)),
        sni: tls.hostname.clone(),
        ca_certificates: tls.ca_certificates.clone(),
        subject_alt_names: (tls.subject_alt_names.iter())
            .map(|n| match n {
                SubjectAltName::Hostname(h) => model::SubjectAltName::Dns(h.clone()),
                SubjectAltName::Uri(u) => model::SubjectAltName::Uri(u.clone()),
            })
            .collect(),
    }
}

// The spec's check has admitted every number and duration below; what it would refuse
// falls back to the default rather than fail a lowering that cannot fail.

fn count(value: Option<i32>, default: u32) -> u32 {
    value.and_then(|v| u32::try_from(v).ok()).unwrap_or(default)
}

fn duration_or(text: Option<&str>, default: Duration) -> Duration {
    text.and_then(|t| duration::parse(t).ok())
        .unwrap_or(default)
}

fn circuit_breakers(cb: &spec::CircuitBreaker) -> model::CircuitBreakers {
    let limit = |v: Option<i32>| v.and_then(|v| u32::try_from(v).ok());
    model::CircuitBreakers {
        max_connections: limit(cb.max_connections),
        max_pending_requests: limit(cb.max_pending_requests),
        max_requests: limit(cb.max_requests),
        max_retries: limit(cb.max_retries),
    }
}

fn outlier_detection(od: &spec::OutlierDetection) -> model::OutlierDetection {
    model::OutlierDetection {
        consecutive_5xx: count(od.consecutive_5xx, 5),
        interval: duration_or(od.interval.as_deref(), Duration::from_secs(10)),
        base_ejection_time: duration_or(od.base_ejection_time.as_deref(), Duration::from_secs(30)),
        max_ejection_percent: count(od.max_ejection_percent, 10),
    }
}

/// The Host header of health checks when the spec names none.
pub const HEALTH_CHECK_HOST: &str = "switchyard-health-check";

fn health_check(hc: &spec::HealthCheck) -> model::HealthCheck {
    model::HealthCheck {
        path: hc.path.clone(),
        host: hc
            .host
            .clone()
            .unwrap_or_else(|| HEALTH_CHECK_HOST.to_owned()),
        interval: duration_or(hc.interval.as_deref(), Duration::from_secs(5)),
        timeout: duration_or(hc.timeout.as_deref(), Duration::from_secs(1)),
        unhealthy_threshold: count(hc.unhealthy_threshold, 3),
        healthy_threshold: count(hc.healthy_threshold, 2),
    }
}

/// The model's routes of resolved rules, in order.
pub fn routes(namespace: &str, rules: &[ResolvedRule]) -> Result<Vec<Route>, String> {
    rules.iter().map(|r| route(namespace, r)).collect()
}

fn route(namespace: &str, rule: &ResolvedRule) -> Result<Route, String> {
    let m = rule.matches.clone().unwrap_or_default();
    let path = match (
        m.path_prefix,
        m.path_segment_prefix,
        m.path_exact,
        m.path_regex,
    ) {
        (Some(p), None, None, None) => PathMatch::Prefix(p),
        (None, Some(p), None, None) => segment_prefix(&p),
        (None, None, Some(p), None) => PathMatch::Exact(p),
        (None, None, None, Some(p)) => PathMatch::Regex(p),
        (None, None, None, None) => PathMatch::Prefix("/".into()),
        _ => return Err(format!("rule {}: more than one path match", rule.name)),
    };
    let headers = m
        .headers
        .iter()
        .map(header_match)
        .collect::<Result<_, _>>()?;
    let query = m
        .query_params
        .iter()
        .map(query_match)
        .collect::<Result<_, _>>()?;
    let options = &rule.options;
    let duration = |d: &Option<String>| -> Result<Option<Duration>, String> {
        d.as_deref()
            .map(duration::parse)
            .transpose()
            .map_err(|e| format!("rule {}: {e}", rule.name))
    };
    let action = if rule.redirect_https {
        RouteAction::RedirectHttps
    } else if let Some(r) = &rule.redirect {
        RouteAction::Redirect(redirect(r))
    } else if rule.backends.is_empty() {
        // Only a front-end that keeps rules whose backends all failed (the Gateway API's)
        // gets here; the spec's check refuses a rule without backends. A gRPC client reads
        // a 503 as UNAVAILABLE (a 500 as UNKNOWN).
        RouteAction::Respond(if rule.grpc { 503 } else { 500 })
    } else {
        let retry = match &options.retries {
            Some(r) => Some(Box::new(
                retry_policy(r).map_err(|e| format!("rule {}: {e}", rule.name))?,
            )),
            None => None,
        };
        RouteAction::Forward(Forward {
            backends: rule
                .backends
                .iter()
                .map(|b| WeightedCluster {
                    cluster: cluster_name(namespace, &b.cluster),
                    weight: u32::try_from(b.weight).unwrap_or(0),
                    request_headers: header_edits(b.request_headers.as_ref()),
                })
                .collect(),
            timeout: duration(&options.timeout)?,
            idle_timeout: duration(&options.idle_timeout)?,
            retry,
            prefix_rewrite: options.rewrite_prefix.clone(),
            path_rewrite: options.rewrite_path.clone(),
            host_rewrite: options.rewrite_host.clone(),
            websocket: options.websocket.unwrap_or(false),
            cors: match &options.cors {
                Some(c) => Some(Box::new(cors(c, duration(&c.max_age)?))),
                None => None,
            },
            rate_limit: options
                .rate_limit
                .as_deref()
                .map(rate_limit)
                .transpose()
                .map_err(|e| format!("rule {}: {e}", rule.name))?,
            max_request_bytes: options
                .max_request_body_bytes
                .map(|b| {
                    u32::try_from(b).map_err(|_| format!("rule {}: body limit {b}", rule.name))
                })
                .transpose()?,
            affinity: match options
                .load_balancer
                .as_ref()
                .and_then(|lb| lb.affinity.as_ref())
            {
                Some(a) => {
                    let ttl = a.cookie.as_ref().and_then(|c| c.ttl.clone());
                    Some(affinity(a, duration(&ttl)?))
                }
                None => None,
            },
            unavailable_weight: u32::try_from(rule.unavailable_weight).unwrap_or(0),
            grpc: rule.grpc,
            mirrors: rule
                .mirrors
                .iter()
                .map(|m| Mirror {
                    cluster: cluster_name(namespace, &m.cluster),
                    per_million: m.per_million.map(|p| u32::try_from(p).unwrap_or(0)),
                })
                .collect(),
        })
    };
    Ok(Route {
        name: rule.name.clone(),
        path,
        headers,
        method: m.method.clone(),
        query,
        action,
        request_headers: header_edits(options.request_headers.as_deref()),
        response_headers: header_edits(options.response_headers.as_deref()),
    })
}

fn cors(c: &SpecCors, max_age: Option<Duration>) -> Cors {
    Cors {
        allow_origins: c.allow_origins.clone(),
        allow_methods: c.allow_methods.clone(),
        allow_headers: c.allow_headers.clone(),
        expose_headers: c.expose_headers.clone(),
        max_age,
        allow_credentials: c.allow_credentials.unwrap_or(false),
    }
}

fn affinity(a: &SpecAffinity, ttl: Option<Duration>) -> Affinity {
    match (&a.cookie, &a.header) {
        (Some(c), _) => Affinity::Cookie {
            name: c.name.clone(),
            ttl: ttl.unwrap_or_default(),
            path: c.path.clone(),
        },
        (None, Some(h)) => Affinity::Header(h.clone()),
        (None, None) => Affinity::SourceIp,
    }
}

fn retry_policy(r: &spec::Retries) -> Result<RetryPolicy, String> {
    let duration = |d: &Option<String>| d.as_deref().map(duration::parse).transpose();
    let mut retry_on = if r.on.is_empty() {
        DEFAULT_RETRY_ON.map(str::to_owned).to_vec()
    } else {
        r.on.clone()
    };
    // Envoy looks at the codes only under this condition.
    const BY_CODE: &str = "retriable-status-codes";
    if !r.status_codes.is_empty() && !retry_on.iter().any(|c| c == BY_CODE) {
        retry_on.push(BY_CODE.to_owned());
    }
    Ok(RetryPolicy {
        retry_on,
        num_retries: u32::try_from(r.attempts).unwrap_or(0),
        per_try_timeout: duration(&r.per_try_timeout)?,
        retriable_status_codes: r
            .status_codes
            .iter()
            .filter_map(|&c| u32::try_from(c).ok())
            .collect(),
        backoff: duration(&r.backoff)?,
    })
}

fn rate_limit(r: &SpecRateLimit) -> Result<RateLimit, String> {
    let seconds = RATE_LIMIT_UNITS
        .iter()
        .find(|(u, _)| *u == r.unit)
        .map(|(_, s)| *s)
        .ok_or_else(|| format!("rate limit unit {:?}", r.unit))?;
    Ok(RateLimit {
        requests: u32::try_from(r.requests).map_err(|_| format!("rate limit {}", r.requests))?,
        per: Duration::from_secs(seconds),
        burst: u32::try_from(r.burst.unwrap_or(0)).unwrap_or(0),
    })
}

fn redirect(r: &SpecRedirect) -> Redirect {
    let path = match (&r.path, &r.prefix) {
        (Some(p), _) => Some(RedirectPath::Full(p.clone())),
        (None, Some(p)) => Some(RedirectPath::Prefix(p.clone())),
        (None, None) => None,
    };
    Redirect {
        scheme: r.scheme.clone(),
        host: r.hostname.clone(),
        // The schema bounds ports to 1..=65535 and codes to redirects.
        port: r.port.and_then(|p| u16::try_from(p).ok()),
        path,
        status: r
            .status_code
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or(302),
    }
}

/// Envoy's separated prefix takes no trailing `/`; all of `/` is every path.
fn segment_prefix(prefix: &str) -> PathMatch {
    match prefix.trim_end_matches('/') {
        "" => PathMatch::Prefix("/".into()),
        trimmed => PathMatch::SegmentPrefix(trimmed.to_owned()),
    }
}

fn query_match(q: &SpecQueryMatch) -> Result<QueryMatch, String> {
    let value = match (&q.exact, &q.regex, q.present.unwrap_or(false)) {
        (Some(v), None, false) => QueryValueMatch::Exact(v.clone()),
        (None, Some(v), false) => QueryValueMatch::Regex(v.clone()),
        (None, None, true) => QueryValueMatch::Present,
        _ => {
            return Err(format!(
                "query parameter match {:?}: give exactly one kind",
                q.name
            ));
        }
    };
    Ok(QueryMatch {
        name: q.name.clone(),
        value,
    })
}

fn header_match(h: &SpecHeaderMatch) -> Result<HeaderMatch, String> {
    let value = match (&h.exact, &h.prefix, &h.regex, h.present.unwrap_or(false)) {
        (Some(v), None, None, false) => HeaderValueMatch::Exact(v.clone()),
        (None, Some(v), None, false) => HeaderValueMatch::Prefix(v.clone()),
        (None, None, Some(v), false) => HeaderValueMatch::Regex(v.clone()),
        (None, None, None, true) => HeaderValueMatch::Present,
        _ => return Err(format!("header match {:?}: give exactly one kind", h.name)),
    };
    Ok(HeaderMatch {
        name: h.name.to_ascii_lowercase(),
        value,
        invert: h.invert.unwrap_or(false),
    })
}

fn header_edits(edits: Option<&SpecHeaderEdits>) -> HeaderEdits {
    let Some(e) = edits else {
        return HeaderEdits::default();
    };
    HeaderEdits {
        set: e.set.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        add: e.add.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        remove: e.remove.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::spec::RuleMatch;

    fn lowered(rule: ResolvedRule) -> Route {
        route("web", &rule).expect("lowers")
    }

    #[test]
    fn a_segment_prefix_loses_its_trailing_slash_and_all_of_it_is_every_path() {
        let by = |prefix: &str| {
            lowered(ResolvedRule {
                name: "r".into(),
                matches: Some(RuleMatch {
                    path_segment_prefix: Some(prefix.into()),
                    ..RuleMatch::default()
                }),
                redirect: Some(SpecRedirect::default()),
                ..ResolvedRule::default()
            })
            .path
        };
        assert_eq!(by("/docs/"), PathMatch::SegmentPrefix("/docs".into()));
        assert_eq!(by("/docs"), PathMatch::SegmentPrefix("/docs".into()));
        assert_eq!(by("/"), PathMatch::Prefix("/".into()));
    }

    #[test]
    fn a_rule_left_without_backends_answers_500_and_a_redirect_302_unless_told() {
        let failed = lowered(ResolvedRule {
            name: "r".into(),
            ..ResolvedRule::default()
        });
        assert_eq!(failed.action, RouteAction::Respond(500));
        // gRPC: 503, which its clients read as UNAVAILABLE.
        let failed = lowered(ResolvedRule {
            name: "r".into(),
            grpc: true,
            ..ResolvedRule::default()
        });
        assert_eq!(failed.action, RouteAction::Respond(503));
        let moved = lowered(ResolvedRule {
            name: "r".into(),
            redirect: Some(SpecRedirect {
                path: Some("/here".into()),
                ..SpecRedirect::default()
            }),
            ..ResolvedRule::default()
        });
        assert_eq!(
            moved.action,
            RouteAction::Redirect(Redirect {
                scheme: None,
                host: None,
                port: None,
                path: Some(RedirectPath::Full("/here".into())),
                status: 302,
            })
        );
    }
}
