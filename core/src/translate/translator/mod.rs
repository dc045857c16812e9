//! The translator's state between changes: the inputs by name, indexes from what is
//! referenced to who refers to it, and the snapshot last produced. A change recomputes only
//! what depends on it, so its cost follows the size of the change, not of the config:
//!
//! - a cluster: its CDS and EDS resources, and the virtual hosts and probes that name it;
//! - a virtual host: itself, and the virtual hosts that share a domain with it (the first
//!   one by name keeps a host, so only they can win or lose one);
//! - a probe: its virtual host or the probe listener.
//!
//! The route configuration holds every virtual host; it is re-assembled from each virtual
//! host's cached encoding (a copy, no re-encoding). Listeners are rebuilt when TLS hosts or
//! endpoint probes change. The result is the same as translating the whole configuration
//! from scratch ([`super::translate`] is a fresh `Translator`); a property test holds it.
//!
//! By concern: `hosts` (which virtual host claims which domain, what probes reserve),
//! `placement` (route entries, use counts, the snapshot an apply ends with), `listeners`,
//! `inputs` (clusters and secrets as they come in), `found` (what its problems are keyed
//! by: the step that found them). This file holds the state and the two
//! entries, [`Translator::update`] (a whole configuration) and [`Translator::apply`].
//!
//! Three caches keep state between changes, each for its own step: the model cache
//! (`src/k8s/model_cache.rs`) keeps what the last model was built from, so a change to a
//! few Kubernetes objects becomes a few [`Changes`]; the translator (`core/src/translate/
//! translator`) keeps the inputs by name, their indexes and the last snapshot, so a change
//! costs what it touches; each xDS session (`core/src/xds/session`) keeps what its Envoy
//! has acknowledged, so it is sent only what differs, in make-before-break order.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use prost::Message;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;

use super::{
    HTTP_LISTENER, HTTPS_LISTENER, Inputs, PROBE_CATCH_ALL_VHOST, PROBE_LISTENER, Problem,
    ROUTE_CONFIG_NAME, Subject, Translation, VERSION_PROBE_VHOST_PREFIX, cluster, datagram,
    endpoint, listener, probe, proto, route, secret, stream, unique_by_name, validate,
};
use crate::model;
use crate::xds::snapshot::{
    CLUSTER, ENDPOINT, LISTENER, ROUTE, Resource, SECRET, Snapshot, VIRTUAL_HOST,
};
use crate::xds::vhds;

mod found;
mod hosts;
mod inputs;
mod listeners;
mod placement;

use found::Found;
use hosts::{DomainKey, Host, domain_key, route_config_of};
use inputs::{build_clusters, decrement, edits, remove_from};
use placement::{EntryKey, EntryKind, Output, StreamServed, TlsServed, Uses};

/// A change to one input: its new definition, or its removal by name.
#[derive(Clone, Debug)]
pub enum Edit<T> {
    Put(T),
    Remove(String),
}

/// Changes to apply together.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    pub listeners: Option<model::ListenerSettings>,
    /// Every Gateway listener, when they changed.
    pub gateway_listeners: Option<Vec<model::GatewayListener>>,
    pub clusters: Vec<Edit<model::Cluster>>,
    pub secrets: Vec<Edit<model::TlsSecret>>,
    pub virtual_hosts: Vec<Edit<model::VirtualHost>>,
    pub version_probes: Vec<Edit<model::VersionProbe>>,
    pub endpoint_probes: Vec<Edit<model::EndpointProbe>>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.listeners.is_none()
            && self.gateway_listeners.is_none()
            && self.clusters.is_empty()
            && self.secrets.is_empty()
            && self.virtual_hosts.is_empty()
            && self.version_probes.is_empty()
            && self.endpoint_probes.is_empty()
    }
}

/// Incremental translation; see the module documentation.
pub struct Translator {
    listeners: model::ListenerSettings,
    token_ok: bool,
    /// Gateway listeners as given, and those served (no conflict), by name.
    gateway_listeners: Vec<model::GatewayListener>,
    served_gateway_listeners: BTreeMap<String, model::GatewayListener>,
    /// The default secrets of the served Gateway listeners (each counts as a use).
    gateway_secret_uses: Vec<String>,
    clusters: HashMap<String, model::Cluster>,
    invalid_clusters: HashMap<String, String>,
    secrets: HashMap<String, model::TlsSecret>,
    hosts: BTreeMap<String, Host>,
    version_probes: BTreeMap<String, model::VersionProbe>,
    endpoint_probes: BTreeMap<String, model::EndpointProbe>,

    /// Cluster / secret name → every virtual host that names it, servable or not.
    hosts_by_cluster: HashMap<String, BTreeSet<String>>,
    hosts_by_secret: HashMap<String, BTreeSet<String>>,
    /// Domain → the virtual hosts without errors that ask for it.
    hosts_by_domain: HashMap<DomainKey, BTreeSet<String>>,
    /// Names and domains that probes hold before any user virtual host.
    reserved_names: HashSet<String>,
    reserved_domains: HashMap<DomainKey, String>,
    /// The domains each reserving name was given (some may have gone to a later one):
    /// a version probe's change looks up its own instead of scanning every reservation.
    reserved_by_holder: HashMap<String, Vec<DomainKey>>,
    /// Valid version probes (they hold their host), by id.
    selected_version_probes: BTreeSet<String>,
    /// Valid endpoint probes, by id, and the clusters they count as used.
    selected_endpoint_probes: Vec<String>,
    endpoint_probe_clusters: Vec<String>,

    /// How many served virtual hosts and endpoint probes use a cluster or secret.
    cluster_uses: HashMap<String, usize>,
    secret_uses: HashMap<String, usize>,
    /// Served cluster → the secret it presents to its backends (one use each).
    cluster_secrets: HashMap<String, String>,
    served_uses: HashMap<String, Uses>,
    /// Served TLS virtual hosts: Gateway listener, hosts and secret, by virtual host name.
    tls_hosts: BTreeMap<String, TlsServed>,
    /// Served virtual hosts of TCP and TLS Gateway listeners: one filter chain each, by
    /// virtual host name.
    stream_hosts: BTreeMap<String, StreamServed>,
    /// The blends served UDP virtual hosts send to (see [`datagram`]), by name: served
    /// while used, like a cluster.
    blends: BTreeMap<String, datagram::Blend>,
    /// Encoded virtual hosts of the route configurations.
    route_entries: BTreeMap<EntryKey, Vec<u8>>,
    /// The route configuration each placed version probe is in, by id.
    probe_entries: HashMap<String, String>,
    /// Version probe id → the clusters its served routes on trial send to: uses of them,
    /// like a virtual host's.
    probe_cluster_uses: HashMap<String, Vec<String>>,
    /// Problems by the step that found them; flattened and sorted into each translation.
    problems: BTreeMap<Found, Vec<Problem>>,
    /// Names defined more than once (see [`Translator::update`]).
    duplicate_problems: Vec<Problem>,
    duplicate_probe_problems: Vec<Problem>,
    snapshot: Snapshot,
}

impl Default for Translator {
    fn default() -> Self {
        Self::new()
    }
}

impl Translator {
    /// A translator with nothing in it: listeners with default settings, no routes.
    pub fn new() -> Self {
        let catch_all = probe::catch_all_virtual_host();
        // The catch-all answers in the shared route configuration.
        let catch_all_domains: Vec<DomainKey> = catch_all
            .domains
            .iter()
            .map(|d| domain_key(None, d))
            .collect();
        let mut translator = Self {
            listeners: model::ListenerSettings::default(),
            token_ok: false,
            gateway_listeners: Vec::new(),
            served_gateway_listeners: BTreeMap::new(),
            gateway_secret_uses: Vec::new(),
            clusters: HashMap::new(),
            invalid_clusters: HashMap::new(),
            secrets: HashMap::new(),
            hosts: BTreeMap::new(),
            version_probes: BTreeMap::new(),
            endpoint_probes: BTreeMap::new(),
            hosts_by_cluster: HashMap::new(),
            hosts_by_secret: HashMap::new(),
            hosts_by_domain: HashMap::new(),
            reserved_names: HashSet::from([PROBE_CATCH_ALL_VHOST.to_owned()]),
            reserved_domains: catch_all_domains
                .iter()
                .map(|d| (d.clone(), catch_all.name.clone()))
                .collect(),
            reserved_by_holder: HashMap::from([(catch_all.name.clone(), catch_all_domains)]),
            selected_version_probes: BTreeSet::new(),
            selected_endpoint_probes: Vec::new(),
            endpoint_probe_clusters: Vec::new(),
            cluster_uses: HashMap::new(),
            secret_uses: HashMap::new(),
            cluster_secrets: HashMap::new(),
            served_uses: HashMap::new(),
            tls_hosts: BTreeMap::new(),
            stream_hosts: BTreeMap::new(),
            blends: BTreeMap::new(),
            route_entries: BTreeMap::new(),
            probe_entries: HashMap::new(),
            probe_cluster_uses: HashMap::new(),
            problems: BTreeMap::new(),
            duplicate_problems: Vec::new(),
            duplicate_probe_problems: Vec::new(),
            snapshot: Snapshot::new([]),
        };
        let mut out = Output {
            routes_changed: BTreeSet::from([ROUTE_CONFIG_NAME.to_owned()]),
            ..Output::default()
        };
        translator.route_entries.insert(
            (
                ROUTE_CONFIG_NAME.to_owned(),
                catch_all.name.clone(),
                EntryKind::Probe,
            ),
            catch_all.encode_to_vec(),
        );
        let listeners = translator.listeners.clone();
        translator.set_listeners(listeners);
        translator.select_endpoint_probes(&mut out);
        translator.place_listeners(&mut out);
        translator.finish(out);
        translator
    }

    /// Brings the translator to `config`: names defined twice with different contents are
    /// left out (and reported), then only what differs from the current inputs is applied.
    /// Finding what differs compares every input; a caller that knows what changed calls
    /// [`Translator::apply`] instead.
    pub fn update(&mut self, config: &model::Config) -> Translation {
        let mut duplicates = Vec::new();
        let clusters = unique_by_name(
            &config.clusters,
            |c| c.name.as_str(),
            ("cluster", Subject::Cluster),
            super::cluster_content,
            &mut duplicates,
        );
        let secrets = unique_by_name(
            &config.secrets,
            |s| s.name.as_str(),
            ("secret", Subject::Secret),
            super::secret_content,
            &mut duplicates,
        );
        let hosts = unique_by_name(
            &config.virtual_hosts,
            |v| v.name.as_str(),
            ("virtual host", Subject::VirtualHost),
            super::serde_content,
            &mut duplicates,
        );
        let mut probe_duplicates = Vec::new();
        let version_probes = unique_by_name(
            &config.version_probes,
            |p| p.id.as_str(),
            ("version probe", Subject::VersionProbe),
            super::serde_content,
            &mut probe_duplicates,
        );
        let endpoint_probes = unique_by_name(
            &config.endpoint_probes,
            |p| p.id.as_str(),
            ("endpoint probe", Subject::EndpointProbe),
            super::serde_content,
            &mut probe_duplicates,
        );
        self.duplicate_problems = duplicates;
        self.duplicate_probe_problems = probe_duplicates;

        let changes = Changes {
            listeners: (config.listeners != self.listeners).then(|| config.listeners.clone()),
            gateway_listeners: (config.gateway_listeners != self.gateway_listeners)
                .then(|| config.gateway_listeners.clone()),
            clusters: edits(&self.clusters, &clusters),
            secrets: edits(&self.secrets, &secrets),
            virtual_hosts: edits(self.hosts.iter().map(|(n, h)| (n, &h.model)), &hosts),
            version_probes: edits(&self.version_probes, &version_probes),
            endpoint_probes: edits(&self.endpoint_probes, &endpoint_probes),
        };
        self.apply(changes)
    }

    /// The cluster of that name as last given (valid or not), endpoints included: a
    /// caller that edits clusters reads them here instead of keeping copies of its own.
    /// A name [`Translator::update`] was given twice with different contents is absent.
    pub fn cluster(&self, name: &str) -> Option<&model::Cluster> {
        self.clusters.get(name)
    }

    /// Applies changes and returns the new translation.
    pub fn apply(&mut self, changes: Changes) -> Translation {
        if changes.is_empty() {
            return self.translation();
        }
        let mut out = Output::default();
        let mut dirty_hosts: BTreeSet<String> = BTreeSet::new();
        let mut dirty_clusters: BTreeSet<String> = BTreeSet::new();
        let mut dirty_secrets: BTreeSet<String> = BTreeSet::new();
        let mut dirty_version_probes: BTreeSet<String> = BTreeSet::new();
        let mut endpoint_probes_dirty = false;

        if let Some(settings) = changes.listeners {
            if settings.virtual_host_discovery != self.listeners.virtual_host_discovery {
                // Every virtual host comes or goes as a resource of its own.
                out.entries_changed
                    .extend(self.route_entries.keys().cloned());
                out.routes_changed
                    .extend(self.route_entries.keys().map(|(rc, _, _)| rc.clone()));
            }
            self.set_listeners(settings);
            // The token is part of every probe.
            dirty_version_probes.extend(self.version_probes.keys().cloned());
            endpoint_probes_dirty = true;
            out.listeners_changed = true;
        }
        // Their ports are checked against the shared ones: a change there checks them again.
        let gateway_listeners = changes.gateway_listeners.or_else(|| {
            out.listeners_changed
                .then(|| self.gateway_listeners.clone())
        });
        if let Some(gateway_listeners) = gateway_listeners {
            let changed = self.set_gateway_listeners(gateway_listeners, &mut out);
            // Their virtual hosts and version probes are served, or not, with them.
            dirty_hosts.extend(
                self.hosts
                    .iter()
                    .filter(|(_, h)| {
                        h.model
                            .listener
                            .as_ref()
                            .is_some_and(|l| changed.contains(l))
                    })
                    .map(|(n, _)| n.clone()),
            );
            dirty_version_probes.extend(
                self.version_probes
                    .values()
                    .filter(|p| p.listener.as_ref().is_some_and(|l| changed.contains(l)))
                    .map(|p| p.id.clone()),
            );
            out.listeners_changed = true;
        }
        let mut usable_changed_clusters: HashSet<String> = HashSet::new();
        for edit in changes.clusters {
            let (name, usable_changed, switch_changed) = self.edit_cluster(edit);
            // Endpoint probes also care whether its endpoints may take a switch.
            endpoint_probes_dirty |= switch_changed
                && (self.endpoint_probes.values()).any(|p| p.clusters.contains_key(&name));
            // Virtual hosts and probes only care whether the cluster can be used.
            if usable_changed {
                usable_changed_clusters.insert(name.clone());
                dirty_hosts.extend(
                    self.hosts_by_cluster
                        .get(&name)
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
                endpoint_probes_dirty |= self
                    .endpoint_probes
                    .values()
                    .any(|p| p.clusters.contains_key(&name));
            }
            dirty_clusters.insert(name);
        }
        // Routes on trial are served only while their clusters can be (one pass over the
        // probes, not one per cluster).
        if !usable_changed_clusters.is_empty() {
            dirty_version_probes.extend(
                self.version_probes
                    .values()
                    .filter(|p| {
                        route::routed_clusters(&p.routes)
                            .any(|c| usable_changed_clusters.contains(c))
                    })
                    .map(|p| p.id.clone()),
            );
        }
        for edit in changes.secrets {
            let (name, usable_changed) = self.edit_secret(edit);
            let default_of_a_listener = self
                .served_gateway_listeners
                .values()
                .any(|l| l.default_secret.as_deref() == Some(name.as_str()));
            out.listeners_changed |= usable_changed && default_of_a_listener;
            if usable_changed {
                dirty_hosts.extend(
                    self.hosts_by_secret
                        .get(&name)
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
            }
            dirty_secrets.insert(name);
        }
        for edit in changes.version_probes {
            let id = match edit {
                Edit::Put(p) => {
                    let id = p.id.clone();
                    self.version_probes.insert(id.clone(), p);
                    id
                }
                Edit::Remove(id) => {
                    self.version_probes.remove(&id);
                    id
                }
            };
            dirty_version_probes.insert(id);
        }
        for edit in changes.endpoint_probes {
            match edit {
                Edit::Put(p) => self.endpoint_probes.insert(p.id.clone(), p),
                Edit::Remove(id) => self.endpoint_probes.remove(&id),
            };
            endpoint_probes_dirty = true;
        }

        // Version probes hold their names and domains before any user virtual host.
        let mut seed_domains: BTreeSet<DomainKey> = BTreeSet::new();
        for id in &dirty_version_probes {
            let (name, domains) = self.reserve_version_probe(id);
            if self.hosts.contains_key(&name) {
                dirty_hosts.insert(name);
            }
            seed_domains.extend(domains);
        }

        // User virtual hosts: out of the indexes with their old state, in with the new.
        let mut before: BTreeMap<String, Option<bool>> = BTreeMap::new();
        for edit in changes.virtual_hosts {
            let name = match &edit {
                Edit::Put(v) => v.name.clone(),
                Edit::Remove(name) => name.clone(),
            };
            self.unindex_host(&name, &mut seed_domains, &mut before);
            match edit {
                Edit::Put(model) => {
                    let served = self.hosts.get(&name).is_some_and(|h| h.served);
                    self.hosts.insert(
                        name.clone(),
                        Host {
                            model,
                            hosts: Vec::new(),
                            domain_keys: Vec::new(),
                            errors: Vec::new(),
                            served,
                            served_hosts: Vec::new(),
                        },
                    );
                }
                Edit::Remove(_) => {
                    self.hosts.remove(&name);
                }
            }
            dirty_hosts.insert(name);
        }
        for name in &dirty_hosts {
            self.unindex_host(name, &mut seed_domains, &mut before);
            self.index_host(name, &mut seed_domains);
        }

        let affected = self.sharing_domains(&dirty_hosts, &seed_domains);
        let drop_changed = self.claim(&affected, &before, &dirty_hosts, &mut out);

        for id in dirty_version_probes.iter().chain(&drop_changed) {
            self.place_version_probe(id, &mut out);
        }
        if endpoint_probes_dirty {
            self.select_endpoint_probes(&mut out);
            out.listeners_changed = true;
        }
        dirty_clusters.extend(std::mem::take(&mut out.touched_clusters));
        self.place_clusters(&dirty_clusters, &mut out);
        dirty_secrets.extend(std::mem::take(&mut out.touched_secrets));
        self.place_secrets(&dirty_secrets, &mut out);
        // A TCP or TLS listener answers its version probes from its route configuration's
        // probe entries, inline (its user virtual hosts are filter chains).
        out.listeners_changed |= out
            .routes_changed
            .iter()
            .any(|rc| self.is_stream_listener(rc));
        if out.listeners_changed {
            self.place_listeners(&mut out);
        }
        self.finish(out);
        self.translation()
    }

    /// The current translation.
    pub fn translation(&self) -> Translation {
        let probe_duplicates = self
            .duplicate_probe_problems
            .iter()
            .filter(|_| self.token_ok);
        let mut problems: Vec<Problem> = self
            .problems
            .values()
            .flatten()
            .chain(&self.duplicate_problems)
            .chain(probe_duplicates)
            .cloned()
            .collect();
        problems.sort();
        problems.dedup();
        Translation {
            snapshot: self.snapshot.clone(),
            problems,
        }
    }

    fn inputs(&self) -> Inputs<'_> {
        Inputs {
            clusters: &self.clusters,
            invalid_clusters: &self.invalid_clusters,
            secrets: &self.secrets,
        }
    }
}
