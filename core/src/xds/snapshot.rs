//! The desired xDS state: every resource the fleet should have, keyed by type and name,
//! each with a content-hash version. The xDS server's only input; it knows nothing of
//! where the resources came from.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::google::protobuf::Any;

use crate::hash;

pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
/// Virtual hosts served one by one (VHDS), to delta Envoys only: see [`crate::xds::vhds`].
pub const VIRTUAL_HOST: &str = "type.googleapis.com/envoy.config.route.v3.VirtualHost";

/// A type this server serves. Envoy may ask for others: those stay type URLs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResourceType {
    Cluster,
    Endpoint,
    Secret,
    Listener,
    Route,
    VirtualHost,
}

impl ResourceType {
    /// Every type served, in the order a make-before-break push sends them.
    pub const ALL: [ResourceType; 6] = [
        ResourceType::Cluster,
        ResourceType::Endpoint,
        ResourceType::Secret,
        ResourceType::Listener,
        ResourceType::Route,
        ResourceType::VirtualHost,
    ];

    pub const fn type_url(self) -> &'static str {
        match self {
            ResourceType::Cluster => CLUSTER,
            ResourceType::Endpoint => ENDPOINT,
            ResourceType::Secret => SECRET,
            ResourceType::Listener => LISTENER,
            ResourceType::Route => ROUTE,
            ResourceType::VirtualHost => VIRTUAL_HOST,
        }
    }

    /// None for a type this server does not serve.
    pub fn from_type_url(type_url: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.type_url() == type_url)
    }

    /// Other resources refer to these by name: they must be in place before the
    /// referrers (I1) and leave only after them (I2).
    pub const fn is_referenced(self) -> bool {
        matches!(
            self,
            ResourceType::Cluster | ResourceType::Endpoint | ResourceType::Secret
        )
    }

    /// Every snapshot has this type, empty or not; virtual hosts only when the route
    /// configurations are served in parts.
    pub const fn is_always_present(self) -> bool {
        !matches!(self, ResourceType::VirtualHost)
    }

    /// Envoy asks for all of these rather than by name.
    pub const fn is_wildcard(self) -> bool {
        matches!(self, ResourceType::Cluster | ResourceType::Listener)
    }
}

/// Short name of a type URL for logs and metrics ("Cluster", "Listener", ...).
pub fn short_type(type_url: &str) -> &str {
    type_url.rsplit('.').next().unwrap_or(type_url)
}

/// A type Envoy asks for all of rather than by name (see [`ResourceType::is_wildcard`]).
pub fn is_wildcard_type(type_url: &str) -> bool {
    ResourceType::from_type_url(type_url).is_some_and(ResourceType::is_wildcard)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    pub name: String,
    /// Content hash of `body`.
    pub version: String,
    pub body: Any,
}

impl Resource {
    pub fn new(name: impl Into<String>, body: Any) -> Self {
        let version = hash::resource_version(&body.value);
        Self {
            name: name.into(),
            version,
            body,
        }
    }

    /// A resource a node says it holds, known only by name and version (a reconnecting
    /// delta client's initial versions): it has no content and is never sent.
    pub fn held(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            body: Any::default(),
        }
    }

    /// False for a [`Resource::held`] one. Every served resource has a type URL.
    pub fn has_content(&self) -> bool {
        !self.body.type_url.is_empty()
    }
}

/// Resources of one type, by name. A persistent map: a snapshot built from the previous
/// one shares every unchanged resource and tree node with it, so a change costs what it
/// touches, not the size of the snapshot.
pub type Resources = imbl::OrdMap<String, Arc<Resource>>;

/// The desired state. Cheap to clone; `insert` and `remove` cost O(log n).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    types: BTreeMap<String, Resources>,
    /// Per type, the wrapping sum of [`entry_hash`] over its resources: order-free, so
    /// it is kept up to date in O(1) per change.
    sums: BTreeMap<String, u128>,
    version: String,
}

/// Two snapshots are equal when they hold the same resources (versions follow from them).
impl PartialEq for Snapshot {
    fn eq(&self, other: &Self) -> bool {
        self.types == other.types
    }
}

impl Snapshot {
    /// Builds a snapshot; later duplicates of a (type, name) replace earlier ones.
    pub fn new(resources: impl IntoIterator<Item = Resource>) -> Self {
        let mut snapshot = Self {
            types: ResourceType::ALL
                .iter()
                .filter(|t| t.is_always_present())
                .map(|t| (t.type_url().to_string(), Resources::new()))
                .collect(),
            ..Self::default()
        };
        for resource in resources {
            snapshot.put(Arc::new(resource));
        }
        snapshot.refresh_version();
        snapshot
    }

    /// Adds or replaces one resource.
    pub fn insert(&mut self, resource: Arc<Resource>) {
        self.put(resource);
        self.refresh_version();
    }

    /// Removes, then adds or replaces, several resources; one version update for all.
    pub fn update(
        &mut self,
        removes: impl IntoIterator<Item = (&'static str, String)>,
        puts: impl IntoIterator<Item = Arc<Resource>>,
    ) {
        for (type_url, name) in removes {
            self.take(type_url, &name);
        }
        for resource in puts {
            self.put(resource);
        }
        self.refresh_version();
    }

    fn take(&mut self, type_url: &str, name: &str) -> bool {
        let Some(old) = self.types.get_mut(type_url).and_then(|rs| rs.remove(name)) else {
            return false;
        };
        let sum = self.sums.entry(type_url.to_owned()).or_default();
        *sum = sum.wrapping_sub(entry_hash(&old));
        // A type only some snapshots have is gone with its last resource, as if it had
        // never been: the version is the same as a snapshot built without it.
        let optional =
            ResourceType::from_type_url(type_url).is_some_and(|t| !t.is_always_present());
        if optional && self.types.get(type_url).is_some_and(Resources::is_empty) {
            self.types.remove(type_url);
            self.sums.remove(type_url);
        }
        true
    }

    fn put(&mut self, resource: Arc<Resource>) {
        let type_url = resource.body.type_url.clone();
        let added = entry_hash(&resource);
        let old = self
            .types
            .entry(type_url.clone())
            .or_default()
            .insert(resource.name.clone(), resource);
        let sum = self.sums.entry(type_url).or_default();
        *sum = sum.wrapping_add(added);
        if let Some(old) = old {
            *sum = sum.wrapping_sub(entry_hash(&old));
        }
    }

    fn refresh_version(&mut self) {
        self.version = hash::digest_of_versions(
            self.types
                .keys()
                .map(|type_url| (type_url.as_str(), self.type_version(type_url))),
        );
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn resources(&self, type_url: &str) -> Option<&Resources> {
        self.types.get(type_url)
    }

    pub fn types(&self) -> impl Iterator<Item = (&str, &Resources)> {
        self.types.iter().map(|(t, r)| (t.as_str(), r))
    }

    /// Version of one type: a digest of its names and versions.
    pub fn type_version(&self, type_url: &str) -> String {
        format_version(self.sums.get(type_url).copied().unwrap_or(0))
    }

    /// Version of `resources`, a set of this type's resources, as [`version_of`] computes
    /// it: from the type's version and what `resources` adds, changes or lacks, so O(1)
    /// when they are all of the type (the maps are shared) and the cost of the difference
    /// when they share most of it (a node's view between two steps, or all a node asks
    /// for less a few names): every delta response of every node asks this.
    pub fn version_of(&self, type_url: &str, resources: &Resources) -> String {
        let Some(all) = self.types.get(type_url) else {
            return version_of(resources);
        };
        if all.ptr_eq(resources) {
            return self.type_version(type_url);
        }
        let mut sum = self.sums.get(type_url).copied().unwrap_or(0);
        // Sets that share little (a first answer built apart from the snapshot's map) are
        // hashed whole: the diff would hash most entries of both.
        let most = resources.len() / 2 + 1;
        for (seen, item) in all.diff(resources).enumerate() {
            if seen > most {
                return version_of(resources);
            }
            sum = moved_by(sum, &item, true);
        }
        format_version(sum)
    }

    pub fn len(&self) -> usize {
        self.types.values().map(Resources::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Version of a set of resources of one type, as [`Snapshot::type_version`] computes it.
pub fn version_of(resources: &Resources) -> String {
    format_version(
        resources
            .values()
            .fold(0u128, |sum, r| sum.wrapping_add(entry_hash(r))),
    )
}

/// Version of `a` and `b` together, `b`'s entry where both have a name (what a make step
/// holds between two sets), from `a`'s version and what `b` adds or changes: no pass over
/// what they share. None if `a_version` is not a version.
pub fn union_version(a: &Resources, a_version: &str, b: &Resources) -> Option<String> {
    let mut sum = u128::from_str_radix(a_version, 16).ok()?;
    for item in a.diff(b) {
        sum = moved_by(sum, &item, false);
    }
    Some(format_version(sum))
}

/// A sum of [`entry_hash`]es over the first map of a diff, moved by one item of the diff
/// towards the second map; a name only the first map has is taken out if `removes`.
fn moved_by(
    sum: u128,
    item: &imbl::ordmap::DiffItem<'_, '_, String, Arc<Resource>>,
    removes: bool,
) -> u128 {
    match item {
        imbl::ordmap::DiffItem::Add(_, added) => sum.wrapping_add(entry_hash(added)),
        imbl::ordmap::DiffItem::Update { old, new } => sum
            .wrapping_add(entry_hash(new.1))
            .wrapping_sub(entry_hash(old.1)),
        imbl::ordmap::DiffItem::Remove(_, removed) if removes => {
            sum.wrapping_sub(entry_hash(removed))
        }
        imbl::ordmap::DiffItem::Remove(..) => sum,
    }
}

fn format_version(sum: u128) -> String {
    format!("{sum:032x}")
}

/// Hash of one resource's name and version, for its type's version.
fn entry_hash(resource: &Resource) -> u128 {
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    hasher.update(resource.name.as_bytes());
    hasher.update(&[0]);
    hasher.update(resource.version.as_bytes());
    hasher.digest128()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(name: &str, content: &str) -> Resource {
        Resource::new(
            name,
            Any {
                type_url: CLUSTER.to_string(),
                value: content.as_bytes().to_vec(),
            },
        )
    }

    #[test]
    fn a_resource_type_is_known_by_its_type_url_and_others_are_not() {
        for t in ResourceType::ALL {
            assert_eq!(ResourceType::from_type_url(t.type_url()), Some(t));
        }
        let ecds = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
        assert_eq!(ResourceType::from_type_url(ecds), None);
        assert!(!is_wildcard_type(ecds));
        assert_eq!(
            ResourceType::ALL.map(ResourceType::type_url),
            [CLUSTER, ENDPOINT, SECRET, LISTENER, ROUTE, VIRTUAL_HOST],
            "make-before-break order"
        );
    }

    #[test]
    fn a_set_of_resources_has_one_version_whether_shared_copied_or_changed() {
        let snapshot = Snapshot::new([resource("a", "1"), resource("b", "2")]);
        let all = snapshot.resources(CLUSTER).expect("clusters").clone();
        let copy: Resources = all.iter().map(|(n, r)| (n.clone(), r.clone())).collect();
        assert!(!copy.ptr_eq(&all));
        let version = snapshot.type_version(CLUSTER);
        assert_eq!(snapshot.version_of(CLUSTER, &all), version);
        assert_eq!(snapshot.version_of(CLUSTER, &copy), version);
        let mut fewer = copy.clone();
        fewer.remove("b");
        assert_ne!(snapshot.version_of(CLUSTER, &fewer), version);
        assert_eq!(snapshot.version_of(CLUSTER, &fewer), version_of(&fewer));
        let mut other = all.clone();
        other.remove("a");
        other.insert("b".into(), Arc::new(resource("b", "3")));
        other.insert("c".into(), Arc::new(resource("c", "4")));
        assert_eq!(snapshot.version_of(CLUSTER, &other), version_of(&other));
        assert_eq!(
            version_of(&Resources::new()),
            snapshot.type_version(ENDPOINT)
        );
    }
}
