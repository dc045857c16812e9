//! Each unit of a Gateway ([`super::unit`]) moved through the two-phase rollout by the
//! engine ([`advance`]): its probe ProxyConfig staged, every
//! Envoy asked whether the new clusters are ready and the routes on trial accepted, its
//! live ProxyConfig promoted, every Envoy asked whether it serves it, then the probe
//! collected after the drain period (at once when no cluster leaves with it). The
//! ProxyConfigs live in the Gateway's namespace,
//! owned by the Gateway, and are served like any other.
//!
//! Units move side by side. Within a pass a unit asks the fleet again each time an Envoy
//! connected here answers (and, while only Envoys connected to other replicas hold it
//! back, after a short wait: [`ASK_ELSEWHERE_AGAIN`]), until [`VERIFY_IN_PASS`] after
//! the pass began: a Gateway pass translates every Gateway and writes statuses, so ending
//! it to wait cost each step a pass. A unit that still waits says why, and the controller
//! comes back soon (see [`Outcome::wake`]).
//! Everything is derived from the ProxyConfigs the API server holds, so a new leader goes
//! on where the old one was; promotion only follows a verification of the same pass (I3).
//! They are read, written and deleted through the engine ([`ProxyConfigs`]): every write
//! and delete holds only if the object is still as read.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::sync::watch;

use kube::{Client, Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::api::gateways::Gateway;
use super::service::{CONTROLLER_LABEL, GATEWAY_LABEL, GatewayKey};
use super::unit::Unit;
use crate::api::ProxyConfig;
use crate::k8s::envoys::Envoys;
use crate::k8s::events::{Event, EventRecorder, EventType};
use crate::k8s::watched::{Filter, View, Watched};
use crate::model::trial_id;
use crate::prober::{FleetResult, Prober};
use crate::rollout::executor::{self, Done, End, Front, Held, Phase, Verification, advance};
use crate::rollout::fleet::{
    FleetChanges, check_while_fleet_stays, fleet_addresses, fleet_pods, lagging_only_elsewhere,
    named_by_pod, passed,
};
use crate::rollout::lagging::{ENVOYS_LAGGING, LaggingEnvoys, event_note};
use crate::rollout::proxy_configs::Error;
use crate::rollout::served::ServedVersions;
use crate::rollout::{
    DEFAULT_DRAIN, Owner, ProxyConfigs, ROUTE_LABEL, RouteError, UnitRef, label_value,
};
use crate::translate::Problem;
use switchyard_core::route::lower::{endpoint_probe_id, route_id};

/// How long after a pass began its units may wait on the fleet, asking again each time an
/// Envoy answers: long enough for Envoys to take a configuration push (as a TrafficRoute's
/// pass waits), short enough that a unit that cannot pass reports promptly. The time is
/// the pass's, not each unit's: units that wait hold a place among the [`CONCURRENCY`]
/// running, and with thousands of new HTTPRoutes waiting 200 ms each, a pass lasted
/// seconds while the snapshots their checks waited for came and went.
const VERIFY_IN_PASS: Duration = Duration::from_millis(200);

/// How soon a unit waiting only on Envoys connected to other replicas asks them again
/// (then twice as long each time, up to [`ASK_ELSEWHERE_AT_MOST`], within
/// [`VERIFY_IN_PASS`]): their answers to the new snapshot reach only their own replica,
/// and a unit that waited for one here to wake it waited out the pass's whole time (every
/// change of a two-replica install took ≈ 250 ms to be served when both Envoys were
/// connected to the replica that is not the leader). The replicas build the same snapshot
/// from the same watch events, within milliseconds of each other. At most 7 asks a pass,
/// where an Envoy connected here is asked again only when it answers.
const ASK_ELSEWHERE_AGAIN: Duration = Duration::from_millis(10);
/// The longest wait between two such asks: doubling on, the last ask of a pass came at
/// 150 ms and none after, just as endpoints late by a 100 ms would be there.
const ASK_ELSEWHERE_AT_MOST: Duration = Duration::from_millis(40);

/// Units moved at once in a pass. A pass lasts until its last unit is moved, and a unit
/// waiting on the fleet holds its place while it waits: with thousands of HTTPRoutes
/// rolling out at once, this paced them (at 64, 5000 new HTTPRoutes took 281 s to be
/// served). As many as a TrafficRoute controller runs passes.
const CONCURRENCY: usize = 256;

/// Where a unit stands after a pass.
#[derive(Clone, Debug, PartialEq)]
pub enum UnitState {
    /// Every Envoy serves its current version.
    Served,
    /// Not yet, and why.
    Waiting(String),
    /// It cannot be rolled out as it is (the API server refuses its ProxyConfig).
    Failed(String),
}

/// What a pass over every unit gives.
#[derive(Default)]
pub struct Outcome {
    /// By unit name (names are unique within a namespace; the Gateway is in the key).
    pub states: BTreeMap<(GatewayKey, String), UnitState>,
    /// When the controller should come back, if sooner than its resync.
    pub wake: Option<Duration>,
    /// The Envoys' answers (the count `answered` gives) when the units still waiting on
    /// the fleet last asked it, the earliest; None when none waits on the fleet. A newer
    /// answer may change what one of them is told.
    pub asked: Option<u64>,
}

impl Outcome {
    /// The worst state (Failed, then Waiting, then Served) of the listeners of `gateway`
    /// (of its `port`, when given): its ports' own units. What routes wait for on those
    /// ports is theirs to tell (Served), not the listener's.
    pub fn listeners<'a>(
        &'a self,
        units: &'a [Unit],
        gateway: &GatewayKey,
        port: Option<i32>,
    ) -> Option<&'a UnitState> {
        units
            .iter()
            .filter(|u| u.hostname.is_none())
            .filter(|u| &u.gateway == gateway && port.is_none_or(|p| u.port == p))
            .filter_map(|u| self.states.get(&(u.gateway.clone(), u.name.clone())))
            .max_by_key(|s| match s {
                UnitState::Served => 0,
                UnitState::Waiting(_) => 1,
                UnitState::Failed(_) => 2,
            })
    }
}

pub struct Rollout {
    proxy_configs: ProxyConfigs,
    prober: Prober,
    /// The controller's label value on what it writes.
    controller: String,
    two_phase: bool,
    /// The live version each unit was last seen served in by the whole fleet.
    served: ServedVersions,
    /// Consecutive passes a unit waited, for the backoff.
    attempts: HashMap<(String, String), u32>,
    /// What this replica's snapshot builder left out (see [`left_out`]).
    problems: watch::Receiver<Vec<Problem>>,
    /// The fleet Service's EndpointSlices: the Pod of each Envoy.
    fleet: View<EndpointSlice>,
    /// The fleet's addresses as they change: every Envoy a unit must hear from.
    fleet_changes: FleetChanges,
    /// Which Envoys hold each waiting unit's version back, for the Event that names them.
    lagging: LaggingEnvoys<String>,
    /// Records Events on the Gateways.
    recorder: EventRecorder,
    /// The Envoys connected to this replica.
    envoys: Arc<dyn Envoys>,
}

/// What a rollout reads and tells besides its ProxyConfigs.
pub struct Sources {
    pub prober: Prober,
    /// The fleet Service's EndpointSlices.
    pub fleet: View<EndpointSlice>,
    /// What this replica's snapshot builder left out.
    pub problems: watch::Receiver<Vec<Problem>>,
    pub recorder: EventRecorder,
    /// Where units' first ProxyConfigs may be written together.
    pub batches: Option<std::sync::Arc<crate::rollout::Batches>>,
    /// The Envoys connected to this replica: the answers a waiting unit hears of.
    pub envoys: Arc<dyn Envoys>,
}

impl Rollout {
    /// `store`: a watch of (at least) the Gateways' ProxyConfigs.
    pub fn new(
        client: Client,
        store: Watched<ProxyConfig>,
        sources: Sources,
        controller: String,
        two_phase: bool,
    ) -> Self {
        Self {
            proxy_configs: ProxyConfigs::new(client, store, sources.batches),
            prober: sources.prober,
            controller,
            two_phase,
            served: ServedVersions::default(),
            attempts: HashMap::new(),
            problems: sources.problems,
            fleet_changes: FleetChanges::new(&sources.fleet),
            fleet: sources.fleet,
            lagging: LaggingEnvoys::default(),
            recorder: sources.recorder,
            envoys: sources.envoys,
        }
    }

    /// Moves every unit as far as it goes now, and collects the ProxyConfigs of units gone.
    /// `answered` changes whenever an Envoy connected here answers.
    pub async fn pass(
        &mut self,
        units: &[Unit],
        gateways: &[Gateway],
        answered: &watch::Receiver<u64>,
    ) -> Outcome {
        let mut outcome = Outcome::default();
        let until = tokio::time::Instant::now() + VERIFY_IN_PASS;
        let asked = AtomicU64::new(u64::MAX);
        let work: Vec<(&Unit, &Gateway)> = units
            .iter()
            .filter_map(|unit| {
                let gateway = gateways.iter().find(|g| {
                    g.metadata.namespace.as_deref() == Some(unit.gateway.0.as_str())
                        && g.metadata.name.as_deref() == Some(unit.gateway.1.as_str())
                })?;
                Some((unit, gateway))
            })
            .collect();
        // Each move is made when one of CONCURRENCY running ends: a move is the size of
        // everything it may await, and thousands made at once (one per HTTPRoute's
        // hostname) held that much while only CONCURRENCY ran. A plain loop, as a lazy
        // stream of them cannot be proven Send here (rust-lang/rust#102211).
        let moved = {
            let this = &*self;
            let asked = &asked;
            let mut work = work.into_iter();
            let mut running = FuturesUnordered::new();
            let mut moved = Vec::new();
            loop {
                while running.len() < CONCURRENCY {
                    let Some((unit, gateway)) = work.next() else {
                        break;
                    };
                    let next: futures::future::BoxFuture<'_, _> = Box::pin(async move {
                        let fleet = (answered.clone(), until, asked);
                        let moved = this.advance(unit, gateway, fleet);
                        (unit, moved.await)
                    });
                    running.push(next);
                }
                match running.next().await {
                    Some(done) => moved.push(done),
                    None => break moved,
                }
            }
        };
        let asked = asked.into_inner();
        outcome.asked = (asked != u64::MAX).then_some(asked);
        for (unit, (state, wake)) in moved {
            let key = (unit.gateway.0.clone(), unit.name.clone());
            let wake = match &state {
                UnitState::Waiting(_) => Some(wake.unwrap_or_else(|| self.backoff(&key))),
                _ => {
                    self.attempts.remove(&key);
                    wake
                }
            };
            outcome.wake = min(outcome.wake, wake);
            outcome
                .states
                .insert((unit.gateway.clone(), unit.name.clone()), state);
        }
        // Units served, refused or gone wait on no Envoy any more.
        let waiting: HashSet<(&str, &str)> = (outcome.states.iter())
            .filter(|(_, state)| matches!(state, UnitState::Waiting(_)))
            .map(|((gateway, name), _)| (gateway.0.as_str(), name.as_str()))
            .collect();
        (self.lagging).retain(|unit| waiting.contains(&(unit.0.as_str(), unit.1.as_str())));
        self.collect_gone(units).await;
        outcome
    }

    /// Whether a ProxyConfig a watch event brings is only one of this rollout's own
    /// writes heard back.
    pub fn echoes(&self) -> Filter<ProxyConfig> {
        self.proxy_configs.echoes()
    }

    fn is_ours(&self, pc: &ProxyConfig) -> bool {
        pc.labels().contains_key(GATEWAY_LABEL)
            && pc.labels().get(CONTROLLER_LABEL) == Some(&self.controller)
    }

    fn backoff(&mut self, key: &(String, String)) -> Duration {
        let n = self.attempts.entry(key.clone()).or_insert(0);
        *n = (*n + 1).min(7);
        Duration::from_millis(25 << (*n - 1)).min(Duration::from_secs(2))
    }

    /// Moves one unit as far as it goes now, by the engine's steps, waiting on the fleet
    /// until `until` at most: its state, and when to come back if sooner than the backoff.
    /// A unit left waiting on the fleet lowers `asked` to the answers it had seen.
    async fn advance(
        &self,
        unit: &Unit,
        gateway: &Gateway,
        (answered, until, asked): (watch::Receiver<u64>, tokio::time::Instant, &AtomicU64),
    ) -> (UnitState, Option<Duration>) {
        let resolved: Result<_, RouteError> = Ok(unit.resolved.clone());
        let moved = executor::Unit {
            unit: UnitRef {
                namespace: &unit.gateway.0,
                name: &unit.name,
                owner: Owner {
                    reference: gateway.controller_owner_ref(&()),
                    labels: [
                        (GATEWAY_LABEL.to_owned(), label_value(&unit.gateway.1)),
                        (CONTROLLER_LABEL.to_owned(), self.controller.clone()),
                    ]
                    .into(),
                },
            },
            // A unit's content is its version: it has no generation of its own.
            generation: 1,
            resolved: &resolved,
            drain_period: DEFAULT_DRAIN,
            two_phase: self.two_phase,
            created: None,
        };
        let mut held = match Held::read(&self.proxy_configs, &moved.unit).await {
            Ok(held) => held,
            Err(error) => return retried(&error),
        };
        let mut front = Fleet {
            prober: &self.prober,
            served: &self.served,
            unit,
            asking: Asking {
                fleet: &self.fleet,
                addresses: self.fleet_changes.subscribe(),
                envoys: self.envoys.as_ref(),
                answered,
                until,
                asked,
            },
        };
        let end = advance(&self.proxy_configs, &moved, &mut held, &mut front).await;
        match end {
            Ok(End::Rejected(error) | End::Refused(error)) => {
                (UnitState::Failed(error.to_string()), None)
            }
            Ok(End::Waiting {
                phase,
                result,
                version,
                ..
            }) => {
                let why = match phase {
                    Phase::VerifyingEndpoints => {
                        "new clusters not ready, or routes on trial not accepted"
                    }
                    Phase::VerifyingLive => "new routes not served by every Envoy yet",
                };
                let mut waiting = lagging(why, &result);
                let id = route_id(&unit.gateway.0, &unit.name);
                for problem in left_out(&self.problems.borrow(), &id) {
                    waiting.push_str(&format!("; left out: {problem}"));
                }
                self.tell_lagging(unit, gateway, &version, &result, &waiting)
                    .await;
                (UnitState::Waiting(waiting), None)
            }
            Ok(End::Draining { after }) => (UnitState::Served, Some(after)),
            Ok(End::Served) => (UnitState::Served, None),
            Ok(End::Superseded | End::MoreSteps) => (
                UnitState::Waiting("still rolling out".into()),
                Some(Duration::ZERO),
            ),
            Err(error) => retried(&error),
        }
    }

    /// Records an Event on the Gateway once the same Envoys have held `version` of `unit`
    /// back for a while (see [`LaggingEnvoys`]): its routes' status names them from the
    /// first pass, but nothing there is seen by `kubectl describe gateway` or an alert on
    /// Warning Events.
    async fn tell_lagging(
        &self,
        unit: &Unit,
        gateway: &Gateway,
        version: &str,
        result: &FleetResult,
        waiting: &str,
    ) {
        let key = (unit.gateway.0.clone(), unit.name.clone());
        let envoys: Vec<String> = result.lagging.iter().map(|(e, _)| e.clone()).collect();
        let now = Instant::now();
        if !(self.lagging).tell(&key, &version.to_owned(), &envoys, now) {
            return;
        }
        let on = match &unit.hostname {
            Some(hostname) => format!("port {} hostname {hostname}", unit.port),
            None => format!("port {}", unit.port),
        };
        let event = Event {
            type_: EventType::Warning,
            reason: ENVOYS_LAGGING.into(),
            note: Some(event_note(&format!("{on}: {waiting}"))),
            action: "Rollout".into(),
            secondary: None,
        };
        if let Err(error) = self
            .recorder
            .publish(&event, &gateway.object_ref(&()))
            .await
        {
            warn!(%error, "cannot record an event");
        }
    }

    /// Deletes the ProxyConfigs of this controller whose unit is gone (its Gateway, port
    /// or hostname): what they served is no longer asked for.
    async fn collect_gone(&mut self, units: &[Unit]) {
        let wanted: BTreeSet<(&str, &str)> = units
            .iter()
            .map(|u| (u.gateway.0.as_str(), u.name.as_str()))
            .collect();
        let held = self.proxy_configs.store().state();
        let ours: Vec<&ProxyConfig> = held
            .iter()
            .map(AsRef::as_ref)
            .filter(|pc| self.is_ours(pc))
            .collect();
        for pc in ours {
            let namespace = pc.namespace().unwrap_or_default();
            let unit = pc.labels().get(ROUTE_LABEL).cloned().unwrap_or_default();
            if wanted.contains(&(namespace.as_str(), unit.as_str()))
                || pc.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            self.served.forget(&(namespace.clone(), unit.clone()));
            let name = pc.name_any();
            // Only as this replica saw it: one rewritten since is the next pass's business.
            let deleted = self.proxy_configs.delete(&namespace, &name, Some(pc)).await;
            self.proxy_configs
                .forget(&(namespace.clone(), name.clone()));
            match deleted {
                Ok(()) => {
                    debug!(%namespace, proxy_config = %name, "unit gone: ProxyConfig deleted")
                }
                Err(error) => {
                    warn!(%namespace, proxy_config = %name, %error, "cannot delete a ProxyConfig of a unit gone")
                }
            }
        }
    }
}

/// A Gateway's unit as the engine's front: how it asks the fleet ([`Asking`]) whether
/// its versions are ready and served.
struct Fleet<'a> {
    prober: &'a Prober,
    served: &'a ServedVersions,
    unit: &'a Unit,
    asking: Asking<'a>,
}

/// How a unit asks the fleet within its pass: again each time an Envoy connected here
/// answers, the fleet changes, or (while only Envoys connected elsewhere hold it back) a
/// short wait is over, until the pass's time to wait is over; then the controller comes
/// back (see [`Outcome::wake`]).
struct Asking<'a> {
    /// The fleet's EndpointSlices: the Envoys to ask, and the Pod of each where known
    /// (status names it).
    fleet: &'a View<EndpointSlice>,
    /// The fleet's addresses, as they change: what wakes a unit, and drops a check.
    addresses: watch::Receiver<Vec<String>>,
    /// The Envoys connected here, whose answers `answered` counts.
    envoys: &'a dyn Envoys,
    answered: watch::Receiver<u64>,
    /// When the pass's time to wait on the fleet is over ([`VERIFY_IN_PASS`]).
    until: tokio::time::Instant,
    /// The pass's [`Outcome::asked`], as its units leave.
    asked: &'a AtomicU64,
}

impl Asking<'_> {
    /// `check` of the fleet (read again on every attempt, so Envoys that join are asked
    /// too) until every Envoy passes it, or the pass's time to wait is over (it asks once
    /// at least): an Envoy's answer to a new snapshot may change the result, and so may an
    /// Envoy leaving or joining the fleet. A check started within that time is dropped
    /// when the fleet changes while it is in flight: a hung Envoy's probe takes the
    /// prober's whole timeout, and once it has left the fleet nobody needs the answer.
    async fn until_passed<F, Fut>(&mut self, check: F) -> Verification
    where
        F: Fn(Vec<String>) -> Fut,
        Fut: Future<Output = FleetResult>,
    {
        let until = self.until;
        let mut ask_again = ASK_ELSEWHERE_AGAIN;
        loop {
            // Answers that come from here on may not be in this check's result.
            let seen = *self.answered.borrow_and_update();
            self.addresses.borrow_and_update();
            let envoys = fleet_addresses(&self.fleet.state());
            let may_drop = tokio::time::Instant::now() < until;
            let asked = envoys.clone();
            let checked = check_while_fleet_stays(&mut self.addresses, &check, asked, may_drop);
            let Some(result) = checked.await else {
                continue;
            };
            if passed(&result, &envoys) {
                return Verification::Passed(result);
            }
            let pods = fleet_pods(&self.fleet.state());
            let elsewhere = lagging_only_elsewhere(&result, &pods, &self.envoys.connected());
            let result = named_by_pod(result, &pods);
            // The deadline first: past it, an answer that came meanwhile asks no more.
            let woken = tokio::select! {
                biased;
                () = tokio::time::sleep_until(until) => false,
                changed = self.answered.changed() => changed.is_ok(),
                changed = self.addresses.changed() => changed.is_ok(),
                () = tokio::time::sleep(ask_again), if elsewhere => {
                    ask_again = (ask_again * 2).min(ASK_ELSEWHERE_AT_MOST);
                    true
                }
            };
            if !woken {
                self.asked.fetch_min(seen, Ordering::Relaxed);
                return Verification::Waiting(result, Duration::ZERO);
            }
        }
    }
}

impl Front for Fleet<'_> {
    async fn verify_endpoints(&mut self, probe_version: &str) -> Verification {
        let (namespace, name) = (&self.unit.gateway.0, &self.unit.name);
        let id = endpoint_probe_id(namespace, name, probe_version);
        let trial = trial_id(&route_id(namespace, name));
        let prober = self.prober;
        let check = |envoys: Vec<String>| {
            let (id, trial) = (&id, &trial);
            async move { prober.check_staged(&envoys, id, trial, probe_version).await }
        };
        self.asking.until_passed(check).await
    }

    async fn verify_live(&mut self, version: &str) -> Verification {
        let key = (self.unit.gateway.0.clone(), self.unit.name.clone());
        let envoys = fleet_addresses(&self.asking.fleet.state());
        if let Some(seen) = self.served.seen(&key, version, &envoys) {
            return Verification::Passed(seen);
        }
        let port = (self.unit.resolved.listener.as_ref())
            .and_then(|l| u16::try_from(l.probe_port).ok())
            .unwrap_or_default();
        let id = route_id(&key.0, &key.1);
        let prober = self.prober;
        // The Envoys the last attempt asked: those a pass is recorded for.
        let asked = Mutex::new(Vec::new());
        let check = |envoys: Vec<String>| {
            *asked.lock().unwrap_or_else(|p| p.into_inner()) = envoys.clone();
            let id = &id;
            async move { prober.check_version_on(&envoys, port, id, version).await }
        };
        let verdict = self.asking.until_passed(check).await;
        if let Verification::Passed(result) = &verdict {
            let asked = asked.into_inner().unwrap_or_else(|p| p.into_inner());
            self.served.record(&key, version, asked, result);
        }
        verdict
    }

    fn done(&mut self, step: Done<'_>) {
        if let Done::Promoted { first: true } = step {
            let unit = (self.unit.gateway.0.clone(), self.unit.name.clone());
            self.served.forget(&unit);
            let gateway = format!("{}/{}", self.unit.gateway.0, self.unit.gateway.1);
            info!(%gateway, unit = %self.unit.name, "promoted");
        }
    }
}

/// What the snapshot builder left out of unit `id` (`namespace/name`): its virtual host or
/// its endpoint probe (a cluster that cannot take a switch), in its own words.
fn left_out<'a>(problems: &'a [Problem], id: &str) -> impl Iterator<Item = &'a str> {
    (problems.iter())
        .filter(move |p| p.subject().route() == Some(id))
        .map(Problem::message)
}

/// Why a unit waits, naming the Envoys that hold it back (the first few).
fn lagging(why: &str, result: &FleetResult) -> String {
    let named: Vec<String> = result
        .lagging
        .iter()
        .take(3)
        .map(|(envoy, reason)| format!("{envoy}: {reason}"))
        .collect();
    let more = result.lagging.len().saturating_sub(named.len());
    let more = if more > 0 {
        format!(" (and {more} more)")
    } else {
        String::new()
    };
    format!(
        "{why} ({} of {} Envoys ready; {}{more})",
        result.ready.len(),
        result.total(),
        named.join("; ")
    )
}

/// A read or write that failed: refused for good (the API server finds the ProxyConfig
/// invalid), or to retry as soon as its kind of error allows (a conflict: at once, with a
/// fresh read).
fn retried(error: &Error) -> (UnitState, Option<Duration>) {
    if let Some((name, message)) = error.refusal() {
        let refused = RouteError::WriteRefused {
            name: name.to_owned(),
            message: message.to_owned(),
        };
        return (UnitState::Failed(refused.to_string()), None);
    }
    let (_, after) = error.policy();
    (UnitState::Waiting(error.to_string()), Some(after))
}

fn min(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::atomic::AtomicUsize;

    use k8s_openapi::api::core::v1::ObjectReference;
    use tokio::sync::mpsc;

    use super::*;
    use crate::k8s::envoys::{BlockingNack, Holding, RouteVerdict, Snapshot};
    use crate::k8s::fixtures;
    use crate::translate::Subject;

    /// Envoys connected here by node id, none of which ever answers.
    struct Connected(BTreeSet<String>);

    impl Envoys for Connected {
        fn publish(&self, _: Arc<Snapshot>) -> bool {
            false
        }
        fn verdicts(&self) -> mpsc::UnboundedReceiver<RouteVerdict> {
            mpsc::unbounded_channel().1
        }
        fn changes(&self) -> watch::Receiver<u64> {
            watch::channel(0).1
        }
        fn holdings(&self) -> Vec<Holding> {
            Vec::new()
        }
        fn blocking_nacks(&self) -> Vec<BlockingNack> {
            Vec::new()
        }
        fn connected(&self) -> BTreeSet<String> {
            self.0.clone()
        }
        fn set_draining(&self, _: BTreeSet<String>) {}
    }

    /// A fleet of two Envoys: Pod `envoy-here` connected to this replica, Pod
    /// `envoy-elsewhere` to another one.
    fn fleet() -> View<EndpointSlice> {
        let envoy = |address: &str, pod: &str| {
            let mut endpoint = fixtures::endpoint(address);
            endpoint.target_ref = Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                ..Default::default()
            });
            endpoint
        };
        let mut slice = fixtures::slice("envoy-x", "envoy");
        slice.endpoints = Some(vec![
            envoy("198.18.0.4", "envoy-here"),
            envoy("198.18.0.5", "envoy-elsewhere"),
        ]);
        Watched::holding(vec![slice]).view(Arc::new(|_: &EndpointSlice| true))
    }

    /// Asks a fleet where the Envoys at `lagging` answer "not yet" until `ready_after`,
    /// counting the checks: what the pass's wait gave, the checks, and the pass's
    /// [`Outcome::asked`] as the unit left it.
    async fn wait_on(lagging: &[&str], ready_after: Duration) -> (Verification, usize, u64) {
        let fleet = fleet();
        let changes = FleetChanges::new(&fleet);
        let here = Connected(BTreeSet::from(["envoy-here".to_owned()]));
        let (_answers, answered) = watch::channel(0);
        let asked = AtomicU64::new(u64::MAX);
        let started = tokio::time::Instant::now();
        let mut asking = Asking {
            fleet: &fleet,
            addresses: changes.subscribe(),
            envoys: &here,
            answered,
            until: started + VERIFY_IN_PASS,
            asked: &asked,
        };
        let checks = AtomicUsize::new(0);
        let check = |envoys: Vec<String>| {
            checks.fetch_add(1, Ordering::Relaxed);
            let not_yet = started.elapsed() < ready_after;
            let (lagging, ready): (Vec<String>, Vec<String>) = (envoys.into_iter())
                .partition(|envoy| not_yet && lagging.contains(&envoy.as_str()));
            let lagging = (lagging.into_iter())
                .map(|envoy| (envoy, "serves version \"a\"".to_owned()))
                .collect();
            async move { FleetResult { ready, lagging } }
        };
        let verdict = asking.until_passed(check).await;
        (verdict, checks.into_inner(), asked.into_inner())
    }

    /// An Envoy connected to another replica takes the change without a word reaching
    /// this one: the unit asks it again, and is served within its pass rather than after.
    #[tokio::test(start_paused = true)]
    async fn an_envoy_connected_elsewhere_is_asked_again_within_the_pass() {
        let (verdict, checks, _) = wait_on(&["198.18.0.5"], Duration::from_millis(30)).await;
        assert!(matches!(verdict, Verification::Passed(_)), "{verdict:?}");
        // At 0, 10, 30 ms.
        assert_eq!(checks, 3);
    }

    /// One that never takes it is asked a bounded number of times in a pass, and the
    /// unit leaves the pass waiting, having seen no answer here.
    #[tokio::test(start_paused = true)]
    async fn an_envoy_elsewhere_that_lags_on_is_asked_at_most_seven_times_a_pass() {
        let (verdict, checks, asked) = wait_on(&["198.18.0.5"], Duration::MAX).await;
        assert!(matches!(verdict, Verification::Waiting(..)), "{verdict:?}");
        // At 0, 10, 30, 70, 110, 150 and 190 ms.
        assert_eq!(checks, 7);
        assert_eq!(asked, 0);
    }

    /// One connected here is asked again when it answers, and only then: no Envoy is
    /// asked in a loop while nothing it could say has changed; nor while one elsewhere
    /// lags beside it, since the unit waits for both.
    #[tokio::test(start_paused = true)]
    async fn an_envoy_connected_here_is_asked_again_only_when_it_answers() {
        for lagging in [&["198.18.0.4"][..], &["198.18.0.4", "198.18.0.5"]] {
            let (verdict, checks, _) = wait_on(lagging, Duration::from_millis(30)).await;
            assert!(matches!(verdict, Verification::Waiting(..)), "{verdict:?}");
            assert_eq!(checks, 1, "{lagging:?}");
        }
    }

    #[test]
    fn a_waiting_unit_is_told_what_was_left_out_of_it_only() {
        let problems = [
            Problem::new(Subject::EndpointProbe("gw/web-80/1f".into()), "held"),
            Problem::new(Subject::EndpointProbe("gw/web-8080/1f".into()), "not ours"),
            Problem::new("gw/web-80", "its virtual host"),
            Problem::new(Subject::Cluster("gw/new/80".into()), "a cluster's"),
        ];
        let told: Vec<&str> = left_out(&problems, "gw/web-80").collect();
        assert_eq!(told, ["held", "its virtual host"]);
    }
}
