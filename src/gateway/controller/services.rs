//! Which Service events are a change to the Gateway API's translation.
//!
//! Every Service of the process's scope is watched once, for every front-end; most are no
//! business of this controller. One that is (a route names it, it is the fleet's, or
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

use super::super::api::grpcroutes::GrpcRoute;
use super::super::api::httproutes::HttpRoute;
use super::super::api::tcproutes::TcpRoute;
use super::super::api::tlsroutes::TlsRoute;
use super::super::api::udproutes::UdpRoute;
use super::super::service;
use crate::k8s::watched::{Filter, Watched};

/// Whether `route` (an HTTPRoute or a GRPCRoute: their references have the same fields)
/// refers to the Service `namespace`/`name` in a backendRef or a request mirror, on a rule
/// or on a backendRef (a reference of another kind of the same name counts too: a pass
/// too many is harmless, one too few is not).
macro_rules! names {
    ($route:expr, $namespace:expr, $name:expr) => {{
        let route = $route;
        let own = route.namespace().unwrap_or_default();
        let names = |ns: Option<&String>, n: &str| n == $name && ns.unwrap_or(&own) == $namespace;
        route.spec.rules.iter().flatten().any(|rule| {
            let backends = rule.backend_refs.iter().flatten();
            let backend_mirrors = (backends.clone())
                .flat_map(|b| b.filters.iter().flatten())
                .filter_map(|f| f.request_mirror.as_ref())
                .map(|m| &m.backend_ref)
                .any(|b| names(b.namespace.as_ref(), &b.name));
            let rule_mirrors = (rule.filters.iter().flatten())
                .filter_map(|f| f.request_mirror.as_ref())
                .map(|m| &m.backend_ref)
                .any(|b| names(b.namespace.as_ref(), &b.name));
            backends
                .clone()
                .any(|b| names(b.namespace.as_ref(), &b.name))
                || backend_mirrors
                || rule_mirrors
        })
    }};
}

/// Whether a TLSRoute or a TCPRoute (no filters, so no mirrors) names the Service
/// `namespace`/`name` in a backendRef.
macro_rules! names_backend {
    ($route:expr, $namespace:expr, $name:expr) => {{
        let route = $route;
        let own = route.namespace().unwrap_or_default();
        (route.spec.rules.iter())
            .flat_map(|rule| &rule.backend_refs)
            .any(|b| &b.name == $name && b.namespace.as_ref().unwrap_or(&own) == $namespace)
    }};
}

/// The routes whose backendRefs name Services, of every kind watched.
pub struct Named<'a> {
    pub routes: &'a Watched<HttpRoute>,
    pub grpc_routes: Option<&'a Watched<GrpcRoute>>,
    pub tls_routes: Option<&'a Watched<TlsRoute>>,
    pub tcp_routes: Option<&'a Watched<TcpRoute>>,
    pub udp_routes: Option<&'a Watched<UdpRoute>>,
}

/// Passes the Services a translation reads: those in `fleet_namespace` labelled as a
/// Gateway's (this controller's or another's: both hold fleet ports), the fleet Service,
/// and those a route names in a backendRef or a mirror.
pub fn read_by_translation(fleet_service: &(String, String), named: Named<'_>) -> Filter<Service> {
    let (fleet_namespace, fleet_name) = fleet_service.clone();
    let routes = named.routes.clone();
    let grpc_routes = named.grpc_routes.cloned();
    let tls_routes = named.tls_routes.cloned();
    let tcp_routes = named.tcp_routes.cloned();
    let udp_routes = named.udp_routes.cloned();
    Arc::new(move |s: &Service| {
        let namespace = s.namespace().unwrap_or_default();
        let name = s.name_any();
        if namespace == fleet_namespace && (name == fleet_name || service::gateway_of(s).is_some())
        {
            return true;
        }
        // A scan, not an index: Service events are rare next to route events, and a scan
        // of every route's references costs microseconds per thousand routes.
        let by_http = (routes.state().iter()).any(|r| names!(r, &namespace, &name));
        by_http
            || (grpc_routes.iter())
                .any(|g| (g.state().iter()).any(|r| names!(r, &namespace, &name)))
            || (tls_routes.iter())
                .any(|t| (t.state().iter()).any(|r| names_backend!(r, &namespace, &name)))
            || (tcp_routes.iter())
                .any(|t| (t.state().iter()).any(|r| names_backend!(r, &namespace, &name)))
            || (udp_routes.iter())
                .any(|u| (u.state().iter()).any(|r| names_backend!(r, &namespace, &name)))
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
        let names = |namespace: &str, name: &str| names!(&route, namespace, name);
        assert!(names("apps", "here"));
        assert!(names("other", "there"));
        assert!(names("apps", "copy"));
        assert!(names("s", "shadow"));
        // The namespace is the route's unless the reference gives one.
        assert!(!names("other", "here"));
        assert!(!names("apps", "there"));
        assert!(!names("apps", "shadow"));
        assert!(!names("apps", "fresh"));
    }
}
