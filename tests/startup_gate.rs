//! The strict startup gate (I5) on a real kube-apiserver: after a restart, an Envoy's first
//! configuration already holds every route, and slow status writes never hold xDS back.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use switchyard::api::{ProxyConfig, ProxyConfigRole, TrafficRoute};
use switchyard::k8s::resolve::{proxy_config_spec, resolve_route};
use switchyard_e2e::Envoy;
use switchyard_e2e::rig::Rig;

/// Names of the user virtual hosts (`<namespace>/<route>`) in an Envoy's active route
/// configuration, or None while it has none.
async fn served_virtual_hosts(envoy: &Envoy, namespace: &str) -> Option<usize> {
    let dump = envoy
        .admin("/config_dump?resource=dynamic_route_configs")
        .await;
    let json: serde_json::Value = serde_json::from_str(&dump).ok()?;
    let configs = json["configs"].as_array()?;
    let vhosts = configs
        .iter()
        .flat_map(|c| {
            c["route_config"]["virtual_hosts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|v| {
            v["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&format!("{namespace}/")))
        })
        .count();
    (!configs.is_empty()).then_some(vhosts)
}

fn tls_secret(name: &str) -> Secret {
    let read = |file: &str| {
        let path = format!("{}/e2e/testdata/{file}", env!("CARGO_MANIFEST_DIR"));
        k8s_openapi::ByteString(std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
    };
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            [
                ("tls.crt".to_string(), read("tls.crt")),
                ("tls.key".to_string(), read("tls.key")),
            ]
            .into(),
        ),
        ..Default::default()
    }
}

#[tokio::test]
async fn after_a_restart_the_first_configuration_holds_every_route() {
    const ROUTES: usize = 40;
    let mut rig = Rig::start(1).await;
    rig.add_backend("app").await;
    rig.start_operator("switchyard-1", &[]);
    // Routes first, their TLS Secrets after: on a cold start the Secrets arrive last.
    for i in 0..ROUTES {
        let spec = format!(
            "hosts: [\"r{i}.test\"]\ntls: {{ secretName: cert-{i} }}\nrules:\n- backends: [ {{ service: app, port: 80 }} ]\n"
        );
        rig.apply_route(&format!("r{i}"), &spec).await;
    }
    let secrets: Api<Secret> = Api::namespaced(rig.client.clone(), &rig.namespace);
    for i in 0..ROUTES {
        secrets
            .create(&PostParams::default(), &tls_secret(&format!("cert-{i}")))
            .await
            .expect("create secret");
    }
    for i in 0..ROUTES {
        rig.wait_ready(&format!("r{i}"), Duration::from_secs(60))
            .await;
    }

    // Restart: a new Switchyard, and a brand-new Envoy whose very first configuration
    // comes from it.
    rig.operators.clear();
    rig.envoys.clear();
    rig.start_operator("switchyard-2", &[]);
    let started = Instant::now();
    let first = loop {
        if let Some(count) = served_virtual_hosts(&rig.envoys[0], &rig.namespace).await {
            break count;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no route configuration reached Envoy"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    eprintln!(
        "first route configuration after the restart: {first}/{ROUTES} routes, {:?} after start",
        started.elapsed()
    );
    assert_eq!(
        first, ROUTES,
        "the first configuration an Envoy got was half-built"
    );
}

#[tokio::test]
async fn slow_status_writes_never_delay_xds() {
    const ROUTES: usize = 2000;
    let mut rig = Rig::start(1).await;
    rig.add_backend("app").await;
    let services: Api<Service> = Api::namespaced(rig.client.clone(), &rig.namespace);
    let app = services.get("app").await.expect("app service");
    let routes: Api<TrafficRoute> = Api::namespaced(rig.client.clone(), &rig.namespace);
    let configs: Api<ProxyConfig> = Api::namespaced(rig.client.clone(), &rig.namespace);

    // 2000 routes whose live configs an earlier leader wrote; none has a status yet.
    let created = Instant::now();
    futures::stream::iter(0..ROUTES)
        .map(|i| {
            let (routes, configs, app) = (routes.clone(), configs.clone(), app.clone());
            async move {
                let name = format!("r{i}");
                let spec: switchyard::api::TrafficRouteSpec =
                    serde_json::from_value(serde_json::json!({
                        "hosts": [format!("r{i}.test")],
                        "rules": [{ "backends": [{ "service": "app", "port": 80 }] }],
                    }))
                    .expect("spec");
                let route = routes
                    .create(&PostParams::default(), &TrafficRoute::new(&name, spec))
                    .await
                    .expect("create route");
                let resolved = resolve_route(&route, &[&app]).expect("resolves");
                let spec = proxy_config_spec(
                    &name,
                    route.metadata.generation.unwrap_or(1),
                    ProxyConfigRole::Live,
                    &resolved,
                    &[],
                );
                let pc = ProxyConfig::new(&format!("{name}-live"), spec);
                configs
                    .patch(
                        &pc.name_any(),
                        &PatchParams::apply("switchyard").force(),
                        &Patch::Apply(&pc),
                    )
                    .await
                    .expect("apply live config");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    eprintln!(
        "created {ROUTES} routes and live configs in {:?}",
        created.elapsed()
    );

    rig.start_operator("switchyard-1", &["--status-qps", "2"]);
    let started = Instant::now();
    loop {
        if served_virtual_hosts(&rig.envoys[0], &rig.namespace).await == Some(ROUTES) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "Envoy did not get every route"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let xds = started.elapsed();
    let with_status = routes
        .list(&Default::default())
        .await
        .expect("list routes")
        .items
        .iter()
        .filter(|r| r.status.is_some())
        .count();
    eprintln!(
        "Envoy holds all {ROUTES} routes {xds:?} after the operator started; {with_status} statuses written by then (2 writes/s)"
    );
    assert!(xds < Duration::from_secs(20), "xDS took {xds:?}");
    assert!(
        with_status < ROUTES / 2,
        "status was not the slow part: {with_status}"
    );
    // ... and status catches up on its own: a first write within a bounded wait (its
    // pace is the status writer's and the machine's, not what this test is about).
    let waiting = Instant::now();
    let later = loop {
        let written = routes
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .iter()
            .filter(|r| r.status.is_some())
            .count();
        if written > with_status || waiting.elapsed() > Duration::from_secs(20) {
            break written;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!("{later} statuses written {:?} later", waiting.elapsed());
    assert!(later > with_status, "status writes stalled");
}
