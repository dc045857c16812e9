//! Resolution: a route's spec, checked, and each backend mapped through a
//! [`ServiceLookup`] to the cluster of a concrete service port. Pure and deterministic
//! (I6): the same spec and the same services give the same [`ResolvedRoute`] and version.
//!
//! The spec is checked in full before any service is looked up, so a spec that can never
//! work says so even while a service is missing.

use super::check::{self, SpecError};
use super::resolved::{
    ResolvedBackend, ResolvedCluster, ResolvedRoute, ResolvedRule, ResolvedTls, ResolvedVirtualHost,
};
use super::spec::{Backend, LoadBalancer, RouteRule, RouteSpec};
use crate::hash;

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
/// the services of its namespace.
pub fn resolve(
    root: &str,
    spec: &RouteSpec,
    services: &dyn ServiceLookup,
) -> Result<ResolvedRoute, ResolveError> {
    let checked = check::check(root, spec)?;
    let tls = spec.tls.as_ref().map(|t| ResolvedTls {
        namespace: None,
        secret_name: t.secret_name.clone(),
        redirect_http: t.redirect_http.unwrap_or(true),
    });
    let rules = spec
        .rules
        .iter()
        .zip(checked.rule_names)
        .map(|(rule, name)| resolve_rule(rule, name, services))
        .collect::<Result<Vec<_>, _>>()?;
    let virtual_host = ResolvedVirtualHost {
        hosts: checked.hosts,
        tls,
        rules,
    };
    let clusters = referenced_clusters(&virtual_host);
    let version = hash::digest_of(&virtual_host);
    Ok(ResolvedRoute {
        virtual_host,
        clusters,
        version,
        listener: None,
    })
}

fn resolve_rule(
    rule: &RouteRule,
    name: String,
    services: &dyn ServiceLookup,
) -> Result<ResolvedRule, ResolveError> {
    let lb_policy = rule.options.load_balancer.as_ref().and_then(cluster_policy);
    let backends = rule
        .backends
        .iter()
        .map(|b| {
            Ok(ResolvedBackend {
                cluster: ResolvedCluster {
                    lb_policy: lb_policy.clone(),
                    circuit_breaker: rule.options.circuit_breaker.clone(),
                    outlier_detection: rule.options.outlier_detection.clone(),
                    health_check: rule.options.health_check.clone(),
                    ..services.cluster(b)?
                },
                weight: b.weight.unwrap_or(1),
            })
        })
        .collect::<Result<Vec<_>, ResolveError>>()?;
    Ok(ResolvedRule {
        name,
        matches: rule.matches.clone(),
        backends,
        redirect_https: rule.redirect_https.unwrap_or(false),
        redirect: rule.redirect.clone(),
        options: rule.options.clone(),
    })
}

/// The policy of the clusters of a rule with `lb`: None for round robin (the default
/// cluster); affinity without a policy is ring hash.
pub fn cluster_policy(lb: &LoadBalancer) -> Option<String> {
    match lb.policy.as_deref() {
        None if lb.affinity.is_some() => Some("ringHash".to_owned()),
        None | Some("roundRobin") => None,
        Some(policy) => Some(policy.to_owned()),
    }
}

/// Every cluster the rules of `virtual_host` send to, sorted and deduplicated.
pub fn referenced_clusters(virtual_host: &ResolvedVirtualHost) -> Vec<ResolvedCluster> {
    sorted_unique(
        virtual_host
            .rules
            .iter()
            .flat_map(|r| r.backends.iter().map(|b| b.cluster.clone())),
    )
}

pub fn sorted_unique(clusters: impl IntoIterator<Item = ResolvedCluster>) -> Vec<ResolvedCluster> {
    let mut clusters: Vec<_> = clusters.into_iter().collect();
    clusters.sort();
    clusters.dedup();
    clusters
}
