//! The scale rows: N HTTPRoutes created at once on a system that serves one route, each
//! its own hostname (`r<i>.scale.test`), all on Gateway `edge` and all to the one backend
//! Service [`super::scenarios::prepare`] made (so that Services and Pods do not multiply). Timed
//! from just before the first create: to every route answering 2xx through the Gateway's
//! address, from inside the node's namespace as the scenarios' load is sent; to every
//! route showing the system's own "done" ([`System::done_condition`]). The control plane's
//! CPU time and memory are read from /proc ([`super::usage`]) before the first create, when
//! every route is served and at the end. Then one Envoy Pod
//! is deleted (grace 0) and its replacement is timed to every route: how long a new
//! Envoy takes to get all N routes from the control plane.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, ResourceExt as _};
use serde_json::Value;
use switchyard::gateway::api::httproutes::HttpRoute;

use super::scenarios::is_done;
use super::systems::System;
use super::usage::{self, ProcessSample};
use crate::load::traffic_runtime;
use crate::node::Node;
use crate::served::{Reached, every_host_served, unserved};

/// The sizes run unless told otherwise.
pub const DEFAULT_SIZES: [usize; 2] = [1000, 5000];
/// How long a system gets to serve every route (and to say it is done with each; and a
/// replacement Envoy, to serve them all): past it, how many it got to is reported.
pub const WITHIN: Duration = Duration::from_secs(600);
/// How many times a create refused for load is tried.
const CREATE_ATTEMPTS: u32 = 5;
/// Route creations in flight at once.
const CREATING_AT_ONCE: usize = 32;
/// Every route goes to this Service: the backend [`super::scenarios::prepare`] made.
const BACKEND: &str = "svc-0";
/// The label the routes carry, for the watch of their status.
const LABEL: &str = "compare-scale";

/// The hostname of route `r<i>`.
pub fn host(i: usize) -> String {
    format!("r{i}.scale.test")
}

/// The control plane's processes over the run.
#[derive(Clone, Debug)]
pub struct Usage {
    /// Just before the first create.
    pub before: Vec<ProcessSample>,
    /// When every route was served (or the time was up).
    pub at_served: Vec<ProcessSample>,
    /// When every route was both served and done (or the time was up).
    pub at_end: Vec<ProcessSample>,
}

/// What one size measured on one system.
#[derive(Clone, Debug)]
pub struct ScaleOutcome {
    pub system: System,
    pub routes: usize,
    /// From the first create to the last one answered by the API.
    pub created_in: Duration,
    /// Every route answering 2xx through the Gateway's address.
    pub served: Reached,
    /// Every route showing the system's done condition.
    pub done: Reached,
    /// Routes that did not answer 2xx in one pass over all of them after every one had:
    /// 0 unless one stopped being served.
    pub unserved_at_check: Option<usize>,
    pub usage: Usage,
    /// One Envoy Pod deleted → its replacement serves every route; None when that could
    /// not be measured (said on stderr).
    pub replacement: Option<Reached>,
}

/// Creates `routes` HTTPRoutes on `system` (installed and prepared, its Gateway at `url`)
/// and measures them; see the module's comment.
pub async fn run(
    node: &Node,
    system: System,
    url: &str,
    routes: usize,
) -> anyhow::Result<ScaleOutcome> {
    let client = node.api().client().await;
    let namespace = system.namespace();
    let api: Api<HttpRoute> = Api::namespaced(client.clone(), &namespace);
    let hosts: Vec<String> = (0..routes).map(host).collect();
    let pids = usage::control_plane_pids(node, system).await?;
    eprintln!("   {routes} routes; the control plane's processes: {pids:?}");
    let before = usage::sample(&pids);
    let started = Instant::now();
    // The probes run on the traffic runtime, apart from this thread's API calls, so that
    // these do not delay the moment a route is seen served.
    let prober = traffic_runtime().spawn(every_host_served(
        url.to_owned(),
        hosts.clone(),
        (started, WITHIN),
    ));
    let stop_probing = prober.abort_handle();
    let served = async {
        let served = prober.await.context("the probes of every route")??;
        // The moment every route is served (or the time is up): the control plane's
        // work for it ends here.
        Ok::<_, anyhow::Error>((served, usage::sample(&pids)))
    };
    let joined = tokio::try_join!(
        create_routes(&api, &namespace, routes),
        every_route_done(api.clone(), system, routes, started),
        served,
    );
    if joined.is_err() {
        stop_probing.abort();
    }
    let (created_in, done, (served, at_served)) = joined?;
    let at_end = usage::sample(&pids);
    let unserved_at_check = match served.every {
        Some(_) => Some(
            traffic_runtime()
                .spawn(unserved(url.to_owned(), hosts.clone(), WITHIN))
                .await
                .context("the check of every route")??,
        ),
        None => None,
    };
    let replacement = match envoy_replacement(&client, url, &hosts).await {
        Ok(reached) => Some(reached),
        Err(error) => {
            eprintln!(
                "   {}: an Envoy's replacement not measured: {error:#}",
                system.name()
            );
            None
        }
    };
    Ok(ScaleOutcome {
        system,
        routes,
        created_in,
        served,
        done,
        unserved_at_check,
        usage: Usage {
            before,
            at_served,
            at_end,
        },
        replacement,
    })
}

/// Creates routes `r0` … `r<n-1>` through the API, [`CREATING_AT_ONCE`] at a time; how
/// long from the first create until the last was answered.
async fn create_routes(
    api: &Api<HttpRoute>,
    namespace: &str,
    n: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    futures::stream::iter((0..n).map(Ok))
        .try_for_each_concurrent(CREATING_AT_ONCE, |i| async move {
            let route = route(namespace, i)?;
            create_with_retries(api, &route)
                .await
                .with_context(|| format!("create httproute/r{i} in {namespace}"))
        })
        .await?;
    Ok(started.elapsed())
}

/// Creates `route`, again after a refusal for load (429, 5xx) or a lost answer, at most
/// [`CREATE_ATTEMPTS`] times: one such answer among thousands of creates would otherwise
/// lose the system's row. A create that got through before its answer was lost is
/// answered 409 the next time: it is there.
async fn create_with_retries(api: &Api<HttpRoute>, route: &HttpRoute) -> anyhow::Result<()> {
    let mut pause = Duration::from_millis(200);
    let mut attempt = 1;
    loop {
        match api.create(&PostParams::default(), route).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if attempt > 1 && status.code == 409 => return Ok(()),
            Err(error) if attempt < CREATE_ATTEMPTS && refused_for_load(&error) => {}
            Err(error) => {
                return Err(anyhow::Error::new(error).context(format!("attempt {attempt}")));
            }
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
        attempt += 1;
    }
}

/// An answer that says nothing about the route: the API server was busy, or the answer
/// never came.
fn refused_for_load(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        _ => true,
    }
}

/// HTTPRoute `r<i>` for [`host`]`(i)` on Gateway `edge`, to [`BACKEND`].
fn route(namespace: &str, i: usize) -> anyhow::Result<HttpRoute> {
    let route = serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {
            "name": format!("r{i}"),
            "namespace": namespace,
            "labels": { LABEL: "true" },
        },
        "spec": {
            "parentRefs": [{ "name": "edge" }],
            "hostnames": [host(i)],
            "rules": [{ "backendRefs": [{ "name": BACKEND, "port": 80 }] }],
        },
    });
    serde_json::from_value(route).context("an HTTPRoute of the scale rows")
}

/// Watches the routes' status until every one of the `n` shows the system's done
/// condition for its generation at once, or [`WITHIN`] from `started` passed.
async fn every_route_done(
    api: Api<HttpRoute>,
    system: System,
    n: usize,
    started: Instant,
) -> anyhow::Result<Reached> {
    let condition = system.done_condition();
    let config = watcher::Config::default().labels(&format!("{LABEL}=true"));
    let mut routes = std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
    let deadline = tokio::time::Instant::from_std(started + WITHIN);
    let mut done = BTreeSet::new();
    let mut watch_errors = 0_usize;
    loop {
        let next = tokio::time::timeout_at(deadline, routes.next()).await;
        let route = match next {
            Err(_) => {
                if watch_errors > 0 {
                    eprintln!("   the watch of the routes failed {watch_errors} times");
                }
                return Ok(Reached {
                    every: None,
                    count: done.len(),
                });
            }
            Ok(None) => anyhow::bail!("the watch of the HTTPRoutes ended"),
            // The watch starts over after a backoff; a status seen twice counts once. Said
            // once, and counted: a watch that keeps failing ends in "not within", and
            // the reason must be on record.
            Ok(Some(Err(error))) => {
                watch_errors += 1;
                if watch_errors == 1 {
                    eprintln!("   the watch of the routes failed (it starts over): {error}");
                }
                continue;
            }
            Ok(Some(Ok(route))) => route,
        };
        if is_done(&route, condition) {
            done.insert(route.name_any());
        } else {
            done.remove(&route.name_any());
        }
        if done.len() == n {
            return Ok(Reached {
                every: Some(started.elapsed()),
                count: n,
            });
        }
    }
}

/// Deletes one Envoy Pod behind the Gateway's address (grace 0: no drain, whatever each
/// system's own drain takes) and times its replacement, from the delete, until it
/// answers 2xx for every host on its own address. The Envoy Pods are the endpoints of the
/// Service whose ClusterIP is in `url`, found through its EndpointSlices, which list a
/// Pod once it has an address, ready or not.
async fn envoy_replacement(
    client: &kube::Client,
    url: &str,
    hosts: &[String],
) -> anyhow::Result<Reached> {
    let address = (url.strip_prefix("http://"))
        .and_then(|rest| rest.rsplit_once(':'))
        .map(|(ip, _)| ip)
        .with_context(|| format!("no address in {url}"))?;
    let services: Api<Service> = Api::all(client.clone());
    let services = (services.list(&ListParams::default()).await).context("list the Services")?;
    let service = (services.items.into_iter())
        .find(|s| (s.spec.as_ref()).and_then(|s| s.cluster_ip.as_deref()) == Some(address))
        .with_context(|| format!("no Service has the Gateway's address {address}"))?;
    let namespace = service
        .namespace()
        .context("the Gateway's Service has no namespace")?;
    let port_name = (service.spec.iter())
        .flat_map(|s| s.ports.iter().flatten())
        .find(|p| p.port == 80)
        .map(|p| p.name.clone().unwrap_or_default())
        .with_context(|| format!("Service {namespace}/{} has no port 80", service.name_any()))?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let selector = format!("kubernetes.io/service-name={}", service.name_any());
    let before = envoy_endpoints(&slices, &selector, &port_name).await?;
    let (victim, _) = before
        .first()
        .with_context(|| format!("no endpoint in the EndpointSlices {selector}"))?;
    eprintln!("   deleting Envoy Pod {namespace}/{victim}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let started = Instant::now();
    (pods.delete(victim, &now).await).with_context(|| format!("delete pod {victim}"))?;
    let target = loop {
        let endpoints = envoy_endpoints(&slices, &selector, &port_name).await?;
        let new = (endpoints.into_iter()).find(|(pod, _)| before.iter().all(|(old, _)| old != pod));
        if let Some((_, target)) = new {
            break target;
        }
        if started.elapsed() > WITHIN {
            return Ok(Reached {
                every: None,
                count: 0,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("   its replacement at {target}");
    let hosts = hosts.to_vec();
    traffic_runtime()
        .spawn(every_host_served(target, hosts, (started, WITHIN)))
        .await
        .context("the probes of the replacement Envoy")?
}

/// The Pods listed in the EndpointSlices `selector`, with `http://<address>:<port>` of
/// the slice port named `port_name`, sorted by Pod.
async fn envoy_endpoints(
    slices: &Api<EndpointSlice>,
    selector: &str,
    port_name: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let listed = (slices.list(&ListParams::default().labels(selector)).await)
        .with_context(|| format!("list the EndpointSlices {selector}"))?;
    let mut endpoints = Vec::new();
    for slice in listed.items {
        let port = (slice.ports.iter().flatten())
            .find(|p| p.name.as_deref().unwrap_or_default() == port_name)
            .and_then(|p| p.port);
        let Some(port) = port else {
            continue;
        };
        for endpoint in slice.endpoints.into_iter().flatten() {
            let pod = endpoint.target_ref.and_then(|r| r.name);
            if let (Some(pod), Some(address)) = (pod, endpoint.addresses.first()) {
                endpoints.push((pod, format!("http://{address}:{port}")));
            }
        }
    }
    endpoints.sort();
    Ok(endpoints)
}

/// One table per size, the systems side by side, as Markdown.
pub fn tables(outcomes: &[ScaleOutcome]) -> String {
    let mut sizes: Vec<usize> = outcomes.iter().map(|o| o.routes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut out = String::new();
    for size in sizes {
        let _ = writeln!(out, "\n### {size} HTTPRoutes\n");
        let _ = writeln!(
            out,
            "| system | control-plane processes | created through the API in s | first create → every route served s | → every route done s (condition) | control-plane CPU s: to every route served / to served and done | control-plane RSS before / after MiB | peak RSS MiB (VmHWM, each process since its start) | an Envoy Pod deleted → its replacement serves every route s |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
        for o in outcomes.iter().filter(|o| o.routes == size) {
            let u = &o.usage;
            let cpu = |after: &[ProcessSample]| {
                usage::cpu_seconds(&u.before, after).map_or_else(
                    || "— (a process restarted)".to_owned(),
                    |s| format!("{s:.1}"),
                )
            };
            let mib = |m: Option<f64>| m.map_or_else(|| "—".to_owned(), |m| format!("{m:.0}"));
            let mut served = reached(&o.served, o.routes);
            if let Some(unserved) = o.unserved_at_check.filter(|&n| n > 0) {
                let _ = write!(served, " ({unserved} not served at the check after)");
            }
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} | {} | {} ({}) | {} / {} | {:.0} / {} | {} | {} |",
                o.system.name(),
                u.before.len(),
                o.created_in.as_secs_f64(),
                served,
                reached(&o.done, o.routes),
                o.system.done_condition(),
                cpu(&u.at_served),
                cpu(&u.at_end),
                usage::rss_mib(&u.before),
                mib(usage::rss_mib_after(&u.before, &u.at_end)),
                mib(usage::peak_rss_mib(&u.before, &u.at_end)),
                o.replacement
                    .map_or_else(|| "n/a".to_owned(), |r| reached(&r, o.routes)),
            );
        }
    }
    out
}

/// Seconds to every route, or how many it got to within [`WITHIN`].
fn reached(r: &Reached, routes: usize) -> String {
    match r.every {
        Some(every) => format!("{:.1}", every.as_secs_f64()),
        None => format!(
            "not within {} s ({} of {routes})",
            WITHIN.as_secs(),
            r.count
        ),
    }
}

/// The outcome as JSON, durations in seconds, memory in KiB per process.
pub fn to_json(outcome: &ScaleOutcome) -> Value {
    let reached = |r: &Reached| {
        serde_json::json!({
            "every_s": r.every.map(|d| d.as_secs_f64()),
            "count": r.count,
        })
    };
    let processes = |samples: &[ProcessSample]| -> Vec<Value> {
        (samples.iter())
            .map(|s| {
                serde_json::json!({
                    "pid": s.pid,
                    "cpu_ticks": s.cpu_ticks,
                    "rss_kib": s.rss_kib,
                    "peak_rss_kib": s.peak_rss_kib,
                })
            })
            .collect()
    };
    let u = &outcome.usage;
    serde_json::json!({
        "system": outcome.system.key(),
        "routes": outcome.routes,
        "within_s": WITHIN.as_secs(),
        "created_s": outcome.created_in.as_secs_f64(),
        "served": reached(&outcome.served),
        "done": reached(&outcome.done),
        "done_condition": outcome.system.done_condition(),
        "unserved_at_check": outcome.unserved_at_check,
        "cpu_s_to_served": usage::cpu_seconds(&u.before, &u.at_served),
        "cpu_s_to_served_and_done": usage::cpu_seconds(&u.before, &u.at_end),
        "rss_mib_before": usage::rss_mib(&u.before),
        "rss_mib_after": usage::rss_mib_after(&u.before, &u.at_end),
        "peak_rss_mib": usage::peak_rss_mib(&u.before, &u.at_end),
        "processes_before": processes(&u.before),
        "processes_at_served": processes(&u.at_served),
        "processes_at_end": processes(&u.at_end),
        "envoy_replacement": outcome.replacement.as_ref().map(reached),
    })
}
