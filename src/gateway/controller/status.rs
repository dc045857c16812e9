//! The statuses of a pass: every object of Switchyard's gets the conditions the
//! translation decided, with what only the fleet can tell (Programmed, Served) added, and
//! hands them to the status writer, which writes what differs from what the object shows.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use serde_json::{Value, json};

use super::Settings;
use super::grace::{WaitingRoutes, served_while_waiting};
use super::policies;
use crate::gateway::api::backendtlspolicies::BackendTlsPolicy;
use crate::gateway::api::gatewayclasses::GatewayClass;
use crate::gateway::api::gateways::Gateway;
use crate::gateway::api::grpcroutes::GrpcRoute;
use crate::gateway::api::httproutes::HttpRoute;
use crate::gateway::api::listenersets::ListenerSet;
use crate::gateway::api::tcproutes::TcpRoute;
use crate::gateway::api::tlsroutes::TlsRoute;
use crate::gateway::api::udproutes::UdpRoute;
use crate::gateway::rollout::{Outcome, UnitState};
use crate::gateway::service::GatewayKey;
use crate::gateway::translate::gateway::{GRPC_ROUTE, HTTP_ROUTE, TCP_ROUTE, TLS_ROUTE, UDP_ROUTE};
use crate::gateway::translate::{
    Cond, GROUP, GatewayOutcome, ListenerOutcome, ListenerSetOutcome, ParentOutcome, RouteOutcome,
    Translation,
};
use crate::gateway::unit::Unit;
use crate::k8s::status::{StatusKind, StatusUpdate, StatusWriter, Write, condition_of};

/// What the API server holds, to write only what changes.
pub(super) struct Written<'a> {
    pub classes: &'a [GatewayClass],
    pub gateways: &'a [Gateway],
    pub listener_sets: &'a [ListenerSet],
    pub routes: &'a [HttpRoute],
    pub grpc_routes: &'a [GrpcRoute],
    pub tls_routes: &'a [TlsRoute],
    pub tcp_routes: &'a [TcpRoute],
    pub udp_routes: &'a [UdpRoute],
    pub policies: &'a [BackendTlsPolicy],
    pub addresses: &'a BTreeMap<GatewayKey, Vec<(String, String)>>,
    pub units: &'a [Unit],
    pub outcome: &'a Outcome,
    /// Routes whose change waits for an object (see [`super::grace`]).
    pub waiting: &'a WaitingRoutes,
}

/// Hands every status of this pass to the status writer (which writes what differs from
/// what the objects show).
pub(super) fn write_statuses(
    settings: &Settings,
    translation: &Translation,
    written: &Written<'_>,
) {
    let Written {
        classes,
        gateways,
        listener_sets,
        routes,
        grpc_routes,
        tls_routes,
        tcp_routes,
        udp_routes,
        policies,
        addresses,
        units,
        outcome,
        waiting,
    } = written;
    for outcome in &translation.classes {
        let current = classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(outcome.name.as_str()));
        let before = current.and_then(|c| c.status.as_ref()).map(to_value);
        let old = conditions_of(before.as_ref(), "conditions");
        let status = json!({
            "conditions": conditions(&outcome.conditions, outcome.generation, &old),
        });
        let read = current.and_then(|c| c.metadata.resource_version.clone());
        let object = ("", outcome.name.as_str(), read);
        set(&settings.status, &CLASS_STATUS, object, before, status);
    }
    for outcome in &translation.gateways {
        let current = gateways.iter().find(|g| {
            g.metadata.namespace.as_deref() == Some(outcome.namespace.as_str())
                && g.metadata.name.as_deref() == Some(outcome.name.as_str())
        });
        let before = current.and_then(|g| g.status.as_ref()).map(to_value);
        let key = (outcome.namespace.clone(), outcome.name.clone());
        let found = addresses.get(&key).map(Vec::as_slice).unwrap_or_default();
        let programmed = Programmed {
            units,
            outcome: written.outcome,
        };
        let status = gateway_status(outcome, found, before.as_ref(), &programmed);
        let read = current.and_then(|g| g.metadata.resource_version.clone());
        let object = (outcome.namespace.as_str(), outcome.name.as_str(), read);
        set(&settings.status, &GATEWAY_STATUS, object, before, status);
    }
    let programmed = Programmed {
        units,
        outcome: written.outcome,
    };
    for outcome in &translation.listener_sets {
        let current = listener_sets.iter().find(|s| {
            s.metadata.namespace.as_deref() == Some(outcome.namespace.as_str())
                && s.metadata.name.as_deref() == Some(outcome.name.as_str())
        });
        let before = current.and_then(|s| s.status.as_ref()).map(to_value);
        let status = listener_set_status(outcome, before.as_ref(), &programmed);
        let read = current.and_then(|s| s.metadata.resource_version.clone());
        let object = (outcome.namespace.as_str(), outcome.name.as_str(), read);
        set(
            &settings.status,
            &LISTENER_SET_STATUS,
            object,
            before,
            status,
        );
    }
    // Each route kind: its objects as read (generated types of their own), its kind's
    // name and status, and the translation's outcomes of it.
    macro_rules! route_statuses {
        ($objects:expr, $kind:expr, $status:expr, $outcomes:expr) => {{
            let read = $objects.iter().map(|r| RouteRead {
                meta: &r.metadata,
                status: r.status.as_ref().map(to_value),
            });
            let of_kind = RoutesOfKind {
                kind: $kind,
                status: $status,
                outcomes: $outcomes,
            };
            write_route_statuses(settings, &of_kind, read, (units, outcome), waiting);
        }};
    }
    route_statuses!(routes, HTTP_ROUTE, &ROUTE_STATUS, &translation.routes);
    route_statuses!(
        grpc_routes,
        GRPC_ROUTE,
        &GRPC_ROUTE_STATUS,
        &translation.grpc_routes
    );
    route_statuses!(
        tls_routes,
        TLS_ROUTE,
        &TLS_ROUTE_STATUS,
        &translation.tls_routes
    );
    route_statuses!(
        tcp_routes,
        TCP_ROUTE,
        &TCP_ROUTE_STATUS,
        &translation.tcp_routes
    );
    route_statuses!(
        udp_routes,
        UDP_ROUTE,
        &UDP_ROUTE_STATUS,
        &translation.udp_routes
    );
    for policy in policies.iter() {
        let namespace = policy.metadata.namespace.as_deref().unwrap_or_default();
        let name = policy.metadata.name.as_deref().unwrap_or_default();
        let ours =
            (translation.policies.iter()).find(|p| p.namespace == namespace && p.name == name);
        let before = policy.status.as_ref().map(to_value);
        let status = policies::policy_status(&settings.controller_name, ours, before.as_ref());
        let Some(status) = status else { continue };
        let object = (namespace, name, policy.metadata.resource_version.clone());
        set(&settings.status, &POLICY_STATUS, object, before, status);
    }
}

/// A route as read: its metadata and status.
struct RouteRead<'a> {
    meta: &'a ObjectMeta,
    status: Option<Value>,
}

/// The routes of one kind: how their statuses are written, and the translation's outcomes.
struct RoutesOfKind<'a> {
    kind: &'static str,
    status: &'a Arc<StatusKind>,
    outcomes: &'a [RouteOutcome],
}

/// The status of every route of a kind that has a parent of Switchyard's, or had one.
fn write_route_statuses<'a>(
    settings: &Settings,
    of: &RoutesOfKind<'_>,
    routes: impl Iterator<Item = RouteRead<'a>>,
    (units, outcome): (&[Unit], &Outcome),
    waiting: &WaitingRoutes,
) {
    let ours: BTreeMap<(&str, &str), &[ParentOutcome]> = (of.outcomes.iter())
        .map(|r| {
            (
                (r.namespace.as_str(), r.name.as_str()),
                r.parents.as_slice(),
            )
        })
        .collect();
    // Each route's units, looked up once: thousands of routes, each its own hostname and
    // unit, made a walk of every unit per route parent.
    let mut units_of: HashMap<&(&'static str, String), Vec<&Unit>> = HashMap::new();
    for unit in units {
        for route in &unit.routes {
            units_of.entry(route).or_default().push(unit);
        }
    }
    for route in routes {
        let namespace = route.meta.namespace.as_deref().unwrap_or_default();
        let name = route.meta.name.as_deref().unwrap_or_default();
        let parents = ours.get(&(namespace, name)).copied().unwrap_or_default();
        let route_id = (of.kind, format!("{namespace}/{name}"));
        let route_units = units_of.get(&route_id).map_or(&[][..], Vec::as_slice);
        let generation = route.meta.generation.unwrap_or(0);
        let waits = waiting.get(&route_id);
        // A route whose change waits is served at the generation kept meanwhile.
        let served = |p: &ParentOutcome| {
            let served = served(p, route_units, outcome);
            match waits {
                Some(w) => served_while_waiting(served, w, generation),
                None => served,
            }
        };
        let generations = Generations {
            current: generation,
            served: waits.map_or(generation, |w| w.kept_generation),
        };
        let status = route_status(
            &settings.controller_name,
            parents,
            &served,
            generations,
            route.status.as_ref(),
        );
        let Some(status) = status else { continue };
        let object = (namespace, name, route.meta.resource_version.clone());
        set(&settings.status, of.status, object, route.status, status);
    }
}

fn to_value<T: serde::Serialize>(status: &T) -> Value {
    serde_json::to_value(status).unwrap_or(Value::Null)
}

/// How the Gateway API's statuses are written: merge patches (lists replaced whole), other
/// controllers' fields left as they are; these conditions' changes first.
pub(super) static CLASS_STATUS: LazyLock<Arc<StatusKind>> = LazyLock::new(|| {
    Arc::new(StatusKind::cluster::<GatewayClass>(
        Write::Merge,
        &["Accepted"],
    ))
});
pub(super) static GATEWAY_STATUS: LazyLock<Arc<StatusKind>> = LazyLock::new(|| {
    Arc::new(StatusKind::namespaced::<Gateway>(
        Write::Merge,
        &["Accepted", "Programmed"],
    ))
});
pub(super) static LISTENER_SET_STATUS: LazyLock<Arc<StatusKind>> = LazyLock::new(|| {
    Arc::new(StatusKind::namespaced::<ListenerSet>(
        Write::Merge,
        &["Accepted", "Programmed"],
    ))
});
pub(super) static ROUTE_STATUS: LazyLock<Arc<StatusKind>> = LazyLock::new(|| {
    Arc::new(StatusKind::namespaced::<HttpRoute>(
        Write::Merge,
        &["Accepted", "ResolvedRefs", SERVED],
    ))
});

pub(super) static GRPC_ROUTE_STATUS: LazyLock<Arc<StatusKind>> = LazyLock::new(|| {
    Arc::new(StatusKind::namespaced::<GrpcRoute>(
        Write::Merge,
        &["Accepted", "ResolvedRefs", SERVED],
    ))
});

pub(super) static TLS_ROUTE_STATUS: LazyLock<Arc<StatusKind>> = LazyLock::new(|| {
    Arc::new(StatusKind::namespaced::<TlsRoute>(
        Write::Merge,
        &["Accepted", "ResolvedRefs", SERVED],
    ))
});

pub(super) static TCP_ROUTE_STATUS: LazyLock<Arc<StatusKind>> = LazyLock::new(|| {
    Arc::new(StatusKind::namespaced::<TcpRoute>(
        Write::Merge,
        &["Accepted", "ResolvedRefs", SERVED],
    ))
});

pub(super) static UDP_ROUTE_STATUS: LazyLock<Arc<StatusKind>> = LazyLock::new(|| {
    Arc::new(StatusKind::namespaced::<UdpRoute>(
        Write::Merge,
        &["Accepted", "ResolvedRefs", SERVED],
    ))
});

pub(super) static POLICY_STATUS: LazyLock<Arc<StatusKind>> = LazyLock::new(|| {
    Arc::new(StatusKind::namespaced::<BackendTlsPolicy>(
        Write::Merge,
        &["Accepted", "ResolvedRefs"],
    ))
});

/// Asks for `status` on the object (namespace, name, resourceVersion as read), which
/// showed `before`.
fn set(
    writer: &StatusWriter,
    kind: &Arc<StatusKind>,
    (namespace, name, read): (&str, &str, Option<String>),
    before: Option<Value>,
    status: Value,
) {
    writer.set(StatusUpdate {
        kind: kind.clone(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        status,
        shown: before,
        read,
    });
}

/// The conditions found at `key` of a status, by type.
pub(super) fn conditions_of(status: Option<&Value>, key: &str) -> Vec<Condition> {
    status
        .and_then(|s| s.get(key))
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default()
}

/// Every condition type Switchyard writes on a GatewayClass, a Gateway or a listener. Any
/// other type found there is another controller's, and stays as it is: an implementation
/// must not remove or modify the conditions it is not responsible for.
const OWN_CONDITIONS: &[&str] = &[
    "Accepted",
    "Programmed",
    "ResolvedRefs",
    "Conflicted",
    "SupportedVersion",
    "InsecureFrontendValidationMode",
];

/// The conditions, each keeping the lastTransitionTime of the one it replaces while its
/// status stays (the rule every status Switchyard writes follows: [`condition_of`]), then
/// the other controllers' conditions of `old` as they are.
pub(super) fn conditions(conds: &[Cond], generation: i64, old: &[Condition]) -> Vec<Condition> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let ours = conds.iter().map(|c| {
        condition_of(
            old, c.type_, c.status, c.reason, &c.message, generation, &now,
        )
    });
    let foreign = old
        .iter()
        .filter(|c| !OWN_CONDITIONS.contains(&c.type_.as_str()))
        .filter(|c| conds.iter().all(|own| own.type_ != c.type_))
        .cloned();
    ours.chain(foreign).collect()
}

/// The condition type Switchyard adds to each of its route parents: True when every Envoy
/// serves the route's current generation there.
pub const SERVED: &str = "switchyard.dev/Served";

/// What Programmed is made of: the rollout of the Gateways' units.
struct Programmed<'a> {
    units: &'a [Unit],
    outcome: &'a Outcome,
}

impl Programmed<'_> {
    /// Programmed of Gateway `key` (accepted or not), or of its listeners on `port`.
    fn condition(&self, key: &GatewayKey, accepted: bool, port: Option<i32>) -> Cond {
        if !accepted {
            return Cond::no("Programmed", "Invalid", "not accepted: nothing to serve");
        }
        match self.outcome.listeners(self.units, key, port) {
            Some(UnitState::Served) => {
                Cond::yes("Programmed", "Programmed", "every Envoy listens for it")
            }
            Some(UnitState::Waiting(why)) => Cond::no(
                "Programmed",
                "Pending",
                format!("not on every Envoy yet: {why}"),
            ),
            Some(UnitState::Failed(why)) => Cond::no("Programmed", "Invalid", why.clone()),
            None => Cond::no(
                "Programmed",
                "Pending",
                "no port of the fleet is left for this Gateway",
            ),
        }
    }

    /// Programmed of a Gateway's.
    fn of_gateway(&self, outcome: &GatewayOutcome) -> Cond {
        let accepted = outcome.conditions.first().is_some_and(Cond::is_true);
        if accepted && outcome.ports.is_empty() {
            return Cond::no("Programmed", "Invalid", "no listener can be served");
        }
        let key = (outcome.namespace.clone(), outcome.name.clone());
        self.condition(&key, accepted, None)
    }

    /// Programmed of a listener of Gateway `key`'s (its own or a ListenerSet's): one in
    /// conflict is not, for that reason.
    fn of_listener(&self, key: &GatewayKey, listener: &ListenerOutcome) -> Cond {
        if !listener.usable {
            let conflict = (listener.conditions.iter())
                .find(|c| c.type_ == "Conflicted" && c.is_true())
                .map(|c| c.reason);
            let reason = conflict.unwrap_or("Invalid");
            return Cond::no("Programmed", reason, "not valid: nothing to serve");
        }
        self.condition(key, true, Some(listener.port))
    }
}

/// Served of one route parent: the route's rules are in units of that Gateway (of
/// `route_units`, the units holding the route), and every one of them is served by every
/// Envoy.
fn served(parent: &ParentOutcome, route_units: &[&Unit], outcome: &Outcome) -> Cond {
    if !parent.conditions.first().is_some_and(Cond::is_true) {
        return Cond::no(
            SERVED,
            "NotAccepted",
            "the parent does not accept the route",
        );
    }
    let gateway = (parent.gateway_namespace.clone(), parent.gateway.clone());
    let states: Vec<&UnitState> = route_units
        .iter()
        .filter(|u| u.gateway == gateway)
        .filter_map(|u| outcome.states.get(&(u.gateway.clone(), u.name.clone())))
        .collect();
    if states.is_empty() {
        return Cond::no(SERVED, "Pending", "not rolled out to the fleet yet");
    }
    if let Some(UnitState::Failed(why)) = states.iter().find(|s| matches!(s, UnitState::Failed(_)))
    {
        return Cond::no(SERVED, "Refused", why.clone());
    }
    if let Some(UnitState::Waiting(why)) =
        states.iter().find(|s| matches!(s, UnitState::Waiting(_)))
    {
        return Cond::no(SERVED, "RollingOut", why.clone());
    }
    Cond::yes(SERVED, "Served", "every Envoy serves this generation")
}

fn gateway_status(
    outcome: &GatewayOutcome,
    addresses: &[(String, String)],
    before: Option<&Value>,
    programmed: &Programmed<'_>,
) -> Value {
    let key = (outcome.namespace.clone(), outcome.name.clone());
    let accepted = outcome.conditions.first().is_some_and(Cond::is_true);
    let mut conds = outcome.conditions.clone();
    conds.push(programmed.of_gateway(outcome));
    let old = conditions_of(before, "conditions");
    // A listener of a Gateway that is not accepted serves nothing.
    let listeners = listeners_status(&outcome.listeners, before, outcome.generation, |l| {
        if accepted {
            programmed.of_listener(&key, l)
        } else {
            programmed.condition(&key, false, None)
        }
    });
    let addresses: Vec<Value> = addresses
        .iter()
        .map(|(type_, value)| json!({ "type": type_, "value": value }))
        .collect();
    let mut status = json!({
        "addresses": addresses,
        "conditions": conditions(&conds, outcome.generation, &old),
        "listeners": listeners,
    });
    // Written once there is something to count: a cluster whose Gateway CRD predates the
    // field would prune it, and the status would never show what was written.
    let counted = before.is_some_and(|b| b.get("attachedListenerSets").is_some());
    if outcome.attached_listener_sets > 0 || counted {
        status["attachedListenerSets"] = json!(outcome.attached_listener_sets);
    }
    status
}

/// A ListenerSet's status: Accepted as translated, Programmed when every Envoy listens
/// for the listeners of its that are valid.
fn listener_set_status(
    outcome: &ListenerSetOutcome,
    before: Option<&Value>,
    programmed: &Programmed<'_>,
) -> Value {
    let key = &outcome.gateway;
    let mut conds = outcome.conditions.clone();
    let listening = match conds.first() {
        Some(accepted) if !accepted.is_true() => Cond::no(
            "Programmed",
            accepted.reason,
            "not accepted: nothing to serve",
        ),
        _ => {
            let states: Vec<Cond> = (outcome.listeners.iter())
                .filter(|l| l.usable)
                .map(|l| programmed.of_listener(key, l))
                .collect();
            match states.into_iter().find(|c| !c.is_true()) {
                Some(not_yet) => not_yet,
                None => Cond::yes("Programmed", "Programmed", "every Envoy listens for it"),
            }
        }
    };
    conds.push(listening);
    let old = conditions_of(before, "conditions");
    let listeners = listeners_status(&outcome.listeners, before, outcome.generation, |l| {
        programmed.of_listener(key, l)
    });
    json!({
        "conditions": conditions(&conds, outcome.generation, &old),
        "listeners": listeners,
    })
}

/// The `listeners` of a Gateway's or a ListenerSet's status, each with its Programmed.
fn listeners_status(
    listeners: &[ListenerOutcome],
    before: Option<&Value>,
    generation: i64,
    programmed: impl Fn(&ListenerOutcome) -> Cond,
) -> Vec<Value> {
    let old_listeners: Vec<Value> = before
        .and_then(|b| b.get("listeners"))
        .and_then(|l| l.as_array().cloned())
        .unwrap_or_default();
    (listeners.iter())
        .map(|l| {
            let held = old_listeners
                .iter()
                .find(|o| o.get("name").and_then(Value::as_str) == Some(l.name.as_str()));
            let mut conds = l.conditions.clone();
            conds.push(programmed(l));
            json!({
                "name": l.name,
                "supportedKinds": l.supported_kinds.iter()
                    .map(|k| json!({ "group": GROUP, "kind": k }))
                    .collect::<Vec<_>>(),
                "attachedRoutes": l.attached_routes,
                "conditions": conditions(&conds, generation, &conditions_of(held, "conditions")),
            })
        })
        .collect()
}

/// The generations a route's status speaks of: the current one, and the one its Served
/// condition is about (an earlier one while the current one's change waits).
#[derive(Clone, Copy)]
struct Generations {
    current: i64,
    served: i64,
}

/// The route's parents: those of other controllers as they are, and Switchyard's; `None`
/// when Switchyard has nothing to say and said nothing before.
fn route_status(
    controller: &str,
    ours: &[ParentOutcome],
    served: &dyn Fn(&ParentOutcome) -> Cond,
    generations: Generations,
    before: Option<&Value>,
) -> Option<Value> {
    let held: Vec<Value> = before
        .and_then(|b| b.get("parents"))
        .and_then(|p| p.as_array().cloned())
        .unwrap_or_default();
    let is_ours = |p: &Value| p.get("controllerName").and_then(Value::as_str) == Some(controller);
    if ours.is_empty() && !held.iter().any(is_ours) {
        return None;
    }
    let mut parents: Vec<Value> = held.iter().filter(|p| !is_ours(p)).cloned().collect();
    for p in ours {
        let (kind, namespace, name) = match &p.listener_set {
            Some((namespace, name)) => ("ListenerSet", namespace, name),
            None => ("Gateway", &p.gateway_namespace, &p.gateway),
        };
        let old = held.iter().find(|h| {
            is_ours(h)
                && h.pointer("/parentRef/kind").and_then(Value::as_str) == Some(kind)
                && h.pointer("/parentRef/name").and_then(Value::as_str) == Some(name.as_str())
                && h.pointer("/parentRef/namespace").and_then(Value::as_str)
                    == Some(namespace.as_str())
                && h.pointer("/parentRef/sectionName").and_then(Value::as_str)
                    == p.section_name.as_deref()
                && h.pointer("/parentRef/port").and_then(Value::as_i64) == p.port.map(i64::from)
        });
        let mut parent_ref = json!({
            "group": GROUP,
            "kind": kind,
            "namespace": namespace,
            "name": name,
        });
        if let Some(section) = &p.section_name {
            parent_ref["sectionName"] = json!(section);
        }
        if let Some(port) = p.port {
            parent_ref["port"] = json!(port);
        }
        let mut conds = p.conditions.clone();
        conds.push(served(p));
        let old = conditions_of(old, "conditions");
        let mut conditions = conditions(&conds, generations.current, &old);
        if let Some(c) = conditions.iter_mut().find(|c| c.type_ == SERVED) {
            c.observed_generation = Some(generations.served);
        }
        parents.push(json!({
            "parentRef": parent_ref,
            "controllerName": controller,
            "conditions": conditions,
        }));
    }
    Some(json!({ "parents": parents }))
}

#[cfg(test)]
mod tests;
