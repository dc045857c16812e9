//! The rule checks of the assembly step: a rule's redirect and match, then its options
//! ([`super::options`]), for every front-end, as much as its [`Checks`] say.

use super::super::spec::{REDIRECT_CODES, Redirect, RouteRule, RuleMatch, RuleOptions};
use super::{SpecError, error, field, options};

/// How much of the rule and option checks a front-end's rules go through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checks {
    /// All of them: rules written in the vocabulary's own spec (a TrafficRoute's, a
    /// standalone file's), which may come without the CRD's schema.
    Spec,
    /// A rule a front-end lowered from another API whose own schema the API server has
    /// enforced (the Gateway API's HTTPRoute): only where the vocabulary admits less than
    /// such a schema, its retries (attempts, per-try timeout, backoff, conditions, each
    /// code; not how many codes) and its load balancing (policy, affinity, a cookie's
    /// name, lifetime and path). What that schema bounds itself (paths, matches,
    /// redirects, CORS) is not checked again, so the front-end keeps accepting what its
    /// schema admits.
    Lowered,
}

/// A rule's parts in the vocabulary's words, as a front-end lowered them, before its
/// backends are clusters (they carry no words of the rule's: the front-end's lookup
/// gives them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Draft {
    pub matches: Option<RuleMatch>,
    pub redirect_https: bool,
    pub redirect: Option<Redirect>,
    pub options: RuleOptions,
}

impl Draft {
    /// The parts of a rule of the vocabulary's spec.
    pub fn of(rule: &RouteRule) -> Self {
        Self {
            matches: rule.matches.clone(),
            redirect_https: rule.redirect_https.unwrap_or(false),
            redirect: rule.redirect.clone(),
            options: rule.options.clone(),
        }
    }
}

/// The rule and option checks of a rule at `at`: its redirect, its match, its options.
pub fn rule(at: &str, checks: Checks, draft: &Draft) -> Result<(), SpecError> {
    if checks == Checks::Spec {
        if let Some(redirect) = &draft.redirect {
            check_redirect(&field(at, "redirect"), redirect, draft.matches.as_ref())?;
        }
        if let Some(m) = &draft.matches {
            check_match(&field(at, "match"), m)?;
        }
    }
    options::check(at, checks, &draft.options)
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
