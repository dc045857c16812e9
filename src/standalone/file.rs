//! The standalone configuration format: YAML files in one directory.
//!
//! Every `*.yaml`/`*.yml` file may hold any of the top-level keys; lists are merged.
//! A route is written in the vocabulary of the TrafficRoute spec (the same type), so a
//! configuration can move to Kubernetes; services and secrets stand in for the Services,
//! EndpointSlices and Secrets of a cluster.

use schemars::JsonSchema;
use serde::Deserialize;

pub use switchyard_core::route::RouteSpec;

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct File {
    pub listeners: Option<Listeners>,
    #[serde(default)]
    pub routes: Vec<FileRoute>,
    #[serde(default)]
    pub services: Vec<ServiceSpec>,
    #[serde(default)]
    pub secrets: Vec<SecretSpec>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Listeners {
    pub address: Option<String>,
    pub http_port: Option<u16>,
    pub https_port: Option<u16>,
    pub probe_port: Option<u16>,
    /// Envoy's access log: `{ format: json | text | off, samplePercent: 0-100 }`
    /// (default: JSON, every request).
    pub access_log: Option<crate::model::AccessLog>,
    /// Where the client's address comes from: `{ xffTrustedHops: 0-10, proxyProtocol }`
    /// (default: the connection's peer).
    pub client_ip: Option<crate::model::ClientIp>,
    /// Serve route configurations to delta-xDS Envoys one virtual host at a time (VHDS):
    /// a route change sends that route, not every route (default: true).
    pub virtual_host_discovery: Option<bool>,
}

/// A route: its name and namespace, and its spec: the TrafficRoute's, the same type.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRoute {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    pub spec: RouteSpec,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceSpec {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Upstream HTTP/2 for every port of this service.
    #[serde(default)]
    pub http2: bool,
    #[serde(default)]
    pub endpoints: Vec<EndpointSpec>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointSpec {
    pub address: String,
    pub port: u16,
    #[serde(default = "yes")]
    pub ready: bool,
    #[serde(default = "yes")]
    pub serving: bool,
    #[serde(default)]
    pub terminating: bool,
    pub zone: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretSpec {
    /// What a route's `tls.secretName` names, in the same namespace.
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// PEM files, relative to the configuration directory.
    pub cert_file: String,
    pub key_file: String,
}

fn default_namespace() -> String {
    "default".into()
}

fn yes() -> bool {
    true
}
