//! The logic of one ADS stream, as a state machine without I/O.
//!
//! The server loop feeds it requests from Envoy and new desired snapshots; it answers with
//! the responses to send. It moves its Envoy from what that Envoy has acknowledged towards
//! the desired snapshot in make-before-break steps (I1, I2), planned by [`planner`]: make
//! (clusters, endpoints, secrets), route (listeners, route configurations), break
//! (removals), each step sent once the previous one is ACKed.
//!
//! [`planner`]: super::planner
//!
//! A new stream knows nothing of what its Envoy holds: after a restart of the server, a
//! reconnecting Envoy still serves the previous instance's configuration. So nothing is
//! planned before its first request, and until the route step sets them, SotW listeners
//! and routes are not answered at all: a SotW response is the whole set, and an empty one
//! would remove them. (Delta only sends changes, and keeps what the node says it holds.)
//!
//! A new snapshot arriving mid-step waits for the step's ACKs, then planning starts again
//! from what Envoy has, so the order holds whatever the timing. A NACK stops the sequence
//! with the Envoy on its last good configuration until a newer snapshot arrives (I8).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use serde::Serialize;

use super::localize;
use super::names::Names;
pub use super::planner::Ordering;
use super::planner::{Entries, View, advance, holds_exactly, only_removals, same_versions};
use super::snapshot::{self, ALL_TYPES, Resource, Snapshot, short_type};
pub use super::wire::{DeltaResponse, Response, SotwResponse};
use imbl::ordmap::DiffItem;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Protocol {
    /// State of the world: every response carries the full set of a type.
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
}

#[derive(Clone, Debug)]
struct Pending {
    nonce: String,
    version: String,
    /// Version of the desired snapshot this response was planned from.
    desired: String,
    /// What the node holds of this type once it ACKs.
    wanted: Entries,
}

#[derive(Clone, Debug, Default)]
struct TypeState {
    requested: bool,
    wildcard: bool,
    names: Names,
    /// What the node has accepted; None until it has been answered once.
    acked: Option<Entries>,
    acked_version: Option<String>,
    acked_at: Option<Instant>,
    pending: Option<Pending>,
    /// Last nonce sent on this type (SotW requests must echo it to be current).
    last_nonce: Option<String>,
    /// The node asked again without ACKing anything new: answer even if nothing changed.
    force_send: bool,
    last_nack: Option<NackInfo>,
    /// What the node holds of this type was found equal to what it should hold, and
    /// neither has changed since: no need to compare them again on the next message.
    settled: bool,
    /// Neither the view of this type nor the subscription changed since the pending
    /// response was built: once ACKed, the node holds what it should (settled).
    unchanged_since_sent: bool,
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
    view: View,
    types: BTreeMap<String, TypeState>,
    /// Planning is suspended after a NACK until the desired version changes.
    blocked_on: Option<String>,
    next_nonce: u64,
    events: Vec<Event>,
}

impl Session {
    pub fn new(protocol: Protocol, ordering: Ordering) -> Self {
        Self {
            protocol,
            ordering,
            node: None,
            desired: None,
            desired_source: None,
            view: View::new(),
            types: BTreeMap::new(),
            blocked_on: None,
            next_nonce: 0,
            events: Vec::new(),
        }
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

    pub fn on_sotw_request(&mut self, request: DiscoveryRequest, now: Instant) -> Vec<Response> {
        self.remember_node(request.node);
        let type_url = request.type_url;
        let ts = self.types.entry(type_url.clone()).or_default();
        let nonce = request.response_nonce;
        if !nonce.is_empty() && ts.last_nonce.as_deref() != Some(nonce.as_str()) {
            self.events.push(Event::StaleNonce { type_url, nonce });
            return Vec::new();
        }
        let answers_pending = ts.pending.as_ref().is_some_and(|p| p.nonce == nonce);
        // SotW requests repeat the whole subscription: most ACKs change nothing, and
        // comparing a thousand names costs less than collecting them again (in one walk
        // when they come sorted, else a lookup each).
        let names = &request.resource_names;
        let same_names = names.len() == ts.names.len()
            && if names.is_sorted() {
                names.iter().eq(ts.names.iter())
            } else {
                names.iter().all(|n| ts.names.contains(n))
            };
        let mut fewer_names = false;
        if !same_names {
            let names = Names::from_request(request.resource_names, self.view.get(&type_url));
            fewer_names =
                ts.requested && names.len() < ts.names.len() && names.is_subset(&ts.names);
            ts.names = names;
        }
        // (Also when the names did not change: the view may have come to match them.)
        if let Some(view) = self.view.get(&type_url) {
            ts.names.share(view);
        }
        let wildcard = ts.names.contains("*")
            || (ts.names.is_empty() && snapshot::is_wildcard_type(&type_url));
        if !ts.requested || ts.wildcard != wildcard || !same_names {
            ts.unsettle();
        }
        ts.requested = true;
        ts.wildcard = wildcard;
        if answers_pending {
            match request.error_detail {
                Some(status) => self.nack(&type_url, status.message),
                None => self.ack(&type_url, now),
            }
        } else if !fewer_names || self.ordering == Ordering::AllAtOnce {
            // A first request, or a new request on the last nonce (the node subscribes to
            // more, or asks again for a cluster it rebuilt): always answer, or a cluster can
            // stay warming forever. Asking for fewer needs no answer when clusters are
            // only ever removed in a step of their own (make before break); pushed all at
            // once, a removal can come with a rebuilt cluster that waits for its endpoints.
            ts.force_send = true;
        }
        if !same_names
            && !wildcard
            && let Some(ts) = self.types.get_mut(&type_url)
            && let Some(acked) = ts.acked.as_mut()
        {
            // Envoy forgets what it stops asking for by name.
            let forgotten: Vec<String> = acked
                .keys()
                .filter(|name| !ts.names.contains(name))
                .cloned()
                .collect();
            for name in forgotten {
                acked.remove(&name);
            }
        }
        self.pump(now)
    }

    pub fn on_delta_request(
        &mut self,
        request: DeltaDiscoveryRequest,
        now: Instant,
    ) -> Vec<Response> {
        self.remember_node(request.node);
        let type_url = request.type_url;
        let first = !self.types.get(&type_url).is_some_and(|t| t.requested);
        let ts = self.types.entry(type_url.clone()).or_default();
        if first
            || !request.resource_names_subscribe.is_empty()
            || !request.resource_names_unsubscribe.is_empty()
        {
            ts.unsettle();
        }
        if first {
            ts.requested = true;
            // Legacy wildcard: a first request that names nothing.
            ts.wildcard = request.resource_names_subscribe.is_empty();
            ts.force_send = true;
            if !request.initial_resource_versions.is_empty() {
                let held: Entries = request
                    .initial_resource_versions
                    .into_iter()
                    .map(|(name, version)| {
                        let entry = Arc::new(Resource::held(name.clone(), version));
                        (name, entry)
                    })
                    .collect();
                // Keep what the node already has in the view, so nothing it may still route
                // to is removed before the route step.
                let view = self.view.entry(type_url.clone()).or_default();
                for (name, entry) in &held {
                    if !view.contains_key(name) {
                        view.insert(name.clone(), entry.clone());
                    }
                }
                ts.acked = Some(held);
            }
        }
        for name in request.resource_names_subscribe {
            if name == "*" {
                ts.wildcard = true;
            } else {
                ts.names.insert(name);
            }
        }
        for name in request.resource_names_unsubscribe {
            if name == "*" {
                ts.wildcard = false;
            } else {
                ts.names.remove(&name);
                // The node forgets what it unsubscribes from.
                if let Some(acked) = ts.acked.as_mut()
                    && !ts.wildcard
                {
                    acked.remove(&name);
                }
            }
        }
        if let Some(view) = self.view.get(&type_url) {
            ts.names.share(view);
        }
        let nonce = request.response_nonce;
        if !nonce.is_empty() {
            if ts.pending.as_ref().is_some_and(|p| p.nonce == nonce) {
                match request.error_detail {
                    Some(status) => self.nack(&type_url, status.message),
                    None => self.ack(&type_url, now),
                }
            } else {
                self.events.push(Event::StaleNonce { type_url, nonce });
            }
        }
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
        self.desired = Some(
            match self.node.as_ref().and_then(localize::listen_address) {
                Some(address) => Arc::new(localize::bind_listeners(&source, &address)),
                None => source,
            },
        );
    }

    fn ack(&mut self, type_url: &str, now: Instant) {
        let Some(ts) = self.types.get_mut(type_url) else {
            return;
        };
        let Some(pending) = ts.pending.take() else {
            return;
        };
        ts.acked = Some(pending.wanted.clone());
        ts.settled = ts.unchanged_since_sent;
        ts.acked_version = Some(pending.version.clone());
        ts.acked_at = Some(now);
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
        let info = NackInfo {
            nonce: pending.nonce.clone(),
            version: pending.version.clone(),
            error: error.clone(),
        };
        ts.last_nack = Some(info);
        // Blocked on the snapshot the refused response came from: one that changed since
        // (the refusal itself may be why) is planned at once.
        self.blocked_on = Some(pending.desired.clone());
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
        // Each pass either sends something (and waits for ACKs) or completes a step whose
        // changes this node does not subscribe to; three steps at most.
        for _ in 0..4 {
            let idle = self.types.values().all(|t| t.pending.is_none());
            let may_plan = self.blocked_on.as_deref() != Some(desired.version())
                && (idle || self.ordering == Ordering::AllAtOnce);
            let mut changed = false;
            if may_plan {
                self.blocked_on = None;
                changed = advance(&mut self.view, &desired, self.ordering);
                if changed {
                    for ts in self.types.values_mut() {
                        ts.unsettle();
                    }
                }
            }
            let sent = self.send_ready(&desired, &mut out);
            if sent > 0 || !changed {
                break;
            }
        }
        out
    }

    /// Sends every requested type whose wanted content differs from what the node holds,
    /// in make-before-break type order. At most one response per type is in flight.
    fn send_ready(&mut self, desired: &Snapshot, out: &mut Vec<Response>) -> usize {
        let order: Vec<String> = ALL_TYPES
            .iter()
            .map(|t| t.to_string())
            .chain(
                self.types
                    .keys()
                    .filter(|t| !ALL_TYPES.contains(&t.as_str()))
                    .cloned(),
            )
            .collect();
        let mut sent = 0;
        for type_url in order {
            let Some(ts) = self.types.get(&type_url) else {
                continue;
            };
            if !ts.requested || ts.pending.is_some() || self.withheld(&type_url, desired) {
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

    fn respond(&mut self, type_url: &str, wanted: Entries, desired: &Snapshot) -> Response {
        self.next_nonce += 1;
        let nonce = self.next_nonce.to_string();
        let version = desired.version_of(type_url, &wanted);
        let Some(ts) = self.types.get(type_url) else {
            unreachable!("respond is only called for tracked types");
        };
        let (response, resources, removed) = match self.protocol {
            Protocol::Sotw => {
                // Held entries exist only in delta sessions; a SotW response could not carry one.
                let resources: Vec<_> = wanted
                    .values()
                    .filter(|r| r.has_content())
                    .cloned()
                    .collect();
                let count = resources.len();
                let response = Response::Sotw(SotwResponse {
                    version_info: version.clone(),
                    resources,
                    type_url: type_url.to_string(),
                    nonce: nonce.clone(),
                });
                (response, count, 0)
            }
            Protocol::Delta => {
                let empty = Entries::new();
                let held = ts.acked.as_ref().unwrap_or(&empty);
                // Only what differs: a diff of two maps that share most of their nodes.
                let mut resources: Vec<Arc<Resource>> = Vec::new();
                let mut removed: Vec<String> = Vec::new();
                for item in held.diff(&wanted) {
                    match item {
                        DiffItem::Add(_, new) => resources.push(new.clone()),
                        DiffItem::Update { old, new } if old.1.version != new.1.version => {
                            resources.push(new.1.clone())
                        }
                        DiffItem::Update { .. } => {}
                        DiffItem::Remove(name, _) => removed.push(name.clone()),
                    }
                }
                resources.retain(|r| r.has_content());
                let counts = (resources.len(), removed.len());
                let response = Response::Delta(DeltaResponse {
                    system_version_info: desired.version().to_string(),
                    resources,
                    type_url: type_url.to_string(),
                    removed_resources: removed,
                    nonce: nonce.clone(),
                });
                (response, counts.0, counts.1)
            }
        };
        let Some(ts) = self.types.get_mut(type_url) else {
            unreachable!("respond is only called for tracked types");
        };
        ts.force_send = false;
        ts.unchanged_since_sent = true;
        ts.last_nonce = Some(nonce.clone());
        ts.pending = Some(Pending {
            nonce: nonce.clone(),
            version: version.clone(),
            desired: desired.version().to_string(),
            wanted,
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
        view_is_desired
            && self.types.iter().all(|(type_url, ts)| {
                !ts.requested
                    || ts.settled
                    || ts
                        .acked
                        .as_ref()
                        .is_some_and(|a| same_versions(a, &self.wanted(type_url, ts)))
            })
    }

    pub fn status(&self) -> SessionStatus {
        let types = self
            .types
            .iter()
            .filter(|(_, ts)| ts.requested)
            .map(|(type_url, ts)| {
                let status = TypeStatus {
                    subscribed: if ts.wildcard {
                        "*".to_string()
                    } else {
                        ts.names.len().to_string()
                    },
                    acked_version: ts.acked_version.clone(),
                    acked_resources: ts.acked.as_ref().map_or(0, Entries::len),
                    pending_nonce: ts.pending.as_ref().map(|p| p.nonce.clone()),
                    last_nack: ts.last_nack.clone(),
                };
                (short_type(type_url).to_string(), status)
            })
            .collect();
        SessionStatus {
            protocol: self.protocol,
            desired_version: self
                .desired_source
                .as_ref()
                .map(|d| d.version().to_string()),
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
    pub synced: bool,
    pub blocked_by_nack: bool,
    pub types: BTreeMap<String, TypeStatus>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TypeStatus {
    /// "*" for wildcard, else the number of names subscribed.
    pub subscribed: String,
    pub acked_version: Option<String>,
    pub acked_resources: usize,
    pub pending_nonce: Option<String>,
    pub last_nack: Option<NackInfo>,
}

/// The names of `entries` that are not in `names`. One ordered walk of both: Envoy
/// subscribes to every cluster's endpoints by name, and this runs on every message.
fn unsubscribed<'e>(names: &Names, entries: &'e Entries) -> Vec<&'e String> {
    if names.are_keys_of(entries) {
        return Vec::new();
    }
    let mut names = names.iter().peekable();
    let mut out = Vec::new();
    for key in entries.keys() {
        while names.next_if(|name| *name < key).is_some() {}
        if names.next_if(|name| *name == key).is_none() {
            out.push(key);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::snapshot::{CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET};
    use envoy_types::pb::google::protobuf::Any;
    use envoy_types::pb::google::rpc::Status;

    fn res(type_url: &str, name: &str, content: &str) -> Resource {
        Resource::new(
            name,
            Any {
                type_url: type_url.to_string(),
                value: format!("{name}:{content}").into_bytes(),
            },
        )
    }

    /// A route to `cluster`, with the cluster and its endpoints.
    fn switch_to(cluster: &str) -> Arc<Snapshot> {
        Arc::new(Snapshot::new([
            res(CLUSTER, cluster, "c"),
            res(ENDPOINT, cluster, "e"),
            res(LISTENER, "http", "l"),
            res(ROUTE, "switchyard", &format!("to {cluster}")),
        ]))
    }

    fn names(response: &Response) -> (String, Vec<String>, Vec<String>) {
        match response {
            Response::Sotw(r) => (
                short_type(&r.type_url).to_string(),
                r.resources
                    .iter()
                    .map(|a| String::from_utf8_lossy(&a.body.value).to_string())
                    .collect(),
                vec![],
            ),
            Response::Delta(r) => (
                short_type(&r.type_url).to_string(),
                r.resources.iter().map(|a| a.name.clone()).collect(),
                r.removed_resources.clone(),
            ),
        }
    }

    fn nonce(response: &Response) -> String {
        response.nonce().to_string()
    }

    fn type_of(response: &Response) -> String {
        response.type_url().to_string()
    }

    fn sotw(type_url: &str, names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url.to_string(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            response_nonce: nonce.to_string(),
            ..Default::default()
        }
    }

    fn delta(type_url: &str, subscribe: &[&str], nonce: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url.to_string(),
            resource_names_subscribe: subscribe.iter().map(|n| n.to_string()).collect(),
            response_nonce: nonce.to_string(),
            ..Default::default()
        }
    }

    /// A SotW node that has subscribed to everything and holds `cluster`'s snapshot.
    fn synced_sotw(cluster: &str, ordering: Ordering) -> (Session, BTreeMap<String, String>) {
        let now = Instant::now();
        let mut s = Session::new(Protocol::Sotw, ordering);
        let mut nonces = BTreeMap::new();
        assert!(s.on_sotw_request(sotw(CLUSTER, &[], ""), now).is_empty());
        assert!(s.on_sotw_request(sotw(LISTENER, &[], ""), now).is_empty());
        let mut pending = s.set_desired(switch_to(cluster), now);
        // Act like Envoy: subscribe to what arrives, ACK everything.
        while let Some(r) = pending.pop() {
            let t = type_of(&r);
            let n = nonce(&r);
            nonces.insert(t.clone(), n.clone());
            let names: Vec<&str> = match t.as_str() {
                CLUSTER | LISTENER => vec![],
                _ => vec![cluster],
            };
            let names = if t == ROUTE {
                vec!["switchyard"]
            } else {
                names
            };
            pending.extend(s.on_sotw_request(sotw(&t, &names, &n), now));
            if t == CLUSTER {
                pending.extend(s.on_sotw_request(sotw(ENDPOINT, &[cluster], ""), now));
            }
            if t == LISTENER && !nonces.contains_key(ROUTE) {
                pending.extend(s.on_sotw_request(sotw(ROUTE, &["switchyard"], ""), now));
            }
        }
        assert!(s.is_synced(), "{:#?}", s.status());
        (s, nonces)
    }

    #[test]
    fn a_subscription_to_every_name_of_the_view_shares_the_view() {
        let (s, _) = synced_sotw("a", Ordering::MakeBeforeBreak);
        for type_url in [ENDPOINT, ROUTE] {
            let names = &s.types[type_url].names;
            assert!(
                names.are_keys_of(&s.view[type_url]),
                "{type_url}: {names:?}"
            );
        }
    }

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
    fn nothing_is_answered_before_the_gate_opens() {
        let now = Instant::now();
        let mut s = Session::new(Protocol::Sotw, Ordering::MakeBeforeBreak);
        assert!(s.on_sotw_request(sotw(CLUSTER, &[], ""), now).is_empty());
        assert!(s.on_sotw_request(sotw(LISTENER, &[], ""), now).is_empty());
        let out = s.set_desired(switch_to("a"), now);
        let kinds: Vec<_> = out.iter().map(|r| names(r).0).collect();
        // Clusters first; listeners wait for the route step (an empty answer would make
        // a reconnecting Envoy drop the listeners it has).
        assert_eq!(kinds, ["Cluster"]);
    }

    #[test]
    fn sotw_switch_is_make_before_break() {
        let now = Instant::now();
        let (mut s, nonces) = synced_sotw("a", Ordering::MakeBeforeBreak);
        let out = s.set_desired(switch_to("b"), now);
        assert_eq!(out.len(), 1, "only CDS first: {out:?}");
        assert_eq!(
            names(&out[0]).1,
            ["a:c", "b:c"],
            "make: old and new clusters"
        );
        let cds = nonce(&out[0]);
        // Envoy subscribes to b's endpoints (previous EDS nonce) before ACKing CDS.
        let out = s.on_sotw_request(sotw(ENDPOINT, &["a", "b"], &nonces[ENDPOINT]), now);
        assert_eq!(names(&out[0]).1, ["a:e", "b:e"]);
        let eds = nonce(&out[0]);
        assert!(
            s.on_sotw_request(sotw(CLUSTER, &[], &cds), now).is_empty(),
            "EDS not ACKed yet"
        );
        let out = s.on_sotw_request(sotw(ENDPOINT, &["a", "b"], &eds), now);
        assert_eq!(out.len(), 1);
        assert_eq!(
            names(&out[0]),
            (
                "RouteConfiguration".into(),
                vec!["switchyard:to b".into()],
                vec![]
            )
        );
        let rds = nonce(&out[0]);
        let out = s.on_sotw_request(sotw(ROUTE, &["switchyard"], &rds), now);
        assert_eq!(
            names(&out[0]).1,
            ["b:c"],
            "break: old cluster leaves after the route ACK"
        );
        assert_eq!(
            out.len(),
            1,
            "no EDS only to leave a's endpoints out: {out:?}"
        );
        let cds = nonce(&out[0]);
        assert!(s.on_sotw_request(sotw(CLUSTER, &[], &cds), now).is_empty());
        assert!(!s.is_synced(), "the node still holds a's endpoints");
        // With the cluster gone, Envoy stops asking for its endpoints: nothing to answer.
        assert!(
            s.on_sotw_request(sotw(ENDPOINT, &["b"], &eds), now)
                .is_empty()
        );
        assert!(s.is_synced());
    }

    #[test]
    fn a_newer_snapshot_mid_step_waits_for_acks_and_keeps_every_cluster() {
        let now = Instant::now();
        let (mut s, nonces) = synced_sotw("a", Ordering::MakeBeforeBreak);
        let out = s.set_desired(switch_to("b"), now);
        let cds = nonce(&out[0]);
        // c arrives before b's step completed: nothing is sent until the ACK.
        assert!(s.set_desired(switch_to("c"), now).is_empty());
        let out = s.on_sotw_request(sotw(ENDPOINT, &["a", "b"], &nonces[ENDPOINT]), now);
        let eds = nonce(&out[0]);
        let out = s.on_sotw_request(sotw(ENDPOINT, &["a", "b"], &eds), now);
        assert!(out.is_empty(), "CDS still pending");
        let out = s.on_sotw_request(sotw(CLUSTER, &[], &cds), now);
        assert_eq!(
            names(&out[0]).1,
            ["a:c", "b:c", "c:c"],
            "a stays: live routes use it"
        );
    }

    #[test]
    fn nack_keeps_last_good_config_and_stops_the_sequence() {
        let now = Instant::now();
        let (mut s, _) = synced_sotw("a", Ordering::MakeBeforeBreak);
        let out = s.set_desired(switch_to("b"), now);
        let cds = nonce(&out[0]);
        let mut nack = sotw(CLUSTER, &[], &cds);
        nack.error_detail = Some(Status {
            code: 3,
            message: "bad cluster b".into(),
            details: vec![],
        });
        let out = s.on_sotw_request(nack, now);
        assert!(
            out.is_empty(),
            "no route step, no retry of the same content: {out:?}"
        );
        let status = s.status();
        assert!(status.blocked_by_nack);
        assert_eq!(
            status.types["Cluster"]
                .last_nack
                .as_ref()
                .map(|n| n.error.as_str()),
            Some("bad cluster b")
        );
        assert_eq!(status.types["RouteConfiguration"].acked_resources, 1);
        // A fixed snapshot moves on.
        let out = s.set_desired(switch_to("c"), now);
        assert_eq!(names(&out[0]).1, ["a:c", "c:c"]);
    }

    #[test]
    fn a_nack_of_a_snapshot_already_replaced_does_not_block_its_successor() {
        let now = Instant::now();
        let (mut s, _) = synced_sotw("a", Ordering::MakeBeforeBreak);
        let out = s.set_desired(switch_to("b"), now);
        let cds = nonce(&out[0]);
        // The snapshot changes while Envoy still judges the response made from "b".
        let out = s.set_desired(switch_to("c"), now);
        assert!(out.is_empty(), "one response in flight per type: {out:?}");
        let mut nack = sotw(CLUSTER, &[], &cds);
        nack.error_detail = Some(Status {
            code: 3,
            message: "bad cluster b".into(),
            details: vec![],
        });
        let out = s.on_sotw_request(nack, now);
        assert!(
            !s.status().blocked_by_nack,
            "blocked on \"b\", which is gone"
        );
        assert_eq!(names(&out[0]).1, ["a:c", "c:c"], "\"c\" is sent at once");
    }

    #[test]
    fn a_refused_route_configuration_replaced_before_the_nack_is_sent_again() {
        let now = Instant::now();
        let (mut s, _) = synced_sotw("a", Ordering::MakeBeforeBreak);
        let routes = |text: &str| {
            Arc::new(Snapshot::new([
                res(CLUSTER, "a", "c"),
                res(ENDPOINT, "a", "e"),
                res(LISTENER, "http", "l"),
                res(ROUTE, "switchyard", text),
            ]))
        };
        let out = s.set_desired(routes("bad"), now);
        assert_eq!(names(&out[0]).1, ["switchyard:bad"]);
        let rds = nonce(&out[0]);
        assert!(s.set_desired(routes("fixed"), now).is_empty());
        let mut nack = sotw(ROUTE, &["switchyard"], &rds);
        nack.error_detail = Some(Status {
            code: 3,
            message: "bad route".into(),
            details: vec![],
        });
        let out = s.on_sotw_request(nack, now);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(names(&out[0]).1, ["switchyard:fixed"]);
    }

    #[test]
    fn stale_nonces_are_ignored() {
        let now = Instant::now();
        let (mut s, _) = synced_sotw("a", Ordering::MakeBeforeBreak);
        let out = s.set_desired(switch_to("b"), now);
        assert_eq!(out.len(), 1);
        let out = s.on_sotw_request(sotw(CLUSTER, &[], "999"), now);
        assert!(out.is_empty());
        assert!(matches!(
            s.take_events().last(),
            Some(Event::StaleNonce { .. })
        ));
    }

    #[test]
    fn sotw_rerequest_on_last_nonce_is_answered_even_if_unchanged() {
        let now = Instant::now();
        let (mut s, nonces) = synced_sotw("a", Ordering::MakeBeforeBreak);
        let out = s.on_sotw_request(sotw(ENDPOINT, &["a"], &nonces[ENDPOINT]), now);
        assert_eq!(names(&out[0]).1, ["a:e"]);
    }

    #[test]
    fn all_at_once_pushes_routes_before_clusters_are_acked() {
        let now = Instant::now();
        let (mut s, _) = synced_sotw("a", Ordering::AllAtOnce);
        let out = s.set_desired(switch_to("b"), now);
        let kinds: Vec<_> = out.iter().map(|r| names(r).0).collect();
        assert_eq!(
            kinds,
            ["Cluster", "ClusterLoadAssignment", "RouteConfiguration"]
        );
        assert_eq!(names(&out[0]).1, ["b:c"], "old cluster removed at once");
    }

    #[test]
    fn delta_sends_changes_and_removals_in_order() {
        let now = Instant::now();
        let mut s = Session::new(Protocol::Delta, Ordering::MakeBeforeBreak);
        s.on_delta_request(delta(CLUSTER, &[], ""), now);
        s.on_delta_request(delta(LISTENER, &[], ""), now);
        let out = s.set_desired(switch_to("a"), now);
        let cds = nonce(&out[0]);
        let lds = nonce(&out[1]);
        let out = s.on_delta_request(delta(ENDPOINT, &["a"], ""), now);
        let eds = nonce(&out[0]);
        s.on_delta_request(delta(CLUSTER, &[], &cds), now);
        s.on_delta_request(delta(LISTENER, &[], &lds), now);
        let out = s.on_delta_request(delta(ENDPOINT, &[], &eds), now);
        assert_eq!(names(&out[0]).0, "Listener");
        let lds = nonce(&out[0]);
        let out = s.on_delta_request(delta(ROUTE, &["switchyard"], ""), now);
        let rds = nonce(&out[0]);
        s.on_delta_request(delta(LISTENER, &[], &lds), now);
        assert!(s.on_delta_request(delta(ROUTE, &[], &rds), now).is_empty());
        assert!(s.is_synced(), "{:#?}", s.status());

        let out = s.set_desired(switch_to("b"), now);
        assert_eq!(
            names(&out[0]),
            ("Cluster".into(), vec!["b".into()], vec![]),
            "only the new one"
        );
        let cds = nonce(&out[0]);
        let mut sub = delta(ENDPOINT, &["b"], "");
        sub.resource_names_subscribe = vec!["b".into()];
        let out = s.on_delta_request(sub, now);
        let eds = nonce(&out[0]);
        s.on_delta_request(delta(CLUSTER, &[], &cds), now);
        let out = s.on_delta_request(delta(ENDPOINT, &[], &eds), now);
        assert_eq!(names(&out[0]).0, "RouteConfiguration");
        let rds = nonce(&out[0]);
        let out = s.on_delta_request(delta(ROUTE, &[], &rds), now);
        assert_eq!(names(&out[0]), ("Cluster".into(), vec![], vec!["a".into()]));
    }

    #[test]
    fn delta_reconnect_keeps_what_the_node_has_until_routes_move() {
        let now = Instant::now();
        let a = switch_to("a");
        let mut s = Session::new(Protocol::Delta, Ordering::MakeBeforeBreak);
        let mut req = delta(CLUSTER, &[], "");
        req.initial_resource_versions = [(
            "a".to_string(),
            a.resources(CLUSTER).unwrap()["a"].version.clone(),
        )]
        .into();
        s.on_delta_request(req, now);
        let out = s.set_desired(switch_to("b"), now);
        assert_eq!(
            names(&out[0]),
            ("Cluster".into(), vec!["b".into()], vec![]),
            "a is not removed yet"
        );

        // Unchanged resources are not sent again.
        let mut s = Session::new(Protocol::Delta, Ordering::MakeBeforeBreak);
        let mut req = delta(CLUSTER, &[], "");
        req.initial_resource_versions = [(
            "a".to_string(),
            a.resources(CLUSTER).unwrap()["a"].version.clone(),
        )]
        .into();
        s.on_delta_request(req, now);
        let out = s.set_desired(a, now);
        assert_eq!(names(&out[0]), ("Cluster".into(), vec![], vec![]));
    }

    /// What a server instance serves: http, https and probe listeners with their route
    /// configurations, a cluster with endpoints for each of `clusters`, a secret.
    fn full_config(clusters: &[&str]) -> Arc<Snapshot> {
        let mut resources = vec![res(SECRET, "cert", "s")];
        for c in clusters {
            resources.push(res(CLUSTER, c, "c"));
            resources.push(res(ENDPOINT, c, "e"));
        }
        for l in ["http", "https", "probe"] {
            resources.push(res(LISTENER, l, "l"));
            resources.push(res(ROUTE, l, &format!("to {}", clusters.join(","))));
        }
        Arc::new(Snapshot::new(resources))
    }

    /// The names Envoy asks for by type when it holds `snapshot` (none: wildcard).
    fn subscription(snapshot: &Snapshot, type_url: &str) -> Vec<String> {
        if snapshot::is_wildcard_type(type_url) {
            return Vec::new();
        }
        snapshot
            .resources(type_url)
            .map(|rs| rs.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The requests a SotW Envoy sends when its stream comes back, in its order: every
    /// type it holds, with the version it accepted from the previous server instance.
    fn sotw_reconnect(held: &Snapshot) -> Vec<DiscoveryRequest> {
        [CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET]
            .iter()
            .map(|t| DiscoveryRequest {
                type_url: t.to_string(),
                version_info: held.type_version(t),
                resource_names: subscription(held, t),
                ..Default::default()
            })
            .collect()
    }

    /// Acts like a SotW Envoy holding `snapshot`: ACKs every response with the names it
    /// holds. Every listener or route response must be the whole type, and come after the
    /// clusters, endpoints and secrets of this stream were ACKed (I1). Returns the types
    /// answered, in order.
    fn drive_sotw(
        s: &mut Session,
        first: Vec<Response>,
        held: &Snapshot,
        snapshot: &Snapshot,
    ) -> Vec<String> {
        let now = Instant::now();
        let mut clusters = subscription(held, ENDPOINT);
        let mut nonces = BTreeMap::new();
        let mut acked = std::collections::BTreeSet::new();
        let mut answered = Vec::new();
        let mut queue: std::collections::VecDeque<Response> = first.into();
        while let Some(r) = queue.pop_front() {
            let Response::Sotw(sotw) = &r else {
                panic!("a SotW session sent {r:?}");
            };
            let t = sotw.type_url.clone();
            let full = snapshot.resources(&t).map_or(0, |rs| rs.len());
            // (Endpoints follow the clusters Envoy holds: checked through them.)
            assert!(
                t == ENDPOINT || sotw.resources.len() >= full,
                "{}: {} of {full} resources: a SotW response is the whole set, Envoy drops the rest",
                short_type(&t),
                sotw.resources.len()
            );
            if t == LISTENER || t == ROUTE {
                for needed in [CLUSTER, ENDPOINT, SECRET] {
                    assert!(
                        acked.contains(needed),
                        "{} before {} was ACKed",
                        short_type(&t),
                        short_type(needed)
                    );
                }
            }
            answered.push(short_type(&t).to_string());
            let names = if t == ENDPOINT {
                clusters.clone()
            } else {
                subscription(snapshot, &t)
            };
            let ack = DiscoveryRequest {
                type_url: t.clone(),
                version_info: sotw.version_info.clone(),
                resource_names: names,
                response_nonce: sotw.nonce.clone(),
                ..Default::default()
            };
            queue.extend(s.on_sotw_request(ack, now));
            if t == CLUSTER {
                // Envoy asks for the endpoints of the clusters it now has.
                clusters = sotw.resources.iter().map(|r| r.name.clone()).collect();
                let eds = DiscoveryRequest {
                    type_url: ENDPOINT.to_string(),
                    resource_names: clusters.clone(),
                    response_nonce: nonces.get(ENDPOINT).cloned().unwrap_or_default(),
                    ..Default::default()
                };
                queue.extend(s.on_sotw_request(eds, now));
            }
            nonces.insert(t.clone(), sotw.nonce.clone());
            acked.insert(t);
        }
        answered
    }

    #[test]
    fn sotw_reconnect_before_the_gate_opens_withholds_listeners_and_routes() {
        let now = Instant::now();
        let config = full_config(&["a", "b"]);
        let mut s = Session::new(Protocol::Sotw, Ordering::MakeBeforeBreak);
        for request in sotw_reconnect(&config) {
            assert!(s.on_sotw_request(request, now).is_empty(), "gate closed");
        }
        let out = s.set_desired(config.clone(), now);
        let kinds: Vec<_> = out.iter().map(|r| names(r).0).collect();
        assert_eq!(
            kinds,
            ["Cluster", "ClusterLoadAssignment", "Secret"],
            "no listeners or routes before their clusters are ACKed"
        );
        let answered = drive_sotw(&mut s, out, &config, &config);
        assert!(answered.contains(&"Listener".to_string()), "{answered:?}");
        assert!(answered.contains(&"RouteConfiguration".into()));
        assert!(s.is_synced(), "{:#?}", s.status());
    }

    #[test]
    fn sotw_reconnect_after_the_gate_opened_withholds_listeners_and_routes() {
        let now = Instant::now();
        let config = full_config(&["a", "b"]);
        let mut s = Session::new(Protocol::Sotw, Ordering::MakeBeforeBreak);
        assert!(
            s.set_desired(config.clone(), now).is_empty(),
            "no stream yet"
        );
        let mut out = Vec::new();
        for request in sotw_reconnect(&config) {
            out.extend(s.on_sotw_request(request, now));
        }
        let kinds: Vec<_> = out.iter().map(|r| names(r).0).collect();
        assert_eq!(kinds, ["Cluster", "ClusterLoadAssignment", "Secret"]);
        drive_sotw(&mut s, out, &config, &config);
        assert!(s.is_synced(), "{:#?}", s.status());
    }

    #[test]
    fn sotw_reconnect_to_a_changed_config_moves_make_before_break() {
        let now = Instant::now();
        let held = full_config(&["a", "b"]);
        let config = full_config(&["b", "c"]);
        let mut s = Session::new(Protocol::Sotw, Ordering::MakeBeforeBreak);
        for request in sotw_reconnect(&held) {
            assert!(s.on_sotw_request(request, now).is_empty());
        }
        let out = s.set_desired(config.clone(), now);
        let kinds: Vec<_> = out.iter().map(|r| names(r).0).collect();
        assert_eq!(kinds, ["Cluster", "ClusterLoadAssignment", "Secret"]);
        drive_sotw(&mut s, out, &held, &config);
        assert!(s.is_synced(), "{:#?}", s.status());
    }

    /// The requests a delta Envoy sends when its stream comes back: every type, with the
    /// versions it holds from the previous server instance.
    fn delta_reconnect(held: &Snapshot) -> Vec<DeltaDiscoveryRequest> {
        [CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET]
            .iter()
            .map(|t| DeltaDiscoveryRequest {
                type_url: t.to_string(),
                resource_names_subscribe: subscription(held, t),
                initial_resource_versions: held
                    .resources(t)
                    .into_iter()
                    .flat_map(|rs| rs.values())
                    .map(|r| (r.name.clone(), r.version.clone()))
                    .collect(),
                ..Default::default()
            })
            .collect()
    }

    /// Acts like a delta Envoy: ACKs every response, subscribes to the endpoints of new
    /// clusters. Nothing is removed before the routes that may use it moved (I2), routes
    /// change only after clusters and endpoints were ACKed (I1). Returns every response as
    /// (type, changed, removed).
    fn drive_delta(
        s: &mut Session,
        first: Vec<Response>,
    ) -> Vec<(String, Vec<String>, Vec<String>)> {
        let now = Instant::now();
        let mut acked = std::collections::BTreeSet::new();
        let mut log = Vec::new();
        let mut queue: std::collections::VecDeque<Response> = first.into();
        while let Some(r) = queue.pop_front() {
            let (kind, changed, removed) = names(&r);
            let t = type_of(&r);
            if t == ROUTE && !changed.is_empty() {
                assert!(
                    acked.contains(CLUSTER) && acked.contains(ENDPOINT),
                    "{log:?}"
                );
            }
            if !removed.is_empty() {
                assert!(
                    log.iter()
                        .any(|(k, c, _): &(String, Vec<String>, Vec<String>)| k
                            == "RouteConfiguration"
                            && !c.is_empty())
                        && acked.contains(ROUTE),
                    "{kind} removed {removed:?} before the routes moved: {log:?}"
                );
            }
            if t == CLUSTER && !changed.is_empty() {
                let mut sub = delta(ENDPOINT, &[], "");
                sub.resource_names_subscribe = changed.clone();
                queue.extend(s.on_delta_request(sub, now));
            }
            log.push((kind, changed, removed));
            queue.extend(s.on_delta_request(delta(&t, &[], &nonce(&r)), now));
            acked.insert(t);
        }
        log
    }

    #[test]
    fn delta_reconnect_to_the_same_config_sends_nothing_new_and_removes_nothing() {
        let now = Instant::now();
        let config = full_config(&["a", "b"]);
        let mut s = Session::new(Protocol::Delta, Ordering::MakeBeforeBreak);
        for request in delta_reconnect(&config) {
            assert!(s.on_delta_request(request, now).is_empty());
        }
        let out = s.set_desired(config, now);
        for r in &out {
            let (kind, changed, removed) = names(r);
            assert!(
                changed.is_empty() && removed.is_empty(),
                "{kind}: {changed:?} {removed:?}"
            );
        }
        drive_delta(&mut s, out);
        assert!(s.is_synced(), "{:#?}", s.status());
    }

    #[test]
    fn delta_reconnect_to_a_changed_config_removes_only_after_the_routes_moved() {
        let now = Instant::now();
        let held = full_config(&["a", "b"]);
        let config = full_config(&["b", "c"]);
        let mut s = Session::new(Protocol::Delta, Ordering::MakeBeforeBreak);
        let mut out = Vec::new();
        for request in delta_reconnect(&held) {
            out.extend(s.on_delta_request(request, now));
        }
        assert!(out.is_empty());
        let out = s.set_desired(config, now);
        for r in &out {
            assert!(
                names(r).2.is_empty(),
                "a first response removes nothing: {r:?}"
            );
        }
        let log = drive_delta(&mut s, out);
        assert!(
            log.iter()
                .any(|(k, _, removed)| k == "Cluster" && removed == &["a"]),
            "{log:?}"
        );
        assert!(s.is_synced(), "{:#?}", s.status());
    }

    #[test]
    fn delta_reconnect_after_the_gate_opened_removes_only_after_the_routes_moved() {
        let now = Instant::now();
        let held = full_config(&["a", "b"]);
        let config = full_config(&["b", "c"]);
        let mut s = Session::new(Protocol::Delta, Ordering::MakeBeforeBreak);
        assert!(s.set_desired(config, now).is_empty(), "no request yet");
        let mut out = Vec::new();
        for request in delta_reconnect(&held) {
            out.extend(s.on_delta_request(request, now));
        }
        for r in &out {
            assert!(
                names(r).2.is_empty(),
                "a first response removes nothing: {r:?}"
            );
            let (kind, changed, _) = names(r);
            assert!(
                kind != "RouteConfiguration" || changed.is_empty(),
                "routes changed before the clusters: {r:?}"
            );
        }
        let log = drive_delta(&mut s, out);
        assert!(
            log.iter()
                .any(|(k, _, removed)| k == "Cluster" && removed == &["a"]),
            "{log:?}"
        );
        assert!(s.is_synced(), "{:#?}", s.status());
    }
}
