//! Kubernetes mode's shared parts, by concern: what every front-end and the serving
//! pipeline build on, and no front-end of its own. Watching: `index` (every replica's
//! stores), `fleet_drain`. Building, on every replica: `to_model` and `model_cache`
//! (ProxyConfigs, EndpointSlices and TLS Secrets → model), `departed`, `tls_secrets`,
//! `builder` (→ translator → the Envoys), `built_from` and `convergence` (what the
//! Envoys connected here serve, for rollouts waiting on them). Backends: `services` (a Service port → its
//! cluster). Writing status: `status`; Events: `events`. Leader election: `leader`. The API
//! client's transport and limits: `api_client`, `rate_limit`. The Envoys are reached
//! only through the `envoys` port; `main.rs` composes it with the xDS server.

pub mod api_client;
pub mod batches;
pub mod builder;
pub mod built_from;
pub mod convergence;
pub mod departed;
pub mod envoys;
pub mod events;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod fleet_drain;
pub mod fleet_report;
pub mod index;
pub mod leader;
pub mod model_cache;
pub mod rate_limit;
pub mod rbac;
pub mod services;
pub mod status;
pub mod tls_secrets;
pub mod to_model;
pub mod watched;
