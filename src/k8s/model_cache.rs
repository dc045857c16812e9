//! What the last model was built from, so that a change to a few objects becomes a
//! change to the translator's inputs ([`Translator::apply`]) instead of a new model from
//! every object. The watchers say which objects changed ([`Touched`]); a step looks at
//! those alone. At 10k routes that is the difference between well under a millisecond and
//! two hundred for each change.
//!
//! - an EndpointSlice changes: the clusters of its Service get new endpoints;
//! - a ProxyConfig is added, changed or removed: its virtual host and probes are put or
//!   removed, and its clusters, TLS Secrets and Gateway listener come and go with the last
//!   ProxyConfig using them.
//!
//! Whatever else changes (a TLS Secret's content, listener settings), or an ambiguity the
//! translator itself must resolve (two ProxyConfigs claiming one name), takes a full build
//! from every object, as does the first step.
//!
//! The translator (`core/src/translate/translator`) keeps the inputs these changes edit,
//! the clusters with their endpoints among them: a step reads a cluster there
//! ([`Clusters`]) to give it new endpoints, and keeps none of its own. Each xDS session
//! (`core/src/xds/session`) keeps what its Envoy acknowledged of the snapshots the
//! translator makes.
//!
//! A full build takes ProxyConfigs and slices in key order, so that an incremental step
//! (which keeps what it holds by key) ends exactly where a full build of the same objects
//! does: same endpoint order, same problems in the same order.
//!
//! [`Translator::apply`]: crate::translate::Translator::apply

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use xxhash_rust::xxh3::Xxh3DefaultBuilder;

use super::to_model::{self, Contribution, EndpointsKey, Inputs, TlsData};
use crate::api::ProxyConfig;
use crate::model::{self, ListenerSettings};
use crate::translate::{Changes, Edit, Problem};

/// What to hand the translator.
#[derive(Debug)]
pub enum Step {
    /// A new model from scratch: `Translator::update`.
    Full(model::Config),
    /// What changed: `Translator::apply`.
    Changes(Changes),
}

#[derive(Default)]
pub struct ModelCache {
    last: Option<Last>,
}

/// (namespace, name): how an object is known from one step to the next.
pub type ObjectKey = (String, String);

pub fn key_of<K: ResourceExt>(object: &K) -> ObjectKey {
    (object.namespace().unwrap_or_default(), object.name_any())
}

/// The objects added, changed or deleted since the last step, as the watchers saw them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Touched {
    pub proxy_configs: BTreeSet<ObjectKey>,
    pub endpoint_slices: BTreeSet<ObjectKey>,
}

/// The objects as they are now, by key: the watchers' stores.
pub trait Objects {
    fn proxy_config(&self, key: &ObjectKey) -> Option<Arc<ProxyConfig>>;
    fn endpoint_slice(&self, key: &ObjectKey) -> Option<Arc<EndpointSlice>>;
}

/// Objects held in maps (tests, benchmarks).
#[derive(Clone, Debug, Default)]
pub struct ObjectMaps {
    pub proxy_configs: HashMap<ObjectKey, Arc<ProxyConfig>>,
    pub endpoint_slices: HashMap<ObjectKey, Arc<EndpointSlice>>,
}

impl ObjectMaps {
    pub fn new(proxy_configs: &[&ProxyConfig], endpoint_slices: &[&EndpointSlice]) -> Self {
        Self {
            proxy_configs: proxy_configs
                .iter()
                .map(|pc| (key_of(*pc), Arc::new((*pc).clone())))
                .collect(),
            endpoint_slices: endpoint_slices
                .iter()
                .map(|s| (key_of(*s), Arc::new((*s).clone())))
                .collect(),
        }
    }
}

impl Objects for ObjectMaps {
    fn proxy_config(&self, key: &ObjectKey) -> Option<Arc<ProxyConfig>> {
        self.proxy_configs.get(key).cloned()
    }

    fn endpoint_slice(&self, key: &ObjectKey) -> Option<Arc<EndpointSlice>> {
        self.endpoint_slices.get(key).cloned()
    }
}

/// The clusters the translator holds, by name: what the last steps gave it.
pub type Clusters<'a> = &'a dyn Fn(&str) -> Option<&'a model::Cluster>;

/// What every object shares: a change to any of it takes a full build.
pub struct Settings<'a> {
    pub listeners: &'a ListenerSettings,
    pub secrets: &'a BTreeMap<(String, String), TlsData>,
}

/// (namespace, Service name).
type Service = (String, String);
/// Looked up once per touched object: a fast hash (keys come from the API server).
type ByKey<V> = HashMap<ObjectKey, V, Xxh3DefaultBuilder>;

struct Last {
    listeners: ListenerSettings,
    secrets: BTreeMap<(String, String), TlsData>,
    /// resourceVersion (None: never equal) and the names of what the ProxyConfig added.
    proxy_configs: ByKey<(Option<String>, Held)>,
    /// The ProxyConfigs' problems (those with any), handed out in key order as a full
    /// build lists them.
    pc_problems: BTreeMap<ObjectKey, Vec<Problem>>,
    /// resourceVersion (None: never equal) and the Service the slice lists.
    slices: ByKey<(Option<String>, Option<Service>)>,
    /// Each Service's slices, to gather its endpoints without looking at the others.
    service_slices: BTreeMap<Service, BTreeSet<ObjectKey>>,
    endpoint_sources: BTreeMap<String, EndpointsKey>,
    /// Each Service's clusters (from `endpoint_sources`).
    service_clusters: BTreeMap<Service, BTreeSet<String>>,
    /// Cluster name → how many ProxyConfigs use it.
    cluster_users: BTreeMap<String, usize>,
    /// TLS Secret → how many ProxyConfigs use it (none: not there).
    secret_users: BTreeMap<(String, String), usize>,
    /// Virtual host names and probe ids → the ProxyConfig that has it.
    owners: HashMap<Claim, ObjectKey>,
    /// Problems with TLS Secrets in use (a change to the Secrets themselves rebuilds).
    secret_problems: Vec<Problem>,
    /// Two ProxyConfigs claimed one name: leave it to a full build every time.
    ambiguous: bool,
    /// The Gateway listeners the translator was last given.
    gateway_listeners: Vec<model::GatewayListener>,
}

/// What is kept of a ProxyConfig's contribution once the translator has it: the names it
/// uses and claims, and its Gateway listener, to take them back when it changes or goes.
/// The routes and clusters themselves are the translator's to keep; a copy here took
/// ≈ 2.8 KiB a route at 10k.
#[derive(Debug)]
struct Held {
    /// Its clusters' names, each once.
    clusters: BTreeSet<String>,
    claims: Vec<Claim>,
    secrets: BTreeSet<(String, String)>,
    /// Its Gateway listener, and whether it defines it ([`to_model::listener_of`]).
    listener: Option<(model::GatewayListener, bool)>,
}

impl Held {
    fn of(part: &Contribution) -> Self {
        Self {
            clusters: part.clusters.iter().map(|(n, _, _)| n.clone()).collect(),
            claims: claims(part).collect(),
            secrets: to_model::secrets_of(part).into_iter().cloned().collect(),
            listener: to_model::listener_of(part).map(|(l, defines)| (l.clone(), defines)),
        }
    }

    fn listener(&self) -> Option<(&model::GatewayListener, bool)> {
        self.listener.as_ref().map(|(l, defines)| (l, *defines))
    }
}

fn version<K: ResourceExt>(object: &K) -> Option<&str> {
    object.meta().resource_version.as_deref()
}

/// True when `held` is the resourceVersion `now` has: nothing to look at.
fn same_version<K: ResourceExt>(now: Option<&Arc<K>>, held: Option<&Option<String>>) -> bool {
    match (now, held) {
        (None, None) => true,
        (Some(object), Some(Some(v))) => version(object.as_ref()) == Some(v.as_str()),
        _ => false,
    }
}

fn service_of_key(key: &EndpointsKey) -> Service {
    (key.0.clone(), key.1.clone())
}

/// A name that one ProxyConfig alone may have.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Claim {
    VirtualHost(String),
    VersionProbe(String),
    EndpointProbe(String),
}

/// The names a contribution claims.
fn claims(part: &Contribution) -> impl Iterator<Item = Claim> + '_ {
    let host = part
        .virtual_host
        .iter()
        .map(|v| Claim::VirtualHost(v.name.clone()));
    let version = part
        .version_probe
        .iter()
        .map(|p| Claim::VersionProbe(p.id.clone()));
    let endpoint = part
        .endpoint_probe
        .iter()
        .map(|p| Claim::EndpointProbe(p.id.clone()));
    host.chain(version).chain(endpoint)
}

/// A ProxyConfig as it is now (None: gone).
struct PcChange {
    key: ObjectKey,
    now: Option<(Option<String>, Contribution, Held)>,
}

impl ModelCache {
    /// A whole new model from every object (in key order, see the module docs), and what
    /// was left out of it (with why). Remembers what it was made of.
    pub fn full(&mut self, inputs: &Inputs<'_>) -> (Step, Vec<Problem>) {
        let proxy_configs = to_model::in_key_order(&inputs.proxy_configs);
        let parts: Vec<Contribution> = proxy_configs
            .iter()
            .map(|pc| to_model::contribution(pc))
            .collect();
        let built = to_model::build_from(inputs, &parts);
        self.last = Some(Last::of(
            inputs,
            &proxy_configs,
            parts,
            built.endpoint_sources,
            &built.config.gateway_listeners,
            &built.problems,
        ));
        (Step::Full(built.config), built.problems)
    }

    /// The change that the `touched` objects make, looked up in `objects` (and the
    /// translator's `clusters`, which the last step was applied to), and what is left out
    /// of the model; None when only a full build can tell (the first step, other
    /// settings, a Secret's content, a name claimed twice).
    pub fn step(
        &mut self,
        settings: &Settings<'_>,
        touched: &Touched,
        (objects, clusters): (&dyn Objects, Clusters<'_>),
    ) -> Option<(Step, Vec<Problem>)> {
        let last = self.last.as_mut().filter(|last| {
            !last.ambiguous
                && &last.listeners == settings.listeners
                && &last.secrets == settings.secrets
        })?;
        let step = last.changes(touched, objects, clusters);
        if step.is_none() {
            // Partly applied: only a full build may follow.
            self.last = None;
        }
        step
    }
}

impl Last {
    fn of(
        inputs: &Inputs<'_>,
        proxy_configs: &[&ProxyConfig],
        parts: Vec<Contribution>,
        endpoint_sources: BTreeMap<String, EndpointsKey>,
        gateway_listeners: &[model::GatewayListener],
        problems: &[Problem],
    ) -> Self {
        let mut last = Last {
            listeners: inputs.listeners.clone(),
            secrets: inputs.secrets.clone(),
            proxy_configs: ByKey::default(),
            pc_problems: BTreeMap::new(),
            slices: ByKey::default(),
            service_slices: BTreeMap::new(),
            endpoint_sources: BTreeMap::new(),
            service_clusters: BTreeMap::new(),
            cluster_users: BTreeMap::new(),
            secret_users: BTreeMap::new(),
            owners: HashMap::new(),
            secret_problems: Vec::new(),
            ambiguous: false,
            gateway_listeners: gateway_listeners.to_vec(),
        };
        for slice in &inputs.endpoint_slices {
            let key = key_of(*slice);
            let service = to_model::service_of(slice);
            last.index_slice(&key, service.as_ref());
            let state = (version(*slice).map(str::to_owned), service);
            if last.slices.insert(key, state).is_some() {
                last.ambiguous = true;
            }
        }
        for (name, source) in endpoint_sources {
            last.set_source(name, source);
        }
        let mut pc_problems = 0;
        for (pc, part) in proxy_configs.iter().zip(parts) {
            pc_problems += part.problems.len();
            let key = key_of(*pc);
            let held = Held::of(&part);
            last.add(&key, &held, &part.problems);
            let state = (version(*pc).map(str::to_owned), held);
            if last.proxy_configs.insert(key, state).is_some() {
                last.ambiguous = true;
            }
        }
        // The full build lists the ProxyConfigs' problems first, then the Secrets'.
        last.secret_problems = problems.iter().skip(pc_problems).cloned().collect();
        last
    }

    fn index_slice(&mut self, key: &ObjectKey, service: Option<&Service>) {
        if let Some(service) = service {
            let slices = self.service_slices.entry(service.clone()).or_default();
            slices.insert(key.clone());
        }
    }

    fn unindex_slice(&mut self, key: &ObjectKey, service: Option<&Service>) {
        if let Some(service) = service
            && let Some(slices) = self.service_slices.get_mut(service)
        {
            slices.remove(key);
            if slices.is_empty() {
                self.service_slices.remove(service);
            }
        }
    }

    fn set_source(&mut self, cluster: String, source: EndpointsKey) {
        let service = service_of_key(&source);
        let names = self.service_clusters.entry(service).or_default();
        names.insert(cluster.clone());
        self.endpoint_sources.insert(cluster, source);
    }

    fn remove_source(&mut self, cluster: &str) {
        let Some(source) = self.endpoint_sources.remove(cluster) else {
            return;
        };
        let service = service_of_key(&source);
        if let Some(names) = self.service_clusters.get_mut(&service) {
            names.remove(cluster);
            if names.is_empty() {
                self.service_clusters.remove(&service);
            }
        }
    }

    /// Remembers how many users `part`'s clusters had before this step touched them.
    fn note_users(&self, part: &Held, users_before: &mut BTreeMap<String, usize>) {
        for name in &part.clusters {
            if !users_before.contains_key(name) {
                let users = self.cluster_users.get(name).copied().unwrap_or(0);
                users_before.insert(name.clone(), users);
            }
        }
    }

    /// Counts what `part` uses and claims; a claim already held makes this ambiguous.
    fn add(&mut self, key: &ObjectKey, part: &Held, problems: &[Problem]) {
        for name in &part.clusters {
            *self.cluster_users.entry(name.clone()).or_default() += 1;
        }
        for secret in &part.secrets {
            *self.secret_users.entry(secret.clone()).or_default() += 1;
        }
        for claim in &part.claims {
            if self.owners.insert(claim.clone(), key.clone()).is_some() {
                self.ambiguous = true;
            }
        }
        if !problems.is_empty() {
            self.pc_problems.insert(key.clone(), problems.to_vec());
        }
    }

    fn secret_in_use(&self, secret: &(String, String)) -> bool {
        self.secret_users.get(secret).is_some_and(|n| *n > 0)
    }

    /// The Secrets that gained their first user or lost their last, as edits (one the
    /// watch does not hold has nothing to edit: its problem says so), and the Secrets'
    /// problems made again, in key order as a full build lists them.
    fn secret_edits(
        &mut self,
        used_before: &BTreeMap<(String, String), bool>,
    ) -> Vec<Edit<model::TlsSecret>> {
        let mut edits = Vec::new();
        for (key, was_used) in used_before {
            match (was_used, self.secret_in_use(key), self.secrets.get(key)) {
                (false, true, Some(data)) => {
                    edits.extend(to_model::tls_secret(key, Some(data)).ok().map(Edit::Put));
                }
                (true, false, Some(_)) => {
                    edits.push(Edit::Remove(to_model::secret_name(&key.0, &key.1)))
                }
                _ => {}
            }
        }
        self.secret_problems = (self.secret_users.keys())
            .filter_map(|key| to_model::tls_secret(key, self.secrets.get(key)).err())
            .collect();
        edits
    }

    fn retract(&mut self, key: &ObjectKey, part: &Held) {
        for name in &part.clusters {
            if let Some(users) = self.cluster_users.get_mut(name) {
                *users = users.saturating_sub(1);
            }
        }
        for secret in &part.secrets {
            if let Some(users) = self.secret_users.get_mut(secret) {
                *users = users.saturating_sub(1);
                if *users == 0 {
                    self.secret_users.remove(secret);
                }
            }
        }
        for claim in &part.claims {
            self.owners.remove(claim);
        }
        self.pc_problems.remove(key);
    }

    /// The endpoints of `services`, from their own slices only (in key order, as a full
    /// build takes them).
    fn endpoints_of(
        &self,
        services: &[Service],
        objects: &dyn Objects,
    ) -> BTreeMap<EndpointsKey, Vec<model::Endpoint>> {
        let slices: Vec<Arc<EndpointSlice>> = services
            .iter()
            .filter_map(|service| self.service_slices.get(service))
            .flatten()
            .filter_map(|key| objects.endpoint_slice(key))
            .collect();
        let slices: Vec<&EndpointSlice> = slices.iter().map(Arc::as_ref).collect();
        to_model::endpoints_by_service(&slices)
    }

    /// The changes the touched objects make, or None when only a full build can say.
    fn changes(
        &mut self,
        touched: &Touched,
        objects: &dyn Objects,
        clusters: Clusters<'_>,
    ) -> Option<(Step, Vec<Problem>)> {
        let pc_changes = self.changed_proxy_configs(touched, objects);
        // TLS Secrets the changed ProxyConfigs used or use, and whether they were in use.
        let secrets_used_before: BTreeMap<(String, String), bool> = (pc_changes.iter())
            .flat_map(|c| {
                let before = self.proxy_configs.get(&c.key).map(|(_, p)| p);
                let now = c.now.as_ref().map(|(_, _, p)| p);
                before.into_iter().chain(now).flat_map(|p| &p.secrets)
            })
            .map(|key| (key.clone(), self.secret_in_use(key)))
            .collect();
        // The Gateway listeners are handed to the translator whole: when a ProxyConfig
        // brings, drops or changes one, the list is made again from every ProxyConfig
        // (a walk of what is held, where a full build would translate everything: each
        // of thousands of HTTPRoutes on one Gateway brings the listener its virtual
        // host is served on when it first goes live).
        let touches_listeners = pc_changes.iter().any(|c| {
            let before = self
                .proxy_configs
                .get(&c.key)
                .and_then(|(_, p)| p.listener());
            let now = c.now.as_ref().and_then(|(_, _, p)| p.listener());
            before != now
        });
        let mut cluster_edits: BTreeMap<String, Edit<model::Cluster>> = self
            .refresh_endpoints(touched, objects, clusters)
            .into_iter()
            .map(|c| (c.name.clone(), Edit::Put(c)))
            .collect();
        let mut changes = Changes::default();
        if !pc_changes.is_empty() {
            // Users of each cluster the changed ProxyConfigs name, before the change.
            let mut users_before: BTreeMap<String, usize> = BTreeMap::new();
            let mut befores = Vec::new();
            for change in &pc_changes {
                if let Some((_, before)) = self.proxy_configs.remove(&change.key) {
                    self.note_users(&before, &mut users_before);
                    self.retract(&change.key, &before);
                    befores.push(before);
                }
            }
            let mut nows = Vec::new();
            for change in pc_changes {
                if let Some((version, now, held)) = change.now {
                    self.note_users(&held, &mut users_before);
                    self.add(&change.key, &held, &now.problems);
                    if self.ambiguous {
                        return None;
                    }
                    nows.push(now);
                    self.proxy_configs.insert(change.key, (version, held));
                }
            }
            // Removals first: a name one ProxyConfig gave up, another may have taken.
            for claim in befores.iter().flat_map(|b| &b.claims) {
                match claim.clone() {
                    Claim::VirtualHost(name) => changes.virtual_hosts.push(Edit::Remove(name)),
                    Claim::VersionProbe(id) => changes.version_probes.push(Edit::Remove(id)),
                    Claim::EndpointProbe(id) => changes.endpoint_probes.push(Edit::Remove(id)),
                }
            }
            for now in &nows {
                let host = now.virtual_host.clone();
                changes.virtual_hosts.extend(host.map(Edit::Put));
                changes
                    .version_probes
                    .extend(now.version_probe.clone().map(Edit::Put));
                changes
                    .endpoint_probes
                    .extend(now.endpoint_probe.clone().map(Edit::Put));
            }
            let edits = &mut cluster_edits;
            self.cluster_edits((objects, clusters), &users_before, &nows, edits)?;
        }
        changes.clusters = cluster_edits.into_values().collect();
        if !secrets_used_before.is_empty() {
            changes.secrets = self.secret_edits(&secrets_used_before);
        }
        if touches_listeners {
            let listeners = to_model::gateway_listeners(
                (self.proxy_configs.values()).filter_map(|(_, p)| p.listener()),
            );
            if listeners != self.gateway_listeners {
                changes.gateway_listeners = Some(listeners.clone());
                self.gateway_listeners = listeners;
            }
        }
        let problems = self
            .pc_problems
            .values()
            .flatten()
            .chain(&self.secret_problems)
            .cloned()
            .collect();
        Some((Step::Changes(changes), problems))
    }

    /// The touched ProxyConfigs that were added, changed or are gone.
    fn changed_proxy_configs(&self, touched: &Touched, objects: &dyn Objects) -> Vec<PcChange> {
        let mut changes = Vec::new();
        for key in &touched.proxy_configs {
            let now = objects.proxy_config(key);
            let held = self.proxy_configs.get(key).map(|(v, _)| v);
            if same_version(now.as_ref(), held) {
                continue;
            }
            let now = now.map(|pc| {
                let version = version(pc.as_ref()).map(str::to_owned);
                let part = to_model::contribution(&pc);
                let held = Held::of(&part);
                (version, part, held)
            });
            changes.push(PcChange {
                key: key.clone(),
                now,
            });
        }
        changes
    }

    /// Clusters that gained their first user or lost their last, as edits; None when a
    /// new user describes a cluster differently from the one in place (a full build
    /// decides which wins). `users_before` holds every cluster this step touched.
    fn cluster_edits(
        &mut self,
        (objects, clusters): (&dyn Objects, Clusters<'_>),
        users_before: &BTreeMap<String, usize>,
        nows: &[Contribution],
        edits: &mut BTreeMap<String, Edit<model::Cluster>>,
    ) -> Option<()> {
        let used =
            |users: &BTreeMap<String, usize>, name: &str| users.get(name).is_some_and(|n| *n > 0);
        let gone: Vec<String> = users_before
            .keys()
            .filter(|name| !used(&self.cluster_users, name))
            .cloned()
            .collect();
        for name in gone {
            self.cluster_users.remove(&name);
            self.remove_source(&name);
            edits.insert(name.clone(), Edit::Remove(name));
        }
        let mut fresh: BTreeMap<String, (String, to_model::ResolvedCluster)> = BTreeMap::new();
        for (name, namespace, cluster) in nows.iter().flat_map(|p| &p.clusters) {
            if used(users_before, name) {
                let same = self.endpoint_sources.get(name)
                    == Some(&to_model::endpoints_key(namespace, cluster))
                    && clusters(name).is_some_and(|c| {
                        let probe =
                            to_model::model_cluster(name.clone(), namespace, cluster, vec![]);
                        c.service == probe.service && c.settings == probe.settings
                    });
                if !same {
                    return None;
                }
            } else {
                fresh.insert(name.clone(), (namespace.clone(), cluster.clone()));
            }
        }
        if fresh.is_empty() {
            return Some(());
        }
        let services: Vec<Service> = fresh
            .values()
            .map(|(namespace, c)| (namespace.clone(), c.service.clone()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let endpoints = self.endpoints_of(&services, objects);
        for (name, (namespace, cluster)) in fresh {
            let key = to_model::endpoints_key(&namespace, &cluster);
            let list = endpoints.get(&key).cloned().unwrap_or_default();
            let model = to_model::model_cluster(name.clone(), &namespace, &cluster, list);
            self.set_source(name.clone(), key);
            edits.insert(name, Edit::Put(model));
        }
        Some(())
    }

    /// Takes in the touched slices and recomputes the endpoints of their Services (before
    /// and after a relabel); returns the clusters whose endpoints are now different.
    fn refresh_endpoints(
        &mut self,
        touched: &Touched,
        objects: &dyn Objects,
        clusters: Clusters<'_>,
    ) -> Vec<model::Cluster> {
        // Usually one or two: a plain list.
        let mut services: Vec<Service> = Vec::new();
        let mut touch = |service: Option<Service>| {
            if let Some(service) = service
                && !services.contains(&service)
            {
                services.push(service);
            }
        };
        for key in &touched.endpoint_slices {
            let now = objects.endpoint_slice(key);
            let held = self.slices.get(key).map(|(v, _)| v);
            if same_version(now.as_ref(), held) {
                continue;
            }
            if let Some((_, before)) = self.slices.remove(key) {
                self.unindex_slice(key, before.as_ref());
                touch(before);
            }
            if let Some(slice) = now {
                let service = to_model::service_of(&slice);
                self.index_slice(key, service.as_ref());
                let state = (version(slice.as_ref()).map(str::to_owned), service.clone());
                self.slices.insert(key.clone(), state);
                touch(service);
            }
        }
        if services.is_empty() {
            return Vec::new();
        }
        let endpoints = self.endpoints_of(&services, objects);
        let names: Vec<String> = services
            .iter()
            .filter_map(|service| self.service_clusters.get(service))
            .flatten()
            .cloned()
            .collect();
        let mut changed = Vec::new();
        for name in names {
            let (Some(key), Some(cluster)) = (self.endpoint_sources.get(&name), clusters(&name))
            else {
                continue;
            };
            let now = endpoints.get(key).cloned().unwrap_or_default();
            if cluster.endpoints != now {
                changed.push(model::Cluster {
                    name: cluster.name.clone(),
                    service: cluster.service.clone(),
                    settings: cluster.settings.clone(),
                    endpoints: now,
                });
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests;
