//! `TrafficRoute`: what a user asks for. Switchyard writes its status, never its spec (I7).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

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
    /// Host names this route serves (exact, or "*.example.com").
    #[x_kube(validation = Rule::new("self.all(h, self.exists_one(o, o == h))").message(Message::Expression("'hosts must be unique: ' + self.filter(h, !self.exists_one(o, o == h))[0] + ' is repeated'".into())))]
    #[schemars(
        length(min = 1, max = 16),
        inner(
            length(min = 1, max = 253),
            regex(
                pattern = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
            )
        )
    )]
    pub hosts: Vec<String>,

    /// Serve these hosts over HTTPS with the certificate in this Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<RouteTls>,

    /// HTTP rules, in match order: the first that matches a request wins.
    #[x_kube(validation = Rule::new("self.all(r, !has(r.name) || self.exists_one(o, has(o.name) && o.name == r.name))").message("rule names must be unique"))]
    #[schemars(length(min = 1, max = 32))]
    pub rules: Vec<RouteRule>,

    /// How changes roll out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSettings>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RouteTls {
    /// A `kubernetes.io/tls` Secret in the route's namespace.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub secret_name: String,
    /// Redirect plain-HTTP requests for these hosts to HTTPS (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_http: Option<bool>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.redirectHttps) && self.redirectHttps) || size(self.backends) > 0").message("a rule needs backends, or redirectHttps without backends"))]
#[x_kube(validation = Rule::new("!(has(self.redirectHttps) && self.redirectHttps) || size(self.backends) == 0").message("a rule with redirectHttps must not have backends"))]
#[x_kube(validation = Rule::new("size(self.backends) == 0 || self.backends.exists(b, !has(b.weight) || b.weight > 0)").message("backend weights must not all be zero"))]
pub struct RouteRule {
    /// Unique within the route; shown in status and metrics. An unnamed rule is called
    /// `rule-<index>`, so names of that form are reserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!self.matches('^rule-[0-9]+$')").message("names of the form rule-<number> are reserved for unnamed rules"))]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: Option<String>,

    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub matches: Option<RuleMatch>,

    /// Where matching requests go, split by weight.
    #[serde(default)]
    #[schemars(length(max = 8))]
    pub backends: Vec<Backend>,

    /// Answer with a redirect to HTTPS instead of forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_https: Option<bool>,

    /// Whole-request timeout, e.g. "15s" (default: Envoy's 15s; "0s" disables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub timeout: Option<String>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub idle_timeout: Option<String>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<Retries>,

    /// Replace the matched path prefix before forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/"))]
    pub rewrite_prefix: Option<String>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HeaderEdits>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HeaderEdits>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.pathPrefix), has(self.pathExact), has(self.pathRegex)].filter(x, x).size() <= 1").message("give at most one of pathPrefix, pathExact, pathRegex"))]
pub struct RuleMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/"))]
    pub path_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/"))]
    pub path_exact: Option<String>,
    /// RE2 syntax.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub path_regex: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub headers: Vec<HeaderMatch>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.exact), has(self.prefix), has(self.regex), has(self.present) && self.present].filter(x, x).size() == 1").message("give exactly one of exact, prefix, regex, present"))]
pub struct HeaderMatch {
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
    )]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096), regex(pattern = r"^[^\r\n\x00]*$"))]
    pub exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096), regex(pattern = r"^[^\r\n\x00]*$"))]
    pub prefix: Option<String>,
    /// RE2 syntax.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
    /// Match requests that do NOT match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invert: Option<bool>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.port) != has(self.portName)").message("give exactly one of port, portName"))]
pub struct Backend {
    /// A Service in the route's namespace.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub service: String,
    /// The Service port, by number...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// ...or by name. A Service port's name is a DNS label (up to 63 characters; the
    /// 15-character limit is for container ports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub port_name: Option<String>,
    /// Relative share of traffic (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10000))]
    pub weight: Option<i32>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Retries {
    #[schemars(range(min = 0, max = 10))]
    pub attempts: i32,
    /// Envoy retry conditions, one per item (default: connect-failure, refused-stream).
    /// Quote the key in YAML: a bare `on` is read as `true` by YAML 1.1 parsers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(length(min = 1, max = 64), regex(pattern = r"^[a-z0-9-]+$"))
    )]
    pub on: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub per_try_timeout: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HeaderEdits {
    /// Replace or add: header name (an RFC 9110 token, not `host`) → value.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new(HEADER_NAMES_ARE_TOKENS).message(HEADER_NAMES_MESSAGE))]
    #[x_kube(validation = Rule::new(NOT_HOST).message(NOT_HOST_MESSAGE))]
    #[schemars(schema_with = "header_map")]
    pub set: std::collections::BTreeMap<String, String>,
    /// Append, keeping existing values.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new(HEADER_NAMES_ARE_TOKENS).message(HEADER_NAMES_MESSAGE))]
    #[x_kube(validation = Rule::new(NOT_HOST).message(NOT_HOST_MESSAGE))]
    #[schemars(schema_with = "header_map")]
    pub add: std::collections::BTreeMap<String, String>,
    /// Header names to remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new(NOT_HOST).message(NOT_HOST_MESSAGE))]
    #[schemars(
        length(max = 32),
        inner(
            length(min = 1, max = 256),
            regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
        )
    )]
    pub remove: Vec<String>,
}

/// Header name → value, at most 32; values of at most 4096 bytes without CR, LF or NUL.
fn header_map(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": 32,
        "additionalProperties": {
            "type": "string",
            "maxLength": 4096,
            "pattern": "^[^\\r\\n\\x00]*$"
        }
    })
}

/// Map keys have no schema of their own: their rule is CEL on the map.
const HEADER_NAMES_ARE_TOKENS: &str =
    "self.all(k, k.matches('^[A-Za-z0-9!#$%&\\x27*+.^_`|~-]{1,256}$'))";
const HEADER_NAMES_MESSAGE: &str = "header names must be RFC 9110 tokens (letters, digits, !#$%&'*+.^_`|~-) of 1 to 256 characters";
/// Envoy refuses to edit `host` (and pseudo-headers, which are not tokens).
const NOT_HOST: &str = "self.all(k, k.lowerAscii() != 'host')";
const NOT_HOST_MESSAGE: &str = "the host header cannot be edited: it chose the route";

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSettings {
    /// How long old backends keep their clusters after the switch (default "10s").
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
