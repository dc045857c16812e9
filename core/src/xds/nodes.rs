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
    /// Shared with the stream that reported it: a report is made after most messages.
    pub status: Arc<SessionStatus>,
}

#[derive(Clone, Default)]
pub struct Nodes {
    /// Reports are shared, not copied: every reader of the registry (convergence, the
    /// fleet's NACKs, `/debug/nodes`) would otherwise copy every node's on each change.
    inner: Arc<RwLock<BTreeMap<u64, Arc<NodeReport>>>>,
    /// Bumped on every change, so callers can wait for progress instead of polling.
    changes: Arc<watch::Sender<u64>>,
    /// Whoever wants to hear what Envoys answered to route configurations.
    verdicts: Arc<Mutex<Vec<mpsc::UnboundedSender<RouteVerdict>>>>,
    /// Ids of the nodes about to stop, which are drained (see `localize`).
    draining: Arc<watch::Sender<BTreeSet<String>>>,
}

/// A NACK that holds its node back.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
pub struct BlockingNack {
    pub node: String,
    /// The type's short name, e.g. "Cluster".
    pub kind: String,
    pub error: String,
}

/// What one connected node serves, for whoever waits on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub stream: u64,
    /// The newest published snapshot it serves in full (see [`SessionStatus`]).
    pub serving: Option<String>,
    /// It holds the desired snapshot and nothing holds it back.
    pub synced: bool,
}

impl From<&NodeReport> for Holding {
    fn from(n: &NodeReport) -> Self {
        let synced = n.status.synced && !n.status.blocked_by_nack;
        Self {
            stream: n.stream,
            // Synced, it holds the desired snapshot, even one that asks for no route
            // configuration (so is never found serving one in full).
            serving: if synced {
                n.status.desired_version.clone()
            } else {
                n.status.serving_version.clone()
            },
            synced,
        }
    }
}

/// What an Envoy answered to a route configuration it was sent.
#[derive(Clone, Debug)]
pub enum RouteVerdict {
    Accepted(Arc<Resource>),
    Refused {
        config: Arc<Resource>,
        /// The node id of the Envoy that refused it.
        node: String,
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
        self.write().insert(report.stream, Arc::new(report));
        self.changes.send_modify(|n| *n += 1);
    }

    pub fn remove(&self, stream: u64) {
        self.write().remove(&stream);
        self.changes.send_modify(|n| *n += 1);
    }

    pub fn list(&self) -> Vec<Arc<NodeReport>> {
        self.read().values().cloned().collect()
    }

    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// What each node serves.
    pub fn holdings(&self) -> Vec<Holding> {
        self.read()
            .values()
            .map(|n| Holding::from(n.as_ref()))
            .collect()
    }

    /// What blocks nodes: each node held back by a NACK, with the NACKed type (short name)
    /// and Envoy's message.
    pub fn blocking_nacks(&self) -> Vec<BlockingNack> {
        self.read()
            .values()
            .filter(|n| n.status.blocked_by_nack)
            .flat_map(|n| {
                n.status.types.iter().filter_map(|(kind, t)| {
                    t.last_nack.as_ref().map(|nack| BlockingNack {
                        node: n.node_id.clone(),
                        kind: kind.to_string(),
                        error: nack.error.clone(),
                    })
                })
            })
            .collect()
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

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<u64, Arc<NodeReport>>> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<u64, Arc<NodeReport>>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::Protocol;

    #[test]
    fn a_node_holds_what_it_serves_and_is_synced_only_unblocked() {
        let node = |serving: Option<&str>, synced, blocked_by_nack| NodeReport {
            stream: 7,
            node_id: "envoy-7".into(),
            cluster: "fleet".into(),
            peer: "127.0.0.1:1".into(),
            connected_at: std::time::SystemTime::UNIX_EPOCH,
            status: Arc::new(SessionStatus {
                protocol: Protocol::Delta,
                desired_version: Some("v3".into()),
                serving_version: serving.map(str::to_owned),
                synced,
                blocked_by_nack,
                types: Default::default(),
            }),
        };
        let holding = |serving: Option<&str>, synced| Holding {
            stream: 7,
            serving: serving.map(str::to_owned),
            synced,
        };
        assert_eq!(
            Holding::from(&node(Some("v3"), true, false)),
            holding(Some("v3"), true)
        );
        assert_eq!(
            Holding::from(&node(Some("v2"), false, false)),
            holding(Some("v2"), false)
        );
        assert_eq!(
            Holding::from(&node(Some("v2"), true, true)),
            holding(Some("v2"), false)
        );
        assert_eq!(
            Holding::from(&node(None, false, false)),
            holding(None, false)
        );
        // Synced but never found serving (it asks for no route configuration): it holds
        // the desired snapshot all the same.
        assert_eq!(
            Holding::from(&node(None, true, false)),
            holding(Some("v3"), true)
        );
    }
}
