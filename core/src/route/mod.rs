//! One route vocabulary for every front-end. A route goes through:
//!
//! 1. [`spec`]: what a user writes (the TrafficRoute CRD's spec, a standalone file's
//!    route), checked by [`check`] and resolved by [`resolve`] against the services of its
//!    namespace (a [`ServiceLookup`], for Kubernetes Services or file services). A Gateway
//!    API HTTPRoute is lowered into the same words by its front-end
//!    (`src/gateway/translate`) instead;
//! 2. [`assemble`], the one way in, whatever the front-end: each rule's checks, its
//!    clusters, then the route with its clusters and version → [`ResolvedRoute`];
//! 3. [`lower`]: resolved routes and the endpoints of their clusters → the model.

pub mod assemble;
pub mod check;
pub mod lower;
pub mod resolve;
pub mod resolved;
pub mod spec;

pub use assemble::{Checked, Rule, assemble};
pub use check::{Checks, Draft, SpecError};
pub use resolve::{ResolveError, ServiceLookup, resolve};
pub use resolved::{
    ClientValidation, ListenerProtocol, ResolvedBackend, ResolvedCluster, ResolvedListener,
    ResolvedMirror, ResolvedRoute, ResolvedRule, ResolvedTls, ResolvedVirtualHost, SecretRef,
    SubjectAltName, UpstreamTls,
};
pub use spec::RouteSpec;
