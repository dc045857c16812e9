//! The Kubernetes rig against a real etcd + kube-apiserver (shared by the tests of this
//! binary while they run), or against an existing cluster with SWITCHYARD_E2E_KUBECONFIG.

use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{CustomResource, ResourceExt};
use serde::{Deserialize, Serialize};
use switchyard_e2e::kube::{self as rig, KubeApi};

const WITHIN: Duration = Duration::from_secs(30);

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.rigtest.switchyard.dev
spec:
  group: rigtest.switchyard.dev
  scope: Namespaced
  names:
    plural: widgets
    singular: widget
    kind: Widget
    listKind: WidgetList
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [replicas]
            properties:
              replicas:
                type: integer
                minimum: 1
                maximum: 10
              color:
                type: string
          status:
            type: object
            properties:
              observed:
                type: integer
"#;

/// The test resource, typed; its schema is the CRD above (written by hand, so none here).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "rigtest.switchyard.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus",
    schema = "disabled"
)]
struct WidgetSpec {
    replicas: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    color: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
struct WidgetStatus {
    observed: Option<i64>,
}

fn widget_yaml(namespace: &str, name: &str, replicas: i64) -> String {
    format!(
        "apiVersion: rigtest.switchyard.dev/v1\nkind: Widget\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  replicas: {replicas}\n  color: blue\n"
    )
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test]
async fn crd_applied_with_kubectl_validates_and_is_watched() {
    let api = KubeApi::shared().await;
    let client = api.client().await;

    let out = api
        .kubectl_input(
            [
                "apply",
                "--server-side",
                "--field-manager=rig-test",
                "-f",
                "-",
            ],
            CRD,
        )
        .await;
    assert!(out.status.success(), "apply CRD: {}", stderr(&out));
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    tokio::time::timeout(
        WITHIN,
        await_condition(
            crds.clone(),
            "widgets.rigtest.switchyard.dev",
            conditions::is_crd_established(),
        ),
    )
    .await
    .expect("CRD Established in time")
    .expect("watch the CRD");

    let ns = rig::unique_name("crd");
    rig::create_namespace(&client, &ns).await;
    let widgets = Api::<Widget>::namespaced(client.clone(), &ns);
    let mut events = watcher(widgets.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    rig::next_event(&mut events, WITHIN, "initial listing", |e| {
        matches!(e, watcher::Event::InitDone)
    })
    .await;

    // Rejected by the schema's `minimum`, through the kube client (422 Invalid)...
    let bad = Widget::new(
        "bad",
        WidgetSpec {
            replicas: 0,
            color: None,
        },
    );
    let started = std::time::Instant::now();
    let status = loop {
        match widgets.create(&PostParams::default(), &bad).await {
            // Just after Established, the resource's handler may still be missing.
            Err(kube::Error::Api(s)) if s.code == 404 && started.elapsed() < WITHIN => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(kube::Error::Api(s)) => break s,
            other => panic!("an invalid Widget was not rejected: {other:?}"),
        }
    };
    assert_eq!(status.code, 422, "{status:?}");
    assert_eq!(status.reason, "Invalid", "{status:?}");
    assert!(
        status
            .message
            .contains("spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1"),
        "{}",
        status.message
    );
    // ... and through kubectl.
    let out = api
        .kubectl_input(
            [
                "apply",
                "--server-side",
                "--field-manager=rig-test",
                "-f",
                "-",
            ],
            &widget_yaml(&ns, "bad", 11),
        )
        .await;
    assert!(!out.status.success(), "an invalid Widget was accepted");
    assert!(
        stderr(&out).contains("spec.replicas in body should be less than or equal to 10"),
        "{}",
        stderr(&out)
    );

    // A valid one, applied by kubectl, reaches the watcher of the typed client.
    let out = api
        .kubectl_input(
            [
                "apply",
                "--server-side",
                "--field-manager=rig-test",
                "-f",
                "-",
            ],
            &widget_yaml(&ns, "good", 3),
        )
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let event = rig::next_event(
        &mut events,
        WITHIN,
        "Widget good",
        |e| matches!(e, watcher::Event::Apply(w) if w.name_any() == "good"),
    )
    .await;
    let seen = rig::applied(&event).expect("an applied Widget");
    assert_eq!(
        seen.spec,
        WidgetSpec {
            replicas: 3,
            color: Some("blue".to_string())
        }
    );
    assert_eq!(seen.status, None);

    // The status subresource: written on its own, seen by the watcher.
    let status = serde_json::json!({
        "apiVersion": "rigtest.switchyard.dev/v1",
        "kind": "Widget",
        "status": { "observed": 3 },
    });
    widgets
        .patch_status(
            "good",
            &PatchParams::apply("rig-test-status").force(),
            &Patch::Apply(&status),
        )
        .await
        .expect("apply the status");
    rig::next_event(&mut events, WITHIN, "Widget good with status", |e| {
        rig::applied(e).is_some_and(|w| {
            w.name_any() == "good" && w.status.as_ref().and_then(|s| s.observed) == Some(3)
        })
    })
    .await;
    // Status written through the main resource is ignored.
    let out = api
        .kubectl_input(
            [
                "apply",
                "--server-side",
                "--field-manager=rig-test",
                "-f",
                "-",
            ],
            &format!("{}status:\n  observed: 99\n", widget_yaml(&ns, "good", 4)),
        )
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let good = widgets.get("good").await.expect("get good");
    assert_eq!(good.spec.replicas, 4);
    assert_eq!(good.status, Some(WidgetStatus { observed: Some(3) }));

    rig::delete_namespace(&client, &ns).await;
    let _ = crds
        .delete("widgets.rigtest.switchyard.dev", &DeleteParams::default())
        .await;
}

#[tokio::test]
async fn services_and_endpoint_slices_written_by_the_harness() {
    let api = KubeApi::shared().await;
    let client = api.client().await;
    let ns = rig::unique_name("eps");
    rig::create_namespace(&client, &ns).await;

    let service = rig::apply_service(&client, &ns, "web", 80).await;
    let spec = service.spec.expect("service spec");
    assert!(spec.cluster_ip.is_some(), "no ClusterIP allocated");
    assert_eq!(spec.ports.expect("ports")[0].port, 80);

    let slices = Api::<EndpointSlice>::namespaced(client.clone(), &ns);
    let mut events = watcher(
        slices.clone(),
        watcher::Config::default().labels(&rig::service_selector("web")),
    )
    .default_backoff()
    .boxed();
    // Listed (empty) before anything is written, so what follows arrives as changes.
    rig::next_event(&mut events, WITHIN, "initial listing", |e| {
        matches!(e, watcher::Event::InitDone)
    })
    .await;

    // Two ports, so two slices (as Kubernetes does for differing target ports).
    let names = rig::apply_endpoint_slice(
        &client,
        &ns,
        "web",
        &[
            ("198.51.100.21", 8080, true, true, false),
            ("198.51.100.22", 8080, true, true, false),
            ("198.51.100.23", 9090, true, true, false),
        ],
    )
    .await;
    assert_eq!(names, ["web-8080", "web-9090"]);
    let listed = slices
        .list(&ListParams::default().labels(&rig::service_selector("web")))
        .await
        .expect("list slices");
    let mut seen: Vec<(String, i32, Vec<String>)> = listed
        .items
        .iter()
        .map(|s| {
            let port = &s.ports.as_ref().expect("ports")[0];
            (
                s.name_any(),
                port.port.expect("port"),
                s.endpoints
                    .iter()
                    .flatten()
                    .flat_map(|e| e.addresses.clone())
                    .collect(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (
                "web-8080".to_string(),
                8080,
                vec!["198.51.100.21".to_string(), "198.51.100.22".to_string()]
            ),
            (
                "web-9090".to_string(),
                9090,
                vec!["198.51.100.23".to_string()]
            ),
        ]
    );
    for slice in &listed.items {
        assert_eq!(slice.address_type, "IPv4");
        assert_eq!(
            slice.ports.as_ref().expect("ports")[0].name.as_deref(),
            Some(rig::PORT_NAME)
        );
        assert_eq!(
            slice
                .labels()
                .get(rig::SERVICE_NAME_LABEL)
                .map(String::as_str),
            Some("web")
        );
    }
    // Another service's slices are not listed under this one.
    rig::apply_service(&client, &ns, "other", 80).await;
    rig::apply_endpoint_slice(
        &client,
        &ns,
        "other",
        &[("198.51.100.31", 8080, true, true, false)],
    )
    .await;
    let listed = slices
        .list(&ListParams::default().labels(&rig::service_selector("web")))
        .await
        .expect("list slices");
    assert_eq!(listed.items.len(), 2);

    // An endpoint starts terminating: the watcher sees the new conditions.
    rig::apply_endpoint_slice(
        &client,
        &ns,
        "web",
        &[
            ("198.51.100.21", 8080, true, true, false),
            ("198.51.100.22", 8080, false, true, true),
            ("198.51.100.23", 9090, true, true, false),
        ],
    )
    .await;
    rig::next_event(&mut events, WITHIN, "198.51.100.22 terminating", |e| {
        // A change, not the initial listing.
        let watcher::Event::Apply(slice) = e else {
            return false;
        };
        slice.endpoints.iter().flatten().any(|ep| {
            ep.addresses == ["198.51.100.22"]
                && ep.conditions.as_ref().is_some_and(|c| {
                    c.ready == Some(false) && c.serving == Some(true) && c.terminating == Some(true)
                })
        })
    })
    .await;

    // The 9090 endpoint goes away: its slice is deleted, the other one stays.
    let names = rig::apply_endpoint_slice(
        &client,
        &ns,
        "web",
        &[
            ("198.51.100.21", 8080, true, true, false),
            ("198.51.100.22", 8080, false, false, true),
        ],
    )
    .await;
    assert_eq!(names, ["web-8080"]);
    rig::next_event(
        &mut events,
        WITHIN,
        "web-9090 deleted",
        |e| matches!(e, watcher::Event::Delete(s) if s.name_any() == "web-9090"),
    )
    .await;

    // Delete everything of "web".
    rig::delete_endpoint_slices(&client, &ns, "web").await;
    rig::delete_service(&client, &ns, "web").await;
    rig::next_event(
        &mut events,
        WITHIN,
        "web-8080 deleted",
        |e| matches!(e, watcher::Event::Delete(s) if s.name_any() == "web-8080"),
    )
    .await;
    let listed = slices
        .list(&ListParams::default().labels(&rig::service_selector("web")))
        .await
        .expect("list slices");
    assert!(listed.items.is_empty(), "{:?}", listed.items);
    let services = Api::<Service>::namespaced(client.clone(), &ns);
    assert!(services.get_opt("web").await.expect("get").is_none());
    assert!(services.get_opt("other").await.expect("get").is_some());
    // Deleting what is gone is fine.
    rig::delete_service(&client, &ns, "web").await;

    rig::delete_namespace(&client, &ns).await;
}

#[tokio::test]
async fn kubeconfig_works_for_kubectl() {
    let api = KubeApi::shared().await;
    if let Some(took) = api.started_in {
        eprintln!("apiserver start-up: {took:.2?}");
    }
    if api.is_local() {
        let text = std::fs::read_to_string(&api.kubeconfig).expect("read kubeconfig");
        assert!(text.contains("certificate-authority-data:"), "{text}");
        assert!(!text.contains("insecure"), "{text}");
        assert!(
            api.server.starts_with("https://127.0.0.1:"),
            "{}",
            api.server
        );
    }

    // The system namespaces appear shortly after start-up.
    let started = std::time::Instant::now();
    loop {
        let out = api.kubectl_ok(["get", "ns", "-o", "name"]).await;
        if out.contains("namespace/default") && out.contains("namespace/kube-system") {
            break;
        }
        assert!(started.elapsed() < WITHIN, "no system namespaces: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        api.kubectl_ok(["get", "--raw", "/readyz"]).await.trim(),
        "ok"
    );
    if api.is_local() {
        let whoami = api
            .kubectl_ok([
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.username}",
            ])
            .await;
        assert_eq!(whoami, "admin");
    }

    // Service-account tokens: signed with the generated key, verified by the apiserver,
    // and subject to RBAC.
    let ns = rig::unique_name("sa");
    api.kubectl_ok(["create", "namespace", &ns]).await;
    api.kubectl_ok(["create", "serviceaccount", "probe", "-n", &ns])
        .await;
    let token = api
        .kubectl_ok(["create", "token", "probe", "-n", &ns, "--duration=10m"])
        .await;
    let token = token.trim().to_string();
    // RS256 with the openssl RSA key, ES256 with the built-in one.
    let header = token.split('.').next().expect("a JWT");
    let header: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(header)
            .expect("base64url JWT header"),
    )
    .expect("a JSON JWT header");
    eprintln!("service-account token header: {header}");
    if api.is_local() {
        assert!(
            header["alg"] == "RS256" || header["alg"] == "ES256",
            "{header}"
        );
    }
    let token = format!("--token={token}");
    let whoami = api
        .kubectl_ok([
            "auth",
            "whoami",
            &token,
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .await;
    assert_eq!(whoami, format!("system:serviceaccount:{ns}:probe"));
    let out = api.kubectl(["get", "secrets", "-n", &ns, &token]).await;
    assert!(
        !out.status.success(),
        "RBAC let a bare service account list secrets"
    );
    assert!(stderr(&out).contains("Forbidden"), "{}", stderr(&out));

    let _ = api
        .kubectl(["delete", "namespace", &ns, "--wait=false"])
        .await;
}

#[tokio::test]
async fn loopback_endpoints_are_rejected_so_rig_listeners_take_local_range_addresses() {
    let api = KubeApi::shared().await;
    let client = api.client().await;
    let ns = rig::unique_name("ip");
    rig::create_namespace(&client, &ns).await;
    rig::apply_service(&client, &ns, "web", 80).await;

    // The API server's own rule, which is why the helper refuses 127.x up front.
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": { "name": "web-loopback", "labels": { rig::SERVICE_NAME_LABEL: "web" } },
        "addressType": "IPv4",
        "endpoints": [{ "addresses": ["127.0.0.21"] }],
        "ports": [{ "name": rig::PORT_NAME, "port": 8080 }],
    }))
    .expect("an EndpointSlice");
    let err = Api::<EndpointSlice>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &slice)
        .await
        .expect_err("a loopback endpoint was accepted");
    assert!(
        err.to_string().contains("may not be in the loopback range"),
        "{err}"
    );

    // The rig's listeners take addresses the API server accepts and `lo` holds: a
    // listener binds there, a client reaches it, and a slice lists it as it is.
    let address = switchyard_e2e::local_range::address(0, 21);
    assert_eq!(address, "198.18.0.21");
    let listener = std::net::TcpListener::bind((address.as_str(), 0)).expect("bind 198.18.0.21");
    let port = listener.local_addr().expect("its address").port();
    std::net::TcpStream::connect((address.as_str(), port)).expect("connect to 198.18.0.21");
    let names =
        rig::apply_endpoint_slice(&client, &ns, "web", &[(&address, port, true, true, false)])
            .await;
    assert_eq!(names, [format!("web-{port}")]);

    rig::delete_namespace(&client, &ns).await;
}
