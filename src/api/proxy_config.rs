//! `ProxyConfig`: the resolved configuration Switchyard serves, owned by a TrafficRoute and
//! written only by Switchyard. The translator reads these, never TrafficRoutes, so every
//! replica serves the same thing (I6).
//!
//! Two roles per route: `probe` holds the clusters that must be on every Envoy before a
//! switch (new ∪ live; only the new ones must have ready endpoints) and the routes on
//! trial (every Envoy must accept them), `live` holds what serves user traffic.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::traffic_route::{HeaderEdits, Retries, RuleMatch};

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "ProxyConfig",
    namespaced,
    shortname = "pxc",
    category = "switchyard",
    doc = "The resolved configuration Switchyard serves for one TrafficRoute, written only by Switchyard: the probe role holds the clusters that must be ready on every Envoy before a switch, the live role what serves traffic. Do not edit.",
    printcolumn(name = "Role", type_ = "string", json_path = ".spec.role"),
    printcolumn(name = "Route", type_ = "string", json_path = ".spec.route"),
    printcolumn(name = "Generation", type_ = "integer", json_path = ".spec.generation"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
/// One role of a route's resolved configuration: its virtual host (live) and clusters.
#[serde(rename_all = "camelCase")]
pub struct ProxyConfigSpec {
    pub role: ProxyConfigRole,
    /// The TrafficRoute this was resolved from (also its owner).
    pub route: String,
    /// The TrafficRoute generation this realizes.
    pub generation: i64,
    /// Digest of the content; the live version probe answers with it.
    pub version: String,
    /// The routes: serving (live role), or on trial (probe role): every Envoy must
    /// accept them before they are promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_host: Option<ResolvedVirtualHost>,
    /// Every cluster this config needs on every Envoy.
    #[serde(default)]
    pub clusters: Vec<ResolvedCluster>,
    /// Live role: when the TrafficRoute was created. Of the routes asking for one host,
    /// the oldest gets it (then the first by namespace/name), on every replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_created: Option<Time>,
    /// Probe role: those of `clusters` that are live now and only kept through the
    /// switch. The probe asks that they exist, never that they have ready endpoints: a
    /// route whose current backend lost its endpoints must still be able to move.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_clusters: Vec<ResolvedCluster>,
}

#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "lowercase")]
pub enum ProxyConfigRole {
    Probe,
    Live,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedVirtualHost {
    /// The TrafficRoute's hosts (at most 16 there, so here).
    #[schemars(length(max = 16))]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ResolvedTls>,
    /// One per TrafficRoute rule (at most 32 there, so here). The bound also keeps the
    /// cost of the CEL rules of `match` (shared with TrafficRoute) within the API server's
    /// budget: without it, the CRD is refused.
    #[schemars(length(max = 32))]
    pub rules: Vec<ResolvedRule>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedTls {
    pub secret_name: String,
    pub redirect_http: bool,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedRule {
    pub name: String,
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub matches: Option<RuleMatch>,
    /// The TrafficRoute rule's backends (at most 8 there, so here).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub backends: Vec<ResolvedBackend>,
    #[serde(default)]
    pub redirect_https: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<Retries>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HeaderEdits>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HeaderEdits>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedBackend {
    pub cluster: ResolvedCluster,
    pub weight: i32,
}

/// A Service port, resolved: the port number, and the name its EndpointSlices use for it.
#[derive(
    KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default,
)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedCluster {
    pub service: String,
    pub port: i32,
    /// The Service port's name ("" when unnamed): EndpointSlice ports carry it.
    #[serde(default)]
    pub port_name: String,
    /// Upstream HTTP/2 (appProtocol h2c or kubernetes.io/h2c).
    #[serde(default)]
    pub http2: bool,
}
