//! Clusters and secrets as they come in: each validated and built into its CDS and EDS
//! resources (on every core for a full build), and the indexes from a name to who refers
//! to it.

use super::*;

impl Translator {
    /// Stores a cluster change; returns its name, whether its usability changed (defined
    /// or not, valid or not), and whether its endpoints' fitness for a switch to it did
    /// (see `Inputs::switch_error`).
    pub(super) fn edit_cluster(&mut self, edit: Edit<model::Cluster>) -> (String, bool, bool) {
        let name = match &edit {
            Edit::Put(c) => c.name.clone(),
            Edit::Remove(name) => name.clone(),
        };
        let was = self.inputs().cluster_error(&name);
        let switch_was = self.inputs().switch_error(&name);
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
        let switch_changed = self.inputs().switch_error(&name) != switch_was;
        (name, changed, switch_changed)
    }

    /// Stores a secret change; returns its name and whether its usability changed.
    pub(super) fn edit_secret(&mut self, edit: Edit<model::TlsSecret>) -> (String, bool) {
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
}

/// A cluster's CDS and EDS resources, and the endpoints left out of it.
pub(super) struct BuiltCluster {
    pub(super) cds: Resource,
    pub(super) eds: Resource,
    pub(super) problems: Vec<String>,
}

/// Clusters below this count are built on the calling thread: threads cost more than
/// they save on the few clusters of an incremental change.
pub(super) const PARALLEL_CLUSTERS: usize = 512;

/// Builds clusters, on every core when there are many: in a full build, encoding clusters
/// and their endpoints is most of the work. The output keeps the input order.
pub(super) fn build_clusters(clusters: &[&model::Cluster]) -> Vec<BuiltCluster> {
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

pub(super) fn build_cluster(c: &model::Cluster) -> BuiltCluster {
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
pub(super) fn edits<'c, T: Clone + PartialEq + 'c>(
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

/// Takes `name` out of the names indexed under `key`, and the key with its last name.
pub(super) fn remove_from<K, Q>(index: &mut HashMap<K, BTreeSet<String>>, key: &Q, name: &str)
where
    K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
    Q: std::hash::Hash + Eq + ?Sized,
{
    if let Some(names) = index.get_mut(key) {
        names.remove(name);
        if names.is_empty() {
            index.remove(key);
        }
    }
}

pub(super) fn decrement(counts: &mut HashMap<String, usize>, key: &str) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}
