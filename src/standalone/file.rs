//! The standalone configuration format: YAML files in one directory.
//!
//! Every `*.yaml`/`*.yml` file may hold any of the top-level keys; lists are merged.
//! Field names follow the TrafficRoute spec so a configuration can move to Kubernetes.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct File {
    pub listeners: Option<Listeners>,
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    #[serde(default)]
    pub services: Vec<ServiceSpec>,
    #[serde(default)]
    pub secrets: Vec<SecretSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Listeners {
    pub address: Option<String>,
    pub http_port: Option<u16>,
    pub https_port: Option<u16>,
    pub probe_port: Option<u16>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteSpec {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    pub hosts: Vec<String>,
    pub tls: Option<TlsSpec>,
    pub rules: Vec<RuleSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsSpec {
    pub secret: String,
    #[serde(default = "yes")]
    pub redirect_http: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleSpec {
    pub name: Option<String>,
    #[serde(default, rename = "match")]
    pub matches: MatchSpec,
    #[serde(default)]
    pub backends: Vec<BackendSpec>,
    /// Answer with a redirect to HTTPS instead of forwarding.
    #[serde(default)]
    pub redirect_https: bool,
    #[serde(default, with = "duration_text::option")]
    pub timeout: Option<Duration>,
    #[serde(default, with = "duration_text::option")]
    pub idle_timeout: Option<Duration>,
    pub retries: Option<RetrySpec>,
    pub rewrite_prefix: Option<String>,
    #[serde(default)]
    pub request_headers: HeaderEditSpec,
    #[serde(default)]
    pub response_headers: HeaderEditSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MatchSpec {
    pub path_prefix: Option<String>,
    pub path_exact: Option<String>,
    pub path_regex: Option<String>,
    #[serde(default)]
    pub headers: Vec<HeaderMatchSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderMatchSpec {
    pub name: String,
    pub exact: Option<String>,
    pub prefix: Option<String>,
    pub regex: Option<String>,
    #[serde(default)]
    pub present: bool,
    #[serde(default)]
    pub invert: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendSpec {
    pub service: String,
    pub port: u16,
    #[serde(default = "default_weight")]
    pub weight: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetrySpec {
    pub attempts: u32,
    #[serde(default = "default_retry_on")]
    pub on: Vec<String>,
    #[serde(default, with = "duration_text::option")]
    pub per_try_timeout: Option<Duration>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderEditSpec {
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    #[serde(default)]
    pub add: BTreeMap<String, String>,
    #[serde(default)]
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
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

#[derive(Debug, Clone, Deserialize)]
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

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretSpec {
    pub name: String,
    /// PEM files, relative to the configuration directory.
    pub cert_file: String,
    pub key_file: String,
}

fn default_namespace() -> String {
    "default".into()
}

fn default_weight() -> u32 {
    1
}

fn default_retry_on() -> Vec<String> {
    vec!["connect-failure".into(), "refused-stream".into()]
}

fn yes() -> bool {
    true
}

/// Durations written as "250ms", "5s", "1m".
pub use crate::duration as duration_text;

#[cfg(test)]
mod tests {
    use super::duration_text::parse;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert!(parse("5").is_err());
        assert!(parse("fast").is_err());
        assert!(parse("5y").is_err());
    }
}
