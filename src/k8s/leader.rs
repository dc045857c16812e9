//! Leader election by a Lease: every replica serves xDS; only the leader runs the shift
//! reconcilers (the only writers). Losing the lease stops them at once.
//!
//! A stopping leader releases the Lease, and a follower that sees it released asks for it
//! at once: a rolling update of the operator hands over in about a second, not after the
//! lease runs out (the lease manager alone would wait until the expiry it last read).

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::model_cache::key_of;
use super::watched::Watched;

#[derive(Clone)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub duration_seconds: u64,
    pub grace_seconds: u64,
}

/// How long a stopping replica waits for its Lease to be released.
const RELEASE_WITHIN: Duration = Duration::from_secs(5);

type ManagerTask = JoinHandle<kube_lease_manager::Result<LeaseManager>>;

async fn start_manager(
    client: &Client,
    settings: &LeaseSettings,
) -> anyhow::Result<(watch::Receiver<bool>, ManagerTask)> {
    let manager = LeaseManagerBuilder::new(client.clone(), &settings.name)
        .with_namespace(&settings.namespace)
        .with_identity(&settings.identity)
        .with_duration(settings.duration_seconds)
        .with_grace(settings.grace_seconds)
        // One field manager per replica: the lease is taken by a server-side apply of
        // holderIdentity, which only conflicts between different managers. With one name
        // for all, two replicas starting together both "took" it, and both led (writing
        // status and ProxyConfigs) until the next renewal showed one of them otherwise.
        .with_field_manager(field_manager(&settings.identity))
        .build()
        .await?;
    Ok(manager.watch().await)
}

/// The field manager of this replica's writes to the Lease (at most 128 characters).
fn field_manager(identity: &str) -> String {
    format!("switchyard-lease-{identity}")
        .chars()
        .take(128)
        .collect()
}

/// Closes the manager's channel, which makes it release the lease if it holds it, and
/// waits (bounded) for that.
async fn stop_manager(leading: watch::Receiver<bool>, task: ManagerTask) {
    drop(leading);
    match tokio::time::timeout(RELEASE_WITHIN, task).await {
        Ok(Ok(Ok(_))) => {}
        Ok(Ok(Err(e))) => warn!(error = %e, "could not release the lease"),
        Ok(Err(e)) => warn!(error = %e, "the lease manager failed"),
        Err(_) => warn!("the lease manager did not stop within {RELEASE_WITHIN:?}"),
    }
}

/// Bumps its channel whenever another replica releases the Lease: it had a holder other
/// than this one, and now has none. (A Lease that never had one is the manager's own
/// business: it takes those by itself.)
fn watch_for_release(leases: &Watched<Lease>, settings: &LeaseSettings) -> watch::Receiver<u64> {
    let (tx, rx) = watch::channel(0u64);
    let key = (settings.namespace.clone(), settings.name.clone());
    let me = settings.identity.clone();
    // Subscribed before the store is read: a change in between is seen twice, not missed.
    let mut events = leases.objects();
    let holder_of = |lease: &Lease| {
        (lease.spec.as_ref())
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty())
    };
    let leases = leases.clone();
    tokio::spawn(async move {
        // Who held it when this replica started; what comes after is in `events`.
        leases.ready().await;
        let mut last_holder = leases.get(&key).and_then(|lease| holder_of(&lease));
        while let Some(lease) = events.next().await {
            if key_of(lease.as_ref()) != key {
                continue;
            }
            let holder = holder_of(&lease);
            let released = holder.is_none() && last_holder.as_ref().is_some_and(|h| *h != me);
            last_holder = holder;
            if tx.is_closed() {
                return;
            }
            if released {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    });
    rx
}

/// When a leader stops writing because it cannot see its lease renewed: strictly before
/// the lease runs out for the others, measured from the last renewal the Lease shows
/// (`renewTime`, on the wall clock, which the lease's grace already allows to be skewed).
/// The lease manager renews at `duration - grace`; the fence falls half a grace later,
/// and the Lease is read eight times a grace, beside the loop (a slow read holds back no
/// stop), each read bounded by the time left until the fence (at least that interval), so
/// that a renewal is seen well before it and the fence is late by a quarter grace at most.
#[derive(Debug)]
struct Fence {
    check_every: Duration,
    /// From a renewal to the fence.
    stop_after: Duration,
}

impl Fence {
    fn new(settings: &LeaseSettings) -> Fence {
        let duration = Duration::from_secs(settings.duration_seconds.max(1));
        let grace = Duration::from_secs(settings.grace_seconds).min(duration);
        Fence {
            check_every: (grace / 8).clamp(Duration::from_millis(100), Duration::from_secs(1)),
            stop_after: duration.saturating_sub(grace / 2),
        }
    }

    /// How long a read of the Lease may take, `unrenewed` after the last renewal seen: up
    /// to the fence, never less than a check. A busy API server answering in a second is
    /// still heard (bounded by a check, such reads all ran out and the leader fenced
    /// itself under its own first pass), and the fence falls no later than before.
    fn read_within(&self, unrenewed: Duration) -> Duration {
        self.stop_after
            .saturating_sub(unrenewed)
            .max(self.check_every)
    }
}

/// The Lease's last renewal when it names this replica as its holder; `None` when it
/// names another or cannot be read.
async fn renewed_at(
    leases: &Api<Lease>,
    settings: &LeaseSettings,
    within: Duration,
) -> Option<SystemTime> {
    let read = tokio::time::timeout(within, leases.get(&settings.name)).await;
    let spec = read.ok()?.ok()?.spec?;
    if spec.holder_identity.as_deref() != Some(&settings.identity) {
        return None;
    }
    let renewed = spec.renew_time?.0;
    let since_epoch =
        Duration::try_from(renewed.duration_since(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
            .ok()?;
    Some(SystemTime::UNIX_EPOCH + since_epoch)
}

/// A new lease manager, retried every second until the API server answers; `None` if
/// `stop` completes first.
async fn restart_manager(
    client: &Client,
    settings: &LeaseSettings,
    stop: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Option<(watch::Receiver<bool>, ManagerTask)> {
    loop {
        match start_manager(client, settings).await {
            Ok(started) => return Some(started),
            Err(e) => warn!(error = %e, "cannot start the lease manager; retrying"),
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = stop.as_mut() => return None,
        }
    }
}

/// Runs `lead()` while this replica holds the lease, stopping it when the lease is lost.
/// When `stop` completes (the process is asked to end), it stops leading and releases the
/// lease first.
pub async fn run_when_leader<F, Fut>(
    client: Client,
    settings: LeaseSettings,
    leases: &Watched<Lease>,
    lead: F,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (mut leading, mut manager) = start_manager(&client, &settings).await?;
    let mut released = watch_for_release(leases, &settings);
    let mut task: Option<JoinHandle<()>> = None;
    let fence = Fence::new(&settings);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    // The last renewal seen; taken as now when the lead starts (the manager just wrote it).
    let mut renewed = SystemTime::now();
    // The Lease read in flight, if any; its answer is the renewal it saw.
    let mut reading: Option<Pin<Box<dyn Future<Output = Option<SystemTime>> + Send>>> = None;
    let mut check = tokio::time::interval(fence.check_every);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        let is_leader = *leading.borrow_and_update();
        match (is_leader, task.is_some()) {
            (true, false) => {
                info!(identity = %settings.identity, lease = %settings.name, "became the leader");
                renewed = SystemTime::now();
                task = Some(tokio::spawn(lead()));
            }
            (false, true) => {
                warn!(identity = %settings.identity, "lost the lease: stopping writes");
                if let Some(t) = task.take() {
                    t.abort();
                }
            }
            _ => {}
        }
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() {
                    if let Some(t) = task.take() {
                        t.abort();
                    }
                    anyhow::bail!("lease manager stopped");
                }
            }
            Ok(()) = released.changed(), if task.is_none() => {
                // Released by the leader: a fresh manager reads it now and takes it.
                info!(lease = %settings.name, "the lease was released; asking for it");
                stop_manager(leading, manager).await;
                let Some(restarted) = restart_manager(&client, &settings, &mut stop).await else {
                    return Ok(());
                };
                (leading, manager) = restarted;
            }
            Some(at) = async { Some(reading.as_mut()?.await) }, if reading.is_some() => {
                reading = None;
                if let Some(at) = at {
                    renewed = renewed.max(at);
                }
            }
            _ = check.tick(), if task.is_some() => {
                let unrenewed = SystemTime::now().duration_since(renewed).unwrap_or_default();
                // One read at a time, beside the loop: a slow one delays no stop or loss.
                if reading.is_none() {
                    let within = fence.read_within(unrenewed);
                    let (leases, settings) = (leases.clone(), settings.clone());
                    reading = Some(Box::pin(async move {
                        renewed_at(&leases, &settings, within).await
                    }));
                }
                if unrenewed >= fence.stop_after {
                    // Fencing: stop before the lease could have run out for the others,
                    // whatever the lease manager believes (it may be cut off as well).
                    warn!(
                        identity = %settings.identity,
                        ?unrenewed,
                        "the lease was not seen renewed: stopping writes before it can run out"
                    );
                    if let Some(t) = task.take() {
                        t.abort();
                    }
                    stop_manager(leading, manager).await;
                    let Some(restarted) = restart_manager(&client, &settings, &mut stop).await
                    else {
                        return Ok(());
                    };
                    (leading, manager) = restarted;
                }
            }
            () = &mut stop => {
                if let Some(t) = task.take() {
                    t.abort();
                }
                stop_manager(leading, manager).await;
                info!(identity = %settings.identity, "stopped; the lease is released");
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(duration_seconds: u64, grace_seconds: u64) -> LeaseSettings {
        LeaseSettings {
            namespace: "ns".into(),
            name: "lease".into(),
            identity: "me".into(),
            duration_seconds,
            grace_seconds,
        }
    }

    #[test]
    fn a_leader_stops_strictly_before_its_lease_can_run_out() {
        for (duration, grace) in [(15, 5), (4, 1), (2, 1), (60, 5), (10, 0)] {
            let fence = Fence::new(&settings(duration, grace));
            let duration = Duration::from_secs(duration);
            let renewal = duration - Duration::from_secs(grace);
            // After the manager's renewal, before the expiry.
            assert!(fence.stop_after < duration || grace == 0, "{fence:?}");
            assert!(fence.stop_after >= renewal, "{fence:?}");
            // The renewal is read at least twice before the fence.
            assert!(
                grace == 0 || fence.check_every * 2 <= fence.stop_after - renewal,
                "{fence:?}"
            );
            // Late by a tick and a bounded read at most: still before the expiry.
            assert!(
                grace == 0 || fence.stop_after + fence.check_every * 2 < duration,
                "{fence:?}"
            );
        }
    }

    #[test]
    fn a_slow_read_is_waited_for_until_the_fence_and_no_longer() {
        let fence = Fence::new(&settings(15, 5));
        // Just renewed: a read may take until the fence.
        assert_eq!(fence.read_within(Duration::ZERO), fence.stop_after);
        assert_eq!(
            fence.read_within(Duration::from_secs(10)),
            fence.stop_after - Duration::from_secs(10)
        );
        // At or past the fence: one check, as before.
        assert_eq!(fence.read_within(fence.stop_after), fence.check_every);
        assert_eq!(
            fence.read_within(Duration::from_secs(60)),
            fence.check_every
        );
    }

    #[test]
    fn every_replica_writes_the_lease_as_a_manager_of_its_own() {
        assert_ne!(field_manager("switchyard-a"), field_manager("switchyard-b"));
        assert!(field_manager(&"x".repeat(300)).len() <= 128);
    }
}
