//! SDS secrets: the certificate and key of each TLS virtual host, inline.

use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    Secret, TlsCertificate, secret::Type,
};

use super::proto;
use crate::model;

/// Why Envoy could not use this secret, if it could not. The PEM itself is not parsed:
/// Envoy would reject a malformed one when it builds the TLS context.
pub fn validate(s: &model::TlsSecret) -> Result<(), String> {
    if s.certificate_chain.trim().is_empty() {
        Err("certificate chain is empty".to_owned())
    } else if s.private_key.trim().is_empty() {
        Err("private key is empty".to_owned())
    } else {
        Ok(())
    }
}

pub fn secret(s: &model::TlsSecret) -> Secret {
    Secret {
        name: s.name.clone(),
        r#type: Some(Type::TlsCertificate(TlsCertificate {
            certificate_chain: Some(proto::inline(&s.certificate_chain)),
            private_key: Some(proto::inline(&s.private_key)),
            ..Default::default()
        })),
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;

    use super::*;

    fn tls_secret() -> model::TlsSecret {
        model::TlsSecret {
            name: "ns/cert".into(),
            certificate_chain: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
                .into(),
            private_key: "-----BEGIN PRIVATE KEY-----\nTOPSECRET\n-----END PRIVATE KEY-----\n"
                .into(),
        }
    }

    #[test]
    fn inline_certificate_and_key() {
        let s = secret(&tls_secret());
        assert_eq!(s.name, "ns/cert");
        let Some(Type::TlsCertificate(cert)) = s.r#type else {
            panic!()
        };
        assert!(matches!(
            cert.private_key.unwrap().specifier,
            Some(Specifier::InlineString(k)) if k.contains("TOPSECRET")
        ));
    }

    #[test]
    fn private_key_is_not_in_debug_output() {
        let s = tls_secret();
        let debug = format!("{s:?} {s:#?}");
        assert!(!debug.contains("TOPSECRET"), "{debug}");
        assert!(debug.contains("MIIB"), "{debug}");
    }

    #[test]
    fn empty_material_is_invalid() {
        let mut s = tls_secret();
        assert!(validate(&s).is_ok());
        s.private_key = " \n".into();
        assert_eq!(validate(&s).unwrap_err(), "private key is empty");
        s.certificate_chain.clear();
        assert_eq!(validate(&s).unwrap_err(), "certificate chain is empty");
    }
}
