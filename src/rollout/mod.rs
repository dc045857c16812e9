//! The rollout engine: moves every unit of every front-end through the two phases of
//! DESIGN.md (stage the probe ProxyConfig, prove the new clusters ready on every Envoy,
//! promote the live ProxyConfig, prove it served everywhere, drain, collect). A unit is
//! what a front-end hands over: a TrafficRoute, a Gateway's port, a hostname on one. The
//! engine knows no front-end; front-ends know the engine and never each other.
//!
//! - [`shift`]: the decision, pure: from what the API server holds, the next step;
//! - [`spec`]: a unit's two ProxyConfig specs and names, and why a unit is not served;
//! - [`proxy_configs`]: reading them, and writing and deleting them conditionally;
//! - [`batch`]: writing many units' ProxyConfigs as one object when their first rollouts
//!   coincide;
//! - [`fleet`]: the Envoys a verification must hear from;
//! - [`lagging`]: when an Event names the Envoys that hold a unit back;
//! - [`served`]: the live versions the whole fleet was seen serving, not asked again;
//! - [`clock`]: how long each step took, for the step histogram.

pub mod batch;
pub mod clock;
pub mod executor;
pub mod fleet;
mod known;
pub mod lagging;
pub mod proxy_configs;
pub mod served;
pub mod shift;
pub mod spec;

use std::time::Duration;

pub use batch::Batches;
pub use fleet::{fleet_addresses, fleet_pods, named_by_pod};
pub use proxy_configs::{
    Owner, ProxyConfigs, UnitRef, promoted_ago, promotion_time, unchanged_since,
};
pub use spec::{RouteError, live_name, probe_name, proxy_config_spec};

/// The field manager of every ProxyConfig the engine writes.
pub const FIELD_MANAGER: &str = "switchyard";

pub use crate::api::proxy_config::PROMOTED_AT;

/// The label naming the unit a ProxyConfig belongs to (by [`label_value`]).
pub const ROUTE_LABEL: &str = "switchyard.dev/route";

/// A name as a label value: itself when it fits in 63 characters, else cut and followed by
/// a digest of it (object names are DNS subdomains: ASCII), so that a name of up to 253
/// characters still labels what belongs to it.
pub fn label_value(name: &str) -> String {
    fit(name, LABEL_VALUE_MAX)
}

/// The longest value a Kubernetes label may have.
pub const LABEL_VALUE_MAX: usize = 63;

/// `name` itself when it has at most `max` characters, else cut and followed by a digest
/// of it, `max` characters in all (`max` leaves room for the digest).
pub fn fit(name: &str, max: usize) -> String {
    if name.len() <= max {
        return name.to_owned();
    }
    let digest = &switchyard_core::hash::digest(name.as_bytes())[..8];
    let room = max.saturating_sub(1 + digest.len()).min(name.len());
    let cut = name[..room].trim_end_matches(['.', '-']);
    format!("{cut}-{digest}")
}

/// The drain period of a unit that sets none.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(10);
