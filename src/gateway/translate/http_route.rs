//! HTTPRoutes: each parentRef attached to the listeners of a Gateway of Switchyard's that
//! admit it, and each rule lowered into the core's vocabulary, one rule per match, through
//! the core's assembly step (`switchyard_core::route::assemble`): its checks
//! ([`Checks::Lowered`]: where the vocabulary admits less than the Gateway API's schema),
//! worded in the HTTPRoute's own fields ([`refusal`]), and its clusters.

use super::backend_ref::{Backends, UrlRewrite, backends, mirrors};
use super::duration::{gateway_duration_ms, vocabulary_duration};
use super::gateway::{HTTP_ROUTE, Listening, Owner, admits_namespace};
use super::hostname;
use super::{Cond, GROUP, GatewayRule, Inputs, ParentOutcome, RouteOutcome};
use crate::gateway::api::httproutes::{
    HttpRoute, HttpRouteParentRefs, HttpRouteRules, HttpRouteRulesFilters,
    HttpRouteRulesFiltersCors, HttpRouteRulesFiltersRequestRedirect,
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
    Affinity, AffinityCookie, Cors, HeaderEdits, HeaderMatch, LoadBalancer, QueryParamMatch,
    Redirect, Retries, RuleMatch, RuleOptions,
};
use switchyard_core::route::{Checks, Draft, SpecError, assemble, check::rule_name as unnamed};

/// A route's rules as attached to one listener of a Gateway, for the hostnames the two
/// share.
#[derive(Clone, Debug)]
pub struct Attached {
    pub gateway: (String, String),
    pub listener: usize,
    pub hostnames: Vec<hostname::Served>,
    pub rules: Vec<Ranked>,
}

/// How specific a match is, most significant first: the kind of path match (exact 2,
/// regular expression 1, prefix 0), the path's length, whether it matches the method, and
/// the numbers of header and query parameter matches.
pub type Specificity = (u8, usize, bool, usize, usize);

/// A lowered rule with its place in the Gateway API's order of precedence: the more
/// specific match first (`specificity`, compared in reverse), then the older route, then
/// the order of rules and matches (`order`).
#[derive(Clone, Debug)]
pub struct Ranked {
    pub specificity: Specificity,
    pub order: (usize, usize, usize),
    pub rule: GatewayRule,
}

/// Attaches `route` (the `seniority`-th oldest) to the Gateways it names, counting it on
/// their listeners; gives its status and its rules where it attached.
pub fn attach(
    inputs: &Inputs<'_>,
    route: &HttpRoute,
    seniority: usize,
    gateways: &mut [Listening<'_>],
) -> (RouteOutcome, Vec<Attached>) {
    let namespace = route.metadata.namespace.clone().unwrap_or_default();
    let name = route.metadata.name.clone().unwrap_or_default();
    let lowered = lower_rules(inputs, route, seniority);
    let route_hostnames = route.spec.hostnames.clone().unwrap_or_default();
    let mut parents = Vec::new();
    let mut attached = Vec::new();
    for parent in route.spec.parent_refs.iter().flatten() {
        let Some((index, owner)) = parent_of(gateways, parent, &namespace) else {
            // Not a parent of Switchyard's: its own controller writes this parent's status.
            continue;
        };
        let gateway = &mut gateways[index];
        let gateway_key = (gateway.namespace.to_owned(), gateway.name.to_owned());
        let accepted = match (&lowered, owner) {
            (Err(message), _) => Cond::no("Accepted", "UnsupportedValue", message.clone()),
            (Ok(_), None) => Cond::no(
                "Accepted",
                "NoMatchingParent",
                format!(
                    "ListenerSet {} is not attached to its Gateway",
                    parent_name(parent, &namespace)
                ),
            ),
            (Ok(l), Some(owner)) => {
                let found = matching_listeners(
                    inputs,
                    gateway,
                    owner,
                    parent,
                    &namespace,
                    &route_hostnames,
                );
                match found {
                    Err(cond) => cond,
                    Ok(listeners) => {
                        for (index, hostnames) in listeners {
                            gateway.listeners[index].attached_routes += 1;
                            attached.push(Attached {
                                gateway: gateway_key.clone(),
                                listener: index,
                                hostnames,
                                rules: l.rules.clone(),
                            });
                        }
                        Cond::yes("Accepted", "Accepted", "attached")
                    }
                }
            }
        };
        let resolved = match &lowered {
            Ok(l) => l.resolved_refs.clone(),
            Err(_) => Cond::no("ResolvedRefs", "UnsupportedValue", "not resolved"),
        };
        let listener_set = is_listener_set(parent).then(|| {
            (
                parent
                    .namespace
                    .clone()
                    .unwrap_or_else(|| namespace.clone()),
                parent.name.clone(),
            )
        });
        parents.push(ParentOutcome {
            gateway_namespace: gateway_key.0,
            gateway: gateway_key.1,
            listener_set,
            section_name: parent.section_name.clone(),
            port: parent.port,
            conditions: vec![accepted, resolved],
        });
    }
    let outcome = RouteOutcome {
        namespace,
        name,
        generation: route.metadata.generation.unwrap_or(0),
        parents,
    };
    (outcome, attached)
}

fn is_listener_set(parent: &HttpRouteParentRefs) -> bool {
    parent.group.as_deref().unwrap_or(GROUP) == GROUP
        && parent.kind.as_deref() == Some("ListenerSet")
}

/// `namespace/name` of the parentRef's object.
fn parent_name(parent: &HttpRouteParentRefs, route_namespace: &str) -> String {
    let namespace = parent.namespace.as_deref().unwrap_or(route_namespace);
    format!("{namespace}/{}", parent.name)
}

/// The Gateway of Switchyard's a parentRef names, itself or through one of its
/// ListenerSets: its index, and whose listeners the route may attach to (None: a
/// ListenerSet that names it but is not attached).
fn parent_of(
    gateways: &[Listening<'_>],
    parent: &HttpRouteParentRefs,
    route_namespace: &str,
) -> Option<(usize, Option<Owner>)> {
    let namespace = parent.namespace.as_deref().unwrap_or(route_namespace);
    let name = parent.name.as_str();
    if parent.group.as_deref().unwrap_or(GROUP) != GROUP {
        return None;
    }
    match parent.kind.as_deref().unwrap_or("Gateway") {
        "Gateway" => (gateways.iter())
            .position(|g| g.namespace == namespace && g.name == name)
            .map(|i| (i, Some(Owner::Gateway))),
        "ListenerSet" => gateways.iter().enumerate().find_map(|(i, g)| {
            let attached = (g.sets.iter()).position(|s| s.namespace == namespace && s.name == name);
            match attached {
                Some(set) => Some((i, Some(Owner::ListenerSet(set)))),
                None => (g.refused_sets.iter())
                    .any(|s| s.namespace == namespace && s.name == name)
                    .then_some((i, None)),
            }
        }),
        _ => None,
    }
}

/// The listeners of `owner`'s the parentRef attaches to, each with the hostnames it
/// shares with the route; or the Accepted condition saying why none.
fn matching_listeners(
    inputs: &Inputs<'_>,
    gateway: &Listening<'_>,
    owner: Owner,
    parent: &HttpRouteParentRefs,
    route_namespace: &str,
    route_hostnames: &[String],
) -> Result<Vec<(usize, Vec<hostname::Served>)>, Cond> {
    if !gateway.accepted() {
        return Err(Cond::no(
            "Accepted",
            "NoMatchingParent",
            format!(
                "Gateway {}/{} is not accepted",
                gateway.namespace, gateway.name
            ),
        ));
    }
    let named: Vec<usize> = gateway
        .listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| l.owner == owner)
        .filter(|(_, l)| {
            parent
                .section_name
                .as_ref()
                .is_none_or(|s| *s == l.spec.name)
        })
        .filter(|(_, l)| parent.port.is_none_or(|p| p == l.spec.port))
        .map(|(i, _)| i)
        .collect();
    if named.is_empty() {
        return Err(Cond::no(
            "Accepted",
            "NoMatchingParent",
            format!(
                "no listener of the {} has the sectionName and port the parentRef gives",
                if owner == Owner::Gateway {
                    "Gateway"
                } else {
                    "ListenerSet"
                }
            ),
        ));
    }
    let allowed: Vec<usize> = named
        .into_iter()
        .filter(|&i| {
            let l = &gateway.listeners[i];
            l.attachable
                && l.supported_kinds.iter().any(|k| k == HTTP_ROUTE)
                && admits_namespace(inputs, l, route_namespace)
        })
        .collect();
    if allowed.is_empty() {
        return Err(Cond::no(
            "Accepted",
            "NotAllowedByListeners",
            format!("no listener admits HTTPRoutes from namespace {route_namespace}"),
        ));
    }
    let with_hosts: Vec<(usize, Vec<hostname::Served>)> = allowed
        .into_iter()
        .map(|i| {
            let listener = gateway.listeners[i].spec.hostname.as_deref();
            (i, hostname::intersect(listener, route_hostnames))
        })
        .filter(|(_, hosts)| !hosts.is_empty())
        .collect();
    if with_hosts.is_empty() {
        return Err(Cond::no(
            "Accepted",
            "NoMatchingListenerHostname",
            "no hostname of the route matches a hostname of the listeners",
        ));
    }
    Ok(with_hosts)
}

/// A route's rules, lowered, and whether all its backendRefs resolved.
struct Lowered {
    rules: Vec<Ranked>,
    resolved_refs: Cond,
}

/// Every rule of the route in the vocabulary, or what the route uses that Switchyard does
/// not support yet (the route is then not accepted at all, rather than served in part).
fn lower_rules(
    inputs: &Inputs<'_>,
    route: &HttpRoute,
    seniority: usize,
) -> Result<Lowered, String> {
    let namespace = route.metadata.namespace.as_deref().unwrap_or_default();
    let name = route.metadata.name.as_deref().unwrap_or_default();
    if route.spec.use_default_gateways == Some(HttpRouteUseDefaultGateways::All) {
        return Err(
            "spec.useDefaultGateways: All is not supported (Switchyard has no \
                    default Gateways): name the Gateway in parentRefs"
                .to_owned(),
        );
    }
    let mut rules = Vec::new();
    let mut first_problem: Option<Cond> = None;
    for (ri, rule) in route.spec.rules.iter().flatten().enumerate() {
        let at = format!("spec.rules[{ri}]");
        let (
            Lowering {
                mut options,
                redirect,
            },
            problem,
        ) = lower_filters(rule, &at);
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
        let Backends {
            usable: backends,
            unavailable: unavailable_weight,
            rewrite,
        } = backends(inputs, namespace, rule, &at, &mut first_problem)?;
        if let Some(rewrite) = rewrite {
            take_rewrite(&mut options, rewrite, &at)?;
        }
        let mirrors = mirrors(inputs, namespace, rule, &at, &mut first_problem)?;
        // A redirect answers by itself: it has no backends to miss.
        let unavailable_weight = if redirect.is_some() {
            0
        } else {
            unavailable_weight
        };
        let rule_name = rule.name.clone().unwrap_or_else(|| unnamed(ri));
        let default_match = [HttpRouteRulesMatches::default()];
        let matches = match rule.matches.as_deref() {
            None | Some([]) => &default_match[..],
            Some(m) => m,
        };
        for (mi, m) in matches.iter().enumerate() {
            let (matches, specificity) = lower_match(m, &format!("{at}.matches[{mi}]"))?;
            // The rule this match makes, through the same checks (they passed above).
            let checked = assemble::check("", Checks::Lowered, draft(&options, Some(matches)))
                .map_err(|e| refusal(&at, rule, &e))?;
            rules.push(Ranked {
                specificity,
                order: (seniority, ri, mi),
                rule: GatewayRule {
                    route: format!("{namespace}/{name}"),
                    rule: checked
                        .rule(
                            format!("{namespace}/{name}/{rule_name}/{mi}"),
                            backends.clone(),
                        )
                        .mirrored(mirrors.clone())
                        .unavailable(unavailable_weight),
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
                lowering.options.request_headers = Some(request_edits(filter));
            }
            FilterType::ResponseHeaderModifier => {
                lowering.options.response_headers = Some(response_edits(filter));
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
            FilterType::Cors => lowering.options.cors = filter.cors.as_ref().and_then(cors),
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
            lowering.options.retries = Some(Retries {
                attempts: 0,
                per_try_timeout: Some(timeout),
                ..Retries::default()
            });
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
        let retries = lowering
            .options
            .retries
            .get_or_insert_with(Retries::default);
        lower_retry(retry, &format!("{at}.retry"), retries)?;
    }
    if let Some(session) = &rule.session_persistence {
        lowering.options.load_balancer = Some(session_persistence(
            session,
            &format!("{at}.sessionPersistence"),
        )?);
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
    for h in m.headers.iter().flatten() {
        let mut header = HeaderMatch {
            name: h.name.clone(),
            ..HeaderMatch::default()
        };
        match h.r#type.as_ref().unwrap_or(&HeaderType::Exact) {
            HeaderType::Exact => header.exact = Some(h.value.clone()),
            HeaderType::RegularExpression => header.regex = Some(h.value.clone()),
        }
        out.headers.push(header);
    }
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
    let specificity = (
        rank,
        value.len(),
        out.method.is_some(),
        out.headers.len(),
        out.query_params.len(),
    );
    Ok((out, specificity))
}
