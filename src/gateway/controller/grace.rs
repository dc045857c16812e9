//! A served route's change that would newly answer 500 waits a while for what it lacks.
//!
//! A GitOps sync applies objects in its own order: an HTTPRoute changed to a backend in
//! another namespace may land a second before the ReferenceGrant that allows it, or before
//! the Service. The Gateway API asks for 500 where a backendRef cannot be used, and a route
//! that was never served gets that at once. But a route whose last generation had every
//! backendRef resolved, changed so that one is not (its Service or ReferenceGrant is not
//! there: `BackendNotFound`, `RefNotPermitted`), is lowered as that last generation for up to
//! the grace period. Its status says so: ResolvedRefs False on the new generation, Served on
//! the one that keeps serving. The grace ends when what was missing comes (the new
//! generation is lowered and rolled out as any change) or when the period is over (the new
//! generation is served as the specification asks, with its 500s); each new generation
//! gets a period of its own.
//!
//! Kept in memory by the leader: a leader that takes over during a grace serves the new
//! generation as it is.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use kube::Resource;
use tokio::time::Instant;

use crate::gateway::api::grpcroutes::GrpcRoute;
use crate::gateway::api::httproutes::HttpRoute;
use crate::gateway::api::tcproutes::TcpRoute;
use crate::gateway::api::tlsroutes::TlsRoute;
use crate::gateway::api::udproutes::UdpRoute;
use crate::gateway::translate::gateway::{GRPC_ROUTE, HTTP_ROUTE, TCP_ROUTE, TLS_ROUTE, UDP_ROUTE};
use crate::gateway::translate::{Cond, Inputs, RouteOutcome, Translation};

/// Why a backendRef cannot be used that another object may yet mend: its Service (or its
/// port) is not there, or the ReferenceGrant that allows it.
const AWAITABLE: [&str; 2] = ["BackendNotFound", "RefNotPermitted"];

/// A route whose change waits: the generation lowered meanwhile, and until when.
#[derive(Clone, Debug, PartialEq)]
pub struct Waiting {
    pub kept_generation: i64,
    pub until: Instant,
    /// The grace period it was given.
    pub period: Duration,
}

/// The routes that wait, by (kind, `namespace/name`), as the statuses name them.
pub type WaitingRoutes = BTreeMap<(&'static str, String), Waiting>;

/// The grace of every route kind.
pub struct Graces {
    period: Duration,
    http: Grace<HttpRoute>,
    grpc: Grace<GrpcRoute>,
    tls: Grace<TlsRoute>,
    tcp: Grace<TcpRoute>,
    udp: Grace<UdpRoute>,
}

/// The routes to lower in a pass where some wait: of each kind, the routes with every
/// waiting one replaced by its kept generation (None: the kind's routes as they are).
#[derive(Default)]
pub struct Lowered {
    routes: Option<Vec<HttpRoute>>,
    grpc_routes: Option<Vec<GrpcRoute>>,
    tls_routes: Option<Vec<TlsRoute>>,
    tcp_routes: Option<Vec<TcpRoute>>,
    udp_routes: Option<Vec<UdpRoute>>,
}

impl Lowered {
    /// `inputs`, with the routes to lower.
    pub fn inputs<'a>(&'a self, inputs: &Inputs<'a>) -> Inputs<'a> {
        Inputs {
            routes: self.routes.as_deref().unwrap_or(inputs.routes),
            grpc_routes: self.grpc_routes.as_deref().unwrap_or(inputs.grpc_routes),
            tls_routes: self.tls_routes.as_deref().unwrap_or(inputs.tls_routes),
            tcp_routes: self.tcp_routes.as_deref().unwrap_or(inputs.tcp_routes),
            udp_routes: self.udp_routes.as_deref().unwrap_or(inputs.udp_routes),
            ..*inputs
        }
    }
}

impl Graces {
    /// A grace of `period` (zero: none).
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            http: Grace::new(HTTP_ROUTE),
            grpc: Grace::new(GRPC_ROUTE),
            tls: Grace::new(TLS_ROUTE),
            tcp: Grace::new(TCP_ROUTE),
            udp: Grace::new(UDP_ROUTE),
        }
    }

    /// Takes in a pass's routes and their translation: the routes to lower, and those that
    /// wait.
    pub fn review(
        &mut self,
        inputs: &Inputs<'_>,
        translation: &Translation,
        now: Instant,
    ) -> (Lowered, WaitingRoutes) {
        let mut waiting = WaitingRoutes::new();
        let period = self.period;
        let lowered = Lowered {
            routes: (self.http).review(
                inputs.routes,
                &translation.routes,
                period,
                now,
                &mut waiting,
            ),
            grpc_routes: (self.grpc).review(
                inputs.grpc_routes,
                &translation.grpc_routes,
                period,
                now,
                &mut waiting,
            ),
            tls_routes: (self.tls).review(
                inputs.tls_routes,
                &translation.tls_routes,
                period,
                now,
                &mut waiting,
            ),
            tcp_routes: (self.tcp).review(
                inputs.tcp_routes,
                &translation.tcp_routes,
                period,
                now,
                &mut waiting,
            ),
            udp_routes: (self.udp).review(
                inputs.udp_routes,
                &translation.udp_routes,
                period,
                now,
                &mut waiting,
            ),
        };
        (lowered, waiting)
    }
}

/// What the grace keeps of one route.
struct Kept<K> {
    /// Its last generation whose backendRefs all resolved, as long as it is what serves.
    object: K,
    /// Where that generation attached: a later one waits only for the same parents.
    parents: Vec<Parent>,
    /// A later generation that waits, and since when.
    waiting: Option<(i64, Instant)>,
}

/// A parent a route attached to: Gateway (namespace, name), ListenerSet, sectionName, port.
type Parent = (
    String,
    String,
    Option<(String, String)>,
    Option<String>,
    Option<i32>,
);

fn parents(outcome: &RouteOutcome) -> Vec<Parent> {
    (outcome.parents.iter())
        .map(|p| {
            (
                p.gateway_namespace.clone(),
                p.gateway.clone(),
                p.listener_set.clone(),
                p.section_name.clone(),
                p.port,
            )
        })
        .collect()
}

/// The grace of the routes of one kind.
pub struct Grace<K> {
    kind: &'static str,
    kept: HashMap<(String, String), Kept<K>>,
}

impl<K: Resource + Clone> Grace<K> {
    pub fn new(kind: &'static str) -> Self {
        Self {
            kind,
            kept: HashMap::new(),
        }
    }

    /// Takes in this pass's routes of the kind and the translation's outcomes of them.
    /// Returns the routes to lower, when any waits (each waiting one replaced by its kept
    /// generation); the waiting ones go into `waiting`.
    pub fn review(
        &mut self,
        objects: &[K],
        outcomes: &[RouteOutcome],
        period: Duration,
        now: Instant,
        waiting: &mut WaitingRoutes,
    ) -> Option<Vec<K>> {
        if period.is_zero() {
            self.kept.clear();
            return None;
        }
        let outcomes: BTreeMap<(&str, &str), &RouteOutcome> = (outcomes.iter())
            .map(|o| ((o.namespace.as_str(), o.name.as_str()), o))
            .collect();
        let mut present = HashSet::with_capacity(objects.len());
        let mut lowered: Option<Vec<K>> = None;
        for (i, object) in objects.iter().enumerate() {
            let meta = object.meta();
            let key = (
                meta.namespace.clone().unwrap_or_default(),
                meta.name.clone().unwrap_or_default(),
            );
            let outcome = outcomes.get(&(key.0.as_str(), key.1.as_str()));
            let kept = match outcome {
                Some(o) if resolved(o) => {
                    self.keep(&key, object, o);
                    None
                }
                Some(o) if awaits(o) => self.wait(&key, object, o, period, now),
                // What serves now is this generation, as it is: nothing earlier may come
                // back.
                _ => {
                    self.kept.remove(&key);
                    None
                }
            };
            if let Some((object, until)) = kept {
                let kept_generation = object.meta().generation.unwrap_or(0);
                let id = (self.kind, format!("{}/{}", key.0, key.1));
                let held = Waiting {
                    kept_generation,
                    until,
                    period,
                };
                waiting.insert(id, held);
                lowered
                    .get_or_insert_with(|| objects[..i].to_vec())
                    .push(object);
            } else if let Some(lowered) = lowered.as_mut() {
                lowered.push(object.clone());
            }
            present.insert(key);
        }
        self.kept.retain(|key, _| present.contains(key));
        lowered
    }

    /// `object` resolved: it is the generation to keep (unless it already is).
    fn keep(&mut self, key: &(String, String), object: &K, outcome: &RouteOutcome) {
        let same = self.kept.get(key).is_some_and(|k| {
            let (a, b) = (k.object.meta(), object.meta());
            a.uid == b.uid && a.generation == b.generation
        });
        if !same {
            let kept = Kept {
                object: object.clone(),
                parents: parents(outcome),
                waiting: None,
            };
            self.kept.insert(key.clone(), kept);
        }
    }

    /// `object` awaits what its backendRefs name: its route's kept generation and until when
    /// it is lowered instead, while the period lasts (the same object, a later generation,
    /// the same parents). Once the period is over the kept generation goes: `object` is
    /// served as it is.
    fn wait(
        &mut self,
        key: &(String, String),
        object: &K,
        outcome: &RouteOutcome,
        period: Duration,
        now: Instant,
    ) -> Option<(K, Instant)> {
        let meta = object.meta();
        let generation = meta.generation.unwrap_or(0);
        let kept = self.kept.get_mut(key)?;
        let earlier = kept.object.meta().uid == meta.uid
            && kept.object.meta().generation.unwrap_or(0) < generation
            && kept.parents == parents(outcome);
        if !earlier {
            self.kept.remove(key);
            return None;
        }
        let since = match kept.waiting {
            Some((waiting, since)) if waiting == generation => since,
            _ => {
                kept.waiting = Some((generation, now));
                now
            }
        };
        let until = since + period;
        if now < until {
            Some((kept.object.clone(), until))
        } else {
            self.kept.remove(key);
            None
        }
    }
}

/// Whether every parent accepts the route with every backendRef resolved.
fn resolved(outcome: &RouteOutcome) -> bool {
    !outcome.parents.is_empty()
        && (outcome.parents.iter()).all(|p| p.conditions.iter().all(Cond::is_true))
}

/// Whether every parent accepts the route and what stops a backendRef from resolving is
/// an object that may yet come.
fn awaits(outcome: &RouteOutcome) -> bool {
    let accepted = |conds: &[Cond]| conds.iter().any(|c| c.type_ == "Accepted" && c.is_true());
    let awaiting = |conds: &[Cond]| {
        conds
            .iter()
            .any(|c| c.type_ == "ResolvedRefs" && !c.is_true() && AWAITABLE.contains(&c.reason))
    };
    !outcome.parents.is_empty()
        && (outcome.parents.iter()).all(|p| accepted(&p.conditions))
        && (outcome.parents.iter()).any(|p| awaiting(&p.conditions))
}

/// The Served condition of a route parent whose change waits, from the one of the kept
/// generation: what serves, and why the new generation is not served yet. Its
/// observedGeneration is the kept one's.
pub fn served_while_waiting(served: Cond, waiting: &Waiting, generation: i64) -> Cond {
    let note = format!(
        "generation {generation} waits, at most {}, for the objects its backendRefs name \
         (see ResolvedRefs)",
        switchyard_core::duration::format(waiting.period)
    );
    let message = if served.is_true() {
        format!(
            "every Envoy serves generation {}; {note}",
            waiting.kept_generation
        )
    } else {
        format!("{}; {note}", served.message)
    };
    Cond { message, ..served }
}

#[cfg(test)]
mod tests;
