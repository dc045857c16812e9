//! Leader election by a Lease: every replica serves xDS; only the leader runs the shift
//! reconcilers (the only writers).
//!
//! The election runs on a thread of its own (`elector`), by client-go's rules (`lease`):
//! the leader renews every few seconds and stops writing, by the clock, once no renewal has
//! gone through for the lease duration less the grace (`gate`): strictly before any other
//! replica may lead. A leader that stopped that way and renews again, the Lease still its
//! own, goes on where it was; one that lost the Lease drops its work.
//!
//! A stopping leader releases the Lease, and a follower that sees it change reads it at
//! once: a rolling update of the operator hands over in about a second, not after the
//! lease runs out.

mod elector;
pub mod gate;
mod lease;

use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::model_cache::key_of;
use super::watched::Watched;
use elector::Elector;
pub use elector::LeaseMetrics;
use gate::{Term, WriteGate};
use lease::Timing;

#[derive(Clone)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub duration_seconds: u64,
    pub grace_seconds: u64,
}

/// How long a stopping replica waits for the elector to release the Lease and end.
const STOP_WITHIN: Duration = Duration::from_secs(6);

/// Bumps its channel whenever the election's Lease changes.
fn lease_changes(leases: &Watched<Lease>, settings: &LeaseSettings) -> watch::Receiver<u64> {
    let (tx, rx) = watch::channel(0u64);
    let key = (settings.namespace.clone(), settings.name.clone());
    let mut events = leases.objects();
    tokio::spawn(async move {
        while let Some(lease) = events.next().await {
            if tx.is_closed() {
                return;
            }
            if key_of(lease.as_ref()) == key {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    });
    rx
}

/// Starts the elector on a thread of its own, with a client `make_client` builds there
/// (its connection is driven by that thread alone). Ends when `stop` is set, having
/// released the Lease; the terms it publishes go to `terms`.
fn start_elector(
    make_client: impl FnOnce() -> anyhow::Result<Client> + Send + 'static,
    settings: LeaseSettings,
    changes: watch::Receiver<u64>,
    terms: watch::Sender<Option<Term>>,
    metrics: LeaseMetrics,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<oneshot::Receiver<anyhow::Result<()>>> {
    let (done_tx, done) = oneshot::channel();
    std::thread::Builder::new()
        .name("switchyard-lease".into())
        .spawn(move || {
            let run = || -> anyhow::Result<()> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("starting the lease elector's runtime")?;
                runtime.block_on(async move {
                    let client = make_client()?;
                    let elector = Elector {
                        api: Api::namespaced(client, &settings.namespace),
                        timing: Timing::new(settings.duration_seconds, settings.grace_seconds),
                        settings,
                        terms,
                        metrics,
                        next_term: 1,
                    };
                    elector.run(changes, stop).await;
                    Ok(())
                })
            };
            let _ = done_tx.send(run());
        })
        .context("starting the lease elector's thread")?;
    Ok(done)
}

/// Runs `lead(gate)` for each term this replica holds the Lease, stopping it when the term
/// ends; `gate` shuts its writes while renewals are not going through. When `stop`
/// completes (the process is asked to end), it stops leading and releases the Lease first.
pub async fn run_when_leader<F, Fut>(
    make_client: impl FnOnce() -> anyhow::Result<Client> + Send + 'static,
    settings: LeaseSettings,
    leases: &Watched<Lease>,
    metrics: LeaseMetrics,
    lead: F,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<()>
where
    F: Fn(WriteGate) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (terms_tx, mut terms) = watch::channel(None);
    let (stop_elector, stop_rx) = watch::channel(false);
    let changes = lease_changes(leases, &settings);
    let mut done = start_elector(make_client, settings, changes, terms_tx, metrics, stop_rx)?;
    let mut task: Option<(u64, JoinHandle<()>)> = None;
    let end = |task: &mut Option<(u64, JoinHandle<()>)>| {
        if let Some((_, running)) = task.take() {
            running.abort();
        }
    };
    tokio::pin!(stop);
    loop {
        let term = *terms.borrow_and_update();
        match (term, task.as_ref().map(|(number, _)| *number)) {
            (Some(term), Some(number)) if term.number == number => {}
            (Some(term), _) => {
                end(&mut task);
                let gate = WriteGate::new(terms.clone(), term.number);
                task = Some((term.number, tokio::spawn(lead(gate))));
            }
            (None, Some(_)) => end(&mut task),
            (None, None) => {}
        }
        tokio::select! {
            Ok(()) = terms.changed() => {}
            ended = &mut done => {
                end(&mut task);
                return match ended {
                    Ok(Err(error)) => Err(error.context("the lease elector")),
                    _ => anyhow::bail!("the lease elector stopped"),
                };
            }
            () = &mut stop => {
                // The term's requests are dropped before the Lease is released.
                if let Some((_, running)) = task.take() {
                    running.abort();
                    let _ = tokio::time::timeout(Duration::from_secs(1), running).await;
                }
                stop_elector.send_replace(true);
                if tokio::time::timeout(STOP_WITHIN, done).await.is_err() {
                    tracing::warn!("the lease elector did not stop within {STOP_WITHIN:?}");
                }
                return Ok(());
            }
        }
    }
}
