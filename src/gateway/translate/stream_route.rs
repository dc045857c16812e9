//! TLSRoutes and TCPRoutes: each connection goes whole to a backend of the route's one
//! rule, picked by weight (a TLSRoute's by the server name the client sends, on a TLS
//! listener; a TCPRoute's on a TCP listener, which has no name to go by). Their
//! backendRefs are an HTTPRoute's without filters, so a rule is lowered as one
//! ([`http_route::lower_rules`]) with a match for everything: its backends, a
//! ReferenceGrant for another namespace's Service, and the share of those that cannot be
//! used (connections to it are closed).
//!
//! Of the routes attached to one listener for one name, the oldest is served (the
//! Gateway API's order); every one of them is Accepted.

use super::Inputs;
use super::attach::{Lowered, Route, Specificity, route_of};
use super::gateway::{TCP_ROUTE, TLS_ROUTE, UDP_ROUTE};
use super::http_route::{self, Matches, RuleOf};
use crate::gateway::api::httproutes::{HttpRouteRules, HttpRouteRulesBackendRefs};
use crate::gateway::api::tcproutes::TcpRoute;
use crate::gateway::api::tlsroutes::TlsRoute;
use crate::gateway::api::udproutes::UdpRoute;
use switchyard_core::route::spec::RuleMatch;

/// A TLSRoute as attachment reads it.
pub fn tls_route(route: &TlsRoute) -> Route<'_> {
    route_of!(route, TLS_ROUTE, &route.spec.hostnames)
}

/// A TCPRoute as attachment reads it: no hostnames.
pub fn tcp_route(route: &TcpRoute) -> Route<'_> {
    route_of!(route, TCP_ROUTE, &[])
}

/// A UDPRoute as attachment reads it: no hostnames.
pub fn udp_route(route: &UdpRoute) -> Route<'_> {
    route_of!(route, UDP_ROUTE, &[])
}

/// A backendRef of a TLSRoute's or a TCPRoute's (generated types of their own, with the
/// same fields) as an HTTPRoute's.
macro_rules! backend_ref {
    ($b:expr) => {{
        let b = $b;
        HttpRouteRulesBackendRefs {
            group: b.group.clone(),
            kind: b.kind.clone(),
            name: b.name.clone(),
            namespace: b.namespace.clone(),
            port: b.port,
            weight: b.weight,
            filters: None,
        }
    }};
}

/// The rules of a TLSRoute's or a TCPRoute's (`$rules`) in HTTPRoute's fields.
macro_rules! as_http_rules {
    ($rules:expr) => {
        ($rules.iter())
            .map(|r| HttpRouteRules {
                name: r.name.clone(),
                backend_refs: Some(r.backend_refs.iter().map(|b| backend_ref!(b)).collect()),
                ..HttpRouteRules::default()
            })
            .collect::<Vec<HttpRouteRules>>()
    };
}

/// A TLSRoute's rules in HTTPRoute's fields.
pub fn tls_rules(route: &TlsRoute) -> Vec<HttpRouteRules> {
    as_http_rules!(route.spec.rules)
}

/// A TLSRoute's rules (`rules`: [`tls_rules`] of it) in the vocabulary (it is the
/// `seniority`-th oldest route): as a Terminate listener serves them (the
/// BackendTLSPolicies of their backends apply), each with its variant for a Passthrough
/// listener (they do not).
pub fn lower_tls(
    inputs: &Inputs<'_>,
    route: &TlsRoute,
    rules: &[HttpRouteRules],
    seniority: usize,
) -> Result<Lowered, String> {
    let mut terminated = lower(inputs, TLS_ROUTE, &route.metadata, rules, seniority, true)?;
    let passed = lower(inputs, TLS_ROUTE, &route.metadata, rules, seniority, false)?;
    for (t, p) in terminated.rules.iter_mut().zip(passed.rules) {
        t.rule.passed_through = Some(p.rule.rule);
    }
    Ok(terminated)
}

/// A TCPRoute's rules in the vocabulary (it is the `seniority`-th oldest route). No
/// BackendTLSPolicy applies: the Gateway API defines none for a TCPRoute.
pub fn lower_tcp(
    inputs: &Inputs<'_>,
    route: &TcpRoute,
    seniority: usize,
) -> Result<Lowered, String> {
    let rules = as_http_rules!(route.spec.rules);
    lower(inputs, TCP_ROUTE, &route.metadata, &rules, seniority, false)
}

/// A UDPRoute's rules in the vocabulary (it is the `seniority`-th oldest route): its
/// backendRefs are UDP ports of Services. No BackendTLSPolicy applies.
pub fn lower_udp(
    inputs: &Inputs<'_>,
    route: &UdpRoute,
    seniority: usize,
) -> Result<Lowered, String> {
    let rules = as_http_rules!(route.spec.rules);
    lower(inputs, UDP_ROUTE, &route.metadata, &rules, seniority, false)
}

fn lower(
    inputs: &Inputs<'_>,
    kind: &'static str,
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    rules: &[HttpRouteRules],
    seniority: usize,
    backend_tls: bool,
) -> Result<Lowered, String> {
    let of = RuleOf {
        kind,
        namespace: metadata.namespace.as_deref().unwrap_or_default(),
        name: metadata.name.as_deref().unwrap_or_default(),
        seniority,
        backend_tls,
    };
    let everything = |_: usize, _: &str| -> Result<Matches, String> {
        Ok(vec![(RuleMatch::default(), Specificity::Stream)])
    };
    http_route::lower_rules(inputs, &of, rules, &everything)
}
