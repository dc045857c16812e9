//! HTTPRoutes: each parentRef attached to the listeners of a Gateway of Switchyard's that
//! admit it, and each rule lowered into the core's vocabulary, one rule per match, through
//! the core's assembly step (`switchyard_core::route::assemble`): its checks
//! ([`Checks::Lowered`]: where the vocabulary admits less than the Gateway API's schema),
//! worded in the HTTPRoute's own fields ([`refusal`]), and its clusters.

use super::attach::{Lowered, Ranked, Route, Specificity, route_of};
use super::backend_ref::{Backends, Referrer, UrlRewrite, backends, mirrors};
use super::duration::{gateway_duration_ms, vocabulary_duration};
use super::gateway::{GRPC_ROUTE, HTTP_ROUTE, TCP_ROUTE, TLS_ROUTE, UDP_ROUTE};
use super::{Cond, GatewayRule, Inputs};
use crate::gateway::api::httproutes::{
    HttpRoute, HttpRouteRules, HttpRouteRulesFilters, HttpRouteRulesFiltersCors,
    HttpRouteRulesFiltersRequestRedirect,
    HttpRouteRulesFiltersRequestRedirectPathType as RedirectPathType,
    HttpRouteRulesFiltersRequestRedirectScheme as RedirectScheme,
    HttpRouteRulesFiltersType as FilterType,
    HttpRouteRulesFiltersUrlRewritePathType as RewritePathType, HttpRouteRulesMatches,
    HttpRouteRulesMatchesHeadersType as HeaderType, HttpRouteRulesMatchesPathType as PathType,
    HttpRouteRulesMatchesQueryParamsType as QueryType, HttpRouteRulesRetry,
    HttpRouteRulesSessionPersistence,
    HttpRouteRulesSessionPersistenceCookieLifetimeType as LifetimeType,
    HttpRouteRulesSessionPersistenceType as SessionType, HttpRouteUseDefaultGateways,
};
use switchyard_core::route::check::{RETRY_ATTEMPTS, RETRY_STATUS_CODES};
use switchyard_core::route::spec::{
    Affinity, AffinityCookie, Cors, HeaderEdits, LoadBalancer, QueryParamMatch, Redirect, Retries,
    RuleMatch, RuleOptions,
};
use switchyard_core::route::{Checks, Draft, SpecError, assemble, check::rule_name as unnamed};

/// The route as attachment reads it.
pub fn route(route: &HttpRoute) -> Route<'_> {
    route_of!(route, HTTP_ROUTE)
}

/// The route's rules (it is the `seniority`-th oldest) in the vocabulary, or what it uses
/// that Switchyard does not support (it is then not accepted at all, rather than served in
/// part).
pub fn lower(inputs: &Inputs<'_>, route: &HttpRoute, seniority: usize) -> Result<Lowered, String> {
    if route.spec.use_default_gateways == Some(HttpRouteUseDefaultGateways::All) {
        return Err(NO_DEFAULT_GATEWAYS.to_owned());
    }
    let rules = route.spec.rules.as_deref().unwrap_or_default();
    let lower_matches = |ri: usize, at: &str| {
        let default_match = [HttpRouteRulesMatches::default()];
        let matches = match rules.get(ri).and_then(|r| r.matches.as_deref()) {
            None | Some([]) => &default_match[..],
            Some(m) => m,
        };
        (matches.iter().enumerate())
            .map(|(mi, m)| lower_match(m, &format!("{at}.matches[{mi}]")))
            .collect()
    };
    let of = RuleOf {
        kind: HTTP_ROUTE,
        namespace: route.metadata.namespace.as_deref().unwrap_or_default(),
        name: route.metadata.name.as_deref().unwrap_or_default(),
        seniority,
        backend_tls: true,
    };
    lower_rules(inputs, &of, rules, &lower_matches)
}

/// `spec.useDefaultGateways: All`'s refusal.
pub const NO_DEFAULT_GATEWAYS: &str = "spec.useDefaultGateways: All is not supported \
    (Switchyard has no default Gateways): name the Gateway in parentRefs";

/// Whose rules are lowered: the route's kind, namespace and name, and its place among
/// the routes, oldest first.
pub struct RuleOf<'a> {
    pub kind: &'static str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub seniority: usize,
    /// Whether its backends' BackendTLSPolicies apply ([`Referrer::backend_tls`]).
    pub backend_tls: bool,
}

/// A rule's matches in the vocabulary, each with how specific it is.
pub type Matches = Vec<(RuleMatch, Specificity)>;

/// Rules in HTTPRoute's fields (an HTTPRoute's, or a GRPCRoute's: its filters and
/// backendRefs are HTTPRoute's) in the vocabulary, the matches of the i-th lowered by
/// `lower_matches(i, at)`; or the first thing they use that Switchyard does not support. A
/// GRPCRoute's backends speak HTTP/2, its requests never upgrade, and what it cannot send
/// anywhere is answered as gRPC clients expect (`Rule::grpc`).
pub fn lower_rules(
    inputs: &Inputs<'_>,
    of: &RuleOf<'_>,
    spec_rules: &[HttpRouteRules],
    lower_matches: &dyn Fn(usize, &str) -> Result<Matches, String>,
) -> Result<Lowered, String> {
    let RuleOf {
        kind,
        namespace,
        name,
        seniority,
        backend_tls,
    } = *of;
    let grpc = kind == GRPC_ROUTE;
    let mut rules = Vec::new();
    let mut first_problem: Option<Cond> = None;
    for (ri, rule) in spec_rules.iter().enumerate() {
        let at = format!("spec.rules[{ri}]");
        let (
            Lowering {
                mut options,
                redirect,
            },
            problem,
        ) = lower_filters(rule, &at);
        let stream = [TLS_ROUTE, TCP_ROUTE, UDP_ROUTE].contains(&kind);
        if grpc || stream {
            options.websocket = None;
        }
        let draft = |options: &RuleOptions, matches| Draft {
            matches,
            redirect_https: false,
            redirect: redirect.clone(),
            options: options.clone(),
        };
        // The vocabulary's checks first: what they look at (retries, then the session's
        // cookie) is lowered before anything of the rule that can fail after it, and a
        // lowering that failed hands over only what it lowered before its problem. So a
        // rule's first problem is the one it was when this front-end checked its retries
        // itself (but for a retry with both a code outside 400..599, which the Gateway
        // API's schema refuses, and a zero backoff: the backoff is named first now).
        assemble::check("", Checks::Lowered, draft(&options, None))
            .map_err(|e| refusal(&at, rule, &e))?;
        if let Some(problem) = problem {
            return Err(problem);
        }
        let referrer = Referrer {
            kind,
            namespace,
            backend_tls,
        };
        let Backends {
            usable: mut backends,
            unavailable: unavailable_weight,
            rewrite,
        } = backends(inputs, &referrer, rule, &at, &mut first_problem)?;
        if let Some(rewrite) = rewrite {
            take_rewrite(&mut options, rewrite, &at)?;
        }
        let mut mirrors = mirrors(inputs, &referrer, rule, &at, &mut first_problem)?;
        if grpc {
            // gRPC is HTTP/2, whatever the Service's appProtocol says.
            (backends.iter_mut()).for_each(|b| b.cluster.http2 = true);
            (mirrors.iter_mut()).for_each(|m| m.cluster.http2 = true);
        }
        if stream {
            // Connections are forwarded as they come, whatever they carry.
            (backends.iter_mut()).for_each(|b| b.cluster.http2 = false);
        }
        // A redirect answers by itself: it has no backends to miss.
        let unavailable_weight = if redirect.is_some() {
            0
        } else {
            unavailable_weight
        };
        let rule_name = rule.name.clone().unwrap_or_else(|| unnamed(ri));
        for (mi, (matches, specificity)) in lower_matches(ri, &at)?.into_iter().enumerate() {
            // The rule this match makes, through the same checks (they passed above).
            let checked = assemble::check("", Checks::Lowered, draft(&options, Some(matches)))
                .map_err(|e| refusal(&at, rule, &e))?;
            let made = checked
                .rule(
                    format!("{namespace}/{name}/{rule_name}/{mi}"),
                    backends.clone(),
                )
                .mirrored(mirrors.clone())
                .unavailable(unavailable_weight);
            rules.push(Ranked {
                specificity,
                order: (seniority, ri, mi),
                rule: GatewayRule {
                    route: format!("{namespace}/{name}"),
                    kind,
                    rule: if grpc { made.grpc() } else { made },
                    passed_through: None,
                },
            });
        }
    }
    let resolved_refs = first_problem
        .unwrap_or_else(|| Cond::yes("ResolvedRefs", "ResolvedRefs", "all references resolved"));
    Ok(Lowered {
        rules,
        resolved_refs,
    })
}

/// The URLRewrite of the rule's only backendRef, as the rule's own: refused when the rule
/// has one too (which would Envoy apply?).
fn take_rewrite(options: &mut RuleOptions, rewrite: UrlRewrite, at: &str) -> Result<(), String> {
    let rule_has_one = options.rewrite_host.is_some()
        || options.rewrite_path.is_some()
        || options.rewrite_prefix.is_some();
    if rule_has_one {
        return Err(format!(
            "{at}: a URLRewrite on both the rule and its backendRef is not supported"
        ));
    }
    options.rewrite_host = rewrite.host;
    options.rewrite_path = rewrite.path;
    options.rewrite_prefix = rewrite.prefix;
    Ok(())
}

/// The vocabulary's options of a rule, and its redirect.
#[derive(Clone, Default)]
struct Lowering {
    options: RuleOptions,
    redirect: Option<Redirect>,
}

/// The rule's filters, timeouts, retries and session in the vocabulary, and the first
/// problem lowering them met: what was lowered before it is kept, for the vocabulary's
/// checks to see.
fn lower_filters(rule: &HttpRouteRules, at: &str) -> (Lowering, Option<String>) {
    // The Gateway API has no field for upgrades; its backends may speak WebSocket (the
    // appProtocol `kubernetes.io/ws`), so every rule lets the upgrade through, as Envoy
    // Gateway and Istio do. The backend still decides whether to accept it.
    let mut lowering = Lowering {
        options: RuleOptions {
            websocket: Some(true),
            ..RuleOptions::default()
        },
        redirect: None,
    };
    let problem = lower_filters_into(rule, at, &mut lowering).err();
    (lowering, problem)
}

fn lower_filters_into(
    rule: &HttpRouteRules,
    at: &str,
    lowering: &mut Lowering,
) -> Result<(), String> {
    for (fi, filter) in rule.filters.iter().flatten().enumerate() {
        let at = format!("{at}.filters[{fi}]");
        match filter.r#type {
            FilterType::RequestHeaderModifier => {
                lowering.options.request_headers = Some(Box::new(request_edits(filter)));
            }
            FilterType::ResponseHeaderModifier => {
                lowering.options.response_headers = Some(Box::new(response_edits(filter)));
            }
            FilterType::UrlRewrite => {
                let Some(rewrite) = filter.url_rewrite.as_ref() else {
                    continue;
                };
                lowering.options.rewrite_host = rewrite.hostname.clone();
                if let Some(path) = &rewrite.path {
                    match path.r#type {
                        RewritePathType::ReplaceFullPath => {
                            lowering.options.rewrite_path = path.replace_full_path.clone();
                        }
                        RewritePathType::ReplacePrefixMatch => {
                            lowering.options.rewrite_prefix = path.replace_prefix_match.clone();
                        }
                    }
                }
            }
            FilterType::RequestRedirect => {
                lowering.redirect = filter.request_redirect.as_ref().map(redirect);
            }
            FilterType::Cors => {
                lowering.options.cors = filter.cors.as_ref().and_then(cors).map(Box::new);
            }
            // Resolved with the rule's backends (`backend_ref::mirrors`).
            FilterType::RequestMirror => {}
            ref other => return Err(format!("{at}: filter {other:?} is not supported")),
        }
    }
    if let Some(timeouts) = &rule.timeouts {
        if let Some(backend) = &timeouts.backend_request {
            let timeout = gateway_duration_ms(backend)
                .and_then(vocabulary_duration)
                .ok_or_else(|| {
                    format!("{at}.timeouts.backendRequest: {backend:?} is not a duration")
                })?;
            // Each request to a backend, the first included: Envoy's per-try timeout.
            lowering.options.retries = Some(Box::new(Retries {
                attempts: 0,
                per_try_timeout: Some(timeout),
                ..Retries::default()
            }));
        }
        if let Some(request) = &timeouts.request {
            let timeout = gateway_duration_ms(request)
                .and_then(vocabulary_duration)
                .ok_or_else(|| format!("{at}.timeouts.request: {request:?} is not a duration"))?;
            lowering.options.timeout = Some(timeout);
        }
    }
    if let Some(retry) = &rule.retry {
        // After timeouts: a backendRequest timeout is the per-try timeout of these retries.
        let retries = lowering.options.retries.get_or_insert_with(Box::default);
        lower_retry(retry, &format!("{at}.retry"), retries)?;
    }
    if let Some(session) = &rule.session_persistence {
        lowering.options.load_balancer = Some(Box::new(session_persistence(
            session,
            &format!("{at}.sessionPersistence"),
        )?));
    }
    Ok(())
}

/// Retries when the route names no number (the Gateway API leaves it to implementations):
/// Envoy's default.
const GATEWAY_RETRY_ATTEMPTS: i32 = 1;

/// What a Gateway API retry retries besides its codes: a backend that could not be reached
/// or did not answer at all, a per-try timeout included (the backoff's "after timing out").
const GATEWAY_RETRY_ON: [&str; 3] = ["connect-failure", "refused-stream", "reset"];

/// The cookie's name when the route names no session.
const SESSION_COOKIE: &str = "switchyard-session";

/// A rule's `retry` in the vocabulary's retries. Numbers that do not fit the vocabulary's
/// are lowered to ones its checks refuse (the refusal names the route's own number); a
/// backoff that is not a duration is a problem, met after the attempts and codes are in.
fn lower_retry(retry: &HttpRouteRulesRetry, at: &str, into: &mut Retries) -> Result<(), String> {
    into.attempts = retry.attempts.map_or(GATEWAY_RETRY_ATTEMPTS, saturated);
    into.on = GATEWAY_RETRY_ON.map(str::to_owned).to_vec();
    into.status_codes = retry
        .codes
        .iter()
        .flatten()
        .map(|&c| saturated(c))
        .collect();
    into.backoff = match &retry.backoff {
        None => None,
        Some(text) => Some(
            gateway_duration_ms(text)
                .and_then(vocabulary_duration)
                .ok_or_else(|| format!("{at}.backoff: {text:?} is not a duration"))?,
        ),
    };
    Ok(())
}

/// `n` as an i32, or the nearest one (out of every range the vocabulary allows).
fn saturated(n: i64) -> i32 {
    i32::try_from(n).unwrap_or(if n < 0 { i32::MIN } else { i32::MAX })
}

/// The vocabulary's refusal of the rule at `at`, in the HTTPRoute's fields and words (what
/// its status has always said): the assembly step checks the vocabulary's retries and
/// cookie, which the HTTPRoute calls `retry` and `sessionPersistence`. `e.at` is under the
/// empty root.
fn refusal(at: &str, rule: &HttpRouteRules, e: &SpecError) -> String {
    let retry = rule.retry.as_ref();
    let code = |index: &str| {
        let index: usize = index.strip_suffix(']')?.parse().ok()?;
        retry?.codes.as_ref()?.get(index).copied()
    };
    match e.at.as_str() {
        "retries.attempts" => match retry.and_then(|r| r.attempts).unwrap_or_default() {
            n if n < i64::from(*RETRY_ATTEMPTS.start()) => {
                format!("{at}.retry.attempts: {n} is negative")
            }
            n => format!(
                "{at}.retry.attempts: {n} is more than the {} supported",
                RETRY_ATTEMPTS.end()
            ),
        },
        "retries.backoff" => format!("{at}.retry.backoff: {}", e.message),
        "loadBalancer.affinity.cookie.name" => format!(
            "{at}.sessionPersistence.cookie.name: {:?} is not a cookie name (letters, digits \
             and !#$%&'*+.^_`|~-)",
            session_name(rule)
        ),
        other => match other.strip_prefix("retries.statusCodes[").and_then(code) {
            Some(code) => format!(
                "{at}.retry.codes: {code} is not within {}..{}",
                RETRY_STATUS_CODES.start(),
                RETRY_STATUS_CODES.end()
            ),
            None => format!("{at}: {e}"),
        },
    }
}

/// The name of the cookie of the rule's session.
fn session_name(rule: &HttpRouteRules) -> &str {
    rule.session_persistence
        .as_ref()
        .and_then(|s| s.cookie.as_ref())
        .and_then(|c| c.name.as_deref())
        .unwrap_or(SESSION_COOKIE)
}

/// A rule's `sessionPersistence` as the vocabulary's cookie affinity: Envoy sets a cookie
/// naming the Pod on the first answer and hashes it onto the same Pod after that, while
/// that Pod is ready. What that cannot keep as the route says is refused, naming the
/// field: header sessions (the Gateway issues the token, which hashing cannot) and an
/// absolute timeout on a session cookie (Envoy keeps no session state to time out).
fn session_persistence(
    session: &HttpRouteRulesSessionPersistence,
    at: &str,
) -> Result<LoadBalancer, String> {
    if session.r#type == Some(SessionType::Header) {
        return Err(format!(
            "{at}.type: Header is not supported, only Cookie (a TrafficRoute's \
             loadBalancer.affinity.header keeps requests with the same header value together)"
        ));
    }
    let cookie = session.cookie.as_ref();
    let permanent = cookie.and_then(|c| c.lifetime_type.as_ref()) == Some(&LifetimeType::Permanent);
    let ttl = match (&session.absolute_timeout, permanent) {
        (Some(text), true) => Some(
            gateway_duration_ms(text)
                .filter(|ms| *ms > 0)
                .and_then(vocabulary_duration)
                .ok_or_else(|| format!("{at}.absoluteTimeout: {text:?} is not a duration"))?,
        ),
        (None, true) => {
            return Err(format!(
                "{at}.absoluteTimeout: a Permanent cookie needs its lifetime"
            ));
        }
        (Some(_), false) => {
            return Err(format!(
                "{at}.absoluteTimeout: only with cookie.lifetimeType Permanent (it \
                 is then the cookie's Max-Age); a session cookie lives as long as the browser \
                 keeps it"
            ));
        }
        (None, false) => None,
    };
    // The assembly step checks that it can be a cookie's name.
    let name = cookie
        .and_then(|c| c.name.as_deref())
        .unwrap_or(SESSION_COOKIE);
    // The spec's default: every path of the host, as a session spans the application.
    let path = cookie.and_then(|c| c.path.as_deref()).unwrap_or("/");
    Ok(LoadBalancer {
        policy: Some("ringHash".to_owned()),
        affinity: Some(Affinity {
            cookie: Some(AffinityCookie {
                name: name.to_owned(),
                ttl,
                path: Some(path.to_owned()),
            }),
            ..Affinity::default()
        }),
    })
}

/// A CORS filter in the vocabulary; None when it allows no origin (then no answer carries
/// CORS headers, as without the filter). The Gateway API's default maxAge is 5 seconds.
fn cors(c: &HttpRouteRulesFiltersCors) -> Option<Cors> {
    let allow_origins = c.allow_origins.clone().unwrap_or_default();
    if allow_origins.is_empty() {
        return None;
    }
    Some(Cors {
        allow_origins,
        allow_methods: c.allow_methods.clone().unwrap_or_default(),
        allow_headers: c.allow_headers.clone().unwrap_or_default(),
        expose_headers: c.expose_headers.clone().unwrap_or_default(),
        max_age: Some(format!("{}s", c.max_age.unwrap_or(5).max(0))),
        allow_credentials: c.allow_credentials,
    })
}

/// A RequestRedirect in the vocabulary: the Gateway API's default status is 302, as ours.
fn redirect(r: &HttpRouteRulesFiltersRequestRedirect) -> Redirect {
    let (path, prefix) = match &r.path {
        Some(p) => match p.r#type {
            RedirectPathType::ReplaceFullPath => (p.replace_full_path.clone(), None),
            RedirectPathType::ReplacePrefixMatch => (None, p.replace_prefix_match.clone()),
        },
        None => (None, None),
    };
    Redirect {
        scheme: r.scheme.as_ref().map(|s| match s {
            RedirectScheme::Http => "http".to_owned(),
            RedirectScheme::Https => "https".to_owned(),
        }),
        hostname: r.hostname.clone(),
        port: r.port,
        path,
        prefix,
        status_code: r.status_code.and_then(|c| i32::try_from(c).ok()),
    }
}

/// A header modifier in the vocabulary. kopium makes one type per place the Gateway API
/// uses one (request, response), with the same fields.
fn request_edits(filter: &HttpRouteRulesFilters) -> HeaderEdits {
    header_edits!(&filter.request_header_modifier)
}

fn response_edits(filter: &HttpRouteRulesFilters) -> HeaderEdits {
    header_edits!(&filter.response_header_modifier)
}

/// One match in the vocabulary, and how specific it is.
fn lower_match(m: &HttpRouteRulesMatches, at: &str) -> Result<(RuleMatch, Specificity), String> {
    let path_type = m
        .path
        .as_ref()
        .and_then(|p| p.r#type.clone())
        .unwrap_or(PathType::PathPrefix);
    let value = m
        .path
        .as_ref()
        .and_then(|p| p.value.clone())
        .unwrap_or_else(|| "/".to_owned());
    let mut out = RuleMatch::default();
    // Exact before regular expressions before prefixes; the longer path first.
    let rank = match path_type {
        PathType::Exact => {
            out.path_exact = Some(value.clone());
            2
        }
        PathType::RegularExpression => {
            out.path_regex = Some(value.clone());
            1
        }
        PathType::PathPrefix => {
            out.path_segment_prefix = Some(value.clone());
            0
        }
    };
    out.headers = (m.headers.iter().flatten())
        .map(|h| header_match!(h, HeaderType))
        .collect();
    // The method's name, as the API server serializes it (GET, POST...).
    out.method = m
        .method
        .as_ref()
        .and_then(|m| serde_json::to_value(m).ok())
        .and_then(|v| v.as_str().map(str::to_owned));
    if m.method.is_some() && out.method.is_none() {
        return Err(format!("{at}.method: not a method"));
    }
    for q in m.query_params.iter().flatten() {
        let mut query = QueryParamMatch {
            name: q.name.clone(),
            ..QueryParamMatch::default()
        };
        match q.r#type.as_ref().unwrap_or(&QueryType::Exact) {
            QueryType::Exact => query.exact = Some(q.value.clone()),
            QueryType::RegularExpression => query.regex = Some(q.value.clone()),
        }
        out.query_params.push(query);
    }
    let specificity = Specificity::Http(
        rank,
        value.len(),
        out.method.is_some(),
        out.headers.len(),
        out.query_params.len(),
    );
    Ok((out, specificity))
}
