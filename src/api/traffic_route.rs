//! `TrafficRoute`: what a user asks for. Switchyard writes its status, never its spec (I7).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use switchyard_core::route::spec::{
    Backend, HeaderEdits, HeaderMatch, Retries, RouteRule, RouteSpec, RouteTls, RuleMatch,
    RuleOptions,
};

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "TrafficRoute",
    namespaced,
    status = "TrafficRouteStatus",
    shortname = "tr",
    category = "switchyard",
    doc = "A route a user writes: hosts, optional TLS, HTTP rules with weighted Service backends, and how changes roll out. Switchyard moves traffic to each new generation only once every Envoy has proven it ready, and reports progress in status; it never writes the spec.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(name = "Hosts", type_ = "string", json_path = ".spec.hosts"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
/// What the route serves: its hosts, TLS, rules in match order, and rollout settings.
#[serde(rename_all = "camelCase")]
pub struct TrafficRouteSpec {
    /// The route itself, in the vocabulary every front-end shares.
    #[serde(flatten)]
    pub route: RouteSpec,

    /// How changes roll out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSettings>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSettings {
    /// How long old backends keep their clusters after the switch (default "10s").
    /// Connections still open to them after it (WebSockets) are not cut. A Service the
    /// route serves that is deleted keeps its last endpoints as long (at least the
    /// operator's `--hold`, at most a minute or `--hold`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub drain_period: Option<String>,
    /// How long to wait for every Envoy to prove readiness before reporting failure
    /// (default "5m"; the rollout keeps retrying after that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub probe_deadline: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficRouteStatus {
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, Accepted, Progressing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Rollout phase: Staging, VerifyingEndpoints, Promoting, VerifyingLive, Draining, Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The generation Envoys serve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_generation: Option<i64>,
    /// Envoys that have proven the current phase, out of all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoys: Option<EnvoyProgress>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyProgress {
    pub ready: i32,
    pub total: i32,
    /// Up to ten Envoys that have not, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lagging: Vec<String>,
}
