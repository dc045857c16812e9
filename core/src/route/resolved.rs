//! A route resolved: rules named, defaults applied, and each backend mapped to the cluster
//! of a concrete service port, as the assembly step ([`super::assemble`]) makes it for
//! every front-end. This is what the Kubernetes front-ends store in their ProxyConfigs (the
//! JSON shape is that CRD's), and what [`super::lower`] turns into the model in every mode.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::model::ListenerProtocol;

use super::spec::{
    CircuitBreaker, HeaderEdits, HealthCheck, OutlierDetection, Redirect, RuleMatch, RuleOptions,
};

/// What resolving a route's spec against its services gives.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedRoute {
    pub virtual_host: ResolvedVirtualHost,
    /// Every cluster the rules reference, sorted and deduplicated.
    pub clusters: Vec<ResolvedCluster>,
    /// [`crate::hash::digest_of`] the virtual host (and listener, when it has one): the
    /// version the live config announces.
    pub version: String,
    /// The Gateway listener it is served on; None: the shared listeners.
    pub listener: Option<ResolvedListener>,
}

/// A port of a Gateway as every Envoy serves it (see [`crate::model::GatewayListener`]).
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Default,
)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedListener {
    /// Unique and stable: `<namespace>/<gateway>/<port>/<protocol>`.
    #[schemars(length(min = 1, max = 512))]
    pub name: String,
    /// The port on every Envoy.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// The internal port where its version probes answer.
    #[schemars(range(min = 1, max = 65535))]
    pub probe_port: i32,
    /// HTTPS: its virtual hosts are served by SNI, each with its certificate.
    #[serde(default)]
    pub tls: bool,
    /// HTTPS: the certificate for a name no virtual host has (or no name at all): the
    /// handshake succeeds and the request gets 404.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_certificate: Option<SecretRef>,
    /// HTTPS: the client certificates its connections are checked against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_validation: Option<ClientValidation>,
    /// What it forwards: HTTP requests (absent), TLS or TCP connections, each sent whole
    /// to the backends of its virtual host's one rule, or UDP datagrams, sent to those
    /// backends by session (client address and port).
    #[serde(default, skip_serializing_if = "ListenerProtocol::is_http")]
    pub protocol: ListenerProtocol,
}

/// How an HTTPS port checks the certificates clients present (a Gateway's
/// `tls.frontend.validation`).
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Default,
)]
#[serde(rename_all = "camelCase")]
pub struct ClientValidation {
    /// The certificates (PEM) of the authorities a client certificate must chain to.
    #[schemars(length(min = 1))]
    pub ca_certificates: String,
    /// A client without a certificate, or with one that does not verify, is served too
    /// (the Gateway API's `AllowInsecureFallback`); otherwise its handshake fails.
    #[serde(default)]
    pub insecure_fallback: bool,
}

/// A Secret, by namespace and name.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default,
)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedVirtualHost {
    /// The route's hosts, lower-cased (at most 16 in the spec, so here).
    #[schemars(length(max = 16))]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ResolvedTls>,
    /// One per rule of the spec (at most 32 there, so here). The bound also keeps the
    /// cost of the CEL rules of `match` (shared with the spec) within the API server's
    /// budget: without it, the CRD is refused.
    #[schemars(length(max = 32))]
    pub rules: Vec<ResolvedRule>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedTls {
    /// The Secret's namespace when it is not the route's (a Gateway's certificateRef to
    /// another namespace, allowed by a ReferenceGrant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: Option<String>,
    pub secret_name: String,
    pub redirect_http: bool,
    /// On a Gateway port where several listeners serve TLS: the hostname of the listener
    /// this virtual host belongs to (`*`: the one without a hostname; `-`: none). A
    /// request that came in on another listener's connection (its TLS server name chose
    /// another certificate) is answered 421 Misdirected Request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub listener_hostname: Option<String>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedRule {
    pub name: String,
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub matches: Option<RuleMatch>,
    /// The rule's backends (at most 8 in the spec, so here).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub backends: Vec<ResolvedBackend>,
    #[serde(default)]
    pub redirect_https: bool,
    /// As the spec gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Redirect>,
    /// The weight, next to the backends', of the requests answered 500: the share of
    /// backends the front-end could not use (the Gateway API's invalid backendRefs).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 1000000))]
    pub unavailable_weight: i32,
    /// The rule serves gRPC calls (a Gateway API GRPCRoute's): its share of unavailable
    /// backends (all of its requests when it has no backend) is answered 503, which a gRPC
    /// client reads as UNAVAILABLE, rather than 500.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub grpc: bool,
    /// Service ports that get a copy of the rule's requests (at most 16, as a Gateway API
    /// rule has filters).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub mirrors: Vec<ResolvedMirror>,
    /// As the spec gives them.
    #[serde(flatten)]
    pub options: RuleOptions,
}

/// A copy of a share of a rule's requests, sent to a service port; its answers are dropped.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedMirror {
    pub cluster: ResolvedCluster,
    /// The share of requests copied, in a million; absent: every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub per_million: Option<i32>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedBackend {
    pub cluster: ResolvedCluster,
    pub weight: i32,
    /// Edits of the requests sent to this backend alone, after the rule's (a Gateway API
    /// backendRef's RequestHeaderModifier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HeaderEdits>,
}

/// A service port, resolved: the port number, and the name its endpoints use for it.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default,
)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedCluster {
    /// The service's namespace when it is not the route's (a Gateway API backendRef to
    /// another namespace, allowed by a ReferenceGrant). Absent otherwise, so the versions
    /// of same-namespace routes stay what they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: Option<String>,
    pub service: String,
    pub port: i32,
    /// The service port's name ("" when unnamed): Kubernetes EndpointSlice ports carry it.
    #[serde(default)]
    pub port_name: String,
    /// Upstream HTTP/2 (appProtocol h2c or kubernetes.io/h2c).
    #[serde(default)]
    pub http2: bool,
    /// A UDP port of the Service (a UDPRoute's backend): a cluster of its own, apart from
    /// a TCP port of the same number.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub udp: bool,
    /// The load-balancing policy of the rule that sends here, when not round robin: a
    /// cluster of its own (see `model::cluster_name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(leastRequest|random|ringHash|maglev)$"))]
    pub lb_policy: Option<String>,
    // The optional parts below are boxed, as a rule's options are (`spec::RuleOptions`):
    // held in place they took most of the 432 bytes of every copy of every cluster.
    /// The limits of the rule that sends here (a cluster of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<Box<CircuitBreaker>>,
    /// The passive health checking of the rule that sends here (a cluster of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<Box<OutlierDetection>>,
    /// The active health checking of the rule that sends here (a cluster of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<Box<HealthCheck>>,
    /// TLS to the backend (a Gateway API BackendTLSPolicy): a cluster of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Box<UpstreamTls>>,
}

/// How a cluster's connections to its backend are encrypted and the backend's certificate
/// checked.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default,
)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamTls {
    /// The server name sent (SNI); the backend's certificate must be for it, unless
    /// `subjectAltNames` says what it must be for.
    #[schemars(length(min = 1, max = 253))]
    pub hostname: String,
    /// The certificates (PEM) of the authorities the backend's certificate must chain to.
    #[schemars(length(min = 1))]
    pub ca_certificates: String,
    /// Names of which the backend's certificate must hold one (instead of `hostname`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub subject_alt_names: Vec<SubjectAltName>,
    /// The TLS Secret whose certificate the fleet presents to the backend (a Gateway's
    /// `tls.backend.clientCertificateRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<SecretRef>,
}

/// A name a certificate holds: a DNS name or a URI.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "camelCase")]
pub enum SubjectAltName {
    Hostname(String),
    Uri(String),
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}
