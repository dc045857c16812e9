//! Delta (incremental) subscriptions. Requests subscribe and unsubscribe names, a
//! reconnecting node says what it holds, and responses carry only what changed and the
//! names removed.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use imbl::ordmap::DiffItem;

use super::{DeltaResponse, Event, Response, Session};
use crate::xds::planner::Entries;
use crate::xds::snapshot::{Resource, VIRTUAL_HOST};
use crate::xds::vhds;

impl Session {
    /// A request of a delta node: names it subscribes to or drops on one type, what it
    /// holds when it reconnects, maybe answering the last response of that type.
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
        }
        if first && !request.initial_resource_versions.is_empty() {
            let held: Entries = request
                .initial_resource_versions
                .into_iter()
                .map(|(name, version)| {
                    let entry = Arc::new(Resource::held(name.clone(), version));
                    (name, entry)
                })
                .collect();
            self.hold(&type_url, held);
        }
        let Some(ts) = self.types.get_mut(&type_url) else {
            unreachable!("the entry was made above");
        };
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
                // The node forgets what it unsubscribes from: for virtual hosts, the
                // namespace's every one.
                if let Some(acked) = ts.acked.as_mut()
                    && !ts.wildcard
                {
                    if type_url == VIRTUAL_HOST {
                        forget_namespace(acked, &name);
                    } else {
                        acked.remove(&name);
                    }
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
}

/// Drops from what a node holds every virtual host of route configuration namespace
/// `namespace` (see [`vhds`]).
pub(super) fn forget_namespace(held: &mut Entries, namespace: &str) {
    let forgotten: Vec<String> = held
        .keys()
        .filter(|name| vhds::namespace(name) == namespace)
        .cloned()
        .collect();
    for name in forgotten {
        held.remove(&name);
    }
}

/// What differs between what the node holds and `wanted`; with the number of resources
/// it carries and of names it removes.
pub(super) fn response(
    type_url: &str,
    system_version: &str,
    nonce: &str,
    held: &Entries,
    wanted: &Entries,
) -> (Response, usize, usize) {
    // Only what differs: a diff of two maps that share most of their nodes.
    let mut resources: Vec<Arc<Resource>> = Vec::new();
    let mut removed: Vec<String> = Vec::new();
    for item in held.diff(wanted) {
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
        system_version_info: system_version.to_string(),
        resources,
        type_url: type_url.to_string(),
        removed_resources: removed,
        nonce: nonce.to_string(),
    });
    (response, counts.0, counts.1)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;

    use std::sync::Arc;

    use super::super::testing::{full_config, names, nonce, res, subscription, switch_to, type_of};
    use super::super::{Event, Ordering, Protocol, Response, Session};
    use crate::xds::snapshot::{
        CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, Snapshot, VIRTUAL_HOST,
    };
    use crate::xds::vhds;

    fn delta(type_url: &str, subscribe: &[&str], nonce: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url.to_string(),
            resource_names_subscribe: subscribe.iter().map(|n| n.to_string()).collect(),
            response_nonce: nonce.to_string(),
            ..Default::default()
        }
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

    /// Answers as Envoy would until a route configuration is in flight (returned) or
    /// nothing is: ACKs each response, asks for the endpoints of the clusters it gets and
    /// for the route configuration once a listener comes.
    fn answer_until_routes_are_sent(s: &mut Session, mut out: Vec<Response>) -> Option<Response> {
        let now = Instant::now();
        while let Some(r) = out.pop() {
            let (kind, sent, _) = names(&r);
            if kind == "RouteConfiguration" && !sent.is_empty() {
                assert!(out.is_empty(), "nothing else in flight: {out:?}");
                return Some(r);
            }
            out.extend(s.on_delta_request(delta(&type_of(&r), &[], &nonce(&r)), now));
            let subscribe: Vec<&str> = sent.iter().map(String::as_str).collect();
            if kind == "Cluster" && !subscribe.is_empty() {
                out.extend(s.on_delta_request(delta(ENDPOINT, &subscribe, ""), now));
            }
            if kind == "Listener" && !subscribe.is_empty() {
                out.extend(s.on_delta_request(delta(ROUTE, &["switchyard"], ""), now));
            }
        }
        None
    }

    #[test]
    fn a_node_never_synced_serves_the_snapshot_each_route_step_was_planned_from() {
        let now = Instant::now();
        let mut s = Session::new(Protocol::Delta, Ordering::MakeBeforeBreak);
        s.on_delta_request(delta(CLUSTER, &[], ""), now);
        s.on_delta_request(delta(LISTENER, &[], ""), now);
        let (a, b, c) = (switch_to("a"), switch_to("b"), switch_to("c"));
        let out = s.set_desired(a.clone(), now);
        let routes = answer_until_routes_are_sent(&mut s, out).expect("routes to a");
        assert_eq!(
            s.status().serving_version,
            None,
            "nothing served in full yet"
        );
        // b comes while the routes to a are in flight, c while those to b are.
        assert!(
            s.set_desired(b.clone(), now).is_empty(),
            "one step at a time"
        );
        let out = s.on_delta_request(delta(ROUTE, &[], &nonce(&routes)), now);
        assert_eq!(s.status().serving_version.as_deref(), Some(a.version()));
        let routes = answer_until_routes_are_sent(&mut s, out).expect("routes to b");
        assert!(s.set_desired(c.clone(), now).is_empty());
        let out = s.on_delta_request(delta(ROUTE, &[], &nonce(&routes)), now);
        let status = s.status();
        assert!(!status.synced);
        assert_eq!(status.serving_version.as_deref(), Some(b.version()));
        // Once the node takes c too, it serves c, synced, and the break step changes
        // nothing of that.
        let routes = answer_until_routes_are_sent(&mut s, out).expect("routes to c");
        let out = s.on_delta_request(delta(ROUTE, &[], &nonce(&routes)), now);
        assert_eq!(s.status().serving_version.as_deref(), Some(c.version()));
        assert_eq!(answer_until_routes_are_sent(&mut s, out), None);
        let status = s.status();
        assert!(status.synced, "{status:#?}");
        assert_eq!(status.serving_version.as_deref(), Some(c.version()));
    }

    #[test]
    fn a_node_that_never_asks_for_virtual_hosts_serves_what_it_asked_for() {
        let now = Instant::now();
        let mut s = Session::new(Protocol::Delta, Ordering::MakeBeforeBreak);
        s.on_delta_request(delta(CLUSTER, &[], ""), now);
        s.on_delta_request(delta(LISTENER, &[], ""), now);
        let mut with_listener = Snapshot::clone(&in_parts(&[("a", "v1")]));
        with_listener.insert(Arc::new(res(LISTENER, "http", "l")));
        let snapshot = Arc::new(with_listener);
        let out = s.set_desired(snapshot.clone(), now);
        let routes = answer_until_routes_are_sent(&mut s, out);
        if let Some(routes) = routes {
            let out = s.on_delta_request(delta(ROUTE, &[], &nonce(&routes)), now);
            assert_eq!(answer_until_routes_are_sent(&mut s, out), None);
        }
        let status = s.status();
        assert!(status.synced, "{status:#?}");
        assert_eq!(status.serving_version.as_deref(), Some(snapshot.version()));
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
        drive_delta_after(s, first, &[])
    }

    /// [`drive_delta`] on a stream where the node has ACKed responses of `acked` already.
    fn drive_delta_after(
        s: &mut Session,
        first: Vec<Response>,
        acked: &[&str],
    ) -> Vec<(String, Vec<String>, Vec<String>)> {
        let now = Instant::now();
        let mut acked: std::collections::BTreeSet<String> =
            acked.iter().map(|t| t.to_string()).collect();
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

    /// The reconnect request of one type from `delta_reconnect`.
    fn reconnect_request(held: &Snapshot, type_url: &str) -> DeltaDiscoveryRequest {
        let Some(request) = delta_reconnect(held)
            .into_iter()
            .find(|r| r.type_url == type_url)
        else {
            panic!("no reconnect request of {type_url}");
        };
        request
    }

    /// An Envoy that reconnects while a cluster it got before the stall is warming holds
    /// its cluster request back until that cluster has endpoints: they are sent on its
    /// endpoint request, and nothing else is before it asks for clusters.
    #[test]
    fn delta_reconnect_without_a_cluster_request_gets_the_endpoints_of_the_clusters_it_holds() {
        let now = Instant::now();
        let held = full_config(&["a", "b"]);
        let config = full_config(&["a", "b", "c"]);
        let mut s = Session::new(Protocol::Delta, Ordering::MakeBeforeBreak);
        assert!(
            s.set_desired(config.clone(), now).is_empty(),
            "no request yet"
        );
        let mut out = Vec::new();
        for mut request in delta_reconnect(&held) {
            if request.type_url == CLUSTER {
                continue; // held back
            }
            if request.type_url == ENDPOINT {
                request.resource_names_subscribe.push("c".into());
            }
            out.extend(s.on_delta_request(request, now));
        }
        let sent: Vec<_> = out.iter().map(names).collect();
        assert_eq!(
            sent,
            [("ClusterLoadAssignment".into(), vec!["c".into()], vec![])],
            "only the endpoints the node lacks"
        );
        let eds = nonce(&out[0]);
        assert!(
            s.on_delta_request(delta(ENDPOINT, &[], &eds), now)
                .is_empty()
        );

        // c is warm: the cluster request comes, with c among what the node holds.
        let mut cds = reconnect_request(&held, CLUSTER);
        let c = &config.resources(CLUSTER).unwrap()["c"];
        cds.initial_resource_versions
            .insert("c".into(), c.version.clone());
        let out = s.on_delta_request(cds, now);
        drive_delta_after(&mut s, out, &[ENDPOINT]);
        assert!(s.is_synced(), "{:#?}", s.status());
    }

    /// A reconnecting node whose cluster request comes before it has asked for listeners
    /// and routes: nothing is removed until it has, and its routes moved.
    #[test]
    fn delta_reconnect_removes_nothing_before_the_node_asks_for_listeners_and_routes() {
        let now = Instant::now();
        let held = full_config(&["a", "b"]);
        let config = full_config(&["b"]);
        let mut s = Session::new(Protocol::Delta, Ordering::MakeBeforeBreak);
        assert!(s.set_desired(config, now).is_empty(), "no request yet");
        let mut out = s.on_delta_request(reconnect_request(&held, ENDPOINT), now);
        out.extend(s.on_delta_request(reconnect_request(&held, CLUSTER), now));
        out.extend(s.on_delta_request(reconnect_request(&held, SECRET), now));
        // ACK everything so far, as Envoy would before its next requests are read.
        while let Some(r) = out.pop() {
            assert!(names(&r).2.is_empty(), "removed too early: {r:?}");
            out.extend(s.on_delta_request(delta(&type_of(&r), &[], &nonce(&r)), now));
        }
        let mut out = s.on_delta_request(reconnect_request(&held, LISTENER), now);
        out.extend(s.on_delta_request(reconnect_request(&held, ROUTE), now));
        let log = drive_delta_after(&mut s, out, &[CLUSTER, ENDPOINT, SECRET]);
        assert!(
            log.iter()
                .any(|(k, _, removed)| k == "Cluster" && removed == &["a"]),
            "{log:?}"
        );
        assert!(s.is_synced(), "{:#?}", s.status());
    }

    /// A snapshot serving the route configuration in parts: the inline one, its parts
    /// configuration and one VirtualHost resource per (id, content).
    fn in_parts(vhosts: &[(&str, &str)]) -> Arc<Snapshot> {
        let mut resources = vec![
            res(CLUSTER, "a", "c"),
            res(ROUTE, "switchyard", &format!("{vhosts:?}")),
        ];
        if !vhosts.is_empty() {
            resources.push(res(ROUTE, &vhds::parts_name("switchyard"), "parts"));
        }
        for (id, content) in vhosts {
            let name = vhds::virtual_host_name("switchyard", id);
            resources.push(res(VIRTUAL_HOST, &name, content));
        }
        Arc::new(Snapshot::new(resources))
    }

    /// ACKs every response until there is none; returns them and the session's events.
    fn ack_all(s: &mut Session, mut out: Vec<Response>) -> (Vec<Response>, Vec<Event>) {
        let now = Instant::now();
        let mut all = Vec::new();
        while let Some(r) = out.pop() {
            out.extend(s.on_delta_request(delta(&type_of(&r), &[], &nonce(&r)), now));
            all.push(r);
        }
        (all, s.take_events())
    }

    fn virtual_host_responses(responses: &[Response]) -> Vec<(String, Vec<String>, Vec<String>)> {
        responses
            .iter()
            .filter(|r| type_of(r) == VIRTUAL_HOST)
            .map(names)
            // The answer to a first request, before the view has any.
            .filter(|(_, changed, removed)| !changed.is_empty() || !removed.is_empty())
            .collect()
    }

    /// A delta session asked for clusters, the parts configuration and its virtual hosts.
    fn subscribed_to_parts(parts: &str) -> Session {
        let now = Instant::now();
        let mut s = Session::new(Protocol::Delta, Ordering::MakeBeforeBreak);
        s.on_delta_request(delta(CLUSTER, &[], ""), now);
        s.on_delta_request(delta(ROUTE, &[parts], ""), now);
        s.on_delta_request(delta(VIRTUAL_HOST, &[parts], ""), now);
        s
    }

    #[test]
    fn virtual_hosts_go_one_by_one_and_stay_while_a_draining_listener_may_use_them() {
        let now = Instant::now();
        let parts = vhds::parts_name("switchyard");
        let mut s = subscribed_to_parts(&parts);
        let first = in_parts(&[("x", "1"), ("y", "1")]);
        let out = s.set_desired(first.clone(), now);
        let (responses, events) = ack_all(&mut s, out);
        let sent = virtual_host_responses(&responses);
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0].1.len(), 2);
        // Accepting the parts is accepting the route configuration they make.
        let inline = first.resources(ROUTE).unwrap()["switchyard"].clone();
        assert!(events.iter().any(|e| matches!(e,
            Event::RoutesInParts { route_configs, refused: None } if route_configs == std::slice::from_ref(&inline)
        )), "{events:?}");
        assert!(s.is_synced(), "{:#?}", s.status());

        // One virtual host changed: it alone is sent.
        let out = s.set_desired(in_parts(&[("x", "2"), ("y", "1")]), now);
        let (responses, _) = ack_all(&mut s, out);
        assert_eq!(
            virtual_host_responses(&responses),
            [(
                "VirtualHost".to_string(),
                vec![vhds::virtual_host_name("switchyard", "x")],
                vec![]
            )]
        );
        assert!(s.is_synced(), "{:#?}", s.status());

        // Served whole again: a listener draining on the parts still routes with them, so
        // nothing is removed while the node asks for them...
        let out = s.set_desired(in_parts(&[]), now);
        let (responses, _) = ack_all(&mut s, out);
        assert!(
            virtual_host_responses(&responses)
                .iter()
                .all(|(_, _, removed)| removed.is_empty()),
            "{responses:?}"
        );
        assert!(s.is_synced(), "{:#?}", s.status());
        // ...and the node forgets them when it stops asking: nothing to send.
        let mut bye = delta(VIRTUAL_HOST, &[], "");
        bye.resource_names_unsubscribe = vec![parts.clone()];
        assert!(s.on_delta_request(bye, now).is_empty());
        assert!(s.is_synced(), "{:#?}", s.status());
    }

    #[test]
    fn a_refused_virtual_host_is_a_refused_route_configuration() {
        let now = Instant::now();
        let parts = vhds::parts_name("switchyard");
        let mut s = subscribed_to_parts(&parts);
        let out = s.set_desired(in_parts(&[("x", "1")]), now);
        ack_all(&mut s, out);
        let bad = in_parts(&[("x", "1"), ("bad", "1")]);
        let mut out = s.set_desired(bad.clone(), now);
        s.take_events();
        let mut refused = false;
        while let Some(r) = out.pop() {
            let mut answer = delta(&type_of(&r), &[], &nonce(&r));
            if type_of(&r) == VIRTUAL_HOST {
                answer.error_detail = Some(Default::default());
                refused = true;
            }
            out.extend(s.on_delta_request(answer, now));
        }
        assert!(refused);
        let inline = bad.resources(ROUTE).unwrap()["switchyard"].clone();
        assert!(s.take_events().iter().any(|e| matches!(e,
            Event::RoutesInParts { route_configs, refused: Some(_) } if route_configs == std::slice::from_ref(&inline)
        )));
    }

    /// Envoy keeps a virtual host only for a route configuration it already uses: those of
    /// one it starts using later are sent again after it.
    #[test]
    fn a_route_configuration_in_parts_gets_its_virtual_hosts_again_after_it() {
        let now = Instant::now();
        let (shared, gateway) = (vhds::parts_name("switchyard"), vhds::parts_name("gw"));
        let snapshot = Arc::new(Snapshot::new([
            res(CLUSTER, "a", "c"),
            res(ROUTE, "switchyard", "whole"),
            res(ROUTE, &shared, "parts"),
            res(ROUTE, "gw", "whole"),
            res(ROUTE, &gateway, "parts"),
            res(
                VIRTUAL_HOST,
                &vhds::virtual_host_name("switchyard", "x"),
                "1",
            ),
            res(VIRTUAL_HOST, &vhds::virtual_host_name("gw", "y"), "1"),
        ]));
        let mut s = Session::new(Protocol::Delta, Ordering::MakeBeforeBreak);
        s.on_delta_request(delta(CLUSTER, &[], ""), now);
        s.on_delta_request(delta(ROUTE, &[&shared], ""), now);
        // Envoy asks for virtual hosts as a wildcard: "gw"'s go out before Envoy uses it.
        s.on_delta_request(delta(VIRTUAL_HOST, &[], ""), now);
        let out = s.set_desired(snapshot, now);
        ack_all(&mut s, out);

        // In the order sent.
        let out = s.on_delta_request(delta(ROUTE, &[&gateway], ""), now);
        let kinds: Vec<(String, Vec<String>)> = out
            .iter()
            .map(names)
            .map(|(kind, changed, _)| (kind, changed))
            .collect();
        let route = kinds
            .iter()
            .position(|(k, c)| k == "RouteConfiguration" && c == std::slice::from_ref(&gateway));
        let again = kinds.iter().position(|(k, c)| {
            k == "VirtualHost" && c.contains(&vhds::virtual_host_name("gw", "y"))
        });
        assert!(
            matches!((route, again), (Some(r), Some(v)) if r < v),
            "{kinds:?}"
        );
        ack_all(&mut s, out);
        assert!(s.is_synced(), "{:#?}", s.status());
    }
}
