//! The logic of one ADS stream, as a state machine without I/O.
//!
//! The server loop feeds it requests from Envoy and new desired snapshots; it answers with
//! the responses to send. It moves its Envoy from what that Envoy has acknowledged towards
//! the desired snapshot in make-before-break steps (I1, I2), planned by `xds::planner`:
//! make (clusters, endpoints, secrets), route (listeners, route configurations), break
//! (removals), each step sent once the previous one is ACKed.
//!
//! A new stream knows nothing of what its Envoy holds: after a restart of the server, or a
//! reconnect after missed changes, the Envoy still serves what it had. So nothing is
//! planned before its first request, and until the route step sets them, SotW listeners
//! and routes are not answered at all: a SotW listener response is the whole set, and an
//! empty one would remove them. What the Envoy holds stays until the routes that may use it are
//! replaced: a delta node says what it holds; a SotW node names only the version of its
//! clusters, which the session looks up among the sets this replica knows Envoys to hold
//! (`xds::accepted`: after a restart, those of the snapshots built since, so a node that
//! missed changes made while the server was down loses the clusters they removed).
//! Nothing is removed from such a node before every type that refers to others has been
//! asked for and answered on its stream, and the endpoints of the clusters it holds are
//! answered even before it asks for clusters (see `session/reconnect.rs`).
//!
//! A new snapshot arriving mid-step waits for the step's ACKs, then planning starts again
//! from what Envoy has, so the order holds whatever the timing. A NACK stops the sequence
//! with the Envoy on its last good configuration until a newer snapshot arrives (I8).
//!
//! The snapshots come from the translator (`core/src/translate/translator`), which keeps
//! their inputs between changes, fed by the model cache (`src/k8s/model_cache.rs`), which
//! keeps what the last model was built from.
//!
//! Each protocol's subscription bookkeeping (what a request subscribes to, ACKs or
//! NACKs, and how a response is built) is in `sotw` and `delta`; this module keeps
//! what both share: the per-type state, planning and sending in order, and the status.

mod delta;
mod reconnect;
mod sotw;
#[cfg(test)]
mod testing;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Node;
use serde::Serialize;

use super::accepted::AcceptedClusters;
use super::localize;
use super::names::Names;
use super::planner;
pub use super::planner::Ordering;
use super::planner::{
    Entries, View, advance_until, holds_exactly, only_removals, rebuilds, same_versions,
};
use super::snapshot::{
    CLUSTER, ENDPOINT, LISTENER, ROUTE, Resource, ResourceType, Snapshot, VIRTUAL_HOST, short_type,
};
use super::vhds;
pub use super::wire::{DeltaResponse, Response, SotwResponse};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Protocol {
    /// State of the world: every response carries the full set of a type (endpoints
    /// aside: see `sotw::may_send_changes_only`).
    Sotw,
    /// Incremental: responses carry changed resources and removed names.
    Delta,
}

/// What happened, for logs and metrics. The server loop owns the clock for latencies.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Sent {
        type_url: String,
        nonce: String,
        version: String,
        resources: usize,
        removed: usize,
    },
    Acked {
        type_url: String,
        nonce: String,
        version: String,
        /// What the node now holds of this type.
        resources: Entries,
    },
    Nacked {
        type_url: String,
        nonce: String,
        version: String,
        error: String,
        /// What the node refused: the resources of the response, as sent.
        resources: Entries,
    },
    StaleNonce {
        type_url: String,
        nonce: String,
    },
    /// A reconnecting SotW node's clusters, found by the version it named.
    Recalled {
        version: String,
        clusters: usize,
    },
    /// A reconnecting SotW node named a version of its clusters this replica does not
    /// know: those gone since go with the first cluster response.
    NotRecalled {
        version: String,
    },
    /// The node accepted (`refused` None) or refused the virtual hosts of these route
    /// configurations, served in parts (see [`vhds`]): a verdict on each, as if it had
    /// been sent whole.
    RoutesInParts {
        route_configs: Vec<Arc<Resource>>,
        refused: Option<String>,
    },
}

#[derive(Clone, Debug)]
struct Pending {
    nonce: String,
    version: String,
    /// Version of the desired snapshot this response was planned from.
    desired: String,
    /// What the node holds of this type once it ACKs.
    wanted: Entries,
    /// Virtual hosts only: the route configurations they are every part of.
    in_parts_of: Vec<Arc<Resource>>,
}

#[derive(Clone, Debug, Default)]
struct TypeState {
    requested: bool,
    wildcard: bool,
    names: Names,
    /// What the node has accepted; None until it has been answered once.
    acked: Option<Entries>,
    /// Shared with the status reports, which are made after most messages.
    acked_version: Option<Arc<str>>,
    acked_at: Option<Instant>,
    pending: Option<Pending>,
    /// Last nonce sent on this type (SotW requests must echo it to be current).
    last_nonce: Option<String>,
    /// The node asked again without ACKing anything new: answer even if nothing changed.
    force_send: bool,
    /// SotW: the next response carries the whole set, even of a type that may carry only
    /// what changed (the node asked again for the same names).
    send_whole: bool,
    last_nack: Option<NackInfo>,
    /// What the node holds of this type was found equal to what it should hold, and
    /// neither has changed since: no need to compare them again on the next message.
    settled: bool,
    /// Neither the view of this type nor the subscription changed since the pending
    /// response was built: once ACKed, the node holds what it should (settled).
    unchanged_since_sent: bool,
    /// Virtual hosts only: a route configuration in parts went out while a response was
    /// in flight, whose virtual hosts may reach no watch: all are sent again once it is
    /// ACKed.
    resend_after_ack: bool,
}

impl TypeState {
    /// The view of this type or the subscription changed.
    fn unsettle(&mut self) {
        self.settled = false;
        self.unchanged_since_sent = false;
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NackInfo {
    pub nonce: String,
    pub version: String,
    pub error: String,
}

pub struct Session {
    protocol: Protocol,
    ordering: Ordering,
    node: Option<Node>,
    /// None until the startup gate opens: requests are recorded but not answered (I5).
    desired: Option<Arc<Snapshot>>,
    /// The desired snapshot as received, before per-node adjustments.
    desired_source: Option<Arc<Snapshot>>,
    /// The Envoy is about to stop: its connections close after one request each.
    draining: bool,
    view: View,
    types: BTreeMap<String, TypeState>,
    /// Planning is suspended after a NACK until the desired version changes.
    blocked_on: Option<String>,
    /// The node said it holds resources from before this stream (it reconnected).
    held_before: bool,
    /// The cluster sets SotW nodes may hold, by version (see `xds::accepted`).
    accepted: Option<Arc<AcceptedClusters>>,
    /// The snapshots as delta nodes take them, shared by every stream of the server.
    in_parts: Option<Arc<localize::InParts>>,
    /// The version of the clusters a SotW node said it holds, until it is looked up.
    named_clusters: Option<String>,
    next_nonce: u64,
    events: Vec<Event>,
    /// The snapshot (as this node takes it) the current step was planned from, with its
    /// published version.
    planned_from: Option<(Arc<Snapshot>, String)>,
    /// The published version of the newest snapshot this node was found serving in full
    /// (see [`planner::serves`]).
    serving: Option<String>,
}

impl Session {
    pub fn new(protocol: Protocol, ordering: Ordering) -> Self {
        Self {
            protocol,
            ordering,
            node: None,
            desired: None,
            desired_source: None,
            draining: false,
            view: View::new(),
            types: BTreeMap::new(),
            blocked_on: None,
            held_before: false,
            accepted: None,
            in_parts: None,
            named_clusters: None,
            next_nonce: 0,
            events: Vec::new(),
            planned_from: None,
            serving: None,
        }
    }

    /// Looks up the clusters a reconnecting SotW node holds in `accepted`.
    pub(in crate::xds) fn with_accepted(mut self, accepted: Arc<AcceptedClusters>) -> Self {
        self.accepted = Some(accepted);
        self
    }

    /// Takes delta snapshots in parts from `in_parts`, made once for every stream.
    pub(in crate::xds) fn with_in_parts(mut self, in_parts: Arc<localize::InParts>) -> Self {
        self.in_parts = Some(in_parts);
        self
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Whether this stream has asked for `type_url` yet.
    fn has_requested(&self, type_url: &str) -> bool {
        self.types.get(type_url).is_some_and(|t| t.requested)
    }

    /// The nonces of the responses the node has not answered yet.
    pub fn pending_nonces(&self) -> impl Iterator<Item = &str> {
        self.types
            .values()
            .filter_map(|t| t.pending.as_ref())
            .map(|p| p.nonce.as_str())
    }

    pub fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }

    /// Events since the last call.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// A new desired snapshot (the first one opens the gate for this stream).
    pub fn set_desired(&mut self, snapshot: Arc<Snapshot>, now: Instant) -> Vec<Response> {
        self.desired_source = Some(snapshot);
        self.localize_desired();
        self.pump(now)
    }

    /// Whether this Envoy is draining (see [`localize::drain_connections`]); a change is
    /// served like a new snapshot.
    pub fn set_draining(&mut self, draining: bool, now: Instant) -> Vec<Response> {
        if self.draining == draining {
            return Vec::new();
        }
        self.draining = draining;
        self.localize_desired();
        self.pump(now)
    }

    fn remember_node(&mut self, node: Option<Node>) {
        if self.node.is_none()
            && let Some(node) = node
        {
            self.node = Some(node);
            self.localize_desired();
        }
    }

    /// Applies per-node adjustments (see [`localize`]) to the desired snapshot.
    fn localize_desired(&mut self) {
        let Some(source) = self.desired_source.clone() else {
            return;
        };
        let source = match self.protocol {
            Protocol::Delta => match &self.in_parts {
                Some(in_parts) => in_parts.of(&source),
                None => Arc::new(localize::serve_routes_in_parts(&source)),
            },
            Protocol::Sotw => source,
        };
        let bound = match self.node.as_ref().and_then(localize::listen_address) {
            Some(address) => Arc::new(localize::bind_listeners(&source, &address)),
            None => source,
        };
        self.desired = Some(if self.draining {
            Arc::new(localize::drain_connections(&bound))
        } else {
            bound
        });
    }

    fn ack(&mut self, type_url: &str, now: Instant) {
        let Some(ts) = self.types.get_mut(type_url) else {
            return;
        };
        let Some(pending) = ts.pending.take() else {
            return;
        };
        ts.acked = Some(if std::mem::take(&mut ts.resend_after_ack) {
            Entries::new()
        } else {
            pending.wanted.clone()
        });
        ts.settled = ts.unchanged_since_sent;
        ts.acked_version = Some(Arc::from(pending.version.as_str()));
        ts.acked_at = Some(now);
        if !pending.in_parts_of.is_empty() {
            self.events.push(Event::RoutesInParts {
                route_configs: pending.in_parts_of,
                refused: None,
            });
        }
        self.events.push(Event::Acked {
            type_url: type_url.to_string(),
            nonce: pending.nonce,
            version: pending.version,
            resources: pending.wanted,
        });
    }

    /// Envoy rejected the last response of this type and keeps what it had. Put the view
    /// back to that, and plan nothing more until the desired snapshot changes.
    fn nack(&mut self, type_url: &str, error: String) {
        let Some(ts) = self.types.get_mut(type_url) else {
            return;
        };
        let Some(pending) = ts.pending.take() else {
            return;
        };
        ts.unsettle();
        let held = ts.acked.clone().unwrap_or_default();
        let view = self.view.entry(type_url.to_string()).or_default();
        for name in pending.wanted.keys().chain(held.keys()) {
            match held.get(name) {
                Some(entry) => view.insert(name.clone(), entry.clone()),
                None => view.remove(name),
            };
        }
        // The view is back to what the node held; but Envoy may have taken some of a
        // refused SotW endpoint response (its watches take theirs in turn until one
        // refuses), so what it holds of the names sent at another version is unknown, and
        // the next response carries them again.
        if self.protocol == Protocol::Sotw
            && sotw::may_send_changes_only(type_url)
            && let Some(acked) = ts.acked.as_mut()
        {
            for (name, entry) in pending.wanted.iter() {
                if acked
                    .get(name)
                    .is_some_and(|held| held.version != entry.version)
                {
                    acked.remove(name);
                }
            }
        }
        let info = NackInfo {
            nonce: pending.nonce.clone(),
            version: pending.version.clone(),
            error: error.clone(),
        };
        ts.last_nack = Some(info);
        // Blocked on the snapshot the refused response came from: one that changed since
        // (the refusal itself may be why) is planned at once.
        self.blocked_on = Some(pending.desired.clone());
        if !pending.in_parts_of.is_empty() {
            self.events.push(Event::RoutesInParts {
                route_configs: pending.in_parts_of,
                refused: Some(error.clone()),
            });
        }
        self.events.push(Event::Nacked {
            type_url: type_url.to_string(),
            nonce: pending.nonce,
            version: pending.version,
            error,
            resources: pending.wanted,
        });
    }

    /// Plans the next step when the current one is complete, and sends what differs.
    fn pump(&mut self, _now: Instant) -> Vec<Response> {
        let mut out = Vec::new();
        let Some(desired) = self.desired.clone() else {
            return out;
        };
        // A stream that has asked for nothing yet has told nothing of what its Envoy holds:
        // planning now would run every step for nobody (nothing subscribed, nothing to
        // wait for) and release listeners before this stream's clusters were ACKed.
        if !self.types.values().any(|t| t.requested) {
            return out;
        }
        // Nor can routes go out before this stream has asked for the clusters they send
        // to: the make step would pass for want of a subscription, and the routes would
        // name clusters the Envoy does not hold (Envoy asks for clusters first; a client
        // that asks for routes first waits for its own cluster request). Found by fuzzing.
        if desired.resources(CLUSTER).is_some() && !self.has_requested(CLUSTER) {
            self.serve_endpoints_before_clusters(&desired, &mut out);
            return out;
        }
        self.recall_named_clusters();
        // What the step just ACKed left the node serving, before the next is planned.
        self.note_serving(&desired);
        let may_break = self.may_break(&desired);
        // Each pass either sends something (and waits for ACKs) or completes a step whose
        // changes this node does not subscribe to; three steps at most.
        for _ in 0..4 {
            let idle = self.types.values().all(|t| t.pending.is_none());
            let may_plan = self.blocked_on.as_deref() != Some(desired.version())
                && (idle || self.ordering == Ordering::AllAtOnce);
            let mut changed = false;
            if may_plan {
                self.blocked_on = None;
                changed = advance_until(&mut self.view, &desired, self.ordering, may_break);
                if changed {
                    for ts in self.types.values_mut() {
                        ts.unsettle();
                    }
                    self.planned_from = self.desired_source_version().map(|v| (desired.clone(), v));
                }
            }
            let sent = self.send_ready(&desired, &mut out);
            if sent > 0 || !changed {
                break;
            }
        }
        self.note_serving(&desired);
        out
    }

    /// The published version of the desired snapshot.
    fn desired_source_version(&self) -> Option<String> {
        self.desired_source
            .as_ref()
            .map(|d| d.version().to_string())
    }

    /// Once every response is ACKed: the newest snapshot the node now serves in full, the
    /// desired one or the one the last step was planned from. While snapshots come faster
    /// than the Envoy takes them it is never synced, yet each route step ACKed leaves it
    /// serving the snapshot that step was planned from (and a make step, the one it was
    /// planned from when its listeners and routes needed no change).
    fn note_serving(&mut self, desired: &Arc<Snapshot>) {
        if !self.all_acked() || !self.asked_for_routes() {
            return;
        }
        if planner::serves(&self.view, desired) {
            // It stands for the last step too: a newer snapshot that it does not serve
            // must not bring back an older one.
            self.planned_from = self.desired_source_version().map(|v| (desired.clone(), v));
            self.serving = self.desired_source_version();
        } else if let Some((planned, version)) = &self.planned_from
            && planner::serves(&self.view, planned)
        {
            self.serving = Some(version.clone());
        }
    }

    /// A node holding listeners has asked for route configurations: until it does, the
    /// listeners it took route nothing. (Virtual hosts are not asked for by every delta
    /// node: one that does not take route configurations in parts never asks.)
    fn asked_for_routes(&self) -> bool {
        self.view.get(LISTENER).is_none_or(Entries::is_empty) || self.has_requested(ROUTE)
    }

    /// No response in flight, and what the node acknowledged of each type it asked for is
    /// what its view wants of it.
    fn all_acked(&self) -> bool {
        self.types.values().all(|ts| ts.pending.is_none())
            && self.types.iter().all(|(type_url, ts)| {
                !ts.requested
                    || ts.settled
                    || ts
                        .acked
                        .as_ref()
                        .is_some_and(|a| same_versions(a, &self.wanted(type_url, ts)))
            })
    }

    /// Sends every requested type whose wanted content differs from what the node holds,
    /// in make-before-break type order. At most one response per type is in flight.
    fn send_ready(&mut self, desired: &Snapshot, out: &mut Vec<Response>) -> usize {
        self.send_ready_of(desired, out, |_| true)
    }

    /// [`Session::send_ready`], for the types `include` accepts only.
    fn send_ready_of(
        &mut self,
        desired: &Snapshot,
        out: &mut Vec<Response>,
        include: impl Fn(&str) -> bool,
    ) -> usize {
        let order: Vec<String> = ResourceType::ALL
            .iter()
            .map(|t| t.type_url().to_string())
            .chain(
                self.types
                    .keys()
                    .filter(|t| ResourceType::from_type_url(t).is_none())
                    .cloned(),
            )
            .collect();
        let mut sent = 0;
        for type_url in order {
            let Some(ts) = self.types.get(&type_url) else {
                continue;
            };
            if !include(&type_url)
                || !ts.requested
                || ts.pending.is_some()
                || self.withheld(&type_url, desired)
            {
                continue;
            }
            if !ts.force_send && ts.settled {
                continue;
            }
            let wanted = self.wanted(&type_url, ts);
            let same = ts.acked.as_ref().is_some_and(|a| same_versions(a, &wanted));
            // SotW by name (endpoints, routes, secrets): Envoy drops a resource when it
            // stops asking for it, once the cluster or listener using it is gone. A response
            // that would only leave resources out (3.8 MB of endpoints at 10k routes, to
            // drop one) is not sent; the node's next request says it forgot them.
            let only_fewer = !same
                && self.protocol == Protocol::Sotw
                && self.ordering == Ordering::MakeBeforeBreak
                && !ts.wildcard
                && ts.acked.as_ref().is_some_and(|a| only_removals(a, &wanted));
            if !ts.force_send && (same || only_fewer) {
                if same && let Some(ts) = self.types.get_mut(&type_url) {
                    ts.settled = true;
                }
                continue;
            }
            let response = self.respond(&type_url, wanted, desired);
            out.push(response);
            sent += 1;
        }
        sent
    }

    /// SotW: the plan has not released this type to the node yet (a new stream before its
    /// route step), so the view knows nothing of it. A SotW response is the whole set: an
    /// empty one would make a reconnecting Envoy remove every listener it serves with.
    /// Such a type is answered once the step that fills it comes (I1), never before.
    fn withheld(&self, type_url: &str, desired: &Snapshot) -> bool {
        self.protocol == Protocol::Sotw
            && desired.resources(type_url).is_some()
            && !self.view.contains_key(type_url)
    }

    /// The part of the current view this node subscribes to: usually all of it, shared;
    /// otherwise mostly (a new cluster's endpoints Envoy has yet to ask for), so the view
    /// less the few names it lacks, still sharing the rest.
    fn wanted(&self, type_url: &str, ts: &TypeState) -> Entries {
        if type_url == VIRTUAL_HOST {
            return self.wanted_virtual_hosts(ts, self.view.get(type_url));
        }
        let Some(view) = self.view.get(type_url) else {
            return Entries::new();
        };
        if ts.wildcard {
            return view.clone();
        }
        let unsubscribed = unsubscribed(&ts.names, view);
        if unsubscribed.len() <= view.len() / 2 {
            let mut wanted = view.clone();
            for name in unsubscribed {
                wanted.remove(name);
            }
            return wanted;
        }
        view.iter()
            .filter(|(name, _)| ts.names.contains(name))
            .map(|(name, entry)| (name.clone(), entry.clone()))
            .collect()
    }

    /// The view's virtual hosts in the namespaces the node asks for; and those it holds of
    /// a route configuration no longer served in parts (VHDS turned off, a Gateway
    /// listener gone): a listener draining on it still routes with them, so they stay
    /// until the node stops asking for them.
    fn wanted_virtual_hosts(&self, ts: &TypeState, view: Option<&Entries>) -> Entries {
        let mut wanted = match view {
            None => Entries::new(),
            Some(view) if ts.wildcard => view.clone(),
            Some(view) => in_namespaces(&ts.names, view),
        };
        let routes = self.desired.as_ref().and_then(|d| d.resources(ROUTE));
        let retired = |namespace: &str| {
            !routes.is_some_and(|routes| routes.contains_key(namespace))
                && (ts.wildcard || ts.names.contains(namespace))
        };
        let Some(acked) = ts.acked.as_ref() else {
            return wanted;
        };
        for namespace in namespaces_of(acked) {
            if retired(&namespace) {
                for (name, entry) in acked
                    .range::<_, String>(format!("{namespace}/")..)
                    .take_while(|(name, _)| vhds::namespace(name) == namespace)
                {
                    wanted.insert(name.clone(), entry.clone());
                }
            }
        }
        wanted
    }

    /// A route configuration in parts the node gets now (`wanted` has it, `held` not):
    /// Envoy starts asking for its virtual hosts once it has it, and keeps only those that
    /// arrive after (it keeps a resource only for a watch that wants it, and tells the
    /// server of no new watch). So those sent before are sent again, after this response.
    fn resend_virtual_hosts_of_new_parts(&mut self, held: &Entries, wanted: &Entries) {
        let new_parts: Vec<&String> = wanted
            .keys()
            .filter(|name| vhds::is_parts_name(name) && !held.contains_key(*name))
            .collect();
        if new_parts.is_empty() {
            return;
        }
        let Some(ts) = self.types.get_mut(VIRTUAL_HOST) else {
            return;
        };
        if let Some(acked) = ts.acked.as_mut() {
            for namespace in &new_parts {
                delta::forget_namespace(acked, namespace);
            }
        }
        ts.resend_after_ack |= ts.pending.is_some();
        ts.unsettle();
    }

    fn respond(&mut self, type_url: &str, wanted: Entries, desired: &Snapshot) -> Response {
        self.next_nonce += 1;
        let nonce = self.next_nonce.to_string();
        let version = desired.version_of(type_url, &wanted);
        let Some(ts) = self.types.get(type_url) else {
            unreachable!("respond is only called for tracked types");
        };
        let (response, resources, removed) = match self.protocol {
            Protocol::Sotw => {
                let held = ts.acked.as_ref().filter(|_| {
                    sotw::may_send_changes_only(type_url)
                        && !ts.wildcard
                        && !ts.send_whole
                        && self.ordering == Ordering::MakeBeforeBreak
                });
                sotw::response(type_url, &version, &nonce, held, &wanted)
            }
            Protocol::Delta => {
                let empty = Entries::new();
                let held = ts.acked.as_ref().unwrap_or(&empty);
                delta::response(type_url, desired.version(), &nonce, held, &wanted)
            }
        };
        let rebuilt = self.protocol == Protocol::Sotw
            && type_url == CLUSTER
            && ts
                .acked
                .as_ref()
                .is_some_and(|held| rebuilds(held, &wanted));
        if self.protocol == Protocol::Delta && type_url == ROUTE {
            let held = ts.acked.clone().unwrap_or_default();
            self.resend_virtual_hosts_of_new_parts(&held, &wanted);
        }
        if rebuilt && let Some(endpoints) = self.types.get_mut(ENDPOINT) {
            // Envoy makes a cluster it holds anew when its content changes, and the new one
            // waits for its endpoints, which the node holds already: the next endpoint
            // response is whole, and follows this one.
            endpoints.send_whole = true;
            endpoints.force_send = true;
            endpoints.unsettle();
        }
        let Some(ts) = self.types.get_mut(type_url) else {
            unreachable!("respond is only called for tracked types");
        };
        ts.force_send = false;
        ts.send_whole = false;
        ts.unchanged_since_sent = true;
        ts.last_nonce = Some(nonce.clone());
        let in_parts_of = if type_url == VIRTUAL_HOST {
            whole_route_configs(desired, &wanted)
        } else {
            Vec::new()
        };
        ts.pending = Some(Pending {
            nonce: nonce.clone(),
            version: version.clone(),
            desired: desired.version().to_string(),
            wanted,
            in_parts_of,
        });
        self.events.push(Event::Sent {
            type_url: type_url.to_string(),
            nonce,
            version,
            resources,
            removed,
        });
        response
    }

    /// True when the node holds exactly the desired snapshot (as far as it subscribes).
    pub fn is_synced(&self) -> bool {
        let Some(desired) = self.desired.as_ref() else {
            return false;
        };
        // Cheap checks first: the server asks after every message, and most messages
        // leave a response in flight.
        if self.types.values().any(|ts| ts.pending.is_some()) {
            return false;
        }
        let view_is_desired = desired
            .types()
            .all(|(type_url, resources)| holds_exactly(self.view.get(type_url), resources))
            && self.view.iter().all(|(type_url, entries)| {
                entries.is_empty() || desired.resources(type_url).is_some()
            });
        // A settled type was found holding what it should, and neither changed since.
        view_is_desired && self.all_acked()
    }

    /// What the rest of the program sees of this node. Made after most messages, so it
    /// copies little: a served type's name is its own, acked versions are shared.
    pub fn status(&self) -> SessionStatus {
        let mut types = BTreeMap::new();
        for (type_url, ts) in self.types.iter().filter(|(_, ts)| ts.requested) {
            let name = match ResourceType::from_type_url(type_url) {
                Some(known) => Cow::Borrowed(short_type(known.type_url())),
                None => Cow::Owned(short_type(type_url).to_string()),
            };
            let status = TypeStatus {
                subscribed: if ts.wildcard {
                    Subscribed::All
                } else {
                    Subscribed::Names(ts.names.len())
                },
                acked_version: ts.acked_version.clone(),
                acked_resources: ts.acked.as_ref().map_or(0, Entries::len),
                pending_nonce: ts.pending.as_ref().map(|p| p.nonce.clone()),
                last_nack: ts.last_nack.clone(),
            };
            types.insert(name, status);
        }
        SessionStatus {
            protocol: self.protocol,
            desired_version: self.desired_source_version(),
            serving_version: self.serving.clone(),
            synced: self.is_synced(),
            blocked_by_nack: self.blocked_on.is_some(),
            types,
        }
    }
}

/// A node's state as the rest of the program sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SessionStatus {
    pub protocol: Protocol,
    /// Version of the desired snapshot this node is moving to, as published (before the
    /// per-node adjustments of [`localize`]).
    pub desired_version: Option<String>,
    /// Version of the newest published snapshot this node serves in full: all of its
    /// clusters, endpoints and secrets, exactly its listeners and routes. Newer ones may
    /// be on their way.
    pub serving_version: Option<String>,
    pub synced: bool,
    pub blocked_by_nack: bool,
    /// By the type's short name ("Cluster").
    pub types: BTreeMap<Cow<'static, str>, TypeStatus>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TypeStatus {
    pub subscribed: Subscribed,
    pub acked_version: Option<Arc<str>>,
    pub acked_resources: usize,
    pub pending_nonce: Option<String>,
    pub last_nack: Option<NackInfo>,
}

/// What a node subscribes to of one type; shown as "*" for all, else the number of names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subscribed {
    All,
    Names(usize),
}

impl Serialize for Subscribed {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::All => serializer.serialize_str("*"),
            Self::Names(n) => serializer.collect_str(n),
        }
    }
}

/// The route configurations of `desired` whose every virtual host, and nothing else,
/// `virtual_hosts` holds: what a node that accepts or refuses them has judged. None when
/// the response was planned from another snapshot than `desired`: no verdict then.
fn whole_route_configs(desired: &Snapshot, virtual_hosts: &Entries) -> Vec<Arc<Resource>> {
    let (Some(all), Some(routes)) = (desired.resources(VIRTUAL_HOST), desired.resources(ROUTE))
    else {
        return Vec::new();
    };
    if !same_versions(all, virtual_hosts) {
        return Vec::new();
    }
    routes
        .values()
        .filter(|config| routes.contains_key(&vhds::parts_name(&config.name)))
        .cloned()
        .collect()
}

/// The entries whose namespace is among `namespaces`: Envoy subscribes to virtual hosts
/// by their route configuration's namespace (see [`vhds`]). Usually every one.
fn in_namespaces(namespaces: &Names, entries: &Entries) -> Entries {
    // Runs on every message: one look per namespace, not per virtual host.
    if namespaces_of(entries)
        .iter()
        .all(|namespace| namespaces.contains(namespace))
    {
        return entries.clone();
    }
    entries
        .iter()
        .filter(|(name, _)| namespaces.contains(vhds::namespace(name)))
        .map(|(name, entry)| (name.clone(), entry.clone()))
        .collect()
}

/// The namespaces of the VirtualHost names of `entries`, in order, found with one look
/// each: a namespace's names are contiguous in the map's order (ids have no '/', and no
/// namespace starts with another's followed by '/': route configurations are "switchyard"
/// or named after Gateway listeners, and Kubernetes names have no '+').
fn namespaces_of(entries: &Entries) -> Vec<String> {
    let mut namespaces = Vec::new();
    let mut from = String::new();
    while let Some((name, _)) = entries
        .range::<_, String>((Bound::Excluded(from.clone()), Bound::Unbounded))
        .next()
    {
        let namespace = vhds::namespace(name);
        // Past this namespace, and never back (a name without '/' has none).
        from = format!("{namespace}/{}", char::MAX).max(name.clone());
        namespaces.push(namespace.to_owned());
    }
    namespaces
}

/// The names of `entries` that are not in `names`. Envoy subscribes to every cluster's
/// endpoints by name, and this runs on every message: the subscription shares most of
/// its map with the view (see [`Names`]), and the diff skips what they share.
fn unsubscribed<'e>(names: &Names, entries: &'e Entries) -> Vec<&'e String> {
    if names.are_keys_of(entries) {
        return Vec::new();
    }
    names.missing_from(entries)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::testing::res;
    use super::*;
    use crate::xds::snapshot::ENDPOINT;

    #[test]
    fn unsubscribed_names_are_those_of_the_entries_not_named() {
        let entries: Entries = ["b", "d"]
            .iter()
            .map(|n| (n.to_string(), Arc::new(res(ENDPOINT, n, "e"))))
            .collect();
        let names = |ns: &[&str]| ns.iter().map(|n| n.to_string()).collect::<Names>();
        let missing = |ns: &[&str]| -> Vec<String> {
            unsubscribed(&names(ns), &entries)
                .into_iter()
                .cloned()
                .collect()
        };
        assert!(missing(&["b", "d"]).is_empty());
        assert!(missing(&["a", "b", "c", "d", "e"]).is_empty());
        assert_eq!(missing(&["b", "c", "e"]), ["d"]);
        assert_eq!(missing(&["a", "b"]), ["d"]);
        assert_eq!(missing(&["d"]), ["b"]);
        assert_eq!(missing(&[]), ["b", "d"]);
        assert!(unsubscribed(&names(&[]), &Entries::new()).is_empty());
    }

    #[test]
    fn virtual_hosts_are_kept_by_namespace() {
        let entries: Entries = [
            "gw%2Fweb+vhds/b",
            "switchyard+vhds/a",
            "switchyard+vhds/b%2Fc",
            "switchyard+vhds/z",
            "zz+vhds/a",
        ]
        .iter()
        .map(|n| (n.to_string(), Arc::new(res(VIRTUAL_HOST, n, "v"))))
        .collect();
        assert_eq!(
            namespaces_of(&entries),
            ["gw%2Fweb+vhds", "switchyard+vhds", "zz+vhds"]
        );
        assert!(namespaces_of(&Entries::new()).is_empty());

        let names = |ns: &[&str]| ns.iter().map(|n| n.to_string()).collect::<Names>();
        let kept = |ns: &[&str]| -> Vec<String> {
            in_namespaces(&names(ns), &entries)
                .keys()
                .cloned()
                .collect()
        };
        assert_eq!(
            kept(&["gw%2Fweb+vhds", "switchyard+vhds", "zz+vhds"]).len(),
            5
        );
        assert_eq!(kept(&["zz+vhds", "other+vhds"]), ["zz+vhds/a"]);
        assert_eq!(
            kept(&["switchyard+vhds"]),
            [
                "switchyard+vhds/a",
                "switchyard+vhds/b%2Fc",
                "switchyard+vhds/z"
            ]
        );
        assert!(kept(&[]).is_empty());
    }
}
