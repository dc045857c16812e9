//! Translation time, full and incremental, and peak memory, in a child process per size.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use serde::{Deserialize, Serialize};
use switchyard::api::ProxyConfig;
use switchyard::api::proxy_config::ResolvedBackend;
use switchyard::k8s::model_cache::{ModelCache, ObjectMaps, Settings, Step, Touched, key_of};
use switchyard::k8s::to_model::{self, Inputs, TlsData};
use switchyard::model::{
    Cluster, Config, EndpointCondition, ListenerSettings, RouteAction, ServiceRef, WeightedCluster,
    cluster_name,
};
use switchyard::translate::{Changes, Edit, Translator, translate};
use switchyard_e2e::synthetic;

/// Changes measured per kind of incremental rebuild.
const CHANGES: usize = 50;

#[derive(Serialize, Deserialize)]
pub struct TranslationResult {
    pub routes: usize,
    pub clusters: usize,
    pub endpoints: usize,
    pub resources: usize,
    pub best_ms: f64,
    pub median_ms: f64,
    pub peak_rss_mib: f64,
    /// Incremental rebuilds after one change, median and p90 over [`CHANGES`].
    pub incremental: Vec<IncrementalResult>,
}

#[derive(Serialize, Deserialize)]
pub struct IncrementalResult {
    pub change: String,
    pub median_ms: f64,
    pub p90_ms: f64,
}

/// One full translation of `routes` synthetic routes: what it made, and in how long.
pub fn translate_once(routes: usize) -> String {
    let config = synthetic::config(routes, 42);
    let started = Instant::now();
    let translation = translate(&config);
    let elapsed = started.elapsed();
    format!(
        "{routes} routes: {} resources in {:.1} ms",
        translation.snapshot.len(),
        elapsed.as_secs_f64() * 1000.0
    )
}

pub fn measure_translation(routes: usize) -> TranslationResult {
    let config = synthetic::config(routes, 42);
    let mut times = Vec::new();
    let mut resources = 0;
    for _ in 0..5 {
        let started = Instant::now();
        let translation = translate(&config);
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        resources = translation.snapshot.len();
    }
    times.sort_by(f64::total_cmp);
    TranslationResult {
        routes,
        clusters: config.clusters.len(),
        endpoints: config.clusters.iter().map(|c| c.endpoints.len()).sum(),
        resources,
        best_ms: times[0],
        median_ms: times[times.len() / 2],
        peak_rss_mib: peak_rss_mib(),
        incremental: {
            let mut results = measure_incremental(&config);
            results.extend(measure_operator_path(routes));
            results
        },
    }
}

fn operator_inputs<'a>(
    listeners: &ListenerSettings,
    proxy_configs: &'a [ProxyConfig],
    slices: &'a [EndpointSlice],
    secrets: &'a BTreeMap<(String, String), TlsData>,
) -> Inputs<'a> {
    Inputs {
        listeners: listeners.clone(),
        proxy_configs: proxy_configs.iter().collect(),
        endpoint_slices: slices.iter().collect(),
        secrets,
    }
}

/// One build as the operator's builder does it: the objects the watchers named, looked
/// up in their stores.
fn operator_step(
    cache: &mut ModelCache,
    translator: &mut Translator,
    settings: &Settings<'_>,
    touched: &Touched,
    objects: &ObjectMaps,
) {
    let clusters = |name: &str| translator.cluster(name);
    let step = cache.step(settings, touched, (objects, &clusters));
    match step {
        Some((Step::Changes(changes), _)) => translator.apply(changes),
        _ => unreachable!("a slice or a route change at this size is incremental"),
    };
}

/// An EndpointSlice or route change as the operator's builder takes it: from the
/// Kubernetes objects to the new snapshot, now (the changed object looked up, model cache +
/// `apply`) and before (a whole model built from every object, then `update`).
fn measure_operator_path(routes: usize) -> Vec<IncrementalResult> {
    let (proxy_configs, mut slices) = synthetic::k8s_objects(routes, 42);
    let listeners = synthetic::config(1, 42).listeners;
    let secrets = BTreeMap::new();
    let settings = Settings {
        listeners: &listeners,
        secrets: &secrets,
    };
    // One endpoint of one slice flips readiness, under a new resourceVersion.
    let mut version = 1;
    let mut change_one = |slices: &mut [EndpointSlice], i: usize| -> usize {
        version += 1;
        let n = (i * 104_729) % slices.len();
        let slice = &mut slices[n];
        slice.metadata.resource_version = Some(version.to_string());
        if let Some(endpoint) = slice.endpoints.iter_mut().flatten().next()
            && let Some(conditions) = endpoint.conditions.as_mut()
        {
            conditions.ready = Some(!conditions.ready.unwrap_or(true));
        }
        n
    };
    let mut results = Vec::new();

    let mut cache = ModelCache::default();
    let mut translator = Translator::new();
    let (Step::Full(config), _) = cache.full(&operator_inputs(
        &listeners,
        &proxy_configs,
        &slices,
        &secrets,
    )) else {
        unreachable!("a full build");
    };
    // (Clusters are a tenth more: a split's second Service is looked up in the route's
    // own namespace, as Kubernetes would.)
    assert_eq!(
        config.virtual_hosts.len(),
        routes,
        "the synthetic objects make one virtual host per route"
    );
    translator.update(&config);
    let pc_refs: Vec<&ProxyConfig> = proxy_configs.iter().collect();
    let slice_refs: Vec<&EndpointSlice> = slices.iter().collect();
    // The watchers' stores.
    let mut objects = ObjectMaps::new(&pc_refs, &slice_refs);
    let times = timed(|i| {
        let n = change_one(&mut slices, i);
        let key = key_of(&slices[n]);
        // The reflector's part: the new object in its store, the key in the change set.
        objects
            .endpoint_slices
            .insert(key.clone(), Arc::new(slices[n].clone()));
        let touched = Touched {
            endpoint_slices: [key].into(),
            ..Touched::default()
        };
        let started = Instant::now();
        operator_step(&mut cache, &mut translator, &settings, &touched, &objects);
        started.elapsed()
    });
    results.push(incremental(
        "one EndpointSlice, operator (model cache + apply)",
        times,
    ));

    // A route switched to another route's Service (a rollout's live step).
    let mut proxy_configs = proxy_configs.clone();
    let mut pc_version = 1;
    let times = timed(|i| {
        pc_version += 1;
        let n = (i * 7919) % proxy_configs.len();
        let other = proxy_configs[(n + 1) % proxy_configs.len()].spec.clusters[0].clone();
        let pc = &mut proxy_configs[n];
        pc.metadata.resource_version = Some(pc_version.to_string());
        if let Some(rule) = pc
            .spec
            .virtual_host
            .as_mut()
            .and_then(|v| v.rules.first_mut())
        {
            rule.backends = vec![ResolvedBackend {
                cluster: other.clone(),
                weight: 1,
                request_headers: None,
            }];
        }
        pc.spec.clusters = vec![other];
        let key = key_of(&*pc);
        objects
            .proxy_configs
            .insert(key.clone(), Arc::new(pc.clone()));
        let touched = Touched {
            proxy_configs: [key].into(),
            ..Touched::default()
        };
        let started = Instant::now();
        operator_step(&mut cache, &mut translator, &settings, &touched, &objects);
        started.elapsed()
    });
    results.push(incremental(
        "one route → another Service, operator (model cache + apply)",
        times,
    ));

    let mut translator = Translator::new();
    translator.update(
        &to_model::build(&operator_inputs(
            &listeners,
            &proxy_configs,
            &slices,
            &secrets,
        ))
        .0,
    );
    let times = timed(|i| {
        change_one(&mut slices, i);
        let started = Instant::now();
        translator.update(
            &to_model::build(&operator_inputs(
                &listeners,
                &proxy_configs,
                &slices,
                &secrets,
            ))
            .0,
        );
        started.elapsed()
    });
    results.push(incremental(
        "one EndpointSlice, operator before (whole model + update)",
        times,
    ));
    results
}

/// One change at a time on a translator that holds the whole configuration.
fn measure_incremental(config: &Config) -> Vec<IncrementalResult> {
    let mut translator = Translator::new();
    translator.update(config);
    let mut results = Vec::new();

    // A route switched to a brand-new Service: one cluster added, one virtual host changed.
    let times = timed(|i| {
        let n = (i * 7919) % config.virtual_hosts.len();
        let mut cluster = config.clusters[n].clone();
        cluster.service = ServiceRef {
            namespace: cluster.service.namespace.clone(),
            name: format!("fresh-{i}"),
            port: 8080,
        };
        cluster.name = cluster_name(&cluster.service, &cluster.settings);
        let mut vhost = config.virtual_hosts[n].clone();
        if let RouteAction::Forward(f) = &mut vhost.routes[0].action {
            f.backends = vec![WeightedCluster {
                cluster: cluster.name.clone(),
                weight: 1,
                request_headers: Default::default(),
            }];
        }
        let changes = Changes {
            clusters: vec![Edit::Put(cluster)],
            virtual_hosts: vec![Edit::Put(vhost)],
            ..Changes::default()
        };
        let started = Instant::now();
        translator.apply(changes);
        started.elapsed()
    });
    results.push(incremental("route → new Service (apply)", times));

    // An EndpointSlice change: one endpoint of one cluster stops being ready.
    let times = timed(|i| {
        let mut cluster: Cluster = config.clusters[(i * 104_729) % config.clusters.len()].clone();
        let e = i % cluster.endpoints.len();
        cluster.endpoints[e].condition = EndpointCondition {
            ready: i % 2 == 0,
            serving: true,
            terminating: false,
        };
        let changes = Changes {
            clusters: vec![Edit::Put(cluster)],
            ..Changes::default()
        };
        let started = Instant::now();
        translator.apply(changes);
        started.elapsed()
    });
    results.push(incremental("one endpoint (apply)", times));

    // The same, given the whole configuration: every input is compared to find the change.
    let mut current = config.clone();
    let times = timed(|i| {
        let n = (i * 104_729) % current.clusters.len();
        let e = i % current.clusters[n].endpoints.len();
        current.clusters[n].endpoints[e].condition.ready ^= true;
        let started = Instant::now();
        translator.update(&current);
        started.elapsed()
    });
    results.push(incremental(
        "one endpoint (update: diff whole config)",
        times,
    ));
    results
}

fn timed(mut run: impl FnMut(usize) -> std::time::Duration) -> Vec<f64> {
    let mut times: Vec<f64> = (0..CHANGES)
        .map(|i| run(i + 1).as_secs_f64() * 1000.0)
        .collect();
    times.sort_by(f64::total_cmp);
    times
}

fn incremental(change: &str, times: Vec<f64>) -> IncrementalResult {
    IncrementalResult {
        change: change.to_owned(),
        median_ms: times[times.len() / 2],
        p90_ms: times[(times.len() * 9) / 10],
    }
}

pub fn print_table(results: &[TranslationResult]) {
    println!(
        "| translation | clusters | endpoints | resources | best ms | median ms | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for t in results {
        println!(
            "| {} routes | {} | {} | {} | {:.1} | {:.1} | {:.1} |",
            t.routes, t.clusters, t.endpoints, t.resources, t.best_ms, t.median_ms, t.peak_rss_mib
        );
    }
    println!();
    println!("| incremental rebuild, one change | routes | median ms | p90 ms |");
    println!("|---|---|---|---|");
    for t in results {
        for i in &t.incremental {
            println!(
                "| {} | {} | {:.3} | {:.3} |",
                i.change, t.routes, i.median_ms, i.p90_ms
            );
        }
    }
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
