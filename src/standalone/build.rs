//! Standalone files → the routing model, through the core's one resolution and lowering
//! step: each route's spec is resolved against the files' services, lowered as live, and
//! its clusters get the endpoints the files list. Pure: every file was read before.

use std::collections::BTreeMap;

use super::file::{File, ServiceSpec};
use crate::model::{
    self, Config, Endpoint, EndpointCondition, EndpointProbe, ListenerSettings, TlsSecret,
};
use switchyard_core::route::lower;
use switchyard_core::route::spec::Backend;
use switchyard_core::route::{ResolveError, ResolvedCluster, ServiceLookup, resolve};

/// PEM contents of a secret, read from its files.
#[derive(Clone, Debug)]
pub struct SecretPem {
    pub namespace: String,
    pub name: String,
    pub certificate_chain: String,
    pub private_key: String,
}

#[derive(Debug)]
pub struct Built {
    pub config: Config,
    /// Routes left out, with the reason. Every other route is served.
    pub problems: Vec<String>,
}

pub fn build(file: &File, secrets: &[SecretPem], probe_token: &str) -> Built {
    let services: Services<'_> = file
        .services
        .iter()
        .map(|s| ((s.namespace.as_str(), s.name.as_str()), s))
        .collect();
    let mut problems = Vec::new();
    let mut clusters: BTreeMap<String, model::Cluster> = BTreeMap::new();
    let mut config = Config {
        listeners: listeners(file, probe_token),
        ..Config::default()
    };
    let log = &mut config.listeners.access_log;
    if log.sample_percent > 100 {
        problems.push(format!(
            "listeners.accessLog.samplePercent {} is more than 100: every request is logged",
            log.sample_percent
        ));
        log.sample_percent = 100;
    }
    const MAX_TRUSTED_HOPS: u32 = model::MAX_TRUSTED_HOPS;
    let client_ip = &mut config.listeners.client_ip;
    if client_ip.xff_trusted_hops > MAX_TRUSTED_HOPS {
        problems.push(format!(
            "listeners.clientIp.xffTrustedHops {} is more than {MAX_TRUSTED_HOPS}: {MAX_TRUSTED_HOPS} are trusted",
            client_ip.xff_trusted_hops
        ));
        client_ip.xff_trusted_hops = MAX_TRUSTED_HOPS;
    }
    for route in &file.routes {
        let namespace = route.namespace.as_str();
        let id = lower::route_id(namespace, &route.name);
        let lookup = FileServices {
            namespace,
            services: &services,
        };
        let resolved = match resolve("", &route.spec, &lookup) {
            Ok(resolved) => resolved,
            Err(e) => {
                problems.push(format!("route {id}: {e}"));
                continue;
            }
        };
        let part = lower::live(&lower::Live {
            default_secret: None,
            listener: None,
            namespace,
            route: &route.name,
            version: &resolved.version,
            virtual_host: &resolved.virtual_host,
            clusters: &resolved.clusters,
            created: None,
            leaving: false,
        });
        if !part.problems.is_empty() {
            problems.extend(
                part.problems
                    .iter()
                    .map(|p| format!("route {id}: {}", p.message())),
            );
            continue;
        }
        // Without a rollout, a route's endpoint probe asks for every cluster it uses.
        config.endpoint_probes.push(EndpointProbe {
            id,
            clusters: part
                .clusters
                .iter()
                .map(|(name, _, _)| (name.clone(), 1))
                .collect(),
        });
        for (name, namespace, cluster) in part.clusters {
            let endpoints = endpoints(&services, &namespace, &cluster);
            clusters
                .entry(name.clone())
                .or_insert_with(|| lower::cluster(name, &namespace, &cluster, endpoints));
        }
        config.virtual_hosts.extend(part.virtual_host);
        config.version_probes.extend(part.version_probe);
    }
    config.clusters = clusters.into_values().collect();
    config.secrets = secrets
        .iter()
        .map(|s| TlsSecret {
            name: lower::secret_name(&s.namespace, &s.name),
            certificate_chain: s.certificate_chain.clone(),
            private_key: s.private_key.clone(),
        })
        .collect();
    Built { config, problems }
}

fn listeners(file: &File, probe_token: &str) -> ListenerSettings {
    let mut listeners = ListenerSettings {
        probe_token: probe_token.to_string(),
        virtual_host_discovery: true,
        ..ListenerSettings::default()
    };
    if let Some(l) = &file.listeners {
        listeners.address = l.address.clone().unwrap_or(listeners.address);
        listeners.http_port = l.http_port.unwrap_or(listeners.http_port);
        listeners.https_port = l.https_port.unwrap_or(listeners.https_port);
        listeners.probe_port = l.probe_port.unwrap_or(listeners.probe_port);
        if let Some(log) = &l.access_log {
            listeners.access_log = log.clone();
        }
        if let Some(client_ip) = &l.client_ip {
            listeners.client_ip = client_ip.clone();
        }
        listeners.virtual_host_discovery = l
            .virtual_host_discovery
            .unwrap_or(listeners.virtual_host_discovery);
    }
    listeners
}

/// (namespace, name) → service.
type Services<'a> = BTreeMap<(&'a str, &'a str), &'a ServiceSpec>;

/// The services of one namespace of the files, as the core's lookup. A file service has
/// no port list: a backend's port number is the port its endpoints listen on.
struct FileServices<'a> {
    namespace: &'a str,
    services: &'a Services<'a>,
}

impl ServiceLookup for FileServices<'_> {
    fn cluster(&self, backend: &Backend) -> Result<ResolvedCluster, ResolveError> {
        let service = self
            .services
            .get(&(self.namespace, backend.service.as_str()))
            .ok_or_else(|| ResolveError::ServiceNotFound {
                service: backend.service.clone(),
            })?;
        match backend.port {
            Some(port) => Ok(ResolvedCluster {
                namespace: None,
                service: backend.service.clone(),
                port,
                port_name: String::new(),
                http2: service.http2,
                ..ResolvedCluster::default()
            }),
            None => Err(ResolveError::UnsupportedBackend {
                service: backend.service.clone(),
                message: "a service of the files has no named ports: give `port`".into(),
            }),
        }
    }
}

/// The endpoints the files list for `cluster`: those on its port.
fn endpoints(services: &Services<'_>, namespace: &str, cluster: &ResolvedCluster) -> Vec<Endpoint> {
    let Some(service) = services.get(&(namespace, cluster.service.as_str())) else {
        return Vec::new();
    };
    service
        .endpoints
        .iter()
        .filter(|e| i32::from(e.port) == cluster.port)
        .map(|e| Endpoint {
            address: e.address.clone(),
            port: e.port,
            condition: EndpointCondition {
                ready: e.ready,
                serving: e.serving,
                terminating: e.terminating,
            },
            zone: e.zone.clone(),
            leaving: false,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn built(text: &str) -> Built {
        let file = super::super::parse(Path::new("listeners.yaml"), text).expect("parses");
        build(&file, &[], "token")
    }

    #[test]
    fn listener_settings_out_of_range_are_named_and_clamped() {
        let out = built(
            "listeners:\n  accessLog: { samplePercent: 150 }\n  clientIp: { xffTrustedHops: 11, proxyProtocol: true }\n",
        );
        assert_eq!(
            out.problems,
            [
                "listeners.accessLog.samplePercent 150 is more than 100: every request is logged",
                "listeners.clientIp.xffTrustedHops 11 is more than 10: 10 are trusted",
            ]
        );
        let listeners = &out.config.listeners;
        assert_eq!(listeners.access_log.sample_percent, 100);
        assert_eq!(
            listeners.client_ip,
            model::ClientIp {
                xff_trusted_hops: 10,
                proxy_protocol: true
            }
        );
    }
}
