//! Leader election by a Lease: every replica serves xDS; only the leader runs the shift
//! reconcilers (the only writers). Losing the lease stops them at once.

use std::future::Future;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tracing::{info, warn};

pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub duration_seconds: u64,
    pub grace_seconds: u64,
}

/// Runs `lead()` while this replica holds the lease, stopping it when the lease is lost.
pub async fn run_when_leader<F, Fut>(
    client: Client,
    settings: LeaseSettings,
    lead: F,
) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let manager = LeaseManagerBuilder::new(client, &settings.name)
        .with_namespace(&settings.namespace)
        .with_identity(&settings.identity)
        .with_duration(settings.duration_seconds)
        .with_grace(settings.grace_seconds)
        .with_field_manager("switchyard-lease")
        .build()
        .await?;
    let (mut leading, _watch) = manager.watch().await;
    let mut task: Option<tokio::task::JoinHandle<()>> = None;
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
        if leading.changed().await.is_err() {
            if let Some(t) = task.take() {
                t.abort();
            }
            anyhow::bail!("lease manager stopped");
        }
    }
}
