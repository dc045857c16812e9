//! Switchyard's core, with no Kubernetes in it: the routing model, its pure translation
//! into Envoy resources, and the xDS server that moves every Envoy from one snapshot to
//! the next. Front-ends (Kubernetes, standalone files) lower their input into the model;
//! the binary crate composes them.

pub mod duration;
pub mod hash;
pub mod metrics;
pub mod model;
pub mod route;
pub mod translate;
pub mod xds;
