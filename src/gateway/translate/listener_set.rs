//! ListenerSets: more listeners for a Gateway that lets them attach (`allowedListeners`),
//! merged after the Gateway's own in the Gateway API's precedence (the Gateway's, then the
//! ListenerSets oldest first, then by namespace and name). A listener that conflicts with
//! one of higher precedence is not served; the Gateway's own are never displaced by one.

use serde::Serialize;

use super::gateway::namespace_labels;
use super::{Cond, GROUP, Inputs, ListenerOutcome, seniority};
use crate::gateway::api::gateways::{
    Gateway, GatewayAllowedListenersNamespacesFrom as From, GatewayListeners,
};
use crate::gateway::api::listenersets::ListenerSet;

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSetOutcome {
    pub namespace: String,
    pub name: String,
    pub generation: i64,
    /// (namespace, name) of the Gateway it names.
    pub gateway: (String, String),
    /// Accepted (Programmed is the controller's: it needs the fleet).
    pub conditions: Vec<Cond>,
    /// Empty when it is not attached.
    pub listeners: Vec<ListenerOutcome>,
}

impl ListenerSetOutcome {
    pub fn accepted(&self) -> bool {
        self.conditions.first().is_some_and(Cond::is_true)
    }
}

/// A ListenerSet attached to a Gateway: its listeners take part in the Gateway's.
pub struct Attached<'a> {
    pub set: &'a ListenerSet,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// The ListenerSets that name `gateway`: those it lets attach, in the order of precedence,
/// and the others with the outcome that says why they do not attach.
pub fn of_gateway<'a>(
    inputs: &Inputs<'a>,
    gateway: &Gateway,
) -> (Vec<Attached<'a>>, Vec<ListenerSetOutcome>) {
    let gateway_ns = gateway.metadata.namespace.as_deref().unwrap_or_default();
    let gateway_name = gateway.metadata.name.as_deref().unwrap_or_default();
    let mut naming: Vec<&'a ListenerSet> = (inputs.listener_sets.iter())
        .filter(|s| parent_of(s) == Some((gateway_ns, gateway_name)))
        .collect();
    naming.sort_by_key(|s| seniority(&s.metadata));
    let mut attached = Vec::new();
    let mut refused = Vec::new();
    for set in naming {
        let namespace = set.metadata.namespace.as_deref().unwrap_or_default();
        let name = set.metadata.name.as_deref().unwrap_or_default();
        if allows(inputs, gateway, namespace) {
            attached.push(Attached {
                set,
                namespace,
                name,
            });
        } else {
            let message = format!(
                "Gateway {gateway_ns}/{gateway_name} does not allow ListenerSets of namespace \
                 {namespace} (spec.allowedListeners)"
            );
            refused.push(unattached(set, gateway, "NotAllowed", message));
        }
    }
    (attached, refused)
}

/// The outcome of a ListenerSet that does not attach to `gateway`, for `reason`.
pub fn unattached(
    set: &ListenerSet,
    gateway: &Gateway,
    reason: &'static str,
    message: String,
) -> ListenerSetOutcome {
    let key = (
        gateway.metadata.namespace.clone().unwrap_or_default(),
        gateway.metadata.name.clone().unwrap_or_default(),
    );
    not_attached(set, key, reason, message)
}

fn not_attached(
    set: &ListenerSet,
    gateway: (String, String),
    reason: &'static str,
    message: String,
) -> ListenerSetOutcome {
    ListenerSetOutcome {
        namespace: set.metadata.namespace.clone().unwrap_or_default(),
        name: set.metadata.name.clone().unwrap_or_default(),
        generation: set.metadata.generation.unwrap_or(0),
        gateway,
        conditions: vec![Cond::no("Accepted", reason, message)],
        listeners: Vec::new(),
    }
}

/// The ListenerSets that show themselves accepted but whose Gateway does not exist (it
/// was deleted, or they were moved to a name no Gateway has): no controller would
/// correct them, so they say so.
pub fn orphans(inputs: &Inputs<'_>) -> Vec<ListenerSetOutcome> {
    let exists = |(namespace, name): (&str, &str)| {
        (inputs.gateways.iter()).any(|g| {
            g.metadata.namespace.as_deref() == Some(namespace)
                && g.metadata.name.as_deref() == Some(name)
        })
    };
    let shows_accepted = |set: &ListenerSet| {
        (set.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten())
        .any(|c| c.type_ == "Accepted" && c.status == "True")
    };
    (inputs.listener_sets.iter())
        .filter(|set| shows_accepted(set))
        .filter_map(|set| {
            let parent = parent_of(set)?;
            if exists(parent) {
                return None;
            }
            let key = (parent.0.to_owned(), parent.1.to_owned());
            let message = format!("Gateway {}/{} does not exist", key.0, key.1);
            Some(not_attached(set, key, "ParentNotAccepted", message))
        })
        .collect()
}

/// The outcome of an attached ListenerSet, from its listeners': accepted when one of them
/// is usable.
pub fn attached_outcome(
    set: &Attached<'_>,
    gateway: (String, String),
    listeners: Vec<ListenerOutcome>,
) -> ListenerSetOutcome {
    let invalid: Vec<&str> = (listeners.iter())
        .filter(|l| !l.usable)
        .map(|l| l.name.as_str())
        .collect();
    let accepted = if invalid.is_empty() {
        Cond::yes("Accepted", "Accepted", "listeners attached to the Gateway")
    } else {
        let message = format!("listeners not valid: {}", invalid.join(", "));
        if listeners.iter().any(|l| l.usable) {
            Cond::yes("Accepted", "ListenersNotValid", message)
        } else {
            Cond::no("Accepted", "ListenersNotValid", message)
        }
    };
    ListenerSetOutcome {
        namespace: set.namespace.to_owned(),
        name: set.name.to_owned(),
        generation: set.set.metadata.generation.unwrap_or(0),
        gateway,
        conditions: vec![accepted],
        listeners,
    }
}

/// (namespace, name) of the Gateway the ListenerSet names, when it names one.
pub fn parent_of(set: &ListenerSet) -> Option<(&str, &str)> {
    let parent = &set.spec.parent_ref;
    let group = parent.group.as_deref().unwrap_or(GROUP);
    let kind = parent.kind.as_deref().unwrap_or("Gateway");
    if group != GROUP || kind != "Gateway" {
        return None;
    }
    let own_ns = set.metadata.namespace.as_deref().unwrap_or_default();
    Some((
        parent.namespace.as_deref().unwrap_or(own_ns),
        parent.name.as_str(),
    ))
}

/// Whether `gateway` lets ListenerSets of `namespace` attach: by default none may.
fn allows(inputs: &Inputs<'_>, gateway: &Gateway, namespace: &str) -> bool {
    let namespaces = (gateway.spec.allowed_listeners.as_ref()).and_then(|a| a.namespaces.as_ref());
    let Some(namespaces) = namespaces else {
        return false;
    };
    match namespaces.from.as_ref() {
        None | Some(From::None) => false,
        Some(From::All) => true,
        Some(From::Same) => gateway.metadata.namespace.as_deref() == Some(namespace),
        Some(From::Selector) => (namespaces.selector.as_ref())
            .is_some_and(|selector| selects!(selector, &namespace_labels(inputs, namespace))),
    }
}

/// A ListenerSet's listeners as a Gateway's: the two kinds declare them with the same
/// schema (the Gateway API shares the Go type), which kopium generates twice.
pub fn listeners(set: &ListenerSet) -> Vec<GatewayListeners> {
    (set.spec.listeners.iter())
        .filter_map(|entry| {
            serde_json::to_value(entry)
                .and_then(serde_json::from_value)
                .ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::api::listenersets::ListenerSetListeners;

    #[test]
    fn every_field_of_a_listener_set_listener_is_carried_over() {
        let entry: ListenerSetListeners = serde_json::from_value(serde_json::json!({
            "name": "https",
            "hostname": "a.example.com",
            "port": 8443,
            "protocol": "HTTPS",
            "tls": {
                "mode": "Terminate",
                "certificateRefs": [{"group": "", "kind": "Secret", "name": "c", "namespace": "n"}],
                "options": {"k": "v"}
            },
            "allowedRoutes": {
                "kinds": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}],
                "namespaces": {"from": "Selector", "selector": {
                    "matchLabels": {"a": "b"},
                    "matchExpressions": [{"key": "k", "operator": "In", "values": ["x"]}]
                }}
            }
        }))
        .expect("a valid entry");
        let set = ListenerSet {
            spec: crate::gateway::api::listenersets::ListenerSetSpec {
                listeners: vec![entry.clone()],
                ..Default::default()
            },
            ..ListenerSet::new("s", Default::default())
        };
        let converted = listeners(&set);
        assert_eq!(converted.len(), 1);
        assert_eq!(
            serde_json::to_value(&converted[0]).ok(),
            serde_json::to_value(&entry).ok()
        );
    }
}
