//! What the last model was built from, so that a change to EndpointSlices alone (the
//! steady churn of a cluster: pods come and go) becomes a change to the clusters of their
//! Services, for [`Translator::apply`](crate::translate::Translator::apply), instead of a
//! new model compared input by input with the last one.
//!
//! Anything else that changes (a ProxyConfig, a TLS Secret, listener settings) rebuilds
//! the whole model: those changes are rollouts, rare next to endpoint churn.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;

use super::address_map::AddressMap;
use super::to_model::{self, EndpointsKey, Inputs, TlsData};
use crate::model::{self, ListenerSettings};
use crate::translate::Problem;

/// What to hand the translator.
#[derive(Debug)]
pub enum Step {
    /// A new model from scratch.
    Full(model::Config),
    /// Only these clusters changed (their endpoints).
    Clusters(Vec<model::Cluster>),
}

#[derive(Default)]
pub struct ModelCache {
    last: Option<Last>,
}

/// (namespace, name).
type Key = (String, String);
/// An object's identity for "did it change": (namespace, name) → resourceVersion.
type Versions = BTreeMap<Key, String>;
/// A slice's identity and the (namespace, Service) it lists endpoints of.
type SliceVersions = BTreeMap<Key, (String, Option<Key>)>;

struct Last {
    listeners: ListenerSettings,
    address_map: Option<AddressMap>,
    secrets: BTreeMap<(String, String), TlsData>,
    proxy_configs: Versions,
    /// Slice identity → the (namespace, Service) it lists endpoints of.
    slices: SliceVersions,
    clusters: BTreeMap<String, model::Cluster>,
    endpoint_sources: BTreeMap<String, EndpointsKey>,
    problems: Vec<Problem>,
}

fn identity<K: ResourceExt>(object: &K) -> (Key, String) {
    (
        (object.namespace().unwrap_or_default(), object.name_any()),
        // An object without a resourceVersion never compares equal to itself: it is
        // always taken as changed, which is never wrong.
        object
            .resource_version()
            .unwrap_or_else(|| format!("unversioned-{:p}", object)),
    )
}

fn slice_identities(slices: &[&EndpointSlice]) -> SliceVersions {
    slices
        .iter()
        .map(|slice| {
            let (key, version) = identity(*slice);
            (key, (version, to_model::service_of(slice)))
        })
        .collect()
}

impl ModelCache {
    /// The next step from `inputs`, and what was left out of the model (with why).
    pub fn step(&mut self, inputs: &Inputs<'_>) -> (Step, Vec<Problem>) {
        let proxy_configs: Versions = inputs
            .proxy_configs
            .iter()
            .map(|pc| identity(*pc))
            .collect();
        let slices = slice_identities(&inputs.endpoint_slices);
        let only_slices_changed = self.last.as_ref().is_some_and(|last| {
            last.listeners == inputs.listeners
                && last.address_map == inputs.address_map
                && &last.secrets == inputs.secrets
                && last.proxy_configs == proxy_configs
        });
        match self.last.as_mut() {
            Some(last) if only_slices_changed => {
                let clusters = last.refresh_endpoints(inputs, slices);
                (Step::Clusters(clusters), last.problems.clone())
            }
            _ => {
                let built = to_model::build_with_sources(inputs);
                let problems = built.problems.clone();
                self.last = Some(Last {
                    listeners: inputs.listeners.clone(),
                    address_map: inputs.address_map,
                    secrets: inputs.secrets.clone(),
                    proxy_configs,
                    slices,
                    clusters: built
                        .config
                        .clusters
                        .iter()
                        .map(|c| (c.name.clone(), c.clone()))
                        .collect(),
                    endpoint_sources: built.endpoint_sources,
                    problems: built.problems,
                });
                (Step::Full(built.config), problems)
            }
        }
    }
}

impl Last {
    /// Recomputes the endpoints of the Services whose slices changed; returns the
    /// clusters whose endpoints are now different.
    fn refresh_endpoints(
        &mut self,
        inputs: &Inputs<'_>,
        slices: SliceVersions,
    ) -> Vec<model::Cluster> {
        let mut services: BTreeSet<Key> = BTreeSet::new();
        for (key, (version, service)) in &slices {
            if self.slices.get(key).map(|(v, _)| v) != Some(version) {
                services.extend(service.clone());
            }
        }
        for (key, (_, service)) in &self.slices {
            let now = slices.get(key).map(|(_, s)| s);
            if now != Some(service) {
                services.extend(service.clone());
            }
        }
        self.slices = slices;
        if services.is_empty() {
            return Vec::new();
        }
        let relevant: Vec<&EndpointSlice> = inputs
            .endpoint_slices
            .iter()
            .copied()
            .filter(|slice| to_model::service_of(slice).is_some_and(|s| services.contains(&s)))
            .collect();
        let endpoints = to_model::endpoints_by_service(&relevant, inputs.address_map);
        let mut changed = Vec::new();
        for (name, (namespace, service, port_name)) in &self.endpoint_sources {
            if !services.contains(&(namespace.clone(), service.clone())) {
                continue;
            }
            let Some(cluster) = self.clusters.get_mut(name) else {
                continue;
            };
            let key = (namespace.clone(), service.clone(), port_name.clone());
            let now = endpoints.get(&key).cloned().unwrap_or_default();
            if cluster.endpoints != now {
                cluster.endpoints = now;
                changed.push(cluster.clone());
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::proxy_config::{
        ResolvedBackend, ResolvedCluster, ResolvedRule, ResolvedVirtualHost,
    };
    use crate::api::{ProxyConfig, ProxyConfigRole, ProxyConfigSpec};
    use crate::translate::{Changes, Edit, Translator};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort};
    use kube::api::ObjectMeta;

    fn cluster(service: &str) -> ResolvedCluster {
        ResolvedCluster {
            service: service.into(),
            port: 80,
            port_name: "http".into(),
            http2: false,
        }
    }

    fn live(route: &str, services: &[&str], version: &str) -> ProxyConfig {
        let mut pc = ProxyConfig::new(
            &format!("{route}-live"),
            ProxyConfigSpec {
                role: ProxyConfigRole::Live,
                route: route.into(),
                generation: 1,
                version: "v1".into(),
                virtual_host: Some(ResolvedVirtualHost {
                    hosts: vec![format!("{route}.test")],
                    tls: None,
                    rules: vec![ResolvedRule {
                        name: "all".into(),
                        backends: services
                            .iter()
                            .map(|s| ResolvedBackend {
                                cluster: cluster(s),
                                weight: 1,
                            })
                            .collect(),
                        ..Default::default()
                    }],
                }),
                clusters: services.iter().map(|s| cluster(s)).collect(),
            },
        );
        pc.metadata.namespace = Some("shop".into());
        pc.metadata.resource_version = Some(version.into());
        pc
    }

    fn slice(name: &str, service: &str, addresses: &[&str], version: &str) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shop".into()),
                resource_version: Some(version.into()),
                labels: Some(
                    [(
                        to_model::SERVICE_NAME_LABEL.to_string(),
                        service.to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: Some(
                addresses
                    .iter()
                    .map(|a| Endpoint {
                        addresses: vec![a.to_string()],
                        ..Default::default()
                    })
                    .collect(),
            ),
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                port: Some(8080),
                ..Default::default()
            }]),
        }
    }

    fn listeners() -> ListenerSettings {
        crate::model::Config::default().listeners
    }

    /// Steps `cache` and `translator` through `inputs`; the translator must end where a
    /// fresh translation of a full model of the same inputs does.
    fn step_and_compare(
        cache: &mut ModelCache,
        translator: &mut Translator,
        proxy_configs: &[&ProxyConfig],
        slices: &[&EndpointSlice],
    ) -> bool {
        let secrets = BTreeMap::new();
        let inputs = Inputs {
            listeners: listeners(),
            address_map: None,
            proxy_configs: proxy_configs.to_vec(),
            endpoint_slices: slices.to_vec(),
            secrets: &secrets,
        };
        let (step, problems) = cache.step(&inputs);
        let full = matches!(step, Step::Full(_));
        let translation = match step {
            Step::Full(config) => translator.update(&config),
            Step::Clusters(clusters) => translator.apply(Changes {
                clusters: clusters.into_iter().map(Edit::Put).collect(),
                ..Changes::default()
            }),
        };
        let (config, expected_problems) = to_model::build(&inputs);
        assert_eq!(problems, expected_problems);
        let fresh = crate::translate::translate(&config);
        assert!(
            translation.snapshot == fresh.snapshot,
            "the incremental step differs from a full build"
        );
        full
    }

    #[test]
    fn slice_changes_update_only_their_services_clusters() {
        let mut cache = ModelCache::default();
        let mut translator = Translator::new();
        let a = live("a", &["web", "api"], "1");
        let b = live("b", &["api", "img"], "1");
        let web = slice("web-1", "web", &["10.0.0.1"], "1");
        let api = slice("api-1", "api", &["10.0.1.1"], "1");
        let img = slice("img-1", "img", &["10.0.2.1"], "1");
        let pcs = [&a, &b];
        assert!(step_and_compare(
            &mut cache,
            &mut translator,
            &pcs,
            &[&web, &api, &img]
        ));

        // An endpoint moves.
        let api2 = slice("api-1", "api", &["10.0.1.1", "10.0.1.2"], "2");
        assert!(!step_and_compare(
            &mut cache,
            &mut translator,
            &pcs,
            &[&web, &api2, &img]
        ));
        // A second slice for a Service, then a slice goes away.
        let api3 = slice("api-2", "api", &["10.0.1.3"], "3");
        assert!(!step_and_compare(
            &mut cache,
            &mut translator,
            &pcs,
            &[&web, &api2, &api3, &img]
        ));
        assert!(!step_and_compare(
            &mut cache,
            &mut translator,
            &pcs,
            &[&api2, &api3, &img]
        ));
        // A slice is relabelled to another Service: both Services change.
        let moved = slice("api-2", "img", &["10.0.1.3"], "4");
        assert!(!step_and_compare(
            &mut cache,
            &mut translator,
            &pcs,
            &[&api2, &moved, &img]
        ));
        // Nothing changed.
        assert!(!step_and_compare(
            &mut cache,
            &mut translator,
            &pcs,
            &[&api2, &moved, &img]
        ));
        // A ProxyConfig changes: a full build.
        let b2 = live("b", &["img"], "2");
        assert!(step_and_compare(
            &mut cache,
            &mut translator,
            &[&a, &b2],
            &[&api2, &moved, &img]
        ));
    }

    #[test]
    fn only_changed_clusters_are_handed_over() {
        let mut cache = ModelCache::default();
        let a = live("a", &["web", "api"], "1");
        let web = slice("web-1", "web", &["10.0.0.1"], "1");
        let api = slice("api-1", "api", &["10.0.1.1"], "1");
        let secrets = BTreeMap::new();
        let run = |cache: &mut ModelCache, slices: Vec<&EndpointSlice>| {
            let inputs = Inputs {
                listeners: listeners(),
                address_map: None,
                proxy_configs: vec![&a],
                endpoint_slices: slices,
                secrets: &secrets,
            };
            cache.step(&inputs).0
        };
        assert!(matches!(run(&mut cache, vec![&web, &api]), Step::Full(_)));
        let web2 = slice("web-1", "web", &["10.0.0.9"], "2");
        match run(&mut cache, vec![&web2, &api]) {
            Step::Clusters(clusters) => {
                let names: Vec<&str> = clusters.iter().map(|c| c.service.name.as_str()).collect();
                assert_eq!(names, ["web"]);
            }
            Step::Full(_) => panic!("a slice change is not a full build"),
        }
        // A new resourceVersion with the same content hands over nothing.
        let web3 = slice("web-1", "web", &["10.0.0.9"], "3");
        assert!(matches!(run(&mut cache, vec![&web3, &api]), Step::Clusters(c) if c.is_empty()));
    }
}
