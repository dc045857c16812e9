//! The names a node subscribes to, for one resource type.
//!
//! Envoy names every cluster's endpoints: at 10k clusters a set of its own is ≈ 0.7 MB per
//! Envoy, most of what a connected Envoy costs. The names are kept as a persistent map
//! whose keys are the names (the values mean nothing): a subscription that is exactly the
//! names of the node's view becomes that view's own map, shared with the snapshot, and a
//! name subscribed or dropped later copies one path of it, not the whole.

use std::sync::{Arc, LazyLock};

use imbl::ordmap::DiffItem;

use super::snapshot::{Resource, Resources};

/// The value of a name that did not come from a view.
static NAMED: LazyLock<Arc<Resource>> = LazyLock::new(|| Arc::new(Resource::held("", "")));

#[derive(Clone, Debug, Default)]
pub(super) struct Names(Resources);

impl FromIterator<String> for Names {
    fn from_iter<I: IntoIterator<Item = String>>(names: I) -> Self {
        Names(names.into_iter().map(|n| (n, NAMED.clone())).collect())
    }
}

impl Names {
    /// The names a SotW request lists, made from `view`'s own map: the view itself when
    /// they are exactly its names (the common case, found without building anything),
    /// else the view less the names not asked for and with those it lacks, sharing the
    /// rest with it (a new cluster's endpoints asked for, an old one's dropped), so that
    /// what compares the two later skips what they share.
    pub(super) fn from_request(mut names: Vec<String>, view: Option<&Resources>) -> Self {
        names.sort_unstable();
        names.dedup();
        let Some(view) = view else {
            return names.into_iter().collect();
        };
        let (mut lacking, mut extra) = (Vec::new(), Vec::new());
        let mut keys = view.keys().peekable();
        for (i, name) in names.iter().enumerate() {
            while let Some(key) = keys.next_if(|key| *key < name) {
                extra.push(key);
            }
            if keys.next_if(|key| *key == name).is_none() {
                lacking.push(i);
            }
        }
        extra.extend(keys);
        if extra.len() > view.len() / 2 {
            // Mostly other names: built afresh, which costs less than removing them.
            return names.into_iter().collect();
        }
        let mut map = view.clone();
        for key in extra {
            map.remove(key);
        }
        for i in lacking {
            map.insert(names[i].clone(), NAMED.clone());
        }
        Names(map)
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// In order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &String> {
        self.0.keys()
    }

    /// Every name of `self` is in `other`. A diff, which skips what the two share.
    pub(super) fn is_subset(&self, other: &Names) -> bool {
        self.len() <= other.len()
            && !other
                .0
                .diff(&self.0)
                .any(|item| matches!(item, DiffItem::Add(..)))
    }

    /// The keys of `map` that are not among these names, in order. A diff of the two
    /// maps, which skips what they share: a subscription that was a view's own map, and
    /// a view that changed by a few names since (a new cluster's endpoints Envoy has yet
    /// to ask for), cost those few, not a walk of every name.
    pub(super) fn missing_from<'m>(&self, map: &'m Resources) -> Vec<&'m String> {
        self.0
            .diff(map)
            .filter_map(|item| match item {
                DiffItem::Add(name, _) => Some(name),
                DiffItem::Remove(..) | DiffItem::Update { .. } => None,
            })
            .collect()
    }

    /// True when these are the names of `map` itself (not a copy): nothing to compare.
    pub(super) fn are_keys_of(&self, map: &Resources) -> bool {
        self.0.ptr_eq(map)
    }

    pub(super) fn insert(&mut self, name: String) {
        if !self.0.contains_key(&name) {
            self.0.insert(name, NAMED.clone());
        }
    }

    pub(super) fn remove(&mut self, name: &str) {
        self.0.remove(name);
    }

    /// Shares `view`'s map when its names are exactly these. A diff of the two skips what
    /// they already share: after one name changed, that name.
    pub(super) fn share(&mut self, view: &Resources) {
        if self.0.ptr_eq(view) || self.0.len() != view.len() {
            return;
        }
        let same_names = self
            .0
            .diff(view)
            .all(|item| matches!(item, DiffItem::Update { .. }));
        if same_names {
            self.0 = view.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::google::protobuf::Any;

    use super::*;

    fn map(names: &[&str]) -> Resources {
        names
            .iter()
            .map(|n| {
                let body = Any {
                    type_url: "t".into(),
                    value: n.as_bytes().to_vec(),
                };
                (n.to_string(), Arc::new(Resource::new(n.to_string(), body)))
            })
            .collect()
    }

    fn names(names: &[&str]) -> Names {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn the_view_is_shared_only_when_the_names_are_exactly_its_own() {
        let view = map(&["a", "b", "c"]);
        for other in [&["a", "b"][..], &["a", "b", "c", "d"], &["a", "b", "d"]] {
            let mut subscription = names(other);
            subscription.share(&view);
            assert!(!subscription.are_keys_of(&view), "{other:?}");
        }
        let mut subscription = names(&["c", "b", "a"]);
        subscription.share(&view);
        assert!(subscription.are_keys_of(&view));
        assert!(subscription.contains("b") && !subscription.contains("d"));
        assert_eq!(subscription.iter().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(names(&["a", "c"]).is_subset(&subscription));
        assert!(!names(&["a", "d"]).is_subset(&subscription));
    }

    #[test]
    fn a_request_naming_exactly_the_view_is_the_view() {
        let view = map(&["a", "b"]);
        let request = |ns: &[&str]| ns.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert!(Names::from_request(request(&["b", "a"]), Some(&view)).are_keys_of(&view));
        let twice = Names::from_request(request(&["b", "a", "a"]), Some(&view));
        assert!(twice.are_keys_of(&view));
        for other in [&["a"][..], &["a", "c"], &["a", "b", "c"]] {
            let subscription = Names::from_request(request(other), Some(&view));
            assert!(!subscription.are_keys_of(&view), "{other:?}");
            assert_eq!(subscription.len(), other.len());
        }
        assert_eq!(Names::from_request(request(&["a"]), None).len(), 1);
    }

    #[test]
    fn a_request_naming_a_few_other_names_than_the_view_is_the_view_changed_by_those() {
        let view = map(&["a", "b", "c", "d"]);
        let request = |ns: &[&str]| ns.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let names = |ns: &[&str]| Names::from_request(request(ns), Some(&view));
        let listed = |n: &Names| n.iter().cloned().collect::<Vec<_>>();
        assert_eq!(
            listed(&names(&["e", "a", "b", "c", "d"])),
            ["a", "b", "c", "d", "e"]
        );
        assert_eq!(listed(&names(&["d", "a", "c"])), ["a", "c", "d"]);
        assert_eq!(listed(&names(&["a", "b", "c", "x"])), ["a", "b", "c", "x"]);
        assert_eq!(listed(&names(&["x", "y"])), ["x", "y"]);
        assert_eq!(listed(&names(&[])), Vec::<String>::new());
        assert!(names(&["a", "c"]).is_subset(&names(&["a", "b", "c"])));
        assert!(!names(&["a", "x"]).is_subset(&names(&["a", "b", "c"])));
        assert!(names(&[]).is_subset(&names(&["a"])));
    }

    #[test]
    fn a_shared_subscription_changes_by_one_name_and_is_shared_again() {
        let view = map(&["a", "b"]);
        let mut subscription = names(&["a", "b"]);
        subscription.share(&view);
        subscription.insert("c".into());
        assert!(!subscription.are_keys_of(&view));
        assert_eq!(subscription.iter().collect::<Vec<_>>(), ["a", "b", "c"]);
        // The view itself is untouched.
        assert_eq!(view.keys().collect::<Vec<_>>(), ["a", "b"]);
        // The view gains the name too (a new cluster's endpoints): shared again.
        let mut next = view.clone();
        next.insert("c".into(), map(&["c"])["c"].clone());
        subscription.share(&next);
        assert!(subscription.are_keys_of(&next));
        subscription.remove("a");
        assert_eq!(subscription.iter().collect::<Vec<_>>(), ["b", "c"]);
    }
}
