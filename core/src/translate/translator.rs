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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use prost::Message;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;

use super::{
    HTTP_LISTENER, HTTPS_LISTENER, Inputs, PROBE_CATCH_ALL_VHOST, PROBE_LISTENER, Problem,
    ROUTE_CONFIG_NAME, Translation, VERSION_PROBE_VHOST_PREFIX, cluster, endpoint, listener, probe,
    proto, route, secret, unique_by_name, validate,
};
use crate::model;
use crate::xds::snapshot::{
    CLUSTER, ENDPOINT, LISTENER, ROUTE, Resource, SECRET, Snapshot, VIRTUAL_HOST,
};
use crate::xds::vhds;

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

/// A user virtual host and what was derived from it.
struct Host {
    model: model::VirtualHost,
    /// Normalized hosts (see [`route::normalized_hosts`]).
    hosts: Vec<String>,
    /// The same, as keys of the domain indexes: scoped by its route configuration, since
    /// a host is claimed once per route configuration.
    domain_keys: Vec<String>,
    /// Why it cannot be served, conflicts with other virtual hosts aside.
    errors: Vec<String>,
    served: bool,
    /// The hosts it is served for: those of `hosts` that no virtual host ahead of it in
    /// the claim order holds.
    served_hosts: Vec<String>,
}

/// What a served virtual host uses.
#[derive(Clone, PartialEq)]
struct Uses {
    route_config: String,
    clusters: BTreeSet<String>,
    secret: Option<String>,
}

/// Route entries are keyed by (route configuration, name, kind): probe virtual hosts sort
/// before a user's of the same name, which is then refused anyway ("reserved for a probe").
type EntryKey = (String, String, EntryKind);

/// The route configuration of a virtual host or version probe: its Gateway listener's, or
/// the shared one.
fn route_config_of(listener: Option<&String>) -> &str {
    listener.map_or(ROUTE_CONFIG_NAME, String::as_str)
}

/// A domain as the indexes know it: within its route configuration.
fn domain_key(listener: Option<&String>, domain: &str) -> String {
    match listener {
        None => domain.to_owned(),
        Some(l) => format!("{l}\u{0}{domain}"),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum EntryKind {
    Probe,
    User,
}

/// What one apply changed, gathered for the snapshot at its end.
#[derive(Default)]
struct Output {
    puts: Vec<Resource>,
    removes: Vec<(&'static str, String)>,
    /// Clusters and secrets whose use count changed.
    touched_clusters: BTreeSet<String>,
    touched_secrets: BTreeSet<String>,
    /// Route configurations to re-assemble (or remove, once their listener is gone).
    routes_changed: BTreeSet<String>,
    /// Virtual hosts added, changed or removed: each is a resource of its own when route
    /// configurations are also served in parts.
    entries_changed: BTreeSet<EntryKey>,
    listeners_changed: bool,
}

/// Keys of the problem map: what a problem is about.
fn key(kind: &str, name: &str) -> String {
    format!("{kind}\u{0}{name}")
}
const HOST: &str = "host";
const CLUSTER_KEY: &str = "cluster";
const VERSION_PROBE: &str = "version-probe";
const LEFT_OUT: &str = "left-out";
const ENDPOINT_PROBES: &str = "endpoint-probes";
const LISTENERS: &str = "listeners";
const GATEWAY_LISTENERS: &str = "gateway-listeners";

/// A served TLS virtual host's place on an HTTPS listener.
#[derive(Clone, PartialEq)]
struct TlsServed {
    listener: Option<String>,
    hosts: Vec<String>,
    secret: String,
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
    hosts_by_domain: HashMap<String, BTreeSet<String>>,
    /// Names and domains that probes hold before any user virtual host.
    reserved_names: HashSet<String>,
    reserved_domains: HashMap<String, String>,
    /// The domains each reserving name was given (some may have gone to a later one):
    /// a version probe's change looks up its own instead of scanning every reservation.
    reserved_by_holder: HashMap<String, Vec<String>>,
    /// Valid version probes (they hold their host), by id.
    selected_version_probes: BTreeSet<String>,
    /// Valid endpoint probes, by id, and the clusters they count as used.
    selected_endpoint_probes: Vec<String>,
    endpoint_probe_clusters: Vec<String>,

    /// How many served virtual hosts and endpoint probes use a cluster or secret.
    cluster_uses: HashMap<String, usize>,
    secret_uses: HashMap<String, usize>,
    served_uses: HashMap<String, Uses>,
    /// Served TLS virtual hosts: Gateway listener, hosts and secret, by virtual host name.
    tls_hosts: BTreeMap<String, TlsServed>,
    /// Encoded virtual hosts of the route configurations.
    route_entries: BTreeMap<EntryKey, Vec<u8>>,
    /// The route configuration each placed version probe is in, by id.
    probe_entries: HashMap<String, String>,
    /// Version probe id → the clusters its served routes on trial send to: uses of them,
    /// like a virtual host's.
    probe_cluster_uses: HashMap<String, Vec<String>>,
    /// Problems by what they are about; flattened and sorted into each translation.
    problems: BTreeMap<String, Vec<Problem>>,
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
            reserved_domains: catch_all
                .domains
                .iter()
                .map(|d| (d.clone(), catch_all.name.clone()))
                .collect(),
            reserved_by_holder: HashMap::from([(
                catch_all.name.clone(),
                catch_all.domains.clone(),
            )]),
            selected_version_probes: BTreeSet::new(),
            selected_endpoint_probes: Vec::new(),
            endpoint_probe_clusters: Vec::new(),
            cluster_uses: HashMap::new(),
            secret_uses: HashMap::new(),
            served_uses: HashMap::new(),
            tls_hosts: BTreeMap::new(),
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
            "cluster",
            super::cluster_content,
            &mut duplicates,
        );
        let secrets = unique_by_name(
            &config.secrets,
            |s| s.name.as_str(),
            "secret",
            super::secret_content,
            &mut duplicates,
        );
        let hosts = unique_by_name(
            &config.virtual_hosts,
            |v| v.name.as_str(),
            "virtual host",
            super::serde_content,
            &mut duplicates,
        );
        let mut probe_duplicates = Vec::new();
        let version_probes = unique_by_name(
            &config.version_probes,
            |p| p.id.as_str(),
            "version probe",
            super::serde_content,
            &mut probe_duplicates,
        );
        let endpoint_probes = unique_by_name(
            &config.endpoint_probes,
            |p| p.id.as_str(),
            "endpoint probe",
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
            let (name, usable_changed) = self.edit_cluster(edit);
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
        let mut seed_domains: BTreeSet<String> = BTreeSet::new();
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

    fn set_listeners(&mut self, settings: model::ListenerSettings) {
        self.listeners = settings;
        match validate::header_value(&self.listeners.probe_token) {
            Ok(()) => {
                self.token_ok = true;
                self.problems.remove(&key(LISTENERS, ""));
            }
            Err(e) => {
                self.token_ok = false;
                self.problems.insert(
                    key(LISTENERS, ""),
                    vec![Problem::new(
                        "listeners",
                        format!(
                            "probe token is not a valid header value ({e}); no probe is served"
                        ),
                    )],
                );
            }
        }
    }

    /// Takes the Gateway listeners in: a name defined twice with different contents is
    /// left out; of those asking for one port, the first by name is served. Every one left
    /// out is reported. Returns the names whose served
    /// definition changed (added, gone or different).
    fn set_gateway_listeners(
        &mut self,
        listeners: Vec<model::GatewayListener>,
        out: &mut Output,
    ) -> BTreeSet<String> {
        let mut sorted = listeners.clone();
        sorted.sort();
        sorted.dedup();
        self.gateway_listeners = listeners;
        let shared = &self.listeners;
        let mut ports: BTreeMap<u16, String> = [
            (shared.http_port, HTTP_LISTENER),
            (shared.https_port, HTTPS_LISTENER),
            (shared.probe_port, PROBE_LISTENER),
        ]
        .into_iter()
        .map(|(p, n)| (p, format!("the shared {n} listener")))
        .collect();
        let mut definitions: HashMap<&str, usize> = HashMap::new();
        for l in &sorted {
            *definitions.entry(l.name.as_str()).or_default() += 1;
        }
        let twice: HashSet<String> = definitions
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(name, _)| name.to_owned())
            .collect();
        let mut served: BTreeMap<String, model::GatewayListener> = BTreeMap::new();
        let mut problems = Vec::new();
        for l in sorted {
            let problem = if l.name.is_empty() || l.name == ROUTE_CONFIG_NAME {
                Some(format!("the name {:?} is not allowed", l.name))
            } else if twice.contains(&l.name) {
                Some("defined twice with different contents".to_owned())
            } else if l.port == 0 || l.probe_port == 0 || l.port == l.probe_port {
                Some("needs two different ports, neither 0".to_owned())
            } else {
                let holder = ports.get(&l.port).or_else(|| ports.get(&l.probe_port));
                holder.map(|h| format!("a port of it is taken by {h}"))
            };
            match problem {
                Some(message) => {
                    problems.push(Problem::new(
                        format!("gateway-listener/{}", l.name),
                        message,
                    ));
                }
                None => {
                    let holder = format!("Gateway listener {:?}", l.name);
                    ports.insert(l.port, holder.clone());
                    ports.insert(l.probe_port, holder);
                    served.insert(l.name.clone(), l);
                }
            }
        }
        self.problems.insert(key(GATEWAY_LISTENERS, ""), problems);
        let mut changed = BTreeSet::new();
        for name in self.served_gateway_listeners.keys().chain(served.keys()) {
            if self.served_gateway_listeners.get(name) != served.get(name) {
                changed.insert(name.clone());
            }
        }
        // Their default secrets are used while they are served.
        let defaults: Vec<String> = served
            .values()
            .filter_map(|l| l.default_secret.clone())
            .collect();
        for s in std::mem::replace(&mut self.gateway_secret_uses, defaults.clone()) {
            decrement(&mut self.secret_uses, &s);
            out.touched_secrets.insert(s);
        }
        for s in defaults {
            *self.secret_uses.entry(s.clone()).or_default() += 1;
            out.touched_secrets.insert(s);
        }
        let catch_all = probe::catch_all_virtual_host();
        for name in &changed {
            // A probe host not installed answers 404 there too, never a user's backend.
            let entry = served.contains_key(name).then(|| catch_all.encode_to_vec());
            let key = (name.clone(), catch_all.name.clone(), EntryKind::Probe);
            self.set_entry(key, entry, out);
            out.routes_changed.insert(name.clone());
        }
        self.served_gateway_listeners = served;
        changed
    }

    /// Stores a cluster change; returns its name and whether its usability changed
    /// (defined or not, valid or not).
    fn edit_cluster(&mut self, edit: Edit<model::Cluster>) -> (String, bool) {
        let name = match &edit {
            Edit::Put(c) => c.name.clone(),
            Edit::Remove(name) => name.clone(),
        };
        let was = self.inputs().cluster_error(&name);
        match edit {
            Edit::Put(c) => {
                match cluster::validate(&c) {
                    Ok(()) => self.invalid_clusters.remove(&name),
                    Err(e) => self.invalid_clusters.insert(name.clone(), e),
                };
                self.clusters.insert(name.clone(), c);
            }
            Edit::Remove(_) => {
                self.clusters.remove(&name);
                self.invalid_clusters.remove(&name);
            }
        }
        let changed = self.inputs().cluster_error(&name) != was;
        (name, changed)
    }

    /// Stores a secret change; returns its name and whether its usability changed.
    fn edit_secret(&mut self, edit: Edit<model::TlsSecret>) -> (String, bool) {
        let usable = |s: Option<&model::TlsSecret>| s.map(secret::validate);
        match edit {
            Edit::Put(s) => {
                let name = s.name.clone();
                let now = usable(Some(&s));
                let old = self.secrets.insert(name.clone(), s);
                let changed = usable(old.as_ref()) != now;
                (name, changed)
            }
            Edit::Remove(name) => {
                let changed = self.secrets.remove(&name).is_some();
                (name, changed)
            }
        }
    }

    /// Re-reserves a version probe's name and domain. Returns its virtual host name and
    /// the domains whose holder may have changed.
    fn reserve_version_probe(&mut self, id: &str) -> (String, Vec<String>) {
        let name = format!("{VERSION_PROBE_VHOST_PREFIX}{id}");
        let given = self.reserved_by_holder.remove(&name).unwrap_or_default();
        let mut domains: Vec<String> = given
            .into_iter()
            .filter(|d| self.reserved_domains.get(d) == Some(&name))
            .collect();
        for d in &domains {
            self.reserved_domains.remove(d);
        }
        self.reserved_names.remove(&name);
        self.selected_version_probes.remove(id);
        self.problems.remove(&key(VERSION_PROBE, id));

        if let Some(p) = self.version_probes.get(id).filter(|_| self.token_ok) {
            let mut problems = Vec::new();
            let listener = p.listener.as_ref();
            let trial_errors = route::validate_routes(&p.routes, &self.inputs());
            if let Some(l) = listener.filter(|l| !self.served_gateway_listeners.contains_key(*l)) {
                problems.push(Problem::new(
                    format!("version-probe/{id}"),
                    format!("Gateway listener {l:?} is not served"),
                ));
                self.problems.insert(key(VERSION_PROBE, id), problems);
            } else if probe::select_version_probes(std::slice::from_ref(p), &mut problems)
                .is_empty()
            {
                self.problems.insert(key(VERSION_PROBE, id), problems);
            } else if !trial_errors.is_empty() {
                // Routes on trial are served only as they would be live: a ProxyConfig
                // written by hand (or by another version) may name clusters it lacks.
                problems.extend(trial_errors.into_iter().map(|e| {
                    Problem::new(
                        format!("version-probe/{id}"),
                        format!("route on trial: {e}"),
                    )
                }));
                self.problems.insert(key(VERSION_PROBE, id), problems);
            } else {
                let vhost = probe::version_probe_virtual_host(p, &self.listeners.probe_token);
                let keys: Vec<String> = vhost
                    .domains
                    .iter()
                    .map(|d| domain_key(listener, d))
                    .collect();
                for d in &keys {
                    self.reserved_domains.insert(d.clone(), vhost.name.clone());
                }
                self.reserved_by_holder
                    .insert(vhost.name.clone(), keys.clone());
                domains.extend(keys);
                self.reserved_names.insert(vhost.name);
                self.selected_version_probes.insert(id.to_owned());
            }
        }
        (name, domains)
    }

    /// Takes a virtual host out of the indexes, once per apply, remembering whether it
    /// existed and was served, and which domains it held.
    fn unindex_host(
        &mut self,
        name: &str,
        seed_domains: &mut BTreeSet<String>,
        before: &mut BTreeMap<String, Option<bool>>,
    ) {
        if before.contains_key(name) {
            return;
        }
        let Some(host) = self.hosts.get(name) else {
            before.insert(name.to_owned(), None);
            return;
        };
        before.insert(name.to_owned(), Some(host.served));
        for c in route::referenced_clusters(&host.model) {
            remove_from(&mut self.hosts_by_cluster, c, name);
        }
        if let Some(tls) = &host.model.tls {
            remove_from(&mut self.hosts_by_secret, &tls.secret, name);
        }
        for d in &host.domain_keys {
            remove_from(&mut self.hosts_by_domain, d, name);
            seed_domains.insert(d.clone());
        }
    }

    /// Validates a virtual host against the current inputs and indexes it.
    fn index_host(&mut self, name: &str, seed_domains: &mut BTreeSet<String>) {
        let Some(host) = self.hosts.get(name) else {
            return;
        };
        let mut errors = route::validate_virtual_host(&host.model, &self.inputs());
        if let Some(l) = &host.model.listener {
            match self.served_gateway_listeners.get(l) {
                None => errors.push(format!("Gateway listener {l:?} is not served")),
                Some(gl) if gl.tls && host.model.tls.is_none() => errors.push(format!(
                    "Gateway listener {l:?} is HTTPS: the virtual host needs TLS"
                )),
                Some(gl) if !gl.tls && host.model.tls.is_some() => errors.push(format!(
                    "Gateway listener {l:?} is plain HTTP: the virtual host cannot have TLS"
                )),
                Some(_) => {}
            }
        }
        let hosts = route::normalized_hosts(&host.model);
        let domain_keys: Vec<String> = hosts
            .iter()
            .map(|d| domain_key(host.model.listener.as_ref(), d))
            .collect();
        let clusters: Vec<String> = route::referenced_clusters(&host.model)
            .map(str::to_owned)
            .collect();
        let secret = host.model.tls.as_ref().map(|t| t.secret.clone());
        for c in clusters {
            self.hosts_by_cluster
                .entry(c)
                .or_default()
                .insert(name.to_owned());
        }
        if let Some(s) = secret {
            self.hosts_by_secret
                .entry(s)
                .or_default()
                .insert(name.to_owned());
        }
        if errors.is_empty() {
            for d in &domain_keys {
                self.hosts_by_domain
                    .entry(d.clone())
                    .or_default()
                    .insert(name.to_owned());
                seed_domains.insert(d.clone());
            }
        }
        if let Some(host) = self.hosts.get_mut(name) {
            host.errors = errors;
            host.hosts = hosts;
            host.domain_keys = domain_keys;
        }
    }

    /// The dirty virtual hosts and every servable one that shares a domain with them or
    /// with a seed domain, directly or through others: the only ones whose hold on a host
    /// can change.
    fn sharing_domains(
        &self,
        dirty: &BTreeSet<String>,
        seed_domains: &BTreeSet<String>,
    ) -> BTreeSet<String> {
        let mut affected: BTreeSet<String> = dirty.clone();
        let mut seen: HashSet<&str> = HashSet::new();
        let mut queue: Vec<&str> = seed_domains.iter().map(String::as_str).collect();
        while let Some(domain) = queue.pop() {
            if !seen.insert(domain) {
                continue;
            }
            for name in self.hosts_by_domain.get(domain).into_iter().flatten() {
                if affected.insert(name.clone())
                    && let Some(h) = self.hosts.get(name)
                {
                    queue.extend(h.domain_keys.iter().map(String::as_str));
                }
            }
        }
        affected
    }

    /// Decides which affected virtual hosts are served, and for which hosts: in claim
    /// order (see [`claim_order`]), each gets the hosts that no one before it holds, and
    /// is served if it gets any. Returns the names whose "left out" state changed.
    fn claim(
        &mut self,
        affected: &BTreeSet<String>,
        before: &BTreeMap<String, Option<bool>>,
        dirty: &BTreeSet<String>,
        out: &mut Output,
    ) -> Vec<String> {
        let mut drop_changed = Vec::new();
        let mut claimed: HashMap<&str, &str> = HashMap::new();
        let mut decisions: Vec<(&str, Vec<&String>, Vec<String>)> = Vec::new();
        let mut order: Vec<(&String, &Host)> = affected
            .iter()
            .filter_map(|name| Some((name, self.hosts.get(name)?)))
            .collect();
        order.sort_by(claim_order);
        for (name, host) in order {
            let mut errors = host.errors.clone();
            let mut won: Vec<&String> = Vec::new();
            if errors.is_empty() && self.reserved_names.contains(name) {
                errors.push(format!(
                    "virtual host name {name:?} is reserved for a probe"
                ));
            }
            if errors.is_empty() {
                for (h, k) in host.hosts.iter().zip(&host.domain_keys) {
                    let holder = self
                        .reserved_domains
                        .get(k)
                        .map(String::as_str)
                        .or_else(|| claimed.get(k.as_str()).copied());
                    match holder {
                        Some(holder) => errors.push(format!(
                            "host {h:?} is already served by virtual host {holder:?}"
                        )),
                        None => {
                            won.push(h);
                            claimed.insert(k, name);
                        }
                    }
                }
            }
            decisions.push((name, won, errors));
        }
        let decisions: Vec<(String, Vec<String>, Vec<String>)> = decisions
            .into_iter()
            .map(|(n, w, e)| (n.to_owned(), w.into_iter().cloned().collect(), e))
            .collect();
        let decided: HashSet<&String> = decisions.iter().map(|(n, _, _)| n).collect();
        // Removed virtual hosts: out of the route configuration, no problem left.
        for (name, was) in before {
            if !decided.contains(name) && !self.hosts.contains_key(name) {
                self.problems.remove(&key(HOST, name));
                self.unserve(name, out);
                if *was == Some(false) {
                    drop_changed.push(name.clone());
                }
            }
        }
        for (name, won, errors) in decisions {
            let was = match before.get(&name) {
                Some(was) => *was,
                None => self.hosts.get(&name).map(|h| h.served),
            };
            let served = !won.is_empty();
            if served {
                // Hosts lost to virtual hosts ahead of it are reported; the rest serve.
                if errors.is_empty() {
                    self.problems.remove(&key(HOST, &name));
                } else {
                    self.problems.insert(
                        key(HOST, &name),
                        errors.into_iter().map(|e| Problem::new(&name, e)).collect(),
                    );
                }
                let hosts_changed = self.hosts.get(&name).is_some_and(|h| h.served_hosts != won);
                if let Some(h) = self.hosts.get_mut(&name) {
                    h.served_hosts = won;
                }
                if dirty.contains(&name) || was != Some(true) || hosts_changed {
                    self.serve(&name, out);
                }
            } else {
                self.problems.insert(
                    key(HOST, &name),
                    errors.into_iter().map(|e| Problem::new(&name, e)).collect(),
                );
                self.unserve(&name, out);
            }
            if let Some(h) = self.hosts.get_mut(&name) {
                h.served = served;
            }
            let (left_out_before, left_out_now) = (was == Some(false), !served);
            if left_out_before != left_out_now {
                drop_changed.push(name);
            }
        }
        drop_changed
    }

    /// Puts a virtual host that will be served into the route configuration.
    fn serve(&mut self, name: &str, out: &mut Output) {
        let Some(host) = self.hosts.get(name) else {
            return;
        };
        let bytes =
            route::encode_virtual_host(route::virtual_host(&host.model, &host.served_hosts));
        let route_config = route_config_of(host.model.listener.as_ref()).to_owned();
        let uses = Uses {
            route_config: route_config.clone(),
            clusters: route::referenced_clusters(&host.model)
                .map(str::to_owned)
                .collect(),
            secret: host.model.tls.as_ref().map(|t| t.secret.clone()),
        };
        let tls = host.model.tls.as_ref().map(|t| TlsServed {
            listener: host.model.listener.clone(),
            hosts: host.served_hosts.clone(),
            secret: t.secret.clone(),
        });
        let moved_from = self
            .served_uses
            .get(name)
            .map(|u| u.route_config.clone())
            .filter(|old| *old != route_config);
        if let Some(old) = moved_from {
            self.set_entry((old, name.to_owned(), EntryKind::User), None, out);
        }
        self.set_entry(
            (route_config, name.to_owned(), EntryKind::User),
            Some(bytes),
            out,
        );
        self.set_uses(name, Some(uses), out);
        self.set_tls_host(name, tls, out);
    }

    /// Takes a virtual host out of its route configuration (if it was in).
    fn unserve(&mut self, name: &str, out: &mut Output) {
        // It may have moved to another listener since it was served.
        let served_in = self.served_uses.get(name).map(|u| u.route_config.clone());
        if let Some(route_config) = served_in {
            self.set_entry((route_config, name.to_owned(), EntryKind::User), None, out);
        }
        self.set_uses(name, None, out);
        self.set_tls_host(name, None, out);
    }

    fn set_entry(&mut self, key: EntryKey, bytes: Option<Vec<u8>>, out: &mut Output) {
        let route_config = key.0.clone();
        let changed = match bytes {
            Some(bytes) => match self.route_entries.get(&key) {
                Some(current) if *current == bytes => false,
                _ => {
                    self.route_entries.insert(key.clone(), bytes);
                    true
                }
            },
            None => self.route_entries.remove(&key).is_some(),
        };
        if changed {
            out.routes_changed.insert(route_config);
            out.entries_changed.insert(key);
        }
    }

    fn set_uses(&mut self, name: &str, uses: Option<Uses>, out: &mut Output) {
        if self.served_uses.get(name) == uses.as_ref() {
            return;
        }
        if let Some(old) = self.served_uses.remove(name) {
            for c in old.clusters {
                decrement(&mut self.cluster_uses, &c);
                out.touched_clusters.insert(c);
            }
            if let Some(s) = old.secret {
                decrement(&mut self.secret_uses, &s);
                out.touched_secrets.insert(s);
            }
        }
        if let Some(new) = uses {
            for c in &new.clusters {
                *self.cluster_uses.entry(c.clone()).or_default() += 1;
                out.touched_clusters.insert(c.clone());
            }
            if let Some(s) = &new.secret {
                *self.secret_uses.entry(s.clone()).or_default() += 1;
                out.touched_secrets.insert(s.clone());
            }
            self.served_uses.insert(name.to_owned(), new);
        }
    }

    fn set_tls_host(&mut self, name: &str, tls: Option<TlsServed>, out: &mut Output) {
        if self.tls_hosts.get(name) == tls.as_ref() {
            return;
        }
        match tls {
            Some(tls) => self.tls_hosts.insert(name.to_owned(), tls),
            None => self.tls_hosts.remove(name),
        };
        out.listeners_changed = true;
    }

    /// A version probe's virtual host is served when the probe is valid and its virtual
    /// host (same id) is not left out: a probe must never report a version whose routes
    /// are not served.
    fn place_version_probe(&mut self, id: &str, out: &mut Output) {
        self.problems.remove(&key(LEFT_OUT, id));
        let mut entry = None;
        let name = format!("{VERSION_PROBE_VHOST_PREFIX}{id}");
        // Out of the route configuration it was in: its listener may have changed.
        let held: Vec<EntryKey> = self
            .probe_entries
            .remove(id)
            .into_iter()
            .map(|rc| (rc, name.clone(), EntryKind::Probe))
            .collect();
        for key in held {
            self.set_entry(key, None, out);
        }
        let mut route_config = ROUTE_CONFIG_NAME.to_owned();
        if self.selected_version_probes.contains(id)
            && let Some(p) = self.version_probes.get(id)
        {
            route_config = route_config_of(p.listener.as_ref()).to_owned();
            if self.hosts.get(id).is_some_and(|h| !h.served) {
                self.problems.insert(
                    key(LEFT_OUT, id),
                    vec![Problem::new(
                        format!("version-probe/{id}"),
                        "left out with its virtual host",
                    )],
                );
            } else {
                entry = Some(route::encode_virtual_host(
                    probe::version_probe_virtual_host(p, &self.listeners.probe_token),
                ));
            }
        }
        let mut trial_clusters: Vec<String> = Vec::new();
        if entry.is_some() {
            self.probe_entries
                .insert(id.to_owned(), route_config.clone());
            if let Some(p) = self.version_probes.get(id) {
                trial_clusters = route::routed_clusters(&p.routes)
                    .map(str::to_owned)
                    .collect();
                trial_clusters.sort();
                trial_clusters.dedup();
            }
        }
        self.set_probe_cluster_uses(id, trial_clusters, out);
        self.set_entry((route_config, name, EntryKind::Probe), entry, out);
    }

    /// The clusters a version probe's routes on trial use: served while it is.
    fn set_probe_cluster_uses(&mut self, id: &str, clusters: Vec<String>, out: &mut Output) {
        let old = self.probe_cluster_uses.remove(id).unwrap_or_default();
        if old == clusters {
            if !clusters.is_empty() {
                self.probe_cluster_uses.insert(id.to_owned(), clusters);
            }
            return;
        }
        for c in old {
            decrement(&mut self.cluster_uses, &c);
            out.touched_clusters.insert(c);
        }
        for c in &clusters {
            *self.cluster_uses.entry(c.clone()).or_default() += 1;
            out.touched_clusters.insert(c.clone());
        }
        if !clusters.is_empty() {
            self.probe_cluster_uses.insert(id.to_owned(), clusters);
        }
    }

    /// Endpoint probes are few: all of them are selected again when any of their inputs
    /// changed.
    fn select_endpoint_probes(&mut self, out: &mut Output) {
        for c in std::mem::take(&mut self.endpoint_probe_clusters) {
            decrement(&mut self.cluster_uses, &c);
            out.touched_clusters.insert(c);
        }
        let mut problems = Vec::new();
        let selected: Vec<(String, Vec<String>)> = if self.token_ok {
            let probes: Vec<model::EndpointProbe> =
                self.endpoint_probes.values().cloned().collect();
            probe::select_endpoint_probes(&probes, &self.inputs(), &mut problems)
                .into_iter()
                .map(|p| (p.id.clone(), p.clusters.keys().cloned().collect()))
                .collect()
        } else {
            Vec::new()
        };
        self.problems.insert(key(ENDPOINT_PROBES, ""), problems);
        self.selected_endpoint_probes = selected.iter().map(|(id, _)| id.clone()).collect();
        for (_, clusters) in selected {
            for c in clusters {
                *self.cluster_uses.entry(c.clone()).or_default() += 1;
                out.touched_clusters.insert(c.clone());
                self.endpoint_probe_clusters.push(c);
            }
        }
    }

    /// CDS and EDS: a cluster is served while something served uses it.
    fn place_clusters(&mut self, names: &BTreeSet<String>, out: &mut Output) {
        let mut used = Vec::new();
        for name in names {
            self.problems.remove(&key(CLUSTER_KEY, name));
            match self.clusters.get(name) {
                Some(c) if self.cluster_uses.contains_key(name) => used.push(c),
                _ => {
                    out.removes.push((CLUSTER, name.clone()));
                    out.removes.push((ENDPOINT, name.clone()));
                }
            }
        }
        for built in build_clusters(&used) {
            if !built.problems.is_empty() {
                let name = &built.cds.name;
                self.problems.insert(
                    key(CLUSTER_KEY, name),
                    built
                        .problems
                        .into_iter()
                        .map(|e| Problem::new(format!("cluster/{name}"), e))
                        .collect(),
                );
            }
            out.puts.push(built.cds);
            out.puts.push(built.eds);
        }
    }

    /// SDS: a secret is served while a served TLS virtual host uses it.
    fn place_secrets(&mut self, names: &BTreeSet<String>, out: &mut Output) {
        for name in names {
            let used = self.secret_uses.contains_key(name);
            // A listener's default secret is used whether or not it can serve; only one
            // that can is sent (and only then does the listener name it).
            let servable = |s: &&model::TlsSecret| secret::validate(s).is_ok();
            match self.secrets.get(name).filter(|_| used).filter(servable) {
                Some(s) => out
                    .puts
                    .push(Resource::new(name.clone(), proto::pack(&secret::secret(s)))),
                None => out.removes.push((SECRET, name.clone())),
            }
        }
    }

    fn place_listeners(&mut self, out: &mut Output) {
        let tls_hosts_of = |listener: Option<&String>| -> Vec<listener::TlsHost<'_>> {
            self.tls_hosts
                .iter()
                .filter(|(_, t)| t.listener.as_ref() == listener)
                .map(|(name, t)| listener::TlsHost {
                    virtual_host: name,
                    hosts: &t.hosts,
                    secret: &t.secret,
                })
                .collect()
        };
        let probes: Vec<&model::EndpointProbe> = self
            .selected_endpoint_probes
            .iter()
            .filter_map(|id| self.endpoint_probes.get(id))
            .collect();
        let mut listeners = listener::listeners(&self.listeners, &tls_hosts_of(None), &probes);
        for (name, gateway) in &self.served_gateway_listeners {
            // Its default chain only with a secret that can serve.
            let default_secret = gateway.default_secret.as_deref().filter(|s| {
                self.secrets
                    .get(*s)
                    .is_some_and(|s| secret::validate(s).is_ok())
            });
            listeners.extend(listener::gateway_listeners(
                &self.listeners,
                gateway,
                &tls_hosts_of(Some(name)),
                default_secret,
            ));
        }
        let names: BTreeSet<&str> = listeners.iter().map(|l| l.name.as_str()).collect();
        for old in self
            .snapshot
            .resources(LISTENER)
            .into_iter()
            .flat_map(|rs| rs.keys())
        {
            if !names.contains(old.as_str()) {
                out.removes.push((LISTENER, old.clone()));
            }
        }
        for l in &listeners {
            out.puts.push(Resource::new(l.name.clone(), proto::pack(l)));
        }
    }

    /// Writes what changed into the snapshot; a route configuration is re-assembled from
    /// its encoded virtual hosts when any of them changed, and removed with its listener.
    fn finish(&mut self, mut out: Output) {
        let in_parts = self.listeners.virtual_host_discovery;
        for name in std::mem::take(&mut out.routes_changed) {
            if !self.serves_route_config(&name) {
                out.removes.push((ROUTE, vhds::parts_name(&name)));
                out.removes.push((ROUTE, name));
                continue;
            }
            let first = (name.clone(), String::new(), EntryKind::Probe);
            let entries = self
                .route_entries
                .range(first..)
                .take_while(|((rc, _, _), _)| *rc == name)
                .map(|(_, bytes)| bytes.as_slice());
            let body = route::route_configuration(&name, entries);
            if in_parts {
                let parts = vhds::parts_name(&name);
                out.puts.push(Resource::new(
                    parts.clone(),
                    route::parts_configuration(&parts),
                ));
            } else {
                out.removes.push((ROUTE, vhds::parts_name(&name)));
            }
            out.puts.push(Resource::new(name, body));
        }
        for key in std::mem::take(&mut out.entries_changed) {
            let (route_config, vhost, _) = &key;
            match self.route_entries.get(&key) {
                Some(bytes) if in_parts && self.serves_route_config(route_config) => out
                    .puts
                    .push(vhds::virtual_host(route_config, vhost, bytes)),
                _ => out
                    .removes
                    .push((VIRTUAL_HOST, vhds::virtual_host_name(route_config, vhost))),
            }
        }
        self.snapshot
            .update(out.removes, out.puts.into_iter().map(Arc::new));
    }

    fn serves_route_config(&self, name: &str) -> bool {
        name == ROUTE_CONFIG_NAME || self.served_gateway_listeners.contains_key(name)
    }
}

/// The order in which virtual hosts claim their hosts: a leaving one after every other,
/// then the oldest first (its route's creation; unknown counts as newest), then by name.
fn claim_order(a: &(&String, &Host), b: &(&String, &Host)) -> std::cmp::Ordering {
    let rank = |(name, host): &(&String, &Host)| {
        let m = &host.model;
        (m.leaving, m.created.is_none(), m.created, (*name).clone())
    };
    rank(a).cmp(&rank(b))
}

/// A cluster's CDS and EDS resources, and the endpoints left out of it.
struct BuiltCluster {
    cds: Resource,
    eds: Resource,
    problems: Vec<String>,
}

/// Clusters below this count are built on the calling thread: threads cost more than
/// they save on the few clusters of an incremental change.
const PARALLEL_CLUSTERS: usize = 512;

/// Builds clusters, on every core when there are many: in a full build, encoding clusters
/// and their endpoints is most of the work. The output keeps the input order.
fn build_clusters(clusters: &[&model::Cluster]) -> Vec<BuiltCluster> {
    // Asked only when it could matter: it reads the cgroup's CPU limit from files.
    if clusters.len() < 2 * PARALLEL_CLUSTERS {
        return clusters.iter().map(|c| build_cluster(c)).collect();
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(clusters.len() / PARALLEL_CLUSTERS)
        .max(1);
    if threads == 1 {
        return clusters.iter().map(|c| build_cluster(c)).collect();
    }
    let chunk = clusters.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let parts: Vec<_> = clusters
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || part.iter().map(|c| build_cluster(c)).collect::<Vec<_>>())
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|part| {
                part.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect::<Vec<BuiltCluster>>()
    })
}

fn build_cluster(c: &model::Cluster) -> BuiltCluster {
    let (cla, problems) = endpoint::encoded_load_assignment(c);
    BuiltCluster {
        cds: Resource::new(c.name.clone(), cluster::pack(cluster::cluster(c))),
        eds: Resource::new(
            c.name.clone(),
            proto::pack_bytes::<ClusterLoadAssignment>(cla),
        ),
        problems,
    }
}

/// The edits that turn `current` into `wanted`.
fn edits<'c, T: Clone + PartialEq + 'c>(
    current: impl IntoIterator<Item = (&'c String, &'c T)>,
    wanted: &BTreeMap<&str, &T>,
) -> Vec<Edit<T>> {
    let current: HashMap<&str, &T> = current.into_iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut edits: Vec<Edit<T>> = wanted
        .iter()
        .filter(|(name, item)| current.get(*name) != Some(*item))
        .map(|(_, item)| Edit::Put((*item).clone()))
        .collect();
    edits.extend(
        current
            .keys()
            .filter(|name| !wanted.contains_key(*name))
            .map(|name| Edit::Remove((*name).to_owned())),
    );
    edits
}

fn remove_from(index: &mut HashMap<String, BTreeSet<String>>, key: &str, name: &str) {
    if let Some(names) = index.get_mut(key) {
        names.remove(name);
        if names.is_empty() {
            index.remove(key);
        }
    }
}

fn decrement(counts: &mut HashMap<String, usize>, key: &str) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}
