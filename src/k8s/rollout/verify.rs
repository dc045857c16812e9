//! Asking the fleet within one pass, with the backoff between attempts.

use std::future::Future;
use std::time::{Duration, Instant};

use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::debug;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{Context, VERIFY_IN_PASS};
use crate::api::{ProxyConfig, TrafficRoute};
use crate::k8s::address_map::AddressMap;
use crate::prober::FleetResult;

impl Context {
    /// Ready endpoints of the Envoy Service, as addresses the prober can reach.
    pub(super) fn envoys(&self) -> Vec<String> {
        fleet_addresses(&self.fleet.state(), self.settings.address_map)
    }

    /// The ProxyConfig `namespace/name`: from the watch's store when it holds what the API
    /// server last answered for it, else from the API server (see [`super::known`]).
    pub(super) async fn proxy_config(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ProxyConfig>, kube::Error> {
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(pc) = self
            .known
            .stored_if_current(&key, self.proxy_configs.get(&key))
        {
            return Ok(pc);
        }
        let api: Api<ProxyConfig> = Api::namespaced(self.client.clone(), namespace);
        let pc = api.get_opt(name).await?;
        self.known.saw(key, pc.as_ref());
        Ok(pc)
    }

    pub(super) fn backoff(&self, key: &(String, String)) -> Duration {
        let mut attempts = self.attempts.lock().unwrap_or_else(|p| p.into_inner());
        let n = attempts.entry(key.clone()).or_insert(0);
        *n = (*n + 1).min(8);
        Duration::from_millis(20 << (*n - 1)).min(Duration::from_secs(2))
    }

    pub(super) fn progressed(&self, key: &(String, String)) {
        self.attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// A newer generation of the route arrived (or it is gone): this pass should end.
    pub(super) fn superseded(&self, route: &TrafficRoute) -> bool {
        self.routes
            .get(&ObjectRef::from_obj(route))
            .is_none_or(|r| r.metadata.generation != route.metadata.generation)
    }
}

/// The ready endpoints of the fleet's EndpointSlices, as addresses the prober can reach:
/// every Envoy a rollout must hear from.
pub fn fleet_addresses(
    slices: &[std::sync::Arc<EndpointSlice>],
    address_map: Option<AddressMap>,
) -> Vec<String> {
    let mut out: Vec<String> = slices
        .iter()
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.iter())
        .map(|a| address_map.map_or(a.clone(), |m| m.map(a)))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// How a verification within one reconcile ended.
pub(super) enum Verification {
    /// Every Envoy passed, or there is none to ask.
    Passed(FleetResult),
    /// Not yet: report the result, ask again after the backoff.
    Waiting(FleetResult, Duration),
    /// A newer generation arrived meanwhile.
    Superseded,
}

/// Asks the fleet (re-read on every attempt, so Envoys that join are asked too) until every
/// Envoy passes `check`. Between attempts it waits out the route's backoff, or less: as
/// soon as the Envoys connected here hold a new snapshot, since only then can the answer
/// change. Waiting in the pass saves the reconcile's API reads; it lasts at most
/// [`VERIFY_IN_PASS`].
pub(super) async fn verify<F, Fut>(ctx: &Context, route: &TrafficRoute, check: F) -> Verification
where
    F: Fn(Vec<String>) -> Fut,
    Fut: Future<Output = FleetResult>,
{
    let key = (route.namespace().unwrap_or_default(), route.name_any());
    let started = Instant::now();
    let mut converged = ctx.converged.clone();
    let mut woken = false;
    let mut wait = Duration::ZERO;
    loop {
        // A snapshot that converges from here on may change the answer: it wakes us.
        converged.borrow_and_update();
        let envoys = ctx.envoys();
        let empty = envoys.is_empty();
        let result = check(envoys).await;
        debug!(route = %key.1, ready = result.ready.len(), lagging = ?result.lagging, woken, "fleet checked");
        if result.all_ready() || empty {
            ctx.progressed(&key);
            return Verification::Passed(result);
        }
        // Only a wait that ran out grows the backoff; a new snapshot is worth a look anyway.
        if !woken {
            wait = ctx.backoff(&key);
        }
        if started.elapsed() + wait > VERIFY_IN_PASS {
            return Verification::Waiting(result, wait);
        }
        woken = tokio::select! {
            () = tokio::time::sleep(wait) => false,
            changed = converged.changed() => changed.is_ok(),
        };
        if ctx.superseded(route) {
            return Verification::Superseded;
        }
    }
}
