//! One route vocabulary for every front-end. A route goes through three steps:
//!
//! 1. [`spec`]: what a user writes (the TrafficRoute CRD's spec, a standalone file's
//!    route; a Gateway API HTTPRoute lowers into it), checked once by [`check`];
//! 2. [`resolve`]: the spec against the services of its namespace (a [`ServiceLookup`],
//!    for Kubernetes Services or file services) → [`ResolvedRoute`];
//! 3. [`lower`]: resolved routes and the endpoints of their clusters → the model.

pub mod check;
pub mod lower;
pub mod resolve;
pub mod resolved;
pub mod spec;

pub use check::SpecError;
pub use resolve::{ResolveError, ServiceLookup, resolve};
pub use resolved::{
    ResolvedBackend, ResolvedCluster, ResolvedListener, ResolvedRoute, ResolvedRule, ResolvedTls,
    ResolvedVirtualHost, SecretRef,
};
pub use spec::RouteSpec;
