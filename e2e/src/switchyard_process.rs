//! The Switchyard process (standalone or operator), its listener ports, standalone route
//! files, and the ADS server in this process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{Backend, Process, free_port};

/// The switchyard binary: $SWITCHYARD_BIN, or the one cargo built next to this test.
pub fn switchyard_binary() -> PathBuf {
    if let Ok(path) = std::env::var("SWITCHYARD_BIN") {
        return PathBuf::from(path);
    }
    // target/<profile>/deps/<test> or target/<profile>/<bin>
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join("switchyard");
    assert!(
        path.exists(),
        "no switchyard binary at {}: build it (cargo build) or set SWITCHYARD_BIN",
        path.display()
    );
    path
}

/// The listener ports every Envoy of a rig uses.
#[derive(Clone, Copy, Debug)]
pub struct ListenerPorts {
    pub http: u16,
    pub https: u16,
    pub probe: u16,
}

impl ListenerPorts {
    pub fn free() -> Self {
        Self {
            http: free_port(),
            https: free_port(),
            probe: free_port(),
        }
    }
}

pub struct Switchyard {
    pub process: Process,
    pub xds_port: u16,
    pub admin_port: u16,
    pub config_dir: PathBuf,
}

impl Switchyard {
    pub fn start_standalone(work: &Path, config_dir: &Path, extra: &[&str]) -> Switchyard {
        let xds_port = free_port();
        let admin_port = free_port();
        let mut command = Command::new(switchyard_binary());
        command
            .arg("standalone")
            .arg("--config")
            .arg(config_dir)
            .args(["--xds-address", &format!("127.0.0.1:{xds_port}")])
            .args(["--admin-address", &format!("127.0.0.1:{admin_port}")])
            .args(["--poll-interval", "50ms", "--probe-token", "test-token"])
            .args(extra)
            .env("RUST_LOG", "info,switchyard=debug");
        let process = Process::spawn("switchyard", &mut command, work.join("switchyard.log"));
        Switchyard {
            process,
            xds_port,
            admin_port,
            config_dir: config_dir.to_path_buf(),
        }
    }

    /// Starts `switchyard operator` against the cluster of `kubeconfig`. The Envoy fleet
    /// is the Service `envoy_service` (NAMESPACE/NAME), whose EndpointSlices list the
    /// Envoys' addresses (see [`crate::local_range`]).
    pub fn start_operator(
        work: &Path,
        name: &str,
        kubeconfig: &Path,
        envoy_service: &str,
        ports: ListenerPorts,
        extra: &[&str],
    ) -> Switchyard {
        Self::start_operator_on(
            work,
            name,
            kubeconfig,
            envoy_service,
            ports,
            free_port(),
            extra,
            &[],
        )
    }

    /// [`Switchyard::start_operator`] serving xDS on a port chosen beforehand, e.g. the one
    /// of a replica that was killed, or one that Envoys already list
    /// ([`Envoy::start_with_replicas`]). `env` is added to its environment.
    #[allow(clippy::too_many_arguments)]
    pub fn start_operator_on(
        work: &Path,
        name: &str,
        kubeconfig: &Path,
        envoy_service: &str,
        ports: ListenerPorts,
        xds_port: u16,
        extra: &[&str],
        env: &[(String, String)],
    ) -> Switchyard {
        let admin_port = free_port();
        let mut command = Command::new(switchyard_binary());
        command
            .arg("operator")
            .args(["--envoy-service", envoy_service])
            .args(["--xds-address", &format!("127.0.0.1:{xds_port}")])
            .args(["--admin-address", &format!("127.0.0.1:{admin_port}")])
            .args(["--probe-token", "test-token"])
            .args(["--http-port", &ports.http.to_string()])
            .args(["--https-port", &ports.https.to_string()])
            .args(["--probe-port", &ports.probe.to_string()])
            .args(["--identity", name, "--lease-namespace", "default"])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,switchyard=debug,kube=warn")
            .envs(env.iter().map(|(k, v)| (k, v)));
        let process = Process::spawn(name, &mut command, work.join(format!("{name}.log")));
        Switchyard {
            process,
            xds_port,
            admin_port,
            config_dir: PathBuf::new(),
        }
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin_port)
    }

    pub async fn nodes(&self) -> serde_json::Value {
        let text = reqwest::get(self.admin_url("/debug/nodes")).await.ok();
        let text = match text {
            Some(r) => r.text().await.unwrap_or_default(),
            None => String::new(),
        };
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }

    pub async fn desired_version(&self) -> Option<String> {
        self.nodes().await["desired_version"]
            .as_str()
            .map(str::to_string)
    }

    /// Waits until the desired snapshot is no longer `previous` (a change was loaded).
    pub async fn wait_for_new_version(&self, previous: Option<&str>, within: Duration) {
        let started = Instant::now();
        while self.desired_version().await.as_deref() == previous {
            assert!(
                started.elapsed() < within,
                "configuration change not loaded within {within:?}\n--- switchyard log ---\n{}",
                self.process.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until `count` nodes are connected and hold the desired snapshot.
    pub async fn wait_synced(&self, count: usize, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let view = self.nodes().await;
            let desired = view["desired_version"].as_str().map(str::to_string);
            let nodes = view["nodes"].as_array().cloned().unwrap_or_default();
            let synced = nodes
                .iter()
                .filter(|n| {
                    n["status"]["synced"].as_bool() == Some(true)
                        && n["status"]["desired_version"].as_str().map(str::to_string) == desired
                })
                .count();
            if desired.is_some() && synced == count && nodes.len() == count {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "nodes not synced within {within:?}: {view:#}\n--- switchyard log ---\n{}",
                self.process.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A scratch folder for a standalone Switchyard: its work folder, the config folder it
/// watches, and free ports for the Envoys' HTTP and probe listeners.
pub struct StandaloneDir {
    _dir: tempfile::TempDir,
    pub work: PathBuf,
    pub config: PathBuf,
    pub http_port: u16,
    pub probe_port: u16,
}

impl StandaloneDir {
    pub fn new() -> StandaloneDir {
        let dir = tempfile::tempdir().expect("temp dir");
        let work = dir.path().to_path_buf();
        let config = work.join("config");
        std::fs::create_dir(&config).expect("config dir");
        StandaloneDir {
            _dir: dir,
            work,
            config,
            http_port: free_port(),
            probe_port: free_port(),
        }
    }

    /// Writes `file` of the config folder whole: written aside, then renamed, so the
    /// watcher never reads half a file.
    pub fn write(&self, file: &str, text: &str) {
        let path = self.config.join(file);
        let tmp = self.config.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).expect("write config");
        std::fs::rename(&tmp, path).expect("rename config");
    }
}

impl Default for StandaloneDir {
    fn default() -> Self {
        Self::new()
    }
}

/// Makes each change of `changes` (it writes the config), one after the other, while
/// 200 requests a second go to `target` for `host`: each change loaded and held by the
/// `envoys` connected Envoys before the next. The load's report, once it stopped.
pub async fn changes_under_load<C: FnMut()>(
    switchyard: &Switchyard,
    envoys: usize,
    target: String,
    host: &str,
    changes: impl IntoIterator<Item = C>,
) -> crate::LoadReport {
    let load = crate::Load::start(vec![target], host, 200, Duration::from_secs(120));
    for mut change in changes {
        let before = switchyard.desired_version().await;
        // Requests under the configuration before, then the change.
        tokio::time::sleep(Duration::from_millis(500)).await;
        change();
        switchyard
            .wait_for_new_version(before.as_deref(), Duration::from_secs(10))
            .await;
        switchyard
            .wait_synced(envoys, Duration::from_secs(10))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    load.finish().await
}

/// Writes a standalone config with one route `host` → each (service, weight), every
/// service pointing at `backend`.
pub fn write_route(
    dir: &Path,
    host: &str,
    http_port: u16,
    probe_port: u16,
    services: &[(&str, &Backend)],
) {
    let mut yaml = format!(
        "listeners:\n  httpPort: {http_port}\n  httpsPort: {}\n  probePort: {probe_port}\nroutes:\n- name: web\n  spec:\n    hosts: [\"{host}\"]\n    rules:\n    - backends:\n",
        http_port + 1
    );
    for (service, _) in services {
        yaml.push_str(&format!(
            "      - {{ service: {service}, port: {{PORT_{service}}} }}\n"
        ));
    }
    yaml.push_str("services:\n");
    for (service, backend) in services {
        yaml = yaml.replace(
            &format!("{{PORT_{service}}}"),
            &backend.address.port().to_string(),
        );
        yaml.push_str(&format!(
            "- name: {service}\n  endpoints:\n  - {{ address: \"{}\", port: {} }}\n",
            backend.address.ip(),
            backend.address.port()
        ));
    }
    // Write then rename, so the watcher never reads half a file.
    let tmp = dir.join(".routes.yaml.tmp");
    std::fs::write(&tmp, yaml).expect("write config");
    std::fs::rename(&tmp, dir.join("routes.yaml")).expect("rename config");
}

/// The ADS server in this process, for tests that publish hand-made snapshots.
pub struct InProcessServer {
    pub desired: Arc<switchyard::xds::Desired>,
    pub nodes: switchyard::xds::Nodes,
    pub registry: Arc<prometheus_client::registry::Registry>,
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl InProcessServer {
    pub async fn start(ordering: switchyard::xds::Ordering) -> InProcessServer {
        Self::start_with(ordering, switchyard::xds::server::DEFAULT_ANSWER_TIMEOUT).await
    }

    /// [`InProcessServer::start`], closing streams left unanswered for `answer_timeout`.
    pub async fn start_with(
        ordering: switchyard::xds::Ordering,
        answer_timeout: Duration,
    ) -> InProcessServer {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = switchyard::metrics::Metrics::register(&mut registry);
        let desired = Arc::new(switchyard::xds::Desired::new());
        let nodes = switchyard::xds::Nodes::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind xds");
        let port = listener.local_addr().expect("xds address").port();
        let server =
            switchyard::xds::AdsServer::new(desired.clone(), nodes.clone(), metrics, ordering)
                .with_answer_timeout(answer_timeout);
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(server.into_service())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        InProcessServer {
            desired,
            nodes,
            registry: Arc::new(registry),
            port,
            task,
        }
    }

    pub fn metrics_text(&self) -> String {
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

impl Drop for InProcessServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
