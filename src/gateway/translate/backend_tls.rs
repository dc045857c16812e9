//! BackendTLSPolicies: TLS from the fleet to a Service's endpoints. A policy targets a
//! Service, or one port of it by name (`sectionName`); for a backendRef the policy of its
//! port wins over one of the whole Service. Of several policies with the same target the
//! oldest wins (then the first by name); the others are `Accepted: False`, Conflicted.
//!
//! The policy's CA certificates are ConfigMaps of its namespace (`ca.crt`); its hostname is
//! the server name sent, and the name the backend's certificate must be for unless
//! `subjectAltNames` lists the names it must hold one of. A backendRef whose policy cannot
//! be used (no CA certificate resolved) is not sent plain text: its share is answered 500.

use std::collections::BTreeSet;

use switchyard_core::route::{SubjectAltName, UpstreamTls};

use super::client_validation::{KnownCaBundle, ca_bundle};
use super::{Cond, Inputs, seniority};
use crate::gateway::api::backendtlspolicies::{
    BackendTlsPolicy, BackendTlsPolicyValidationSubjectAltNamesType as SanType,
};

/// The status of one policy of Switchyard's Gateways: its conditions, for every Gateway
/// that sends to a Service it targets (its ancestors).
#[derive(serde::Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyOutcome {
    pub namespace: String,
    pub name: String,
    pub generation: i64,
    /// (namespace, name) of each Gateway, sorted.
    pub ancestors: Vec<(String, String)>,
    /// Accepted, ResolvedRefs.
    pub conditions: Vec<Cond>,
}

/// What a backendRef's port gets from the policies.
#[derive(Clone, Debug, PartialEq)]
pub enum BackendTls {
    /// No policy targets it: plain text.
    None,
    Tls(UpstreamTls),
    /// Its policy cannot be used (its status says why).
    Unusable,
}

/// The TLS for port `port_name` of Service `namespace/service`: its port's policy, else
/// the whole Service's.
pub fn for_backend(
    inputs: &Inputs<'_>,
    namespace: &str,
    service: &str,
    port_name: &str,
) -> BackendTls {
    let policy = (!port_name.is_empty())
        .then(|| winner(inputs, namespace, service, Some(port_name)))
        .flatten()
        .or_else(|| winner(inputs, namespace, service, None));
    match policy.map(|p| resolve(inputs.ca_bundles, namespace, p)) {
        None => BackendTls::None,
        Some(Ok(tls)) => BackendTls::Tls(tls),
        Some(Err(_)) => BackendTls::Unusable,
    }
}

/// The policy of `namespace` that wins target `service` with exactly `section` (None: the
/// whole Service): the oldest, then the first by name.
fn winner<'a>(
    inputs: &Inputs<'a>,
    namespace: &str,
    service: &str,
    section: Option<&str>,
) -> Option<&'a BackendTlsPolicy> {
    (inputs.backend_tls_policies.iter())
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
        .filter(|p| {
            p.spec.target_refs.iter().any(|t| {
                t.group.is_empty()
                    && t.kind == "Service"
                    && t.name == service
                    && t.section_name.as_deref() == section
            })
        })
        .min_by_key(|p| seniority(&p.metadata))
}

/// Why a policy cannot be used: the reason of its Accepted condition, that of its
/// ResolvedRefs when a reference is at fault, and the message.
type Refusal = (&'static str, Option<&'static str>, String);

/// The policy's TLS: its CA certificates resolved, its names checked.
fn resolve(
    ca_bundles: &[KnownCaBundle],
    namespace: &str,
    policy: &BackendTlsPolicy,
) -> Result<UpstreamTls, Refusal> {
    let validation = &policy.spec.validation;
    if validation.well_known_ca_certificates.is_some() {
        return Err((
            "Invalid",
            None,
            "wellKnownCACertificates is not supported: name the CA certificates in \
             caCertificateRefs"
                .to_owned(),
        ));
    }
    let mut pems = Vec::new();
    let mut problems = Vec::new();
    for r in validation.ca_certificate_refs.iter().flatten() {
        if !r.group.is_empty() || r.kind != "ConfigMap" {
            problems.push((
                "InvalidKind",
                format!(
                    "caCertificateRef {} {:?}: only a ConfigMap is supported",
                    r.kind, r.name
                ),
            ));
            continue;
        }
        match ca_bundle(ca_bundles, namespace, &r.name) {
            Ok(pem) => pems.push(pem),
            Err(why) => problems.push(("InvalidCACertificateRef", why)),
        }
    }
    if pems.is_empty() {
        let (reason, _) = problems
            .first()
            .cloned()
            .unwrap_or(("InvalidCACertificateRef", "no caCertificateRefs".to_owned()));
        let why: Vec<String> = problems.into_iter().map(|(_, m)| m).collect();
        let message = if why.is_empty() {
            "no caCertificateRefs".to_owned()
        } else {
            why.join("; ")
        };
        return Err(("NoValidCACertificate", Some(reason), message));
    }
    let subject_alt_names = (validation.subject_alt_names.iter().flatten())
        .filter_map(|n| match n.r#type {
            SanType::Hostname => n.hostname.clone().map(SubjectAltName::Hostname),
            SanType::Uri => n.uri.clone().map(SubjectAltName::Uri),
        })
        .collect();
    Ok(UpstreamTls {
        hostname: validation.hostname.clone(),
        ca_certificates: pems.join("\n"),
        subject_alt_names,
        // A Gateway's own, set on its units (`spec.tls.backend`).
        client_certificate: None,
    })
}

/// (namespace, name) of Gateways.
pub type Gateways = BTreeSet<(String, String)>;

/// The status of every policy that targets a Service the Gateways in `ancestors` send to:
/// `ancestors(namespace, service)` gives them.
pub fn outcomes(
    inputs: &Inputs<'_>,
    ancestors: &dyn Fn(&str, &str) -> Gateways,
) -> Vec<PolicyOutcome> {
    let mut out = Vec::new();
    for policy in inputs.backend_tls_policies {
        let namespace = policy.metadata.namespace.as_deref().unwrap_or_default();
        let name = policy.metadata.name.clone().unwrap_or_default();
        let gateways: Gateways = (policy.spec.target_refs.iter())
            .filter(|t| t.group.is_empty() && t.kind == "Service")
            .flat_map(|t| ancestors(namespace, &t.name))
            .collect();
        if gateways.is_empty() {
            continue;
        }
        out.push(PolicyOutcome {
            namespace: namespace.to_owned(),
            name,
            generation: policy.metadata.generation.unwrap_or(0),
            ancestors: gateways.into_iter().collect(),
            conditions: conditions(inputs, namespace, policy),
        });
    }
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// Accepted and ResolvedRefs of one policy.
fn conditions(inputs: &Inputs<'_>, namespace: &str, policy: &BackendTlsPolicy) -> Vec<Cond> {
    let resolved = resolve(inputs.ca_bundles, namespace, policy);
    let resolved_refs = match &resolved {
        Err((_, Some(reason), message)) => Cond::no("ResolvedRefs", reason, message.clone()),
        _ => Cond::yes("ResolvedRefs", "ResolvedRefs", "all references resolved"),
    };
    // A target another policy had first.
    let beaten = policy.spec.target_refs.iter().find_map(|t| {
        let section = t.section_name.as_deref();
        let winner = winner(inputs, namespace, &t.name, section)?;
        (winner.metadata.name != policy.metadata.name).then(|| {
            let target = match section {
                Some(s) => format!("port {s} of Service {}", t.name),
                None => format!("Service {}", t.name),
            };
            format!(
                "{target} has the older BackendTLSPolicy {}",
                winner.metadata.name.as_deref().unwrap_or_default()
            )
        })
    });
    let accepted = match (beaten, &resolved) {
        (Some(message), _) => Cond::no("Accepted", "Conflicted", message),
        (None, Err((reason, _, message))) => Cond::no("Accepted", reason, message.clone()),
        (None, Ok(_)) => Cond::yes("Accepted", "Accepted", "policy accepted"),
    };
    vec![accepted, resolved_refs]
}
