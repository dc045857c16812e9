//! Resolves standalone files into the routing model: backends become clusters, services
//! give them endpoints. Pure: every file was read before.

use std::collections::{BTreeMap, BTreeSet};

use super::file::{BackendSpec, File, HeaderEditSpec, HeaderMatchSpec, RouteSpec, RuleSpec};
use crate::hash;
use crate::model::{
    Cluster, ClusterSettings, Config, Endpoint, EndpointCondition, EndpointProbe, Forward,
    HeaderEdits, HeaderMatch, HeaderValueMatch, ListenerSettings, PathMatch, RetryPolicy, Route,
    RouteAction, ServiceRef, TlsSecret, VersionProbe, VirtualHost, VirtualHostTls, WeightedCluster,
    cluster_name,
};

/// PEM contents of a secret, read from its files.
#[derive(Clone, Debug)]
pub struct SecretPem {
    pub name: String,
    pub certificate_chain: String,
    pub private_key: String,
}

#[derive(Debug)]
pub struct Resolved {
    pub config: Config,
    /// Routes left out, with the reason. Every other route is served.
    pub problems: Vec<String>,
}

pub fn resolve(file: &File, secrets: &[SecretPem], probe_token: &str) -> Resolved {
    let mut listeners = ListenerSettings {
        probe_token: probe_token.to_string(),
        ..ListenerSettings::default()
    };
    if let Some(l) = &file.listeners {
        listeners.address = l.address.clone().unwrap_or(listeners.address);
        listeners.http_port = l.http_port.unwrap_or(listeners.http_port);
        listeners.https_port = l.https_port.unwrap_or(listeners.https_port);
        listeners.probe_port = l.probe_port.unwrap_or(listeners.probe_port);
    }
    let services: BTreeMap<(String, String), &super::file::ServiceSpec> = file
        .services
        .iter()
        .map(|s| ((s.namespace.clone(), s.name.clone()), s))
        .collect();

    let mut problems = Vec::new();
    let mut clusters: BTreeMap<String, Cluster> = BTreeMap::new();
    let mut config = Config {
        listeners,
        ..Config::default()
    };
    for route in &file.routes {
        let id = format!("{}/{}", route.namespace, route.name);
        match resolve_route(route, &services) {
            Ok((virtual_host, used)) => {
                config.version_probes.push(VersionProbe {
                    id: id.clone(),
                    version: hash::digest_of(&virtual_host),
                    ..Default::default()
                });
                config.endpoint_probes.push(EndpointProbe {
                    id: id.clone(),
                    clusters: used.iter().map(|c| (c.name.clone(), 1)).collect(),
                });
                for cluster in used {
                    clusters.insert(cluster.name.clone(), cluster);
                }
                config.virtual_hosts.push(virtual_host);
            }
            Err(reason) => problems.push(format!("route {id}: {reason}")),
        }
    }
    config.clusters = clusters.into_values().collect();
    config.secrets = secrets
        .iter()
        .map(|s| TlsSecret {
            name: s.name.clone(),
            certificate_chain: s.certificate_chain.clone(),
            private_key: s.private_key.clone(),
        })
        .collect();
    Resolved { config, problems }
}

type Services<'a> = BTreeMap<(String, String), &'a super::file::ServiceSpec>;

fn resolve_route(
    route: &RouteSpec,
    services: &Services<'_>,
) -> Result<(VirtualHost, Vec<Cluster>), String> {
    if route.hosts.is_empty() {
        return Err("hosts must not be empty".into());
    }
    let mut used = Vec::new();
    let mut routes = Vec::new();
    let mut rule_names = BTreeSet::new();
    for (index, rule) in route.rules.iter().enumerate() {
        let name = rule.name.clone().unwrap_or_else(|| format!("rule-{index}"));
        if !rule_names.insert(name.clone()) {
            return Err(format!("rule name {name:?} is used twice"));
        }
        let action = if rule.redirect_https {
            RouteAction::RedirectHttps
        } else {
            let backends = rule
                .backends
                .iter()
                .map(|b| {
                    let cluster = resolve_backend(&route.namespace, b, services)
                        .map_err(|e| format!("rule {name:?}: {e}"))?;
                    let weighted = WeightedCluster {
                        cluster: cluster.name.clone(),
                        weight: b.weight,
                    };
                    used.push(cluster);
                    Ok(weighted)
                })
                .collect::<Result<Vec<_>, String>>()?;
            if backends.is_empty() {
                return Err(format!("rule {name:?}: needs at least one backend"));
            }
            if backends.iter().all(|b| b.weight == 0) {
                return Err(format!("rule {name:?}: backend weights are all zero"));
            }
            RouteAction::Forward(forward(rule, backends))
        };
        routes.push(Route {
            name,
            path: path_match(rule).map_err(|e| format!("rule {index}: {e}"))?,
            headers: rule
                .matches
                .headers
                .iter()
                .map(header_match)
                .collect::<Result<_, _>>()?,
            action,
            request_headers: header_edits(&rule.request_headers),
            response_headers: header_edits(&rule.response_headers),
        });
    }
    let virtual_host = VirtualHost {
        leaving: false,
        created: None,
        name: format!("{}/{}", route.namespace, route.name),
        hosts: route.hosts.clone(),
        tls: route.tls.as_ref().map(|t| VirtualHostTls {
            secret: t.secret.clone(),
            redirect_http: t.redirect_http,
        }),
        routes,
    };
    Ok((virtual_host, used))
}

fn resolve_backend(
    namespace: &str,
    backend: &BackendSpec,
    services: &Services<'_>,
) -> Result<Cluster, String> {
    let service = services
        .get(&(namespace.to_string(), backend.service.clone()))
        .ok_or_else(|| format!("service {namespace}/{} is not defined", backend.service))?;
    let service_ref = ServiceRef {
        namespace: namespace.to_string(),
        name: backend.service.clone(),
        port: backend.port,
    };
    let settings = ClusterSettings {
        http2: service.http2,
        ..ClusterSettings::default()
    };
    let endpoints = service
        .endpoints
        .iter()
        .filter(|e| e.port == backend.port)
        .map(|e| Endpoint {
            address: e.address.clone(),
            port: e.port,
            condition: EndpointCondition {
                ready: e.ready,
                serving: e.serving,
                terminating: e.terminating,
            },
            zone: e.zone.clone(),
        })
        .collect();
    Ok(Cluster {
        name: cluster_name(&service_ref, &settings),
        service: service_ref,
        settings,
        endpoints,
    })
}

fn forward(rule: &RuleSpec, backends: Vec<WeightedCluster>) -> Forward {
    Forward {
        backends,
        timeout: rule.timeout,
        idle_timeout: rule.idle_timeout,
        retry: rule.retries.as_ref().map(|r| RetryPolicy {
            retry_on: r.on.clone(),
            num_retries: r.attempts,
            per_try_timeout: r.per_try_timeout,
        }),
        prefix_rewrite: rule.rewrite_prefix.clone(),
    }
}

fn path_match(rule: &RuleSpec) -> Result<PathMatch, String> {
    let m = &rule.matches;
    match (&m.path_prefix, &m.path_exact, &m.path_regex) {
        (None, None, None) => Ok(PathMatch::Prefix("/".into())),
        (Some(p), None, None) => Ok(PathMatch::Prefix(p.clone())),
        (None, Some(p), None) => Ok(PathMatch::Exact(p.clone())),
        (None, None, Some(p)) => Ok(PathMatch::Regex(p.clone())),
        _ => Err("give at most one of pathPrefix, pathExact, pathRegex".into()),
    }
}

fn header_match(spec: &HeaderMatchSpec) -> Result<HeaderMatch, String> {
    let value = match (&spec.exact, &spec.prefix, &spec.regex, spec.present) {
        (Some(v), None, None, false) => HeaderValueMatch::Exact(v.clone()),
        (None, Some(v), None, false) => HeaderValueMatch::Prefix(v.clone()),
        (None, None, Some(v), false) => HeaderValueMatch::Regex(v.clone()),
        (None, None, None, true) => HeaderValueMatch::Present,
        _ => {
            return Err(format!(
                "header match {:?}: give exactly one of exact, prefix, regex, present",
                spec.name
            ));
        }
    };
    Ok(HeaderMatch {
        name: spec.name.to_ascii_lowercase(),
        value,
        invert: spec.invert,
    })
}

fn header_edits(spec: &HeaderEditSpec) -> HeaderEdits {
    HeaderEdits {
        set: spec
            .set
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        add: spec
            .add
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        remove: spec.remove.clone(),
    }
}
