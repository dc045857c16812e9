//! What a stream does for an Envoy that holds configuration from before it: one that
//! reconnects after a restart of the server, or after changes it missed, to this replica
//! or another. What it holds stays until the routes that may use it are replaced (I2).

use super::{Entries, Event, Protocol, Response, Session};
use crate::xds::planner::{holds_exactly, merged};
use crate::xds::snapshot::{CLUSTER, ENDPOINT, LISTENER, ROUTE, Snapshot, VIRTUAL_HOST};

impl Session {
    /// Before this stream has asked for clusters, only the endpoints of clusters it
    /// holds go out: an Envoy that reconnects while a cluster it got before is warming
    /// holds its cluster request back until that cluster has its endpoints, and would
    /// otherwise wait for its initial-fetch timeout (15 s) for them. Endpoints are what a
    /// make step sends; they remove nothing and no route names them.
    pub(super) fn serve_endpoints_before_clusters(
        &mut self,
        desired: &Snapshot,
        out: &mut Vec<Response>,
    ) {
        let Some(endpoints) = desired.resources(ENDPOINT) else {
            return;
        };
        if !self.has_requested(ENDPOINT) || self.blocked_on.as_deref() == Some(desired.version()) {
            return;
        }
        let view = self.view.entry(ENDPOINT.to_string()).or_default();
        let next = merged(view, endpoints);
        if !holds_exactly(Some(view), &next) {
            *view = next;
            if let Some(ts) = self.types.get_mut(ENDPOINT) {
                ts.unsettle();
            }
        }
        self.send_ready_of(desired, out, |type_url| type_url == ENDPOINT);
    }

    /// Whether the break step may come: nothing can be removed from a node that holds
    /// resources from before this stream until every type that refers to others
    /// (listeners, routes, and for delta, virtual hosts) the snapshot has has been asked
    /// for and answered on this stream, with nothing of it in flight. A reconnecting
    /// Envoy asks for each type it holds, one request after the other, clusters first;
    /// until they are all in, the route step passes for the types not asked for yet, and
    /// the break step would remove clusters that the routes it still holds send to, in
    /// the very response that answers the late request. (A SotW Envoy is served whole
    /// route configurations, and never asks for virtual hosts.)
    pub(super) fn may_break(&self, desired: &Snapshot) -> bool {
        if !self.held_before {
            return true;
        }
        let referrers: &[&str] = match self.protocol {
            Protocol::Sotw => &[LISTENER, ROUTE],
            Protocol::Delta => &[LISTENER, ROUTE, VIRTUAL_HOST],
        };
        referrers.iter().all(|type_url| {
            let answered = self
                .types
                .get(*type_url)
                .is_some_and(|t| t.requested && t.pending.is_none() && t.acked_version.is_some());
            desired.resources(type_url).is_none_or(|r| r.is_empty()) || answered
        })
    }

    /// What a reconnecting node says it holds of one type (`held`): kept in the view, so
    /// that nothing it may still route to is removed before the route step.
    pub(super) fn hold(&mut self, type_url: &str, held: Entries) {
        self.held_before = true;
        let view = self.view.entry(type_url.to_string()).or_default();
        for (name, entry) in &held {
            if !view.contains_key(name) {
                view.insert(name.clone(), entry.clone());
            }
        }
        if let Some(ts) = self.types.get_mut(type_url) {
            ts.acked = Some(held);
        }
    }

    /// A reconnecting SotW node holds `held` of `type_url`, as recalled from the version
    /// it names (a SotW request names only that).
    pub(super) fn recall_held(&mut self, type_url: &str, held: Entries) {
        self.types.entry(type_url.to_string()).or_default();
        self.hold(type_url, held);
    }

    /// The clusters of the version a SotW node named on its first cluster request, looked
    /// up once, just before the first plan: after a restart, the sets this replica knows
    /// are those of the snapshots it has built since, and its first may come after the
    /// node's request.
    pub(super) fn recall_named_clusters(&mut self) {
        let Some(version) = self.named_clusters.take() else {
            return;
        };
        let Some(accepted) = self.accepted.clone() else {
            return;
        };
        match accepted.recall(&version) {
            Some(held) => {
                let clusters = held.len();
                self.recall_held(CLUSTER, held);
                self.events.push(Event::Recalled { version, clusters });
            }
            None => self.events.push(Event::NotRecalled { version }),
        }
    }
}
