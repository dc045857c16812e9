//! Asking the fleet within one pass, with the backoff between attempts.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tracing::debug;

use super::{Context, VERIFY_IN_PASS};
use crate::api::TrafficRoute;
use crate::prober::FleetResult;
use crate::rollout::executor::Verification;
use crate::rollout::fleet::check_while_fleet_stays;
use crate::rollout::{fleet_addresses, fleet_pods, named_by_pod};

impl Context {
    /// Ready endpoints of the Envoy Service, as addresses the prober can reach.
    pub(super) fn envoys(&self) -> Vec<String> {
        fleet_addresses(&self.fleet.state())
    }

    /// The Pod of each Envoy of the fleet, where its EndpointSlice names one.
    pub(super) fn envoy_pods(&self) -> BTreeMap<String, String> {
        fleet_pods(&self.fleet.state())
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

/// Asks the fleet (re-read on every attempt, so Envoys that join are asked too) until every
/// Envoy passes `check`. Between attempts it waits out the route's backoff, or less: as
/// soon as the Envoys connected here hold a new snapshot, or the fleet changes, since only
/// then can the answer change. Waiting in the pass saves the reconcile's API reads; it lasts at most
/// [`VERIFY_IN_PASS`].
pub(super) async fn verify<F, Fut>(ctx: &Context, route: &TrafficRoute, check: F) -> Verification
where
    F: Fn(Vec<String>) -> Fut,
    Fut: Future<Output = FleetResult>,
{
    let key = (route.namespace().unwrap_or_default(), route.name_any());
    let started = Instant::now();
    let mut converged = ctx.converged.clone();
    let mut fleet_changes = ctx.fleet_changes.subscribe();
    let mut woken = false;
    let mut wait = Duration::ZERO;
    loop {
        // A snapshot that converges from here on may change the answer, and so may an
        // Envoy leaving or joining the fleet: either wakes us.
        converged.borrow_and_update();
        fleet_changes.borrow_and_update();
        let envoys = ctx.envoys();
        let empty = envoys.is_empty();
        // Past the pass's time, the answer is waited for whatever happens.
        let may_drop = started.elapsed() < VERIFY_IN_PASS;
        let Some(result) =
            check_while_fleet_stays(&mut fleet_changes, &check, envoys, may_drop).await
        else {
            // The fleet changed while it was asked: ask the fleet as it is now.
            if ctx.superseded(route) {
                return Verification::Superseded;
            }
            woken = true;
            continue;
        };
        let result = named_by_pod(result, &ctx.envoy_pods());
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
            changed = fleet_changes.changed() => changed.is_ok(),
        };
        if ctx.superseded(route) {
            return Verification::Superseded;
        }
    }
}
