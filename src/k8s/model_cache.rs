//! What the last model was built from, so that a change to EndpointSlices alone (the
//! steady churn of a cluster: pods come and go) becomes a change to the clusters of their
//! Services, for [`Translator::apply`](crate::translate::Translator::apply), instead of a
//! new model compared input by input with the last one.
//!
//! Anything else that changes (a ProxyConfig, a TLS Secret, listener settings) rebuilds
//! the whole model: those changes are rollouts, rare next to endpoint churn.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use xxhash_rust::xxh3::Xxh3DefaultBuilder;

use super::address_map::AddressMap;
use super::to_model::{self, EndpointsKey, Inputs, SERVICE_NAME_LABEL, TlsData};
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

/// (namespace, Service name).
type Service = (String, String);
/// Looked up once per object on every step: a fast hash (no untrusted keys here, the
/// uids come from the API server).
type ByUid<V> = HashMap<String, V, Xxh3DefaultBuilder>;

struct Last {
    listeners: ListenerSettings,
    address_map: Option<AddressMap>,
    secrets: BTreeMap<(String, String), TlsData>,
    /// uid → resourceVersion of every ProxyConfig the model was built from.
    proxy_configs: ByUid<String>,
    /// uid → resourceVersion (None: never equal) and the Service the slice lists.
    slices: ByUid<(Option<String>, Option<Service>)>,
    clusters: BTreeMap<String, model::Cluster>,
    endpoint_sources: BTreeMap<String, EndpointsKey>,
    problems: Vec<Problem>,
}

/// An object's identity: its uid, or where there is none (objects built by hand), its
/// namespace and name. Borrowed in the common case: this runs for every object.
fn uid<K: ResourceExt>(object: &K) -> Cow<'_, str> {
    match object.meta().uid.as_deref() {
        Some(uid) => Cow::Borrowed(uid),
        None => Cow::Owned(format!(
            "{}/{}",
            object.namespace().unwrap_or_default(),
            object.name_any()
        )),
    }
}

fn version<K: ResourceExt>(object: &K) -> Option<&str> {
    object.meta().resource_version.as_deref()
}

/// uid → resourceVersion; objects without a version are left out, so that they never
/// compare equal (taken as changed, which is never wrong).
fn versions_of<K: ResourceExt>(objects: &[&K]) -> ByUid<String> {
    objects
        .iter()
        .filter_map(|o| Some((uid(*o).into_owned(), version(*o)?.to_owned())))
        .collect()
}

/// `objects` are exactly those `versions` was taken from, at the same versions.
fn same_objects<K: ResourceExt>(versions: &ByUid<String>, objects: &[&K]) -> bool {
    objects.len() == versions.len()
        && objects.iter().all(|o| {
            version(*o)
                .is_some_and(|v| versions.get(uid(*o).as_ref()).map(String::as_str) == Some(v))
        })
}

fn lists_one_of(slice: &EndpointSlice, services: &[Service]) -> bool {
    let Some(name) = slice.labels().get(SERVICE_NAME_LABEL) else {
        return false;
    };
    let namespace = slice.metadata.namespace.as_deref().unwrap_or_default();
    services.iter().any(|(n, s)| n == namespace && s == name)
}

impl ModelCache {
    /// The next step from `inputs`, and what was left out of the model (with why).
    pub fn step(&mut self, inputs: &Inputs<'_>) -> (Step, Vec<Problem>) {
        let only_slices_changed = self.last.as_ref().is_some_and(|last| {
            last.listeners == inputs.listeners
                && last.address_map == inputs.address_map
                && &last.secrets == inputs.secrets
                && same_objects(&last.proxy_configs, &inputs.proxy_configs)
        });
        match self.last.as_mut() {
            Some(last) if only_slices_changed => {
                let clusters = last.refresh_endpoints(inputs);
                (Step::Clusters(clusters), last.problems.clone())
            }
            _ => {
                let built = to_model::build_with_sources(inputs);
                let problems = built.problems.clone();
                self.last = Some(Last {
                    listeners: inputs.listeners.clone(),
                    address_map: inputs.address_map,
                    secrets: inputs.secrets.clone(),
                    proxy_configs: versions_of(&inputs.proxy_configs),
                    slices: inputs
                        .endpoint_slices
                        .iter()
                        .map(|s| {
                            let state = (version(*s).map(str::to_owned), to_model::service_of(s));
                            (uid(*s).into_owned(), state)
                        })
                        .collect(),
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
    fn refresh_endpoints(&mut self, inputs: &Inputs<'_>) -> Vec<model::Cluster> {
        // Usually one or two: a plain list.
        let mut services: Vec<Service> = Vec::new();
        let mut touch = |service: &Option<Service>| {
            if let Some(service) = service
                && !services.contains(service)
            {
                services.push(service.clone());
            }
        };
        let before = self.slices.len();
        let mut known = 0;
        for slice in &inputs.endpoint_slices {
            let id = uid(*slice);
            let now = version(*slice);
            let old = self.slices.get(id.as_ref());
            known += usize::from(old.is_some());
            if let Some((Some(v), _)) = old
                && Some(v.as_str()) == now
            {
                continue;
            }
            let service = to_model::service_of(slice);
            if let Some((_, before)) = old {
                touch(before);
            }
            touch(&service);
            self.slices
                .insert(id.into_owned(), (now.map(str::to_owned), service));
        }
        // Fewer of the slices held were seen than there are: some are gone.
        if known < before {
            let present: HashSet<Cow<'_, str>> =
                inputs.endpoint_slices.iter().map(|s| uid(*s)).collect();
            self.slices.retain(|id, (_, service)| {
                let keep = present.contains(id.as_str());
                if !keep {
                    touch(service);
                }
                keep
            });
        }
        if services.is_empty() {
            return Vec::new();
        }
        let relevant: Vec<&EndpointSlice> = inputs
            .endpoint_slices
            .iter()
            .copied()
            .filter(|slice| lists_one_of(slice, &services))
            .collect();
        let endpoints = to_model::endpoints_by_service(&relevant, inputs.address_map);
        let mut changed = Vec::new();
        for (name, key) in &self.endpoint_sources {
            let (namespace, service, _) = key;
            if !services.iter().any(|(n, s)| n == namespace && s == service) {
                continue;
            }
            let Some(cluster) = self.clusters.get_mut(name) else {
                continue;
            };
            let now = endpoints.get(key).cloned().unwrap_or_default();
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
