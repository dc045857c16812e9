//! The session state machine, SotW and delta, against an Envoy that ACKs, NACKs and repeats
//! itself in any order: it never sends routes to a cluster the Envoy has not accepted (I1), never
//! removes a cluster the Envoy's accepted routes still use (I2), and, once the Envoy
//! answers honestly, brings it to the newest snapshot. A delta Envoy may take its route
//! configuration in parts (VHDS, the default for delta): then the same holds of every
//! virtual host it is sent and holds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status;
use proptest::prelude::*;
use switchyard_core::xds::session::Session;
use switchyard_core::xds::snapshot::{CLUSTER, ENDPOINT, LISTENER, ROUTE, VIRTUAL_HOST};
use switchyard_core::xds::wire::Response;
use switchyard_core::xds::{Ordering, Protocol, Resource, Snapshot, vhds};

fn res(type_url: &str, name: &str, content: &str) -> Resource {
    Resource::new(
        name,
        Any {
            type_url: type_url.to_string(),
            value: format!("{name}:{content}").into_bytes(),
        },
    )
}

/// The route configuration, and the name of its parts configuration.
const ROUTE_CONFIG: &str = "switchyard";

/// Snapshot `k`: one route to cluster `c<k>`, with its endpoints and the listener; and
/// the same in parts: a parts configuration and two virtual hosts to `c<k>`, one that
/// every snapshot has (`app`, changed) and one of its own (`only<k>`, added and removed).
fn snapshot(k: u8) -> Arc<Snapshot> {
    let cluster = format!("c{k}");
    let to = format!("to {cluster}");
    Arc::new(Snapshot::new([
        res(CLUSTER, &cluster, "c"),
        res(ENDPOINT, &cluster, "e"),
        res(LISTENER, "http", "l"),
        res(ROUTE, ROUTE_CONFIG, &to),
        res(ROUTE, &vhds::parts_name(ROUTE_CONFIG), "parts"),
        res(
            VIRTUAL_HOST,
            &vhds::virtual_host_name(ROUTE_CONFIG, "app"),
            &to,
        ),
        res(
            VIRTUAL_HOST,
            &vhds::virtual_host_name(ROUTE_CONFIG, &format!("only{k}")),
            &to,
        ),
    ]))
}

#[derive(Clone, Debug)]
enum Op {
    Desired(u8),
    Ack(usize),
    Nack(usize),
    Stale(usize),
}

const TYPES: [&str; 5] = [CLUSTER, ENDPOINT, LISTENER, ROUTE, VIRTUAL_HOST];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..3).prop_map(Op::Desired),
        (0usize..5).prop_map(Op::Ack),
        (0usize..5).prop_map(Op::Ack),
        (0usize..5).prop_map(Op::Nack),
        (0usize..5).prop_map(Op::Stale),
    ]
}

/// An Envoy: what it accepted of each type, the last response of each type it has not
/// answered yet (what it would then hold), and what it subscribes to.
struct Envoy {
    protocol: Protocol,
    /// Takes its routes in parts (delta only): the parts configuration, then its virtual
    /// hosts.
    parts: bool,
    held: BTreeMap<&'static str, BTreeMap<String, String>>,
    unanswered: BTreeMap<&'static str, (String, BTreeMap<String, String>)>,
    asked_routes: bool,
    asked_virtual_hosts: bool,
    endpoint_names: BTreeSet<String>,
}

/// A request to the session, in the Envoy's protocol.
enum Request {
    Sotw(DiscoveryRequest),
    Delta(DeltaDiscoveryRequest),
}

impl Envoy {
    fn new(protocol: Protocol, parts: bool) -> Self {
        Self {
            protocol,
            parts,
            held: BTreeMap::new(),
            unanswered: BTreeMap::new(),
            asked_routes: false,
            asked_virtual_hosts: false,
            endpoint_names: BTreeSet::new(),
        }
    }

    /// The route configuration it asks for.
    fn route_config(&self) -> String {
        if self.parts {
            vhds::parts_name(ROUTE_CONFIG)
        } else {
            ROUTE_CONFIG.to_owned()
        }
    }

    fn held_names(&self, type_url: &str) -> BTreeSet<String> {
        self.held
            .get(type_url)
            .map(|h| h.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn routed_cluster(bodies: &BTreeMap<String, String>) -> Option<String> {
        bodies
            .get(ROUTE_CONFIG)
            .and_then(|b| b.strip_prefix("switchyard:to "))
            .map(str::to_owned)
    }

    /// The clusters the resources of `type_url` in `bodies` route to: the inline route
    /// configuration's, or every virtual host's.
    fn routed_clusters(type_url: &str, bodies: &BTreeMap<String, String>) -> BTreeSet<String> {
        match type_url {
            ROUTE => Self::routed_cluster(bodies).into_iter().collect(),
            VIRTUAL_HOST => (bodies.iter())
                .filter_map(|(name, body)| body.strip_prefix(&format!("{name}:to ")))
                .map(str::to_owned)
                .collect(),
            _ => BTreeSet::new(),
        }
    }

    /// Every cluster its accepted routes use.
    fn used_clusters(&self) -> BTreeSet<String> {
        [ROUTE, VIRTUAL_HOST]
            .into_iter()
            .filter_map(|t| Some(Self::routed_clusters(t, self.held.get(t)?)))
            .flatten()
            .collect()
    }

    /// Takes the session's responses, checking I1 and I2 as each arrives.
    fn receive(&mut self, responses: Vec<Response>) -> Result<(), String> {
        for response in responses {
            let (type_url, nonce, resources, removed) = match (&response, self.protocol) {
                (Response::Sotw(r), Protocol::Sotw) => (&r.type_url, &r.nonce, &r.resources, None),
                (Response::Delta(r), Protocol::Delta) => (
                    &r.type_url,
                    &r.nonce,
                    &r.resources,
                    Some(&r.removed_resources),
                ),
                _ => return Err("a response in the other protocol".into()),
            };
            let type_url = TYPES
                .iter()
                .find(|t| *t == type_url)
                .ok_or_else(|| format!("unknown type {type_url}"))?;
            let sent = resources.iter().map(|res| {
                (
                    res.name.clone(),
                    String::from_utf8_lossy(&res.body.value).to_string(),
                )
            });
            // What the Envoy holds once it accepts: a SotW listener or cluster response
            // replaces the set; an endpoint or route configuration response adds to what it
            // holds (Envoy keeps what one leaves out, until it stops asking); delta the
            // changes.
            let bodies: BTreeMap<String, String> = match removed {
                None if *type_url != ENDPOINT && *type_url != ROUTE => sent.collect(),
                None => {
                    let mut bodies = self.held.get(type_url).cloned().unwrap_or_default();
                    bodies.extend(sent);
                    bodies
                }
                Some(removed) => {
                    let mut bodies = self.held.get(type_url).cloned().unwrap_or_default();
                    bodies.extend(sent);
                    for name in removed {
                        bodies.remove(name);
                    }
                    bodies
                }
            };
            let held_clusters = self.held_names(CLUSTER);
            if let Some(cluster) = (Self::routed_clusters(type_url, &bodies).into_iter())
                .find(|c| !held_clusters.contains(c))
            {
                return Err(format!(
                    "{type_url}: routes to {cluster} sent before the Envoy accepted it (holds \
                     {held_clusters:?})"
                ));
            }
            if *type_url == CLUSTER
                && let Some(cluster) =
                    (self.used_clusters().into_iter()).find(|c| !bodies.contains_key(c))
            {
                return Err(format!(
                    "cluster {cluster} removed while the Envoy's routes use it"
                ));
            }
            self.unanswered.insert(type_url, (nonce.clone(), bodies));
        }
        Ok(())
    }

    /// A request of `type_url` answering `nonce`; `subscribe`/`unsubscribe` are the
    /// changes to the subscription (delta), from which SotW sends the whole list.
    fn request(
        &self,
        type_url: &'static str,
        nonce: &str,
        error: bool,
        subscribe: &[String],
        unsubscribe: &[String],
    ) -> Request {
        let error_detail = error.then(|| Status {
            code: 3,
            message: "refused".into(),
            details: vec![],
        });
        match self.protocol {
            Protocol::Sotw => Request::Sotw(DiscoveryRequest {
                type_url: type_url.to_string(),
                resource_names: match type_url {
                    ENDPOINT => self.endpoint_names.iter().cloned().collect(),
                    ROUTE => vec![ROUTE_CONFIG.into()],
                    _ => Vec::new(),
                },
                response_nonce: nonce.to_string(),
                error_detail,
                ..Default::default()
            }),
            Protocol::Delta => Request::Delta(DeltaDiscoveryRequest {
                type_url: type_url.to_string(),
                resource_names_subscribe: subscribe.to_vec(),
                resource_names_unsubscribe: unsubscribe.to_vec(),
                response_nonce: nonce.to_string(),
                error_detail,
                ..Default::default()
            }),
        }
    }

    fn send(&mut self, session: &mut Session, request: Request) -> Result<(), String> {
        let now = Instant::now();
        let out = match request {
            Request::Sotw(r) => session.on_sotw_request(r, now),
            Request::Delta(r) => session.on_delta_request(r, now),
        };
        self.receive(out)
    }

    /// Answers the last response of a type: ACK (it holds it now) or NACK. Afterwards it
    /// asks for the endpoints of the clusters it holds, for routes once it has a listener,
    /// and (in parts) for the virtual hosts once it has the parts configuration, as Envoy
    /// does.
    fn answer(
        &mut self,
        session: &mut Session,
        type_url: &'static str,
        accept: bool,
    ) -> Result<(), String> {
        let Some((nonce, bodies)) = self.unanswered.remove(type_url) else {
            return Ok(());
        };
        if accept {
            self.held.insert(type_url, bodies);
        }
        let request = self.request(type_url, &nonce, !accept, &[], &[]);
        self.send(session, request)?;
        let clusters = self.held_names(CLUSTER);
        if type_url == CLUSTER && accept && clusters != self.endpoint_names {
            let added: Vec<String> = clusters.difference(&self.endpoint_names).cloned().collect();
            let gone: Vec<String> = self.endpoint_names.difference(&clusters).cloned().collect();
            self.endpoint_names = clusters;
            if let Some(held) = self.held.get_mut(ENDPOINT) {
                held.retain(|name, _| !gone.contains(name));
            }
            let nonce = self
                .unanswered
                .get(ENDPOINT)
                .map(|(n, _)| n.clone())
                .unwrap_or_default();
            let request = self.request(ENDPOINT, &nonce, false, &added, &gone);
            self.send(session, request)?;
        }
        if type_url == LISTENER && accept && !self.asked_routes {
            self.asked_routes = true;
            let request = self.request(ROUTE, "", false, &[self.route_config()], &[]);
            self.send(session, request)?;
        }
        // Its VHDS subscription comes with the parts configuration it takes.
        if type_url == ROUTE
            && accept
            && self.held_names(ROUTE).contains(&self.route_config())
            && self.parts
            && !self.asked_virtual_hosts
        {
            self.asked_virtual_hosts = true;
            let request = self.request(VIRTUAL_HOST, "", false, &[self.route_config()], &[]);
            self.send(session, request)?;
        }
        Ok(())
    }
}

fn run(protocol: Protocol, parts: bool, ops: &[Op]) -> Result<(), String> {
    let now = Instant::now();
    let mut session = Session::new(protocol, Ordering::MakeBeforeBreak);
    let mut envoy = Envoy::new(protocol, parts);
    for type_url in [CLUSTER, LISTENER] {
        let request = envoy.request(type_url, "", false, &[], &[]);
        envoy.send(&mut session, request)?;
    }
    for op in ops {
        match op {
            Op::Desired(k) => envoy.receive(session.set_desired(snapshot(*k), now))?,
            Op::Ack(t) => envoy.answer(&mut session, TYPES[*t], true)?,
            Op::Nack(t) => envoy.answer(&mut session, TYPES[*t], false)?,
            // Envoy asks for virtual hosts only by the namespace of a parts configuration
            // it holds: no request of that type comes before.
            Op::Stale(t) if TYPES[*t] == VIRTUAL_HOST && !envoy.asked_virtual_hosts => {}
            Op::Stale(t) => {
                let request = envoy.request(TYPES[*t], "999", false, &[], &[]);
                envoy.send(&mut session, request)?;
            }
        }
    }
    // From here on the Envoy accepts everything: a new snapshot must arrive whole.
    envoy.receive(session.set_desired(snapshot(7), now))?;
    for _ in 0..40 {
        let pending: Vec<&'static str> = envoy.unanswered.keys().copied().collect();
        if pending.is_empty() {
            break;
        }
        for type_url in pending {
            envoy.answer(&mut session, type_url, true)?;
        }
    }
    if parts {
        let newest = [
            vhds::virtual_host_name(ROUTE_CONFIG, "app"),
            vhds::virtual_host_name(ROUTE_CONFIG, "only7"),
        ];
        let hosts = envoy.held_names(VIRTUAL_HOST);
        let routed = envoy.used_clusters();
        if hosts != BTreeSet::from(newest) || routed != BTreeSet::from(["c7".to_string()]) {
            return Err(format!(
                "virtual hosts not brought to the newest snapshot: {hosts:?} routing to \
                 {routed:?}; {:#?}",
                session.status()
            ));
        }
    }
    let routed = envoy.used_clusters().into_iter().next();
    if routed.as_deref() != Some("c7") || !envoy.held_names(CLUSTER).contains("c7") {
        return Err(format!(
            "not brought to the newest snapshot: routes to {routed:?}, clusters {:?}; {:#?}",
            envoy.held_names(CLUSTER),
            session.status()
        ));
    }
    if envoy.held_names(CLUSTER) != BTreeSet::from(["c7".to_string()]) {
        return Err(format!(
            "old clusters left behind: {:?}",
            envoy.held_names(CLUSTER)
        ));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5_000, ..ProptestConfig::default() })]

    #[test]
    fn any_answer_order_keeps_make_before_break_and_ends_in_sync(
        kind in 0u8..3,
        ops in proptest::collection::vec(op(), 0..40)
    ) {
        // SotW; delta with the route configuration whole; delta in parts (VHDS).
        let protocol = if kind == 0 { Protocol::Sotw } else { Protocol::Delta };
        let parts = kind == 2;
        if let Err(e) = run(protocol, parts, &ops) {
            prop_assert!(false, "{protocol:?} (in parts: {parts}): {e}");
        }
    }
}
