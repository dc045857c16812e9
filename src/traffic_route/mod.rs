//! The TrafficRoute front-end, on the leader only. For each TrafficRoute the reconciler
//! performs the steps the rollout engine decides ([`crate::rollout::shift::next_step`]):
//! writes ProxyConfigs through the engine, has every Envoy probed, and hands the resulting
//! status to the status writer.
//!
//! - [`resolve`]: the spec and its Services into the route vocabulary;
//! - `reconcile`: one pass, the effects of each step;
//! - `admission`: what a route needs beyond its own spec (its hosts, Envoy's verdict);
//! - `verify`: asking the fleet, with the backoff between attempts;
//! - `report`: the status and its conditions;
//! - `triggers`: what else wakes a route (the fleet converging, Secrets, orphans);
//! - `routes`: the routes by host and by Service, for those triggers and admission;
//! - `told`: the last Event told about each route, until its status says the same.

mod admission;
mod deadline;
mod reconcile;
mod report;
pub mod resolve;
mod routes;
mod told;
mod triggers;
mod verify;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::warn;

use crate::api::{ProxyConfig, TrafficRoute};
use crate::k8s::built_from::{Awaited, BuiltFrom};
use crate::k8s::convergence::Convergence;
use crate::k8s::envoys::Envoys;
use crate::k8s::events::EventRecorder;
use crate::k8s::fleet_report::FleetView;
use crate::k8s::index::{Scope, Watches};
use crate::k8s::status::{StatusKind, StatusWriter, Write};
use crate::k8s::watched::{View, WatchBackoff, Watched, forget_bookkeeping};
use crate::metrics::{ErrorLabel, Metrics};
use crate::prober::{FleetResult, Prober};
use crate::rollout::ProxyConfigs;
use crate::rollout::clock::RolloutClock;
use crate::rollout::fleet::FleetChanges;
use crate::rollout::lagging::LaggingEnvoys;
use crate::rollout::proxy_configs::Error;
use crate::rollout::served::ServedVersions;
use crate::translate::Problem;
use deadline::ProbeDeadlines;
use reconcile::reconcile;
use routes::{RouteIndex, object_ref};
use triggers::{
    collect_orphans, track_convergence, wake_on_fleet_change, wake_on_fleet_rejections,
    wake_on_news, wake_on_secret_troubles,
};

/// A waiting route's last question to the fleet (see [`crate::k8s::built_from`]).
pub(super) struct Asked {
    /// What it waits for the Envoys to hold.
    pub(super) awaited: Awaited,
    /// The build every Envoy connected here served when it asked.
    pub(super) checked: u64,
    /// The Envoys it asked, and their answers with when they came (None while it asks).
    pub(super) envoys: Vec<String>,
    pub(super) answer: Option<(FleetResult, std::time::Instant)>,
}

/// How long a waiting route's last answer from the fleet stands in for asking again while
/// the Envoys connected here do not serve what it waits for: the longest backoff,
/// so that Envoys on other replicas, and a convergence this replica misreads, cost at most
/// what the backoff did.
pub(super) const ANSWER_KEPT: Duration = Duration::from_secs(2);

/// Each route waiting on the fleet, by namespace and name: its last question.
pub(super) type Awaiting = Arc<Mutex<HashMap<(String, String), Asked>>>;

/// Whether `pc` belongs to another front-end's unit: owned (as its controller) by an
/// object that is not a TrafficRoute. Those are their own front-end's to roll out, claim
/// hosts with and collect.
pub(super) fn is_others(pc: &ProxyConfig) -> bool {
    pc.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.kind != "TrafficRoute")
}

/// How a TrafficRoute's status is written: applied whole (a field no longer set goes), a
/// new Accepted or Ready first.
pub(super) static STATUS: LazyLock<Arc<StatusKind>> = LazyLock::new(|| {
    Arc::new(StatusKind::namespaced::<TrafficRoute>(
        Write::Apply,
        &["Accepted", "Ready"],
    ))
});

/// The Ready reason (and Event reason) while an Envoy rejects the route's configuration.
pub(super) const ENVOY_REJECTED: &str = "EnvoyRejected";

/// The route configuration's type, as NACKs name it: its NACKs are blamed on routes on
/// trial by the builder, not on every route.
pub(super) const ROUTE_CONFIGURATION: &str = "RouteConfiguration";

/// How long one reconcile keeps re-probing before it hands the wait to the controller's
/// requeue (and publishes why it waits): long enough for Envoys to take a configuration
/// push, short enough that a stuck rollout reports promptly.
pub(super) const VERIFY_IN_PASS: Duration = Duration::from_millis(200);

/// Reconciles at once at most. A new leader reconciles every route: unbounded, thousands
/// of passes each read the API server and probe the fleet at the same moment, and the
/// first status (or the leader's own Lease reads) waits behind all of them. Not much
/// lower either: a pass waiting on the fleet holds its slot up to [`VERIFY_IN_PASS`], and
/// with 32 slots a flood of routes waiting on their trials held back a good route's
/// rollout past 30 s (`tests/containment.rs`, 1 run in 3).
pub(super) const RECONCILE_CONCURRENCY: u16 = 256;

/// How the leader rolls routes out.
pub struct Settings {
    pub prober: Prober,
    /// Writes the statuses, every front-end's.
    pub status: StatusWriter,
    /// Off only for tests that prove the two phases matter.
    pub two_phase: bool,
    /// What this replica's snapshot builder left out, to explain stuck rollouts.
    pub problems: tokio::sync::watch::Receiver<Vec<Problem>>,
    /// Envoys connected to this replica: what they serve.
    pub envoys: Arc<dyn Envoys>,
    /// What the snapshots this replica published were built from: which convergence has
    /// news for a waiting route.
    pub built_from: Arc<BuiltFrom>,
    /// What the whole fleet's Envoys rejected, whichever replica they are connected to.
    pub fleet: watch::Receiver<FleetView>,
    pub metrics: Metrics,
    /// The process's watches: ProxyConfigs, Services and the fleet's EndpointSlices are
    /// read there, never watched again here.
    pub watches: Watches,
    /// Where routes' first ProxyConfigs may be written together (this term's, shared with
    /// the other front-ends).
    pub batches: Option<Arc<crate::rollout::Batches>>,
}

pub(super) struct Context {
    /// Every ProxyConfig (to keep a route from taking a host another route serves), read
    /// and written through the engine.
    pub(super) proxy_configs: ProxyConfigs,
    pub(super) settings: Settings,
    pub(super) status: StatusWriter,
    pub(super) services: Watched<Service>,
    /// The fleet Service's EndpointSlices: the Envoys a rollout must hear from.
    pub(super) fleet: View<EndpointSlice>,
    pub(super) recorder: EventRecorder,
    /// Consecutive unsuccessful verifications per route, for the requeue backoff; its keys
    /// are the routes waiting on the fleet.
    pub(super) attempts: Arc<Mutex<HashMap<(String, String), u32>>>,
    /// What each route waiting on the fleet waits for, and the build every Envoy connected
    /// here served when it last asked them.
    pub(super) awaiting: Awaiting,
    /// The live version each route was last seen served in by the whole fleet: not asked
    /// again in the passes of the next 30 s, while the fleet's addresses stay (see
    /// [`ServedVersions`]).
    pub(super) served: ServedVersions,
    /// The controller's own view of TrafficRoutes, to notice a newer generation.
    pub(super) routes: Store<TrafficRoute>,
    /// The same routes by host and by Service.
    pub(super) route_index: Arc<RouteIndex>,
    /// The snapshot every Envoy connected here serves in full, None while not known (see
    /// [`track_convergence`]).
    pub(super) converged: watch::Receiver<Option<String>>,
    /// The fleet's addresses, as they change (see [`FleetChanges`]).
    pub(super) fleet_changes: FleetChanges,
    /// When each route's rollout took its last step, for the step histogram.
    pub(super) clock: RolloutClock,
    /// How long each waiting route has waited, against its `probeDeadline`.
    pub(super) deadlines: ProbeDeadlines,
    /// Which Envoys hold each waiting route's generation back, for the Event that names
    /// them.
    pub(super) lagging: LaggingEnvoys<i64>,
    /// The translator's last verdict on each route's spec alone (see [`admission::admit`]).
    pub(super) verdicts: admission::Verdicts,
    /// The last Event told about each route whose status does not say it yet.
    pub(super) told: told::Told,
}

/// Runs until the returned future is dropped (when leadership is lost).
pub async fn run(client: Client, settings: Settings) {
    let watches = settings.watches.clone();
    // Deciding on empty stores would resolve against no Services and verify against no
    // Envoys: wait for every initial list first.
    if !watches.ready().await {
        warn!("a watcher stopped before its initial list; not reconciling");
        return;
    }
    let routes: Api<TrafficRoute> = match &watches.scope {
        Scope::Namespaces(list) if list.len() == 1 => Api::namespaced(client.clone(), &list[0]),
        // One controller for several namespaces watches them all; the list is short.
        _ => Api::all(client.clone()),
    };
    let recorder = EventRecorder::new(&client);
    // The controller's watch, also feeding the index its triggers look routes up in.
    let route_index = Arc::new(RouteIndex::default());
    let (route_store, writer) = reflector::store();
    let route_events = watcher(routes, watcher::Config::default())
        .modify(forget_bookkeeping)
        .reflect(writer)
        .inspect_ok({
            let index = route_index.clone();
            move |event| index.apply(event)
        })
        .applied_objects();
    let controller = Controller::for_stream(route_events, route_store.clone())
        .with_config(controller::Config::default().concurrency(RECONCILE_CONCURRENCY));
    let (converged_tx, converged) = watch::channel(None);
    let convergence = Arc::new(Convergence::new(
        settings.envoys.clone(),
        settings.built_from.clone(),
    ));
    let tracker = track_convergence(settings.envoys.changes(), convergence.clone(), converged_tx);
    let context = Arc::new(Context {
        proxy_configs: ProxyConfigs::new(
            client.clone(),
            watches.proxy_configs.clone(),
            settings.batches.clone(),
        ),
        status: settings.status.clone(),
        settings,
        services: watches.services.clone(),
        fleet: watches.fleet.clone(),
        recorder,
        attempts: Arc::default(),
        awaiting: Arc::default(),
        served: ServedVersions::default(),
        routes: route_store,
        route_index: route_index.clone(),
        converged,
        fleet_changes: FleetChanges::new(&watches.fleet),
        clock: RolloutClock::default(),
        deadlines: ProbeDeadlines::default(),
        lagging: LaggingEnvoys::default(),
        verdicts: admission::Verdicts::default(),
        told: told::Told::default(),
    });
    let orphans = context.clone();
    let waiting = wake_on_news(context.clone());
    let secrets = wake_on_secret_troubles(context.settings.problems.clone());
    let rejections =
        wake_on_fleet_rejections(context.settings.fleet.clone(), context.attempts.clone());
    let fleet_changes = wake_on_fleet_change(&context.fleet_changes, context.attempts.clone());
    let reconciling = controller
        // A watch that failed (the API server restarted, say) retries within a second, so
        // rollouts go on as soon as the API is back.
        .trigger_backoff(WatchBackoff::default())
        .reconcile_on(waiting)
        // A TLS Secret deleted, broken or back changes what its routes' status says, and
        // nothing else would reconcile them.
        .reconcile_on(secrets)
        // An Envoy connected to any replica rejecting, or taking back a rejection.
        .reconcile_on(rejections)
        // An Envoy leaving the fleet (a hung one no longer ready) or joining it.
        .reconcile_on(fleet_changes)
        // A ProxyConfig event reconciles its route, and every route asking for one of its
        // hosts: when a route goes, or comes, which of them gets a host may change.
        .reconcile_on(watches.proxy_configs.objects().flat_map({
            let index = route_index.clone();
            move |pc| {
                let refs = if is_others(&pc) {
                    Vec::new()
                } else {
                    let namespace = pc.namespace().unwrap_or_default();
                    let owner = ObjectRef::new(&pc.spec.route).within(&namespace);
                    let hosts = pc
                        .spec
                        .virtual_host
                        .as_ref()
                        .map(|vh| vh.hosts.as_slice())
                        .unwrap_or_default();
                    let sharing = index.asking_for(hosts);
                    std::iter::once(owner)
                        .chain(sharing.iter().map(object_ref))
                        .collect::<Vec<_>>()
                };
                futures::stream::iter(refs)
            }
        }))
        // A Service change may resolve (or break) the routes naming it.
        .reconcile_on(watches.services.objects().flat_map(move |service| {
            let namespace = service.namespace().unwrap_or_default();
            let refs = route_index
                .naming(&namespace, &service.name_any())
                .iter()
                .map(object_ref)
                .collect::<Vec<_>>();
            futures::stream::iter(refs)
        }))
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                warn!(%error, "reconcile failed");
            }
        });
    // The tracker only ends if the xDS server is gone; reconciling goes on without it
    // (the backoff timer alone then paces verification).
    let tracker = async {
        tracker.await;
        std::future::pending::<()>().await;
    };
    // Nor does collecting orphans end reconciling, should it stop.
    let orphans = async {
        collect_orphans(orphans).await;
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = reconciling => {}
        () = tracker => {}
        () = orphans => {}
    }
}

fn error_policy(route: Arc<TrafficRoute>, error: &Error, ctx: Arc<Context>) -> Action {
    let (kind, after) = error.policy();
    ctx.settings
        .metrics
        .reconcile_failures
        .get_or_create(&ErrorLabel { error: kind })
        .inc();
    warn!(route = %route.name_any(), %error, kind, ?after, "will retry");
    Action::requeue(after)
}
