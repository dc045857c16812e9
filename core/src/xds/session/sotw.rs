//! State-of-the-world subscriptions. Every request repeats the node's whole subscription
//! of one type and must echo the last nonce sent on it to be current (an older one is
//! stale, and ignored); a response carries the whole set of its type, except one of
//! endpoints: only what the node lacks or holds at another version (see
//! [`may_send_changes_only`]), and whole again after Envoy rebuilt a cluster.

use std::time::Instant;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use imbl::ordmap::DiffItem;

use super::{Event, Ordering, Response, Session, SotwResponse};
use crate::xds::names::Names;
use crate::xds::planner::Entries;
use crate::xds::snapshot;

impl Session {
    /// A request of a SotW node: its whole subscription of one type, maybe answering the
    /// last response of that type (an ACK, or a NACK with `error_detail`).
    pub fn on_sotw_request(&mut self, request: DiscoveryRequest, now: Instant) -> Vec<Response> {
        self.remember_node(request.node);
        let type_url = request.type_url;
        // A first request naming a version: the node holds that from before this stream.
        let names_held = !self.has_requested(&type_url) && !request.version_info.is_empty();
        self.held_before |= names_held;
        if names_held && type_url == snapshot::CLUSTER {
            // What it is, is looked up just before the first plan.
            self.named_clusters = Some(request.version_info.clone());
        }
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
            // Asked again for the same names: which of them a rebuilt cluster waits for
            // cannot be told, so the answer carries them all.
            ts.send_whole |= same_names;
        }
        if !same_names
            && !wildcard
            && let Some(ts) = self.types.get_mut(&type_url)
            && let Some(acked) = ts.acked.as_mut()
        {
            // Envoy forgets what it stops asking for by name.
            let forgotten: Vec<String> =
                ts.names.missing_from(acked).into_iter().cloned().collect();
            for name in forgotten {
                acked.remove(&name);
            }
        }
        self.pump(now)
    }
}

/// Whether a SotW response of this type may carry only what changed. The xDS protocol
/// asks for the whole set in listener and cluster responses alone; Envoy's default SotW
/// mux hands each endpoint watch only the resources a response has for it, and a watch a
/// response leaves out keeps what it holds. (Its newer muxes call such a watch with an
/// empty update, which an endpoint watch counts and otherwise ignores.) Endpoints only:
/// they are most of the bytes, and a refused route configuration is told to the routes by
/// what the response was meant to hold.
pub(super) fn may_send_changes_only(type_url: &str) -> bool {
    type_url == snapshot::ENDPOINT
}

/// `wanted` as one response: whole, or (`held`: what the node holds of it) only what
/// `held` lacks or has at another version; with the number of resources it carries, and
/// of names it removes (none: a SotW node forgets what it stops asking for).
pub(super) fn response(
    type_url: &str,
    version: &str,
    nonce: &str,
    held: Option<&Entries>,
    wanted: &Entries,
) -> (Response, usize, usize) {
    // Held entries exist only in delta sessions; a SotW response could not carry one.
    let resources: Vec<_> = match held {
        None => wanted
            .values()
            .filter(|r| r.has_content())
            .cloned()
            .collect(),
        Some(held) => held
            .diff(wanted)
            .filter_map(|item| match item {
                DiffItem::Add(_, new) => Some(new),
                DiffItem::Update { old, new } if old.1.version != new.1.version => Some(new.1),
                DiffItem::Update { .. } | DiffItem::Remove(..) => None,
            })
            .filter(|r| r.has_content())
            .cloned()
            .collect(),
    };
    let count = resources.len();
    let response = Response::Sotw(SotwResponse {
        version_info: version.to_string(),
        resources,
        type_url: type_url.to_string(),
        nonce: nonce.to_string(),
    });
    (response, count, 0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Instant;

    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use envoy_types::pb::google::rpc::Status;

    use super::super::testing::{full_config, names, nonce, res, subscription, switch_to, type_of};
    use super::super::{Event, Ordering, Protocol, Response, Session};
    use crate::xds::snapshot::{
        CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, Snapshot, VIRTUAL_HOST, short_type,
    };

    fn sotw(type_url: &str, names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url.to_string(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            response_nonce: nonce.to_string(),
            ..Default::default()
        }
    }

    /// A SotW node that has subscribed to everything and holds `cluster`'s snapshot.
    fn synced_sotw(cluster: &str, ordering: Ordering) -> (Session, BTreeMap<String, String>) {
        synced_sotw_on(switch_to(cluster), cluster, ordering)
    }

    /// A SotW session in sync with `snapshot`, whose one cluster is `cluster`.
    fn synced_sotw_on(
        snapshot: Arc<Snapshot>,
        cluster: &str,
        ordering: Ordering,
    ) -> (Session, BTreeMap<String, String>) {
        let now = Instant::now();
        let mut s = Session::new(Protocol::Sotw, ordering);
        let mut nonces = BTreeMap::new();
        assert!(s.on_sotw_request(sotw(CLUSTER, &[], ""), now).is_empty());
        assert!(s.on_sotw_request(sotw(LISTENER, &[], ""), now).is_empty());
        let version = snapshot.version().to_owned();
        let mut pending = s.set_desired(snapshot, now);
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
        assert_eq!(s.status().serving_version, Some(version));
        (s, nonces)
    }

    /// Found by fuzzing (fuzz/fuzz_targets/xds_session.rs): a stream whose first request
    /// was for routes got them at once, naming clusters it had never been sent.
    #[test]
    fn routes_wait_until_the_stream_asks_for_clusters() {
        let now = Instant::now();
        let mut s = Session::new(Protocol::Sotw, Ordering::MakeBeforeBreak);
        assert!(
            s.on_sotw_request(sotw(ROUTE, &["switchyard"], ""), now)
                .is_empty()
        );
        assert!(
            s.set_desired(switch_to("a"), now).is_empty(),
            "no routes yet"
        );
        let out = s.on_sotw_request(sotw(CLUSTER, &[], ""), now);
        let kinds: Vec<_> = out.iter().map(|r| names(r).0).collect();
        assert_eq!(kinds, ["Cluster"], "clusters first");
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
    fn a_draining_envoy_is_sent_listeners_that_close_each_connection_and_nothing_else() {
        let now = Instant::now();
        let mut snapshot = (*switch_to("a")).clone();
        snapshot.insert(Arc::new(crate::xds::localize::tests::listener_with_hcm()));
        let (mut s, _) = synced_sotw_on(Arc::new(snapshot), "a", Ordering::MakeBeforeBreak);
        let out = s.set_draining(true, now);
        let kinds: Vec<_> = out.iter().map(|r| names(r).0).collect();
        assert_eq!(kinds, ["Listener"], "only the listeners change");
        let Response::Sotw(response) = &out[0] else {
            panic!("a SotW response");
        };
        assert!(
            crate::xds::localize::tests::closes_after_one_request(&response.resources[0].body),
            "the listener closes each connection after one request"
        );
        assert!(s.set_draining(true, now).is_empty(), "nothing new to send");
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
        assert_eq!(
            names(&out[0]).1,
            ["b:e"],
            "only what the node lacks: it keeps a's endpoints"
        );
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

    /// `switch_to(cluster)` with the cluster's and its endpoints' content as given.
    fn on(cluster: &str, cluster_content: &str, endpoints: &str) -> Arc<Snapshot> {
        Arc::new(Snapshot::new([
            res(CLUSTER, cluster, cluster_content),
            res(ENDPOINT, cluster, endpoints),
            res(LISTENER, "http", "l"),
            res(ROUTE, "switchyard", &format!("to {cluster}")),
        ]))
    }

    #[test]
    fn a_cluster_envoy_makes_anew_gets_its_endpoints_in_a_whole_response_after_it() {
        let now = Instant::now();
        let (mut s, _) = synced_sotw("a", Ordering::MakeBeforeBreak);
        // Cluster a changes (Envoy makes it anew, waiting for its endpoints); its
        // endpoints do not.
        let out = s.set_desired(on("a", "c2", "e"), now);
        let kinds: Vec<_> = out.iter().map(names).collect();
        assert_eq!(
            kinds,
            [
                ("Cluster".into(), vec!["a:c2".into()], vec![]),
                ("ClusterLoadAssignment".into(), vec!["a:e".into()], vec![]),
            ],
            "the endpoints follow the cluster, whole"
        );
    }

    #[test]
    fn endpoints_of_a_refused_response_are_sent_again_whatever_envoy_took_of_it() {
        let now = Instant::now();
        let (mut s, _) = synced_sotw("a", Ordering::MakeBeforeBreak);
        let out = s.set_desired(on("a", "c", "e2"), now);
        assert_eq!(names(&out[0]).1, ["a:e2"]);
        let mut nack = sotw(ENDPOINT, &["a"], &nonce(&out[0]));
        nack.error_detail = Some(Status {
            code: 3,
            message: "bad endpoints".into(),
            details: vec![],
        });
        // It may hold the refused version of a now: it gets what it held before again.
        let out = s.on_sotw_request(nack, now);
        assert_eq!(names(&out[0]).1, ["a:e"]);
        assert!(s.status().blocked_by_nack, "nothing else is planned");
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
        drive_sotw_after(s, first, held, snapshot, &BTreeMap::new())
    }

    /// [`drive_sotw`] on a stream where the node has ACKed the last responses of some
    /// types already: their nonces, by type.
    fn drive_sotw_after(
        s: &mut Session,
        first: Vec<Response>,
        held: &Snapshot,
        snapshot: &Snapshot,
        acked_before: &BTreeMap<String, String>,
    ) -> Vec<String> {
        let now = Instant::now();
        let mut clusters = subscription(held, ENDPOINT);
        let mut nonces = acked_before.clone();
        let mut acked: std::collections::BTreeSet<String> = acked_before.keys().cloned().collect();
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
            if t == CLUSTER && !(acked.contains(LISTENER) && acked.contains(ROUTE)) {
                let sent: Vec<_> = sotw.resources.iter().map(|r| r.name.as_str()).collect();
                for cluster in held.resources(CLUSTER).into_iter().flat_map(|c| c.keys()) {
                    assert!(
                        sent.contains(&cluster.as_str()),
                        "{cluster} removed before the routes moved"
                    );
                }
            }
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
            if request.type_url == CLUSTER {
                // What the server recalls of the version the node names.
                s.recall_held(CLUSTER, held.resources(CLUSTER).unwrap().clone());
            }
            assert!(s.on_sotw_request(request, now).is_empty());
        }
        let out = s.set_desired(config.clone(), now);
        let kinds: Vec<_> = out.iter().map(|r| names(r).0).collect();
        assert_eq!(kinds, ["Cluster", "ClusterLoadAssignment", "Secret"]);
        drive_sotw(&mut s, out, &held, &config);
        assert!(s.is_synced(), "{:#?}", s.status());
    }

    /// A node whose route request comes only after everything else it asked for was
    /// answered and ACKed: the clusters recalled stay until its routes moved, also in
    /// the responses to that late request.
    #[test]
    fn sotw_reconnect_whose_route_request_comes_last_keeps_the_clusters_until_its_routes_moved() {
        let now = Instant::now();
        let held = full_config(&["a", "b"]);
        let config = full_config(&["b"]);
        let mut s = Session::new(Protocol::Sotw, Ordering::MakeBeforeBreak);
        assert!(
            s.set_desired(config.clone(), now).is_empty(),
            "no request yet"
        );
        let mut out = Vec::new();
        let mut late = None;
        for request in sotw_reconnect(&held) {
            match request.type_url.as_str() {
                ROUTE => late = Some(request),
                CLUSTER => {
                    s.recall_held(CLUSTER, held.resources(CLUSTER).unwrap().clone());
                    out.extend(s.on_sotw_request(request, now));
                }
                _ => out.extend(s.on_sotw_request(request, now)),
            }
        }
        let mut nonces = BTreeMap::new();
        while let Some(r) = out.pop() {
            assert!(
                type_of(&r) != CLUSTER || names(&r).1.contains(&"a:c".to_string()),
                "a removed before the routes were asked for: {r:?}"
            );
            let Response::Sotw(sent) = &r else {
                panic!("a SotW session sent {r:?}");
            };
            let ack = DiscoveryRequest {
                type_url: type_of(&r),
                version_info: sent.version_info.clone(),
                resource_names: subscription(&config, &type_of(&r)),
                response_nonce: nonce(&r),
                ..Default::default()
            };
            nonces.insert(type_of(&r), nonce(&r));
            out.extend(s.on_sotw_request(ack, now));
        }
        let Some(late) = late else {
            panic!("no route request");
        };
        let out = s.on_sotw_request(late, now);
        drive_sotw_after(&mut s, out, &held, &config, &nonces);
        assert!(s.is_synced(), "{:#?}", s.status());
    }

    /// Once the gate is open, with a move that adds no cluster: the clusters recalled
    /// stay until the routes moved; and the snapshot's virtual hosts, which a SotW node
    /// never asks for, hold nothing back.
    #[test]
    fn sotw_reconnect_after_a_move_keeps_the_recalled_clusters_until_the_routes_moved() {
        let now = Instant::now();
        let held = full_config(&["a", "b"]);
        let mut config = (*full_config(&["b"])).clone();
        config.insert(Arc::new(res(VIRTUAL_HOST, "http/parts/b", "v")));
        let config = Arc::new(config);
        let mut s = Session::new(Protocol::Sotw, Ordering::MakeBeforeBreak);
        assert!(
            s.set_desired(config.clone(), now).is_empty(),
            "no request yet"
        );
        let mut out = Vec::new();
        for request in sotw_reconnect(&held) {
            if request.type_url == CLUSTER {
                s.recall_held(CLUSTER, held.resources(CLUSTER).unwrap().clone());
            }
            out.extend(s.on_sotw_request(request, now));
        }
        let answered = drive_sotw(&mut s, out, &held, &config);
        assert_eq!(
            answered.iter().filter(|t| *t == "Cluster").count(),
            2,
            "the clusters kept, then the one left: {answered:?}"
        );
        assert!(s.is_synced(), "{:#?}", s.status());
    }
}
