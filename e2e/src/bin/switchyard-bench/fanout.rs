//! The ADS server at fleet scale, with simulated Envoys (`switchyard_e2e::ads_client`):
//! one change fanned out to many clients, and the memory of a server holding 10k routes
//! while serving them. (Bytes one Envoy receives per change: `switchyard_e2e::change_bytes`.)

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use switchyard::translate::{Translator, translate};
use switchyard::xds::{Ordering, Protocol};
use switchyard_e2e::InProcessServer;
use switchyard_e2e::ads_client::{Target, spawn_fleet, wait_all};
use switchyard_e2e::change_bytes::{CHANGE_TIMEOUT, repoint_to_new_cluster, wait_server_synced};
use switchyard_e2e::synthetic;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// Bounds every wait: a first sync of 1000 clients, or of 10k routes, is slow but not this slow.
const SYNC_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Serialize)]
pub struct FanoutResult {
    pub protocol: String,
    pub clients: usize,
    pub routes: usize,
    pub changes: usize,
    /// Connect to every client holding the first snapshot.
    pub initial_sync_ms: f64,
    /// Publish → every client holds the change and has sent its last ACK.
    pub p50_ms: f64,
    pub max_ms: f64,
    /// Publish → the server has every node's ACK (its Nodes registry says synced).
    pub server_p50_ms: f64,
    pub server_max_ms: f64,
    /// CPU time of this whole process (server and clients) per change, median: the
    /// machine is shared, so this says more than wall time when it is busy.
    pub cpu_ms_per_change: f64,
    /// CPU time of the server's own threads per change, median: what the control plane
    /// spends; the rest is the simulated fleet, which in production runs elsewhere.
    pub server_cpu_ms_per_change: f64,
}

/// Name of the server's runtime threads, to tell its CPU time from the clients'.
const SERVER_THREAD: &str = "ads-server";

/// `changes` route changes (each to a brand-new cluster, so every one is a full
/// make-before-break switch) to `clients` clients of one protocol; with `in_parts`, the
/// server also serves route configurations in parts (VHDS, the operator's default), which
/// delta clients take instead of the whole one.
pub async fn measure_fanout(
    protocol: Protocol,
    in_parts: bool,
    clients: usize,
    routes: usize,
    changes: usize,
) -> anyhow::Result<FanoutResult> {
    // The server on a runtime of its own, so that its CPU time can be told apart.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(SERVER_THREAD)
        .enable_all()
        .build()
        .context("building the server's runtime")?;
    let server = runtime
        .spawn(InProcessServer::start(Ordering::MakeBeforeBreak))
        .await
        .context("starting the server")?;
    let result = fan_out(&server, protocol, in_parts, clients, routes, changes).await;
    drop(server);
    runtime.shutdown_background();
    result
}

async fn fan_out(
    server: &InProcessServer,
    protocol: Protocol,
    in_parts: bool,
    clients: usize,
    routes: usize,
    changes: usize,
) -> anyhow::Result<FanoutResult> {
    let mut config = synthetic::config(routes, 42);
    config.listeners.virtual_host_discovery = in_parts;
    // One translator for every snapshot, as the operator's builder keeps one: each
    // snapshot is built from the one before and shares what is unchanged with it, which
    // is what lets a session compare what a node holds with what it should in the cost
    // of the change.
    let mut translator = Translator::new();
    let first = Arc::new(translator.update(&config).snapshot);
    server.desired.publish(first.clone());
    server.desired.open();
    let started = Instant::now();
    let fleet = match protocol {
        Protocol::Sotw => spawn_fleet(server.port, clients, 0).await?,
        Protocol::Delta => spawn_fleet(server.port, 0, clients).await?,
    };
    wait_all(
        &fleet,
        &Target::for_protocol(&first, protocol),
        SYNC_TIMEOUT,
    )
    .await
    .context("first sync")?;
    let initial_sync_ms = started.elapsed().as_secs_f64() * 1000.0;
    wait_server_synced(server, clients, &first, started).await?;

    let mut times = Vec::new();
    let mut server_times = Vec::new();
    let mut cpu_times = Vec::new();
    let mut server_cpu_times = Vec::new();
    for change in 0..changes {
        repoint_to_new_cluster(&mut config, change % routes, &format!("fresh-{change}"));
        let snapshot = Arc::new(translator.update(&config).snapshot);
        let target = Target::for_protocol(&snapshot, protocol);
        let started = Instant::now();
        let cpu_before = process_cpu_ms();
        let server_cpu_before = threads_cpu_ms(SERVER_THREAD);
        server.desired.publish(snapshot.clone());
        let reached = wait_all(&fleet, &target, CHANGE_TIMEOUT)
            .await
            .with_context(|| format!("change {change}"))?;
        let last = reached.iter().max().copied().unwrap_or(started);
        times.push(last.saturating_duration_since(started).as_secs_f64() * 1000.0);
        let acked = wait_server_synced(server, clients, &snapshot, started).await?;
        server_times.push(acked.as_secs_f64() * 1000.0);
        cpu_times.push(process_cpu_ms() - cpu_before);
        server_cpu_times.push(threads_cpu_ms(SERVER_THREAD) - server_cpu_before);
    }
    Ok(FanoutResult {
        protocol: if in_parts {
            format!("{protocol:?} + VHDS")
        } else {
            format!("{protocol:?}")
        },
        clients,
        routes,
        changes,
        initial_sync_ms,
        p50_ms: quantile(&mut times, 0.5),
        max_ms: quantile(&mut times, 1.0),
        server_p50_ms: quantile(&mut server_times, 0.5),
        server_max_ms: quantile(&mut server_times, 1.0),
        cpu_ms_per_change: quantile(&mut cpu_times, 0.5),
        server_cpu_ms_per_change: quantile(&mut server_cpu_times, 0.5),
    })
}

#[derive(Serialize, Deserialize)]
pub struct MemoryResult {
    pub routes: usize,
    pub resources: usize,
    pub sotw_clients: usize,
    pub delta_clients: usize,
    /// VmHWM of the server process: its peak, translation included.
    pub peak_rss_mib: f64,
    /// VmRSS once every client is synced.
    pub rss_mib: f64,
}

/// What the server child prints once told its clients are synced.
#[derive(Serialize, Deserialize)]
struct ServerMemory {
    resources: usize,
    peak_rss_mib: f64,
    rss_mib: f64,
}

/// Runs a server holding `routes` routes in a child process (so the clients' memory is
/// not counted), syncs simulated clients from this one, then reads the child's memory.
pub async fn measure_memory(
    routes: usize,
    sotw: usize,
    delta: usize,
) -> anyhow::Result<MemoryResult> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--serve-only", &routes.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the server child")?;
    let result = memory_of_child(&mut child, routes, sotw, delta).await;
    let _ = child.kill().await;
    result
}

async fn memory_of_child(
    child: &mut Child,
    routes: usize,
    sotw: usize,
    delta: usize,
) -> anyhow::Result<MemoryResult> {
    let mut stdin = child.stdin.take().context("child stdin")?;
    let mut stdout = BufReader::new(child.stdout.take().context("child stdout")?);
    let mut line = String::new();
    stdout
        .read_line(&mut line)
        .await
        .context("reading the child's port")?;
    let port: u16 = line
        .trim()
        .parse()
        .with_context(|| format!("the child's port, got {line:?}"))?;
    let snapshot = translate(&synthetic::config(routes, 42)).snapshot;
    let clients = spawn_fleet(port, sotw, delta).await?;
    wait_all(&clients, &Target::of(&snapshot), SYNC_TIMEOUT)
        .await
        .context("syncing the clients of the server child")?;
    stdin
        .write_all(b"report\n")
        .await
        .context("asking the child for its memory")?;
    line.clear();
    stdout
        .read_line(&mut line)
        .await
        .context("reading the child's memory")?;
    let memory: ServerMemory = serde_json::from_str(&line)
        .with_context(|| format!("the child's memory report, got {line:?}"))?;
    Ok(MemoryResult {
        routes,
        resources: memory.resources,
        sotw_clients: sotw,
        delta_clients: delta,
        peak_rss_mib: memory.peak_rss_mib,
        rss_mib: memory.rss_mib,
    })
}

/// The child: serves `routes` routes on a free port (printed on stdout), then prints its
/// memory as JSON when a line arrives on stdin.
pub async fn serve_only(routes: usize) -> anyhow::Result<()> {
    let server = InProcessServer::start(Ordering::MakeBeforeBreak).await;
    // Held for the whole run, as a builder holds it: its inputs and indexes count too.
    let mut translator = Translator::new();
    let snapshot = Arc::new(translator.update(&synthetic::config(routes, 42)).snapshot);
    let resources = snapshot.len();
    server.desired.publish(snapshot);
    server.desired.open();
    println!("{}", server.port);
    std::io::stdout().flush()?;
    let mut line = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await
        .context("waiting for the parent")?;
    let memory = ServerMemory {
        resources,
        peak_rss_mib: status_mib("VmHWM:"),
        rss_mib: status_mib("VmRSS:"),
    };
    println!("{}", serde_json::to_string(&memory)?);
    Ok(())
}

/// User and system CPU time of this process so far (0 where there is no /proc).
fn process_cpu_ms() -> f64 {
    cpu_ms_of(Path::new("/proc/self/stat"))
}

/// CPU time so far of this process's threads named `name` (0 where there is no /proc).
fn threads_cpu_ms(name: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.trim() == name)
        })
        .map(|task| cpu_ms_of(&task.path().join("stat")))
        .sum()
}

/// User and system CPU time from a /proc `stat` file.
fn cpu_ms_of(path: &Path) -> f64 {
    let Ok(stat) = std::fs::read_to_string(path) else {
        return 0.0;
    };
    // Fields after the command name (which may contain spaces): utime and stime are
    // the 14th and 15th fields, in clock ticks of 1/100 s.
    let after_name = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) * 10.0
}

/// A memory line of /proc/self/status, in MiB (0 where there is no /proc).
fn status_mib(key: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q).round() as usize]
}
