//! What wakes a route besides its own changes: the fleet converging on a snapshot, a TLS
//! Secret going bad or coming back, a ProxyConfig left without its route.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{Context, is_others};
use crate::api::TrafficRoute;
use crate::k8s::built_from::Awaited;
use crate::k8s::convergence::Convergence;
use crate::k8s::fleet_report::FleetView;
use crate::rollout::fleet::FleetChanges;
use crate::translate::{Cause, Problem};

/// Deletes the ProxyConfigs of routes that are gone, as Kubernetes' garbage collector
/// does (and where it does not run, as on a node-less test rig): the snapshot builders
/// keep a deleted live one for a while as leaving, so another route can take its hosts
/// over without a gap. Runs until dropped.
pub(super) async fn collect_orphans(ctx: Arc<Context>) {
    // An empty route store would make every ProxyConfig look orphaned.
    if ctx.routes.wait_until_ready().await.is_err() {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        for pc in ctx.proxy_configs.store().state() {
            let namespace = pc.namespace().unwrap_or_default();
            let route = ObjectRef::<TrafficRoute>::new(&pc.spec.route).within(&namespace);
            // A Gateway's are the Gateway controller's to collect.
            if ctx.routes.get(&route).is_some()
                || pc.metadata.deletion_timestamp.is_some()
                || is_others(&pc)
            {
                continue;
            }
            // Only as this replica saw it: a ProxyConfig rewritten since (by a route
            // that came back) is the next look's business.
            let name = pc.name_any();
            let deleted = ctx.proxy_configs.delete(&namespace, &name, Some(&pc)).await;
            // The route is gone: nothing needs what the API server said of its configs.
            ctx.proxy_configs.forget(&(namespace.clone(), name));
            match deleted {
                Ok(()) => {
                    info!(%namespace, proxy_config = %pc.name_any(), "route gone: ProxyConfig deleted")
                }
                Err(error) if error.is_conflict() => {}
                Err(error) => {
                    warn!(%namespace, proxy_config = %pc.name_any(), %error, "cannot delete an orphaned ProxyConfig")
                }
            }
        }
    }
}

/// The routes waiting on the fleet for which the snapshot every Envoy connected here now
/// serves has news (their configuration, or new endpoints of their Services: what
/// may change the answer, while their requeue timer may be seconds away). A route whose
/// wait is not known is woken at every convergence.
pub(super) fn wake_on_news(
    ctx: Arc<Context>,
) -> impl futures::Stream<Item = ObjectRef<TrafficRoute>> + Send + 'static {
    futures::stream::unfold(ctx.converged.clone(), move |mut converged| {
        let ctx = ctx.clone();
        async move {
            converged.changed().await.ok()?;
            let version = converged.borrow_and_update().clone();
            forget_routes_gone(&ctx);
            let waiting: Vec<(String, String)> = (ctx.attempts.lock())
                .unwrap_or_else(|p| p.into_inner())
                .keys()
                .cloned()
                .collect();
            let asked: HashMap<(String, String), (Awaited, u64)> = (ctx.awaiting.lock())
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(key, asked)| (key.clone(), (asked.awaited.clone(), asked.checked)))
                .collect();
            let woken: Vec<ObjectRef<TrafficRoute>> = waiting
                .into_iter()
                .filter(|key| {
                    asked.get(key).is_none_or(|(awaited, checked)| {
                        ctx.has_news(version.as_deref(), awaited, *checked)
                    })
                })
                .map(|(namespace, name)| ObjectRef::new(&name).within(&namespace))
                .collect();
            Some((futures::stream::iter(woken), converged))
        }
    })
    .flatten()
}

/// Forgets what routes that are gone waited for: nothing else takes a deleted route out.
fn forget_routes_gone(ctx: &Context) {
    let gone = |(namespace, name): &(String, String)| {
        ctx.routes
            .get(&ObjectRef::new(name).within(namespace))
            .is_none()
    };
    (ctx.attempts.lock().unwrap_or_else(|p| p.into_inner())).retain(|key, _| !gone(key));
    (ctx.awaiting.lock().unwrap_or_else(|p| p.into_inner())).retain(|key, _| !gone(key));
    ctx.served.retain(|key| !gone(key));
}

/// The routes waiting on the fleet (the keys of `attempts`), at every change of `changes`
/// (the fleet's addresses, see [`wake_on_fleet_change`]).
fn wake_waiting<T: Send + Sync + 'static>(
    changes: watch::Receiver<T>,
    attempts: Arc<Mutex<HashMap<(String, String), u32>>>,
) -> impl futures::Stream<Item = ObjectRef<TrafficRoute>> + Send + 'static {
    futures::stream::unfold(changes, move |mut changes| {
        let attempts = attempts.clone();
        async move {
            changes.changed().await.ok()?;
            let waiting: Vec<ObjectRef<TrafficRoute>> = attempts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .keys()
                .map(|(namespace, name)| ObjectRef::new(name).within(namespace))
                .collect();
            Some((futures::stream::iter(waiting), changes))
        }
    })
    .flatten()
}

/// The routes waiting on the fleet, at every change of its addresses.
pub(super) fn wake_on_fleet_change(
    changes: &FleetChanges,
    attempts: Arc<Mutex<HashMap<(String, String), u32>>>,
) -> impl futures::Stream<Item = ObjectRef<TrafficRoute>> + Send + 'static {
    wake_waiting(changes.subscribe(), attempts)
}

/// The routes whose TLS Secret troubles (as this replica's snapshot builder sees them)
/// appeared, changed or went, each time the builder's problems change.
pub(super) fn wake_on_secret_troubles(
    problems: watch::Receiver<Vec<Problem>>,
) -> impl futures::Stream<Item = ObjectRef<TrafficRoute>> + Send + 'static {
    use std::collections::BTreeSet;
    let troubles = |problems: &[Problem]| -> BTreeSet<(String, String)> {
        problems
            .iter()
            .filter(|p| matches!(p.cause(), Cause::TlsSecret { .. }))
            .filter_map(|p| Some((p.subject().virtual_host()?, p.message())))
            .map(|(route, message)| (route.to_owned(), message.to_owned()))
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

/// Routes to look at again when the fleet's view changes: those whose refusals appeared,
/// changed or went, and, when NACKs of other configuration did, every route waiting on
/// the fleet (such a NACK holds every rollout back).
pub(super) fn wake_on_fleet_rejections(
    fleet: watch::Receiver<FleetView>,
    attempts: Arc<Mutex<HashMap<(String, String), u32>>>,
) -> impl futures::Stream<Item = ObjectRef<TrafficRoute>> + Send + 'static {
    use std::collections::BTreeSet;
    let before = fleet.borrow().clone();
    futures::stream::unfold((fleet, before), move |(mut fleet, before)| {
        let attempts = attempts.clone();
        async move {
            fleet.changed().await.ok()?;
            let now = fleet.borrow_and_update().clone();
            let mut routes: BTreeSet<(String, String)> = before
                .left_out
                .iter()
                .chain(&now.left_out)
                .filter(|p| !(before.left_out.contains(p) && now.left_out.contains(p)))
                .filter_map(|p| p.subject().virtual_host()?.split_once('/'))
                .map(|(namespace, name)| (namespace.to_owned(), name.to_owned()))
                .collect();
            if before.rejections != now.rejections {
                routes.extend(
                    attempts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .keys()
                        .cloned(),
                );
            }
            let refs: Vec<ObjectRef<TrafficRoute>> = routes
                .into_iter()
                .map(|(namespace, name)| ObjectRef::new(&name).within(&namespace))
                .collect();
            Some((futures::stream::iter(refs), (fleet, now)))
        }
    })
    .flatten()
}

/// Publishes the snapshot every Envoy connected to this replica serves in full, whenever
/// that changes (see [`Convergence`]): the moments a probe of those Envoys can change its
/// answer. None while that is not known: then only asking tells. Envoys connected to other
/// replicas are not seen here; for them the backoff timer stands in, and a last answer
/// kept at most [`super::ANSWER_KEPT`].
pub(super) async fn track_convergence(
    mut changes: watch::Receiver<u64>,
    convergence: Arc<Convergence>,
    converged: watch::Sender<Option<String>>,
) {
    loop {
        let reading = convergence.read();
        converged.send_if_modified(|current| {
            if *current == reading.version {
                return false;
            }
            debug!(version = ?reading.version, "every Envoy connected here serves the snapshot");
            current.clone_from(&reading.version);
            true
        });
        // An Envoy stalling leaves the reading without saying anything.
        let stalls = async {
            match reading.recheck_at {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = changes.changed() => if changed.is_err() {
                return;
            },
            () = stalls => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_wakes_every_route_waiting_on_the_fleet() {
        let (changes, receiver) = watch::channel(0u64);
        let waiting = |name: &str| (("shop".to_owned(), name.to_owned()), 3);
        let attempts = Arc::new(Mutex::new(HashMap::from([waiting("a"), waiting("b")])));
        let mut woken = Box::pin(wake_waiting(receiver, attempts.clone()));
        changes.send_replace(1);
        let mut names = vec![
            woken.next().await.map(|r| r.name),
            woken.next().await.map(|r| r.name),
        ];
        names.sort();
        assert_eq!(names, [Some("a".to_owned()), Some("b".to_owned())]);
        // A route that moved on is not waiting any more.
        attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&("shop".to_owned(), "a".to_owned()));
        changes.send_replace(2);
        assert_eq!(woken.next().await.map(|r| r.name), Some("b".to_owned()));
    }
}
