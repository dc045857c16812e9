//! The Gateway API front-end: GatewayClasses, Gateways, HTTPRoutes and ReferenceGrants,
//! lowered into Switchyard's one route vocabulary.
//!
//! - [`api`]: the generated types;
//! - [`translate`]: the pure lowering, and the status every object gets;
//! - [`service`]: each Gateway's own Service (its address) in the fleet's namespace;
//! - [`controller`]: the watches, the Services and the status writes (on the leader).

pub mod api;
pub mod controller;
pub mod service;
pub mod translate;
