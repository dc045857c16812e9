//! Certificates for mutual TLS between Envoy and the xDS server (`switchyard certgen`).
//!
//! One run makes a private CA and two certificates it signs: a server certificate for
//! Switchyard's ADS port (serverAuth, the given DNS names and IP addresses) and a client
//! certificate for Envoy (clientAuth). Keys are ECDSA P-256, made with ring. They are
//! written as PEM files (private keys readable by the owner only) or as two
//! `kubernetes.io/tls` Secrets with `tls.crt`, `tls.key` and `ca.crt`, the shape
//! cert-manager gives its Secrets, so that either source fits the chart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// The xDS Service the chart creates for a release named `switchyard`.
pub const DEFAULT_XDS_SERVICE: &str = "switchyard-xds";
/// The namespace the README installs the chart into.
pub const DEFAULT_NAMESPACE: &str = "switchyard-system";
/// File names in `--out`.
pub const FILES: [&str; 6] = [
    "ca.crt",
    "ca.key",
    "server.crt",
    "server.key",
    "client.crt",
    "client.key",
];

/// A certificate and its private key, PEM-encoded. `Debug` never shows the key.
pub struct Issued {
    pub cert_pem: String,
    pub cert_der: Vec<u8>,
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// The CA and the two certificates it signed.
#[derive(Debug)]
pub struct Bundle {
    pub ca: Issued,
    pub server: Issued,
    pub client: Issued,
}

/// The server names used when none are given: loopback (standalone mode, tests) and every
/// name under which Envoy can reach the chart's xDS Service `service` in `namespace`
/// (the bootstrap uses the last, fully qualified one).
pub fn default_server_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// Makes a CA and a server and a client certificate valid for `days` days (from an hour
/// ago, for clock skew). `server_names` are DNS names or IP addresses.
pub fn generate(server_names: &[String], days: u32) -> anyhow::Result<Bundle> {
    anyhow::ensure!(days > 0, "--days must be at least 1");
    anyhow::ensure!(
        !server_names.is_empty(),
        "the server certificate needs at least one name"
    );
    let now = time::OffsetDateTime::now_utc();
    let not_before = now - time::Duration::hours(1);
    let not_after = now + time::Duration::days(i64::from(days));

    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = name("Switchyard xDS CA");
    // Signs end-entity certificates only.
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .context("signing the CA certificate")?;
    let ca = Issued {
        cert_pem: ca_cert.pem(),
        cert_der: ca_cert.der().to_vec(),
        key_pem: ca_key.serialize_pem(),
    };
    let issuer = Issuer::new(ca_params, ca_key);

    let mut server_params = CertificateParams::new(server_names.to_vec())
        .context("server names (DNS names or IP addresses)")?;
    server_params.distinguished_name = name("switchyard-xds");
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server = leaf(server_params, not_before, not_after, &issuer).context("server")?;

    let mut client_params = CertificateParams::new(vec!["switchyard-envoy".to_string()])?;
    client_params.distinguished_name = name("switchyard-envoy");
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client = leaf(client_params, not_before, not_after, &issuer).context("client")?;

    Ok(Bundle { ca, server, client })
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "Switchyard");
    name.push(DnType::CommonName, common_name);
    name
}

fn leaf(
    mut params: CertificateParams,
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
    issuer: &Issuer<'_, KeyPair>,
) -> anyhow::Result<Issued> {
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before;
    params.not_after = not_after;
    let key = KeyPair::generate().context("generating a key")?;
    let cert = params
        .signed_by(&key, issuer)
        .context("signing a certificate")?;
    Ok(Issued {
        cert_pem: cert.pem(),
        cert_der: cert.der().to_vec(),
        key_pem: key.serialize_pem(),
    })
}

impl Bundle {
    /// Writes [`FILES`] into `dir` (created if missing). Refuses to replace existing files
    /// unless `force`: a new CA invalidates every certificate the old one signed.
    pub fn write(&self, dir: &Path, force: bool) -> anyhow::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let contents = [
            (&self.ca.cert_pem, false),
            (&self.ca.key_pem, true),
            (&self.server.cert_pem, false),
            (&self.server.key_pem, true),
            (&self.client.cert_pem, false),
            (&self.client.key_pem, true),
        ];
        let paths: Vec<PathBuf> = FILES.iter().map(|f| dir.join(f)).collect();
        if !force && let Some(existing) = paths.iter().find(|p| p.exists()) {
            anyhow::bail!(
                "{} exists: pass --force to replace the CA and every certificate",
                existing.display()
            );
        }
        for (path, (text, secret)) in paths.iter().zip(contents) {
            write_file(path, text, secret)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(paths)
    }

    /// Two `kubernetes.io/tls` Secrets in `namespace` as one YAML stream: `server_secret`
    /// (for the operator) and `client_secret` (for Envoy), each with `tls.crt`, `tls.key`
    /// and `ca.crt`. The CA key is in neither.
    pub fn kubernetes_secrets(
        &self,
        namespace: &str,
        server_secret: &str,
        client_secret: &str,
    ) -> anyhow::Result<String> {
        let mut yaml = String::new();
        for (name, issued) in [(server_secret, &self.server), (client_secret, &self.client)] {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(namespace.to_string()),
                    labels: Some(BTreeMap::from([(
                        "app.kubernetes.io/part-of".to_string(),
                        "switchyard".to_string(),
                    )])),
                    ..ObjectMeta::default()
                },
                type_: Some("kubernetes.io/tls".to_string()),
                data: Some(BTreeMap::from([
                    (
                        "tls.crt".to_string(),
                        ByteString(issued.cert_pem.clone().into_bytes()),
                    ),
                    (
                        "tls.key".to_string(),
                        ByteString(issued.key_pem.clone().into_bytes()),
                    ),
                    (
                        "ca.crt".to_string(),
                        ByteString(self.ca.cert_pem.clone().into_bytes()),
                    ),
                ])),
                ..Secret::default()
            };
            yaml.push_str("---\n");
            yaml.push_str(&serde_saphyr::to_string(&secret)?);
        }
        Ok(yaml)
    }
}

fn write_file(path: &Path, text: &str, secret: bool) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    let mut file = options.open(path)?;
    #[cfg(unix)]
    if secret {
        // An existing file (--force) keeps its mode on open: tighten it.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    #[cfg(not(unix))]
    let _ = secret;
    file.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

    const ALGS: &[&dyn rustls_pki_types::SignatureVerificationAlgorithm] =
        &[webpki::ring::ECDSA_P256_SHA256];

    fn verify(
        ca: &CertificateDer<'_>,
        cert: &CertificateDer<'_>,
        usage: webpki::KeyUsage,
    ) -> Result<(), webpki::Error> {
        let anchor = webpki::anchor_from_trusted_cert(ca)?;
        let cert = webpki::EndEntityCert::try_from(cert)?;
        cert.verify_for_usage(ALGS, &[anchor], &[], UnixTime::now(), usage, None, None)
            .map(|_| ())
    }

    #[test]
    fn certificates_verify_against_their_ca_with_the_right_names_and_usages() {
        let names = default_server_names("sy-switchyard-xds", "edge");
        let bundle = generate(&names, 30).expect("certgen");
        let dir = tempfile::tempdir().expect("a temporary folder");
        bundle.write(dir.path(), false).expect("write");

        let pem = |file: &str| {
            CertificateDer::from_pem_file(dir.path().join(file))
                .unwrap_or_else(|e| panic!("{file}: {e:?}"))
        };
        let (ca, server, client) = (pem("ca.crt"), pem("server.crt"), pem("client.crt"));
        assert_eq!(server.as_ref(), bundle.server.cert_der.as_slice());

        verify(&ca, &server, webpki::KeyUsage::server_auth()).expect("server cert verifies");
        verify(&ca, &client, webpki::KeyUsage::client_auth()).expect("client cert verifies");
        // Each is good for its own side only.
        assert!(verify(&ca, &server, webpki::KeyUsage::client_auth()).is_err());
        assert!(verify(&ca, &client, webpki::KeyUsage::server_auth()).is_err());

        // Every name is in the server certificate's SANs, and nothing else matches.
        let end_entity = webpki::EndEntityCert::try_from(&server).expect("parse");
        for name in &names {
            let subject = ServerName::try_from(name.as_str()).expect("a server name");
            end_entity
                .verify_is_valid_for_subject_name(&subject)
                .unwrap_or_else(|e| panic!("{name} not in the SANs: {e:?}"));
        }
        assert!(
            end_entity
                .verify_is_valid_for_subject_name(
                    &ServerName::try_from("sy-switchyard-xds.other.svc.cluster.local")
                        .expect("a name")
                )
                .is_err()
        );
        assert!(names.contains(&"sy-switchyard-xds.edge.svc.cluster.local".to_string()));

        // Another run is another CA: its certificates do not verify against this one.
        let other = generate(&names, 30).expect("certgen");
        let foreign = CertificateDer::from(other.client.cert_der.clone());
        assert!(verify(&ca, &foreign, webpki::KeyUsage::client_auth()).is_err());
    }

    #[test]
    fn keys_are_private_and_files_are_not_replaced_by_accident() {
        let bundle = generate(&["localhost".to_string()], 1).expect("certgen");
        let dir = tempfile::tempdir().expect("a temporary folder");
        bundle.write(dir.path(), false).expect("write");
        #[cfg(unix)]
        for file in FILES {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(file))
                .expect("metadata")
                .permissions()
                .mode()
                & 0o777;
            let expected = if file.ends_with(".key") { 0o600 } else { 0o644 };
            assert_eq!(mode, expected, "{file}");
        }
        let error = bundle.write(dir.path(), false).expect_err("refused");
        assert!(error.to_string().contains("--force"), "{error}");
        bundle
            .write(dir.path(), true)
            .expect("replaced with --force");
        assert!(!format!("{bundle:?}").contains("PRIVATE KEY"));
    }

    #[test]
    fn kubernetes_secrets_have_the_cert_manager_shape() {
        let bundle = generate(&["localhost".to_string()], 1).expect("certgen");
        let yaml = bundle
            .kubernetes_secrets("edge", "server-tls", "client-tls")
            .expect("secrets");
        let secrets: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml).expect("YAML");
        let secrets: Vec<_> = secrets.into_iter().filter(|s| !s.is_null()).collect();
        assert_eq!(secrets.len(), 2, "{yaml}");
        for (secret, name, issued) in [
            (&secrets[0], "server-tls", &bundle.server),
            (&secrets[1], "client-tls", &bundle.client),
        ] {
            assert_eq!(secret["apiVersion"], "v1");
            assert_eq!(secret["kind"], "Secret");
            assert_eq!(secret["type"], "kubernetes.io/tls");
            assert_eq!(secret["metadata"]["name"], name);
            assert_eq!(secret["metadata"]["namespace"], "edge");
            let data: BTreeMap<String, ByteString> =
                serde_json::from_value(secret["data"].clone()).expect("base64 data");
            assert_eq!(
                data.keys().map(String::as_str).collect::<Vec<_>>(),
                ["ca.crt", "tls.crt", "tls.key"]
            );
            assert_eq!(data["tls.crt"].0, issued.cert_pem.as_bytes());
            assert_eq!(data["tls.key"].0, issued.key_pem.as_bytes());
            assert_eq!(data["ca.crt"].0, bundle.ca.cert_pem.as_bytes());
        }
        assert!(!yaml.contains(&bundle.ca.key_pem), "the CA key stays out");
    }
}
