//! The Gateway API front-end: GatewayClasses, Gateways, HTTPRoutes and ReferenceGrants,
//! lowered into Switchyard's one route vocabulary.
//!
//! - [`api`]: the generated types;
//! - [`translate`]: the pure lowering, and the status every object gets;
//! - [`controller`]: the watches, and the status writes (on the leader).

pub mod api;
pub mod controller;
pub mod translate;
