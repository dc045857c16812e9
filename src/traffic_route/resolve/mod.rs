//! Step 1 of a rollout, "Resolve" (see DESIGN.md), for a TrafficRoute: its spec resolved
//! through the Services of its namespace by the core (`switchyard_core::route::resolve`,
//! which ends in the assembly step every front-end ends in: the spec's checks, each rule's
//! clusters, the route's version), and the route's two ProxyConfigs built from the result
//! ([`proxy_config_spec`]). What is the TrafficRoute's alone (its rollout settings) is
//! checked here.
//!
//! Pure and deterministic (I6): the same spec and the same Services give the same
//! [`ResolvedRoute`] and version, whatever the order of the Services. Nothing here writes
//! anything (I7).

use k8s_openapi::api::core::v1::Service;

use crate::api::ProxyConfig;
use crate::api::proxy_config::ProxyConfigRole;
use crate::api::traffic_route::TrafficRoute;
use crate::k8s::services::ServiceIndex;
use crate::rollout::{RouteError, live_name, proxy_config_spec};
use switchyard_core::route::check::{self, SpecError};
pub use switchyard_core::route::{ResolveError, ResolvedRoute};

/// Resolves a TrafficRoute's spec against `services`, the Services of its namespace (any
/// Service of another namespace is ignored). The spec is checked in full before any
/// Service is looked up; within each pass, the first problem in spec order is reported.
pub fn resolve_route(
    route: &TrafficRoute,
    services: &[&Service],
) -> Result<ResolvedRoute, RouteError> {
    if let Some(rollout) = &route.spec.rollout {
        let invalid = |e: SpecError| RouteError::from(ResolveError::from(e));
        check::duration_field("spec.rollout.drainPeriod", rollout.drain_period.as_deref())
            .map_err(invalid)?;
        check::duration_field(
            "spec.rollout.probeDeadline",
            rollout.probe_deadline.as_deref(),
        )
        .map_err(invalid)?;
    }
    let services = ServiceIndex::new(route.metadata.namespace.as_deref(), services);
    Ok(switchyard_core::route::resolve(
        "spec",
        &route.spec.route,
        &services,
    )?)
}

/// The live ProxyConfig a route has once its current generation is rolled out (name,
/// namespace and spec; the rollout adds its owner and labels when it writes it).
pub fn live_proxy_config(route: &TrafficRoute, resolved: &ResolvedRoute) -> ProxyConfig {
    let name = route.metadata.name.as_deref().unwrap_or_default();
    let spec = proxy_config_spec(
        name,
        route.metadata.generation.unwrap_or(1),
        ProxyConfigRole::Live,
        resolved,
        &[],
        route.metadata.creation_timestamp.as_ref(),
    );
    let mut pc = ProxyConfig::new(&live_name(name), spec);
    pc.metadata.namespace = route.metadata.namespace.clone();
    pc
}

#[cfg(test)]
mod tests;
