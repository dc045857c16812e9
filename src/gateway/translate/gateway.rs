//! Gateways: each listener checked (protocol, conflicts with its siblings, route kinds,
//! certificates), its own and those of the ListenerSets it lets attach
//! ([`super::listener_set`]), and which routes it admits.

use std::borrow::Cow;
use std::collections::BTreeMap;

use switchyard_core::route::{ClientValidation, SecretRef};

use super::listener_set::{self, ListenerSetOutcome};
use super::reference_grant::{self, Side};
use super::{
    Cond, GROUP, GatewayOutcome, Infrastructure, Inputs, ListenerOutcome, PortConfig,
    client_validation,
};
use crate::gateway::api::gateways::{
    Gateway, GatewayListeners, GatewayListenersAllowedRoutesNamespacesFrom as From,
    GatewayListenersTlsMode,
};

pub const HTTP_ROUTE: &str = "HTTPRoute";
pub const GRPC_ROUTE: &str = "GRPCRoute";
pub const TLS_ROUTE: &str = "TLSRoute";
pub const TCP_ROUTE: &str = "TCPRoute";
pub const UDP_ROUTE: &str = "UDPRoute";

/// The route kinds Switchyard serves on HTTP and HTTPS listeners: a listener that names
/// none lists both in its supportedKinds.
const HTTP_KINDS: &[&str] = &[HTTP_ROUTE, GRPC_ROUTE];
/// On TLS listeners, on TCP listeners, and on UDP listeners.
const TLS_KINDS: &[&str] = &[TLS_ROUTE];
const TCP_KINDS: &[&str] = &[TCP_ROUTE];
const UDP_KINDS: &[&str] = &[UDP_ROUTE];

/// A Gateway of Switchyard's, its listeners checked, collecting the routes that attach.
pub struct Listening<'a> {
    pub gateway: &'a Gateway,
    pub namespace: &'a str,
    pub name: &'a str,
    pub conditions: Vec<Cond>,
    /// Its own, then those of the ListenerSets attached, in the order of precedence.
    pub listeners: Vec<Listener<'a>>,
    /// The ListenerSets attached, in the order of precedence.
    pub sets: Vec<listener_set::Attached<'a>>,
    /// The ListenerSets that name it but may not attach.
    pub refused_sets: Vec<ListenerSetOutcome>,
    /// The certificate its connections to TLS backends present, when it names a usable one.
    pub client_certificate: Option<SecretRef>,
}

/// Who declares a listener: the Gateway, or the `i`-th of its attached ListenerSets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    Gateway,
    ListenerSet(usize),
}

pub struct Listener<'a> {
    pub spec: Cow<'a, GatewayListeners>,
    pub owner: Owner,
    /// The namespace of its owner: routes of the `Same` namespace are of this one, and its
    /// certificates are its owner's references.
    pub namespace: &'a str,
    pub conditions: Vec<Cond>,
    pub supported_kinds: Vec<String>,
    /// Routes attach to it: accepted, no conflict, a kind it serves. Its references may
    /// still be unresolved (then its routes count, but nothing is served).
    pub attachable: bool,
    /// Traffic flows: attachable, and its certificates resolved.
    pub usable: bool,
    pub attached_routes: i32,
    /// HTTPS: the (namespace, name) of its certificate Secrets.
    pub secrets: Vec<(String, String)>,
    /// HTTPS: the client certificates its port checks (the Gateway's
    /// `tls.frontend`, for its port or by default), with the authorities that resolved.
    pub client_validation: Option<ClientValidation>,
}

/// Checks the Gateway's listeners; routes attach later ([`super::http_route`]).
pub fn listening<'a>(inputs: &Inputs<'a>, gateway: &'a Gateway) -> Listening<'a> {
    let namespace = gateway.metadata.namespace.as_deref().unwrap_or_default();
    let name = gateway.metadata.name.as_deref().unwrap_or_default();
    let specs = &gateway.spec.listeners;
    let conflicts = conflicts(specs);
    let own = Declarer {
        owner: Owner::Gateway,
        kind: "Gateway",
        namespace,
    };
    let mut listeners: Vec<Listener<'a>> = specs
        .iter()
        .zip(conflicts)
        .map(|(spec, conflict)| listener(inputs, gateway, own, Cow::Borrowed(spec), conflict))
        .collect();
    let mut conditions = vec![accepted(gateway, &listeners)];
    let (sets, refused_sets) = listener_set::of_gateway(inputs, gateway);
    for (i, set) in sets.iter().enumerate() {
        let declarer = Declarer {
            owner: Owner::ListenerSet(i),
            kind: "ListenerSet",
            namespace: set.namespace,
        };
        for spec in listener_set::listeners(set.set) {
            let conflict = conflict_with_precedent(&listeners, &spec);
            let l = listener(inputs, gateway, declarer, Cow::Owned(spec), conflict);
            listeners.push(l);
        }
    }
    let client_certificate = backend_client_certificate(inputs, gateway);
    match &client_certificate {
        None => {}
        Some(Ok(_)) => conditions.push(Cond::yes(
            "ResolvedRefs",
            "ResolvedRefs",
            "all references resolved",
        )),
        Some(Err((reason, message))) => {
            conditions.push(Cond::no("ResolvedRefs", reason, message.clone()));
        }
    }
    let insecure = listeners
        .iter()
        .filter(|l| l.usable)
        .find(|l| (l.client_validation.as_ref()).is_some_and(|v| v.insecure_fallback));
    if let Some(l) = insecure {
        conditions.push(Cond::yes(
            "InsecureFrontendValidationMode",
            "ConfigurationChanged",
            format!(
                "port {} serves clients without a valid certificate too \
                 (AllowInsecureFallback)",
                l.spec.port
            ),
        ));
    }
    Listening {
        gateway,
        namespace,
        name,
        conditions,
        listeners,
        sets,
        refused_sets,
        client_certificate: client_certificate.and_then(Result::ok),
    }
}

/// Who declares the listeners being checked, and the kind a ReferenceGrant names it by.
#[derive(Clone, Copy)]
struct Declarer<'a> {
    owner: Owner,
    kind: &'static str,
    namespace: &'a str,
}

/// The TLS Secret the Gateway's `tls.backend.clientCertificateRef` names, when it has one:
/// of kind Secret, permitted (a ReferenceGrant for another namespace's), present and
/// holding a certificate and key; or the ResolvedRefs reason and message saying why not.
fn backend_client_certificate(
    inputs: &Inputs<'_>,
    gateway: &Gateway,
) -> Option<Result<SecretRef, Problem>> {
    let r = gateway
        .spec
        .tls
        .as_ref()?
        .backend
        .as_ref()?
        .client_certificate_ref
        .as_ref()?;
    let namespace = gateway.metadata.namespace.as_deref().unwrap_or_default();
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Secret");
    let target_ns = r.namespace.as_deref().unwrap_or(namespace);
    let resolved = if !group.is_empty() || kind != "Secret" {
        Err((
            "InvalidClientCertificateRef",
            format!(
                "clientCertificateRef {group}/{kind} {:?} is not a Secret",
                r.name
            ),
        ))
    } else {
        gateway_may_use(inputs, namespace, "Secret", target_ns, &r.name)
            .and_then(|()| tls_secret(inputs, target_ns, &r.name, "InvalidClientCertificateRef"))
            .map(|()| SecretRef {
                namespace: target_ns.to_owned(),
                name: r.name.clone(),
            })
    };
    Some(resolved)
}

/// Whether a Gateway of `namespace` may use the `kind` object `name` of `target_ns` (a
/// ReferenceGrant there lets it), else RefNotPermitted.
pub fn gateway_may_use(
    inputs: &Inputs<'_>,
    namespace: &str,
    kind: &str,
    target_ns: &str,
    name: &str,
) -> Result<(), Problem> {
    may_use(inputs, ("Gateway", namespace), kind, target_ns, name)
}

/// Whether an object of kind `from.0` in namespace `from.1` may use the `kind` object
/// `name` of `target_ns` (a ReferenceGrant there lets it), else RefNotPermitted.
fn may_use(
    inputs: &Inputs<'_>,
    (from_kind, namespace): (&str, &str),
    kind: &str,
    target_ns: &str,
    name: &str,
) -> Result<(), Problem> {
    let from = Side {
        group: GROUP,
        kind: from_kind,
        namespace,
    };
    let to = Side {
        group: "",
        kind,
        namespace: target_ns,
    };
    if reference_grant::permits(inputs.grants, from, to, name) {
        Ok(())
    } else {
        Err((
            "RefNotPermitted",
            format!(
                "no ReferenceGrant in namespace {target_ns} lets this {from_kind} use {kind} {name:?}"
            ),
        ))
    }
}

/// Whether Secret `target_ns/name` is there and holds a certificate and key the fleet can
/// serve; else `reason` and why not.
fn tls_secret(
    inputs: &Inputs<'_>,
    target_ns: &str,
    name: &str,
    reason: &'static str,
) -> Result<(), Problem> {
    let found = (inputs.secrets.iter()).find(|s| s.namespace == target_ns && s.name == name);
    match found {
        Some(s) if s.valid_tls => Ok(()),
        Some(_) => Err((
            reason,
            format!("Secret {target_ns}/{name} holds no valid tls.crt and tls.key"),
        )),
        None => Err((reason, format!("Secret {target_ns}/{name} does not exist"))),
    }
}

impl Listener<'_> {
    pub fn conflicted(&self) -> bool {
        (self.conditions.iter()).any(|c| c.type_ == "Conflicted" && c.is_true())
    }
}

impl Listening<'_> {
    pub fn accepted(&self) -> bool {
        self.conditions.first().is_some_and(Cond::is_true)
    }

    /// The Gateway's outcome, and those of the ListenerSets that name it.
    pub fn into_outcome(self, ports: Vec<PortConfig>) -> (GatewayOutcome, Vec<ListenerSetOutcome>) {
        let accepted = self.accepted();
        let ports = if accepted { ports } else { Vec::new() };
        let key = (self.namespace.to_owned(), self.name.to_owned());
        let mut own = Vec::new();
        let mut of_sets: Vec<Vec<ListenerOutcome>> = self.sets.iter().map(|_| Vec::new()).collect();
        for l in self.listeners {
            match l.owner {
                Owner::Gateway => own.push(l.into_outcome()),
                Owner::ListenerSet(i) => of_sets[i].push(l.into_outcome()),
            }
        }
        let mut sets: Vec<ListenerSetOutcome> = (self.sets.iter())
            .zip(of_sets)
            .map(|(set, listeners)| {
                if accepted {
                    listener_set::attached_outcome(set, key.clone(), listeners)
                } else {
                    let message = format!("Gateway {}/{} is not accepted", key.0, key.1);
                    listener_set::unattached(set.set, self.gateway, "ParentNotAccepted", message)
                }
            })
            .collect();
        let attached_listener_sets = sets.iter().filter(|s| s.accepted()).count() as i32;
        sets.extend(self.refused_sets);
        let outcome = GatewayOutcome {
            namespace: self.namespace.to_owned(),
            name: self.name.to_owned(),
            generation: self.gateway.metadata.generation.unwrap_or(0),
            conditions: self.conditions,
            backend_client_certificate: self.client_certificate,
            listeners: own,
            attached_listener_sets,
            infrastructure: infrastructure(self.gateway),
            ports,
        };
        (outcome, sets)
    }
}

impl Listener<'_> {
    fn into_outcome(self) -> ListenerOutcome {
        ListenerOutcome {
            name: self.spec.name.clone(),
            port: self.spec.port,
            conditions: self.conditions,
            supported_kinds: self.supported_kinds,
            attached_routes: self.attached_routes,
            usable: self.usable,
        }
    }
}

/// `spec.infrastructure`'s labels and annotations.
fn infrastructure(gateway: &Gateway) -> Infrastructure {
    let infrastructure = gateway.spec.infrastructure.as_ref();
    Infrastructure {
        labels: (infrastructure.and_then(|i| i.labels.clone())).unwrap_or_default(),
        annotations: (infrastructure.and_then(|i| i.annotations.clone())).unwrap_or_default(),
    }
}

fn accepted(gateway: &Gateway, listeners: &[Listener<'_>]) -> Cond {
    let parameters = (gateway.spec.infrastructure.as_ref()).and_then(|i| i.parameters_ref.as_ref());
    if let Some(p) = parameters {
        return Cond::no(
            "Accepted",
            "InvalidParameters",
            format!(
                "spec.infrastructure.parametersRef {}/{} {:?}: Switchyard takes no parameters \
                 for a Gateway",
                p.group, p.kind, p.name
            ),
        );
    }
    // A Gateway's address is its Service's IP: an address asked for by type alone
    // (GatewayAddressEmpty) is that one; a given value, or a hostname, cannot be had.
    // An address's routability (the experimental channel's) is the Service's too: it cannot
    // be asked for.
    let unsupported = (gateway.spec.addresses.iter().flatten()).find(|a| {
        a.value.as_deref().is_some_and(|v| !v.is_empty())
            || a.r#type.as_deref().is_some_and(|t| t != "IPAddress")
            || a.routability.as_deref().is_some_and(|r| !r.is_empty())
    });
    if let Some(address) = unsupported {
        let named = match (address.r#type.as_deref(), address.value.as_deref()) {
            (t, Some(v)) if !v.is_empty() => format!("{} {v}", t.unwrap_or("IPAddress")),
            (t, _) => match address.routability.as_deref() {
                Some(r) if !r.is_empty() => format!("an address of routability {r}"),
                _ => format!("an address of type {}", t.unwrap_or("IPAddress")),
            },
        };
        return Cond::no(
            "Accepted",
            "UnsupportedAddress",
            format!(
                "{named} cannot be assigned: a Gateway's address is its Service's IP, which \
                 spec.addresses may ask for only as type IPAddress without a value or a \
                 routability"
            ),
        );
    }
    // Only its own listeners: a ListenerSet's say nothing of the Gateway.
    let invalid: Vec<&str> = listeners
        .iter()
        .filter(|l| l.owner == Owner::Gateway && !l.usable)
        .map(|l| l.spec.name.as_str())
        .collect();
    if invalid.is_empty() {
        Cond::yes("Accepted", "Accepted", "served by Switchyard")
    } else {
        let message = format!("listeners not valid: {}", invalid.join(", "));
        // Accepted while routes can attach anywhere (a listener whose certificates do not
        // resolve still counts its routes).
        if !listeners.iter().any(|l| l.attachable) {
            Cond::no("Accepted", "ListenersNotValid", message)
        } else {
            Cond::yes("Accepted", "ListenersNotValid", message)
        }
    }
}

/// Why a ListenerSet's listener conflicts with one of higher precedence that is not
/// itself in conflict, if it does: another protocol on its port, or the same hostname
/// there. The one of higher precedence keeps its port.
fn conflict_with_precedent(
    precedent: &[Listener<'_>],
    spec: &GatewayListeners,
) -> Option<&'static str> {
    let on_port: Vec<&GatewayListeners> = (precedent.iter())
        .filter(|l| !l.conflicted() && l.spec.port == spec.port)
        .map(|l| l.spec.as_ref())
        .collect();
    let nameless = is_nameless(&spec.protocol) && !on_port.is_empty();
    if nameless || on_port.iter().any(|l| l.protocol != spec.protocol) {
        return Some("ProtocolConflict");
    }
    let hostname = spec.hostname.as_deref().map(str::to_ascii_lowercase);
    (on_port.iter())
        .any(|l| l.hostname.as_deref().map(str::to_ascii_lowercase) == hostname)
        .then_some("HostnameConflict")
}

/// A TCP or UDP port has no name to tell two listeners' connections (or datagrams) apart.
fn is_nameless(protocol: &str) -> bool {
    protocol == "TCP" || protocol == "UDP"
}

/// Why a listener conflicts with a sibling on its port, if it does: another protocol
/// there, or the same hostname.
fn conflicts(listeners: &[GatewayListeners]) -> Vec<Option<&'static str>> {
    let mut protocols: BTreeMap<i32, Vec<&str>> = BTreeMap::new();
    for l in listeners {
        protocols
            .entry(l.port)
            .or_default()
            .push(l.protocol.as_str());
    }
    listeners
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let on_port = &protocols[&l.port];
            let nameless = is_nameless(&l.protocol) && on_port.len() > 1;
            if nameless || on_port.iter().any(|p| *p != l.protocol) {
                return Some("ProtocolConflict");
            }
            let hostname = l.hostname.as_deref().map(str::to_ascii_lowercase);
            let same = listeners.iter().enumerate().any(|(j, o)| {
                j != i
                    && o.port == l.port
                    && o.hostname.as_deref().map(str::to_ascii_lowercase) == hostname
            });
            same.then_some("HostnameConflict")
        })
        .collect()
}

/// A listener of `declarer`'s, checked. A ListenerSet's that conflicts with one of higher
/// precedence is not accepted (the reason of its conflict says why), whatever else it is.
fn listener<'a>(
    inputs: &Inputs<'a>,
    gateway: &Gateway,
    declarer: Declarer<'a>,
    spec: Cow<'a, GatewayListeners>,
    conflict: Option<&'static str>,
) -> Listener<'a> {
    let mut out = checked(inputs, gateway, declarer, spec, conflict);
    if let (Owner::ListenerSet(_), Some(reason)) = (declarer.owner, conflict) {
        let message = format!(
            "a listener of higher precedence on port {} conflicts with it",
            out.spec.port
        );
        out.conditions = vec![
            Cond::no("Accepted", reason, message.clone()),
            (out.conditions.iter())
                .find(|c| c.type_ == "ResolvedRefs")
                .cloned()
                .unwrap_or_else(|| Cond::yes("ResolvedRefs", "ResolvedRefs", "not checked")),
            Cond::yes("Conflicted", reason, message),
        ];
        out.attachable = false;
        out.usable = false;
    }
    out
}

fn checked<'a>(
    inputs: &Inputs<'a>,
    gateway: &Gateway,
    declarer: Declarer<'a>,
    spec: Cow<'a, GatewayListeners>,
    conflict: Option<&'static str>,
) -> Listener<'a> {
    let mut out = Listener {
        spec,
        owner: declarer.owner,
        namespace: declarer.namespace,
        conditions: Vec::new(),
        supported_kinds: Vec::new(),
        attachable: false,
        usable: false,
        attached_routes: 0,
        secrets: Vec::new(),
        client_validation: None,
    };
    let mode = (out.spec.tls.as_ref()).and_then(|t| t.mode.clone());
    let passthrough = mode == Some(GatewayListenersTlsMode::Passthrough);
    // Whether its connections are decrypted with its certificates, and the route kinds
    // it serves.
    let (decrypts, served_kinds) = match out.spec.protocol.as_str() {
        "HTTP" => (false, HTTP_KINDS),
        "HTTPS" => (true, HTTP_KINDS),
        "TLS" => (!passthrough, TLS_KINDS),
        "TCP" => (false, TCP_KINDS),
        "UDP" => (false, UDP_KINDS),
        other => {
            // No route kind Switchyard serves goes on this protocol: one named is invalid.
            let names_kinds = (out.spec.allowed_routes.as_ref())
                .and_then(|a| a.kinds.as_ref())
                .is_some_and(|k| !k.is_empty());
            let resolved = if names_kinds {
                Cond::no(
                    "ResolvedRefs",
                    "InvalidRouteKinds",
                    format!("no route kind it names is served on protocol {other}"),
                )
            } else {
                Cond::no("ResolvedRefs", "UnsupportedProtocol", "not checked")
            };
            out.conditions = vec![
                Cond::no(
                    "Accepted",
                    "UnsupportedProtocol",
                    format!("protocol {other} is not supported; use HTTP, HTTPS, TLS, TCP or UDP"),
                ),
                resolved,
                Cond::no("Conflicted", "NoConflicts", "no conflict"),
            ];
            return out;
        }
    };
    let spec = out.spec.clone();
    let spec = spec.as_ref();
    let (kinds, kinds_problem) = route_kinds(spec, served_kinds);
    out.supported_kinds = kinds;
    let refs_problem = if decrypts {
        let from = (declarer.kind, declarer.namespace);
        certificates(inputs, from, spec, &mut out.secrets).err()
    } else {
        None
    };
    let validation = (spec.protocol == "HTTPS")
        .then(|| client_validation::of_port(inputs, gateway, spec.port))
        .flatten();
    let no_valid_ca = validation.as_ref().is_some_and(|v| v.resolved.is_none());
    let accepted = match (spec.protocol.as_str(), passthrough) {
        ("HTTPS", true) => Some(Cond::no(
            "Accepted",
            "UnsupportedProtocol",
            "TLS passthrough is not supported on HTTPS listeners",
        )),
        _ if no_valid_ca => Some(Cond::no(
            "Accepted",
            "NoValidCACertificate",
            "none of the CA certificates for client validation resolved",
        )),
        // Run before routing, they may be what guards it (ExternalAuth): not served rather
        // than served without them.
        _ if has_filters(spec) => Some(Cond::no(
            "Accepted",
            "UnsupportedValue",
            "filters (pre-routing listener filters) are not supported: the listener is not \
             served without them",
        )),
        _ => None,
    };
    let certificates_ok = refs_problem.is_none();
    let ca_problem = validation.as_ref().and_then(|v| v.problem.clone());
    out.client_validation = validation.and_then(|v| v.resolved);
    let resolved = match refs_problem.or(ca_problem).or(kinds_problem) {
        Some((reason, message)) => Cond::no("ResolvedRefs", reason, message),
        None => Cond::yes("ResolvedRefs", "ResolvedRefs", "all references resolved"),
    };
    let conflicted = match conflict {
        Some(reason) => Cond::yes(
            "Conflicted",
            reason,
            format!("another listener on port {} conflicts with it", spec.port),
        ),
        None => Cond::no("Conflicted", "NoConflicts", "no conflict"),
    };
    let accepted =
        accepted.unwrap_or_else(|| Cond::yes("Accepted", "Accepted", "listener accepted"));
    // A kind it cannot serve does not stop the kinds it can.
    out.attachable = accepted.is_true() && !conflicted.is_true() && !out.supported_kinds.is_empty();
    out.usable = out.attachable && certificates_ok;
    out.conditions = vec![accepted, resolved, conflicted];
    out
}

pub type Problem = (&'static str, String);

/// Whether the listener asks for filters before routing (the experimental channel's).
fn has_filters(spec: &GatewayListeners) -> bool {
    (spec.filters.as_ref())
        .and_then(|f| f.requests.as_ref())
        .is_some_and(|r| !r.is_empty())
}

/// The kinds the listener admits that Switchyard supports, and what it names that
/// Switchyard does not.
fn route_kinds(spec: &GatewayListeners, served: &[&str]) -> (Vec<String>, Option<Problem>) {
    let Some(kinds) = spec.allowed_routes.as_ref().and_then(|a| a.kinds.as_ref()) else {
        return (served.iter().map(|k| (*k).to_owned()).collect(), None);
    };
    let mut supported = Vec::new();
    let mut unsupported = Vec::new();
    for k in kinds {
        let group = k.group.as_deref().unwrap_or(GROUP);
        if group == GROUP && served.contains(&k.kind.as_str()) {
            if !supported.contains(&k.kind) {
                supported.push(k.kind.clone());
            }
        } else {
            unsupported.push(format!("{group}/{}", k.kind));
        }
    }
    let problem = (!unsupported.is_empty()).then(|| {
        (
            "InvalidRouteKinds",
            format!("route kinds not supported: {}", unsupported.join(", ")),
        )
    });
    (supported, problem)
}

/// The listener's certificate Secrets, each of kind Secret, permitted (a ReferenceGrant
/// for another namespace's), present and holding a certificate and key.
fn certificates(
    inputs: &Inputs<'_>,
    (from_kind, namespace): (&str, &str),
    spec: &GatewayListeners,
    secrets: &mut Vec<(String, String)>,
) -> Result<(), Problem> {
    let refs = spec
        .tls
        .as_ref()
        .and_then(|t| t.certificate_refs.as_deref())
        .unwrap_or_default();
    if refs.is_empty() {
        return Err((
            "InvalidCertificateRef",
            match spec.protocol.as_str() {
                "TLS" => "a TLS listener in mode Terminate needs tls.certificateRefs",
                _ => "an HTTPS listener needs tls.certificateRefs",
            }
            .to_owned(),
        ));
    }
    for r in refs {
        let group = r.group.as_deref().unwrap_or("");
        let kind = r.kind.as_deref().unwrap_or("Secret");
        let target_ns = r.namespace.as_deref().unwrap_or(namespace);
        if !group.is_empty() || kind != "Secret" {
            return Err((
                "InvalidCertificateRef",
                format!("certificateRef {group}/{kind} {:?} is not a Secret", r.name),
            ));
        }
        may_use(inputs, (from_kind, namespace), "Secret", target_ns, &r.name)?;
        tls_secret(inputs, target_ns, &r.name, "InvalidCertificateRef")?;
        secrets.push((target_ns.to_owned(), r.name.clone()));
    }
    Ok(())
}

/// Whether the listener admits routes of `route_namespace` (`Same`: its owner's).
pub fn admits_namespace(
    inputs: &Inputs<'_>,
    listener: &Listener<'_>,
    route_namespace: &str,
) -> bool {
    let namespaces = (listener.spec.allowed_routes.as_ref()).and_then(|a| a.namespaces.as_ref());
    match namespaces.and_then(|n| n.from.as_ref()) {
        None | Some(From::Same) => route_namespace == listener.namespace,
        Some(From::All) => true,
        Some(From::Selector) => namespaces
            .and_then(|n| n.selector.as_ref())
            .is_some_and(|selector| selects!(selector, &namespace_labels(inputs, route_namespace))),
    }
}

/// The labels of namespace `name`, none when it is not known.
pub fn namespace_labels(inputs: &Inputs<'_>, name: &str) -> BTreeMap<String, String> {
    (inputs.namespaces.iter())
        .find(|n| n.metadata.name.as_deref() == Some(name))
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_default()
}

/// A label selector (its matchLabels, and its matchExpressions as key, operator and
/// values), as Kubernetes evaluates it.
pub fn selects(
    match_labels: Option<&BTreeMap<String, String>>,
    expressions: &[(&str, &str, &[String])],
    labels: &BTreeMap<String, String>,
) -> bool {
    let by_label =
        (match_labels.iter().flat_map(|m| m.iter())).all(|(k, v)| labels.get(k) == Some(v));
    let by_expression = expressions.iter().all(|&(key, operator, values)| {
        let value = labels.get(key);
        match operator {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_label && by_expression
}
