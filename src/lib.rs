//! Switchyard: shifts HTTP traffic between backends through a fleet of Envoy proxies
//! without dropping a request. See DESIGN.md for the data flow this crate follows.

pub mod admin;
pub mod api;
pub mod bootstrap;
pub mod certgen;
pub mod gateway;
pub mod k8s;
pub mod offline;
pub mod prober;
pub mod proxy_status;
pub mod rollout;
pub mod serving;
pub mod standalone;
pub mod traffic_route;
pub mod xds_tls;

// The Kubernetes-free core: model, translator, xDS server (crate switchyard-core).
pub use switchyard_core::{duration, hash, metrics, model, translate, xds};
