//! Leader election by a Lease: every replica serves xDS; only the leader runs the shift
//! reconcilers (the only writers). Losing the lease stops them at once.
//!
//! A stopping leader releases the Lease, and a follower that sees it released asks for it
//! at once: a rolling update of the operator hands over in about a second, not after the
//! lease runs out (the lease manager alone would wait until the expiry it last read).

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

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
fn watch_for_release(client: Client, settings: &LeaseSettings) -> watch::Receiver<u64> {
    let (tx, rx) = watch::channel(0u64);
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", settings.name));
    let me = settings.identity.clone();
    tokio::spawn(async move {
        let mut leases = std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
        let mut last_holder: Option<String> = None;
        while let Some(lease) = leases.next().await {
            let Ok(lease) = lease else { continue };
            let holder = lease
                .spec
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty());
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

/// Runs `lead()` while this replica holds the lease, stopping it when the lease is lost.
/// When `stop` completes (the process is asked to end), it stops leading and releases the
/// lease first.
pub async fn run_when_leader<F, Fut>(
    client: Client,
    settings: LeaseSettings,
    lead: F,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (mut leading, mut manager) = start_manager(&client, &settings).await?;
    let mut released = watch_for_release(client.clone(), &settings);
    let mut task: Option<JoinHandle<()>> = None;
    tokio::pin!(stop);
    loop {
        let is_leader = *leading.borrow_and_update();
        match (is_leader, task.is_some()) {
            (true, false) => {
                info!(identity = %settings.identity, lease = %settings.name, "became the leader");
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
                (leading, manager) = start_manager(&client, &settings).await?;
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
    use super::field_manager;

    #[test]
    fn every_replica_writes_the_lease_as_a_manager_of_its_own() {
        assert_ne!(field_manager("switchyard-a"), field_manager("switchyard-b"));
        assert!(field_manager(&"x".repeat(300)).len() <= 128);
    }
}
