//! The Gateway API types Switchyard reads and writes status of, as kopium generates them
//! from the CRDs of the release `e2e/provision.sh` downloads (GATEWAY_API_VERSION): of the
//! standard channel, and for Gateway, ListenerSet, HTTPRoute and GRPCRoute of the experimental one (a
//! superset), so that an experimental field set is seen. Never edited by hand:
//! `e2e/tests/gateway_types.rs` checks that regenerating changes nothing.
#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod backendtlspolicies;
pub mod gatewayclasses;
pub mod gateways;
pub mod grpcroutes;
pub mod httproutes;
pub mod listenersets;
pub mod referencegrants;
pub mod tcproutes;
pub mod tlsroutes;
pub mod udproutes;
