//! The make-before-break planner: pure functions that move what one node should hold
//! (its view) one step towards the desired snapshot (I1, I2). No I/O and no protocol:
//! the session calls [`advance_until`] when every response of the current step is ACKed.
//!
//! 1. **make**: clusters, endpoints and secrets of the desired snapshot are added or
//!    updated, nothing is removed; wait until Envoy has ACKed every one of them (Envoy holds
//!    the CDS ACK until new clusters are warm, and the EDS ACK names the new clusters);
//! 2. **route**: listeners and route configurations become the desired ones; wait for ACKs;
//! 3. **break**: whatever the desired snapshot no longer has is removed. (In SotW, types
//!    asked for by name are not answered only to leave resources out: Envoy drops them
//!    when the cluster or listener using them goes, and says so in its next request.)
//!
//! A type is absent from the view until a step sets it: a new stream's listeners and
//! routes stay unset until the route step, so that nothing is said about them before.

use std::collections::BTreeMap;

use imbl::ordmap::DiffItem;
use serde::Serialize;

use super::snapshot::{ResourceType, Resources, Snapshot};

/// How a node moves between snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Ordering {
    /// Make before break, waiting for Envoy's ACK between steps. The only sane choice.
    MakeBeforeBreak,
    /// Everything pushed at once, like a naive control plane. For tests that prove the
    /// ordering matters; never a user-facing setting.
    AllAtOnce,
}

/// What a node holds or should hold of one type: the same persistent map as the
/// snapshot's, so a node in step with the snapshot shares it instead of copying it, and
/// comparing the two skips whatever they share. A reconnecting delta client may say it
/// holds resources we have no content for: those are [`Resource::held`] entries, kept
/// (never remove what routes may still use) but never sent.
///
/// [`Resource::held`]: super::snapshot::Resource::held
pub(super) type Entries = Resources;
/// What a node should hold at the current step, per type. A type is absent until a step
/// of the plan sets it: until then the node keeps whatever it has (see the session's
/// `withheld`).
pub(super) type View = BTreeMap<String, Entries>;

/// Same names with the same versions (content aside: a held entry equals the resource).
pub(super) fn same_versions(a: &Entries, b: &Entries) -> bool {
    a.len() == b.len()
        && a.diff(b).all(|item| match item {
            DiffItem::Update { old, new } => old.1.version == new.1.version,
            DiffItem::Add(..) | DiffItem::Remove(..) => false,
        })
}

/// `wanted` has a name `held` has, at another version.
pub(super) fn rebuilds(held: &Entries, wanted: &Entries) -> bool {
    held.diff(wanted)
        .any(|item| matches!(item, DiffItem::Update { old, new } if old.1.version != new.1.version))
}

/// `wanted` is `held` less some names: nothing added, nothing at another version.
pub(super) fn only_removals(held: &Entries, wanted: &Entries) -> bool {
    held.diff(wanted).all(|item| match item {
        DiffItem::Remove(..) => true,
        DiffItem::Update { old, new } => old.1.version == new.1.version,
        DiffItem::Add(..) => false,
    })
}

/// `entries` (None: none) hold exactly `resources`, with their content.
pub(super) fn holds_exactly(entries: Option<&Entries>, resources: &Resources) -> bool {
    match entries {
        Some(entries) => entries.ptr_eq(resources) || entries == resources,
        None => resources.is_empty(),
    }
}

/// Same names with the same versions as `resources` (None: none).
fn same_as_desired(entries: Option<&Entries>, resources: Option<&Resources>) -> bool {
    match (entries, resources) {
        (Some(entries), Some(resources)) => same_versions(entries, resources),
        (Some(only), None) | (None, Some(only)) => only.is_empty(),
        (None, None) => true,
    }
}

/// Makes the view of one type exactly `resources`; true if that changed it.
fn become_desired(view: &mut View, type_url: &str, resources: &Resources) -> bool {
    let entries = view.entry(type_url.to_string()).or_default();
    if holds_exactly(Some(entries), resources) {
        return false;
    }
    *entries = resources.clone();
    true
}

/// `resources`, plus whatever `held` has that `resources` lacks: the make step adds and
/// updates, and removes nothing. Built from `resources` so that it shares its nodes.
pub(super) fn merged(held: &Entries, resources: &Resources) -> Entries {
    let mut out = resources.clone();
    for item in held.diff(resources) {
        if let DiffItem::Remove(name, entry) = item {
            out.insert(name.clone(), entry.clone());
        }
    }
    out
}

/// Some resource of `resources` is missing from `entries`, or there in another version.
fn lacks(entries: Option<&Entries>, resources: &Resources) -> bool {
    let Some(entries) = entries else {
        return !resources.is_empty();
    };
    entries.diff(resources).any(|item| match item {
        DiffItem::Add(..) => true,
        DiffItem::Update { old, new } => old.1.version != new.1.version,
        DiffItem::Remove(..) => false,
    })
}

/// [`advance_until`], the break step allowed.
#[cfg(test)]
pub(super) fn advance(view: &mut View, desired: &Snapshot, ordering: Ordering) -> bool {
    advance_until(view, desired, ordering, true)
}

/// Moves `view` one step towards `desired` (see the module docs); true if it changed.
/// Takes the break step only if `may_break`: the session holds a node back where its
/// stream has not yet told what the removals must wait for. Works in place and only
/// copies what differs: every node plans after every step.
pub(super) fn advance_until(
    view: &mut View,
    desired: &Snapshot,
    ordering: Ordering,
    may_break: bool,
) -> bool {
    let empty = Resources::new();
    let wanted = |type_url: &str| desired.resources(type_url).unwrap_or(&empty);
    if ordering == Ordering::AllAtOnce {
        return become_everything(view, desired);
    }
    // A reconnecting delta node's held entries, at the versions of the snapshot, are its
    // resources: take the snapshot's (with content), or the node never counts as synced.
    // Not a step: the node holds them already, nothing is sent.
    for t in ResourceType::ALL.map(ResourceType::type_url) {
        if let Some(entries) = view.get_mut(t)
            && !entries.ptr_eq(wanted(t))
            && same_versions(entries, wanted(t))
        {
            *entries = wanted(t).clone();
        }
    }
    let referenced = ResourceType::ALL
        .into_iter()
        .filter(|t| t.is_referenced())
        .map(ResourceType::type_url);
    let lacks_referenced = referenced.clone().any(|t| lacks(view.get(t), wanted(t)));
    if lacks_referenced {
        let mut changed = false;
        for t in referenced {
            let entries = view.entry(t.to_string()).or_default();
            let next = merged(entries, wanted(t));
            if !holds_exactly(Some(entries), &next) {
                *entries = next;
                changed = true;
            }
        }
        return changed;
    }
    let referrers = ResourceType::ALL
        .into_iter()
        .filter(|t| !t.is_referenced())
        .map(ResourceType::type_url);
    let referrers_differ = referrers
        .clone()
        .any(|t| !same_as_desired(view.get(t), desired.resources(t)));
    if referrers_differ {
        let mut changed = false;
        for t in referrers {
            changed |= become_desired(view, t, wanted(t));
        }
        return changed;
    }
    if !may_break {
        return false;
    }
    let all_same = ResourceType::ALL
        .map(ResourceType::type_url)
        .into_iter()
        .all(|t| same_as_desired(view.get(t), desired.resources(t)));
    if all_same {
        false
    } else {
        become_everything(view, desired)
    }
}

/// Whether a node holding `view` serves `snapshot` in full: every cluster, endpoint and
/// secret of it (others may still wait for the break step) and exactly its listeners and
/// routes. What a node holds once the route step planned from `snapshot` is ACKed, even
/// if newer snapshots came meanwhile.
pub(super) fn serves(view: &View, snapshot: &Snapshot) -> bool {
    ResourceType::ALL.into_iter().all(|t| {
        let (entries, resources) = (view.get(t.type_url()), snapshot.resources(t.type_url()));
        if t.is_referenced() {
            resources.is_none_or(|resources| !lacks(entries, resources))
        } else {
            same_as_desired(entries, resources)
        }
    })
}

/// The view becomes the desired snapshot, every type at once.
fn become_everything(view: &mut View, desired: &Snapshot) -> bool {
    let before = view.len();
    view.retain(|type_url, _| desired.resources(type_url).is_some());
    let mut changed = view.len() != before;
    for (type_url, resources) in desired.types() {
        changed |= become_desired(view, type_url, resources);
    }
    changed
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use envoy_types::pb::google::protobuf::Any;

    use super::*;
    use crate::xds::snapshot::{CLUSTER, ENDPOINT, LISTENER, ROUTE, Resource, SECRET};

    fn res(type_url: &str, name: &str, content: &str) -> Resource {
        Resource::new(
            name,
            Any {
                type_url: type_url.to_string(),
                value: format!("{name}:{content}").into_bytes(),
            },
        )
    }

    /// A route to `cluster`, with the cluster, its endpoints and a secret.
    fn switch_to(cluster: &str) -> Snapshot {
        Snapshot::new([
            res(CLUSTER, cluster, "c"),
            res(ENDPOINT, cluster, "e"),
            res(SECRET, "cert", "s"),
            res(LISTENER, "http", "l"),
            res(ROUTE, "switchyard", &format!("to {cluster}")),
        ])
    }

    /// The view of a node that holds `snapshot`.
    fn holding(snapshot: &Snapshot) -> View {
        snapshot
            .types()
            .map(|(type_url, resources)| (type_url.to_string(), resources.clone()))
            .collect()
    }

    fn names(view: &View, type_url: &str) -> Vec<String> {
        view.get(type_url)
            .map(|entries| entries.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The cluster the view's route configuration sends to, if it has one.
    fn routed_cluster(view: &View) -> Option<String> {
        let route = view.get(ROUTE)?.get("switchyard")?;
        let body = String::from_utf8_lossy(&route.body.value).to_string();
        body.strip_prefix("switchyard:to ").map(str::to_string)
    }

    /// I1 and I2 as the view sees them: the cluster the routes use is there, with its
    /// endpoints.
    fn assert_routes_have_their_cluster(view: &View) {
        if let Some(cluster) = routed_cluster(view) {
            assert!(
                names(view, CLUSTER).contains(&cluster) && names(view, ENDPOINT).contains(&cluster),
                "routes to {cluster} without it: {view:#?}"
            );
        }
    }

    #[test]
    fn a_switch_is_make_then_route_then_break() {
        let mut view = holding(&switch_to("a"));
        let b = switch_to("b");

        assert!(advance(&mut view, &b, Ordering::MakeBeforeBreak));
        assert_eq!(
            names(&view, CLUSTER),
            ["a", "b"],
            "make: old and new clusters"
        );
        assert_eq!(names(&view, ENDPOINT), ["a", "b"]);
        assert_eq!(routed_cluster(&view).as_deref(), Some("a"), "routes wait");

        assert!(advance(&mut view, &b, Ordering::MakeBeforeBreak));
        assert_eq!(routed_cluster(&view).as_deref(), Some("b"), "route step");
        assert_eq!(
            names(&view, CLUSTER),
            ["a", "b"],
            "a stays until routes moved"
        );

        assert!(advance(&mut view, &b, Ordering::MakeBeforeBreak));
        assert_eq!(names(&view, CLUSTER), ["b"], "break: a leaves last");
        assert_eq!(names(&view, ENDPOINT), ["b"]);

        assert!(!advance(&mut view, &b, Ordering::MakeBeforeBreak), "done");
        assert!(view[CLUSTER].ptr_eq(b.resources(CLUSTER).unwrap()));
    }

    #[test]
    fn a_new_view_sets_listeners_and_routes_only_at_the_route_step() {
        let mut view = View::new();
        let a = switch_to("a");
        assert!(advance(&mut view, &a, Ordering::MakeBeforeBreak));
        assert_eq!(
            view.keys().map(String::as_str).collect::<Vec<_>>(),
            [CLUSTER, ENDPOINT, SECRET],
            "listeners and routes unset: the node keeps what it has"
        );
        assert!(advance(&mut view, &a, Ordering::MakeBeforeBreak));
        assert_eq!(names(&view, LISTENER), ["http"]);
        assert_eq!(names(&view, ROUTE), ["switchyard"]);
    }

    #[test]
    fn a_newer_snapshot_mid_switch_keeps_every_cluster_the_routes_may_use() {
        let mut view = holding(&switch_to("a"));
        assert!(advance(
            &mut view,
            &switch_to("b"),
            Ordering::MakeBeforeBreak
        ));
        assert!(advance(
            &mut view,
            &switch_to("c"),
            Ordering::MakeBeforeBreak
        ));
        assert_eq!(names(&view, CLUSTER), ["a", "b", "c"]);
        assert_eq!(routed_cluster(&view).as_deref(), Some("a"));
    }

    #[test]
    fn every_step_of_any_sequence_of_switches_keeps_the_routed_cluster() {
        // Every sequence of three targets, each followed for 0 to 3 steps before the next
        // one arrives, then to the end.
        let targets = ["a", "b", "c"];
        for first in targets {
            for second in targets {
                for third in targets {
                    for steps in 0..4 {
                        let mut view = holding(&switch_to(first));
                        for (i, target) in [second, third].into_iter().enumerate() {
                            let desired = switch_to(target);
                            let limit = if i == 0 { steps } else { 10 };
                            for _ in 0..limit {
                                if !advance(&mut view, &desired, Ordering::MakeBeforeBreak) {
                                    break;
                                }
                                assert_routes_have_their_cluster(&view);
                            }
                        }
                        assert_eq!(routed_cluster(&view).as_deref(), Some(third));
                        assert_eq!(names(&view, CLUSTER), [third]);
                    }
                }
            }
        }
    }

    #[test]
    fn all_at_once_becomes_the_desired_snapshot_in_one_step() {
        let mut view = holding(&switch_to("a"));
        let b = switch_to("b");
        assert!(advance(&mut view, &b, Ordering::AllAtOnce));
        assert_eq!(names(&view, CLUSTER), ["b"]);
        assert_eq!(routed_cluster(&view).as_deref(), Some("b"));
        assert!(!advance(&mut view, &b, Ordering::AllAtOnce));
    }

    #[test]
    fn held_entries_at_the_desired_versions_become_the_snapshots_without_a_step() {
        let a = switch_to("a");
        let mut view: View = a
            .types()
            .map(|(type_url, resources)| {
                let held: Entries = resources
                    .iter()
                    .map(|(name, r)| (name.clone(), Arc::new(Resource::held(name, &r.version))))
                    .collect();
                (type_url.to_string(), held)
            })
            .collect();
        assert!(
            !advance(&mut view, &a, Ordering::MakeBeforeBreak),
            "nothing to send"
        );
        for (type_url, resources) in a.types() {
            assert!(view[type_url].ptr_eq(resources), "{type_url}");
        }
    }

    #[test]
    fn entries_compare_by_name_and_version() {
        let a = switch_to("a");
        let clusters = a.resources(CLUSTER).unwrap();
        let held: Entries = clusters
            .iter()
            .map(|(name, r)| (name.clone(), Arc::new(Resource::held(name, &r.version))))
            .collect();
        assert!(same_versions(&held, clusters));
        assert!(
            !holds_exactly(Some(&held), clusters),
            "a held entry has no content"
        );
        let mut fewer = clusters.clone();
        fewer.remove("a");
        assert!(only_removals(clusters, &fewer));
        assert!(!only_removals(&fewer, clusters));
        let other = switch_to("b");
        assert!(!only_removals(clusters, other.resources(CLUSTER).unwrap()));
    }
}
