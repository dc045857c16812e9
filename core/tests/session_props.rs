//! The session state machine, SotW and delta, against an Envoy that ACKs, NACKs and repeats
//! itself in any order: it never sends routes to a cluster the Envoy has not accepted (I1), never
//! removes a cluster the Envoy's accepted routes still use (I2), and, once the Envoy
//! answers honestly, brings it to the newest snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status;
use proptest::prelude::*;
use switchyard_core::xds::session::Session;
use switchyard_core::xds::snapshot::{CLUSTER, ENDPOINT, LISTENER, ROUTE};
use switchyard_core::xds::wire::Response;
use switchyard_core::xds::{Ordering, Protocol, Resource, Snapshot};

fn res(type_url: &str, name: &str, content: &str) -> Resource {
    Resource::new(
        name,
        Any {
            type_url: type_url.to_string(),
            value: format!("{name}:{content}").into_bytes(),
        },
    )
}

/// Snapshot `k`: one route to cluster `c<k>`, with its endpoints and the listener.
fn snapshot(k: u8) -> Arc<Snapshot> {
    let cluster = format!("c{k}");
    Arc::new(Snapshot::new([
        res(CLUSTER, &cluster, "c"),
        res(ENDPOINT, &cluster, "e"),
        res(LISTENER, "http", "l"),
        res(ROUTE, "switchyard", &format!("to {cluster}")),
    ]))
}

#[derive(Clone, Debug)]
enum Op {
    Desired(u8),
    Ack(usize),
    Nack(usize),
    Stale(usize),
}

const TYPES: [&str; 4] = [CLUSTER, ENDPOINT, LISTENER, ROUTE];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..3).prop_map(Op::Desired),
        (0usize..4).prop_map(Op::Ack),
        (0usize..4).prop_map(Op::Ack),
        (0usize..4).prop_map(Op::Nack),
        (0usize..4).prop_map(Op::Stale),
    ]
}

/// An Envoy: what it accepted of each type, the last response of each type it has not
/// answered yet (what it would then hold), and what it subscribes to.
struct Envoy {
    protocol: Protocol,
    held: BTreeMap<&'static str, BTreeMap<String, String>>,
    unanswered: BTreeMap<&'static str, (String, BTreeMap<String, String>)>,
    asked_routes: bool,
    endpoint_names: BTreeSet<String>,
}

/// A request to the session, in the Envoy's protocol.
enum Request {
    Sotw(DiscoveryRequest),
    Delta(DeltaDiscoveryRequest),
}

impl Envoy {
    fn new(protocol: Protocol) -> Self {
        Self {
            protocol,
            held: BTreeMap::new(),
            unanswered: BTreeMap::new(),
            asked_routes: false,
            endpoint_names: BTreeSet::new(),
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
            .get("switchyard")
            .and_then(|b| b.strip_prefix("switchyard:to "))
            .map(str::to_owned)
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
            // What the Envoy holds once it accepts: SotW sends it whole, delta the changes.
            let bodies: BTreeMap<String, String> = match removed {
                None => sent.collect(),
                Some(removed) => {
                    let mut bodies = self.held.get(type_url).cloned().unwrap_or_default();
                    bodies.extend(sent);
                    for name in removed {
                        bodies.remove(name);
                    }
                    bodies
                }
            };
            if *type_url == ROUTE
                && let Some(cluster) = Self::routed_cluster(&bodies)
                && !self.held_names(CLUSTER).contains(&cluster)
            {
                return Err(format!(
                    "routes to {cluster} sent before the Envoy accepted it (holds {:?})",
                    self.held_names(CLUSTER)
                ));
            }
            if *type_url == CLUSTER
                && let Some(cluster) = self.held.get(ROUTE).and_then(Self::routed_cluster)
                && !bodies.contains_key(&cluster)
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
                    ROUTE => vec!["switchyard".into()],
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
    /// asks for the endpoints of the clusters it holds, and for routes once it has a
    /// listener, as Envoy does.
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
            let request = self.request(ROUTE, "", false, &["switchyard".into()], &[]);
            self.send(session, request)?;
        }
        Ok(())
    }
}

fn run(protocol: Protocol, ops: &[Op]) -> Result<(), String> {
    let now = Instant::now();
    let mut session = Session::new(protocol, Ordering::MakeBeforeBreak);
    let mut envoy = Envoy::new(protocol);
    for type_url in [CLUSTER, LISTENER] {
        let request = envoy.request(type_url, "", false, &[], &[]);
        envoy.send(&mut session, request)?;
    }
    for op in ops {
        match op {
            Op::Desired(k) => envoy.receive(session.set_desired(snapshot(*k), now))?,
            Op::Ack(t) => envoy.answer(&mut session, TYPES[*t], true)?,
            Op::Nack(t) => envoy.answer(&mut session, TYPES[*t], false)?,
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
    let routed = envoy.held.get(ROUTE).and_then(Envoy::routed_cluster);
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
        delta in any::<bool>(),
        ops in proptest::collection::vec(op(), 0..40)
    ) {
        let protocol = if delta { Protocol::Delta } else { Protocol::Sotw };
        if let Err(e) = run(protocol, &ops) {
            prop_assert!(false, "{protocol:?}: {e}");
        }
    }
}
