//! The cluster sets SotW Envoys hold, by version, for a while.
//!
//! A SotW Envoy that reconnects names only the version of the clusters it holds, and the
//! first cluster response on its new stream replaces them whole: a cluster left out of it
//! is removed at once, while the routes that send to it are still the old ones (I2). So
//! the server remembers the sets it knows Envoys to hold — every published snapshot's
//! (kept by [`super::Desired`]), and every set a SotW Envoy of this replica accepted on
//! its way between two — and a reconnecting Envoy's version finds what it holds, with
//! content, here. Replicas build the same snapshots, so another replica knows the set of
//! a snapshot it published too. A set older than the last [`CAPACITY`] is forgotten, and
//! an Envoy holding it loses its removed clusters with the first response.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::planner::{Entries, merged};
use super::snapshot::union_version;

/// How many sets are kept. They share their resources with the snapshots (persistent
/// maps), so a set costs little beyond the resources no snapshot has any more.
pub const CAPACITY: usize = 32;

#[derive(Default)]
pub struct AcceptedClusters {
    /// Oldest first; a set remembered again moves to the back.
    sets: Mutex<VecDeque<(String, Entries)>>,
}

impl AcceptedClusters {
    /// Remembers `clusters` as version `version`.
    pub fn remember(&self, version: &str, clusters: &Entries) {
        let mut sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        if sets.back().is_some_and(|(v, _)| v == version) {
            return;
        }
        sets.retain(|(v, _)| v != version);
        if sets.len() == CAPACITY {
            sets.pop_front();
        }
        sets.push_back((version.to_string(), clusters.clone()));
    }

    /// The set remembered as `version`, if it still is; or else the union of two sets
    /// remembered one after the other that has this version: what an Envoy holds between
    /// the make and break steps of a move from one to the next, seen on another replica.
    pub fn recall(&self, version: &str) -> Option<Entries> {
        let sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, set)) = sets.iter().rev().find(|(v, _)| v == version) {
            return Some(set.clone());
        }
        let (older, newer) = (sets.iter(), sets.iter().skip(1));
        older
            .zip(newer)
            .rev()
            .find(|((va, a), (_, b))| union_version(a, va, b).as_deref() == Some(version))
            .map(|((_, a), (_, b))| merged(a, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::snapshot::version_of;

    fn set(names: &[&str]) -> Entries {
        names
            .iter()
            .map(|n| {
                let entry = std::sync::Arc::new(crate::xds::Resource::held(n.to_string(), "1"));
                (n.to_string(), entry)
            })
            .collect()
    }

    #[test]
    fn recalls_the_union_of_two_sets_one_after_the_other() {
        let accepted = AcceptedClusters::default();
        let (a, b, c) = (set(&["a", "b"]), set(&["b", "c"]), set(&["d"]));
        for s in [&a, &b, &c] {
            accepted.remember(&version_of(s), s);
        }
        let between = merged(&a, &b);
        assert_eq!(accepted.recall(&version_of(&between)), Some(between));
        // Not one after the other: not recalled.
        assert_eq!(accepted.recall(&version_of(&merged(&a, &c))), None);
    }

    #[test]
    fn recalls_what_it_remembers_and_forgets_the_oldest_beyond_capacity() {
        let accepted = AcceptedClusters::default();
        accepted.remember("v0", &set(&["a"]));
        for i in 1..CAPACITY {
            accepted.remember(&format!("v{i}"), &set(&["b"]));
        }
        assert_eq!(accepted.recall("v0"), Some(set(&["a"])));
        // Remembered again: the newest, so v1 is the oldest now.
        accepted.remember("v0", &set(&["a"]));
        accepted.remember("new", &set(&["c"]));
        assert_eq!(accepted.recall("v0"), Some(set(&["a"])));
        assert_eq!(accepted.recall("v1"), None);
        assert_eq!(accepted.recall("new"), Some(set(&["c"])));
        assert_eq!(accepted.recall("unknown"), None);
    }
}
