//! Every reason Envoy would refuse a virtual host, or routes on trial, as the model has
//! them: checked before anything is encoded, so that a bad route is left out and reported
//! (I8) instead of taking the whole route configuration down with it.

use super::normalized_hosts;
use crate::model;
use crate::translate::{Inputs, http_filters, proto, secret, validate};

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
                if let Err(e) = secret::validate(secret) {
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
    let backend_edits = match &route.action {
        model::RouteAction::Forward(f) => f.backends.iter().map(|b| &b.request_headers).collect(),
        _ => Vec::new(),
    };
    let edits = [
        (&route.request_headers, "request"),
        (&route.response_headers, "response"),
    ];
    let backend_edits = backend_edits.into_iter().map(|e| (e, "backend request"));
    for (edits, direction) in edits.into_iter().chain(backend_edits) {
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
            let total: u64 = (forward
                .backends
                .iter()
                .map(|b| u64::from(b.weight))
                .sum::<u64>())
                + u64::from(forward.unavailable_weight);
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
        for mirror in &forward.mirrors {
            if let Some(e) = inputs.cluster_error(&mirror.cluster) {
                errors.push(format!("mirror: {e}"));
            }
            if let Some(share) = mirror.per_million.filter(|&p| p > 1_000_000) {
                errors.push(format!("mirror share {share} is more than a million"));
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
