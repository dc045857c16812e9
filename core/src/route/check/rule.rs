//! The checks of a rule's redirect and of its match.

use super::super::spec::{REDIRECT_CODES, Redirect, RuleMatch};
use super::{SpecError, error};

pub(super) fn check_redirect(
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

pub(super) fn check_match(at: &str, m: &RuleMatch) -> Result<(), SpecError> {
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
