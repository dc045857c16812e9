//! The Kubernetes part of the rig: a real etcd + kube-apiserver on 127.0.0.1 (the binaries
//! `e2e/provision.sh` builds), or an existing cluster (kind, k3d, ...) when asked for, plus
//! helpers that play the missing controllers: there is no kubelet and no
//! controller-manager, so tests create Services and EndpointSlices themselves.
//!
//! ```no_run
//! # async fn demo() {
//! use switchyard_e2e::kube::{self as rig, KubeApi};
//! let api = KubeApi::shared().await; // one per test binary while any test holds it
//! let client = api.client().await;
//! rig::create_namespace(&client, "demo").await;
//! rig::apply_service(&client, "demo", "web", 80).await;
//! // EndpointSlices may not hold 127.x addresses: the rig's listeners take local_range's.
//! let ip = switchyard_e2e::local_range::address(0, 21);
//! rig::apply_endpoint_slice(&client, "demo", "web", &[(ip.as_str(), 8080, true, true, false)]).await;
//! let out = api.kubectl_ok(["get", "endpointslices", "-n", "demo"]).await;
//! # }
//! ```
//!
//! A local apiserver uses TLS with its self-signed certificate (`--cert-dir`), which the
//! written kubeconfig trusts as its CA; the admin is a static token in `system:masters`;
//! authorization is RBAC. Everything lives under `<work_dir>/kube-api/` and is removed when
//! the handle drops; the logs (`etcd.log`, `kube-apiserver.log`) stay in `work_dir`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ::kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use ::kube::config::{KubeConfigOptions, Kubeconfig};
use ::kube::runtime::watcher;
use ::kube::{Client, Config};
use base64::Engine as _;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::io::AsyncWriteExt;

use crate::Process;

/// The field manager of every server-side apply the helpers make.
pub const FIELD_MANAGER: &str = "switchyard-e2e";
/// Label of every EndpointSlice: the Service it belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label of every EndpointSlice the helpers write (value [`FIELD_MANAGER`]), so that a real
/// cluster's EndpointSlice controllers leave them alone.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// The name of the single port of Services and EndpointSlices the helpers write.
pub const PORT_NAME: &str = "http";

const READY_WITHIN: Duration = Duration::from_secs(60);
const KUBECTL_WITHIN: Duration = Duration::from_secs(60);

/// `$SWITCHYARD_E2E_CACHE/bin`, by default `~/.cache/switchyard-e2e/bin`.
pub fn cache_bin_dir() -> PathBuf {
    std::env::var_os("SWITCHYARD_E2E_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/switchyard-e2e")
        })
        .join("bin")
}

/// A provisioned tool (`etcd`, `kube-apiserver`, `kubectl`, `helm`, `argocd-health`...),
/// or a panic that says how to provision it.
pub fn tool(name: &str) -> PathBuf {
    let path = cache_bin_dir().join(name);
    assert!(
        path.exists(),
        "no {name} at {}: run `e2e/provision.sh --only {name}` (or all of it: the first \
         run builds the Go tools from their modules, about 20 min), or, for the API server \
         tests, set SWITCHYARD_E2E_KUBECONFIG to use an existing cluster",
        path.display()
    );
    path
}

/// A name that is unique in this process and unlikely to clash with other runs against
/// the same (existing) cluster: `prefix-<pid>-<n>`.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A Kubernetes API server for tests: one this rig started (etcd + kube-apiserver, killed
/// and wiped on drop) or an existing cluster (left alone on drop).
pub struct KubeApi {
    /// An admin kubeconfig (the current context is the cluster).
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:<port>` for a local apiserver.
    pub server: String,
    /// The admin bearer token (`system:masters`); `None` for an existing cluster whose
    /// kubeconfig authenticates otherwise (client certificates, exec plugins).
    pub token: Option<String>,
    /// How long the local apiserver took from spawning etcd to `/readyz` answering `ok`.
    pub started_in: Option<Duration>,
    kubectl: PathBuf,
    kubectl_cache: Option<PathBuf>,
    local: Option<LocalCluster>,
    // Dropped last: the work folder of a shared apiserver.
    _temp: Option<tempfile::TempDir>,
}

/// Where a local apiserver serves, and what else it is told.
pub struct ApiServerOptions {
    /// Bind and advertise address. On loopback, no endpoints are written for the
    /// `kubernetes` Service (loopback is refused there).
    pub address: std::net::Ipv4Addr,
    /// The secure port; `None`: a free one.
    pub port: Option<u16>,
    pub extra_args: Vec<String>,
}

impl ApiServerOptions {
    /// 127.0.0.1, a free port: the node-less rig.
    pub fn loopback() -> Self {
        ApiServerOptions {
            address: std::net::Ipv4Addr::LOCALHOST,
            port: None,
            extra_args: Vec::new(),
        }
    }
}

struct LocalCluster {
    apiserver: Process,
    etcd: Process,
    dir: PathBuf,
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        // The apiserver first, so it does not log a storm of etcd errors.
        self.apiserver.kill();
        self.etcd.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl KubeApi {
    /// Starts etcd and kube-apiserver on free ports of 127.0.0.1 and waits (bounded) until
    /// `/readyz` says `ok`. Panics with the logs' tails when they do not get there.
    pub async fn start(work_dir: &Path) -> KubeApi {
        Self::start_with(work_dir, &ApiServerOptions::loopback()).await
    }

    /// Like [`KubeApi::start`], serving where `options` say (a node's address, with the
    /// flags a node needs).
    pub async fn start_with(work_dir: &Path, options: &ApiServerOptions) -> KubeApi {
        let etcd_bin = tool("etcd");
        let apiserver_bin = tool("kube-apiserver");
        let kubectl = tool("kubectl");

        let dir = work_dir.join("kube-api");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("certs")).expect("create the kube-api folder");
        let [etcd_port, peer_port, free_api_port] = free_ports();
        let api_port = options.port.unwrap_or(free_api_port);
        let address = options.address;
        let token = random_hex(16);
        let tokens = dir.join("tokens.csv");
        std::fs::write(&tokens, format!("{token},admin,admin,system:masters\n"))
            .expect("write the token file");
        let (signing_key, verification_key) = service_account_keys(&dir);

        let started = Instant::now();
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut command = Command::new(etcd_bin);
        command
            .args(["--name", "default", "--data-dir"])
            .arg(dir.join("etcd"))
            .args(["--listen-client-urls", &etcd_url])
            .args(["--advertise-client-urls", &etcd_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}")])
            .args(["--unsafe-no-fsync", "--log-level", "warn"]);
        let etcd = Process::spawn("etcd", &mut command, work_dir.join("etcd.log"));

        // Started right away: the apiserver retries etcd until it answers, which saves
        // etcd's own second of start-up.
        let mut command = Command::new(apiserver_bin);
        command
            .arg(format!("--etcd-servers={etcd_url}"))
            .arg(format!("--bind-address={address}"))
            .arg(format!("--advertise-address={address}"))
            .arg(format!("--secure-port={api_port}"));
        if address.is_loopback() {
            // Without it, the loopback advertise address is refused.
            command.arg("--endpoint-reconciler-type=none");
        }
        command
            .args(&options.extra_args)
            .arg(path_flag("--cert-dir", &dir.join("certs")))
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(path_flag("--service-account-key-file", &verification_key))
            .arg(path_flag(
                "--service-account-signing-key-file",
                &signing_key,
            ))
            .arg("--authorization-mode=RBAC")
            .arg(path_flag("--token-auth-file", &tokens));
        let apiserver = Process::spawn(
            "kube-apiserver",
            &mut command,
            work_dir.join("kube-apiserver.log"),
        );

        let kubeconfig = dir.join("kubeconfig");
        let server = format!("https://{address}:{api_port}");
        let mut api = KubeApi {
            kubeconfig: kubeconfig.clone(),
            server: server.clone(),
            token: Some(token.clone()),
            started_in: None,
            kubectl,
            kubectl_cache: Some(dir.join("kubectl-cache")),
            // From here on, a panic kills both processes.
            local: Some(LocalCluster {
                apiserver,
                etcd,
                dir: dir.clone(),
            }),
            _temp: None,
        };

        // The self-signed certificate (serving certificate, then its CA) is written before
        // the port listens.
        let deadline = started + READY_WITHIN;
        while tokio::net::TcpStream::connect((address, api_port))
            .await
            .is_err()
        {
            api.check_alive(deadline, "kube-apiserver does not listen");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ca = std::fs::read(dir.join("certs/apiserver.crt")).unwrap_or_default();
        assert!(
            String::from_utf8_lossy(&ca).contains("-----END CERTIFICATE-----"),
            "kube-apiserver listens but wrote no certificate to certs/apiserver.crt"
        );
        std::fs::write(&kubeconfig, kubeconfig_yaml(&server, &ca, &token))
            .expect("write the kubeconfig");

        // Ready means every post-start hook ran (RBAC bootstrap roles, CRD controllers...).
        let client = api.client().await;
        loop {
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("a request");
            let last =
                match tokio::time::timeout(Duration::from_secs(5), client.request_text(request))
                    .await
                {
                    Ok(Ok(text)) if text.trim() == "ok" => break,
                    Ok(Ok(text)) => text,
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "timed out".to_string(),
                };
            api.check_alive(deadline, &format!("/readyz is not ok: {last}"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let took = started.elapsed();
        api.started_in = Some(took);
        eprintln!("kube-apiserver {server} ready in {took:.2?}");
        api
    }

    /// The cluster of `$SWITCHYARD_E2E_KUBECONFIG`, or of `$KUBECONFIG` (its first file)
    /// when `SWITCHYARD_E2E_USE_EXISTING=1`; `None` when neither is set.
    pub async fn existing() -> Option<KubeApi> {
        let path = match std::env::var_os("SWITCHYARD_E2E_KUBECONFIG") {
            Some(path) if !path.is_empty() => PathBuf::from(path),
            _ => {
                if std::env::var("SWITCHYARD_E2E_USE_EXISTING").as_deref() != Ok("1") {
                    return None;
                }
                let list = std::env::var_os("KUBECONFIG")
                    .filter(|v| !v.is_empty())
                    .expect("SWITCHYARD_E2E_USE_EXISTING=1 needs KUBECONFIG");
                std::env::split_paths(&list).next()?
            }
        };
        let config = load_config(&path).await;
        let server = config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string();
        // The token is a SecretString; its serialized form is the plain value.
        let token = serde_json::to_value(&config.auth_info)
            .ok()
            .and_then(|v| v["token"].as_str().map(str::to_string));
        let kubectl = cache_bin_dir().join("kubectl");
        Some(KubeApi {
            kubeconfig: path,
            server,
            token,
            started_in: None,
            kubectl: if kubectl.exists() {
                kubectl
            } else {
                PathBuf::from("kubectl")
            },
            kubectl_cache: None,
            local: None,
            _temp: None,
        })
    }

    /// [`KubeApi::existing`] if configured, otherwise [`KubeApi::start`].
    pub async fn existing_or_start(work_dir: &Path) -> KubeApi {
        match KubeApi::existing().await {
            Some(api) => api,
            None => KubeApi::start(work_dir).await,
        }
    }

    /// One API server for all tests of this test binary that run while any of them holds
    /// it (the existing cluster, or a local one in a temporary folder); it is stopped when
    /// the last holder drops it, so nothing outlives the tests. Each test builds its own
    /// [`KubeApi::client`], since a client belongs to the runtime that made it.
    pub async fn shared() -> Arc<KubeApi> {
        static SHARED: tokio::sync::Mutex<Weak<KubeApi>> =
            tokio::sync::Mutex::const_new(Weak::new());
        let mut slot = SHARED.lock().await;
        if let Some(api) = slot.upgrade() {
            return api;
        }
        let api = match KubeApi::existing().await {
            Some(api) => api,
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("switchyard-kube-")
                    .tempdir()
                    .expect("a temporary folder");
                let mut api = KubeApi::start(temp.path()).await;
                api._temp = Some(temp);
                api
            }
        };
        let api = Arc::new(api);
        *slot = Arc::downgrade(&api);
        api
    }

    /// The folder of a local apiserver's files: `certs/apiserver.crt` (its self-signed
    /// certificate and CA) and `sa.key` (the service-account signing key).
    pub fn local_dir(&self) -> Option<&Path> {
        self.local.as_ref().map(|l| l.dir.as_path())
    }

    /// etcd and kube-apiserver when this rig started them.
    pub fn local_processes(&self) -> Vec<&Process> {
        self.local
            .as_ref()
            .map(|l| vec![&l.etcd, &l.apiserver])
            .unwrap_or_default()
    }

    /// Whether this rig started the apiserver (as opposed to an existing cluster).
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// A client built from [`KubeApi::kubeconfig`] (verifying the server's certificate).
    pub async fn client(&self) -> Client {
        Client::try_from(load_config(&self.kubeconfig).await).expect("a kube client")
    }

    /// The tail of the local apiserver's log (empty for an existing cluster).
    pub fn log_tail(&self) -> String {
        self.local
            .as_ref()
            .map(|l| l.apiserver.log_tail())
            .unwrap_or_default()
    }

    /// Applies the repository's `crds/` server-side (as the README tells users, forcing
    /// conflicts with earlier appliers of the same cluster) and waits until every CRD is
    /// Established. Returns what kubectl printed on stderr: warnings, if any.
    pub async fn install_crds(&self) -> String {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds");
        let out = self
            .kubectl([
                "apply",
                "--server-side",
                "--force-conflicts",
                &format!("--field-manager={FIELD_MANAGER}"),
                "-f",
                dir,
            ])
            .await;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "apply crds/: {stderr}");
        self.wait_established(&[
            "trafficroutes.switchyard.dev",
            "proxyconfigs.switchyard.dev",
        ])
        .await;
        stderr
    }

    /// Waits (bounded) until every named CRD is Established. Not `kubectl wait`: it fails
    /// at once, instead of waiting, when it reads a CRD before the API server has set
    /// any condition on it ("accessor error: <nil> is of the type <nil>").
    pub async fn wait_established(&self, crds: &[&str]) {
        const WITHIN: Duration = Duration::from_secs(30);
        let deadline = Instant::now() + WITHIN;
        for crd in crds {
            loop {
                let out = self
                    .kubectl([
                        "get",
                        &format!("crd/{crd}"),
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
                    ])
                    .await;
                if out.status.success() && out.stdout.trim_ascii() == b"True" {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "crd/{crd} not Established within {WITHIN:?}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Runs `kubectl --kubeconfig <kubeconfig> ARGS` (bounded).
    pub async fn kubectl<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.kubectl_input(args, "").await
    }

    /// Like [`KubeApi::kubectl`], with `input` on stdin (for `-f -`).
    pub async fn kubectl_input<I, S>(&self, args: I, input: &str) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = tokio::process::Command::new(&self.kubectl);
        command.arg("--kubeconfig").arg(&self.kubeconfig);
        if let Some(cache) = &self.kubectl_cache {
            // Not ~/.kube/cache: every local apiserver has a new port.
            command.arg("--cache-dir").arg(cache);
        }
        command.args(args);
        let line = format!("{command:?}");
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.kubectl.display()));
        let mut stdin = child.stdin.take().expect("kubectl stdin");
        let input = input.as_bytes().to_vec();
        let feed = async move {
            let _ = stdin.write_all(&input).await;
            // Dropping stdin closes it.
        };
        let (_, output) = tokio::time::timeout(
            KUBECTL_WITHIN,
            futures::future::join(feed, child.wait_with_output()),
        )
        .await
        .unwrap_or_else(|_| panic!("{line} did not finish within {KUBECTL_WITHIN:?}"));
        output.unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    /// Runs kubectl and returns its stdout; panics with its stderr when it fails.
    pub async fn kubectl_ok<I, S>(&self, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<_> = args
            .into_iter()
            .map(|a| a.as_ref().to_os_string())
            .collect();
        let output = self.kubectl(&args).await;
        assert!(
            output.status.success(),
            "kubectl {args:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Panics (with the logs) past `deadline`, or as soon as a log shows a fatal error.
    fn check_alive(&self, deadline: Instant, what: &str) {
        let Some(local) = &self.local else { return };
        let fatal = fatal_line(&local.apiserver).or_else(|| fatal_line(&local.etcd));
        if fatal.is_none() && Instant::now() < deadline {
            return;
        }
        panic!(
            "kube-apiserver at {} {}\n\
             --- kube-apiserver log ({}) ---\n{}\n--- etcd log ({}) ---\n{}",
            self.server,
            fatal.map_or_else(
                || format!("not ready within {READY_WITHIN:?}: {what}"),
                |f| format!("did not start: {f}")
            ),
            local.apiserver.log.display(),
            local.apiserver.log_tail(),
            local.etcd.log.display(),
            local.etcd.log_tail(),
        );
    }
}

/// A line of the log that says the process gave up (so waiting longer is pointless).
fn fatal_line(process: &Process) -> Option<String> {
    let text = std::fs::read_to_string(&process.log).unwrap_or_default();
    text.lines()
        .find(|line| {
            // kube-apiserver: cobra's "Error: ..." on a bad flag, klog's F-lines;
            // etcd: zap's fatal/panic levels.
            line.starts_with("Error: ")
                || line.starts_with("panic: ")
                || (line.starts_with('F') && line[1..].starts_with(|c: char| c.is_ascii_digit()))
                || line.contains("\"level\":\"fatal\"")
                || line.contains("\"level\":\"panic\"")
        })
        .map(str::to_string)
}

fn path_flag(flag: &str, path: &Path) -> String {
    format!("{flag}={}", path.display())
}

/// Distinct free ports on 127.0.0.1 (all held at once while they are picked).
fn free_ports<const N: usize>() -> [u16; N] {
    std::array::from_fn(|_| crate::free_port())
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut buf)
        .expect("random bytes");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

async fn load_config(path: &Path) -> Config {
    let kubeconfig = Kubeconfig::read_from(path)
        .unwrap_or_else(|e| panic!("cannot read kubeconfig {}: {e}", path.display()));
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("unusable kubeconfig {}: {e}", path.display()))
}

fn kubeconfig_yaml(server: &str, ca_pem: &[u8], token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: switchyard-e2e
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: admin
  user:
    token: {token}
contexts:
- name: switchyard-e2e
  context:
    cluster: switchyard-e2e
    user: admin
    namespace: default
current-context: switchyard-e2e
"
    )
}

/// The service-account keys: (signing private key, verification key). An RSA key from
/// `openssl genrsa` (`$SWITCHYARD_E2E_OPENSSL`, default `openssl`) when that command
/// works; otherwise a built-in ECDSA P-256 key (tokens are then ES256), since the
/// apiserver accepts either.
pub fn service_account_keys(dir: &Path) -> (PathBuf, PathBuf) {
    let openssl = std::env::var_os("SWITCHYARD_E2E_OPENSSL").unwrap_or_else(|| "openssl".into());
    let key = dir.join("sa.key");
    match Command::new(&openssl)
        .arg("genrsa")
        .arg("-out")
        .arg(&key)
        .arg("2048")
        .stdin(Stdio::null())
        .output()
    {
        // One RSA private key serves as both: the public half is derived from it.
        Ok(out) if out.status.success() => return (key.clone(), key),
        Ok(out) => eprintln!(
            "openssl genrsa failed ({}), using a built-in ECDSA key: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(_) => {} // no openssl: the built-in key
    }
    let (private_pem, public_pem) = ecdsa_p256_key();
    let public = dir.join("sa.pub");
    std::fs::write(&key, private_pem).expect("write the service-account key");
    std::fs::write(&public, public_pem).expect("write the service-account public key");
    (key, public)
}

/// A new ECDSA P-256 key as PEM: (PKCS#8 private key, SubjectPublicKeyInfo public key).
/// The apiserver reads the public half of an EC key only from a SEC1 private key or a
/// public key, so the public key is written out.
fn ecdsa_p256_key() -> (String, String) {
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    // SubjectPublicKeyInfo up to the key: SEQUENCE { SEQUENCE { id-ecPublicKey,
    // prime256v1 }, BIT STRING (no unused bits) }, followed by the 65-byte point.
    const SPKI_PREFIX: [u8; 26] = [
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08,
        0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ];
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 =
        EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("an ECDSA key");
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
        .expect("the generated ECDSA key");
    let mut spki = SPKI_PREFIX.to_vec();
    spki.extend_from_slice(pair.public_key().as_ref());
    (pem("PRIVATE KEY", pkcs8.as_ref()), pem("PUBLIC KEY", &spki))
}

fn pem(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in body.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

// ----------------------------------------------------------------------------- helpers --

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Creates (server-side applies) a namespace.
pub async fn create_namespace(client: &Client, name: &str) -> Namespace {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .patch(name, &apply_params(), &Patch::Apply(&namespace))
        .await
        .unwrap_or_else(|e| panic!("apply namespace {name}: {e}"))
}

/// Deletes a namespace (best effort: without a controller-manager it stays Terminating,
/// which does no harm).
pub async fn delete_namespace(client: &Client, name: &str) {
    let _ = Api::<Namespace>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await;
}

/// The port of the UDP Services of [`apply_udp_service`] and their slices.
pub const UDP_PORT_NAME: &str = "udp";
/// The name and protocol of the one port of a Service and of its slices.
type PortKind = (&'static str, &'static str);
const TCP_PORT: PortKind = (PORT_NAME, "TCP");
const UDP_PORT: PortKind = (UDP_PORT_NAME, "UDP");

/// Creates or updates (server-side apply) a ClusterIP Service `name` without a selector,
/// with one TCP port named [`PORT_NAME`]. Without a selector, no controller of a real
/// cluster writes its EndpointSlices: [`apply_endpoint_slice`] does.
pub async fn apply_service(client: &Client, namespace: &str, name: &str, port: u16) -> Service {
    apply_service_of(client, namespace, name, port, TCP_PORT).await
}

/// [`apply_service`] with one UDP port named [`UDP_PORT_NAME`]; its endpoints are written
/// by [`apply_udp_endpoint_slice`].
pub async fn apply_udp_service(client: &Client, namespace: &str, name: &str, port: u16) -> Service {
    apply_service_of(client, namespace, name, port, UDP_PORT).await
}

async fn apply_service_of(
    client: &Client,
    namespace: &str,
    name: &str,
    port: u16,
    (port_name, protocol): PortKind,
) -> Service {
    let service = Service {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            ports: Some(vec![ServicePort {
                name: Some(port_name.to_string()),
                port: i32::from(port),
                protocol: Some(protocol.to_string()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Service>::namespaced(client.clone(), namespace)
        .patch(name, &apply_params(), &Patch::Apply(&service))
        .await
        .unwrap_or_else(|e| panic!("apply service {namespace}/{name}: {e}"))
}

/// Deletes a Service (a missing one is fine).
pub async fn delete_service(client: &Client, namespace: &str, name: &str) {
    match Api::<Service>::namespaced(client.clone(), namespace)
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(::kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => panic!("delete service {namespace}/{name}: {e}"),
    }
}

/// One endpoint: (IP, port, ready, serving, terminating).
pub type EndpointSpec<'a> = (&'a str, u16, bool, bool, bool);

/// Sets the endpoints of `service` to exactly `endpoints`, as Kubernetes would: one
/// EndpointSlice per (address family, port), named `<service>-<port>` (IPv6:
/// `<service>-v6-<port>`), labelled [`SERVICE_NAME_LABEL`] and [`MANAGED_BY_LABEL`], with
/// its port named [`PORT_NAME`]; with no endpoints at all, one empty slice
/// `<service>-empty`. The slices are applied (server-side) first, then slices of this
/// service that are no longer needed are deleted. Returns the names of the slices.
pub async fn apply_endpoint_slice(
    client: &Client,
    namespace: &str,
    service: &str,
    endpoints: &[EndpointSpec<'_>],
) -> Vec<String> {
    apply_endpoint_slice_of(client, namespace, service, endpoints, TCP_PORT).await
}

/// [`apply_endpoint_slice`] for a Service of [`apply_udp_service`]: its port UDP, named
/// [`UDP_PORT_NAME`].
pub async fn apply_udp_endpoint_slice(
    client: &Client,
    namespace: &str,
    service: &str,
    endpoints: &[EndpointSpec<'_>],
) -> Vec<String> {
    apply_endpoint_slice_of(client, namespace, service, endpoints, UDP_PORT).await
}

async fn apply_endpoint_slice_of(
    client: &Client,
    namespace: &str,
    service: &str,
    endpoints: &[EndpointSpec<'_>],
    (port_name, protocol): PortKind,
) -> Vec<String> {
    // (family, port) → endpoints, in a stable order.
    let mut groups: BTreeMap<(&str, u16), Vec<Endpoint>> = BTreeMap::new();
    for &(ip, port, ready, serving, terminating) in endpoints {
        let address: std::net::IpAddr = ip
            .parse()
            .unwrap_or_else(|_| panic!("endpoint address {ip:?} is not an IP address"));
        assert!(
            !address.is_loopback(),
            "endpoint address {ip}: the API server rejects loopback endpoints; \
             listen on an address of switchyard_e2e::local_range instead"
        );
        let family = if address.is_ipv4() { "IPv4" } else { "IPv6" };
        groups.entry((family, port)).or_default().push(Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(serving),
                terminating: Some(terminating),
            }),
            ..Default::default()
        });
    }
    let api = Api::<EndpointSlice>::namespaced(client.clone(), namespace);
    let mut names = Vec::new();
    // A Service without endpoints keeps one empty slice, as the EndpointSlice controller
    // does: a Service scaled to zero still has a slice, a deleted one has none.
    let placeholder = groups.is_empty().then(|| (("IPv4", 0), Vec::new()));
    for ((family, port), endpoints) in groups.into_iter().chain(placeholder) {
        let name = match (family, port) {
            (_, 0) => format!("{service}-empty"),
            ("IPv4", _) => format!("{service}-{port}"),
            _ => format!("{service}-v6-{port}"),
        };
        let ports = (port != 0).then(|| {
            vec![EndpointPort {
                name: Some(port_name.to_string()),
                port: Some(i32::from(port)),
                protocol: Some(protocol.to_string()),
                ..Default::default()
            }]
        });
        let slice = EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.to_string()),
                labels: Some(BTreeMap::from([
                    (SERVICE_NAME_LABEL.to_string(), service.to_string()),
                    (MANAGED_BY_LABEL.to_string(), FIELD_MANAGER.to_string()),
                ])),
                ..Default::default()
            },
            address_type: family.to_string(),
            endpoints: Some(endpoints),
            ports,
        };
        api.patch(&name, &apply_params(), &Patch::Apply(&slice))
            .await
            .unwrap_or_else(|e| panic!("apply endpointslice {namespace}/{name}: {e}"));
        names.push(name);
    }
    let keep: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    for stale in endpoint_slice_names(client, namespace, service).await {
        if !keep.contains(stale.as_str()) {
            delete_endpoint_slice(&api, namespace, &stale).await;
        }
    }
    names
}

/// Deletes every EndpointSlice [`apply_endpoint_slice`] wrote for `service`.
pub async fn delete_endpoint_slices(client: &Client, namespace: &str, service: &str) {
    let api = Api::<EndpointSlice>::namespaced(client.clone(), namespace);
    for name in endpoint_slice_names(client, namespace, service).await {
        delete_endpoint_slice(&api, namespace, &name).await;
    }
}

/// The label selector of the EndpointSlices of `service`.
pub fn service_selector(service: &str) -> String {
    format!("{SERVICE_NAME_LABEL}={service}")
}

async fn endpoint_slice_names(client: &Client, namespace: &str, service: &str) -> Vec<String> {
    let selector = format!(
        "{},{MANAGED_BY_LABEL}={FIELD_MANAGER}",
        service_selector(service)
    );
    Api::<EndpointSlice>::namespaced(client.clone(), namespace)
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .unwrap_or_else(|e| panic!("list endpointslices {namespace} {selector}: {e}"))
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect()
}

async fn delete_endpoint_slice(api: &Api<EndpointSlice>, namespace: &str, name: &str) {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(::kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => panic!("delete endpointslice {namespace}/{name}: {e}"),
    }
}

/// The object of an event that says "this object is now so" (`Apply`, or `InitApply` of
/// the initial listing: a watcher only lists once it is first polled).
pub fn applied<K>(event: &watcher::Event<K>) -> Option<&K> {
    match event {
        watcher::Event::Apply(object) | watcher::Event::InitApply(object) => Some(object),
        _ => None,
    }
}

/// Waits (bounded by `within`) for the next watch event that satisfies `accept`, and
/// returns it. Watch errors are retried by the stream (use `.default_backoff()`) and
/// quoted if the time runs out.
pub async fn next_event<K, S>(
    stream: &mut S,
    within: Duration,
    what: &str,
    mut accept: impl FnMut(&watcher::Event<K>) -> bool,
) -> watcher::Event<K>
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Unpin,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut last_error = None;
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => {
                panic!("{what}: not seen within {within:?} (last watch error: {last_error:?})")
            }
            Ok(None) => panic!("{what}: the watch ended"),
            Ok(Some(Err(e))) => last_error = Some(e.to_string()),
            Ok(Some(Ok(event))) if accept(&event) => return event,
            Ok(Some(Ok(_))) => {}
        }
    }
}
