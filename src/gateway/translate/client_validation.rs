//! Client certificate validation on a Gateway's HTTPS ports (`spec.tls.frontend`): the
//! configuration that applies to a port (its `perPort` entry, else the default) and its
//! CA certificate references resolved to the PEM of ConfigMaps' `ca.crt`.

use switchyard_core::route::ClientValidation;

use super::Inputs;
use super::gateway::{Problem, gateway_may_use};
use crate::gateway::api::gateways::{
    Gateway, GatewayTlsFrontendDefaultValidationMode as DefaultMode,
    GatewayTlsFrontendPerPortTlsValidationMode as PortMode,
};

/// The key of a ConfigMap that holds the CA certificates, as the Gateway API names it.
pub const CA_KEY: &str = "ca.crt";

/// A ConfigMap a Gateway may name as a CA certificate reference.
#[derive(Clone, Debug, PartialEq)]
pub struct KnownCaBundle {
    pub namespace: String,
    pub name: String,
    /// Its `ca.crt`, as it is: checked only when a reference names it ([`ca_bundle`]), as
    /// every namespace has a ConfigMap with one (`kube-root-ca.crt`).
    pub ca_crt: Option<String>,
}

/// What a port's client validation resolved to.
#[derive(Clone, Debug, PartialEq)]
pub struct PortValidation {
    /// The authorities that resolved, with the mode; None when none did (the port's
    /// listeners are then not accepted: NoValidCACertificate).
    pub resolved: Option<ClientValidation>,
    /// The references that did not resolve: the reason ResolvedRefs gives (the first
    /// one's), and why each did not.
    pub problem: Option<Problem>,
}

/// One CA certificate reference (the generated types of the default and of a port differ).
struct CaRef<'a> {
    group: &'a str,
    kind: &'a str,
    name: &'a str,
    namespace: Option<&'a str>,
}

/// The client validation of `gateway`'s HTTPS `port`, when it asks for one.
pub fn of_port(inputs: &Inputs<'_>, gateway: &Gateway, port: i32) -> Option<PortValidation> {
    let frontend = gateway.spec.tls.as_ref()?.frontend.as_ref()?;
    // The CA references of a validation (the generated types of the default and of a
    // port differ, with the same fields), and whether it falls back.
    macro_rules! validation {
        ($v:expr, $fallback:expr) => {{
            let v = $v.as_ref()?;
            let refs = (v.ca_certificate_refs.iter())
                .map(|r| CaRef {
                    group: &r.group,
                    kind: &r.kind,
                    name: &r.name,
                    namespace: r.namespace.as_deref(),
                })
                .collect::<Vec<_>>();
            (refs, v.mode == Some($fallback))
        }};
    }
    // A port's own entry replaces the default whole, even without a validation.
    let (refs, insecure_fallback) =
        match frontend.per_port.iter().flatten().find(|p| p.port == port) {
            Some(entry) => validation!(entry.tls.validation, PortMode::AllowInsecureFallback),
            None => validation!(
                frontend.default.validation,
                DefaultMode::AllowInsecureFallback
            ),
        };
    let namespace = gateway.metadata.namespace.as_deref().unwrap_or_default();
    let mut pems = Vec::new();
    let mut problems: Vec<Problem> = Vec::new();
    for r in &refs {
        match resolve(inputs, namespace, r) {
            Ok(pem) => pems.push(pem),
            Err(p) => problems.push(p),
        }
    }
    let problem = problems.first().map(|(reason, _)| {
        let why: Vec<&str> = problems.iter().map(|(_, m)| m.as_str()).collect();
        (*reason, why.join("; "))
    });
    let resolved = (!pems.is_empty()).then(|| ClientValidation {
        ca_certificates: pems.join("\n"),
        insecure_fallback,
    });
    Some(PortValidation { resolved, problem })
}

/// The PEM certificates of one reference: a ConfigMap (of the Gateway's namespace, or of
/// another that a ReferenceGrant opens to Gateways) with PEM certificates under `ca.crt`.
fn resolve(inputs: &Inputs<'_>, namespace: &str, r: &CaRef<'_>) -> Result<String, Problem> {
    if !r.group.is_empty() || r.kind != "ConfigMap" {
        let kind = match r.group {
            "" => r.kind.to_owned(),
            group => format!("{group}/{}", r.kind),
        };
        return Err((
            "InvalidCACertificateKind",
            format!(
                "caCertificateRef {kind} {:?}: only a ConfigMap is supported",
                r.name
            ),
        ));
    }
    let target_ns = r.namespace.unwrap_or(namespace);
    gateway_may_use(inputs, namespace, "ConfigMap", target_ns, r.name)?;
    ca_bundle(inputs.ca_bundles, target_ns, r.name).map_err(|why| ("InvalidCACertificateRef", why))
}

/// The CA certificates of ConfigMap `namespace/name`, or why it has none to give.
pub fn ca_bundle(bundles: &[KnownCaBundle], namespace: &str, name: &str) -> Result<String, String> {
    let found = (bundles.iter()).find(|c| c.namespace == namespace && c.name == name);
    let Some(bundle) = found else {
        return Err(format!("ConfigMap {namespace}/{name} does not exist"));
    };
    ca_certificates(bundle.ca_crt.as_deref())
        .map_err(|why| format!("ConfigMap {namespace}/{name}: {why}"))
}

/// A ConfigMap's `ca.crt` (None: the key is missing) as CA certificates: PEM with at
/// least one certificate, every block well formed and nothing else in it, so that Envoy
/// does not reject the listener for it.
pub fn ca_certificates(ca_crt: Option<&str>) -> Result<String, String> {
    use rustls_pki_types::pem::{PemObject, SectionKind};

    let text = ca_crt.ok_or_else(|| format!("no {CA_KEY}"))?;
    let mut certificates = 0;
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(text.as_bytes()) {
        match section.map_err(|e| format!("{CA_KEY}: {e}"))? {
            (SectionKind::Certificate, _) => certificates += 1,
            (kind, _) => return Err(format!("{CA_KEY} holds a {kind:?}, not only certificates")),
        }
    }
    if certificates == 0 {
        return Err(format!("{CA_KEY} holds no PEM certificate"));
    }
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &str = include_str!("../../../e2e/testdata/tls.crt");
    const KEY: &str = include_str!("../../../e2e/testdata/tls.key");

    #[test]
    fn a_ca_bundle_is_pem_certificates_only() {
        assert_eq!(ca_certificates(Some(CERT)), Ok(CERT.to_owned()));
        let two = format!("{CERT}{CERT}");
        assert_eq!(ca_certificates(Some(&two)), Ok(two.clone()));
        assert_eq!(ca_certificates(None), Err("no ca.crt".to_owned()));
        assert_eq!(
            ca_certificates(Some("not a certificate")),
            Err("ca.crt holds no PEM certificate".to_owned())
        );
        // A key next to the certificate is refused: it has no business in a trust bundle.
        let with_key = format!("{CERT}{KEY}");
        let refused = ca_certificates(Some(&with_key)).unwrap_err();
        assert!(refused.contains("not only certificates"), "{refused}");
        let broken = CERT.replace("MII", "!!!");
        assert!(ca_certificates(Some(&broken)).is_err());
    }
}
