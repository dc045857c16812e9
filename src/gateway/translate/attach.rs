//! A route's parentRefs, of any kind: each attached to the listeners of a Gateway of
//! Switchyard's (or of one of its ListenerSets) that admit the kind, the route's
//! namespace and a hostname of the route's; the route's status per parent.
//!
//! HTTPRoutes and GRPCRoutes are not merged: a route is not accepted by a listener that
//! already serves a route of the other kind for a hostname the two share. The older route
//! keeps it (the Gateway API's order: creation time, then `{namespace}/{name}`), as the
//! routes attach oldest first.

use super::gateway::{Listening, Owner, admits_namespace};
use super::hostname;
use super::{Cond, GROUP, GatewayRule, Inputs, ParentOutcome, RouteOutcome};

/// A route, whatever its kind, as attachment reads it.
pub struct Route<'a> {
    /// `HTTPRoute`, `GRPCRoute`.
    pub kind: &'static str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub generation: i64,
    pub hostnames: &'a [String],
    pub parents: Vec<ParentRef>,
}

/// A parentRef (each route kind has a generated type of its own, with these fields).
#[derive(Clone, Debug, Default)]
pub struct ParentRef {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    pub section_name: Option<String>,
    pub port: Option<i32>,
}

/// A route of a generated kind (each has its own types, with these fields) as
/// attachment reads it: `$kind` is its kind's name.
macro_rules! route_of {
    ($route:expr, $kind:expr) => {{
        let route = $route;
        route_of!(
            route,
            $kind,
            route.spec.hostnames.as_deref().unwrap_or_default()
        )
    }};
    ($route:expr, $kind:expr, $hostnames:expr) => {{
        let route = $route;
        $crate::gateway::translate::attach::Route {
            kind: $kind,
            namespace: route.metadata.namespace.as_deref().unwrap_or_default(),
            name: route.metadata.name.as_deref().unwrap_or_default(),
            generation: route.metadata.generation.unwrap_or(0),
            hostnames: $hostnames,
            parents: (route.spec.parent_refs.iter().flatten())
                .map(|p| $crate::gateway::translate::attach::ParentRef {
                    group: p.group.clone(),
                    kind: p.kind.clone(),
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    section_name: p.section_name.clone(),
                    port: p.port,
                })
                .collect(),
        }
    }};
}
pub(crate) use route_of;

/// A route's rules as attached to one listener of a Gateway, for the hostnames the two
/// share.
#[derive(Clone, Debug)]
pub struct Attached {
    pub gateway: (String, String),
    pub listener: usize,
    /// The route's kind and `namespace/name`.
    pub kind: &'static str,
    pub route: String,
    pub hostnames: Vec<hostname::Served>,
    pub rules: Vec<Ranked>,
}

/// How specific a match is, compared between matches of one kind (routes of two kinds
/// never share a hostname of a listener), most significant first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Specificity {
    /// The kind of path match (exact 2, regular expression 1, prefix 0), the path's
    /// length, whether it matches the method, and the numbers of header and query
    /// parameter matches.
    Http(u8, usize, bool, usize, usize),
    /// Whether its method match is exact, the characters of the service and of the
    /// method it matches, and its number of header matches.
    Grpc(bool, usize, usize, usize),
    /// A connection has nothing to match: the older route's rule first.
    Stream,
}

/// A lowered rule with its place in the Gateway API's order of precedence: the more
/// specific match first (`specificity`, compared in reverse), then the older route, then
/// the order of rules and matches (`order`).
#[derive(Clone, Debug)]
pub struct Ranked {
    pub specificity: Specificity,
    pub order: (usize, usize, usize),
    pub rule: GatewayRule,
}

/// A route's rules, lowered, and whether all its backendRefs resolved.
pub struct Lowered {
    pub rules: Vec<Ranked>,
    pub resolved_refs: Cond,
}

/// Attaches `route` to the Gateways it names, counting it on their listeners; gives its
/// status and its rules where it attached. `lowered` is its rules, or what it uses that
/// Switchyard does not serve (then no parent accepts it). `before` holds what the older
/// routes attached.
pub fn attach(
    inputs: &Inputs<'_>,
    route: &Route<'_>,
    lowered: &Result<Lowered, String>,
    gateways: &mut [Listening<'_>],
    before: &[Attached],
) -> (RouteOutcome, Vec<Attached>) {
    let namespace = route.namespace;
    let mut parents = Vec::new();
    let mut attached = Vec::new();
    for parent in &route.parents {
        let Some((index, owner)) = parent_of(gateways, parent, namespace) else {
            // Not a parent of Switchyard's: its own controller writes this parent's status.
            continue;
        };
        let gateway = &mut gateways[index];
        let gateway_key = (gateway.namespace.to_owned(), gateway.name.to_owned());
        let accepted = match (lowered, owner) {
            (Err(message), _) => Cond::no("Accepted", "UnsupportedValue", message.clone()),
            (Ok(_), None) => Cond::no(
                "Accepted",
                "NoMatchingParent",
                format!(
                    "ListenerSet {} is not attached to its Gateway",
                    parent_name(parent, namespace)
                ),
            ),
            (Ok(l), Some(owner)) => {
                let found = matching_listeners(inputs, gateway, owner, parent, route).and_then(
                    |listeners| {
                        no_other_kind(route, &gateway_key, &listeners, before)?;
                        Ok(listeners)
                    },
                );
                match found {
                    Err(cond) => cond,
                    Ok(listeners) => {
                        for (index, hostnames) in listeners {
                            gateway.listeners[index].attached_routes += 1;
                            attached.push(Attached {
                                gateway: gateway_key.clone(),
                                listener: index,
                                kind: route.kind,
                                route: format!("{namespace}/{}", route.name),
                                hostnames,
                                rules: l.rules.clone(),
                            });
                        }
                        Cond::yes("Accepted", "Accepted", "attached")
                    }
                }
            }
        };
        let resolved = match lowered {
            Ok(l) => l.resolved_refs.clone(),
            Err(_) => Cond::no("ResolvedRefs", "UnsupportedValue", "not resolved"),
        };
        let listener_set = is_listener_set(parent).then(|| {
            (
                (parent.namespace.clone()).unwrap_or_else(|| namespace.to_owned()),
                parent.name.clone(),
            )
        });
        parents.push(ParentOutcome {
            gateway_namespace: gateway_key.0,
            gateway: gateway_key.1,
            listener_set,
            section_name: parent.section_name.clone(),
            port: parent.port,
            conditions: vec![accepted, resolved],
        });
    }
    let outcome = RouteOutcome {
        namespace: namespace.to_owned(),
        name: route.name.to_owned(),
        generation: route.generation,
        parents,
    };
    (outcome, attached)
}

/// Refuses the listeners found when an older route of the other kind (HTTPRoute or
/// GRPCRoute) serves a hostname there that this one would serve too.
fn no_other_kind(
    route: &Route<'_>,
    gateway: &(String, String),
    listeners: &[(usize, Vec<hostname::Served>)],
    before: &[Attached],
) -> Result<(), Cond> {
    for (index, hostnames) in listeners {
        let older = before.iter().find(|a| {
            a.gateway == *gateway
                && a.listener == *index
                && a.kind != route.kind
                && (a.hostnames.iter()).any(|h| {
                    (hostnames.iter()).any(|o| hostname::overlap(&h.hostname, &o.hostname))
                })
        });
        if let Some(older) = older {
            return Err(Cond::no(
                "Accepted",
                "HostnameConflict",
                format!(
                    "{} {}, older, serves a hostname of this route on the same listener: \
                     HTTPRoutes and GRPCRoutes do not share a listener's hostname",
                    older.kind, older.route
                ),
            ));
        }
    }
    Ok(())
}

fn is_listener_set(parent: &ParentRef) -> bool {
    parent.group.as_deref().unwrap_or(GROUP) == GROUP
        && parent.kind.as_deref() == Some("ListenerSet")
}

/// `namespace/name` of the parentRef's object.
fn parent_name(parent: &ParentRef, route_namespace: &str) -> String {
    let namespace = parent.namespace.as_deref().unwrap_or(route_namespace);
    format!("{namespace}/{}", parent.name)
}

/// The Gateway of Switchyard's a parentRef names, itself or through one of its
/// ListenerSets: its index, and whose listeners the route may attach to (None: a
/// ListenerSet that names it but is not attached).
fn parent_of(
    gateways: &[Listening<'_>],
    parent: &ParentRef,
    route_namespace: &str,
) -> Option<(usize, Option<Owner>)> {
    let namespace = parent.namespace.as_deref().unwrap_or(route_namespace);
    let name = parent.name.as_str();
    if parent.group.as_deref().unwrap_or(GROUP) != GROUP {
        return None;
    }
    match parent.kind.as_deref().unwrap_or("Gateway") {
        "Gateway" => (gateways.iter())
            .position(|g| g.namespace == namespace && g.name == name)
            .map(|i| (i, Some(Owner::Gateway))),
        "ListenerSet" => gateways.iter().enumerate().find_map(|(i, g)| {
            let attached = (g.sets.iter()).position(|s| s.namespace == namespace && s.name == name);
            match attached {
                Some(set) => Some((i, Some(Owner::ListenerSet(set)))),
                None => (g.refused_sets.iter())
                    .any(|s| s.namespace == namespace && s.name == name)
                    .then_some((i, None)),
            }
        }),
        _ => None,
    }
}

/// The listeners of `owner`'s the parentRef attaches to, each with the hostnames it
/// shares with the route; or the Accepted condition saying why none.
fn matching_listeners(
    inputs: &Inputs<'_>,
    gateway: &Listening<'_>,
    owner: Owner,
    parent: &ParentRef,
    route: &Route<'_>,
) -> Result<Vec<(usize, Vec<hostname::Served>)>, Cond> {
    if !gateway.accepted() {
        return Err(Cond::no(
            "Accepted",
            "NoMatchingParent",
            format!(
                "Gateway {}/{} is not accepted",
                gateway.namespace, gateway.name
            ),
        ));
    }
    let named: Vec<usize> = gateway
        .listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| l.owner == owner)
        .filter(|(_, l)| {
            parent
                .section_name
                .as_ref()
                .is_none_or(|s| *s == l.spec.name)
        })
        .filter(|(_, l)| parent.port.is_none_or(|p| p == l.spec.port))
        .map(|(i, _)| i)
        .collect();
    if named.is_empty() {
        return Err(Cond::no(
            "Accepted",
            "NoMatchingParent",
            format!(
                "no listener of the {} has the sectionName and port the parentRef gives",
                if owner == Owner::Gateway {
                    "Gateway"
                } else {
                    "ListenerSet"
                }
            ),
        ));
    }
    let allowed: Vec<usize> = named
        .into_iter()
        .filter(|&i| {
            let l = &gateway.listeners[i];
            l.attachable
                && l.supported_kinds.iter().any(|k| k == route.kind)
                && admits_namespace(inputs, l, route.namespace)
        })
        .collect();
    if allowed.is_empty() {
        return Err(Cond::no(
            "Accepted",
            "NotAllowedByListeners",
            format!(
                "no listener admits {}s from namespace {}",
                route.kind, route.namespace
            ),
        ));
    }
    let with_hosts: Vec<(usize, Vec<hostname::Served>)> = allowed
        .into_iter()
        .map(|i| {
            let listener = gateway.listeners[i].spec.hostname.as_deref();
            (i, hostname::intersect(listener, route.hostnames))
        })
        .filter(|(_, hosts)| !hosts.is_empty())
        .collect();
    if with_hosts.is_empty() {
        return Err(Cond::no(
            "Accepted",
            "NoMatchingListenerHostname",
            "no hostname of the route matches a hostname of the listeners",
        ));
    }
    Ok(with_hosts)
}
