//! The desired snapshot, and the startup gate in front of it (I5).
//!
//! Until the owner calls [`Desired::open`], sessions receive nothing: Envoys stay connected
//! and unanswered rather than receive a configuration built from half-synced state.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::Snapshot;
use super::accepted::AcceptedClusters;
use super::localize::InParts;
use super::snapshot::CLUSTER;

pub struct Desired {
    /// What sessions see: None while the gate is closed.
    tx: watch::Sender<Option<Arc<Snapshot>>>,
    held: Mutex<Held>,
    /// Every published snapshot's clusters: a set Envoys hold once they are in step.
    accepted: Arc<AcceptedClusters>,
    /// The snapshot as delta Envoys take it, made once for all of them.
    in_parts: Arc<InParts>,
}

#[derive(Default)]
struct Held {
    open: bool,
    latest: Option<Arc<Snapshot>>,
}

impl Default for Desired {
    fn default() -> Self {
        Self::new()
    }
}

impl Desired {
    pub fn new() -> Self {
        Self {
            tx: watch::channel(None).0,
            held: Mutex::new(Held::default()),
            accepted: Arc::default(),
            in_parts: Arc::default(),
        }
    }

    /// Sets the desired snapshot; sessions see it once the gate is open.
    pub fn publish(&self, snapshot: Arc<Snapshot>) {
        if let Some(clusters) = snapshot.resources(CLUSTER) {
            self.accepted
                .remember(&snapshot.type_version(CLUSTER), clusters);
        }
        let mut held = self.lock();
        held.latest = Some(snapshot.clone());
        if held.open {
            self.tx.send_if_modified(|current| {
                let changed = current.as_ref().map(|c| c.version()) != Some(snapshot.version());
                *current = Some(snapshot);
                changed
            });
        }
    }

    /// Opens the gate: the owner says the first full snapshot has been published.
    /// Returns false if there is nothing published yet (the gate stays closed).
    pub fn open(&self) -> bool {
        let mut held = self.lock();
        let Some(latest) = held.latest.clone() else {
            return false;
        };
        held.open = true;
        self.tx.send_replace(Some(latest));
        true
    }

    /// Publishes, and opens the gate if it is still closed: for owners whose every
    /// published snapshot is complete. True when this call opened it.
    pub fn publish_and_open(&self, snapshot: Arc<Snapshot>) -> bool {
        self.publish(snapshot);
        !self.is_open() && self.open()
    }

    pub fn is_open(&self) -> bool {
        self.lock().open
    }

    /// The snapshot sessions are served (None while the gate is closed).
    pub fn current(&self) -> Option<Arc<Snapshot>> {
        self.tx.borrow().clone()
    }

    /// The cluster sets Envoys may hold (see [`AcceptedClusters`]).
    pub(super) fn accepted(&self) -> &Arc<AcceptedClusters> {
        &self.accepted
    }

    /// The snapshots as delta Envoys take them (see [`InParts`]).
    pub(super) fn in_parts(&self) -> &Arc<InParts> {
        &self.in_parts
    }

    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Snapshot>>> {
        self.tx.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // A panic while holding this lock leaves plain data behind; keep serving.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_holds_snapshots_until_opened() {
        let desired = Desired::new();
        let rx = desired.subscribe();
        assert!(!desired.open(), "nothing to serve yet");
        desired.publish(Arc::new(Snapshot::default()));
        assert!(rx.borrow().is_none());
        assert!(desired.open());
        assert!(rx.borrow().is_some());
        assert!(desired.is_open());
    }
}
