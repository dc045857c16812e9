//! Asking the fleet within one pass, with the backoff between attempts.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tracing::debug;

use super::{ANSWER_KEPT, Asked, Context, VERIFY_IN_PASS};
use crate::api::TrafficRoute;
use crate::k8s::built_from::Awaited;
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
        self.awaiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Records that the route asks `envoys` for `awaited`, every Envoy connected here
    /// serving build `checked`.
    fn asking(&self, key: &(String, String), awaited: &Awaited, checked: u64, envoys: &[String]) {
        let asked = Asked {
            awaited: awaited.clone(),
            checked,
            envoys: envoys.to_vec(),
            answer: None,
        };
        (self.awaiting.lock().unwrap_or_else(|p| p.into_inner())).insert(key.clone(), asked);
    }

    fn answered(&self, key: &(String, String), result: &FleetResult) {
        let mut awaiting = self.awaiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(asked) = awaiting.get_mut(key) {
            asked.answer = Some((result.clone(), Instant::now()));
        }
    }

    /// The route's last answer from the fleet, when asking again now would get the same:
    /// it asked the same Envoys for the same less than [`ANSWER_KEPT`] ago, and those
    /// connected here do not serve a snapshot built from it yet.
    fn unchanged_answer(&self, key: &(String, String), awaited: &Awaited) -> Option<FleetResult> {
        let envoys = self.envoys();
        let awaiting = self.awaiting.lock().unwrap_or_else(|p| p.into_inner());
        let asked = awaiting.get(key)?;
        let same = asked.awaited == *awaited && asked.envoys == envoys;
        let (result, at) = asked.answer.clone().filter(|_| same)?;
        drop(awaiting);
        (at.elapsed() < ANSWER_KEPT && !self.holds_now(awaited)).then_some(result)
    }

    /// The build of the snapshot every Envoy connected here serves, if known.
    fn converged_build(&self, converged: Option<&str>) -> u64 {
        converged
            .and_then(|version| self.settings.built_from.build_of(version))
            .unwrap_or(0)
    }

    /// The snapshot every Envoy connected here serves in full (see
    /// [`crate::k8s::convergence`]); None while that is not known here (no Envoy here,
    /// each stalled, one serving nothing yet or a snapshot forgotten): only asking tells.
    fn converged_now(&self) -> Option<String> {
        self.converged.borrow().clone()
    }

    /// Whether the Envoys connected here hold a snapshot built from what `awaited` names;
    /// true when that is not known here: then only asking tells.
    pub(super) fn holds_now(&self, awaited: &Awaited) -> bool {
        let converged = self.converged_now();
        converged.is_none_or(|version| self.settings.built_from.holds(&version, awaited))
    }

    /// Whether the snapshot every Envoy connected here serves has news for a route
    /// that waits for `awaited` and last asked them at build `checked`.
    pub(super) fn has_news(
        &self,
        converged: Option<&str>,
        awaited: &Awaited,
        checked: u64,
    ) -> bool {
        converged.is_none_or(|version| self.settings.built_from.has_news(version, awaited, checked))
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
/// soon as the Envoys connected here hold a snapshot with news of `awaited` (see
/// [`crate::k8s::built_from`]), or the fleet changes, since only then can the answer
/// change. Waiting in the pass saves the reconcile's API reads; it lasts at most
/// [`VERIFY_IN_PASS`].
pub(super) async fn verify<F, Fut>(
    ctx: &Context,
    route: &TrafficRoute,
    awaited: &Awaited,
    check: F,
) -> Verification
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
    if let Some(last) = ctx.unchanged_answer(&key, awaited) {
        // Asked already, and nothing the answer depends on changed since.
        return Verification::Waiting(last, ctx.backoff(&key));
    }
    loop {
        // A snapshot that converges from here on may change the answer, and so may an
        // Envoy leaving or joining the fleet: either wakes us.
        let checked = ctx.converged_build(converged.borrow_and_update().as_deref());
        fleet_changes.borrow_and_update();
        let envoys = ctx.envoys();
        let empty = envoys.is_empty();
        ctx.asking(&key, awaited, checked, &envoys);
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
        ctx.answered(&key, &result);
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
        let timer = tokio::time::sleep(wait);
        tokio::pin!(timer);
        woken = loop {
            tokio::select! {
                () = &mut timer => {
                    if ctx.holds_now(awaited) {
                        break false;
                    }
                    // The Envoys connected here do not serve a snapshot with it yet:
                    // those of them in the fleet would answer "not yet". News
                    // will wake us.
                    wait = ctx.backoff(&key);
                    if started.elapsed() + wait > VERIFY_IN_PASS {
                        return Verification::Waiting(result, wait);
                    }
                    timer.as_mut().reset(tokio::time::Instant::now() + wait);
                }
                changed = converged.changed() => {
                    if changed.is_err() {
                        // No convergence to hear of any more: the timer alone paces.
                        (&mut timer).await;
                        break false;
                    }
                    let version = converged.borrow_and_update().clone();
                    if ctx.has_news(version.as_deref(), awaited, checked) {
                        break true;
                    }
                }
                changed = fleet_changes.changed() => break changed.is_ok(),
            }
        };
        if ctx.superseded(route) {
            return Verification::Superseded;
        }
    }
}
