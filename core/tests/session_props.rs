//! The SotW session state machine against an Envoy that ACKs, NACKs and repeats itself in
//! any order: it never sends routes to a cluster the Envoy has not accepted (I1), never
//! removes a cluster the Envoy's accepted routes still use (I2), and, once the Envoy
//! answers honestly, brings it to the newest snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
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

/// A SotW Envoy: what it accepted of each type, the last response of each type it has
/// not answered yet, and what it subscribes to.
#[derive(Default)]
struct Envoy {
    held: BTreeMap<&'static str, BTreeMap<String, String>>,
    unanswered: BTreeMap<&'static str, (String, BTreeMap<String, String>)>,
    asked_routes: bool,
    endpoint_names: BTreeSet<String>,
}

impl Envoy {
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
            let Response::Sotw(r) = response else {
                return Err("a SotW session sent a delta response".into());
            };
            let type_url = TYPES
                .iter()
                .find(|t| **t == r.type_url)
                .ok_or_else(|| format!("unknown type {}", r.type_url))?;
            let bodies: BTreeMap<String, String> = r
                .resources
                .iter()
                .map(|res| {
                    (
                        res.name.clone(),
                        String::from_utf8_lossy(&res.body.value).to_string(),
                    )
                })
                .collect();
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
            self.unanswered.insert(type_url, (r.nonce.clone(), bodies));
        }
        Ok(())
    }

    fn request(&self, type_url: &'static str, nonce: &str, error: bool) -> DiscoveryRequest {
        let names: Vec<String> = match type_url {
            ENDPOINT => self.endpoint_names.iter().cloned().collect(),
            ROUTE => vec!["switchyard".into()],
            _ => Vec::new(),
        };
        DiscoveryRequest {
            type_url: type_url.to_string(),
            resource_names: names,
            response_nonce: nonce.to_string(),
            error_detail: error.then(|| Status {
                code: 3,
                message: "refused".into(),
                details: vec![],
            }),
            ..Default::default()
        }
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
        let now = Instant::now();
        let out = session.on_sotw_request(self.request(type_url, &nonce, !accept), now);
        self.receive(out)?;
        let clusters = self.held_names(CLUSTER);
        if type_url == CLUSTER && accept && clusters != self.endpoint_names {
            self.endpoint_names = clusters;
            let nonce = self
                .unanswered
                .get(ENDPOINT)
                .map(|(n, _)| n.clone())
                .unwrap_or_default();
            let out = session.on_sotw_request(self.request(ENDPOINT, &nonce, false), now);
            self.receive(out)?;
        }
        if type_url == LISTENER && accept && !self.asked_routes {
            self.asked_routes = true;
            let out = session.on_sotw_request(self.request(ROUTE, "", false), now);
            self.receive(out)?;
        }
        Ok(())
    }
}

fn run(ops: &[Op]) -> Result<(), String> {
    let now = Instant::now();
    let mut session = Session::new(Protocol::Sotw, Ordering::MakeBeforeBreak);
    let mut envoy = Envoy::default();
    envoy.receive(session.on_sotw_request(envoy.request(CLUSTER, "", false), now))?;
    envoy.receive(session.on_sotw_request(envoy.request(LISTENER, "", false), now))?;
    for op in ops {
        match op {
            Op::Desired(k) => envoy.receive(session.set_desired(snapshot(*k), now))?,
            Op::Ack(t) => envoy.answer(&mut session, TYPES[*t], true)?,
            Op::Nack(t) => envoy.answer(&mut session, TYPES[*t], false)?,
            Op::Stale(t) => {
                let out = session.on_sotw_request(envoy.request(TYPES[*t], "999", false), now);
                envoy.receive(out)?;
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
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    #[test]
    fn any_answer_order_keeps_make_before_break_and_ends_in_sync(
        ops in proptest::collection::vec(op(), 0..40)
    ) {
        if let Err(e) = run(&ops) {
            prop_assert!(false, "{e}");
        }
    }
}
