//! Kubernetes mode: watchers feed an index; every replica translates the ProxyConfigs in it
//! and serves them over xDS; the leader resolves TrafficRoutes into ProxyConfigs and writes
//! their status.

pub mod builder;
pub mod index;
pub mod resolve;
pub mod to_model;
