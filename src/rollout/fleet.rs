//! The fleet a rollout must hear from: the ready endpoints of the Envoy Service's
//! EndpointSlices: the addresses the prober asks.

use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::prober::FleetResult;

/// The ready endpoints of the fleet's EndpointSlices, sorted and deduplicated: every Envoy
/// a rollout must hear from.
pub fn fleet_addresses(slices: &[Arc<EndpointSlice>]) -> Vec<String> {
    let mut out: Vec<String> = slices
        .iter()
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.iter().cloned())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Every Envoy asked passed, or there is none to ask.
pub fn passed(result: &FleetResult, envoys: &[String]) -> bool {
    result.all_ready() || envoys.is_empty()
}
