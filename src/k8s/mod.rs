//! Kubernetes mode: watchers feed an index; every replica translates the ProxyConfigs in it
//! and serves them over xDS; the leader resolves TrafficRoutes into ProxyConfigs and writes
//! their status.

pub mod address_map;
pub mod builder;
pub mod controller;
pub mod departed;
pub mod fleet_drain;
pub mod index;
pub mod leader;
pub mod model_cache;
pub mod rate_limit;
pub mod rbac;
pub mod resolve;
pub mod shift;
pub mod status;
pub mod tls_secrets;
pub mod to_model;
