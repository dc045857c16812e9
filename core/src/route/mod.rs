//! One route vocabulary for every front-end. A route goes through three steps:
//!
//! 1. [`spec`]: what a user writes (the TrafficRoute CRD's spec, a standalone file's
//!    route), checked once by [`check`]. A Gateway API HTTPRoute does not pass through
//!    it: its front-end builds [`ResolvedRule`]s directly (`src/gateway/translate`);
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
