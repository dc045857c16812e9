//! Every connected Envoy and what it has acknowledged, for the rest of the program
//! (status, prober, `/debug/nodes`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::session::SessionStatus;
use super::snapshot::Resource;

#[derive(Clone, Debug, Serialize)]
pub struct NodeReport {
    pub stream: u64,
    pub node_id: String,
    pub cluster: String,
    pub peer: String,
    #[serde(with = "unix_seconds")]
    pub connected_at: SystemTime,
    pub status: SessionStatus,
}

#[derive(Clone, Default)]
pub struct Nodes {
    inner: Arc<RwLock<BTreeMap<u64, NodeReport>>>,
    /// Bumped on every change, so callers can wait for progress instead of polling.
    changes: Arc<watch::Sender<u64>>,
    /// Whoever wants to hear what Envoys answered to route configurations.
    verdicts: Arc<Mutex<Vec<mpsc::UnboundedSender<RouteVerdict>>>>,
    /// Ids of the nodes about to stop, which are drained (see `localize`).
    draining: Arc<watch::Sender<BTreeSet<String>>>,
}

/// What an Envoy answered to a route configuration it was sent.
#[derive(Clone, Debug)]
pub enum RouteVerdict {
    Accepted(Arc<Resource>),
    Refused {
        config: Arc<Resource>,
        error: String,
    },
}

impl Nodes {
    /// The nodes about to stop (a terminating Pod's Envoy): every stream of one of them
    /// drains its connections.
    pub fn set_draining(&self, ids: BTreeSet<String>) {
        self.draining.send_if_modified(|current| {
            let changed = *current != ids;
            *current = ids;
            changed
        });
    }

    pub fn draining(&self) -> watch::Receiver<BTreeSet<String>> {
        self.draining.subscribe()
    }

    pub fn update(&self, report: NodeReport) {
        self.write().insert(report.stream, report);
        self.changes.send_modify(|n| *n += 1);
    }

    pub fn remove(&self, stream: u64) {
        self.write().remove(&stream);
        self.changes.send_modify(|n| *n += 1);
    }

    pub fn list(&self) -> Vec<NodeReport> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Every verdict from now on. Unbounded: verdicts come one per response, and a
    /// lost refusal would leave its Envoy stuck until the next change.
    pub fn verdicts(&self) -> mpsc::UnboundedReceiver<RouteVerdict> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.verdicts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx);
        rx
    }

    pub fn report_verdict(&self, verdict: RouteVerdict) {
        self.verdicts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|tx| tx.send(verdict.clone()).is_ok());
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<u64, NodeReport>> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }
}

mod unix_seconds {
    use std::time::{SystemTime, UNIX_EPOCH};

    pub fn serialize<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let secs = t
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        s.serialize_f64(secs)
    }
}
