//! The shift reconciler, run by the leader only: for each TrafficRoute, performs the steps
//! [`shift::next_step`] decides — writes ProxyConfigs, probes every Envoy — and hands the
//! resulting status to the status writer.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::address_map::AddressMap;
use super::index::{Scope, WatchBackoff, Watched};
use super::resolve::{ResolvedRoute, RouteError, resolve_route};
use super::shift::{Observed, Step, Verified, next_step};
use super::status::{StatusWriter, condition};
use super::tls_secrets::{SecretTrouble, secret_troubles};
use super::to_model::{SERVICE_NAME_LABEL, endpoint_probe_id};
use crate::api::traffic_route::EnvoyProgress;
use crate::api::{ProxyConfig, ProxyConfigRole, ProxyConfigSpec, TrafficRoute, TrafficRouteStatus};
use crate::duration;
use crate::model::{Config as ModelConfig, ListenerSettings, TlsSecret, trial_id};
use crate::prober::{FleetResult, Prober};
use crate::translate::{EVERY_ROUTE, Problem, REFUSED_BY_ENVOY, translate};
use crate::xds::snapshot::{ROUTE, short_type};
use crate::xds::{NodeReport, Nodes};
use switchyard_core::route::lower;

pub const FIELD_MANAGER: &str = "switchyard";
const PROMOTED_AT: &str = "switchyard.dev/promoted-at";
const DEFAULT_DRAIN: Duration = Duration::from_secs(10);
/// The Ready reason (and Event reason) while an Envoy rejects the route's configuration.
const ENVOY_REJECTED: &str = "EnvoyRejected";
/// How long one reconcile keeps re-probing before it hands the wait to the controller's
/// requeue (and publishes why it waits): long enough for Envoys to take a configuration
/// push, short enough that a stuck rollout reports promptly.
const VERIFY_IN_PASS: Duration = Duration::from_millis(200);

/// How the leader rolls routes out.
pub struct Settings {
    pub scope: Scope,
    /// The Service whose ready endpoints are the Envoy fleet: (namespace, name).
    pub envoy_service: (String, String),
    pub address_map: Option<AddressMap>,
    pub prober: Prober,
    /// Status writes per second at most.
    pub status_qps: f64,
    /// Off only for tests that prove the two phases matter.
    pub two_phase: bool,
    /// What this replica's snapshot builder left out, to explain stuck rollouts.
    pub problems: tokio::sync::watch::Receiver<Vec<Problem>>,
    /// Envoys connected to this replica, to report their NACKs.
    pub nodes: Nodes,
}

struct Context {
    client: Client,
    /// Every ProxyConfig, to keep a route from taking a host another route serves.
    proxy_configs: Watched<ProxyConfig>,
    settings: Settings,
    status: StatusWriter,
    services: Watched<Service>,
    fleet: Watched<EndpointSlice>,
    recorder: Recorder,
    /// Consecutive unsuccessful verifications per route, for the requeue backoff; its keys
    /// are the routes waiting on the fleet.
    attempts: Arc<Mutex<HashMap<(String, String), u32>>>,
    /// The controller's own view of TrafficRoutes, to notice a newer generation.
    routes: Store<TrafficRoute>,
    /// The snapshot version every Envoy connected here has acknowledged, see
    /// [`track_convergence`].
    converged: watch::Receiver<Option<String>>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing ProxyConfig {name}: {source}")]
    Write { name: String, source: kube::Error },
    #[error("reading ProxyConfigs of {route}: {source}")]
    Read { route: String, source: kube::Error },
}

/// Runs until the returned future is dropped (when leadership is lost).
pub async fn run(client: Client, settings: Settings) {
    let changes = Arc::new(tokio::sync::watch::channel(0).0);
    let services = Watched::start(
        settings.scope.apis(&client),
        watcher::Config::default(),
        &changes,
    );
    let proxy_configs = Watched::start(
        settings.scope.apis(&client),
        watcher::Config::default(),
        &changes,
    );
    let (fleet_ns, fleet_name) = settings.envoy_service.clone();
    let fleet = Watched::start(
        vec![Api::<EndpointSlice>::namespaced(client.clone(), &fleet_ns)],
        watcher::Config::default().labels(&format!("{SERVICE_NAME_LABEL}={fleet_name}")),
        &changes,
    );
    // Deciding on empty stores would resolve against no Services and verify against no
    // Envoys: wait for every initial list first.
    if !(services.ready().await && proxy_configs.ready().await && fleet.ready().await) {
        warn!("a watcher stopped before its initial list; not reconciling");
        return;
    }
    let routes: Api<TrafficRoute> = match &settings.scope {
        Scope::Namespaces(list) if list.len() == 1 => Api::namespaced(client.clone(), &list[0]),
        // One controller for several namespaces watches them all; the list is short.
        _ => Api::all(client.clone()),
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "switchyard".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let controller = Controller::new(routes, watcher::Config::default());
    let route_store = controller.store();
    let (converged_tx, converged) = watch::channel(None);
    let tracker = track_convergence(settings.nodes.clone(), converged_tx);
    let context = Arc::new(Context {
        proxy_configs,
        status: StatusWriter::start(client.clone(), settings.status_qps),
        client: client.clone(),
        settings,
        services,
        fleet,
        recorder,
        attempts: Arc::default(),
        routes: route_store.clone(),
        converged,
    });
    let orphans = context.clone();
    let waiting = wake_waiting(context.converged.clone(), context.attempts.clone());
    let secrets = wake_on_secret_troubles(context.settings.problems.clone());
    let reconciling = controller
        // A watch that failed (the API server restarted, say) retries within a second, so
        // rollouts go on as soon as the API is back.
        .trigger_backoff(WatchBackoff::default())
        .reconcile_on(waiting)
        // A TLS Secret deleted, broken or back changes what its routes' status says, and
        // nothing else would reconcile them.
        .reconcile_on(secrets)
        // A ProxyConfig event reconciles its route, and every route asking for one of its
        // hosts: when a route goes, or comes, which of them gets a host may change.
        .watches(
            Api::<ProxyConfig>::all(client.clone()),
            watcher::Config::default(),
            {
                let route_store = route_store.clone();
                move |pc| {
                    let namespace = pc.namespace().unwrap_or_default();
                    let owner = ObjectRef::new(&pc.spec.route).within(&namespace);
                    let hosts = pc
                        .spec
                        .virtual_host
                        .as_ref()
                        .map(|vh| vh.hosts.clone())
                        .unwrap_or_default();
                    let sharing = route_store
                        .state()
                        .into_iter()
                        .filter(|r| shares_a_host(r, &hosts))
                        .map(|r| ObjectRef::from_obj(r.as_ref()));
                    std::iter::once(owner).chain(sharing).collect::<Vec<_>>()
                }
            },
        )
        // A Service change may resolve (or break) every route of its namespace.
        .watches(
            Api::<Service>::all(client),
            watcher::Config::default(),
            move |service| {
                let namespace = service.namespace();
                route_store
                    .state()
                    .into_iter()
                    .filter(move |r| r.namespace() == namespace)
                    .map(|r| ObjectRef::from_obj(r.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
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

/// Whether the route asks for one of `hosts`.
fn shares_a_host(route: &TrafficRoute, hosts: &[String]) -> bool {
    route
        .spec
        .route
        .hosts
        .iter()
        .any(|h| hosts.iter().any(|o| o.eq_ignore_ascii_case(h)))
}

/// Deletes the ProxyConfigs of routes that are gone, as Kubernetes' garbage collector
/// does (and where it does not run, as on a node-less test rig): the snapshot builders
/// keep a deleted live one for a while as leaving, so another route can take its hosts
/// over without a gap. Runs until dropped.
async fn collect_orphans(ctx: Arc<Context>) {
    // An empty route store would make every ProxyConfig look orphaned.
    if ctx.routes.wait_until_ready().await.is_err() {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        for pc in ctx.proxy_configs.state() {
            let namespace = pc.namespace().unwrap_or_default();
            let route = ObjectRef::<TrafficRoute>::new(&pc.spec.route).within(&namespace);
            if ctx.routes.get(&route).is_some() || pc.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let api: Api<ProxyConfig> = Api::namespaced(ctx.client.clone(), &namespace);
            let params = DeleteParams {
                preconditions: pc.uid().map(|uid| kube::api::Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&pc.name_any(), &params).await {
                Ok(_) => {
                    info!(%namespace, proxy_config = %pc.name_any(), "route gone: ProxyConfig deleted")
                }
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(error) => {
                    warn!(%namespace, proxy_config = %pc.name_any(), %error, "cannot delete an orphaned ProxyConfig")
                }
            }
        }
    }
}

/// The routes waiting on the fleet, each time the Envoys connected here converge on a new
/// snapshot: new endpoints, a new probe or live config may be what they wait for, and
/// their requeue timer may be seconds away.
fn wake_waiting(
    converged: watch::Receiver<Option<String>>,
    attempts: Arc<Mutex<HashMap<(String, String), u32>>>,
) -> impl futures::Stream<Item = ObjectRef<TrafficRoute>> + Send + 'static {
    futures::stream::unfold(converged, move |mut converged| {
        let attempts = attempts.clone();
        async move {
            converged.changed().await.ok()?;
            let waiting: Vec<ObjectRef<TrafficRoute>> = attempts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .keys()
                .map(|(namespace, name)| ObjectRef::new(name).within(namespace))
                .collect();
            Some((futures::stream::iter(waiting), converged))
        }
    })
    .flatten()
}

/// The routes whose TLS Secret troubles (as this replica's snapshot builder sees them)
/// appeared, changed or went, each time the builder's problems change.
fn wake_on_secret_troubles(
    problems: watch::Receiver<Vec<Problem>>,
) -> impl futures::Stream<Item = ObjectRef<TrafficRoute>> + Send + 'static {
    use std::collections::BTreeSet;
    let troubles = |problems: &[Problem]| -> BTreeSet<(String, String)> {
        problems
            .iter()
            .filter(|p| p.message.starts_with(super::tls_secrets::SECRET_PROBLEM))
            .map(|p| (p.virtual_host.clone(), p.message.clone()))
            .collect()
    };
    let before = troubles(&problems.borrow());
    futures::stream::unfold(
        (problems, before),
        move |(mut problems, before)| async move {
            problems.changed().await.ok()?;
            let now = troubles(&problems.borrow_and_update());
            let routes: BTreeSet<String> = before
                .symmetric_difference(&now)
                .map(|(route, _)| route.clone())
                .collect();
            let refs: Vec<ObjectRef<TrafficRoute>> = routes
                .iter()
                .filter_map(|id| id.split_once('/'))
                .map(|(namespace, name)| ObjectRef::new(name).within(namespace))
                .collect();
            Some((futures::stream::iter(refs), (problems, now)))
        },
    )
    .flatten()
}

/// Publishes the snapshot version once every Envoy connected to this replica holds it,
/// acknowledged: the moment a probe of those Envoys can change its answer. Envoys
/// connected to other replicas are not seen here; for them the backoff timer stands in.
async fn track_convergence(nodes: Nodes, converged: watch::Sender<Option<String>>) {
    let mut changes = nodes.changes();
    loop {
        if let Some(version) = converged_version(&nodes.list()) {
            converged.send_if_modified(|current| {
                if current.as_deref() == Some(version.as_str()) {
                    return false;
                }
                debug!(%version, "every Envoy connected here holds the snapshot");
                *current = Some(version);
                true
            });
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// The snapshot version every node holds and acknowledged, if they all agree on one.
fn converged_version(nodes: &[NodeReport]) -> Option<String> {
    let mut versions = nodes.iter().map(|n| {
        n.status
            .desired_version
            .clone()
            .filter(|_| n.status.synced && !n.status.blocked_by_nack)
    });
    let first = versions.next()??;
    versions
        .all(|v| v.as_deref() == Some(first.as_str()))
        .then_some(first)
}

fn error_policy(_route: Arc<TrafficRoute>, error: &Error, _context: Arc<Context>) -> Action {
    warn!(%error, "will retry");
    Action::requeue(Duration::from_secs(2))
}

impl Context {
    /// Ready endpoints of the Envoy Service, as addresses the prober can reach.
    fn envoys(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .fleet
            .state()
            .iter()
            .flat_map(|slice| {
                slice
                    .endpoints
                    .iter()
                    .flatten()
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
            .flat_map(|e| e.addresses)
            .map(|a| self.settings.address_map.map_or(a.clone(), |m| m.map(&a)))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    fn backoff(&self, key: &(String, String)) -> Duration {
        let mut attempts = self.attempts.lock().unwrap_or_else(|p| p.into_inner());
        let n = attempts.entry(key.clone()).or_insert(0);
        *n = (*n + 1).min(8);
        Duration::from_millis(20 << (*n - 1)).min(Duration::from_secs(2))
    }

    fn progressed(&self, key: &(String, String)) {
        self.attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// A newer generation of the route arrived (or it is gone): this pass should end.
    fn superseded(&self, route: &TrafficRoute) -> bool {
        self.routes
            .get(&ObjectRef::from_obj(route))
            .is_none_or(|r| r.metadata.generation != route.metadata.generation)
    }
}

/// How a verification within one reconcile ended.
enum Verification {
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
async fn verify<F, Fut>(ctx: &Context, route: &TrafficRoute, check: F) -> Verification
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

async fn reconcile(route: Arc<TrafficRoute>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = route.namespace().unwrap_or_default();
    let name = route.name_any();
    let generation = route.metadata.generation.unwrap_or(0);
    debug!(route = %format!("{namespace}/{name}"), generation, "reconcile");
    let services = ctx.services.state();
    let in_namespace: Vec<&Service> = services
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace.as_str()))
        .map(Arc::as_ref)
        .collect();
    let resolved = resolve_route(&route, &in_namespace).and_then(|r| admit(&ctx, &route, r));

    let api: Api<ProxyConfig> = Api::namespaced(ctx.client.clone(), &namespace);
    let read = |e| Error::Read {
        route: format!("{namespace}/{name}"),
        source: e,
    };
    let (live_pc, probe_pc) = (live_name(&name), probe_name(&name));
    let (live, probe) = tokio::join!(api.get_opt(&live_pc), api.get_opt(&probe_pc));
    let (mut live, mut probe) = (live.map_err(read)?, probe.map_err(read)?);
    let drain = route
        .spec
        .rollout
        .as_ref()
        .and_then(|r| r.drain_period.as_deref())
        .and_then(|d| duration::parse(d).ok())
        .unwrap_or(DEFAULT_DRAIN);
    let mut verified = Verified::default();
    let mut report = Report::new(&route, generation);

    for _ in 0..8 {
        let since_promoted = live.as_ref().and_then(promoted_ago);
        let step = next_step(
            &Observed {
                route: &name,
                generation,
                resolved: &resolved,
                live: live.as_ref().map(|p| &p.spec),
                probe: probe.as_ref().map(|p| &p.spec),
                since_promoted,
                drain_period: drain,
                two_phase: ctx.settings.two_phase,
                created: route.metadata.creation_timestamp.as_ref(),
            },
            &verified,
        );
        match step {
            Step::Reject(error) => {
                report.rejected(&error, live.as_ref());
                publish(
                    &ctx,
                    &route,
                    &report,
                    Some((error.reason(), error.to_string())),
                )
                .await;
                return Ok(Action::requeue(Duration::from_secs(300)));
            }
            Step::Stage(spec) => {
                let written = apply(&ctx, &route, &probe_pc, spec, None).await;
                match written {
                    Ok(pc) => probe = Some(pc),
                    Err(error) => {
                        return refuse(&ctx, &route, &mut report, live.as_ref(), error).await;
                    }
                }
                debug!(route = %name, generation, "probe config written");
                report.phase("Staging", "staging new clusters on every Envoy");
            }
            Step::VerifyEndpoints { probe_version } => {
                let id = endpoint_probe_id(&namespace, &name, &probe_version);
                let trial = trial_id(&format!("{namespace}/{name}"));
                let prober = &ctx.settings.prober;
                let check = |envoys: Vec<String>| {
                    let (id, trial, version) = (&id, &trial, &probe_version);
                    async move { prober.check_staged(&envoys, id, trial, version).await }
                };
                let (result, after) = match verify(&ctx, &route, check).await {
                    Verification::Passed(_) => {
                        verified.endpoints = Some(probe_version);
                        continue;
                    }
                    Verification::Waiting(result, after) => (result, after),
                    Verification::Superseded => return Ok(Action::requeue(Duration::ZERO)),
                };
                let waiting = (
                    "VerifyingEndpoints",
                    "new clusters not ready, or routes on trial not accepted, on every Envoy",
                );
                return Ok(
                    requeue_waiting(&ctx, &route, &mut report, waiting, &result, after).await,
                );
            }
            Step::Promote(spec) => {
                let first = live.as_ref().is_none_or(|l| l.spec.version != spec.version);
                // The promotion time starts the drain period; a metadata-only promotion keeps it.
                let promoted_at = match (first, live.as_ref()) {
                    (false, Some(l)) => l.annotations().get(PROMOTED_AT).cloned(),
                    _ => Some(k8s_openapi::jiff::Timestamp::now().to_string()),
                };
                let written = apply(&ctx, &route, &live_pc, spec, promoted_at).await;
                match written {
                    Ok(pc) => live = Some(pc),
                    Err(error) => {
                        return refuse(&ctx, &route, &mut report, live.as_ref(), error).await;
                    }
                }
                debug!(route = %name, generation, "live config written");
                report.phase("VerifyingLive", "new routes sent to every Envoy");
                if first {
                    info!(route = %format!("{namespace}/{name}"), generation, "promoted");
                }
            }
            Step::VerifyLive { version } => {
                let id = format!("{namespace}/{name}");
                let prober = &ctx.settings.prober;
                let check = |envoys: Vec<String>| {
                    let (id, version) = (&id, &version);
                    async move { prober.check_version(&envoys, id, version).await }
                };
                let (result, after) = match verify(&ctx, &route, check).await {
                    Verification::Passed(result) => {
                        report.ready(live.as_ref(), &result);
                        verified.live = Some(version);
                        continue;
                    }
                    Verification::Waiting(result, after) => (result, after),
                    Verification::Superseded => return Ok(Action::requeue(Duration::ZERO)),
                };
                let waiting = ("VerifyingLive", "new routes not served by every Envoy yet");
                return Ok(
                    requeue_waiting(&ctx, &route, &mut report, waiting, &result, after).await,
                );
            }
            Step::Collect { after } => {
                if !after.is_zero() {
                    report.draining();
                    report.secrets(&ctx.secret_troubles(&route));
                    publish(
                        &ctx,
                        &route,
                        &report,
                        Some(("Ready", "served by every Envoy".into())),
                    )
                    .await;
                    return Ok(Action::requeue(after));
                }
                let deleted = api.delete(&probe_pc, &DeleteParams::default()).await;
                if let Err(e) = deleted
                    && !matches!(&e, kube::Error::Api(s) if s.code == 404)
                {
                    return Err(Error::Write {
                        name: probe_pc.clone(),
                        source: e,
                    });
                }
                probe = None;
            }
            Step::Done => {
                report.done();
                report.secrets(&ctx.secret_troubles(&route));
                publish(
                    &ctx,
                    &route,
                    &report,
                    Some(("Ready", "served by every Envoy".into())),
                )
                .await;
                return Ok(Action::requeue(Duration::from_secs(300)));
            }
        }
    }
    publish(&ctx, &route, &report, None).await;
    Ok(Action::requeue(Duration::from_millis(20)))
}

/// The oldest route asking for one of this route's hosts, if it is older than this one:
/// (host, "namespace/name"). Age is creationTimestamp, then namespace/name, as the Gateway
/// API orders conflicts: the same answer on every replica, whatever came first. Creation
/// times count in seconds, so between routes created in the same second the one serving
/// the host keeps it before names decide: a route created right after another never takes
/// its host for its name. A route being deleted, or one whose spec does not resolve, asks
/// for nothing.
fn older_claimant(
    ctx: &Context,
    route: &TrafficRoute,
    resolved: &ResolvedRoute,
) -> Option<(String, String)> {
    let namespace = route.metadata.namespace.as_deref().unwrap_or_default();
    let name = route.metadata.name.as_deref().unwrap_or_default();
    let live = ctx.proxy_configs.state();
    let serves = |ns: &str, route: &str, host: &str| {
        live.iter().any(|pc| {
            pc.spec.role == ProxyConfigRole::Live
                && pc.spec.route == route
                && pc.namespace().as_deref() == Some(ns)
                && pc
                    .spec
                    .virtual_host
                    .as_ref()
                    .is_some_and(|vh| vh.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)))
        })
    };
    let services = ctx.services.state();
    let mut claimants: Vec<(Seniority<'_>, String, &TrafficRoute)> = Vec::new();
    let routes = ctx.routes.state();
    for other in &routes {
        let other_ns = other.metadata.namespace.as_deref().unwrap_or_default();
        let other_name = other.metadata.name.as_deref().unwrap_or_default();
        if (other_ns == namespace && other_name == name)
            || other.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        let Some(host) = resolved.virtual_host.hosts.iter().find(|h| {
            other
                .spec
                .route
                .hosts
                .iter()
                .any(|o| o.eq_ignore_ascii_case(h))
        }) else {
            continue;
        };
        let me = seniority(
            route.metadata.creation_timestamp.as_ref(),
            serves(namespace, name, host),
            namespace,
            name,
        );
        let age = seniority(
            other.metadata.creation_timestamp.as_ref(),
            serves(other_ns, other_name, host),
            other_ns,
            other_name,
        );
        if age < me {
            claimants.push((age, host.clone(), other.as_ref()));
        }
    }
    claimants.sort_by(|a, b| a.0.cmp(&b.0));
    claimants.into_iter().find_map(|(_, host, other)| {
        let other_ns = other.namespace().unwrap_or_default();
        let in_namespace: Vec<&Service> = services
            .iter()
            .filter(|s| s.namespace().as_deref() == Some(other_ns.as_str()))
            .map(Arc::as_ref)
            .collect();
        resolve_route(other, &in_namespace)
            .is_ok()
            .then(|| (host, format!("{other_ns}/{}", other.name_any())))
    })
}

/// Older first: creation time (unknown counts as newest), then serving the host, then
/// namespace, then name.
type Seniority<'a> = (bool, Option<&'a Time>, bool, &'a str, &'a str);

fn seniority<'a>(
    created: Option<&'a Time>,
    serves: bool,
    namespace: &'a str,
    name: &'a str,
) -> Seniority<'a> {
    (created.is_none(), created, !serves, namespace, name)
}

/// Checks that need more than the route's own spec: no host taken from another route, and
/// nothing Envoy would refuse (the translator's verdict on the route alone).
fn admit(
    ctx: &Context,
    route: &TrafficRoute,
    resolved: ResolvedRoute,
) -> Result<ResolvedRoute, RouteError> {
    if let Some((host, route)) = older_claimant(ctx, route, &resolved) {
        return Err(RouteError::HostConflict { host, route });
    }
    let namespace = route.metadata.namespace.as_deref().unwrap_or_default();
    let name = route.metadata.name.as_deref().unwrap_or_default();
    // The translator's verdict on the route alone, lowered as it would serve live. TLS
    // Secrets are checked where they are read; here only the spec is judged.
    let part = lower::live(&lower::Live {
        namespace,
        route: name,
        version: &resolved.version,
        virtual_host: &resolved.virtual_host,
        clusters: &resolved.clusters,
        created: None,
        leaving: false,
    });
    let mut problems = part.problems.clone();
    let config = ModelConfig {
        listeners: ListenerSettings {
            probe_token: "admission".into(),
            ..ListenerSettings::default()
        },
        virtual_hosts: part.virtual_host.into_iter().collect(),
        clusters: part
            .clusters
            .into_iter()
            .map(|(name, namespace, cluster)| lower::cluster(name, &namespace, &cluster, vec![]))
            .collect(),
        secrets: part
            .secret
            .iter()
            .map(|(namespace, secret)| TlsSecret {
                name: lower::secret_name(namespace, secret),
                certificate_chain: "-".into(),
                private_key: "-".into(),
            })
            .collect(),
        version_probes: part.version_probe.into_iter().collect(),
        endpoint_probes: Vec::new(),
    };
    problems.extend(translate(&config).problems);
    let id = format!("{namespace}/{name}");
    match problems.into_iter().find(|p| p.virtual_host == id) {
        Some(problem) => Err(RouteError::Rejected {
            message: problem.message,
        }),
        None => Ok(resolved),
    }
}

impl Context {
    /// What this replica's snapshot builder says of the route's TLS Secret.
    fn secret_troubles(&self, route: &TrafficRoute) -> Vec<SecretTrouble> {
        let id = format!(
            "{}/{}",
            route.namespace().unwrap_or_default(),
            route.name_any()
        );
        secret_troubles(&self.settings.problems.borrow(), &id)
    }

    /// Why a rollout may be stuck: what the snapshot builder left out of this route (its
    /// routes on trial among it, when an Envoy rejected them), and Envoys (connected here)
    /// that rejected other configuration. A rejected route configuration is the builder's
    /// to blame on one route; told here, it would be every route's.
    fn troubles(&self, key: &(String, String)) -> Vec<String> {
        let id = format!("{}/{}", key.0, key.1);
        let mut out: Vec<String> = self
            .settings
            .problems
            .borrow()
            .iter()
            .filter(|p| p.virtual_host == id || p.virtual_host == EVERY_ROUTE)
            .map(|p| {
                if p.message.starts_with("Envoy ") {
                    p.message.clone()
                } else {
                    format!("left out: {}", p.message)
                }
            })
            .collect();
        for node in self.settings.nodes.list() {
            for (kind, t) in &node.status.types {
                if let Some(nack) = &t.last_nack
                    && node.status.blocked_by_nack
                    && kind != short_type(ROUTE)
                {
                    out.push(format!(
                        "Envoy {} rejected {kind}: {}",
                        node.node_id, nack.error
                    ));
                }
            }
        }
        out
    }
}

fn live_name(route: &str) -> String {
    format!("{route}-live")
}

fn probe_name(route: &str) -> String {
    format!("{route}-probe")
}

fn promoted_ago(pc: &ProxyConfig) -> Option<Duration> {
    let text = pc.annotations().get(PROMOTED_AT)?;
    let at: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    let ago = k8s_openapi::jiff::Timestamp::now().duration_since(at);
    Duration::try_from(ago).ok()
}

/// Server-side applies a ProxyConfig owned by the route.
async fn apply(
    ctx: &Context,
    route: &TrafficRoute,
    name: &str,
    spec: ProxyConfigSpec,
    promoted_at: Option<String>,
) -> Result<ProxyConfig, Error> {
    let namespace = route.namespace().unwrap_or_default();
    let api: Api<ProxyConfig> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut pc = ProxyConfig::new(name, spec);
    pc.metadata.owner_references = route.controller_owner_ref(&()).map(|o| vec![o]);
    pc.metadata.labels = Some([("switchyard.dev/route".to_string(), route.name_any())].into());
    pc.metadata.annotations = promoted_at.map(|at| [(PROMOTED_AT.to_string(), at)].into());
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&pc),
    )
    .await
    .map_err(|source| Error::Write {
        name: name.to_string(),
        source,
    })
}

/// A ProxyConfig write the API server refuses as invalid fails the same way every time:
/// the route is told (status, Event) and asked again only after a while or a change,
/// instead of retried every few seconds without a word. Any other error is retried.
async fn refuse(
    ctx: &Context,
    route: &TrafficRoute,
    report: &mut Report,
    live: Option<&ProxyConfig>,
    error: Error,
) -> Result<Action, Error> {
    let Error::Write {
        name,
        source: kube::Error::Api(status),
    } = &error
    else {
        return Err(error);
    };
    if !matches!(status.code, 400 | 413 | 422) {
        return Err(error);
    }
    let refused = RouteError::WriteRefused {
        name: name.clone(),
        message: status.message.clone(),
    };
    warn!(route = %route.name_any(), %refused, "cannot write the route's ProxyConfig");
    report.rejected(&refused, live);
    publish(
        ctx,
        route,
        report,
        Some((refused.reason(), refused.to_string())),
    )
    .await;
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// The status being built during one reconcile.
struct Report {
    previous: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    generation: i64,
    status: TrafficRouteStatus,
    accepted: (bool, String, String),
    ready: (bool, String, String),
    progressing: (bool, String, String),
}

impl Report {
    fn new(route: &TrafficRoute, generation: i64) -> Self {
        let previous = route
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let status = TrafficRouteStatus {
            observed_generation: Some(generation),
            live_generation: route.status.as_ref().and_then(|s| s.live_generation),
            ..TrafficRouteStatus::default()
        };
        Self {
            previous,
            generation,
            status,
            accepted: (true, "Accepted".into(), "spec resolved".into()),
            ready: (false, "Progressing".into(), "rolling out".into()),
            progressing: (true, "Progressing".into(), "rolling out".into()),
        }
    }

    fn phase(&mut self, phase: &str, message: &str) {
        self.status.phase = Some(phase.into());
        self.ready = (false, phase.into(), message.into());
        self.progressing = (true, phase.into(), message.into());
    }

    fn waiting(&mut self, phase: &str, message: &str, result: &FleetResult) {
        let lagging: Vec<String> = result
            .lagging
            .iter()
            .take(10)
            .map(|(envoy, why)| format!("{envoy}: {why}"))
            .collect();
        let detail = format!(
            "{message}: Envoys ready {}/{}; waiting for {}",
            result.ready.len(),
            result.total(),
            lagging.join(", ")
        );
        self.phase(phase, &detail);
        self.status.envoys = Some(progress(result, lagging));
    }

    /// Adds reasons a rollout is stuck; an Envoy's NACK becomes the condition's reason.
    fn explain(&mut self, troubles: &[String]) {
        if troubles.is_empty() {
            return;
        }
        // Envoy's own words come first: they say what to fix.
        let detail = if troubles.iter().any(|t| t.starts_with("Envoy ")) {
            self.ready.1 = ENVOY_REJECTED.into();
            format!("{}; {}", troubles.join("; "), self.ready.2)
        } else {
            format!("{}; {}", self.ready.2, troubles.join("; "))
        };
        self.ready.2 = detail.clone();
        self.progressing.2 = detail;
    }

    fn rejected(&mut self, error: &RouteError, live: Option<&ProxyConfig>) {
        let reason = error.reason();
        let mut message = error.to_string();
        if let Some(live) = live {
            message.push_str(&format!(
                "; generation {} keeps serving",
                live.spec.generation
            ));
        }
        self.status.phase = Some("Rejected".into());
        self.accepted = (false, reason.into(), message.clone());
        self.ready = (false, reason.into(), message.clone());
        self.progressing = (false, reason.into(), message);
    }

    fn ready(&mut self, live: Option<&ProxyConfig>, result: &FleetResult) {
        self.status.live_generation = live.map(|l| l.spec.generation);
        self.status.envoys = Some(progress(result, Vec::new()));
        let message = format!(
            "served by every Envoy ({}/{})",
            result.ready.len(),
            result.total()
        );
        self.ready = (true, "Ready".into(), message);
        self.progressing = (true, "Draining".into(), "old clusters drain".into());
        self.status.phase = Some("Draining".into());
    }

    fn draining(&mut self) {
        self.status.phase = Some("Draining".into());
    }

    /// A route whose TLS Secret is missing or cannot serve: still Ready while its last good
    /// certificate serves, with the reason and the Secret named; not Ready when it is left
    /// out.
    fn secrets(&mut self, troubles: &[SecretTrouble]) {
        if troubles.is_empty() {
            return;
        }
        let reason = if troubles.iter().any(|t| t.missing) {
            "SecretNotFound"
        } else {
            "InvalidSecret"
        };
        let messages: Vec<&str> = troubles.iter().map(|t| t.message.as_str()).collect();
        let served = self.ready.0 && troubles.iter().all(|t| t.kept);
        self.ready = (
            served,
            reason.into(),
            format!("{}; {}", self.ready.2, messages.join("; ")),
        );
    }

    fn done(&mut self) {
        self.status.phase = Some("Ready".into());
        if !self.ready.0 {
            self.ready = (true, "Ready".into(), "served by every Envoy".into());
        }
        self.progressing = (false, "Ready".into(), "rollout complete".into());
    }

    fn build(&self) -> TrafficRouteStatus {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut status = self.status.clone();
        let make = |type_: &str, (ok, reason, message): &(bool, String, String)| {
            condition(
                &self.previous,
                type_,
                *ok,
                reason,
                message,
                self.generation,
                &now,
            )
        };
        status.conditions = vec![
            make("Accepted", &self.accepted),
            make("Ready", &self.ready),
            make("Progressing", &self.progressing),
        ];
        status
    }
}

fn progress(result: &FleetResult, lagging: Vec<String>) -> EnvoyProgress {
    EnvoyProgress {
        ready: i32::try_from(result.ready.len()).unwrap_or(i32::MAX),
        total: i32::try_from(result.total()).unwrap_or(i32::MAX),
        lagging,
    }
}

/// A verification that is not done yet: says why in the status and asks to be reconciled
/// again after `after`.
async fn requeue_waiting(
    ctx: &Context,
    route: &TrafficRoute,
    report: &mut Report,
    (phase, message): (&str, &str),
    result: &FleetResult,
    after: Duration,
) -> Action {
    report.waiting(phase, message, result);
    let key = (route.namespace().unwrap_or_default(), route.name_any());
    let troubles = ctx.troubles(&key);
    report.explain(&troubles);
    // An Envoy's NACK is told once, when it becomes the reason the rollout waits.
    let event =
        (report.ready.1 == ENVOY_REJECTED).then(|| (ENVOY_REJECTED, report.ready.2.clone()));
    publish(ctx, route, report, event).await;
    // Routes on trial that Envoy refused wait for their own change, which reconciles them:
    // the fleet converging brings them nothing, and hundreds of them probing on every
    // convergence would slow everyone else's rollouts.
    let after = if troubles.iter().any(|t| t.starts_with(REFUSED_BY_ENVOY)) {
        ctx.progressed(&key);
        Duration::from_secs(300)
    } else {
        after
    };
    debug!(route = %key.1, generation = report.generation, ?after, "requeued");
    Action::requeue(after)
}

/// Hands the status to the writer; records an Event when Ready flips, the spec is rejected
/// (under the rejection's reason) or an Envoy rejects the configuration.
async fn publish(
    ctx: &Context,
    route: &TrafficRoute,
    report: &Report,
    event: Option<(&str, String)>,
) {
    let status = report.build();
    let was_ready = report.previous.iter().any(|c| {
        c.type_ == "Ready" && c.status == "True" && c.observed_generation == Some(report.generation)
    });
    let is_ready = report.ready.0;
    ctx.status.set(
        &route.namespace().unwrap_or_default(),
        &route.name_any(),
        status,
    );
    let Some((reason, note)) = event else {
        return;
    };
    let reason_changed = !report.previous.iter().any(|c| {
        c.type_ == "Ready"
            && c.reason == report.ready.1
            && c.observed_generation == Some(report.generation)
    });
    if is_ready && was_ready && !reason_changed {
        return;
    }
    if report.ready.1 == ENVOY_REJECTED && !reason_changed {
        return;
    }
    let rejected_before = report.previous.iter().any(|c| {
        c.type_ == "Accepted"
            && c.status == "False"
            && c.observed_generation == Some(report.generation)
    });
    if !is_ready && rejected_before {
        return;
    }
    // A TLS Secret that went missing or bad is told under its own reason (Warning).
    let secret = matches!(report.ready.1.as_str(), "SecretNotFound" | "InvalidSecret");
    let (reason, note) = if secret {
        (report.ready.1.as_str(), report.ready.2.clone())
    } else {
        (reason, note)
    };
    let event = Event {
        type_: if is_ready && !secret {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason: reason.into(),
        note: Some(note),
        action: "Rollout".into(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &route.object_ref(&())).await {
        warn!(%error, "cannot record an event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::Protocol;
    use crate::xds::session::SessionStatus;

    fn node(stream: u64, version: &str, synced: bool) -> NodeReport {
        NodeReport {
            stream,
            node_id: format!("envoy-{stream}"),
            cluster: "fleet".into(),
            peer: "127.0.0.1:1".into(),
            connected_at: std::time::SystemTime::UNIX_EPOCH,
            status: SessionStatus {
                protocol: Protocol::Delta,
                desired_version: Some(version.into()),
                synced,
                blocked_by_nack: false,
                types: Default::default(),
            },
        }
    }

    #[test]
    fn the_fleet_converges_only_when_every_node_holds_the_same_snapshot() {
        assert_eq!(converged_version(&[]), None, "no node, nothing to wake on");
        let both = [node(1, "v2", true), node(2, "v2", true)];
        assert_eq!(converged_version(&both).as_deref(), Some("v2"));
        let moving = [node(1, "v2", true), node(2, "v2", false)];
        assert_eq!(converged_version(&moving), None, "one still moving");
        let apart = [node(1, "v2", true), node(2, "v1", true)];
        assert_eq!(
            converged_version(&apart),
            None,
            "synced to different snapshots"
        );
    }

    #[test]
    fn an_envoy_nack_becomes_the_reason_a_rollout_waits() {
        let route = TrafficRoute::new("web", Default::default());
        let mut report = Report::new(&route, 2);
        let result = FleetResult {
            ready: vec!["10.0.0.1".into()],
            lagging: vec![("10.0.0.2".into(), "serves version \"old\"".into())],
        };
        report.waiting(
            "VerifyingLive",
            "new routes not served by every Envoy yet",
            &result,
        );
        report.explain(&["Envoy envoy-b rejected RouteConfiguration: bad route".to_string()]);
        let status = report.build();
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .expect("Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "EnvoyRejected")
        );
        assert!(
            ready.message.contains("Envoys ready 1/2"),
            "{}",
            ready.message
        );
        assert!(
            ready
                .message
                .contains("envoy-b rejected RouteConfiguration: bad route"),
            "{}",
            ready.message
        );
        assert_eq!(status.envoys.map(|e| (e.ready, e.total)), Some((1, 2)));
    }
}
