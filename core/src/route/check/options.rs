//! The option checks of a rule: what it does to the requests it forwards (timeouts,
//! retries, rewrites, CORS, rate limits, load balancing, the limits and health checking of
//! its clusters, the body it buffers).

use std::sync::LazyLock;

use regex::Regex;

use super::super::spec::{
    CircuitBreaker, Cors, HealthCheck, LB_POLICIES, LoadBalancer, OutlierDetection,
    RATE_LIMIT_UNITS, RETRY_CONDITIONS, RateLimit, Retries, RuleOptions,
};
use super::{Checks, SpecError, error, field};
use crate::duration;

/// The options of a rule at `at`, as much as `checks` say (see [`Checks::Lowered`]).
pub(super) fn check(at: &str, checks: Checks, options: &RuleOptions) -> Result<(), SpecError> {
    let spec = checks == Checks::Spec;
    if spec {
        duration_field(&field(at, "timeout"), options.timeout.as_deref())?;
        duration_field(&field(at, "idleTimeout"), options.idle_timeout.as_deref())?;
    }
    if let Some(retries) = &options.retries {
        check_retries(&field(at, "retries"), checks, retries)?;
    }
    if !spec {
        return match &options.load_balancer {
            Some(lb) => check_load_balancer(&field(at, "loadBalancer"), lb),
            None => Ok(()),
        };
    }
    for (name, path) in [
        ("rewritePrefix", &options.rewrite_prefix),
        ("rewritePath", &options.rewrite_path),
    ] {
        if let Some(path) = path
            && !path.starts_with('/')
        {
            return Err(error(
                field(at, name),
                format!("{path:?} does not start with \"/\""),
            ));
        }
    }
    if options.rewrite_prefix.is_some() && options.rewrite_path.is_some() {
        return Err(error(at, "give at most one of rewritePrefix, rewritePath"));
    }
    if options.rewrite_host.as_deref() == Some("") {
        return Err(error(field(at, "rewriteHost"), "must not be empty"));
    }
    if let Some(cors) = &options.cors {
        check_cors(&field(at, "cors"), cors)?;
    }
    if let Some(limit) = &options.rate_limit {
        check_rate_limit(&field(at, "rateLimit"), limit)?;
    }
    if let Some(lb) = &options.load_balancer {
        check_load_balancer(&field(at, "loadBalancer"), lb)?;
    }
    if let Some(cb) = &options.circuit_breaker {
        check_circuit_breaker(&field(at, "circuitBreaker"), cb)?;
    }
    if let Some(od) = &options.outlier_detection {
        check_outlier_detection(&field(at, "outlierDetection"), od)?;
    }
    if let Some(hc) = &options.health_check {
        check_health_check(&field(at, "healthCheck"), hc)?;
    }
    if let Some(bytes) = options.max_request_body_bytes
        && !(1..=MAX_REQUEST_BODY_BYTES).contains(&bytes)
    {
        return Err(error(
            field(at, "maxRequestBodyBytes"),
            format!("{bytes} is not within 1..{MAX_REQUEST_BODY_BYTES}"),
        ));
    }
    Ok(())
}

/// The retries a rule may ask for, at most.
pub const RETRY_ATTEMPTS: std::ops::RangeInclusive<i32> = 0..=100;

/// The answers a rule may retry on.
pub const RETRY_STATUS_CODES: std::ops::RangeInclusive<i32> = 400..=599;

fn check_retries(at: &str, checks: Checks, retries: &Retries) -> Result<(), SpecError> {
    if !RETRY_ATTEMPTS.contains(&retries.attempts) {
        return Err(error(
            format!("{at}.attempts"),
            format!(
                "{} is not within {}..{}",
                retries.attempts,
                RETRY_ATTEMPTS.start(),
                RETRY_ATTEMPTS.end()
            ),
        ));
    }
    duration_field(
        &format!("{at}.perTryTimeout"),
        retries.per_try_timeout.as_deref(),
    )?;
    positive_duration(format!("{at}.backoff"), retries.backoff.as_deref())?;
    for (i, condition) in retries.on.iter().enumerate() {
        if !RETRY_CONDITIONS.contains(&condition.as_str()) {
            return Err(error(
                format!("{at}.on[{i}]"),
                format!(
                    "{condition:?} is not a retry condition of Envoy's (answer codes go in statusCodes)"
                ),
            ));
        }
    }
    // The CRD's bound, not Envoy's: another API may name more.
    if checks == Checks::Spec && retries.status_codes.len() > 32 {
        return Err(error(format!("{at}.statusCodes"), "name at most 32 codes"));
    }
    for (i, code) in retries.status_codes.iter().enumerate() {
        if !RETRY_STATUS_CODES.contains(code) {
            return Err(error(
                format!("{at}.statusCodes[{i}]"),
                format!(
                    "{code} is not within {}..{}",
                    RETRY_STATUS_CODES.start(),
                    RETRY_STATUS_CODES.end()
                ),
            ));
        }
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
