//! The Gateway API on the rig: the CRDs installed, the fleet Service given a selector (each
//! Gateway's Service copies it), a GatewayClass and Gateway `edge` of Switchyard's, and the
//! addresses a Gateway's port is reached at on every Envoy.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

use crate::kube::tool;
use crate::rig::{FLEET_NAMESPACE, Rig};

const WITHIN: Duration = Duration::from_secs(30);

/// The experimental channel's CRDs, a superset of the standard one's: the routes of the
/// standard channel are served alike, and one test sets experimental fields. (Every test
/// of this file shares one API server, and the channels' CRDs cannot be installed over
/// each other.)
pub async fn install_crds(rig: &Rig) {
    // kubectl reads a link to a folder as a file: give it the folder itself.
    let crds = std::fs::canonicalize(tool("gateway-api-experimental"))
        .expect("the Gateway API CRDs, experimental channel");
    let crds = crds.to_string_lossy();
    rig.api
        .kubectl_ok(["apply", "--server-side", "--force-conflicts", "-f", &crds])
        .await;
    rig.api
        .wait_established(&[
            "gatewayclasses.gateway.networking.k8s.io",
            "gateways.gateway.networking.k8s.io",
            "httproutes.gateway.networking.k8s.io",
            "grpcroutes.gateway.networking.k8s.io",
            "tlsroutes.gateway.networking.k8s.io",
            "tcproutes.gateway.networking.k8s.io",
            "udproutes.gateway.networking.k8s.io",
            "referencegrants.gateway.networking.k8s.io",
        ])
        .await;
}

/// Gives the rig's fleet Service a selector: each Gateway's Service copies it.
pub async fn select_fleet(rig: &Rig) {
    let fleet: Api<Service> = Api::namespaced(rig.client.clone(), FLEET_NAMESPACE);
    fleet
        .patch(
            &rig.fleet_service(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "selector": { "app": "envoy-fleet" } } })),
        )
        .await
        .expect("give the fleet Service a selector");
}

/// The Services of the Gateway `namespace/name`, from the fleet's namespace.
pub async fn gateway_services(rig: &Rig, namespace: &str, name: &str) -> Vec<Service> {
    let fleet: Api<Service> = Api::namespaced(rig.client.clone(), FLEET_NAMESPACE);
    let selector =
        format!("switchyard.dev/gateway-namespace={namespace},switchyard.dev/gateway-name={name}");
    fleet
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("list Services")
        .items
}

/// The fleet port on every Envoy that the Gateway `namespace/name`'s `port` maps to.
pub async fn fleet_port(rig: &Rig, namespace: &str, name: &str, port: i32) -> u16 {
    let deadline = tokio::time::Instant::now() + WITHIN;
    while tokio::time::Instant::now() < deadline {
        let services = gateway_services(rig, namespace, name).await;
        let target = services
            .iter()
            .flat_map(|s| s.spec.iter().flat_map(|s| s.ports.iter().flatten()))
            .find(|p| p.port == port)
            .and_then(|p| match &p.target_port {
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(t)) => {
                    u16::try_from(*t).ok()
                }
                _ => None,
            });
        if let Some(target) = target {
            return target;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{namespace}/{name}: no Service with port {port} within {WITHIN:?}");
}

/// GatewayClass `class` of `controller`, and Gateway `edge` in `namespace` with one HTTP
/// listener on port 80, ending in a document separator.
pub fn edge_gateway(class: &str, controller: &str, namespace: &str) -> String {
    class_and_gateway(
        (class, controller),
        (namespace, "edge"),
        "[ { name: http, port: 80, protocol: HTTP } ]",
    )
}

/// GatewayClass `class` of `controller`, and Gateway `name` in `namespace` with
/// `listeners` (the YAML of its `spec.listeners`, on one line or indented), ending in a
/// document separator.
pub fn class_and_gateway(
    (class, controller): (&str, &str),
    (namespace, name): (&str, &str),
    listeners: &str,
) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{ name: {class} }}
spec: {{ controllerName: {controller} }}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: {name}, namespace: {namespace} }}
spec:
  gatewayClassName: {class}
  listeners: {listeners}
---"#
    )
}

/// The base URLs of Gateway `edge`'s port 80 on every Envoy of the rig.
pub async fn edge_targets(rig: &Rig) -> Vec<String> {
    let port = fleet_port(rig, &rig.namespace, "edge", 80).await;
    rig.envoy_addresses
        .iter()
        .map(|a| format!("http://{a}:{port}"))
        .collect()
}
