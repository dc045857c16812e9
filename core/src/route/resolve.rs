//! Resolution of the vocabulary's own spec (a TrafficRoute's, a standalone file's): the
//! spec checked, each backend mapped through a [`ServiceLookup`] to the cluster of a
//! concrete service port, and the route made by the assembly step ([`super::assemble`]),
//! as every front-end's is. Pure and deterministic (I6): the same spec and the same
//! services give the same [`ResolvedRoute`] and version.
//!
//! The spec is checked in full (its own checks and every rule's, [`check::spec`]) before
//! any service is looked up, so a spec that can never work says so even while a service
//! is missing.

use super::assemble;
use super::check::{self, Checks, Draft, SpecError};
use super::resolved::{ResolvedBackend, ResolvedCluster, ResolvedRoute, ResolvedTls};
use super::spec::{Backend, RouteRule, RouteSpec};

/// The services a route's backends name, in the route's namespace: Kubernetes Services,
/// or the services of standalone files.
pub trait ServiceLookup {
    /// The cluster of the port `backend` names, or why there is none.
    fn cluster(&self, backend: &Backend) -> Result<ResolvedCluster, ResolveError>;
}

/// Why a route could not be resolved. [`ResolveError::reason`] is a short CamelCase
/// reason (a Kubernetes condition's); the Display form says what to fix.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ResolveError {
    /// A backend names a service that does not exist in the route's namespace.
    #[error("Service {service:?} does not exist in the route's namespace")]
    ServiceNotFound { service: String },
    /// The service exists but has no such port. `port` is the number or the name asked for.
    #[error("Service {service:?} has no {}", port_label(port))]
    PortNotFound { service: String, port: String },
    /// The service or its port cannot carry HTTP through Envoy.
    #[error("Service {service:?} cannot be a backend: {message}")]
    UnsupportedBackend { service: String, message: String },
    /// Something the schema should have refused.
    #[error("invalid spec: {0}")]
    InvalidSpec(#[from] SpecError),
}

impl ResolveError {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ServiceNotFound { .. } => "ServiceNotFound",
            Self::PortNotFound { .. } => "PortNotFound",
            Self::UnsupportedBackend { .. } => "UnsupportedBackend",
            Self::InvalidSpec(_) => "InvalidSpec",
        }
    }
}

/// "port 8080" or "port named \"http\"". Port names always hold a letter, so an all-digit
/// `port` is a number.
fn port_label(port: &str) -> String {
    if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
        format!("port {port}")
    } else {
        format!("port named {port:?}")
    }
}

/// Resolves `spec` (found at `root` in its document: `spec` for a TrafficRoute) against
/// the services of its namespace, through the assembly step.
pub fn resolve(
    root: &str,
    spec: &RouteSpec,
    services: &dyn ServiceLookup,
) -> Result<ResolvedRoute, ResolveError> {
    let checked = check::spec(root, spec, |at, rule| {
        assemble::check(at, Checks::Spec, Draft::of(rule))
    })?;
    let tls = spec.tls.as_ref().map(|t| ResolvedTls {
        namespace: None,
        secret_name: t.secret_name.clone(),
        redirect_http: t.redirect_http.unwrap_or(true),
        listener_hostname: None,
    });
    let rules = spec
        .rules
        .iter()
        .zip(checked.rules)
        .map(|(rule, (name, checked))| Ok(checked.rule(name, backends(rule, services)?)))
        .collect::<Result<Vec<_>, ResolveError>>()?;
    Ok(assemble::assemble(checked.hosts, tls, rules, None))
}

/// The clusters of a rule's backends, with their weights (1 when not given).
fn backends(
    rule: &RouteRule,
    services: &dyn ServiceLookup,
) -> Result<Vec<ResolvedBackend>, ResolveError> {
    rule.backends
        .iter()
        .map(|b| {
            Ok(ResolvedBackend {
                cluster: services.cluster(b)?,
                weight: b.weight.unwrap_or(1),
                request_headers: None,
            })
        })
        .collect()
}
