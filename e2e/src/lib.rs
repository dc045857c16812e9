//! The test rig: real Envoy processes, a Switchyard process in standalone mode (or the
//! ADS server in this process), HTTP backends that answer with their name, and a bounded
//! load generator. Everything binds to 127.0.0.x, or for the Kubernetes rig to addresses of
//! [`local_range`] (local to `lo` too), and every process is killed when its handle drops,
//! even on panic.

pub mod ads_client;
mod backend;
pub mod change_bytes;
pub mod compare;
pub mod connections;
pub mod datagrams;
mod envoy;
pub mod gateway;
pub mod golden;
pub mod grpc;
mod https;
pub mod kube;
pub mod kubelet_probes;
mod load;
pub mod local_range;
pub mod node;
mod process;
pub mod record;
pub mod relay;
pub mod rig;
pub mod served;
mod switchyard_process;
pub mod synthetic;
mod websocket;

pub use backend::*;
pub use envoy::*;
pub use https::*;
pub use load::*;
pub use process::*;
pub use switchyard_process::*;
pub use websocket::*;
