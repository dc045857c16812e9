//! A unit's two ProxyConfigs, as the engine writes them, and why a unit cannot be served.
//!
//! Pure and deterministic (I6): the same resolved route gives the same specs and version
//! strings on every replica.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::proxy_config::{ProxyConfigRole, ProxyConfigSpec, ResolvedCluster};
use crate::hash;
use switchyard_core::route::assemble::{mirror_only_clusters, sorted_unique};
use switchyard_core::route::{ResolveError, ResolvedRoute};

/// Why a unit (a TrafficRoute, a Gateway's port or hostname) is not served. [`RouteError::reason`] is the Kubernetes condition
/// reason; the Display form is the condition message.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum RouteError {
    /// Its spec, or a Service it names, does not resolve.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// Another route already serves one of the hosts; the route that was there first keeps it.
    #[error("host {host:?} is already served by route {route}")]
    HostConflict { host: String, route: String },
    /// Envoy would refuse what the spec asks for (the translator says why).
    #[error("cannot be served: {message}")]
    Rejected { message: String },
    /// The API server refuses the route's ProxyConfig as invalid (it would refuse it again).
    #[error("the API server refuses its ProxyConfig {name}: {message}")]
    WriteRefused { name: String, message: String },
}

impl RouteError {
    /// Short CamelCase reason, for the `Ready`/`Accepted` conditions.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Resolve(e) => e.reason(),
            Self::HostConflict { .. } => "HostConflict",
            Self::Rejected { .. } => "Rejected",
            Self::WriteRefused { .. } => "WriteRefused",
        }
    }
}

/// The spec of one of a route's two ProxyConfigs.
///
/// - `Live`: the routes (`virtual_host`) and the clusters they reference; `version` is
///   `resolved.version`; `created` is the route's creation time. `live_clusters` is not
///   used.
/// - `Probe`: the routes on trial, and the clusters that must be on every Envoy: those of
///   `resolved` and `live_clusters` (the clusters live now, so that nothing live is
///   dropped), sorted and deduplicated. The live ones and those the routes only mirror to
///   are `kept_clusters`: the probe proves only that they exist, and ready endpoints for
///   the others only. `version` is a
///   digest of both lists and the trial.
pub fn proxy_config_spec(
    route_name: &str,
    generation: i64,
    role: ProxyConfigRole,
    resolved: &ResolvedRoute,
    live_clusters: &[ResolvedCluster],
    created: Option<&Time>,
) -> ProxyConfigSpec {
    let (clusters, kept_clusters, version) = match role {
        ProxyConfigRole::Live => (
            sorted_unique(resolved.clusters.iter().cloned()),
            Vec::new(),
            resolved.version.clone(),
        ),
        ProxyConfigRole::Probe => {
            let clusters = sorted_unique(resolved.clusters.iter().chain(live_clusters).cloned());
            let mirrored = mirror_only_clusters(&resolved.virtual_host);
            let kept = sorted_unique(live_clusters.iter().chain(&mirrored).cloned());
            let version = hash::digest_of(&(&clusters, &kept, &resolved.virtual_host));
            (clusters, kept, version)
        }
    };
    ProxyConfigSpec {
        route_created: match role {
            ProxyConfigRole::Live => created.cloned(),
            ProxyConfigRole::Probe => None,
        },
        role,
        route: route_name.to_owned(),
        generation,
        version,
        virtual_host: Some(resolved.virtual_host.clone()),
        clusters,
        kept_clusters,
        listener: match role {
            ProxyConfigRole::Live => resolved.listener.clone(),
            ProxyConfigRole::Probe => None,
        },
        drain_period: None,
        members: Vec::new(),
    }
}

/// The name of a route's live ProxyConfig.
pub fn live_name(route: &str) -> String {
    format!("{route}-live")
}

/// The name of a route's probe ProxyConfig.
pub fn probe_name(route: &str) -> String {
    format!("{route}-probe")
}
