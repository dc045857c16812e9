//! The Gateway API, lowered into Switchyard's route vocabulary. Pure and deterministic:
//! the GatewayClasses, Gateways, HTTPRoutes and ReferenceGrants, with the Services,
//! Secrets and Namespaces they name, give
//!
//! - for each Gateway of a class Switchyard controls, the ports it listens on and, per
//!   port, its virtual hosts: one per hostname, holding the rules of every HTTPRoute
//!   attached there as the core's [`Rule`]s (made by its assembly step), in the Gateway
//!   API's order of precedence;
//! - the status every object gets: the conditions with the specification's reasons.
//!
//! Nothing here reads or writes the API server; the controller does, and adds what only
//! the fleet can tell (Programmed, Served). One file per kind: [`gateway_class`],
//! [`gateway`], [`http_route`]; [`virtual_host`] merges and orders the rules.
//!
//! Not lowered yet (a route using them is not Accepted, reason UnsupportedValue):
//! ExtensionRef filters, and filters per backend but RequestHeaderModifier and, on a
//! rule's only backend, URLRewrite.

/// A RequestHeaderModifier (of a rule or of a backendRef: the generated types differ) in
/// the vocabulary's header edits.
macro_rules! header_edits {
    ($modifier:expr) => {
        match $modifier {
            None => switchyard_core::route::spec::HeaderEdits::default(),
            Some(m) => switchyard_core::route::spec::HeaderEdits {
                set: (m.set.iter().flatten())
                    .map(|h| (h.name.clone(), h.value.clone()))
                    .collect(),
                add: (m.add.iter().flatten())
                    .map(|h| (h.name.clone(), h.value.clone()))
                    .collect(),
                remove: m.remove.clone().unwrap_or_default(),
            },
        }
    };
}

/// A header match (of an HTTPRoute's or a GRPCRoute's: the generated types differ, the
/// fields are the same) in the vocabulary; `$types` is its type's enum.
macro_rules! header_match {
    ($h:expr, $types:ident) => {{
        let h = $h;
        let mut header = switchyard_core::route::spec::HeaderMatch {
            name: h.name.clone(),
            ..Default::default()
        };
        match h.r#type.as_ref().unwrap_or(&$types::Exact) {
            $types::Exact => header.exact = Some(h.value.clone()),
            $types::RegularExpression => header.regex = Some(h.value.clone()),
        }
        header
    }};
}

/// Whether a label selector (of any of the generated types: each field of the Gateway API
/// that holds one has a type of its own) selects `$labels`.
macro_rules! selects {
    ($selector:expr, $labels:expr) => {{
        let selector = $selector;
        let expressions: Vec<(&str, &str, &[String])> = (selector.match_expressions.iter())
            .flatten()
            .map(|e| {
                (
                    e.key.as_str(),
                    e.operator.as_str(),
                    e.values.as_deref().unwrap_or_default(),
                )
            })
            .collect();
        $crate::gateway::translate::gateway::selects(
            selector.match_labels.as_ref(),
            &expressions,
            $labels,
        )
    }};
}

pub mod attach;
pub mod backend_ref;
pub mod backend_tls;
pub mod client_validation;
pub mod duration;
pub mod gateway;
pub mod gateway_class;
pub mod grpc_route;
pub mod hostname;
pub mod http_route;
pub mod listener_set;
pub mod reference_grant;
pub mod stream_route;
pub mod virtual_host;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use super::api::backendtlspolicies::BackendTlsPolicy;
use super::api::gatewayclasses::GatewayClass;
use super::api::gateways::Gateway;
use super::api::grpcroutes::GrpcRoute;
use super::api::httproutes::{HttpRoute, HttpRouteRules};
use super::api::listenersets::ListenerSet;
use super::api::referencegrants::ReferenceGrant;
use super::api::tcproutes::TcpRoute;
use super::api::tlsroutes::TlsRoute;
use super::api::udproutes::UdpRoute;
pub use client_validation::KnownCaBundle;
pub use listener_set::ListenerSetOutcome;
use switchyard_core::route::{ClientValidation, Rule, SecretRef};

/// The controllerName of the GatewayClasses Switchyard serves.
pub const CONTROLLER_NAME: &str = "switchyard.dev/gateway-controller";

/// The Gateway API release the types are of (the CRDs' bundle-version annotation).
pub const GATEWAY_API_VERSION: &str = "v1.7.0";

/// The group of every Gateway API kind.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// Everything the translation reads.
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    pub controller_name: &'a str,
    /// The bundle version the installed Gateway API CRDs announce, when known.
    pub crd_version: Option<&'a str>,
    pub classes: &'a [GatewayClass],
    pub gateways: &'a [Gateway],
    /// More listeners for Gateways that let them attach.
    pub listener_sets: &'a [ListenerSet],
    pub routes: &'a [HttpRoute],
    pub grpc_routes: &'a [GrpcRoute],
    pub tls_routes: &'a [TlsRoute],
    pub tcp_routes: &'a [TcpRoute],
    pub udp_routes: &'a [UdpRoute],
    pub grants: &'a [ReferenceGrant],
    pub services: &'a [Service],
    /// For listeners that admit routes from namespaces by label.
    pub namespaces: &'a [Namespace],
    pub secrets: &'a [KnownSecret],
    /// ConfigMaps, for the CA certificates of client validation and of backends' TLS.
    pub ca_bundles: &'a [KnownCaBundle],
    pub backend_tls_policies: &'a [BackendTlsPolicy],
}

/// A Secret a listener may name, and whether it holds a usable certificate and key.
#[derive(Clone, Debug, PartialEq)]
pub struct KnownSecret {
    pub namespace: String,
    pub name: String,
    /// Of type kubernetes.io/tls with a non-empty tls.crt and tls.key.
    pub valid_tls: bool,
}

/// What the translation gives: a status for every object of Switchyard's, and what each
/// Gateway serves.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Translation {
    pub classes: Vec<ClassOutcome>,
    pub gateways: Vec<GatewayOutcome>,
    /// The ListenerSets that name a Gateway of Switchyard's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub listener_sets: Vec<ListenerSetOutcome>,
    pub routes: Vec<RouteOutcome>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub grpc_routes: Vec<RouteOutcome>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tls_routes: Vec<RouteOutcome>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tcp_routes: Vec<RouteOutcome>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub udp_routes: Vec<RouteOutcome>,
    /// The BackendTLSPolicies of Services the Gateways send to.
    pub policies: Vec<backend_tls::PolicyOutcome>,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClassOutcome {
    pub name: String,
    pub generation: i64,
    pub conditions: Vec<Cond>,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayOutcome {
    pub namespace: String,
    pub name: String,
    pub generation: i64,
    /// Accepted, and ResolvedRefs with a backend client certificate (Programmed is the
    /// controller's: it needs the fleet).
    pub conditions: Vec<Cond>,
    /// The certificate its connections to TLS backends present (`tls.backend`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_client_certificate: Option<SecretRef>,
    /// Its own listeners (a ListenerSet's are in the ListenerSet's outcome).
    pub listeners: Vec<ListenerOutcome>,
    /// How many ListenerSets are attached and accepted.
    #[serde(skip_serializing_if = "is_zero")]
    pub attached_listener_sets: i32,
    /// `spec.infrastructure`'s labels and annotations, for the Gateway's Service.
    #[serde(skip_serializing_if = "Infrastructure::is_empty")]
    pub infrastructure: Infrastructure,
    /// What the Gateway serves, by port; empty when it is not Accepted.
    pub ports: Vec<PortConfig>,
}

/// The labels and annotations a Gateway asks its infrastructure to carry.
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Infrastructure {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Infrastructure {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerOutcome {
    pub name: String,
    pub port: i32,
    /// Accepted, ResolvedRefs, Conflicted.
    pub conditions: Vec<Cond>,
    /// The route kinds it admits that Switchyard supports.
    pub supported_kinds: Vec<String>,
    pub attached_routes: i32,
    /// Whether routes attach and traffic flows: accepted, refs resolved, no conflict.
    pub usable: bool,
}

/// One port of a Gateway, as the fleet is to serve it.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PortConfig {
    pub port: i32,
    /// `HTTP`, `HTTPS`, `TLS`, `TCP` or `UDP`.
    pub protocol: String,
    /// HTTPS: the certificates, by the SNI name of the listener that names them (`*` for
    /// a listener without a hostname).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<ListenerCertificate>,
    /// HTTPS: the client certificates every connection to the port is checked against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_validation: Option<ClientValidation>,
    pub virtual_hosts: Vec<GatewayVirtualHost>,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerCertificate {
    pub hostname: String,
    /// (namespace, name) of each Secret.
    pub secrets: Vec<(String, String)>,
}

/// The rules of every route attached to a port for one hostname, most precedent first.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayVirtualHost {
    pub hostname: String,
    pub rules: Vec<GatewayRule>,
    /// On an HTTPS port of several listeners: the hostname of the listener that claims
    /// this one (`*`: the listener without a hostname; `-`: none). A request that came in
    /// on another listener's certificate is answered 421 (GatewayHTTPSListenerDetect-
    /// MisdirectedRequests). On a TLS port: that of the listener whose mode serves it
    /// (passed through, or decrypted with its certificate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listener_hostname: Option<String>,
}

/// One match of one rule of a route, in the core's vocabulary.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayRule {
    /// `namespace/route`.
    pub route: String,
    /// The route's kind (not written for an HTTPRoute).
    #[serde(skip_serializing_if = "is_http_route")]
    pub kind: &'static str,
    /// Its share of 500s is the weight of the backendRefs that cannot be used; a rule
    /// without a usable backend answers 500 to every request.
    pub rule: Rule,
    /// A TLSRoute's rule as a Passthrough listener serves it: its backends without the
    /// TLS of their BackendTLSPolicies (`rule` is the Terminate listeners').
    #[serde(skip)]
    pub passed_through: Option<Rule>,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteOutcome {
    pub namespace: String,
    pub name: String,
    pub generation: i64,
    /// One per parentRef to a Gateway of Switchyard's.
    pub parents: Vec<ParentOutcome>,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParentOutcome {
    /// The Gateway the parentRef names, itself or through a ListenerSet.
    pub gateway_namespace: String,
    pub gateway: String,
    /// (namespace, name) of the ListenerSet the parentRef names, when it names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listener_set: Option<(String, String)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// Accepted, ResolvedRefs.
    pub conditions: Vec<Cond>,
}

/// A condition as the translation decides it; the status writer adds
/// observedGeneration and lastTransitionTime.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Cond {
    #[serde(rename = "type")]
    pub type_: &'static str,
    /// `True` or `False`.
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

impl Cond {
    pub fn yes(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: "True",
            reason,
            message: message.into(),
        }
    }

    pub fn no(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: "False",
            reason,
            message: message.into(),
        }
    }

    pub fn is_true(&self) -> bool {
        self.status == "True"
    }
}

/// Translates everything at once: a route's attachment depends on its Gateway's
/// listeners, and a listener's attachedRoutes on every route.
pub fn translate(inputs: &Inputs<'_>) -> Translation {
    let classes = gateway_class::outcomes(inputs);
    let accepted_classes: Vec<&str> = classes
        .iter()
        .filter(|c| c.conditions.first().is_some_and(Cond::is_true))
        .map(|c| c.name.as_str())
        .collect();
    let mut gateways: Vec<gateway::Listening<'_>> = inputs
        .gateways
        .iter()
        .filter(|g| accepted_classes.contains(&g.spec.gateway_class_name.as_str()))
        .map(|g| gateway::listening(inputs, g))
        .collect();
    let mut routes = Vec::new();
    let mut grpc_routes = Vec::new();
    let mut tls_routes = Vec::new();
    let mut tcp_routes = Vec::new();
    let mut udp_routes = Vec::new();
    let mut attached = Vec::new();
    // Once per pass: lowering reads them, and so do the BackendTLSPolicies' ancestors.
    let grpc_rules: Vec<_> = (inputs.grpc_routes.iter())
        .map(grpc_route::as_http_rules)
        .collect();
    let tls_rules: Vec<_> = (inputs.tls_routes.iter())
        .map(stream_route::tls_rules)
        .collect();
    let sorted = sorted_routes(inputs, &grpc_rules, &tls_rules);
    for (seniority, route) in sorted.into_iter().enumerate() {
        let (view, lowered) = match route {
            AnyRoute::Http(r) => (
                http_route::route(r),
                http_route::lower(inputs, r, seniority),
            ),
            AnyRoute::Grpc(r, rules) => (
                grpc_route::route(r),
                grpc_route::lower(inputs, r, rules, seniority),
            ),
            AnyRoute::Tls(r, rules) => (
                stream_route::tls_route(r),
                stream_route::lower_tls(inputs, r, rules, seniority),
            ),
            AnyRoute::Tcp(r) => (
                stream_route::tcp_route(r),
                stream_route::lower_tcp(inputs, r, seniority),
            ),
            AnyRoute::Udp(r) => (
                stream_route::udp_route(r),
                stream_route::lower_udp(inputs, r, seniority),
            ),
        };
        let (outcome, rules) = attach::attach(inputs, &view, &lowered, &mut gateways, &attached);
        if !outcome.parents.is_empty() {
            match route {
                AnyRoute::Http(_) => routes.push(outcome),
                AnyRoute::Grpc(..) => grpc_routes.push(outcome),
                AnyRoute::Tls(..) => tls_routes.push(outcome),
                AnyRoute::Tcp(_) => tcp_routes.push(outcome),
                AnyRoute::Udp(_) => udp_routes.push(outcome),
            }
        }
        attached.extend(rules);
    }
    let mut listener_sets = Vec::new();
    let gateways: Vec<GatewayOutcome> = gateways
        .into_iter()
        .map(|g| {
            let ports = virtual_host::ports(&g, &attached);
            let (gateway, sets) = g.into_outcome(ports);
            listener_sets.extend(sets);
            gateway
        })
        .collect();
    listener_sets.extend(listener_set::orphans(inputs));
    let http_rules =
        (inputs.routes.iter()).map(|r| (&r.metadata, r.spec.rules.as_deref().unwrap_or_default()));
    // A GRPCRoute whose rules did not convert is accepted by no Gateway: it sends nowhere.
    let grpc_rules = (inputs.grpc_routes.iter().zip(&grpc_rules))
        .filter_map(|(r, rules)| Some((&r.metadata, rules.as_deref().ok()?)));
    let mut by_service = senders(http_rules, &routes);
    for (service, gateways) in senders(grpc_rules, &grpc_routes) {
        by_service.entry(service).or_default().extend(gateways);
    }
    // A TLSRoute's backends: a BackendTLSPolicy encrypts what a Terminate listener
    // decrypted; a Gateway that passes the route's connections through is no ancestor.
    let tls_rules = (inputs.tls_routes.iter().zip(&tls_rules))
        .map(|(r, rules)| (&r.metadata, rules.as_slice()));
    let decrypted = decrypted_by(&gateways, &tls_routes);
    for (service, gateways) in senders(tls_rules, &decrypted) {
        by_service.entry(service).or_default().extend(gateways);
    }
    let ancestors = |namespace: &str, service: &str| {
        (by_service.get(&(namespace.to_owned(), service.to_owned())))
            .cloned()
            .unwrap_or_default()
    };
    let policies = backend_tls::outcomes(inputs, &ancestors);
    Translation {
        classes,
        gateways,
        listener_sets,
        routes,
        grpc_routes,
        tls_routes,
        tcp_routes,
        udp_routes,
        policies,
    }
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

fn is_http_route(kind: &&'static str) -> bool {
    *kind == gateway::HTTP_ROUTE
}

/// The Gateways that send to each Service (namespace, name): those a route is accepted
/// by, for every Service its backendRefs and mirrors name. `routes`: each route's metadata
/// and its rules in HTTPRoute's fields.
/// The TLSRoutes' outcomes (`tls_routes`) with only the parents whose Gateway decrypts the
/// route's connections (a TLS port's virtual host served with its listener's certificate).
fn decrypted_by(gateways: &[GatewayOutcome], tls_routes: &[RouteOutcome]) -> Vec<RouteOutcome> {
    let mut decrypting: BTreeSet<(&str, &str, &str)> = BTreeSet::new();
    for g in gateways {
        for port in g.ports.iter().filter(|p| p.protocol == "TLS") {
            for vh in &port.virtual_hosts {
                let decrypts = (port.certificates.iter()).any(|c| {
                    Some(&c.hostname) == vh.listener_hostname.as_ref() && !c.secrets.is_empty()
                });
                let routes = (vh.rules.iter()).filter(|r| r.kind == gateway::TLS_ROUTE);
                for r in routes.filter(|_| decrypts) {
                    decrypting.insert((&g.namespace, &g.name, &r.route));
                }
            }
        }
    }
    (tls_routes.iter())
        .map(|o| {
            let route = format!("{}/{}", o.namespace, o.name);
            let parents = (o.parents.iter())
                .filter(|p| decrypting.contains(&(&p.gateway_namespace, &p.gateway, &route)))
                .cloned()
                .collect();
            RouteOutcome {
                parents,
                ..o.clone()
            }
        })
        .collect()
}

fn senders<'a>(
    routes: impl Iterator<Item = (&'a ObjectMeta, &'a [HttpRouteRules])>,
    outcomes: &[RouteOutcome],
) -> BTreeMap<(String, String), BTreeSet<(String, String)>> {
    let mut out: BTreeMap<(String, String), BTreeSet<(String, String)>> = BTreeMap::new();
    for (metadata, rules) in routes {
        let namespace = metadata.namespace.as_deref().unwrap_or_default();
        let name = metadata.name.as_deref().unwrap_or_default();
        let Some(outcome) = outcomes
            .iter()
            .find(|o| o.namespace == namespace && o.name == name)
        else {
            continue;
        };
        let gateways: BTreeSet<(String, String)> = (outcome.parents.iter())
            .filter(|p| p.conditions.first().is_some_and(Cond::is_true))
            .map(|p| (p.gateway_namespace.clone(), p.gateway.clone()))
            .collect();
        for rule in rules {
            let backends = (rule.backend_refs.iter().flatten()).map(|b| {
                (
                    b.group.as_deref(),
                    b.kind.as_deref(),
                    &b.name,
                    b.namespace.as_deref(),
                )
            });
            let mirrors = (rule.filters.iter().flatten())
                .filter_map(|f| f.request_mirror.as_ref())
                .map(|m| &m.backend_ref)
                .map(|b| {
                    (
                        b.group.as_deref(),
                        b.kind.as_deref(),
                        &b.name,
                        b.namespace.as_deref(),
                    )
                });
            for (group, kind, service, service_ns) in backends.chain(mirrors) {
                if !group.unwrap_or("").is_empty() || kind.unwrap_or("Service") != "Service" {
                    continue;
                }
                let key = (service_ns.unwrap_or(namespace).to_owned(), service.clone());
                out.entry(key).or_default().extend(gateways.iter().cloned());
            }
        }
    }
    out
}

/// A route of a kind served on HTTP and HTTPS listeners.
#[derive(Clone, Copy)]
enum AnyRoute<'a> {
    Http(&'a HttpRoute),
    /// With its rules in HTTPRoute's fields.
    Grpc(&'a GrpcRoute, &'a Result<Vec<HttpRouteRules>, String>),
    /// With its rules in HTTPRoute's fields.
    Tls(&'a TlsRoute, &'a [HttpRouteRules]),
    Tcp(&'a TcpRoute),
    Udp(&'a UdpRoute),
}

/// Routes of every kind oldest first, then by namespace and name: the Gateway API's
/// tie-break between routes, so that equal matches keep the order it prescribes, and the
/// older of an HTTPRoute and a GRPCRoute keeps a hostname they share.
fn sorted_routes<'a>(
    inputs: &Inputs<'a>,
    grpc_rules: &'a [Result<Vec<HttpRouteRules>, String>],
    tls_rules: &'a [Vec<HttpRouteRules>],
) -> Vec<AnyRoute<'a>> {
    let http = (inputs.routes.iter()).map(|r| (seniority(&r.metadata), AnyRoute::Http(r)));
    let grpc = (inputs.grpc_routes.iter().zip(grpc_rules))
        .map(|(r, rules)| (seniority(&r.metadata), AnyRoute::Grpc(r, rules)));
    let tls = (inputs.tls_routes.iter().zip(tls_rules))
        .map(|(r, rules)| (seniority(&r.metadata), AnyRoute::Tls(r, rules)));
    let tcp = (inputs.tcp_routes.iter()).map(|r| (seniority(&r.metadata), AnyRoute::Tcp(r)));
    let udp = (inputs.udp_routes.iter()).map(|r| (seniority(&r.metadata), AnyRoute::Udp(r)));
    let mut sorted: Vec<_> = http.chain(grpc).chain(tls).chain(tcp).chain(udp).collect();
    // Stable: an HTTPRoute before a GRPCRoute of the same namespace and name.
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    sorted.into_iter().map(|(_, r)| r).collect()
}

/// Oldest first (an object without a creation time last), then alphabetically by
/// `{namespace}/{name}`: the Gateway API's order between objects that claim the same thing.
pub(crate) fn seniority(meta: &ObjectMeta) -> (bool, Option<String>, String) {
    let created = meta.creation_timestamp.as_ref().map(|t| t.0.to_string());
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    (created.is_none(), created, format!("{namespace}/{name}"))
}
