//! The status of BackendTLSPolicies: one ancestor per Gateway of Switchyard's that sends
//! to a Service the policy targets, with its conditions; other controllers' ancestors stay
//! as they are.

use serde_json::{Value, json};

use super::status::{conditions, conditions_of};
use crate::gateway::translate::GROUP;
use crate::gateway::translate::backend_tls::PolicyOutcome;

/// The status of a policy with `ours` (None: none of Switchyard's Gateways sends to its
/// targets), or None when there is nothing of Switchyard's to write or remove.
pub fn policy_status(
    controller: &str,
    ours: Option<&PolicyOutcome>,
    before: Option<&Value>,
) -> Option<Value> {
    let held: Vec<Value> = before
        .and_then(|b| b.get("ancestors"))
        .and_then(|a| a.as_array().cloned())
        .unwrap_or_default();
    let is_ours = |a: &Value| a.get("controllerName").and_then(Value::as_str) == Some(controller);
    if ours.is_none() && !held.iter().any(is_ours) {
        return None;
    }
    let mut ancestors: Vec<Value> = held.iter().filter(|a| !is_ours(a)).cloned().collect();
    if let Some(outcome) = ours {
        for (namespace, name) in &outcome.ancestors {
            let old = held.iter().find(|h| {
                is_ours(h)
                    && h.pointer("/ancestorRef/name").and_then(Value::as_str) == Some(name)
                    && h.pointer("/ancestorRef/namespace").and_then(Value::as_str)
                        == Some(namespace)
            });
            ancestors.push(json!({
                "ancestorRef": { "group": GROUP, "kind": "Gateway", "namespace": namespace, "name": name },
                "controllerName": controller,
                "conditions": conditions(
                    &outcome.conditions,
                    outcome.generation,
                    &conditions_of(old, "conditions"),
                ),
            }));
        }
    }
    Some(json!({ "ancestors": ancestors }))
}
