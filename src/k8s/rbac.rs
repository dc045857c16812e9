//! The permissions Switchyard needs, kept next to the code that uses them. `switchyard rbac`
//! prints them as a ClusterRole; an end-to-end test runs the operator with nothing more.

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::api::ObjectMeta;

/// (API group, resource, verbs, why).
pub const RULES: &[(&str, &str, &[&str], &str)] = &[
    (
        "switchyard.dev",
        "trafficroutes",
        &["get", "list", "watch"],
        "the leader reconciles them",
    ),
    (
        "switchyard.dev",
        "trafficroutes/status",
        &["patch"],
        "status, by server-side apply",
    ),
    (
        "switchyard.dev",
        "proxyconfigs",
        &["get", "list", "watch", "create", "patch", "delete"],
        "every replica serves them; the leader writes them (server-side apply creates) and collects probe configs",
    ),
    (
        "",
        "services",
        &["get", "list", "watch", "create", "patch", "delete"],
        "resolving backends (read); Gateway API: each Gateway's own Service, in the fleet's namespace (written)",
    ),
    (
        "discovery.k8s.io",
        "endpointslices",
        &["list", "watch"],
        "endpoints of backends and of the Envoy fleet",
    ),
    (
        "",
        "secrets",
        &["list", "watch"],
        "TLS Secrets (type kubernetes.io/tls), watched",
    ),
    (
        "gateway.networking.k8s.io",
        "gatewayclasses",
        &["get", "list", "watch"],
        "Gateway API (--gateway-api): the classes naming Switchyard's controller",
    ),
    (
        "gateway.networking.k8s.io",
        "gateways",
        &["get", "list", "watch"],
        "Gateway API: the Gateways of those classes",
    ),
    (
        "gateway.networking.k8s.io",
        "httproutes",
        &["get", "list", "watch"],
        "Gateway API: the routes attached to them",
    ),
    (
        "gateway.networking.k8s.io",
        "grpcroutes",
        &["get", "list", "watch"],
        "Gateway API: the routes attached to them",
    ),
    (
        "gateway.networking.k8s.io",
        "tlsroutes",
        &["get", "list", "watch"],
        "Gateway API: the routes attached to them",
    ),
    (
        "gateway.networking.k8s.io",
        "tcproutes",
        &["get", "list", "watch"],
        "Gateway API: the routes attached to them",
    ),
    (
        "gateway.networking.k8s.io",
        "udproutes",
        &["get", "list", "watch"],
        "Gateway API: the routes attached to them",
    ),
    (
        "gateway.networking.k8s.io",
        "referencegrants",
        &["get", "list", "watch"],
        "Gateway API: references across namespaces",
    ),
    (
        "gateway.networking.k8s.io",
        "backendtlspolicies",
        &["get", "list", "watch"],
        "Gateway API: TLS to backends",
    ),
    (
        "gateway.networking.k8s.io",
        "listenersets",
        &["get", "list", "watch"],
        "Gateway API: more listeners for Gateways",
    ),
    (
        "gateway.networking.k8s.io",
        "gatewayclasses/status",
        &["patch"],
        "Gateway API status",
    ),
    (
        "gateway.networking.k8s.io",
        "gateways/status",
        &["patch"],
        "Gateway API status",
    ),
    (
        "gateway.networking.k8s.io",
        "httproutes/status",
        &["patch"],
        "Gateway API status",
    ),
    (
        "gateway.networking.k8s.io",
        "grpcroutes/status",
        &["patch"],
        "Gateway API status",
    ),
    (
        "gateway.networking.k8s.io",
        "tlsroutes/status",
        &["patch"],
        "Gateway API status",
    ),
    (
        "gateway.networking.k8s.io",
        "tcproutes/status",
        &["patch"],
        "Gateway API status",
    ),
    (
        "gateway.networking.k8s.io",
        "udproutes/status",
        &["patch"],
        "Gateway API status",
    ),
    (
        "gateway.networking.k8s.io",
        "backendtlspolicies/status",
        &["patch"],
        "Gateway API status",
    ),
    (
        "gateway.networking.k8s.io",
        "listenersets/status",
        &["patch"],
        "Gateway API status",
    ),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        &["get"],
        "Gateway API: the release of the installed CRDs (GatewayClass SupportedVersion)",
    ),
    (
        "",
        "namespaces",
        &["list", "watch"],
        "Gateway API: listeners admitting routes from namespaces by label",
    ),
    (
        "",
        "configmaps",
        &["list", "watch"],
        "Gateway API: CA certificates (ca.crt) for client certificate validation",
    ),
    (
        "coordination.k8s.io",
        "leases",
        &["get", "list", "watch", "create", "patch", "update"],
        "leader election",
    ),
    (
        "events.k8s.io",
        "events",
        &["create", "patch"],
        "Events on rollout transitions",
    ),
];

pub fn cluster_role(name: &str) -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        rules: Some(
            RULES
                .iter()
                .map(|(group, resource, verbs, _)| PolicyRule {
                    api_groups: Some(vec![group.to_string()]),
                    resources: Some(vec![resource.to_string()]),
                    verbs: verbs.iter().map(|v| v.to_string()).collect(),
                    ..Default::default()
                })
                .collect(),
        ),
        ..Default::default()
    }
}
