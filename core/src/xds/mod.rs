//! The ADS server: serves snapshots to Envoy over state-of-the-world and delta xDS,
//! moving each Envoy from one snapshot to the next in make-before-break order.
//! It knows nothing of Kubernetes or of the CRDs.

mod accepted;
pub mod desired;
pub mod localize;
mod names;
pub mod nodes;
mod planner;
pub mod server;
pub mod session;
pub mod snapshot;
pub mod vhds;
pub mod wire;

pub use desired::Desired;
pub use nodes::{BlockingNack, Holding, NodeReport, Nodes, RouteVerdict};
pub use server::AdsServer;
pub use session::{Ordering, Protocol};
pub use snapshot::{Resource, Snapshot};
