//! A restart of Switchyard under live Envoys (issue #21): a SotW and a delta Envoy reconnect
//! to the new instance and keep every listener and cluster they serve with; traffic
//! through them never fails. Twice: once with the new instance's startup gate opening
//! only after the Envoys have reconnected (their requests wait for it), once with the gate
//! already open when they reconnect. All on 127.0.0.x.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use switchyard::xds::Protocol;
use switchyard_e2e::{
    Backend, Envoy, ListenerPorts, Process, Switchyard, error_chain, free_port, switchyard_binary,
    traffic_runtime,
};

const SOTW_IP: &str = "127.0.0.81";
const DELTA_IP: &str = "127.0.0.82";
/// Bounds of each load worker: it never runs longer nor sends more than this.
const LOAD_MAX_TIME: Duration = Duration::from_secs(60);
const LOAD_MAX_PER_WORKER: usize = 30_000;
/// Envoy counters compared across each restart.
const REMOVED: [&str; 2] = [
    "listener_manager.listener_removed",
    "cluster_manager.cluster_removed",
];
const ACTIVE: &str = "listener_manager.total_listeners_active";

/// Several routes, one with TLS (so Envoy has http, https and probe listeners), over two
/// backends.
fn config(ports: ListenerPorts, blue: &Backend, green: &Backend) -> String {
    let testdata = format!("{}/e2e/testdata", env!("CARGO_MANIFEST_DIR"));
    let endpoint = |b: &Backend| {
        format!(
            "{{ address: \"{}\", port: {} }}",
            b.address.ip(),
            b.address.port()
        )
    };
    format!(
        r#"listeners:
  httpPort: {http}
  httpsPort: {https}
  probePort: {probe}
routes:
- name: web
  spec:
    hosts: ["web.test"]
    rules:
    - name: api
      match: {{ pathPrefix: /api }}
      backends: [ {{ service: green, port: {gp} }} ]
    - name: rest
      backends: [ {{ service: blue, port: {bp} }} ]
- name: shop
  spec:
    hosts: ["shop.test"]
    rules:
    - backends: [ {{ service: green, port: {gp}, weight: 50 }}, {{ service: blue, port: {bp}, weight: 50 }} ]
- name: secure
  spec:
    hosts: ["secure.test"]
    tls: {{ secretName: secure-cert, redirectHttp: false }}
    rules:
    - backends: [ {{ service: blue, port: {bp} }} ]
services:
- name: blue
  endpoints: [ {be} ]
- name: green
  endpoints: [ {ge} ]
secrets:
- {{ name: secure-cert, certFile: "{testdata}/tls.crt", keyFile: "{testdata}/tls.key" }}
"#,
        http = ports.http,
        https = ports.https,
        probe = ports.probe,
        gp = green.address.port(),
        bp = blue.address.port(),
        be = endpoint(blue),
        ge = endpoint(green),
    )
}

/// Writes `text` as the only configuration file of `dir`, whole (write, then rename).
fn write_config(dir: &Path, text: &str) {
    let tmp = dir.join(".routes.yaml.tmp");
    std::fs::write(&tmp, text).expect("write config");
    std::fs::rename(&tmp, dir.join("routes.yaml")).expect("rename config");
}

/// `switchyard standalone` on a given xDS port: a new instance where the last one served.
fn start_standalone_on(work: &Path, name: &str, config: &Path, xds_port: u16) -> Switchyard {
    let admin_port = free_port();
    let mut command = Command::new(switchyard_binary());
    command
        .arg("standalone")
        .arg("--config")
        .arg(config)
        .args(["--xds-address", &format!("127.0.0.1:{xds_port}")])
        .args(["--admin-address", &format!("127.0.0.1:{admin_port}")])
        .args(["--poll-interval", "50ms", "--probe-token", "test-token"])
        .env("RUST_LOG", "info,switchyard=debug");
    let process = Process::spawn(name, &mut command, work.join(format!("{name}.log")));
    Switchyard {
        process,
        xds_port,
        admin_port,
        config_dir: config.to_path_buf(),
    }
}

/// The counters of Envoy's admin /stats that these tests read, by name.
async fn stats(envoy: &Envoy) -> BTreeMap<String, u64> {
    envoy
        .admin("/stats?filter=_manager")
        .await
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(": ")?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

#[derive(Clone, Debug)]
enum Target {
    /// An HTTP GET through Envoy, on a fresh connection each time.
    Http { url: String, host: &'static str },
    /// A TCP connection to a listener: only whether Envoy accepts it (for the TLS one,
    /// which this rig's reqwest cannot speak, and to catch short gaps cheaply).
    Connect(SocketAddr),
}

#[derive(Debug, Default)]
struct Tally {
    sent: usize,
    ok: usize,
    /// Connections Envoy refused (no listener on the port).
    refused: usize,
    /// Every other failure: non-2xx, reset, timeout.
    failures: Vec<String>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.sent += other.sent;
        self.ok += other.ok;
        self.refused += other.refused;
        self.failures.extend(other.failures);
    }
}

/// Bounded load through both Envoys, on new connections so that a missing listener shows:
/// HTTP requests to every route (200/s in all), and a TCP connection to each listener of
/// each Envoy every 6 ms, so that even a gap of a few milliseconds is seen.
struct Traffic {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Tally>>,
}

impl Traffic {
    fn start(ports: ListenerPorts) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let mut http = Vec::new();
        let mut tasks = Vec::new();
        for ip in [SOTW_IP, DELTA_IP] {
            for (path, host) in [("/", "web.test"), ("/api", "web.test"), ("/", "shop.test")] {
                http.push(Target::Http {
                    url: format!("http://{ip}:{}{path}", ports.http),
                    host,
                });
            }
            let Ok(ip) = ip.parse() else {
                panic!("{ip} is an address");
            };
            let listeners = [ports.http, ports.https, ports.probe]
                .map(|port| Target::Connect(SocketAddr::new(ip, port)));
            tasks.push(traffic_runtime().spawn(load(
                listeners.to_vec(),
                Duration::from_millis(2),
                stop.clone(),
            )));
        }
        for w in 0..4 {
            let mut targets = http.clone();
            targets.rotate_left(w);
            tasks.push(traffic_runtime().spawn(load(
                targets,
                Duration::from_millis(20),
                stop.clone(),
            )));
        }
        Traffic { stop, tasks }
    }

    async fn finish(self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = Tally::default();
        for task in self.tasks {
            match task.await {
                Ok(tally) => total.add(tally),
                Err(e) => total.failures.push(format!("a load worker failed: {e}")),
            }
        }
        total
    }
}

/// One load worker: `targets` in turn, one every `tick`, until stopped or its bounds
/// ([`LOAD_MAX_TIME`], [`LOAD_MAX_PER_WORKER`]) are reached.
async fn load(targets: Vec<Target>, tick: Duration, stop: Arc<AtomicBool>) -> Tally {
    let mut tally = Tally::default();
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(0)
        .build()
    {
        Ok(client) => client,
        Err(e) => {
            tally.failures.push(format!("no HTTP client: {e}"));
            return tally;
        }
    };
    let started = Instant::now();
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for target in targets.iter().cycle().take(LOAD_MAX_PER_WORKER) {
        if stop.load(Ordering::Relaxed) || started.elapsed() > LOAD_MAX_TIME {
            break;
        }
        ticker.tick().await;
        tally.sent += 1;
        match target {
            Target::Http { url, host } => {
                match client.get(url).header("host", *host).send().await {
                    Ok(r) if r.status().is_success() => tally.ok += 1,
                    Ok(r) => tally.failures.push(format!("{url} {host}: {}", r.status())),
                    Err(e) if e.is_connect() => tally.refused += 1,
                    Err(e) => tally
                        .failures
                        .push(format!("{url} {host}: {}", error_chain(&e))),
                }
            }
            Target::Connect(address) => {
                let connect = tokio::net::TcpStream::connect(address);
                match tokio::time::timeout(Duration::from_secs(2), connect).await {
                    Ok(Ok(_)) => tally.ok += 1,
                    Ok(Err(_)) => tally.refused += 1,
                    Err(_) => tally.failures.push(format!("connect {address}: timeout")),
                }
            }
        }
    }
    tally
}

/// The types each node asks for, by node id: a delta Envoy asks for virtual hosts too.
async fn requested_types(switchyard: &Switchyard) -> BTreeMap<String, Vec<String>> {
    let view = switchyard.nodes().await;
    view["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|node| {
            let types = node["status"]["types"]
                .as_object()
                .map(|types| types.keys().cloned().collect())
                .unwrap_or_default();
            (
                node["node_id"].as_str().unwrap_or_default().to_owned(),
                types,
            )
        })
        .collect()
}

/// Until every node of `switchyard` has asked for each of the types it asked for before
/// (`types`, by node id), and no other node is connected.
async fn wait_requested(switchyard: &Switchyard, types: &BTreeMap<String, Vec<String>>) {
    let started = Instant::now();
    loop {
        let now = requested_types(switchyard).await;
        let asked_again = now.len() == types.len()
            && types.iter().all(|(node, types)| {
                now.get(node)
                    .is_some_and(|asked| types.iter().all(|t| asked.contains(t)))
            });
        if asked_again {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "Envoys did not reconnect: {:#}\n--- log ---\n{}",
            switchyard.nodes().await,
            switchyard.process.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whether every node of `switchyard` (`count` of them) holds its desired snapshot
/// within `within`.
async fn all_synced(switchyard: &Switchyard, count: usize, within: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < within {
        let view = switchyard.nodes().await;
        let desired = &view["desired_version"];
        let nodes = view["nodes"].as_array().cloned().unwrap_or_default();
        let synced = nodes
            .iter()
            .filter(|n| {
                n["status"]["synced"].as_bool() == Some(true)
                    && &n["status"]["desired_version"] == desired
            })
            .count();
        if !desired.is_null() && nodes.len() == count && synced == count {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

struct Rig {
    _dir: tempfile::TempDir,
    work: PathBuf,
    ports: ListenerPorts,
    envoys: Vec<Envoy>,
    good_config: String,
    _backends: (Backend, Backend),
}

impl Rig {
    /// Lowest total_listeners_active of each Envoy while `until` runs, sampled every few
    /// milliseconds.
    async fn min_active_while<F: std::future::Future>(&self, until: F) -> (Vec<u64>, F::Output) {
        let mut min = vec![u64::MAX; self.envoys.len()];
        tokio::pin!(until);
        loop {
            for (i, envoy) in self.envoys.iter().enumerate() {
                if let Some(active) = stats(envoy).await.get(ACTIVE) {
                    min[i] = min[i].min(*active);
                }
            }
            tokio::select! {
                out = &mut until => return (min, out),
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
    }
}

/// Kills `old`, starts a new instance on its xDS port, and checks that the Envoys lose
/// nothing while they move to it. With `gate_after_reconnect`, the new instance first
/// has an unparsable configuration (startup gate closed: Envoys connect and wait), which
/// is fixed once both Envoys have asked for every type again.
async fn restart(rig: &Rig, old: Switchyard, name: &str, gate_after_reconnect: bool) -> Switchyard {
    let before: Vec<_> = futures::future::join_all(rig.envoys.iter().map(stats)).await;
    let served_types = requested_types(&old).await;
    assert!(
        served_types.len() == rig.envoys.len() && served_types.values().all(|t| t.len() >= 5),
        "{served_types:?}"
    );
    let config = rig.work.join(name);
    std::fs::create_dir(&config).expect("config dir");
    write_config(
        &config,
        if gate_after_reconnect {
            "routes: [ {name: web\n"
        } else {
            &rig.good_config
        },
    );
    let xds_port = old.xds_port;
    let traffic = Traffic::start(rig.ports);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut old = old;
    old.process.kill();
    let killed = Instant::now();
    let new = start_standalone_on(&rig.work, name, &config, xds_port);
    let (min_active, (reconnected, synced)) = rig
        .min_active_while(async {
            wait_requested(&new, &served_types).await;
            let reconnected = killed.elapsed();
            if gate_after_reconnect {
                let nodes = new.nodes().await;
                assert!(nodes["desired_version"].is_null(), "gate open: {nodes:#}");
                write_config(&config, &rig.good_config);
            }
            let synced = all_synced(&new, rig.envoys.len(), Duration::from_secs(15))
                .await
                .then(|| killed.elapsed());
            // What Envoy does with the last responses takes a moment.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            (reconnected, synced)
        })
        .await;
    let tally = traffic.finish().await;
    let after: Vec<_> = futures::future::join_all(rig.envoys.iter().map(stats)).await;

    eprintln!(
        "{name}: Envoys reconnected {reconnected:?} after the kill, synced after {synced:?}; \
         {} requests/connections, {} ok, {} refused, {} failed",
        tally.sent,
        tally.ok,
        tally.refused,
        tally.failures.len()
    );
    let mut problems = Vec::new();
    if synced.is_none() {
        problems.push(format!("not every Envoy synced: {:#}", new.nodes().await));
    }
    for (i, envoy) in rig.envoys.iter().enumerate() {
        for counter in REMOVED.iter().chain([&ACTIVE]) {
            let (b, a) = (before[i].get(*counter), after[i].get(*counter));
            eprintln!(
                "{name}: Envoy {}: {counter} {b:?} -> {a:?}, lowest active {}",
                envoy.address, min_active[i]
            );
            if REMOVED.contains(counter) && b != a {
                problems.push(format!("{}: {counter} {b:?} -> {a:?}", envoy.address));
            }
        }
        let active = before[i].get(ACTIVE).copied().unwrap_or(0);
        if active < 3 || min_active[i] < active {
            problems.push(format!(
                "{}: {active} listeners active before, {} at the lowest",
                envoy.address, min_active[i]
            ));
        }
    }
    let shown: Vec<_> = tally.failures.iter().take(10).collect();
    assert!(
        problems.is_empty() && tally.refused == 0 && tally.failures.is_empty(),
        "{name}: Envoys lost configuration across the restart: {problems:#?}\n\
         {} refused connections, {} failures, first ones: {shown:#?}",
        tally.refused,
        tally.failures.len()
    );
    assert!(tally.ok > 100, "{name}: too little load to tell: {tally:?}");
    new
}

#[tokio::test]
async fn envoys_keep_every_listener_and_cluster_across_restarts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let work = dir.path().to_path_buf();
    let ports = ListenerPorts::free();
    let blue = Backend::start("blue", SOTW_IP).await;
    let green = Backend::start("green", DELTA_IP).await;
    let good_config = config(ports, &blue, &green);
    let first = work.join("config-1");
    std::fs::create_dir(&first).expect("config dir");
    write_config(&first, &good_config);
    let switchyard = Switchyard::start_standalone(&work, &first, &[]);
    let envoys = vec![
        Envoy::start(
            &work,
            "envoy-sotw",
            SOTW_IP,
            switchyard.xds_port,
            Protocol::Sotw,
        ),
        Envoy::start(
            &work,
            "envoy-delta",
            DELTA_IP,
            switchyard.xds_port,
            Protocol::Delta,
        ),
    ];
    switchyard.wait_synced(2, Duration::from_secs(30)).await;
    let rig = Rig {
        _dir: dir,
        work,
        ports,
        envoys,
        good_config,
        _backends: (blue, green),
    };
    // Serving: every target answers before the restarts.
    let started = Instant::now();
    loop {
        let traffic = Traffic::start(rig.ports);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let tally = traffic.finish().await;
        if tally.ok > 0 && tally.refused == 0 && tally.failures.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "Envoys not serving: {tally:?}"
        );
    }

    let switchyard = restart(&rig, switchyard, "config-2", true).await;
    let _switchyard = restart(&rig, switchyard, "config-3", false).await;
}
