//! Sequences of xDS requests (SotW or delta) into one session's state machine, between
//! snapshots that move routes from cluster to cluster: ACKs, NACKs, subscriptions, and
//! noise (unknown types, stale and made-up nonces, arbitrary versions, names and what a
//! reconnecting Envoy claims to hold).
//!
//! The Envoy is modelled by what it holds: a response it ACKed, and what it said it held
//! when its stream began. It subscribes to clusters by wildcard, as Envoy does over ADS.
//! The snapshots serve route configurations whole and in parts (VHDS, the default for
//! delta Envoys): an Envoy may ask for either, and for virtual hosts by namespace or name.
//! Checked: no panic, and make-before-break (I1) — no route configuration and no virtual
//! host is ever sent that sends traffic to a cluster the Envoy does not hold.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use arbitrary::Arbitrary;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::rpc::Status;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use switchyard::standalone::file::RouteSpec;
use switchyard_core::translate::translate;
use switchyard_core::xds::session::{Ordering, Protocol, Response, Session};
use switchyard_core::xds::snapshot::{CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, VIRTUAL_HOST};
use switchyard_core::xds::{Snapshot, vhds};
use switchyard_fuzz::{model_of, route_file};

const TYPES: [&str; 6] = [CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, VIRTUAL_HOST];
const MAX_STEPS: usize = 256;

#[derive(Arbitrary, Debug)]
struct Input {
    delta: bool,
    steps: Vec<Step>,
}

#[derive(Arbitrary, Debug)]
enum Step {
    /// A new desired snapshot.
    Publish(u8),
    /// The Envoy accepts the last response of a type.
    Ack(u8),
    /// The Envoy refuses it.
    Nack(u8, String),
    /// A subscription (SotW: the whole; delta: names added), answering nothing new.
    Subscribe(u8, Vec<u8>),
    /// Delta: names dropped.
    Unsubscribe(u8, Vec<u8>),
    Drain(bool),
    Noise(Noise),
}

#[derive(Arbitrary, Debug)]
struct Noise {
    type_url: TypeChoice,
    nonce: NonceChoice,
    version: String,
    names: Vec<String>,
    error: Option<String>,
    held: Vec<(String, String)>,
}

#[derive(Arbitrary, Debug)]
enum TypeChoice {
    Known(u8),
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum NonceChoice {
    Empty,
    /// One of a response already answered.
    Stale(u8),
    MadeUp(String),
}

/// Snapshots a switch goes through: routes on one cluster, on another, split, none.
fn snapshots() -> &'static [Arc<Snapshot>] {
    static SNAPSHOTS: OnceLock<Vec<Arc<Snapshot>>> = OnceLock::new();
    SNAPSHOTS.get_or_init(|| {
        let spec = |yaml: &str| -> RouteSpec {
            match serde_json::from_str(yaml) {
                Ok(spec) => spec,
                Err(e) => panic!("fuzz route {yaml}: {e}"),
            }
        };
        let to = |backends: &str| {
            spec(&format!(
                r#"{{"hosts": ["web.test"], "rules": [{{"backends": [{backends}]}}]}}"#
            ))
        };
        let blue = r#"{"service": "blue", "port": 80}"#;
        let green = r#"{"service": "green", "port": 80}"#;
        let other = spec(
            r#"{"hosts": ["other.test"], "rules": [{"match": {"pathPrefix": "/a"}, "backends": [{"service": "green", "port": 80}]}]}"#,
        );
        [
            vec![to(blue)],
            vec![to(green)],
            vec![to(&format!("{blue}, {green}"))],
            vec![to(blue), other.clone()],
            vec![other],
            vec![],
        ]
        .into_iter()
        .map(|specs| {
            let mut model = model_of(&route_file(specs));
            model.listeners.virtual_host_discovery = true;
            Arc::new(translate(&model).snapshot)
        })
        .collect()
    })
}

/// The clusters a route configuration or a virtual host sends traffic to.
fn routed_clusters(type_url: &str, body: &[u8]) -> BTreeSet<String> {
    let virtual_hosts = if type_url == VIRTUAL_HOST {
        let Ok(vh) = VirtualHost::decode(body) else {
            panic!("the session sent a virtual host that does not decode");
        };
        vec![vh]
    } else {
        let Ok(config) = RouteConfiguration::decode(body) else {
            panic!("the session sent a route configuration that does not decode");
        };
        config.virtual_hosts
    };
    let mut out = BTreeSet::new();
    for vh in &virtual_hosts {
        for route in &vh.routes {
            if let Some(Action::Route(action)) = &route.action {
                match &action.cluster_specifier {
                    Some(ClusterSpecifier::Cluster(name)) => {
                        out.insert(name.clone());
                    }
                    Some(ClusterSpecifier::WeightedClusters(w)) => {
                        out.extend(w.clusters.iter().map(|c| c.name.clone()));
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

/// What the Envoy holds and what it was sent, per type.
#[derive(Default)]
struct Envoy {
    held: BTreeMap<String, BTreeSet<String>>,
    held_version: BTreeMap<String, String>,
    /// The last response of each type it has not answered.
    unanswered: BTreeMap<String, Response>,
    answered_nonces: Vec<String>,
    answered_by_type: BTreeMap<String, String>,
    sent_nonces: BTreeSet<String>,
    subscribed: BTreeMap<String, BTreeSet<String>>,
    started: BTreeSet<String>,
}

impl Envoy {
    /// Records the session's responses, checking each route configuration against what
    /// the Envoy holds.
    fn receive(&mut self, responses: Vec<Response>) {
        for response in responses {
            let nonce = response.nonce().to_owned();
            assert!(
                self.sent_nonces.insert(nonce.clone()),
                "nonce {nonce} sent twice"
            );
            let type_url = response.type_url().to_owned();
            if type_url == ROUTE || type_url == VIRTUAL_HOST {
                let resources = match &response {
                    Response::Sotw(r) => &r.resources,
                    Response::Delta(r) => &r.resources,
                };
                let clusters = self.held.get(CLUSTER).cloned().unwrap_or_default();
                for config in resources {
                    for cluster in routed_clusters(&type_url, &config.body.value) {
                        assert!(
                            clusters.contains(&cluster),
                            "{type_url} {} sent routing to cluster {cluster}, which the Envoy does not hold (it holds {clusters:?})",
                            config.name
                        );
                    }
                }
            }
            self.unanswered
                .insert(response.type_url().to_owned(), response);
        }
    }

    /// Takes the last response of `type_url` as held.
    fn accept(&mut self, type_url: &str) -> Option<Response> {
        let response = self.unanswered.remove(type_url)?;
        let held = self.held.entry(type_url.to_owned()).or_default();
        match &response {
            Response::Sotw(r) => {
                *held = r.resources.iter().map(|r| r.name.clone()).collect();
                self.held_version
                    .insert(type_url.to_owned(), r.version_info.clone());
            }
            Response::Delta(r) => {
                for name in &r.removed_resources {
                    held.remove(name);
                }
                held.extend(r.resources.iter().map(|r| r.name.clone()));
            }
        }
        self.answered(type_url, &response);
        Some(response)
    }

    fn refuse(&mut self, type_url: &str) -> Option<Response> {
        let response = self.unanswered.remove(type_url)?;
        self.answered(type_url, &response);
        Some(response)
    }

    fn answered(&mut self, type_url: &str, response: &Response) {
        self.answered_nonces.push(response.nonce().to_owned());
        self.answered_by_type
            .insert(type_url.to_owned(), response.nonce().to_owned());
    }

    /// A nonce no unanswered response carries: one answered before, made up, or none.
    fn harmless_nonce(&self, choice: &NonceChoice) -> String {
        let nonce = match choice {
            NonceChoice::Empty => String::new(),
            NonceChoice::Stale(i) if !self.answered_nonces.is_empty() => {
                self.answered_nonces[*i as usize % self.answered_nonces.len()].clone()
            }
            NonceChoice::Stale(_) => String::new(),
            NonceChoice::MadeUp(n) => n.clone(),
        };
        if self.unanswered.values().any(|r| r.nonce() == nonce) {
            String::new()
        } else {
            nonce
        }
    }

    /// The nonce of the last response of this type the Envoy answered, if any.
    fn last_answered(&self, type_url: &str) -> String {
        self.answered_by_type
            .get(type_url)
            .cloned()
            .unwrap_or_default()
    }
}

fn type_of(i: u8) -> &'static str {
    TYPES[i as usize % TYPES.len()]
}

/// Names to subscribe to. Clusters are subscribed to as Envoy does in ADS, by wildcard:
/// routes name clusters the Envoy must hold, and a node that picks its clusters by name
/// (on-demand CDS) asks for those as it needs them. Virtual hosts: by the namespace of
/// their parts configuration, as Envoy does, or by name.
fn names_of(type_url: &str, picks: &[u8]) -> Vec<String> {
    if type_url == CLUSTER {
        return Vec::new();
    }
    let all: Vec<String> = snapshots()
        .iter()
        .filter_map(|s| s.resources(type_url))
        .flat_map(|r| r.keys().cloned())
        .flat_map(|name| {
            let namespace = (type_url == VIRTUAL_HOST).then(|| vhds::namespace(&name).to_owned());
            namespace.into_iter().chain([name])
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if all.is_empty() {
        return Vec::new();
    }
    picks
        .iter()
        .take(16)
        .map(|p| all[*p as usize % all.len()].clone())
        .collect()
}

fn node() -> Option<Node> {
    Some(Node {
        id: "envoy-0".into(),
        cluster: "fleet".into(),
        ..Node::default()
    })
}

fn sotw(type_url: &str, version: String, nonce: String, names: Vec<String>) -> DiscoveryRequest {
    DiscoveryRequest {
        node: node(),
        type_url: type_url.to_owned(),
        version_info: version,
        response_nonce: nonce,
        resource_names: names,
        ..DiscoveryRequest::default()
    }
}

fn run(input: Input) {
    let protocol = if input.delta {
        Protocol::Delta
    } else {
        Protocol::Sotw
    };
    let mut session = Session::new(protocol, Ordering::MakeBeforeBreak);
    let mut envoy = Envoy::default();
    let now = Instant::now();
    for step in input.steps.into_iter().take(MAX_STEPS) {
        let responses = match step {
            Step::Publish(i) => {
                let all = snapshots();
                session.set_desired(all[i as usize % all.len()].clone(), now)
            }
            Step::Drain(on) => session.set_draining(on, now),
            Step::Ack(t) => {
                let type_url = type_of(t);
                let Some(response) = envoy.accept(type_url) else {
                    continue;
                };
                match response {
                    Response::Sotw(r) => {
                        let names = envoy.subscribed.get(type_url).cloned().unwrap_or_default();
                        session.on_sotw_request(
                            sotw(
                                type_url,
                                r.version_info,
                                r.nonce,
                                names.into_iter().collect(),
                            ),
                            now,
                        )
                    }
                    Response::Delta(r) => session.on_delta_request(
                        DeltaDiscoveryRequest {
                            type_url: type_url.to_owned(),
                            response_nonce: r.nonce,
                            ..DeltaDiscoveryRequest::default()
                        },
                        now,
                    ),
                }
            }
            Step::Nack(t, error) => {
                let type_url = type_of(t);
                let Some(response) = envoy.refuse(type_url) else {
                    continue;
                };
                let error_detail = Some(Status {
                    code: 13,
                    message: error,
                    ..Status::default()
                });
                match response {
                    Response::Sotw(r) => {
                        let names = envoy.subscribed.get(type_url).cloned().unwrap_or_default();
                        let version = envoy
                            .held_version
                            .get(type_url)
                            .cloned()
                            .unwrap_or_default();
                        let mut request =
                            sotw(type_url, version, r.nonce, names.into_iter().collect());
                        request.error_detail = error_detail;
                        session.on_sotw_request(request, now)
                    }
                    Response::Delta(r) => session.on_delta_request(
                        DeltaDiscoveryRequest {
                            type_url: type_url.to_owned(),
                            response_nonce: r.nonce,
                            error_detail,
                            ..DeltaDiscoveryRequest::default()
                        },
                        now,
                    ),
                }
            }
            Step::Subscribe(t, picks) => {
                let type_url = type_of(t);
                let names = names_of(type_url, &picks);
                let subscribed = envoy.subscribed.entry(type_url.to_owned()).or_default();
                subscribed.extend(names.iter().cloned());
                if input.delta {
                    envoy.started.insert(type_url.to_owned());
                    session.on_delta_request(
                        DeltaDiscoveryRequest {
                            node: node(),
                            type_url: type_url.to_owned(),
                            resource_names_subscribe: names,
                            ..DeltaDiscoveryRequest::default()
                        },
                        now,
                    )
                } else {
                    // The whole subscription, answering nothing new: the nonce of the
                    // last response of the type answered, current only if none is
                    // unanswered (else the request is stale, and ignored).
                    let names = subscribed.iter().cloned().collect();
                    let version = envoy
                        .held_version
                        .get(type_url)
                        .cloned()
                        .unwrap_or_default();
                    let nonce = envoy.last_answered(type_url);
                    session.on_sotw_request(sotw(type_url, version, nonce, names), now)
                }
            }
            Step::Unsubscribe(t, picks) => {
                if !input.delta {
                    continue;
                }
                let type_url = type_of(t);
                let names = names_of(type_url, &picks);
                envoy.started.insert(type_url.to_owned());
                if let Some(subscribed) = envoy.subscribed.get_mut(type_url) {
                    for name in &names {
                        subscribed.remove(name);
                    }
                }
                session.on_delta_request(
                    DeltaDiscoveryRequest {
                        type_url: type_url.to_owned(),
                        resource_names_unsubscribe: names,
                        ..DeltaDiscoveryRequest::default()
                    },
                    now,
                )
            }
            Step::Noise(noise) => {
                let type_url = match noise.type_url {
                    TypeChoice::Known(i) => type_of(i).to_owned(),
                    TypeChoice::Other(t) => t,
                };
                let nonce = envoy.harmless_nonce(&noise.nonce);
                let error_detail = noise.error.map(|message| Status {
                    code: 13,
                    message,
                    ..Status::default()
                });
                let names: Vec<String> = if type_url == CLUSTER {
                    Vec::new()
                } else {
                    noise.names.into_iter().take(16).collect()
                };
                if input.delta {
                    // What a stream's first request claims to hold, the Envoy holds.
                    let first = envoy.started.insert(type_url.clone());
                    let held: BTreeMap<String, String> = if first {
                        noise.held.into_iter().take(16).collect()
                    } else {
                        BTreeMap::new()
                    };
                    envoy
                        .held
                        .entry(type_url.clone())
                        .or_default()
                        .extend(held.keys().cloned());
                    session.on_delta_request(
                        DeltaDiscoveryRequest {
                            node: node(),
                            type_url,
                            response_nonce: nonce,
                            resource_names_subscribe: names,
                            initial_resource_versions: held.into_iter().collect(),
                            error_detail,
                            ..DeltaDiscoveryRequest::default()
                        },
                        now,
                    )
                } else {
                    let mut request = sotw(&type_url, noise.version, nonce, names);
                    request.error_detail = error_detail;
                    session.on_sotw_request(request, now)
                }
            }
        };
        envoy.receive(responses);
        let _ = session.take_events();
        let _ = session.status();
    }
}

fuzz_target!(|input: Input| run(input));
