//! Builders shared by the Kubernetes side's unit tests: the objects they all need, in the
//! namespace they all use.

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use kube::api::ObjectMeta;

use super::to_model::SERVICE_NAME_LABEL;
use crate::api::proxy_config::ResolvedCluster;
use crate::api::traffic_route::{Backend, RouteRule, RouteSpec, TrafficRoute, TrafficRouteSpec};

pub const NS: &str = "shop";

/// Port 80 of `service`, named "http", HTTP/1.
pub fn cluster(service: &str) -> ResolvedCluster {
    ResolvedCluster {
        outlier_detection: None,
        health_check: None,
        circuit_breaker: None,
        namespace: None,
        service: service.into(),
        port: 80,
        port_name: "http".into(),
        http2: false,
        udp: false,
        lb_policy: None,
        tls: None,
    }
}

/// An EndpointSlice `name` of `service` in [`NS`], with no endpoints or ports yet.
pub fn slice(name: &str, service: &str) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some([(SERVICE_NAME_LABEL.to_string(), service.to_string())].into()),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: None,
        ports: None,
    }
}

/// An endpoint at `address`, its conditions unset (ready, as Kubernetes reads them).
pub fn endpoint(address: &str) -> Endpoint {
    Endpoint {
        addresses: vec![address.to_string()],
        ..Default::default()
    }
}

/// A slice port `name` on `port`.
pub fn port(name: &str, port: i32) -> EndpointPort {
    EndpointPort {
        name: Some(name.into()),
        port: Some(port),
        ..Default::default()
    }
}

/// A TrafficRoute `namespace/name` asking for `hosts`, one rule to port 80 of `service`.
pub fn traffic_route(namespace: &str, name: &str, hosts: &[&str], service: &str) -> TrafficRoute {
    let mut route = TrafficRoute::new(
        name,
        TrafficRouteSpec {
            route: RouteSpec {
                hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
                rules: vec![RouteRule {
                    backends: vec![Backend {
                        service: service.to_owned(),
                        port: Some(80),
                        ..Backend::default()
                    }],
                    ..RouteRule::default()
                }],
                ..RouteSpec::default()
            },
            ..TrafficRouteSpec::default()
        },
    );
    route.metadata.namespace = Some(namespace.to_owned());
    route
}
