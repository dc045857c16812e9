//! `ProxyConfig`: the resolved configuration Switchyard serves, owned by a TrafficRoute and
//! written only by Switchyard. The translator reads these, never TrafficRoutes, so every
//! replica serves the same thing (I6).
//!
//! Two roles per route: `probe` holds the clusters that must be on every Envoy before a
//! switch (new ∪ live; only the new ones must have ready endpoints) and the routes on
//! trial (every Envoy must accept them), `live` holds what serves user traffic.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use switchyard_core::route::{
    ResolvedBackend, ResolvedCluster, ResolvedListener, ResolvedRule, ResolvedTls,
    ResolvedVirtualHost,
};

/// When a live ProxyConfig's version was promoted: its drain period runs from then.
pub const PROMOTED_AT: &str = "switchyard.dev/promoted-at";

/// The label of a batch ProxyConfig (see [`ProxyConfigSpec::members`]); its value is the role.
pub const BATCH_LABEL: &str = "switchyard.dev/batch";

/// On a batch member as the watch's store shows it: the batch it is in.
pub const IN_BATCH: &str = "switchyard.dev/in-batch";

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
    /// Live role of a Gateway's virtual host: the Gateway listener it is served on.
    /// Absent for a TrafficRoute (the shared listeners).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<ResolvedListener>,
    /// Live role: the route's drain period (`10s`, `500ms`), how long the clusters it
    /// leaves stay after a switch. A Service it uses that is deleted keeps its last
    /// endpoints as long (the longest of its routes'), so the route can move off it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_period: Option<String>,
    /// A batch (labelled `switchyard.dev/batch`): the ProxyConfigs of this role of many
    /// units, written at once when their first rollouts coincide (a start with thousands
    /// of routes to bring up, a sync creating many). Every replica serves each member as
    /// if it were a ProxyConfig of its own, unless the unit has one of that name, which
    /// then wins. The other fields of a batch describe no unit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<BatchMember>,
}

/// One unit's ProxyConfig inside a batch: what its own object would carry.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BatchMember {
    /// The name its own ProxyConfig would have (`<unit>-probe`, `<unit>-live`).
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The object its own ProxyConfig would belong to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<OwnerReference>,
    /// Live role: when this version was promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_at: Option<String>,
    /// Its spec, as its own ProxyConfig would hold it (checked by Switchyard, which alone
    /// writes it, not by the API server again).
    #[schemars(schema_with = "opaque_object")]
    pub spec: ProxyConfigSpec,
}

/// An object the API server keeps as it is: a batch member's spec has the schema of a
/// ProxyConfig's, which Switchyard checked when it wrote it.
fn opaque_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

#[derive(
    schemars::JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
)]
#[serde(rename_all = "lowercase")]
pub enum ProxyConfigRole {
    Probe,
    Live,
}
