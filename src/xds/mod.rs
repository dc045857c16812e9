//! The ADS server: serves snapshots to Envoy over state-of-the-world and delta xDS,
//! moving each Envoy from one snapshot to the next in make-before-break order.

pub mod snapshot;

pub use snapshot::{Resource, Snapshot};
pub mod localize;
pub mod session;
