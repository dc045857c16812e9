//! The xDS server as the Kubernetes side's [`Envoys`]: the one place, besides `main.rs`,
//! that knows both.

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::k8s::envoys::{BlockingNack, Envoys, Holding, RouteVerdict, Snapshot};
use crate::xds::{Desired, Nodes};

/// The desired snapshot this replica serves, and the Envoys connected to it.
#[derive(Clone)]
pub struct Serving {
    pub desired: Arc<Desired>,
    pub nodes: Nodes,
}

impl Envoys for Serving {
    fn publish(&self, snapshot: Arc<Snapshot>) -> bool {
        self.desired.publish_and_open(snapshot)
    }

    fn verdicts(&self) -> mpsc::UnboundedReceiver<RouteVerdict> {
        self.nodes.verdicts()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.nodes.changes()
    }

    fn holdings(&self) -> Vec<Holding> {
        self.nodes.holdings()
    }

    fn blocking_nacks(&self) -> Vec<BlockingNack> {
        self.nodes.blocking_nacks()
    }

    fn connected(&self) -> BTreeSet<String> {
        self.nodes
            .list()
            .into_iter()
            .map(|n| n.node_id.clone())
            .filter(|id| !id.is_empty())
            .collect()
    }

    fn set_draining(&self, nodes: BTreeSet<String>) {
        self.nodes.set_draining(nodes);
    }
}
