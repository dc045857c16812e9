//! Checks of a route's spec alone, once for every front-end. The CRD's schema and CEL
//! rules say the same for Kubernetes; they are checked again here because a route can come
//! without them (an older CRD, a disabled validation, a standalone file), and a bad route
//! must stay out of the configuration and say why while every other route serves (I8).
//!
//! Messages start with the path of the field (`rules[2].timeout`), under the root the
//! front-end gives (`spec` for a TrafficRoute, nothing for a file).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;

use super::spec::{
    Backend, CircuitBreaker, Cors, HealthCheck, LB_POLICIES, LoadBalancer, OutlierDetection,
    RATE_LIMIT_UNITS, REDIRECT_CODES, RETRY_CONDITIONS, RateLimit, Redirect, RouteRule, RouteSpec,
    RuleMatch, RuleOptions,
};
use crate::duration;

/// A field of the spec that cannot be served, and why.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{at}: {message}")]
pub struct SpecError {
    /// Path of the field, e.g. `spec.rules[0].timeout`.
    pub at: String,
    pub message: String,
}

/// `root.field`, or `field` when there is no root.
pub fn field(root: &str, name: &str) -> String {
    if root.is_empty() {
        name.to_owned()
    } else {
        format!("{root}.{name}")
    }
}

fn error(at: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError {
        at: at.into(),
        message: message.into(),
    }
}

/// Checks the spec in full; the first problem in spec order is reported. Returns each
/// rule's name (given, or `rule-<index>`) and the hosts, lower-cased.
pub fn check(root: &str, spec: &RouteSpec) -> Result<Checked, SpecError> {
    let hosts = hosts(&field(root, "hosts"), &spec.hosts)?;
    if let Some(tls) = &spec.tls
        && tls.secret_name.is_empty()
    {
        return Err(error(field(root, "tls.secretName"), "must not be empty"));
    }
    let at = field(root, "rules");
    if spec.rules.is_empty() {
        return Err(error(at, "a route needs at least one rule"));
    }
    let rule_names = rule_names(&at, &spec.rules)?;
    for (index, rule) in spec.rules.iter().enumerate() {
        check_rule(&format!("{at}[{index}]"), rule)?;
    }
    Ok(Checked { hosts, rule_names })
}

/// What [`check`] derives from a valid spec.
#[derive(Debug)]
pub struct Checked {
    pub hosts: Vec<String>,
    pub rule_names: Vec<String>,
}

/// The CRD's host pattern (checked after lower-casing).
static HOST: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        .expect("host pattern compiles")
});

/// The CRD's rule-name pattern.
static RULE_NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").expect("name pattern"));

/// Lower-cased, in the given order; duplicates (ignoring case) and malformed names refused.
fn hosts(at: &str, hosts: &[String]) -> Result<Vec<String>, SpecError> {
    if hosts.is_empty() {
        return Err(error(at, "a route needs at least one host"));
    }
    let mut checked: Vec<String> = Vec::with_capacity(hosts.len());
    for (index, host) in hosts.iter().enumerate() {
        let host = host.to_ascii_lowercase();
        if host.len() > 253 || !HOST.is_match(&host) {
            return Err(error(
                format!("{at}[{index}]"),
                format!("{host:?} is not a host name (or \"*.\" and a host name)"),
            ));
        }
        if let Some(first) = checked.iter().position(|h| *h == host) {
            return Err(error(
                format!("{at}[{index}]"),
                format!("{host:?} repeats {at}[{first}]"),
            ));
        }
        checked.push(host);
    }
    Ok(checked)
}

/// Each rule's name (given, or `rule-<index>`), unique across the route, generated names
/// included.
fn rule_names(at: &str, rules: &[RouteRule]) -> Result<Vec<String>, SpecError> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut names = Vec::with_capacity(rules.len());
    for (index, rule) in rules.iter().enumerate() {
        let name = match &rule.name {
            Some(name) => {
                if name.len() > 63 || !RULE_NAME.is_match(name) {
                    return Err(error(
                        format!("{at}[{index}].name"),
                        format!("{name:?} is not a lower-case DNS label"),
                    ));
                }
                name.clone()
            }
            None => format!("rule-{index}"),
        };
        if let Some(first) = seen.insert(name.clone(), index) {
            return Err(error(
                format!("{at}[{index}]"),
                format!(
                    "the rule name {name:?} is already used by {at}[{first}] \
                     (an unnamed rule is named \"rule-<index>\")"
                ),
            ));
        }
        names.push(name);
    }
    Ok(names)
}

fn check_rule(at: &str, rule: &RouteRule) -> Result<(), SpecError> {
    let redirect_https = rule.redirect_https.unwrap_or(false);
    if redirect_https && !rule.backends.is_empty() {
        return Err(error(at, "a rule with redirectHttps has no backends"));
    }
    if rule.redirect.is_some() && !rule.backends.is_empty() {
        return Err(error(at, "a rule with redirect has no backends"));
    }
    if redirect_https && rule.redirect.is_some() {
        return Err(error(at, "give at most one of redirect, redirectHttps"));
    }
    if !redirect_https && rule.redirect.is_none() && rule.backends.is_empty() {
        return Err(error(
            at,
            "a rule needs backends, or a redirect (redirect or redirectHttps) without backends",
        ));
    }
    if let Some(redirect) = &rule.redirect {
        check_redirect(&format!("{at}.redirect"), redirect, rule.matches.as_ref())?;
    }
    for (index, backend) in rule.backends.iter().enumerate() {
        check_backend(&format!("{at}.backends[{index}]"), backend)?;
    }
    if !rule.backends.is_empty() && rule.backends.iter().all(|b| b.weight == Some(0)) {
        return Err(error(format!("{at}.backends"), "the weights are all zero"));
    }
    if let Some(m) = &rule.matches {
        check_match(&format!("{at}.match"), m)?;
    }
    check_options(at, &rule.options.clone())
}

fn check_redirect(
    at: &str,
    redirect: &Redirect,
    matches: Option<&RuleMatch>,
) -> Result<(), SpecError> {
    if redirect.path.is_some() && redirect.prefix.is_some() {
        return Err(error(at, "give at most one of path, prefix"));
    }
    let by_prefix =
        matches.is_some_and(|m| m.path_prefix.is_some() || m.path_segment_prefix.is_some());
    if redirect.prefix.is_some() && !by_prefix {
        return Err(error(
            format!("{at}.prefix"),
            "replaces the prefix the rule matches: it needs match.pathPrefix or match.pathSegmentPrefix",
        ));
    }
    if let Some(scheme) = &redirect.scheme
        && scheme != "http"
        && scheme != "https"
    {
        return Err(error(
            format!("{at}.scheme"),
            format!("{scheme:?} is not http or https"),
        ));
    }
    if let Some(port) = redirect.port
        && !(1..=65535).contains(&port)
    {
        return Err(error(
            format!("{at}.port"),
            format!("{port} is not within 1..65535"),
        ));
    }
    for (name, path) in [("path", &redirect.path), ("prefix", &redirect.prefix)] {
        if let Some(path) = path
            && !path.starts_with('/')
        {
            return Err(error(
                format!("{at}.{name}"),
                format!("{path:?} does not start with \"/\""),
            ));
        }
    }
    if let Some(code) = redirect.status_code
        && !REDIRECT_CODES.contains(&code)
    {
        return Err(error(
            format!("{at}.statusCode"),
            "a redirect's status code is 301, 302, 303, 307 or 308",
        ));
    }
    Ok(())
}

fn check_options(at: &str, options: &RuleOptions) -> Result<(), SpecError> {
    duration_field(&format!("{at}.timeout"), options.timeout.as_deref())?;
    duration_field(
        &format!("{at}.idleTimeout"),
        options.idle_timeout.as_deref(),
    )?;
    if let Some(retries) = &options.retries {
        if !(0..=10).contains(&retries.attempts) {
            return Err(error(
                format!("{at}.retries.attempts"),
                format!("{} is not within 0..10", retries.attempts),
            ));
        }
        duration_field(
            &format!("{at}.retries.perTryTimeout"),
            retries.per_try_timeout.as_deref(),
        )?;
        positive_duration(format!("{at}.retries.backoff"), retries.backoff.as_deref())?;
        for (i, condition) in retries.on.iter().enumerate() {
            if !RETRY_CONDITIONS.contains(&condition.as_str()) {
                return Err(error(
                    format!("{at}.retries.on[{i}]"),
                    format!(
                        "{condition:?} is not a retry condition of Envoy's (answer codes go in statusCodes)"
                    ),
                ));
            }
        }
        if retries.status_codes.len() > 32 {
            return Err(error(
                format!("{at}.retries.statusCodes"),
                "name at most 32 codes",
            ));
        }
        for (i, code) in retries.status_codes.iter().enumerate() {
            if !(400..=599).contains(code) {
                return Err(error(
                    format!("{at}.retries.statusCodes[{i}]"),
                    format!("{code} is not within 400..599"),
                ));
            }
        }
    }
    for (name, path) in [
        ("rewritePrefix", &options.rewrite_prefix),
        ("rewritePath", &options.rewrite_path),
    ] {
        if let Some(path) = path
            && !path.starts_with('/')
        {
            return Err(error(
                format!("{at}.{name}"),
                format!("{path:?} does not start with \"/\""),
            ));
        }
    }
    if options.rewrite_prefix.is_some() && options.rewrite_path.is_some() {
        return Err(error(at, "give at most one of rewritePrefix, rewritePath"));
    }
    if options.rewrite_host.as_deref() == Some("") {
        return Err(error(format!("{at}.rewriteHost"), "must not be empty"));
    }
    if let Some(cors) = &options.cors {
        check_cors(&format!("{at}.cors"), cors)?;
    }
    if let Some(limit) = &options.rate_limit {
        check_rate_limit(&format!("{at}.rateLimit"), limit)?;
    }
    if let Some(lb) = &options.load_balancer {
        check_load_balancer(&format!("{at}.loadBalancer"), lb)?;
    }
    if let Some(cb) = &options.circuit_breaker {
        check_circuit_breaker(&format!("{at}.circuitBreaker"), cb)?;
    }
    if let Some(od) = &options.outlier_detection {
        check_outlier_detection(&format!("{at}.outlierDetection"), od)?;
    }
    if let Some(hc) = &options.health_check {
        check_health_check(&format!("{at}.healthCheck"), hc)?;
    }
    if let Some(bytes) = options.max_request_body_bytes
        && !(1..=MAX_REQUEST_BODY_BYTES).contains(&bytes)
    {
        return Err(error(
            format!("{at}.maxRequestBodyBytes"),
            format!("{bytes} is not within 1..{MAX_REQUEST_BODY_BYTES}"),
        ));
    }
    Ok(())
}

/// 1 GiB: what a rule may ask Envoy to buffer of one request.
const MAX_REQUEST_BODY_BYTES: i64 = 1 << 30;

static ORIGIN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(\*|https?://[^/\s]+)$").expect("origin pattern"));
static TOKEN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,256}$").expect("token pattern"));
static METHOD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^([A-Z]{1,16}|\*)$").expect("method pattern"));

fn check_cors(at: &str, cors: &Cors) -> Result<(), SpecError> {
    if cors.allow_origins.is_empty() {
        return Err(error(
            format!("{at}.allowOrigins"),
            "name at least one origin (or \"*\")",
        ));
    }
    for (i, origin) in cors.allow_origins.iter().enumerate() {
        if !ORIGIN.is_match(origin) {
            return Err(error(
                format!("{at}.allowOrigins[{i}]"),
                format!("{origin:?} is not \"*\" nor an origin like https://app.example.com"),
            ));
        }
    }
    for (i, method) in cors.allow_methods.iter().enumerate() {
        if !METHOD.is_match(method) {
            return Err(error(
                format!("{at}.allowMethods[{i}]"),
                format!("{method:?} is not an HTTP method nor \"*\""),
            ));
        }
    }
    for (name, headers) in [
        ("allowHeaders", &cors.allow_headers),
        ("exposeHeaders", &cors.expose_headers),
    ] {
        for (i, header) in headers.iter().enumerate() {
            if !TOKEN.is_match(header) {
                return Err(error(
                    format!("{at}.{name}[{i}]"),
                    format!("{header:?} is not a header name"),
                ));
            }
        }
    }
    duration_field(&format!("{at}.maxAge"), cors.max_age.as_deref())
}

fn check_load_balancer(at: &str, lb: &LoadBalancer) -> Result<(), SpecError> {
    if let Some(policy) = &lb.policy
        && !LB_POLICIES.contains(&policy.as_str())
    {
        return Err(error(
            format!("{at}.policy"),
            format!("{policy:?} is not one of {}", LB_POLICIES.join(", ")),
        ));
    }
    let Some(affinity) = &lb.affinity else {
        return Ok(());
    };
    let at = format!("{at}.affinity");
    if lb
        .policy
        .as_deref()
        .is_some_and(|p| p != "ringHash" && p != "maglev")
    {
        return Err(error(
            &at,
            "affinity needs the policy ringHash or maglev (or no policy: ringHash)",
        ));
    }
    let given = [
        affinity.cookie.is_some(),
        affinity.header.is_some(),
        affinity.source_ip == Some(true),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err(error(&at, "give exactly one of cookie, header, sourceIP"));
    }
    if let Some(header) = &affinity.header
        && !TOKEN.is_match(header)
    {
        return Err(error(
            format!("{at}.header"),
            format!("{header:?} is not a header name"),
        ));
    }
    if let Some(cookie) = &affinity.cookie {
        if !TOKEN.is_match(&cookie.name) {
            return Err(error(
                format!("{at}.cookie.name"),
                format!("{:?} is not a cookie name", cookie.name),
            ));
        }
        duration_field(&format!("{at}.cookie.ttl"), cookie.ttl.as_deref())?;
        if let Some(path) = &cookie.path
            && (!path.starts_with('/') || path.contains([';', ' ', '\t', '\r', '\n']))
        {
            return Err(error(
                format!("{at}.cookie.path"),
                format!("{path:?} is not a cookie path"),
            ));
        }
    }
    Ok(())
}

fn check_rate_limit(at: &str, limit: &RateLimit) -> Result<(), SpecError> {
    if !(1..=1_000_000).contains(&limit.requests) {
        return Err(error(
            format!("{at}.requests"),
            format!("{} is not within 1..1000000", limit.requests),
        ));
    }
    if !RATE_LIMIT_UNITS.iter().any(|(u, _)| *u == limit.unit) {
        return Err(error(
            format!("{at}.unit"),
            format!("{:?} is not second, minute or hour", limit.unit),
        ));
    }
    if let Some(burst) = limit.burst
        && !(0..=1_000_000).contains(&burst)
    {
        return Err(error(
            format!("{at}.burst"),
            format!("{burst} is not within 0..1000000"),
        ));
    }
    Ok(())
}

fn check_backend(at: &str, backend: &Backend) -> Result<(), SpecError> {
    if backend.service.is_empty() {
        return Err(error(format!("{at}.service"), "must not be empty"));
    }
    match (backend.port, &backend.port_name) {
        (Some(port), None) if !(1..=65535).contains(&port) => {
            return Err(error(
                format!("{at}.port"),
                format!("{port} is not within 1..65535"),
            ));
        }
        (None, Some(name)) if name.is_empty() => {
            return Err(error(format!("{at}.portName"), "must not be empty"));
        }
        (Some(_), None) | (None, Some(_)) => {}
        _ => return Err(error(at, "give exactly one of port, portName")),
    }
    if let Some(weight) = backend.weight
        && !(0..=10000).contains(&weight)
    {
        return Err(error(
            format!("{at}.weight"),
            format!("{weight} is not within 0..10000"),
        ));
    }
    Ok(())
}

fn check_match(at: &str, m: &RuleMatch) -> Result<(), SpecError> {
    let paths = [
        &m.path_prefix,
        &m.path_segment_prefix,
        &m.path_exact,
        &m.path_regex,
    ];
    if paths.iter().filter(|p| p.is_some()).count() > 1 {
        return Err(error(
            at,
            "give at most one of pathPrefix, pathSegmentPrefix, pathExact, pathRegex",
        ));
    }
    for (name, path) in [
        ("pathPrefix", &m.path_prefix),
        ("pathSegmentPrefix", &m.path_segment_prefix),
        ("pathExact", &m.path_exact),
    ] {
        if let Some(path) = path
            && !path.starts_with('/')
        {
            return Err(error(
                format!("{at}.{name}"),
                format!("{path:?} does not start with \"/\""),
            ));
        }
    }
    if m.path_regex.as_deref() == Some("") {
        return Err(error(format!("{at}.pathRegex"), "must not be empty"));
    }
    if let Some(method) = &m.method
        && (method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()))
    {
        return Err(error(
            format!("{at}.method"),
            format!("{method:?} is not an HTTP method in capitals"),
        ));
    }
    for (index, q) in m.query_params.iter().enumerate() {
        let kinds = [
            q.exact.is_some(),
            q.regex.is_some(),
            q.present == Some(true),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(error(
                format!("{at}.queryParams[{index}] ({:?})", q.name),
                "give exactly one of exact, regex, present",
            ));
        }
        if q.name.is_empty() {
            return Err(error(
                format!("{at}.queryParams[{index}].name"),
                "must not be empty",
            ));
        }
    }
    for (index, h) in m.headers.iter().enumerate() {
        if h.name.is_empty() {
            return Err(error(
                format!("{at}.headers[{index}].name"),
                "must not be empty",
            ));
        }
        let given = [
            h.exact.is_some(),
            h.prefix.is_some(),
            h.regex.is_some(),
            h.present == Some(true),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(error(
                format!("{at}.headers[{index}] ({:?})", h.name),
                "give exactly one of exact, prefix, regex, present",
            ));
        }
    }
    Ok(())
}

/// A number the spec bounds, when given.
fn within(
    at: String,
    value: Option<i32>,
    range: std::ops::RangeInclusive<i32>,
) -> Result<(), SpecError> {
    match value {
        Some(v) if !range.contains(&v) => Err(error(
            at,
            format!("{v} is not within {}..{}", range.start(), range.end()),
        )),
        _ => Ok(()),
    }
}

/// A duration the spec bounds below: it must be more than zero.
fn positive_duration(at: String, text: Option<&str>) -> Result<(), SpecError> {
    match text.map(duration::parse) {
        Some(Err(e)) => Err(error(at, e)),
        Some(Ok(d)) if d.is_zero() => Err(error(at, "must be more than 0s")),
        _ => Ok(()),
    }
}

fn check_circuit_breaker(at: &str, cb: &CircuitBreaker) -> Result<(), SpecError> {
    within(
        format!("{at}.maxConnections"),
        cb.max_connections,
        1..=1_000_000,
    )?;
    within(
        format!("{at}.maxPendingRequests"),
        cb.max_pending_requests,
        1..=1_000_000,
    )?;
    within(format!("{at}.maxRequests"), cb.max_requests, 1..=1_000_000)?;
    within(format!("{at}.maxRetries"), cb.max_retries, 0..=1_000_000)
}

fn check_outlier_detection(at: &str, od: &OutlierDetection) -> Result<(), SpecError> {
    within(format!("{at}.consecutive5xx"), od.consecutive_5xx, 1..=1000)?;
    positive_duration(format!("{at}.interval"), od.interval.as_deref())?;
    positive_duration(
        format!("{at}.baseEjectionTime"),
        od.base_ejection_time.as_deref(),
    )?;
    within(
        format!("{at}.maxEjectionPercent"),
        od.max_ejection_percent,
        0..=100,
    )
}

static HOST_HEADER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(:[0-9]{1,5})?$")
        .expect("host pattern")
});

fn check_health_check(at: &str, hc: &HealthCheck) -> Result<(), SpecError> {
    if !hc.path.starts_with('/') || hc.path.len() > 1024 || hc.path.contains(char::is_whitespace) {
        return Err(error(
            format!("{at}.path"),
            format!("{:?} is not a path (\"/...\", no spaces)", hc.path),
        ));
    }
    if let Some(host) = &hc.host
        && (host.len() > 253 || !HOST_HEADER.is_match(host))
    {
        return Err(error(
            format!("{at}.host"),
            format!("{host:?} is not a host name"),
        ));
    }
    positive_duration(format!("{at}.interval"), hc.interval.as_deref())?;
    positive_duration(format!("{at}.timeout"), hc.timeout.as_deref())?;
    within(
        format!("{at}.unhealthyThreshold"),
        hc.unhealthy_threshold,
        1..=100,
    )?;
    within(
        format!("{at}.healthyThreshold"),
        hc.healthy_threshold,
        1..=100,
    )
}

/// The spec keeps duration strings as written; they must parse as the lowering parses them.
pub fn duration_field(at: &str, text: Option<&str>) -> Result<(), SpecError> {
    match text.map(duration::parse) {
        Some(Err(e)) => Err(error(at, e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::spec::{Affinity, AffinityCookie, HeaderMatch, Retries, RouteTls};

    fn spec(rules: Vec<RouteRule>) -> RouteSpec {
        RouteSpec {
            hosts: vec!["Shop.Example.com".into(), "*.shop.example.com".into()],
            tls: None,
            rules,
        }
    }

    fn backend(port: i32) -> Backend {
        Backend {
            service: "web".into(),
            port: Some(port),
            ..Backend::default()
        }
    }

    fn rule() -> RouteRule {
        RouteRule {
            backends: vec![backend(80)],
            ..RouteRule::default()
        }
    }

    fn error_of(spec: &RouteSpec) -> String {
        check("", spec)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn a_valid_spec_gives_lower_cased_hosts_and_every_rule_a_name() {
        let named = RouteRule {
            name: Some("api".into()),
            ..rule()
        };
        let checked = check("spec", &spec(vec![named, rule()])).expect("valid");
        assert_eq!(checked.hosts, ["shop.example.com", "*.shop.example.com"]);
        assert_eq!(checked.rule_names, ["api", "rule-1"]);
    }

    #[test]
    fn paths_start_at_the_root_the_front_end_gives() {
        let mut bad = spec(vec![rule()]);
        bad.rules[0].options.timeout = Some("5x".into());
        let at = |root| check(root, &bad).expect_err("invalid").at;
        assert_eq!(at("spec"), "spec.rules[0].timeout");
        assert_eq!(at(""), "rules[0].timeout");
    }

    #[test]
    fn each_rule_of_the_schema_is_checked_again() {
        let cases: Vec<(&str, RouteSpec)> = vec![
            ("hosts: a route needs at least one host", {
                let mut s = spec(vec![rule()]);
                s.hosts.clear();
                s
            }),
            ("repeats hosts[0]", {
                let mut s = spec(vec![rule()]);
                s.hosts.push("SHOP.example.com".into());
                s
            }),
            ("tls.secretName: must not be empty", {
                let mut s = spec(vec![rule()]);
                s.tls = Some(RouteTls::default());
                s
            }),
            ("rules: a route needs at least one rule", spec(vec![])),
            (
                "rules[1]: the rule name \"rule-1\" is already used by rules[0]",
                spec(vec![
                    RouteRule {
                        name: Some("rule-1".into()),
                        ..rule()
                    },
                    rule(),
                ]),
            ),
            (
                "rules[0]: a rule with redirectHttps has no backends",
                spec(vec![RouteRule {
                    redirect_https: Some(true),
                    ..rule()
                }]),
            ),
            (
                "rules[0]: a rule with redirect has no backends",
                spec(vec![RouteRule {
                    redirect: Some(Redirect::default()),
                    ..rule()
                }]),
            ),
            (
                "rules[0]: give at most one of redirect, redirectHttps",
                spec(vec![RouteRule {
                    redirect: Some(Redirect::default()),
                    redirect_https: Some(true),
                    backends: vec![],
                    ..rule()
                }]),
            ),
            (
                "rules[0].redirect.prefix: replaces the prefix the rule matches",
                spec(vec![RouteRule {
                    redirect: Some(Redirect {
                        prefix: Some("/new".into()),
                        ..Redirect::default()
                    }),
                    backends: vec![],
                    ..rule()
                }]),
            ),
            (
                "rules[0].redirect.statusCode: a redirect's status code is",
                spec(vec![RouteRule {
                    redirect: Some(Redirect {
                        status_code: Some(304),
                        ..Redirect::default()
                    }),
                    backends: vec![],
                    ..rule()
                }]),
            ),
            (
                "rules[0]: give at most one of rewritePrefix, rewritePath",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        rewrite_prefix: Some("/v2".into()),
                        rewrite_path: Some("/index.html".into()),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].match.method: \"get\" is not an HTTP method in capitals",
                spec(vec![RouteRule {
                    matches: Some(RuleMatch {
                        method: Some("get".into()),
                        ..RuleMatch::default()
                    }),
                    ..rule()
                }]),
            ),
            (
                "rules[0].match.queryParams[0] (\"q\"): give exactly one of exact, regex, present",
                spec(vec![RouteRule {
                    matches: Some(RuleMatch {
                        query_params: vec![crate::route::spec::QueryParamMatch {
                            name: "q".into(),
                            ..Default::default()
                        }],
                        ..RuleMatch::default()
                    }),
                    ..rule()
                }]),
            ),
            (
                "rules[0].match.pathSegmentPrefix: \"api\" does not start with",
                spec(vec![RouteRule {
                    matches: Some(RuleMatch {
                        path_segment_prefix: Some("api".into()),
                        ..RuleMatch::default()
                    }),
                    ..rule()
                }]),
            ),
            (
                "rules[0].backends[0].port: 0 is not within 1..65535",
                spec(vec![RouteRule {
                    backends: vec![backend(0)],
                    ..rule()
                }]),
            ),
            (
                "rules[0].backends: the weights are all zero",
                spec(vec![RouteRule {
                    backends: vec![Backend {
                        weight: Some(0),
                        ..backend(80)
                    }],
                    ..rule()
                }]),
            ),
            (
                "rules[0].match.headers[0] (\"x\"): give exactly one of",
                spec(vec![RouteRule {
                    matches: Some(RuleMatch {
                        headers: vec![HeaderMatch {
                            name: "x".into(),
                            ..HeaderMatch::default()
                        }],
                        ..RuleMatch::default()
                    }),
                    ..rule()
                }]),
            ),
            (
                "rules[0].retries.attempts: 11 is not within 0..10",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        retries: Some(Retries {
                            attempts: 11,
                            ..Retries::default()
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].retries.statusCodes[1]: 200 is not within 400..599",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        retries: Some(Retries {
                            attempts: 2,
                            status_codes: vec![503, 200],
                            ..Retries::default()
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].retries.on[1]: \"503\" is not a retry condition",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        retries: Some(Retries {
                            attempts: 2,
                            on: vec!["5xx".into(), "503".into()],
                            ..Retries::default()
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].retries.backoff: must be more than 0s",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        retries: Some(Retries {
                            attempts: 2,
                            backoff: Some("0ms".into()),
                            ..Retries::default()
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].cors.allowOrigins: name at least one origin",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        cors: Some(Cors::default()),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].cors.allowOrigins[0]: \"app.example.com\" is not",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        cors: Some(Cors {
                            allow_origins: vec!["app.example.com".into()],
                            ..Cors::default()
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].cors.allowMethods[0]: \"get\" is not an HTTP method",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        cors: Some(Cors {
                            allow_origins: vec!["*".into()],
                            allow_methods: vec!["get".into()],
                            ..Cors::default()
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].cors.maxAge",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        cors: Some(Cors {
                            allow_origins: vec!["*".into()],
                            max_age: Some("ten minutes".into()),
                            ..Cors::default()
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].rateLimit.unit: \"day\" is not second, minute or hour",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        rate_limit: Some(RateLimit {
                            requests: 1,
                            unit: "day".into(),
                            burst: None,
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].rateLimit.requests: 0 is not within 1..1000000",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        rate_limit: Some(RateLimit {
                            requests: 0,
                            unit: "second".into(),
                            burst: None,
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].loadBalancer.policy: \"weighted\" is not one of",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        load_balancer: Some(LoadBalancer {
                            policy: Some("weighted".into()),
                            affinity: None,
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].loadBalancer.affinity: affinity needs the policy ringHash or maglev",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        load_balancer: Some(LoadBalancer {
                            policy: Some("leastRequest".into()),
                            affinity: Some(Affinity {
                                source_ip: Some(true),
                                ..Affinity::default()
                            }),
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].loadBalancer.affinity: give exactly one of cookie, header, sourceIP",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        load_balancer: Some(LoadBalancer {
                            policy: None,
                            affinity: Some(Affinity::default()),
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].circuitBreaker.maxRequests: 0 is not within 1..1000000",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        circuit_breaker: Some(CircuitBreaker {
                            max_requests: Some(0),
                            ..CircuitBreaker::default()
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].outlierDetection.interval: must be more than 0s",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        outlier_detection: Some(OutlierDetection {
                            interval: Some("0s".into()),
                            ..OutlierDetection::default()
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].outlierDetection.maxEjectionPercent: 101 is not within 0..100",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        outlier_detection: Some(OutlierDetection {
                            max_ejection_percent: Some(101),
                            ..OutlierDetection::default()
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].healthCheck.path: \"healthz\" is not a path (\"/...\", no spaces)",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        health_check: Some(HealthCheck {
                            path: "healthz".into(),
                            ..HealthCheck::default()
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].healthCheck.host: \"Web Server\" is not a host name",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        health_check: Some(HealthCheck {
                            path: "/healthz".into(),
                            host: Some("Web Server".into()),
                            ..HealthCheck::default()
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].healthCheck.timeout: duration \"soon\" does not start with a number",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        health_check: Some(HealthCheck {
                            path: "/healthz".into(),
                            timeout: Some("soon".into()),
                            ..HealthCheck::default()
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].loadBalancer.affinity.cookie.path: \"/a; b\" is not a cookie path",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        load_balancer: Some(LoadBalancer {
                            policy: None,
                            affinity: Some(Affinity {
                                cookie: Some(AffinityCookie {
                                    name: "s".into(),
                                    ttl: None,
                                    path: Some("/a; b".into()),
                                }),
                                ..Affinity::default()
                            }),
                        }),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
            (
                "rules[0].maxRequestBodyBytes: 0 is not within 1..1073741824",
                spec(vec![RouteRule {
                    options: RuleOptions {
                        max_request_body_bytes: Some(0),
                        ..rule().options
                    },
                    ..rule()
                }]),
            ),
        ];
        for (expected, spec) in cases {
            let message = error_of(&spec);
            assert!(
                message.contains(expected),
                "{message:?} should contain {expected:?}"
            );
        }
    }
}
