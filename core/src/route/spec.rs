//! What a user writes about a route: hosts, TLS, and HTTP rules with weighted backends.
//!
//! One vocabulary for every front-end: the TrafficRoute CRD embeds [`RouteSpec`] as its
//! spec, standalone files write it inline, and a Gateway API HTTPRoute lowers into it. The
//! JSON schema (with the CEL rules the API server enforces) is derived from these types;
//! what no schema can say is checked once, in [`super::check`].
//!
//! Every field is optional where the CRD makes it optional, and no type denies unknown
//! fields: an older replica must still read a route written for a newer CRD. Standalone
//! files are checked for unknown fields against the schema instead.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The route a user asks for: its hosts, TLS, and rules in match order.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    /// Host names this route serves (exact, or "*.example.com").
    #[schemars(
        length(min = 1, max = 16),
        inner(
            length(min = 1, max = 253),
            regex(
                pattern = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
            )
        ),
        extend("x-kubernetes-validations" = [{
            "rule": "self.all(h, self.exists_one(o, o == h))",
            "messageExpression": "'hosts must be unique: ' + self.filter(h, !self.exists_one(o, o == h))[0] + ' is repeated'"
        }])
    )]
    pub hosts: Vec<String>,

    /// Serve these hosts over HTTPS with the certificate in this Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<RouteTls>,

    /// HTTP rules, in match order: the first that matches a request wins.
    #[schemars(
        length(min = 1, max = 32),
        extend("x-kubernetes-validations" = [{
            "rule": "self.all(r, !has(r.name) || self.exists_one(o, has(o.name) && o.name == r.name))",
            "message": "rule names must be unique"
        }])
    )]
    pub rules: Vec<RouteRule>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
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

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "(has(self.redirectHttps) && self.redirectHttps) || has(self.redirect) || size(self.backends) > 0",
        "message": "a rule needs backends, or a redirect (redirect or redirectHttps) without backends"
    },
    {
        "rule": "!(has(self.redirectHttps) && self.redirectHttps) || size(self.backends) == 0",
        "message": "a rule with redirectHttps must not have backends"
    },
    {
        "rule": "!(has(self.rewritePrefix) && has(self.rewritePath))",
        "message": "give at most one of rewritePrefix, rewritePath"
    },
    {
        "rule": "!has(self.redirect) || size(self.backends) == 0",
        "message": "a rule with redirect must not have backends"
    },
    {
        "rule": "!(has(self.redirect) && has(self.redirectHttps) && self.redirectHttps)",
        "message": "give at most one of redirect, redirectHttps"
    },
    {
        "rule": "!has(self.redirect) || !has(self.redirect.prefix) || (has(self.match) && (has(self.match.pathPrefix) || has(self.match.pathSegmentPrefix)))",
        "message": "redirect.prefix replaces the prefix the rule matches: it needs match.pathPrefix or match.pathSegmentPrefix"
    },
    {
        "rule": "size(self.backends) == 0 || self.backends.exists(b, !has(b.weight) || b.weight > 0)",
        "message": "backend weights must not all be zero"
    }
]))]
pub struct RouteRule {
    /// Unique within the route; shown in status and metrics. An unnamed rule is called
    /// `rule-<index>`, so names of that form are reserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
        extend("x-kubernetes-validations" = [{
            "rule": "!self.matches('^rule-[0-9]+$')",
            "message": "names of the form rule-<number> are reserved for unnamed rules"
        }])
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

    /// Answer with a redirect instead of forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Redirect>,

    /// What the rule does to the requests it forwards.
    #[serde(flatten)]
    pub options: RuleOptions,
}

/// A CORS policy (the Gateway API's CORS filter, in the same words).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Cors {
    /// Origins allowed: exact (`https://app.example.com`), `*` for any, or with `*`
    /// standing for any run of characters other than `/` (`https://*.example.com`).
    #[schemars(
        length(min = 1, max = 64),
        inner(
            length(min = 1, max = 253),
            regex(pattern = r"^(\*|https?://[^/\s]+)$")
        )
    )]
    pub allow_origins: Vec<String>,
    /// Methods allowed, e.g. `GET`, or `*` (default: the CORS-safelisted GET, HEAD, POST).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(regex(pattern = r"^([A-Z]{1,16}|\*)$")))]
    pub allow_methods: Vec<String>,
    /// Request headers allowed beyond the CORS-safelisted ones, or `*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(
            length(min = 1, max = 256),
            regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
        )
    )]
    pub allow_headers: Vec<String>,
    /// Response headers a script may read beyond the CORS-safelisted ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(
            length(min = 1, max = 256),
            regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
        )
    )]
    pub expose_headers: Vec<String>,
    /// How long a browser may cache a preflight's answer, e.g. "10m" (whole seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub max_age: Option<String>,
    /// Let requests carry cookies and credentials (`Access-Control-Allow-Credentials`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
}

/// Requests each Envoy forwards for a rule: `requests` per `unit`, and up to `burst` more
/// at once after a quiet spell. Each Envoy counts alone: N Envoys let N times as many
/// through.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RateLimit {
    #[schemars(range(min = 1, max = 1000000))]
    pub requests: i32,
    /// `second`, `minute` or `hour`.
    #[schemars(regex(pattern = r"^(second|minute|hour)$"))]
    pub unit: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub burst: Option<i32>,
}

/// A rule's load balancing: the policy of its backends' clusters and the requests that
/// stick to one Pod.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.affinity) || !has(self.policy) || self.policy in ['ringHash', 'maglev']",
    "message": "affinity needs the policy ringHash or maglev (or no policy: ringHash)"
}]))]
pub struct LoadBalancer {
    /// `roundRobin` (the default), `leastRequest`, `random`, `ringHash` or `maglev`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(roundRobin|leastRequest|random|ringHash|maglev)$"))]
    pub policy: Option<String>,
    /// Session affinity: requests with the same cookie, header or client address go to the
    /// same Pod while it is ready (when Pods come and go, some move).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
}

/// Limits per backend cluster, on each Envoy (all its Pods together). Unset limits are
/// Envoy's: 1024 each, 3 retries.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default,
)]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreaker {
    /// Connections open to the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub max_connections: Option<i32>,
    /// Requests waiting for a connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub max_pending_requests: Option<i32>,
    /// Requests in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub max_requests: Option<i32>,
    /// Retries in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub max_retries: Option<i32>,
}

/// Passive health checking: after `consecutive5xx` errors in a row (5xx answers, resets,
/// refused connections) a Pod is ejected for `baseEjectionTime` times the number of its
/// ejections so far; at most `maxEjectionPercent` of the Pods are out at once.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default,
)]
#[serde(rename_all = "camelCase")]
pub struct OutlierDetection {
    /// Errors in a row that eject a Pod (default 5).
    #[serde(
        default,
        rename = "consecutive5xx",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 1000))]
    pub consecutive_5xx: Option<i32>,
    /// How often ejected Pods are looked at again (default "10s").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub interval: Option<String>,
    /// How long a first ejection lasts (default "30s").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub base_ejection_time: Option<String>,
    /// The most Pods out at once, in percent (default 10; one Pod may always go).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_ejection_percent: Option<i32>,
}

/// Active health checking over HTTP: every `interval`, each Envoy sends `GET path` to each
/// Pod; an answer other than 2xx within `timeout` is a failure. A Pod that fails
/// `unhealthyThreshold` checks in a row gets no traffic until it passes
/// `healthyThreshold` in a row. New Pods get traffic only once they pass one.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default,
)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// What each check asks for, e.g. `/healthz`.
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/[^\s]*$"))]
    pub path: String,
    /// The Host header of the checks (default `switchyard-health-check`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(
            pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(:[0-9]{1,5})?$"
        )
    )]
    pub host: Option<String>,
    /// Default "5s".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub interval: Option<String>,
    /// Default "1s".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub timeout: Option<String>,
    /// Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub unhealthy_threshold: Option<i32>,
    /// Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub healthy_threshold: Option<i32>,
}

/// The load-balancing policies, as the spec names them.
pub const LB_POLICIES: [&str; 5] = ["roundRobin", "leastRequest", "random", "ringHash", "maglev"];

/// What keeps a client on one Pod: exactly one of these.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "[has(self.cookie), has(self.header), has(self.sourceIP) && self.sourceIP].filter(x, x).size() == 1",
    "message": "give exactly one of cookie, header, sourceIP"
}]))]
pub struct Affinity {
    /// A cookie Envoy sets on the first answer when the request has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<AffinityCookie>,
    /// A request header, e.g. `x-user-id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
    )]
    pub header: Option<String>,
    /// The client's address (see the client IP settings behind a load balancer).
    #[serde(default, rename = "sourceIP", skip_serializing_if = "Option::is_none")]
    pub source_ip: Option<bool>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AffinityCookie {
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
    )]
    pub name: String,
    /// How long the browser keeps it, e.g. "1h" (default: for the browser session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub ttl: Option<String>,
    /// The cookie's Path (default: none, the browser's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/[^;\s]*$"))]
    pub path: Option<String>,
}

/// The units of a rate limit, with their length.
pub const RATE_LIMIT_UNITS: [(&str, u64); 3] = [("second", 1), ("minute", 60), ("hour", 3600)];

/// A redirect: each part given replaces the request's; the rest stays as requested.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!(has(self.path) && has(self.prefix))",
    "message": "give at most one of path, prefix"
}]))]
pub struct Redirect {
    /// `http` or `https`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?$"))]
    pub scheme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// The whole path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/"))]
    pub path: Option<String>,
    /// The part of the path the rule's prefix matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/"))]
    pub prefix: Option<String>,
    /// 301, 302 (the default), 303, 307 or 308.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self in [301, 302, 303, 307, 308]",
        "message": "a redirect's status code is 301, 302, 303, 307 or 308"
    }]))]
    pub status_code: Option<i32>,
}

/// The redirect status codes Envoy can send.
pub const REDIRECT_CODES: [i32; 5] = [301, 302, 303, 307, 308];

// A rule's options: what it does to the requests it forwards, flattened into the rule as
// written (`RouteRule`) and as resolved (`ResolvedRule`), which carries it whole. (A plain
// comment: flattened, a doc comment would become those rules' description.) The optional
// parts of more than a few machine words are boxed: held in place, they made a rule's
// options 896 bytes in every copy of every rule (the stores' TrafficRoutes and
// ProxyConfigs, the rollouts' reads), whatever the rule set; a box serializes as what it
// holds. A part a rule sets costs an allocation per copy instead.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RuleOptions {
    /// Whole-request timeout, e.g. "15s" (default: Envoy's 15s; "0s" disables). A gRPC
    /// request's deadline (`grpc-timeout`) replaces it when shorter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub timeout: Option<String>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub idle_timeout: Option<String>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<Box<Retries>>,

    /// Replace the matched path prefix before forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/"))]
    pub rewrite_prefix: Option<String>,

    /// Replace the whole path before forwarding (the query stays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/"))]
    pub rewrite_path: Option<String>,

    /// Replace the Host header before forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub rewrite_host: Option<String>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<Box<HeaderEdits>>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<Box<HeaderEdits>>,

    /// Let WebSocket upgrades (`Upgrade: websocket`) through to the backends. A rollout
    /// sends new WebSockets to the new backends and leaves open ones where they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub websocket: Option<bool>,

    /// Allow cross-origin requests from browsers: Envoy answers preflights (`OPTIONS`
    /// with `Access-Control-Request-Method`) and adds the CORS headers to answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<Box<Cors>>,

    /// Limit the requests each Envoy forwards for this rule; the rest are answered 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<Box<RateLimit>>,

    /// Answer requests whose body is larger than this many bytes with 413. Envoy buffers
    /// each request body (up to this size) before forwarding it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1073741824))]
    pub max_request_body_bytes: Option<i64>,

    /// How each Envoy picks a backend Pod, and which requests stick to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<Box<LoadBalancer>>,

    /// Limits each Envoy keeps on the rule's backends; what is over them is answered 503
    /// at once (`x-envoy-overloaded`) instead of queueing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<Box<CircuitBreaker>>,

    /// Passive health checking: a Pod that keeps answering errors is left out for a while.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<Box<OutlierDetection>>,

    /// Active health checking: each Envoy asks each Pod for a path, and a Pod that fails
    /// gets no traffic. A rollout waits for a Pod of each new backend to pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<Box<HealthCheck>>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "[has(self.pathPrefix), has(self.pathSegmentPrefix), has(self.pathExact), has(self.pathRegex)].filter(x, x).size() <= 1",
    "message": "give at most one of pathPrefix, pathSegmentPrefix, pathExact, pathRegex"
}]))]
pub struct RuleMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/"))]
    pub path_prefix: Option<String>,
    /// Whole path segments: `/api` matches `/api`, `/api/` and `/api/v1`, not `/apix` (a
    /// trailing `/` is ignored). The Gateway API's PathPrefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/"))]
    pub path_segment_prefix: Option<String>,
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
    /// The request's method, e.g. `GET`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 16), regex(pattern = r"^[A-Z]+$"))]
    pub method: Option<String>,
    /// Query parameters, all of which must match (the first of a repeated name counts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub query_params: Vec<QueryParamMatch>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "[has(self.exact), has(self.regex), has(self.present) && self.present].filter(x, x).size() == 1",
    "message": "give exactly one of exact, regex, present"
}]))]
pub struct QueryParamMatch {
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[^&=#\s]+$"))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "[has(self.exact), has(self.prefix), has(self.regex), has(self.present) && self.present].filter(x, x).size() == 1",
    "message": "give exactly one of exact, prefix, regex, present"
}]))]
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

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.port) != has(self.portName)",
    "message": "give exactly one of port, portName"
}]))]
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

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Retries {
    /// How many times a failed request is tried again, at most 100.
    #[schemars(range(min = 0, max = 100))]
    pub attempts: i32,
    /// Envoy retry conditions, one per item (default: connect-failure, refused-stream):
    /// 5xx, gateway-error, reset, reset-before-request, connect-failure, refused-stream,
    /// retriable-4xx, retriable-status-codes, envoy-ratelimited, http3-post-connect-failure,
    /// and for gRPC cancelled, deadline-exceeded, internal, resource-exhausted, unavailable.
    /// Quote the key in YAML: a bare `on` is read as `true` by YAML 1.1 parsers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(regex(
            pattern = r"^(5xx|gateway-error|reset|reset-before-request|connect-failure|refused-stream|retriable-4xx|retriable-status-codes|envoy-ratelimited|http3-post-connect-failure|cancelled|deadline-exceeded|internal|resource-exhausted|unavailable)$"
        ))
    )]
    pub on: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub per_try_timeout: Option<String>,
    /// Answer codes a request is retried on, e.g. [503]; they add the condition
    /// `retriable-status-codes` to `on`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(range(min = 400, max = 599)))]
    pub status_codes: Vec<i32>,
    /// Envoy's base interval between tries, e.g. "100ms" (default 25ms): it waits a random
    /// time up to this before the first retry, up to three times this before the second,
    /// and so on, at most ten times this (exponential backoff, fully jittered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h)$"))]
    pub backoff: Option<String>,
}

/// The retry conditions Envoy knows (`x-envoy-retry-on` and `x-envoy-retry-grpc-on`);
/// it ignores any other word, so a rule naming one would not retry as written.
pub const RETRY_CONDITIONS: [&str; 15] = [
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "refused-stream",
    "retriable-4xx",
    "retriable-status-codes",
    "envoy-ratelimited",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

/// Retry conditions when a rule names none.
pub const DEFAULT_RETRY_ON: [&str; 2] = ["connect-failure", "refused-stream"];

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HeaderEdits {
    /// Replace or add: header name (an RFC 9110 token, not `host`) → value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(
        schema_with = "header_map",
        extend("x-kubernetes-validations" = [
            { "rule": HEADER_NAMES_ARE_TOKENS, "message": HEADER_NAMES_MESSAGE },
            { "rule": NOT_HOST, "message": NOT_HOST_MESSAGE }
        ])
    )]
    pub set: BTreeMap<String, String>,
    /// Append, keeping existing values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(
        schema_with = "header_map",
        extend("x-kubernetes-validations" = [
            { "rule": HEADER_NAMES_ARE_TOKENS, "message": HEADER_NAMES_MESSAGE },
            { "rule": NOT_HOST, "message": NOT_HOST_MESSAGE }
        ])
    )]
    pub add: BTreeMap<String, String>,
    /// Header names to remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        inner(
            length(min = 1, max = 256),
            regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
        ),
        extend("x-kubernetes-validations" = [{ "rule": NOT_HOST, "message": NOT_HOST_MESSAGE }])
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

#[cfg(test)]
mod tests {
    use super::*;

    fn properties<T: JsonSchema>() -> Vec<String> {
        let schema = schemars::schema_for!(T);
        let mut keys: Vec<String> = schema
            .get("properties")
            .and_then(|p| p.as_object())
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        keys.sort();
        keys
    }

    #[test]
    fn every_rule_option_is_a_field_of_the_rule() {
        let rule = properties::<RouteRule>();
        for option in properties::<RuleOptions>() {
            assert!(rule.contains(&option), "RouteRule lacks {option}");
        }
    }

    #[test]
    fn a_rule_hands_over_every_option_as_written() {
        let options = RuleOptions {
            timeout: Some("1s".into()),
            idle_timeout: Some("2m".into()),
            retries: Some(Box::new(Retries {
                attempts: 2,
                on: vec!["5xx".into()],
                per_try_timeout: Some("250ms".into()),
                status_codes: vec![503],
                backoff: Some("50ms".into()),
            })),
            rewrite_prefix: Some("/v2".into()),
            rewrite_path: Some("/index.html".into()),
            rewrite_host: Some("backend.internal".into()),
            request_headers: Some(Box::new(HeaderEdits {
                remove: vec!["x-a".into()],
                ..HeaderEdits::default()
            })),
            response_headers: Some(Box::new(HeaderEdits {
                set: BTreeMap::from([("x-b".into(), "1".into())]),
                ..HeaderEdits::default()
            })),
            websocket: Some(true),
            cors: Some(Box::new(Cors {
                allow_origins: vec!["https://app.example.com".into()],
                max_age: Some("10m".into()),
                ..Cors::default()
            })),
            rate_limit: Some(Box::new(RateLimit {
                requests: 10,
                unit: "second".into(),
                burst: Some(5),
            })),
            max_request_body_bytes: Some(1024),
            load_balancer: Some(Box::new(LoadBalancer {
                policy: Some("maglev".into()),
                affinity: Some(Affinity {
                    header: Some("x-user".into()),
                    ..Affinity::default()
                }),
            })),
            circuit_breaker: Some(Box::new(CircuitBreaker {
                max_connections: Some(10),
                ..CircuitBreaker::default()
            })),
            outlier_detection: Some(Box::new(OutlierDetection {
                consecutive_5xx: Some(3),
                ..OutlierDetection::default()
            })),
            health_check: Some(Box::new(HealthCheck {
                path: "/healthz".into(),
                ..HealthCheck::default()
            })),
        };
        let json = serde_json::to_value(&options).expect("serializes");
        assert_eq!(
            json.as_object().map(|o| o.len()),
            Some(properties::<RuleOptions>().len()),
            "the test sets every option"
        );
        let rule: RouteRule = serde_json::from_value(json).expect("a rule");
        assert_eq!(rule.options.clone(), options);
    }

    /// Every copy of every rule holds its options in place (see [`RuleOptions`]): an
    /// optional part left unboxed again would grow each by its size, which the RSS record
    /// (3 %) lets through.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_rules_options_and_a_resolved_cluster_stay_small() {
        use crate::route::resolved::{ResolvedCluster, ResolvedRule};
        use std::mem::size_of;
        assert!(
            size_of::<RuleOptions>() <= 216,
            "{}",
            size_of::<RuleOptions>()
        );
        assert!(size_of::<RouteRule>() <= 552, "{}", size_of::<RouteRule>());
        assert!(
            size_of::<ResolvedRule>() <= 576,
            "{}",
            size_of::<ResolvedRule>()
        );
        assert!(
            size_of::<ResolvedCluster>() <= 136,
            "{}",
            size_of::<ResolvedCluster>()
        );
    }
}
