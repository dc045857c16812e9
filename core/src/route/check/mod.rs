//! Checks of what a front-end hands the route vocabulary, once for every front-end.
//!
//! - this file: the spec's own (a [`RouteSpec`]: a TrafficRoute's, a standalone file's):
//!   hosts, TLS, rule names, a rule's backends or its redirect, each backend's reference;
//! - [`rule`] and [`options`]: the rule and option checks every front-end's rules go
//!   through in the assembly step ([`super::assemble::check`]): a rule's redirect and match,
//!   and its options, as much of them as the front-end's [`Checks`] say.
//!
//! The CRD's schema and CEL rules say the same for Kubernetes; they are checked again here
//! because a route can come without them (an older CRD, a disabled validation, a
//! standalone file), and a bad route must stay out of the configuration and say why while
//! every other route serves (I8).
//!
//! Messages start with the path of the field (`rules[2].timeout`), under the root the
//! front-end gives (`spec` for a TrafficRoute, nothing for a file).

mod options;
mod rule;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;

use super::spec::{Backend, RouteRule, RouteSpec};

pub use options::{RETRY_ATTEMPTS, RETRY_STATUS_CODES, duration_field};
pub use rule::{Checks, Draft, rule};

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

/// Checks the spec in full, in spec order (the first problem is reported): its hosts,
/// TLS and rule names, then each rule, the spec's shape of it (backends, or a redirect
/// without them) and then `rule` (the rule and option checks of the assembly step, given
/// the rule and its path). Returns the hosts, lower-cased, and each rule's name (given, or
/// `rule-<index>`) with what `rule` gave.
pub fn spec<T>(
    root: &str,
    spec: &RouteSpec,
    mut rule: impl FnMut(&str, &RouteRule) -> Result<T, SpecError>,
) -> Result<Checked<T>, SpecError> {
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
    let names = rule_names(&at, &spec.rules)?;
    let mut rules = Vec::with_capacity(spec.rules.len());
    for ((index, r), name) in spec.rules.iter().enumerate().zip(names) {
        let at = format!("{at}[{index}]");
        check_shape(&at, r)?;
        rules.push((name, rule(&at, r)?));
    }
    Ok(Checked { hosts, rules })
}

/// What [`spec`] derives from a valid spec.
#[derive(Debug)]
pub struct Checked<T> {
    pub hosts: Vec<String>,
    /// Each rule's name, and what the rule check gave.
    pub rules: Vec<(String, T)>,
}

/// The name of a rule that gives none: `rule-<index>` (so the spec reserves such names).
pub fn rule_name(index: usize) -> String {
    format!("rule-{index}")
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
            None => rule_name(index),
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

/// The spec's shape of a rule: backends, or a redirect (redirect or redirectHttps) without
/// them; each backend's reference, and not every weight zero. (A front-end that lowers
/// another API has its own shape: the Gateway API's rule may keep no usable backend.)
fn check_shape(at: &str, rule: &RouteRule) -> Result<(), SpecError> {
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
    // A rule with a redirect has no backends (above), so checking these before the
    // redirect (in the rule check) reports what checking them after it did.
    for (index, backend) in rule.backends.iter().enumerate() {
        check_backend(&format!("{at}.backends[{index}]"), backend)?;
    }
    if !rule.backends.is_empty() && rule.backends.iter().all(|b| b.weight == Some(0)) {
        return Err(error(format!("{at}.backends"), "the weights are all zero"));
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
