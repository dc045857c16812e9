//! The Gateway API front-end: GatewayClasses, Gateways, HTTPRoutes and ReferenceGrants,
//! lowered into Switchyard's one route vocabulary.
//!
//! - [`api`]: the generated types;
//! - [`translate`]: the pure lowering, and the status every object gets;
//! - [`service`]: each Gateway's own Service (its address) in the fleet's namespace;
//!   [`service_writes`]: its writes, conditional on what they were decided on;
//! - [`unit`]: what a Gateway rolls out, in units of one port or one hostname;
//! - [`rollout`]: each unit moved through the two-phase rollout;
//! - [`controller`]: the watches, the Services and the status writes (on the leader).

pub mod api;
pub mod controller;
pub mod rollout;
pub mod service;
pub mod service_writes;
pub mod translate;
pub mod unit;
