//! ProxyConfigs, EndpointSlices and TLS Secrets → the routing model. Pure.
//!
//! Only Services that some ProxyConfig references become clusters; endpoints come from
//! their EndpointSlices, matched by the Service port's name.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;

pub use crate::api::proxy_config::ResolvedCluster;
use crate::api::{ProxyConfig, ProxyConfigRole};
use crate::model::{self, EndpointCondition, ListenerSettings};
use crate::translate::{Problem, Subject};
use switchyard_core::route::lower;
pub use switchyard_core::route::lower::{
    Contribution, cluster as model_cluster, cluster_name, endpoint_probe_id, gateway_listener,
    secret_name,
};

pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Set by the snapshot builder on the copy it keeps of a deleted live ProxyConfig or of the
/// last EndpointSlice of a deleted Service (see `departed`): the virtual host yields its
/// hosts to any other claimant; the endpoints serve what is live on them, never a switch.
pub const LEAVING: &str = "switchyard.dev/leaving";

/// A TLS Secret's content, keyed by (namespace, name) in [`Inputs::secrets`].
#[derive(Clone, PartialEq)]
pub struct TlsData {
    pub certificate_chain: String,
    pub private_key: String,
}

pub struct Inputs<'a> {
    pub listeners: ListenerSettings,
    pub proxy_configs: Vec<&'a ProxyConfig>,
    pub endpoint_slices: Vec<&'a EndpointSlice>,
    pub secrets: &'a BTreeMap<(String, String), TlsData>,
}

/// The model, and what was left out (with why).
pub fn build(inputs: &Inputs<'_>) -> (model::Config, Vec<Problem>) {
    let built = build_with_sources(inputs);
    (built.config, built.problems)
}

/// Where a cluster's endpoints come from: (namespace, Service, port name).
pub type EndpointsKey = (String, String, String);

/// A model as [`build`] makes it, with where each cluster's endpoints come from.
pub struct Built {
    pub config: model::Config,
    pub problems: Vec<Problem>,
    /// Cluster name → the slices' key its endpoints are taken from.
    pub endpoint_sources: BTreeMap<String, EndpointsKey>,
}

/// What one ProxyConfig adds to the model: its role lowered by the core.
pub fn contribution(pc: &ProxyConfig) -> Contribution {
    let namespace = pc.namespace().unwrap_or_default();
    let spec = &pc.spec;
    let gateway_listener = spec.listener.as_ref().and_then(gateway_listener);
    if spec.listener.is_some() && gateway_listener.is_none() {
        return Contribution {
            clusters: lower::named_clusters(&namespace, &spec.clusters),
            problems: vec![Problem::new(
                lower::route_id(&namespace, &spec.route),
                format!(
                    "ProxyConfig {} names a listener port out of range",
                    pc.name_any()
                ),
            )],
            ..Contribution::default()
        };
    }
    match (spec.role, &spec.virtual_host) {
        (ProxyConfigRole::Probe, trial) => lower::probe(&lower::Probe {
            namespace: &namespace,
            route: &spec.route,
            version: &spec.version,
            trial: trial.as_ref(),
            clusters: &spec.clusters,
            kept: &spec.kept_clusters,
        }),
        (ProxyConfigRole::Live, Some(virtual_host)) => lower::live(&lower::Live {
            listener: gateway_listener.as_ref(),
            default_secret: spec
                .listener
                .as_ref()
                .and_then(|l| l.default_certificate.as_ref())
                .map(|s| (s.namespace.as_str(), s.name.as_str())),
            namespace: &namespace,
            route: &spec.route,
            version: &spec.version,
            virtual_host,
            clusters: &spec.clusters,
            created: spec.route_created.as_ref().map(|t| t.0.as_second()),
            leaving: pc.annotations().contains_key(LEAVING),
        }),
        (ProxyConfigRole::Live, None) => Contribution {
            clusters: lower::named_clusters(&namespace, &spec.clusters),
            problems: vec![Problem::new(
                lower::route_id(&namespace, &spec.route),
                format!("live ProxyConfig {} has no virtual host", pc.name_any()),
            )],
            ..Contribution::default()
        },
    }
}

/// The Gateway listeners the contributions serve on, one entry per listener in one order
/// (the translator compares the list as a whole). Listeners a Gateway port's own unit
/// defines: their virtual hosts' definitions, the same but while a change rolls out, give
/// way (two definitions of one listener serve neither: its port would close).
/// Each item is a contribution's listener and whether it defines it ([`listener_of`]).
pub fn gateway_listeners<'a, I>(listeners: I) -> Vec<model::GatewayListener>
where
    I: IntoIterator<Item = (&'a model::GatewayListener, bool)>,
    I::IntoIter: Clone,
{
    let given = listeners.into_iter();
    let defined: BTreeSet<&str> = (given.clone())
        .filter(|(_, defines)| *defines)
        .map(|(l, _)| l.name.as_str())
        .collect();
    let mut listeners: Vec<model::GatewayListener> = given
        .filter(|(l, defines)| *defines || !defined.contains(l.name.as_str()))
        .map(|(l, _)| l.clone())
        .collect();
    listeners.sort();
    listeners.dedup();
    listeners
}

pub fn build_with_sources(inputs: &Inputs<'_>) -> Built {
    let parts: Vec<Contribution> = in_key_order(&inputs.proxy_configs)
        .iter()
        .map(|pc| contribution(pc))
        .collect();
    build_from(inputs, &parts)
}

/// `objects` by (namespace, name): the order a build takes them in, whatever order the
/// watchers' stores hand them out.
pub fn in_key_order<'a, K: ResourceExt>(objects: &[&'a K]) -> Vec<&'a K> {
    let mut sorted = objects.to_vec();
    sorted.sort_by(|a, b| {
        (a.meta().namespace.as_deref(), a.meta().name.as_deref())
            .cmp(&(b.meta().namespace.as_deref(), b.meta().name.as_deref()))
    });
    sorted
}

/// The model from the ProxyConfigs' contributions (problems in their order, see
/// [`in_key_order`]) and the rest of `inputs`.
pub fn build_from(inputs: &Inputs<'_>, parts: &[Contribution]) -> Built {
    let mut problems = Vec::new();
    let mut config = model::Config {
        listeners: inputs.listeners.clone(),
        ..model::Config::default()
    };
    let mut clusters: BTreeMap<String, (String, ResolvedCluster)> = BTreeMap::new();
    let mut secrets = BTreeSet::new();
    config.gateway_listeners = gateway_listeners(parts.iter().filter_map(listener_of));
    for part in parts {
        for (name, namespace, cluster) in &part.clusters {
            clusters.insert(name.clone(), (namespace.clone(), cluster.clone()));
        }
        config.virtual_hosts.extend(part.virtual_host.clone());
        config.version_probes.extend(part.version_probe.clone());
        config.endpoint_probes.extend(part.endpoint_probe.clone());
        secrets.extend(part.secret.clone());
        secrets.extend(part.client_secrets.iter().cloned());
        problems.extend(part.problems.iter().cloned());
    }
    let endpoints = endpoints_by_service(&inputs.endpoint_slices);
    let mut endpoint_sources = BTreeMap::new();
    config.clusters = clusters
        .into_iter()
        .map(|(name, (namespace, cluster))| {
            let key = endpoints_key(&namespace, &cluster);
            endpoint_sources.insert(name.clone(), key.clone());
            let endpoints = endpoints.get(&key).cloned().unwrap_or_default();
            model_cluster(name, &namespace, &cluster, endpoints)
        })
        .collect();
    for key in secrets {
        match tls_secret(&key, inputs.secrets.get(&key)) {
            Ok(secret) => config.secrets.push(secret),
            Err(problem) => problems.push(problem),
        }
    }
    Built {
        config,
        problems,
        endpoint_sources,
    }
}

/// The model's copy of TLS Secret (namespace, name) that a ProxyConfig uses, or why there
/// is none: the translator leaves out the virtual host and says why.
pub fn tls_secret(
    (namespace, name): &(String, String),
    data: Option<&TlsData>,
) -> Result<model::TlsSecret, Problem> {
    match data {
        Some(data) => Ok(model::TlsSecret {
            name: secret_name(namespace, name),
            certificate_chain: data.certificate_chain.clone(),
            private_key: data.private_key.clone(),
        }),
        None => Err(Problem::new(
            Subject::Secret(format!("{namespace}/{name}")),
            "not found or not a TLS Secret",
        )),
    }
}

/// The Gateway listener a contribution's virtual host is served on, and whether it is the
/// port's own unit, defining it.
pub fn listener_of(part: &Contribution) -> Option<(&model::GatewayListener, bool)> {
    Some((part.gateway_listener.as_ref()?, part.defines_listener))
}

/// The TLS Secrets a ProxyConfig's contribution uses: its virtual host's, its clusters'.
pub fn secrets_of(part: &Contribution) -> BTreeSet<&(String, String)> {
    part.secret.iter().chain(&part.client_secrets).collect()
}

/// Where the endpoints of `cluster` in `namespace` come from.
pub fn endpoints_key(namespace: &str, cluster: &ResolvedCluster) -> EndpointsKey {
    (
        namespace.to_string(),
        cluster.service.clone(),
        cluster.port_name.clone(),
    )
}

/// The (namespace, Service) whose endpoints a slice lists, from its label.
pub fn service_of(slice: &EndpointSlice) -> Option<(String, String)> {
    let service = slice.labels().get(SERVICE_NAME_LABEL)?;
    Some((slice.namespace().unwrap_or_default(), service.clone()))
}

/// (namespace, service, port name) → endpoints, slice after slice in key order.
pub fn endpoints_by_service(
    slices: &[&EndpointSlice],
) -> BTreeMap<EndpointsKey, Vec<model::Endpoint>> {
    let mut out: BTreeMap<EndpointsKey, Vec<model::Endpoint>> = BTreeMap::new();
    for slice in in_key_order(slices) {
        let Some((namespace, service)) = service_of(slice) else {
            continue;
        };
        // Held after its Service was deleted (see `departed`).
        let leaving = slice.annotations().contains_key(LEAVING);
        for port in slice.ports.iter().flatten() {
            let Some(number) = port.port.and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            let key = (
                namespace.clone(),
                service.clone(),
                port.name.clone().unwrap_or_default(),
            );
            let list = out.entry(key).or_default();
            for endpoint in slice.endpoints.iter().flatten() {
                let c = endpoint.conditions.as_ref();
                // Kubernetes: an unset `ready` means ready; unset `serving` follows `ready`.
                let ready = c.and_then(|c| c.ready).unwrap_or(true);
                let condition = EndpointCondition {
                    ready,
                    serving: c.and_then(|c| c.serving).unwrap_or(ready),
                    terminating: c.and_then(|c| c.terminating).unwrap_or(false),
                };
                for address in &endpoint.addresses {
                    list.push(model::Endpoint {
                        address: address.clone(),
                        port: number,
                        condition,
                        zone: endpoint.zone.clone(),
                        leaving,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ProxyConfigSpec;
    use crate::api::proxy_config::ResolvedRule;
    use crate::api::proxy_config::{ResolvedBackend, ResolvedTls, ResolvedVirtualHost};
    use crate::api::traffic_route::RuleOptions;
    use crate::k8s::fixtures::{self, cluster};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};

    fn live(route: &str, service: &str) -> ProxyConfig {
        let mut pc = ProxyConfig::new(
            &format!("{route}-live"),
            ProxyConfigSpec {
                drain_period: None,
                members: Vec::new(),
                listener: None,
                route_created: None,
                role: ProxyConfigRole::Live,
                route: route.into(),
                generation: 1,
                version: "v1".into(),
                virtual_host: Some(ResolvedVirtualHost {
                    hosts: vec![format!("{route}.test")],
                    tls: None,
                    rules: vec![ResolvedRule {
                        name: "all".into(),
                        backends: vec![ResolvedBackend {
                            cluster: cluster(service),
                            weight: 1,
                            request_headers: None,
                        }],
                        options: RuleOptions {
                            timeout: Some("5s".into()),
                            ..RuleOptions::default()
                        },
                        ..Default::default()
                    }],
                }),
                clusters: vec![cluster(service)],
                kept_clusters: Vec::new(),
            },
        );
        pc.metadata.namespace = Some("shop".into());
        pc
    }

    fn slice(
        service: &str,
        port_name: &str,
        addresses: &[(&str, Option<bool>, Option<bool>)],
    ) -> EndpointSlice {
        let mut slice = fixtures::slice(&format!("{service}-abc"), service);
        slice.endpoints = Some(
            addresses
                .iter()
                .map(|(a, ready, terminating)| Endpoint {
                    conditions: Some(EndpointConditions {
                        ready: *ready,
                        serving: None,
                        terminating: *terminating,
                    }),
                    zone: Some("z1".into()),
                    ..fixtures::endpoint(a)
                })
                .collect(),
        );
        slice.ports = Some(vec![fixtures::port(port_name, 8080)]);
        slice
    }

    fn inputs<'a>(
        pcs: &'a [ProxyConfig],
        slices: &'a [EndpointSlice],
        secrets: &'a BTreeMap<(String, String), TlsData>,
    ) -> Inputs<'a> {
        Inputs {
            listeners: ListenerSettings::default(),
            proxy_configs: pcs.iter().collect(),
            endpoint_slices: slices.iter().collect(),
            secrets,
        }
    }

    #[test]
    fn live_config_becomes_a_virtual_host_with_endpoints_from_slices() {
        let pcs = [live("web", "app")];
        let slices = [slice(
            "app",
            "http",
            &[
                ("10.0.0.1", Some(true), None),
                ("10.0.0.2", None, None),
                ("10.0.0.3", Some(false), Some(true)),
            ],
        )];
        let secrets = BTreeMap::new();
        let (config, problems) = build(&inputs(&pcs, &slices, &secrets));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(config.virtual_hosts.len(), 1);
        assert_eq!(config.virtual_hosts[0].name, "shop/web");
        assert_eq!(config.version_probes[0].version, "v1");
        let c = &config.clusters[0];
        assert_eq!(c.name, "shop/app/80");
        let states: Vec<_> = c
            .endpoints
            .iter()
            .map(|e| {
                (
                    e.address.as_str(),
                    e.port,
                    e.condition.ready,
                    e.condition.terminating,
                )
            })
            .collect();
        assert_eq!(
            states,
            [
                ("10.0.0.1", 8080, true, false),
                ("10.0.0.2", 8080, true, false),
                ("10.0.0.3", 8080, false, true)
            ]
        );
        let translation = crate::translate::translate(&config);
        assert!(
            translation.problems.is_empty(),
            "{:?}",
            translation.problems
        );
    }

    #[test]
    fn endpoints_match_the_port_by_name_and_unreferenced_services_stay_out() {
        let pcs = [live("web", "app")];
        let slices = [
            slice("app", "metrics", &[("10.0.0.1", Some(true), None)]),
            slice("other", "http", &[("10.0.0.9", Some(true), None)]),
        ];
        let secrets = BTreeMap::new();
        let (config, _) = build(&inputs(&pcs, &slices, &secrets));
        assert_eq!(config.clusters.len(), 1, "only referenced services");
        assert!(config.clusters[0].endpoints.is_empty(), "port name differs");
    }

    #[test]
    fn probe_config_adds_clusters_and_an_endpoint_probe() {
        let mut probe = live("web", "app");
        probe.spec.role = ProxyConfigRole::Probe;
        probe.spec.virtual_host = None;
        probe.spec.version = "p1".into();
        probe.spec.clusters = vec![cluster("app"), cluster("app-v2")];
        probe.spec.kept_clusters = vec![cluster("app")];
        let pcs = [live("web", "app"), probe];
        let secrets = BTreeMap::new();
        let (config, problems) = build(&inputs(&pcs, &[], &secrets));
        assert!(problems.is_empty());
        let names: Vec<_> = config.clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["shop/app-v2/80", "shop/app/80"]);
        assert_eq!(config.endpoint_probes[0].id, "shop/web/p1");
        // The new cluster needs a ready endpoint; the live one, kept through the switch,
        // only has to exist: its endpoints may be the very thing that is gone (I3).
        let expected: BTreeMap<String, u32> = [
            ("shop/app-v2/80".to_string(), 1),
            ("shop/app/80".to_string(), 0),
        ]
        .into();
        assert_eq!(config.endpoint_probes[0].clusters, expected);
    }

    #[test]
    fn tls_secrets_are_namespaced_and_missing_ones_reported() {
        let mut pc = live("web", "app");
        if let Some(vh) = pc.spec.virtual_host.as_mut() {
            vh.tls = Some(ResolvedTls {
                namespace: None,
                secret_name: "cert".into(),
                redirect_http: true,
                listener_hostname: None,
            });
        }
        let pcs = [pc];
        let empty = BTreeMap::new();
        let (_, problems) = build(&inputs(&pcs, &[], &empty));
        assert_eq!(
            problems,
            [Problem::new(
                Subject::Secret("shop/cert".into()),
                "not found or not a TLS Secret"
            )]
        );
        let secrets: BTreeMap<_, _> = [(
            ("shop".to_string(), "cert".to_string()),
            TlsData {
                certificate_chain: "PEM".into(),
                private_key: "KEY".into(),
            },
        )]
        .into();
        let (config, problems) = build(&inputs(&pcs, &[], &secrets));
        assert!(problems.is_empty());
        assert_eq!(config.secrets[0].name, "shop/cert");
        assert_eq!(
            config.virtual_hosts[0]
                .tls
                .as_ref()
                .map(|t| t.secret.as_str()),
            Some("shop/cert")
        );
    }

    #[test]
    fn a_gateway_ports_own_unit_defines_its_listener_while_a_change_rolls_out() {
        use switchyard_core::route::{ClientValidation, ResolvedListener};
        let listener = |validation: Option<&str>| ResolvedListener {
            name: "shop/edge/443/https".into(),
            port: 20000,
            probe_port: 10000,
            tls: true,
            default_certificate: None,
            client_validation: validation.map(|ca| ClientValidation {
                ca_certificates: ca.into(),
                insecure_fallback: false,
            }),
            ..ResolvedListener::default()
        };
        // The port's unit has the new definition; its virtual host's unit the one before.
        let mut port = live("gw-edge-443", "app");
        if let Some(vh) = port.spec.virtual_host.as_mut() {
            vh.hosts.clear();
        }
        port.spec.listener = Some(listener(Some("CA")));
        let mut host = live("gw-edge-443-web", "app");
        host.spec.listener = Some(listener(None));
        let pcs = [port, host];
        let secrets = BTreeMap::new();
        let (config, problems) = build(&inputs(&pcs, &[], &secrets));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(config.gateway_listeners.len(), 1);
        assert!(config.gateway_listeners[0].client_validation.is_some());
        // Without the port's unit, the hosts' definitions are all there is: differing, the
        // translator reports them.
        let (config, _) = build(&inputs(&pcs[1..], &[], &secrets));
        assert!(config.gateway_listeners[0].client_validation.is_none());
    }
}
