//! Which Service events are a change to the Gateway API's translation.
//!
//! Every Service of the process's scope is watched once, for every front-end; most are no
//! business of this controller. One that is (an HTTPRoute names it, it is the fleet's, or
//! it is a Gateway's own) starts a pass; the rest must not. A user's move to a fresh
//! Service creates the Service a few milliseconds before the HTTPRoute naming it: when the
//! Service's event counted, its pass ran first, found nothing to do, and the HTTPRoute's
//! event then waited out the quiet period behind it (≈ 10 ms of a move's ≈ 40).
//!
//! Either order stays right: a pass reads the Service store when it runs, after the event
//! that started it. A Service that comes before any route names it is in the store when
//! the route's own event starts the pass; one that comes after is named by a route in the
//! store by then.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use super::super::api::httproutes::HttpRoute;
use super::super::service;
use crate::k8s::watched::{Filter, Watched};

/// Passes the Services a translation reads: those in `fleet_namespace` labelled as a
/// Gateway's (this controller's or another's: both hold fleet ports), the fleet Service,
/// and those an HTTPRoute of `routes` names in a backendRef or a mirror.
pub fn read_by_translation(
    fleet_service: &(String, String),
    routes: &Watched<HttpRoute>,
) -> Filter<Service> {
    let (fleet_namespace, fleet_name) = fleet_service.clone();
    let routes = routes.clone();
    Arc::new(move |s: &Service| {
        let namespace = s.namespace().unwrap_or_default();
        let name = s.name_any();
        if namespace == fleet_namespace && (name == fleet_name || service::gateway_of(s).is_some())
        {
            return true;
        }
        // A scan, not an index: Service events are rare next to route events, and a scan
        // of every route's references costs microseconds per thousand routes.
        routes
            .state()
            .iter()
            .any(|route| names(route, &namespace, &name))
    })
}

/// Whether `route` refers to the Service `namespace`/`name` (a reference of another kind
/// of the same name counts too: a pass too many is harmless, one too few is not).
fn names(route: &HttpRoute, namespace: &str, name: &str) -> bool {
    let own = route.namespace().unwrap_or_default();
    references(route).any(|(ns, n)| n == name && ns.unwrap_or(&own) == namespace)
}

/// Every (namespace, name) a route's rules refer to: backendRefs and request mirrors, on
/// a rule or on a backendRef.
fn references(route: &HttpRoute) -> impl Iterator<Item = (Option<&String>, &str)> {
    route.spec.rules.iter().flatten().flat_map(|rule| {
        let backends = rule.backend_refs.iter().flatten();
        let backend_mirrors = backends
            .clone()
            .flat_map(|b| b.filters.iter().flatten())
            .filter_map(|f| f.request_mirror.as_ref())
            .map(|m| {
                (
                    m.backend_ref.namespace.as_ref(),
                    m.backend_ref.name.as_str(),
                )
            });
        let rule_mirrors = (rule.filters.iter().flatten())
            .filter_map(|f| f.request_mirror.as_ref())
            .map(|m| {
                (
                    m.backend_ref.namespace.as_ref(),
                    m.backend_ref.name.as_str(),
                )
            });
        backends
            .map(|b| (b.namespace.as_ref(), b.name.as_str()))
            .chain(backend_mirrors)
            .chain(rule_mirrors)
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn route(rules: serde_json::Value) -> HttpRoute {
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"namespace": "apps", "name": "r"},
            "spec": {"rules": rules},
        }))
        .expect("an HTTPRoute")
    }

    #[test]
    fn a_route_names_its_backends_and_mirrors_in_their_namespaces() {
        let route = route(json!([
            {"backendRefs": [
                {"name": "here", "port": 80},
                {"name": "there", "namespace": "other", "port": 80,
                 "filters": [{"type": "RequestMirror",
                              "requestMirror": {"backendRef": {"name": "copy", "port": 80}}}]},
            ]},
            {"filters": [{"type": "RequestMirror",
                          "requestMirror": {"backendRef": {"name": "shadow", "namespace": "s", "port": 80}}}]},
        ]));
        assert!(names(&route, "apps", "here"));
        assert!(names(&route, "other", "there"));
        assert!(names(&route, "apps", "copy"));
        assert!(names(&route, "s", "shadow"));
        // The namespace is the route's unless the reference gives one.
        assert!(!names(&route, "other", "here"));
        assert!(!names(&route, "apps", "there"));
        assert!(!names(&route, "apps", "shadow"));
        assert!(!names(&route, "apps", "fresh"));
    }
}
