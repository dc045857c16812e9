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

/// Every type served, in the order a make-before-break push sends them.
pub const ALL_TYPES: [&str; 5] = [CLUSTER, ENDPOINT, SECRET, LISTENER, ROUTE];

/// Short name of a type URL for logs and metrics ("Cluster", "Listener", ...).
pub fn short_type(type_url: &str) -> &str {
    type_url.rsplit('.').next().unwrap_or(type_url)
}

/// Types that other resources refer to by name: they must be in place before the
/// referrers (I1) and leave only after them (I2).
pub fn is_referenced_type(type_url: &str) -> bool {
    matches!(type_url, CLUSTER | ENDPOINT | SECRET)
}

/// Wildcard types: Envoy asks for all of them rather than by name.
pub fn is_wildcard_type(type_url: &str) -> bool {
    matches!(type_url, CLUSTER | LISTENER)
}

#[derive(Clone, Debug, PartialEq)]
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
}

/// Resources of one type, by name.
pub type Resources = BTreeMap<String, Arc<Resource>>;

/// A digest of the names and versions of a type's resources.
fn type_version(resources: &Resources) -> String {
    hash::digest_of_versions(
        resources
            .values()
            .map(|r| (r.name.as_str(), r.version.as_str())),
    )
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    types: BTreeMap<String, Resources>,
    version: String,
}

impl Snapshot {
    /// Builds a snapshot; later duplicates of a (type, name) replace earlier ones.
    pub fn new(resources: impl IntoIterator<Item = Resource>) -> Self {
        let mut types: BTreeMap<String, Resources> = ALL_TYPES
            .iter()
            .map(|t| (t.to_string(), Resources::new()))
            .collect();
        for resource in resources {
            types
                .entry(resource.body.type_url.clone())
                .or_default()
                .insert(resource.name.clone(), Arc::new(resource));
        }
        // Names are unique within a type, and types come in order: the type's own
        // version (over its names) is enough to tell snapshots apart.
        let version = hash::digest_of_versions(
            types
                .iter()
                .map(|(type_url, resources)| (type_url.as_str(), type_version(resources))),
        );
        Self { types, version }
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
        self.types
            .get(type_url)
            .map_or_else(|| type_version(&Resources::new()), type_version)
    }

    pub fn len(&self) -> usize {
        self.types.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
