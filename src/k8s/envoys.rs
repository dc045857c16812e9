//! What the Kubernetes side asks of the Envoys connected to this replica. The xDS server
//! answers it (`src/serving.rs` adapts it, `main.rs` composes them); nothing under
//! `src/k8s` sees the server itself. The data that crosses is the core's: the snapshot
//! the translator builds, and what Envoys say of it.

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

pub use switchyard_core::xds::{BlockingNack, Holding, RouteVerdict, Snapshot};

pub trait Envoys: Send + Sync + 'static {
    /// Serves `snapshot` from now on; true when it is the first (the startup gate opens).
    fn publish(&self, snapshot: Arc<Snapshot>) -> bool;
    /// Every answer to a route configuration from now on, as the Envoys give them.
    fn verdicts(&self) -> mpsc::UnboundedReceiver<RouteVerdict>;
    /// Changes whenever an Envoy connects, leaves or answers.
    fn changes(&self) -> watch::Receiver<u64>;
    /// What each Envoy here serves in full (see [`super::convergence`]).
    fn holdings(&self) -> Vec<Holding>;
    /// The NACKs that hold Envoys back.
    fn blocking_nacks(&self) -> Vec<BlockingNack>;
    /// The node ids of the Envoys connected here.
    fn connected(&self) -> BTreeSet<String>;
    /// The Envoys about to stop (by node id): their connections are drained.
    fn set_draining(&self, nodes: BTreeSet<String>);
}
