//! The TLS Secrets that live ProxyConfigs serve, from the watch store, each as it last was
//! good: a Secret deleted or broken does not take its routes' HTTPS down, and the routes
//! that use it say so (their status names the Secret).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::index::Index;
use super::to_model::TlsData;
use crate::api::{ProxyConfig, ProxyConfigRole};
use crate::translate::{Cause, Problem};

/// How the problems about a route's TLS Secret begin ("TLS Secret namespace/name: why; ...").
const SECRET_PROBLEM: &str = "TLS Secret ";
/// Why, when the Secret is not in the watch store.
const SECRET_NOT_FOUND: &str = "not found (or not of type kubernetes.io/tls)";
/// How such a problem ends when the route keeps serving.
const SECRET_KEPT: &str = "its last good certificate keeps serving";
/// How it ends when the route is left out.
const SECRET_LEFT_OUT: &str = "the route is left out until it has a good one";

/// What the snapshot builder says of the TLS Secret that route `id` ("namespace/name")
/// serves, for its status.
#[derive(Clone, Debug, PartialEq)]
pub struct SecretTrouble {
    /// Names the Secret and says why and what serves.
    pub message: String,
    /// The Secret is not there (else: its content cannot serve).
    pub missing: bool,
    /// Its last good certificate keeps serving (else: the route is left out).
    pub kept: bool,
}

/// The troubles with route `id`'s TLS Secret among the builder's `problems`.
pub fn secret_troubles(problems: &[Problem], id: &str) -> Vec<SecretTrouble> {
    problems
        .iter()
        .filter(|p| p.subject().virtual_host() == Some(id))
        .filter_map(|p| match p.cause() {
            Cause::TlsSecret { missing, kept } => Some(SecretTrouble {
                message: p.message().to_owned(),
                missing,
                kept,
            }),
            _ => None,
        })
        .collect()
}

/// (namespace, name) of a Secret.
type SecretKey = (String, String);

/// The TLS Secrets that live ProxyConfigs serve, read from the watch store, each as it
/// last was good. A Secret that is deleted, or whose content is not a PEM certificate and
/// key, does not take the route's HTTPS down: the content it had keeps serving, for as
/// long as a live ProxyConfig still serves that Secret, and a problem naming the Secret
/// says so on the routes that use it. A Secret that was never good here gives nothing: the
/// translator leaves its virtual host out (it never served).
#[derive(Default)]
pub struct TlsSecrets {
    /// What the model gets.
    pub served: BTreeMap<SecretKey, TlsData>,
    /// Why a served Secret's current content is not what serves, per route that uses it.
    pub problems: Vec<Problem>,
}

impl TlsSecrets {
    /// Reads again every Secret a live ProxyConfig serves.
    pub fn refresh(&mut self, index: &Index) {
        let users = index.proxy_configs.state().into_iter().flat_map(|pc| {
            let namespace = pc.namespace().unwrap_or_default();
            let route = format!("{namespace}/{}", pc.spec.route);
            (tls_secrets_of(&pc).into_iter()).map(move |key| (key, route.clone()))
        });
        self.update(users, |key| index.tls_secrets.get(key));
    }

    /// Takes each Secret served by the routes ("namespace/route", the name of their
    /// virtual host) in `users`, as `secret` has it now or as it last was good. Secrets no
    /// route serves any more are let go, their last good content with them.
    fn update(
        &mut self,
        users: impl IntoIterator<Item = (SecretKey, String)>,
        secret: impl Fn(&SecretKey) -> Option<Arc<Secret>>,
    ) {
        let mut routes_of: BTreeMap<SecretKey, Vec<String>> = BTreeMap::new();
        for (key, route) in users {
            routes_of.entry(key).or_default().push(route);
        }
        let mut served = BTreeMap::new();
        let mut problems = Vec::new();
        for (key, mut routes) in routes_of {
            // In key order, whatever order the store hands the ProxyConfigs out in.
            routes.sort();
            routes.dedup();
            let found = secret(&key);
            let missing = found.is_none();
            let current = match found {
                Some(secret) => tls_data(&secret),
                // The watch sees kubernetes.io/tls Secrets only.
                None => Err(SECRET_NOT_FOUND.to_string()),
            };
            let why = match current {
                Ok(data) => {
                    served.insert(key, data);
                    continue;
                }
                Err(why) => why,
            };
            let (namespace, name) = &key;
            let last_good = self.served.remove(&key);
            let kept = last_good.is_some();
            let message = match last_good {
                Some(last_good) => {
                    served.insert(key.clone(), last_good);
                    format!("{SECRET_PROBLEM}{namespace}/{name}: {why}; {SECRET_KEPT}")
                }
                None => format!("{SECRET_PROBLEM}{namespace}/{name}: {why}; {SECRET_LEFT_OUT}"),
            };
            for route in routes {
                problems.push(Problem::tls_secret(&route, &message, missing, kept));
            }
        }
        self.served = served;
        self.problems = problems;
    }
}

/// (namespace, name) of the TLS Secrets a ProxyConfig needs: the one its live virtual
/// host serves, the default certificate of its live Gateway listener, and those its
/// clusters present to their backends (a probe's too: its clusters must warm on every
/// Envoy before a switch).
pub fn tls_secrets_of(pc: &ProxyConfig) -> Vec<(String, String)> {
    let own = pc.namespace().unwrap_or_default();
    let mut keys = Vec::new();
    if pc.spec.role == ProxyConfigRole::Live {
        if let Some(tls) = pc.spec.virtual_host.as_ref().and_then(|v| v.tls.as_ref()) {
            let namespace = tls.namespace.clone().unwrap_or_else(|| own.clone());
            keys.push((namespace, tls.secret_name.clone()));
        }
        let default = (pc.spec.listener.as_ref()).and_then(|l| l.default_certificate.as_ref());
        keys.extend(default.map(|s| (s.namespace.clone(), s.name.clone())));
    }
    let presented = (pc.spec.clusters.iter())
        .filter_map(|c| c.tls.as_ref()?.client_certificate.as_ref())
        .map(|s| (s.namespace.clone(), s.name.clone()));
    keys.extend(presented);
    keys.sort();
    keys.dedup();
    keys
}

/// A TLS Secret's certificate chain and key, or why they cannot serve. Only the PEM form is
/// checked (at least one certificate, one private key of a form Envoy reads, each block
/// well formed): enough to keep what Envoy would reject at once out of the snapshot. A key
/// that does not match its certificate is still Envoy's to reject (it keeps its last good
/// one).
pub fn tls_data(secret: &Secret) -> Result<TlsData, String> {
    let data = secret.data.as_ref();
    let bytes = |key: &str| {
        data.and_then(|d| d.get(key))
            .map(|b| b.0.as_slice())
            .ok_or_else(|| format!("no {key}"))
    };
    let text = |key: &str| {
        String::from_utf8(bytes(key)?.to_vec()).map_err(|_| format!("{key} is not PEM text"))
    };
    let certificate_chain = text("tls.crt")?;
    let private_key = text("tls.key")?;
    let certificates = CertificateDer::pem_slice_iter(certificate_chain.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("tls.crt: {e}"))?;
    if certificates.is_empty() {
        return Err("tls.crt holds no PEM certificate".into());
    }
    match PrivateKeyDer::from_pem_slice(private_key.as_bytes()) {
        Ok(_) => {}
        Err(pem::Error::NoItemsFound) => return Err("tls.key holds no PEM private key".into()),
        Err(e) => return Err(format!("tls.key: {e}")),
    }
    Ok(TlsData {
        certificate_chain,
        private_key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;

    const CERT: &str = include_str!("../../e2e/testdata/tls.crt");
    const KEY: &str = include_str!("../../e2e/testdata/tls.key");

    fn key(name: &str) -> SecretKey {
        ("shop".to_string(), name.to_string())
    }

    fn secret(cert: &str, key: &str) -> Arc<Secret> {
        Arc::new(Secret {
            metadata: ObjectMeta {
                name: Some("cert".into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(
                [
                    ("tls.crt".to_string(), ByteString(cert.as_bytes().to_vec())),
                    ("tls.key".to_string(), ByteString(key.as_bytes().to_vec())),
                ]
                .into(),
            ),
            ..Default::default()
        })
    }

    /// The routes web and api serve Secret "cert"; `now` is what the watch store holds.
    fn update(secrets: &mut TlsSecrets, now: Option<Arc<Secret>>) {
        let users = [
            (key("cert"), "shop/web".to_string()),
            (key("cert"), "shop/api".to_string()),
        ];
        secrets.update(users, |_| now.clone());
    }

    #[test]
    fn a_deleted_or_broken_secret_keeps_its_last_good_content_and_says_so() {
        let mut secrets = TlsSecrets::default();
        update(&mut secrets, Some(secret(CERT, KEY)));
        assert_eq!(secrets.served[&key("cert")].certificate_chain, CERT);
        assert!(secrets.problems.is_empty());

        // Renewed: the new content serves.
        let renewed = CERT.replace('\n', "\r\n");
        update(&mut secrets, Some(secret(&renewed, KEY)));
        assert_eq!(secrets.served[&key("cert")].certificate_chain, renewed);

        // Deleted: the last good content keeps serving, and both routes hear of it.
        update(&mut secrets, None);
        assert_eq!(secrets.served[&key("cert")].certificate_chain, renewed);
        let message = "TLS Secret shop/cert: not found (or not of type kubernetes.io/tls); \
                       its last good certificate keeps serving";
        assert_eq!(
            secrets.problems,
            [
                Problem::tls_secret("shop/api", message, true, true),
                Problem::tls_secret("shop/web", message, true, true)
            ]
        );

        // Back with content Envoy would refuse: still the last good one.
        update(&mut secrets, Some(secret("not a certificate", KEY)));
        assert_eq!(secrets.served[&key("cert")].certificate_chain, renewed);
        assert!(
            secrets.problems[0]
                .message()
                .starts_with("TLS Secret shop/cert: tls.crt holds no PEM certificate;"),
            "{:?}",
            secrets.problems
        );

        // Good again: served as it is, and nothing to report.
        update(&mut secrets, Some(secret(CERT, KEY)));
        assert_eq!(secrets.served[&key("cert")].certificate_chain, CERT);
        assert!(secrets.problems.is_empty());
    }

    #[test]
    fn the_troubles_of_a_route_say_whether_its_secret_is_there_and_what_serves() {
        let mut secrets = TlsSecrets::default();
        update(&mut secrets, None);
        let mut problems = secrets.problems.clone();
        update(&mut secrets, Some(secret(CERT, KEY)));
        update(&mut secrets, Some(secret(CERT, "")));
        problems.extend(secrets.problems.iter().cloned());
        problems.push(Problem::new("shop/web", "cluster \"x\" is not defined"));
        let troubles = secret_troubles(&problems, "shop/web");
        let kinds: Vec<(bool, bool)> = troubles.iter().map(|t| (t.missing, t.kept)).collect();
        assert_eq!(kinds, [(true, false), (false, true)], "{troubles:?}");
        assert!(troubles.iter().all(|t| t.message.contains("shop/cert")));
        assert_eq!(secret_troubles(&problems, "shop/other"), []);
    }

    #[test]
    fn a_secret_never_good_gives_nothing_and_one_no_route_serves_is_let_go() {
        let mut secrets = TlsSecrets::default();
        update(&mut secrets, None);
        assert!(secrets.served.is_empty());
        assert!(
            secrets.problems[0]
                .message()
                .ends_with("the route is left out until it has a good one"),
            "{:?}",
            secrets.problems
        );
        update(&mut secrets, Some(secret(CERT, KEY)));
        // No route serves it any more: its last good content goes too.
        secrets.update([], |_| None);
        assert!(secrets.served.is_empty());
        update(&mut secrets, None);
        assert!(
            secrets.served.is_empty(),
            "nothing held for a route that comes back"
        );
    }

    #[test]
    fn only_pem_certificates_and_keys_are_taken() {
        let check = |cert: &str, key: &str| tls_data(&secret(cert, key)).map(|_| ());
        assert_eq!(check(CERT, KEY), Ok(()));
        let pkcs1 = KEY.replace("PRIVATE KEY", "RSA PRIVATE KEY");
        assert_eq!(check(CERT, &pkcs1), Ok(()), "any key form Envoy reads");
        assert_eq!(
            check(KEY, KEY),
            Err("tls.crt holds no PEM certificate".to_string())
        );
        assert_eq!(
            check(CERT, CERT),
            Err("tls.key holds no PEM private key".to_string())
        );
        let broken = check(&CERT.replace("MII", "M!I"), KEY).expect_err("not base64");
        assert!(broken.starts_with("tls.crt: "), "{broken}");
        let cut = check(&CERT[..CERT.len() / 2], KEY).expect_err("no end line");
        assert!(cut.starts_with("tls.crt: "), "{cut}");
        let mut no_key = secret(CERT, KEY);
        Arc::make_mut(&mut no_key)
            .data
            .as_mut()
            .map(|d| d.remove("tls.key"));
        assert_eq!(tls_data(&no_key).map(|_| ()), Err("no tls.key".to_string()));
    }

    #[test]
    fn a_proxy_config_needs_its_virtual_hosts_its_listeners_and_its_clusters_secrets() {
        use crate::api::ProxyConfigSpec;
        use switchyard_core::route::{ResolvedListener, SecretRef, UpstreamTls};
        let secret = |name: &str| SecretRef {
            namespace: "infra".into(),
            name: name.into(),
        };
        let mut cluster = crate::k8s::fixtures::cluster("secure");
        cluster.tls = Some(Box::new(UpstreamTls {
            hostname: "secure.test".into(),
            ca_certificates: "CA".into(),
            client_certificate: Some(secret("client")),
            ..Default::default()
        }));
        let mut pc = ProxyConfig::new(
            "gw-edge-443-live",
            ProxyConfigSpec {
                drain_period: None,
                members: Vec::new(),
                role: ProxyConfigRole::Live,
                route: "gw-edge-443".into(),
                listener: Some(ResolvedListener {
                    default_certificate: Some(secret("default")),
                    ..Default::default()
                }),
                clusters: vec![cluster],
                route_created: None,
                generation: 1,
                version: "v1".into(),
                virtual_host: None,
                kept_clusters: Vec::new(),
            },
        );
        pc.metadata.namespace = Some("shop".into());
        let keys = |pc: &ProxyConfig| -> Vec<String> {
            (tls_secrets_of(pc).into_iter())
                .map(|(ns, name)| format!("{ns}/{name}"))
                .collect()
        };
        assert_eq!(keys(&pc), ["infra/client", "infra/default"]);
        // A probe's clusters must warm before the switch: their secret is needed already.
        pc.spec.role = ProxyConfigRole::Probe;
        assert_eq!(keys(&pc), ["infra/client"]);
    }
}
