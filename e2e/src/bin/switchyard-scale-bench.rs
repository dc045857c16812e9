//! Switchyard at scale on a real kube-apiserver with one real Envoy: N TrafficRoutes, each
//! on a Service of its own (one EndpointSlice each, all pointing at one real backend).
//! Prints, for a cold start of the operator: the watches' initial lists, xDS serving the
//! full snapshot, every route answering through the Envoy, every route Ready, the status writes it
//! took, the operator's peak RSS and CPU, and what the API server stores; then one route
//! changed at that size (apply → Ready); then a restart after the statuses of M routes
//! were wiped while the operator was down: xDS served long before the status rewrites end
//! (I5), and how long those take at the default status QPS.
//!
//! `switchyard-scale-bench [ROUTES (10000)] [RESTART_ROUTES (2000)]`, run by
//! `e2e/bench.sh --scale` with the release `switchyard` ($SWITCHYARD_BIN).

use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, ResourceExt as _};
use switchyard::api::{ProxyConfig, TrafficRoute, TrafficRouteSpec};
use switchyard_e2e::kube as k;
use switchyard_e2e::rig::Rig;
use switchyard_e2e::served;

/// API requests in flight while the bench creates objects.
const PARALLEL: usize = 32;
/// The operator's default status QPS (`--status-qps`).
const STATUS_QPS: f64 = 20.0;

/// The host of route `r<i>`.
fn host(i: usize) -> String {
    format!("r{i}.test")
}

fn route_spec(host: &str, service: &str) -> TrafficRouteSpec {
    serde_json::from_value(serde_json::json!({
        "hosts": [host],
        "rules": [{ "backends": [{ "service": service, "port": 80 }] }],
    }))
    .expect("a valid spec")
}

/// A Service of one port, as [`k::apply_service`] makes, but headless: the rig's API
/// server has a few hundred cluster IPs, and Switchyard reads only ports and slices.
async fn headless_service(client: &kube::Client, namespace: &str, name: &str) {
    let service: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "clusterIP": "None",
            "ports": [{ "name": k::PORT_NAME, "port": 80, "protocol": "TCP" }],
        },
    }))
    .expect("a Service");
    Api::<Service>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::apply("scale-bench").force(),
            &Patch::Apply(&service),
        )
        .await
        .unwrap_or_else(|e| panic!("apply service {namespace}/{name}: {e}"));
}

/// Services s0..s{n}, each with a slice listing the one backend, and routes r{i} → s{i}.
async fn create_objects(rig: &Rig, n: usize, backend: std::net::SocketAddr) {
    let address = backend.ip().to_string();
    let routes: Api<TrafficRoute> = Api::namespaced(rig.client.clone(), &rig.namespace);
    futures::stream::iter(0..n)
        .map(|i| {
            let (client, namespace, routes, address) = (
                rig.client.clone(),
                rig.namespace.clone(),
                routes.clone(),
                address.clone(),
            );
            async move {
                let service = format!("s{i}");
                headless_service(&client, &namespace, &service).await;
                k::apply_endpoint_slice(
                    &client,
                    &namespace,
                    &service,
                    &[(&address, backend.port(), true, true, false)],
                )
                .await;
                let spec = route_spec(&host(i), &service);
                routes
                    .create(
                        &PostParams::default(),
                        &TrafficRoute::new(&format!("r{i}"), spec),
                    )
                    .await
                    .expect("create route");
            }
        })
        .buffer_unordered(PARALLEL)
        .collect::<Vec<()>>()
        .await;
}

/// Whether the route's status says Ready for its current generation.
fn is_ready(route: &TrafficRoute) -> bool {
    let generation = route.metadata.generation;
    route.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == "Ready" && c.status == "True" && c.observed_generation == generation
        })
    })
}

/// Watches the routes until `target` of them are Ready (or `within` after `since`): the
/// time from `since` it took, or None. A watch, not a list every second: a list of 10k
/// routes costs the API server as much as hundreds of the status writes it would time.
async fn until_ready(
    routes: &Api<TrafficRoute>,
    target: usize,
    (since, within): (Instant, Duration),
) -> Option<Duration> {
    let mut ready = std::collections::HashSet::new();
    let mut events = std::pin::pin!(
        watcher(routes.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects()
    );
    let watching = async {
        while let Some(route) = events.next().await {
            let Ok(route) = route else { continue };
            if is_ready(&route) {
                ready.insert(route.name_any());
            } else {
                ready.remove(&route.name_any());
            }
            if ready.len() >= target {
                return Some(since.elapsed());
            }
        }
        None
    };
    tokio::time::timeout(within.saturating_sub(since.elapsed()), watching)
        .await
        .ok()
        .flatten()
}

/// The xDS responses the operator has sent, those its Envoys have answered (ACK or NACK),
/// and the statuses it has yet to write, from its metrics: read there, not from Envoy's
/// counters, whose admin page takes Envoy's main thread most of a second at 10k routes.
async fn operator_work(operator: &switchyard_e2e::Switchyard) -> Option<(u64, u64, u64)> {
    let metrics = reqwest::get(operator.admin_url("/metrics")).await.ok()?;
    let metrics = metrics.text().await.ok()?;
    let sum = |name: &str| -> u64 {
        (metrics.lines())
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    };
    let answered = sum("switchyard_xds_acks_total") + sum("switchyard_xds_nacks_total");
    let statuses = sum("switchyard_status_writes_pending");
    Some((sum("switchyard_xds_pushes_total"), answered, statuses))
}

/// Waits until the operator has sent the Envoy no xDS response for `quiet`, the Envoy has
/// answered every one, and no status waits to be written, and says how long that took:
/// after a cold start, retired probe configurations and drained clusters are still being
/// removed when every route is Ready, each removal rebuilding the route table, and the
/// statuses saying so wait their turn at the status QPS. A change measured before that
/// waits behind them.
async fn until_envoy_quiet(
    operator: &switchyard_e2e::Switchyard,
    quiet: Duration,
    (since, within): (Instant, Duration),
) -> Option<Duration> {
    let mut last = operator_work(operator).await;
    let mut unchanged_since = Instant::now();
    while since.elapsed() < within {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = operator_work(operator).await;
        let idle = now.is_some_and(|(sent, answered, statuses)| answered >= sent && statuses == 0);
        if now != last || !idle {
            (last, unchanged_since) = (now, Instant::now());
        } else if unchanged_since.elapsed() >= quiet {
            return Some(unchanged_since.duration_since(since));
        }
    }
    None
}

/// The first line of the operator's log containing `text`: its time, as an offset from
/// `since` (the log's timestamps are RFC 3339, UTC).
fn logged_at(log: &str, text: &str, since: SystemTime) -> Option<Duration> {
    let line = log.lines().find(|l| l.contains(text))?;
    let stamp: k8s_openapi::jiff::Timestamp = line.split_whitespace().next()?.parse().ok()?;
    let at = SystemTime::UNIX_EPOCH
        + Duration::try_from(stamp.duration_since(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
            .ok()?;
    at.duration_since(since).ok()
}

/// Peak resident memory (MiB) and CPU time (s) of a process, from /proc.
fn rss_and_cpu(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let peak_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    (peak_kib / 1024.0, ticks / 100.0)
}

/// Objects of one kind in the namespace: a list of one, and the count the API server says
/// remains.
async fn count<K>(api: &Api<K>) -> u64
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(list) => {
            let rest = list.metadata.remaining_item_count.unwrap_or(0);
            list.items.len() as u64 + u64::try_from(rest).unwrap_or(0)
        }
        Err(_) => 0,
    }
}

/// What the API server stores for the bench's namespace, per kind.
async fn stored_objects(rig: &Rig) -> Vec<(&'static str, u64)> {
    let (client, ns) = (rig.client.clone(), rig.namespace.as_str());
    vec![
        (
            "TrafficRoute",
            count(&Api::<TrafficRoute>::namespaced(client.clone(), ns)).await,
        ),
        (
            "ProxyConfig",
            count(&Api::<ProxyConfig>::namespaced(client.clone(), ns)).await,
        ),
        (
            "Service",
            count(&Api::<Service>::namespaced(client.clone(), ns)).await,
        ),
        (
            "EndpointSlice",
            count(&Api::<EndpointSlice>::namespaced(client.clone(), ns)).await,
        ),
        ("Event", count(&Api::<Event>::namespaced(client, ns)).await),
    ]
}

/// The command lines of this machine's processes: (pid, arguments).
fn processes() -> Vec<(u32, Vec<String>)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Some((pid, args))
        })
        .collect()
}

/// The rig's API server (the one serving its port): pid and `--etcd-servers`.
fn api_server(rig: &Rig) -> Option<(u32, String)> {
    let port = rig.api.server.rsplit(':').next()?;
    let secure_port = format!("--secure-port={port}");
    processes().into_iter().find_map(|(pid, args)| {
        if !args.iter().any(|a| a == &secure_port) {
            return None;
        }
        let etcd = args
            .iter()
            .find_map(|a| a.strip_prefix("--etcd-servers="))?;
        Some((pid, etcd.to_owned()))
    })
}

/// The etcd serving `url`.
fn etcd_pid(url: &str) -> Option<u32> {
    processes().into_iter().find_map(|(pid, args)| {
        args.windows(2)
            .any(|w| w[0] == "--listen-client-urls" && w[1] == url)
            .then_some(pid)
    })
}

fn etcd_url(rig: &Rig) -> Option<String> {
    api_server(rig).map(|(_, url)| url)
}

/// CPU seconds each process of the rig used so far: where the machine's time went.
fn rig_cpu(rig: &Rig, operator: u32) -> Vec<(&'static str, f64)> {
    let api = api_server(rig);
    let etcd = api.as_ref().and_then(|(_, url)| etcd_pid(url));
    [
        ("operator", Some(operator)),
        ("kube-apiserver", api.map(|(pid, _)| pid)),
        ("etcd", etcd),
        ("Envoy", Some(rig.envoys[0].process.pid())),
    ]
    .into_iter()
    .filter_map(|(what, pid)| Some((what, rss_and_cpu(pid?).1)))
    .collect()
}

/// The etcd database's size and the part of it in use (MiB), from etcd's metrics.
async fn etcd_size(rig: &Rig) -> Option<(f64, f64)> {
    let url = etcd_url(rig)?;
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let metric = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .map(|b| b / 1024.0 / 1024.0)
    };
    Some((
        metric("etcd_mvcc_db_total_size_in_bytes")?,
        metric("etcd_mvcc_db_total_size_in_use_in_bytes")?,
    ))
}

fn status_writes(log: &str) -> usize {
    log.lines().filter(|l| l.contains("status written")).count()
}

fn row(what: &str, value: String, target: &str) {
    println!("| {what} | {value} | {target} |");
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("not within the bench's wait".to_owned(), |d| {
        format!("{:.2} s", d.as_secs_f64())
    })
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let m: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000)
        .min(n);
    let mut rig = Rig::start(1).await;
    let backend = rig.add_backend("app").await.address;
    let created = Instant::now();
    create_objects(&rig, n, backend).await;
    let created = created.elapsed();
    let routes: Api<TrafficRoute> = Api::namespaced(rig.client.clone(), &rig.namespace);
    // Every route Ready at the default status QPS, plus a margin for this machine.
    let all_ready_within = Duration::from_secs_f64(n as f64 / STATUS_QPS * 2.0 + 120.0);

    println!("| {n} routes, {n} Services and EndpointSlices, 1 Envoy | figure | target |");
    println!("|---|---|---|");
    row(
        "objects created (bench, 32 requests at once)",
        format!("{:.1} s", created.as_secs_f64()),
        "",
    );

    // Cold start.
    let started = SystemTime::now();
    let start = Instant::now();
    rig.start_operator("scale-1", &[]);
    let xds_port = rig.operator("scale-1").xds_port;
    let hosts: Vec<String> = (0..n).map(host).collect();
    let target = rig.targets()[0].clone();
    let answers = served::every_host_served(target, hosts, (start, all_ready_within)).await;
    let envoy_holds = answers.ok().and_then(|reached| reached.every);
    let all_ready = until_ready(&routes, n, (start, all_ready_within)).await;
    let log = std::fs::read_to_string(&rig.operator("scale-1").process.log).unwrap_or_default();
    let lists = logged_at(&log, "every watcher has its initial list", started);
    let serving = logged_at(&log, "first full snapshot built: serving xDS", started);
    row("operator start → watches' initial lists", secs(lists), "");
    row(
        "operator start → xDS serving the full snapshot",
        secs(serving),
        "≤ 5 s after the initial lists",
    );
    if let (Some(lists), Some(serving)) = (lists, serving) {
        row(
            "initial lists → xDS serving",
            format!("{:.2} s", serving.saturating_sub(lists).as_secs_f64()),
            "≤ 5 s",
        );
    }
    row(
        "operator start → every route answers 2xx through the Envoy",
        secs(envoy_holds),
        "",
    );
    row(
        &format!("operator start → every route Ready (status QPS {STATUS_QPS})"),
        secs(all_ready),
        "",
    );
    row(
        "status writes",
        format!("{} for {n} routes", status_writes(&log)),
        "only routes whose status changed",
    );
    let operator = rig.operator("scale-1").process.pid();
    let (rss, _) = rss_and_cpu(operator);
    row("operator peak RSS", format!("{rss:.0} MiB"), "");
    let cpu = rig_cpu(&rig, operator);
    row(
        "CPU, from the objects' creation to all Ready",
        cpu.iter()
            .map(|(what, s)| format!("{what} {s:.1} s"))
            .collect::<Vec<_>>()
            .join(", "),
        "",
    );
    for (kind, count) in stored_objects(&rig).await {
        row(
            &format!("API server objects: {kind}"),
            count.to_string(),
            "",
        );
    }
    let etcd = etcd_size(&rig).await;
    row(
        "etcd database: size, in use",
        etcd.map_or("unknown".to_owned(), |(size, used)| {
            format!("{size:.1} MiB, {used:.1} MiB")
        }),
        "",
    );

    // One route changed at this size, once the cold start has settled: to another route's
    // Service and back.
    let settled = until_envoy_quiet(
        rig.operator("scale-1"),
        Duration::from_secs(3),
        (start, all_ready_within + Duration::from_secs(180)),
    )
    .await;
    row(
        "operator start → no xDS update for 3 s, no status left to write",
        secs(settled),
        "",
    );
    let mut changes = Vec::new();
    for i in 0..5 {
        let service = if i % 2 == 0 { "s1" } else { "s0" };
        let spec = route_spec(&host(0), service);
        routes
            .patch(
                "r0",
                &PatchParams::apply("scale-bench").force(),
                &Patch::Apply(&serde_json::json!({
                    "apiVersion": "switchyard.dev/v1alpha1",
                    "kind": "TrafficRoute",
                    "spec": spec,
                })),
            )
            .await
            .expect("change r0");
        changes.push(
            rig.wait_ready("r0", Duration::from_secs(60))
                .await
                .as_secs_f64()
                * 1000.0,
        );
    }
    changes.sort_by(f64::total_cmp);
    row(
        &format!("one route changed at {n}: apply → Ready (5 changes)"),
        format!(
            "p50 {:.0} ms, max {:.0} ms",
            changes[changes.len() / 2],
            changes[changes.len() - 1]
        ),
        "",
    );

    // Restart with M statuses to rewrite.
    rig.kill_operator("scale-1");
    futures::stream::iter(0..m)
        .map(|i| {
            let routes = routes.clone();
            async move {
                routes
                    .patch_status(
                        &format!("r{i}"),
                        &PatchParams::default(),
                        &Patch::Merge(serde_json::json!({ "status": null })),
                    )
                    .await
                    .expect("wipe a status");
            }
        })
        .buffer_unordered(PARALLEL)
        .collect::<Vec<()>>()
        .await;
    let restarted = SystemTime::now();
    let restart = Instant::now();
    rig.start_operator_on("scale-2", xds_port, &[]);
    let rewritten = until_ready(&routes, n, (restart, all_ready_within)).await;
    let log = std::fs::read_to_string(&rig.operator("scale-2").process.log).unwrap_or_default();
    let serving = logged_at(&log, "first full snapshot built: serving xDS", restarted);
    row(
        &format!("restart, {m} statuses wiped: start → xDS serving"),
        secs(serving),
        "before the status writes end",
    );
    row(
        &format!("restart: start → all {m} statuses rewritten (status QPS {STATUS_QPS})"),
        secs(rewritten),
        "",
    );
    row(
        "restart: status writes",
        status_writes(&log).to_string(),
        &format!("{m}"),
    );
}
