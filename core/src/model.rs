//! The routing model: what every Envoy of the fleet should serve.
//!
//! This is the translator's input. It knows nothing of Kubernetes (the operator resolves
//! ProxyConfigs, Services and EndpointSlices into it) and nothing of Envoy's protobufs
//! (the translator turns it into xDS resources).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A full routing configuration. Every list is kept in a stable order by the translator,
/// so the order in which callers fill it does not matter (I6).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub listeners: ListenerSettings,
    /// Listeners of Gateways, each on a port of its own with a route configuration of its
    /// own; virtual hosts that name one are served there only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateway_listeners: Vec<GatewayListener>,
    pub virtual_hosts: Vec<VirtualHost>,
    /// Every cluster that routes or probes may reference, with its endpoints.
    pub clusters: Vec<Cluster>,
    pub secrets: Vec<TlsSecret>,
    /// Readiness checks served on the probe listener (see DESIGN.md, "Cluster readiness").
    pub endpoint_probes: Vec<EndpointProbe>,
    /// Live-version checks answered by the route configuration itself.
    pub version_probes: Vec<VersionProbe>,
}

/// Where the listeners bind. The probe listener is internal: the public Service never
/// exposes its port.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ListenerSettings {
    pub address: String,
    pub http_port: u16,
    pub https_port: u16,
    pub probe_port: u16,
    /// Shared secret that every probe request must carry; without it the probe
    /// listener answers nothing but 404.
    pub probe_token: String,
    /// What the public listeners log (the probes' log nothing).
    #[serde(default, skip_serializing_if = "AccessLog::is_default")]
    pub access_log: AccessLog,
    /// Which address of a request is its client's.
    #[serde(default, skip_serializing_if = "ClientIp::is_default")]
    pub client_ip: ClientIp,
    /// Also serve each route configuration in parts, one virtual host a resource (VHDS),
    /// which delta Envoys take instead: a route change then sends that route's virtual
    /// host, not every one (see `xds::vhds`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub virtual_host_discovery: bool,
}

/// Where the public listeners find the client's address: by default the connection's
/// peer. Behind proxies or load balancers, what they say.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientIp {
    /// Proxies in front of Envoy that each append the address they got a request from to
    /// X-Forwarded-For: the client is the address this many from the right. 0 trusts no
    /// X-Forwarded-For (a client can write anything there).
    #[serde(default)]
    #[schemars(range(max = 10))]
    pub xff_trusted_hops: u32,
    /// Read the client's address from a PROXY protocol header (v1 or v2) that a load
    /// balancer puts before each connection's bytes; connections without one are served
    /// with their own source address.
    #[serde(default)]
    pub proxy_protocol: bool,
}

/// More proxies in a row than anyone runs in front of an ingress.
pub const MAX_TRUSTED_HOPS: u32 = 10;

impl ClientIp {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Envoy's access log of the requests through its public listeners, to its stdout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccessLog {
    #[serde(default)]
    pub format: AccessLogFormat,
    /// Of every 100 requests, how many are logged (100: all, at most).
    #[serde(default = "all")]
    #[schemars(range(max = 100))]
    pub sample_percent: u32,
}

fn all() -> u32 {
    100
}

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum AccessLogFormat {
    /// One JSON object a line.
    #[default]
    Json,
    /// Envoy's default text line.
    Text,
    /// Nothing logged.
    Off,
}

impl Default for AccessLog {
    fn default() -> Self {
        Self {
            format: AccessLogFormat::Json,
            sample_percent: 100,
        }
    }
}

impl AccessLog {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Parses `json`, `text` or `off`.
    pub fn format_named(name: &str) -> Option<AccessLogFormat> {
        match name {
            "json" => Some(AccessLogFormat::Json),
            "text" => Some(AccessLogFormat::Text),
            "off" => Some(AccessLogFormat::Off),
            _ => None,
        }
    }
}

impl Default for ListenerSettings {
    fn default() -> Self {
        Self {
            address: "0.0.0.0".into(),
            http_port: 8080,
            https_port: 8443,
            probe_port: 8090,
            probe_token: String::new(),
            access_log: AccessLog::default(),
            client_ip: ClientIp::default(),
            // The translator's own default; the operator and standalone files ask for
            // the parts unless told not to.
            virtual_host_discovery: false,
        }
    }
}

/// A port of a Gateway, served by every Envoy of the fleet.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GatewayListener {
    /// Unique, stable name; also the name of its route configuration.
    pub name: String,
    pub port: u16,
    /// Internal port answering with the same route configuration over plain HTTP: the
    /// version probes of its virtual hosts answer there, whatever the public protocol.
    pub probe_port: u16,
    /// HTTPS: one filter chain per TLS virtual host, chosen by SNI.
    pub tls: bool,
    /// HTTPS: the [`TlsSecret`] of the filter chain for any other name (or none): the
    /// handshake succeeds and routing answers 404.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_secret: Option<String>,
    /// HTTPS: the client certificates every filter chain of the port checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_validation: Option<ClientValidation>,
    /// What it forwards: requests (its virtual hosts route them), or connections.
    #[serde(default, skip_serializing_if = "ListenerProtocol::is_http")]
    pub protocol: ListenerProtocol,
}

/// What a Gateway listener forwards.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum ListenerProtocol {
    /// HTTP requests, routed by their virtual hosts (HTTPS with TLS).
    #[default]
    Http,
    /// TLS connections, each sent whole to the backends of the virtual host its server
    /// name (SNI) chooses: passed through as they are, or, for a virtual host with a
    /// certificate, decrypted first.
    Tls,
    /// TCP connections, sent whole to the backends of its one virtual host.
    Tcp,
    /// UDP datagrams, sent to the backends of its one virtual host: those of one client
    /// address and port (a session) to one backend.
    Udp,
}

impl ListenerProtocol {
    pub fn is_http(&self) -> bool {
        *self == Self::Http
    }
}

/// How a Gateway port checks client certificates.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClientValidation {
    /// PEM certificates of the authorities a client certificate must chain to.
    pub ca_certificates: String,
    /// Clients without a certificate, or with one that does not verify, are served too.
    pub insecure_fallback: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VirtualHost {
    /// Unique, stable name (e.g. "namespace/route").
    pub name: String,
    /// The [`GatewayListener`] it is served on; None: the shared listeners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<String>,
    pub hosts: Vec<String>,
    pub tls: Option<VirtualHostTls>,
    pub routes: Vec<Route>,
    /// Its route is gone and it serves only until another virtual host takes its hosts
    /// over: any other claimant of a host wins over it.
    #[serde(default)]
    pub leaving: bool,
    /// When its route was created (seconds since the Unix epoch): of the virtual hosts
    /// asking for one host, the oldest gets it, then the first by name. None counts as
    /// newest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VirtualHostTls {
    /// Name of a [`TlsSecret`] in the same config.
    pub secret: String,
    /// Plain-HTTP requests for these hosts are redirected to HTTPS.
    pub redirect_http: bool,
    /// See [`crate::route::ResolvedTls::listener_hostname`]: its filter chain tags each
    /// request with it, and the virtual host answers 421 to a request tagged otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener_hostname: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Route {
    pub name: String,
    pub path: PathMatch,
    pub headers: Vec<HeaderMatch>,
    /// The request's method, when the route asks for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<QueryMatch>,
    pub action: RouteAction,
    pub request_headers: HeaderEdits,
    pub response_headers: HeaderEdits,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PathMatch {
    Prefix(String),
    /// The path and every path below it, by whole segments: `/api` matches `/api` and
    /// `/api/v1`, not `/apix`. Never `/` and never ending in `/` (lowering sees to it).
    SegmentPrefix(String),
    Exact(String),
    Regex(String),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeaderMatch {
    pub name: String,
    pub value: HeaderValueMatch,
    pub invert: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum HeaderValueMatch {
    Exact(String),
    Prefix(String),
    Regex(String),
    Present,
}

/// A query parameter the request must carry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueryMatch {
    pub name: String,
    pub value: QueryValueMatch,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum QueryValueMatch {
    Exact(String),
    Regex(String),
    Present,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RouteAction {
    Forward(Forward),
    /// Answer with a redirect to the same path over HTTPS.
    RedirectHttps,
    Redirect(Redirect),
    /// Answer with this status and no body: a rule none of whose backends can be used
    /// (500, as the Gateway API says).
    Respond(u16),
}

/// A redirect; what is not given stays as requested.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Redirect {
    pub scheme: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub path: Option<RedirectPath>,
    /// 301, 302, 303, 307 or 308.
    pub status: u16,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RedirectPath {
    /// The whole path.
    Full(String),
    /// The part the route's prefix matched.
    Prefix(String),
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Forward {
    pub backends: Vec<WeightedCluster>,
    pub timeout: Option<Duration>,
    pub idle_timeout: Option<Duration>,
    /// Boxed: most routes have none, and it would make every route action larger.
    pub retry: Option<Box<RetryPolicy>>,
    pub prefix_rewrite: Option<String>,
    /// The whole path, replaced (the query stays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_rewrite: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_rewrite: Option<String>,
    /// WebSocket upgrades pass through to the backends.
    #[serde(default)]
    pub websocket: bool,
    /// Cross-origin requests allowed: Envoy answers preflights and adds the CORS headers.
    /// (Boxed: most routes have none, and every route action is as large as this one.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<Box<Cors>>,
    /// Requests each Envoy lets through; the rest are answered 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// Larger request bodies are answered 413; Envoy buffers each body up to this size
    /// before forwarding it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_bytes: Option<u32>,
    /// What keeps a client on one endpoint (its clusters hash: ring hash or Maglev).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Clusters that get a copy of the requests (their answers are dropped).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<Mirror>,
    /// The weight, next to `backends`', of the requests answered 500: the share of
    /// backends the front-end could not use (the Gateway API's invalid backendRefs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unavailable_weight: u32,
    /// gRPC calls: that share is answered 503, which a gRPC client reads as UNAVAILABLE (a
    /// 500 as UNKNOWN).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub grpc: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The name a route's share of 500s is sent to: no cluster has it (every cluster name has
/// three segments or more, see [`cluster_name`]), and a route with such a share answers
/// 500 for a cluster it does not find.
pub const UNAVAILABLE_CLUSTER: &str = "switchyard/unavailable";

/// A copy of a share of a route's requests, sent to another cluster; the client gets the
/// answer of the route's own backends only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Mirror {
    /// Name of a [`Cluster`] in the same config.
    pub cluster: String,
    /// The share of requests copied, `numerator` in a million; None: every request.
    pub per_million: Option<u32>,
}

/// What a request is hashed by, to pick the same endpoint for the same value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Affinity {
    /// Envoy sets the cookie when the request has none; `ttl` zero: a session cookie.
    Cookie {
        name: String,
        ttl: Duration,
        path: Option<String>,
    },
    Header(String),
    SourceIp,
}

/// A CORS policy. Origins are exact (`https://app.example.com`), `*` for any, or hold `*`
/// for any run of characters other than `/` (`https://*.example.com`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cors {
    pub allow_origins: Vec<String>,
    pub allow_methods: Vec<String>,
    pub allow_headers: Vec<String>,
    pub expose_headers: Vec<String>,
    /// How long a browser may cache a preflight's answer.
    pub max_age: Option<Duration>,
    pub allow_credentials: bool,
}

/// A token bucket per Envoy: `requests` every `per`, up to `requests + burst` at once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateLimit {
    pub requests: u32,
    pub per: Duration,
    pub burst: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WeightedCluster {
    /// Name of a [`Cluster`] in the same config.
    pub cluster: String,
    pub weight: u32,
    /// Edits of the requests sent to this cluster, after the route's own.
    #[serde(default, skip_serializing_if = "HeaderEdits::is_empty")]
    pub request_headers: HeaderEdits,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Envoy retry conditions, e.g. "5xx", "connect-failure".
    pub retry_on: Vec<String>,
    pub num_retries: u32,
    pub per_try_timeout: Option<Duration>,
    /// Answer codes retried under the condition `retriable-status-codes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retriable_status_codes: Vec<u32>,
    /// The least wait before a retry (Envoy's default when None).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Duration>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HeaderEdits {
    /// Replace (or add) these headers.
    pub set: Vec<(String, String)>,
    /// Append these headers, keeping existing values.
    pub add: Vec<(String, String)>,
    pub remove: Vec<String>,
}

impl HeaderEdits {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }
}

/// One upstream: a port of a Service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// Readable and stable, see [`cluster_name`].
    pub name: String,
    pub service: ServiceRef,
    pub settings: ClusterSettings,
    pub endpoints: Vec<Endpoint>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    pub port: u16,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClusterSettings {
    pub connect_timeout: Duration,
    pub http2: bool,
    pub circuit_breakers: Option<CircuitBreakers>,
    #[serde(default, skip_serializing_if = "LbPolicy::is_default")]
    pub lb_policy: LbPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// TLS to the endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
    /// Datagrams to a UDP port (the name says so: `.../udp`); Envoy's UDP proxy holds one
    /// session per client, and those sessions are not capped as connections are.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub udp: bool,
}

/// TLS from Envoy to a cluster's endpoints.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UpstreamTls {
    /// The server name sent (SNI), and the name the certificate must be for when
    /// `subject_alt_names` is empty.
    pub sni: String,
    /// PEM certificates of the authorities the endpoint's certificate must chain to.
    pub ca_certificates: String,
    /// Names of which the endpoint's certificate must hold one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<SubjectAltName>,
    /// Name of a [`TlsSecret`] whose certificate Envoy presents to the endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<String>,
}

/// A name a certificate holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SubjectAltName {
    Dns(String),
    Uri(String),
}

/// How Envoy picks an endpoint of a cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LbPolicy {
    #[default]
    RoundRobin,
    LeastRequest,
    Random,
    RingHash,
    Maglev,
}

impl LbPolicy {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The policy a spec names (`leastRequest`, ...); None for an unknown name.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "roundRobin" => Some(Self::RoundRobin),
            "leastRequest" => Some(Self::LeastRequest),
            "random" => Some(Self::Random),
            "ringHash" => Some(Self::RingHash),
            "maglev" => Some(Self::Maglev),
            _ => None,
        }
    }
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            http2: false,
            circuit_breakers: None,
            lb_policy: LbPolicy::RoundRobin,
            outlier_detection: None,
            health_check: None,
            tls: None,
            udp: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CircuitBreakers {
    pub max_connections: Option<u32>,
    pub max_pending_requests: Option<u32>,
    pub max_requests: Option<u32>,
    pub max_retries: Option<u32>,
}

/// Passive health checking: ejection of hosts that answer errors in a row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OutlierDetection {
    pub consecutive_5xx: u32,
    pub interval: Duration,
    pub base_ejection_time: Duration,
    pub max_ejection_percent: u32,
}

/// Active HTTP health checking of every host.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HealthCheck {
    pub path: String,
    pub host: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub unhealthy_threshold: u32,
    pub healthy_threshold: u32,
}

/// The readable, stable cluster name for a Service port: `namespace/name/port` (and `/udp`
/// for a UDP port), with a short hash of the settings appended when they are not the
/// defaults, so two routes that ask for different settings get two clusters instead of
/// fighting over one.
pub fn cluster_name(service: &ServiceRef, settings: &ClusterSettings) -> String {
    let mut base = format!("{}/{}/{}", service.namespace, service.name, service.port);
    if settings.udp {
        base.push_str("/udp");
    }
    let default = ClusterSettings {
        udp: settings.udp,
        ..ClusterSettings::default()
    };
    if *settings == default {
        base
    } else {
        let digest = crate::hash::digest_of(settings);
        format!("{base}/{}", &digest[..8])
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Endpoint {
    pub address: String,
    pub port: u16,
    pub condition: EndpointCondition,
    pub zone: Option<String>,
    /// Its Service's EndpointSlices were deleted (the Service with them, usually): the
    /// endpoint is held as it last was, so that traffic live on it keeps flowing while a
    /// route moves away; it is never ready for a switch to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leaving: bool,
}

/// The three EndpointSlice conditions, kept as Kubernetes states them; the translator
/// maps them to Envoy health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EndpointCondition {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

impl EndpointCondition {
    pub const READY: Self = Self {
        ready: true,
        serving: true,
        terminating: false,
    };
}

#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct TlsSecret {
    pub name: String,
    /// PEM.
    pub certificate_chain: String,
    /// PEM. Kept out of Debug output and logs.
    #[serde(skip_serializing)]
    pub private_key: String,
}

impl std::fmt::Debug for TlsSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSecret")
            .field("name", &self.name)
            .field("certificate_chain", &self.certificate_chain)
            .field("private_key", &"<redacted>")
            .finish()
    }
}

/// "Does this Envoy have these clusters, each with ready endpoints?" Answered by Envoy's
/// health_check filter on the probe listener without touching any backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndpointProbe {
    /// Unique id, sent by the prober in the `x-switchyard-probe` header.
    pub id: String,
    /// Cluster names with the minimum percentage of available hosts (0 = only present).
    /// Above 0, a cluster whose endpoints are all held after their slices were deleted
    /// ([`Endpoint::leaving`]) never passes: the probe is left out.
    pub clusters: BTreeMap<String, u32>,
}

/// The secret Host name under which a [`VersionProbe`] answers.
pub fn version_probe_host(probe_id: &str, token: &str) -> String {
    format!(
        "{}.{token}.probe.switchyard.invalid",
        crate::hash::digest(probe_id.as_bytes())
    )
}

/// "Does this Envoy serve live version V of this route?" Answered by a virtual host in the
/// live route configuration that only the probe listener reaches (a secret Host name).
///
/// A probe with `routes` is a trial: it carries routes that are not live yet, behind the
/// version answer, so that every Envoy has accepted them before any of them serves a user
/// (Envoy refuses a whole route configuration for one route it rejects, and a trial that
/// it refused can be left out without touching anyone's traffic).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VersionProbe {
    /// Unique id (e.g. "namespace/route"; see [`trial_id`] for trials).
    pub id: String,
    pub version: String,
    /// The [`GatewayListener`] whose route configuration answers; None: the shared one.
    /// Trials are answered by the shared one in any case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<String>,
    /// Trial routes, matched after the version answer; never reached by user traffic.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
}

/// Ids of trials start with this: `trial/<namespace>/<route>`.
pub const TRIAL_PREFIX: &str = "trial/";

/// The id of the trial of a route (id "namespace/route").
pub fn trial_id(route_id: &str) -> String {
    format!("{TRIAL_PREFIX}{route_id}")
}
