//! ClusterLoadAssignments: a cluster's endpoints, grouped by zone, with their health.

use std::collections::BTreeMap;
use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::{
    Address, HealthStatus, Locality, SocketAddress, address, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};

use crate::model;

/// Envoy health of an EndpointSlice endpoint: ready → HEALTHY; not ready, but still serving
/// while terminating → DRAINING (no new requests); anything else → UNHEALTHY.
pub fn health(condition: model::EndpointCondition) -> HealthStatus {
    if condition.ready {
        HealthStatus::Healthy
    } else if condition.serving && condition.terminating {
        HealthStatus::Draining
    } else {
        HealthStatus::Unhealthy
    }
}

/// Preference when one address:port is listed twice (e.g. in two EndpointSlices while
/// they are being updated): the healthiest entry wins.
fn rank(status: HealthStatus) -> u8 {
    match status {
        HealthStatus::Healthy => 0,
        HealthStatus::Draining => 1,
        _ => 2,
    }
}

/// The load assignment of a cluster, named after it, and the endpoints that were left out.
/// A cluster without endpoints gets an empty assignment (it warms, with no host).
///
/// Endpoints that are neither ready nor serving while terminating are left out, as
/// kube-proxy leaves them out: listed as UNHEALTHY, they would count as hosts, and with
/// fewer than half of the hosts healthy Envoy's panic mode sends requests to every host,
/// Pods that do not listen yet included (1 of 3 Pods ready: 2 requests in 3 fail).
/// Terminating Pods that still serve stay, DRAINING: panic mode may still use them, and
/// they answer.
pub fn load_assignment(c: &model::Cluster) -> (ClusterLoadAssignment, Vec<String>) {
    let mut problems = Vec::new();
    // One entry per address:port; among duplicates the best one by (health, endpoint).
    let mut best: BTreeMap<(IpAddr, u16), &model::Endpoint> = BTreeMap::new();
    for e in &c.endpoints {
        let Ok(ip) = e.address.parse::<IpAddr>() else {
            problems.push(format!(
                "endpoint address {:?} is not an IP address; left out",
                e.address
            ));
            continue;
        };
        if e.port == 0 {
            problems.push(format!("endpoint {}:0 has no port; left out", e.address));
            continue;
        }
        let key = |x: &model::Endpoint| (rank(health(x.condition)), x.clone());
        best.entry((ip, e.port))
            .and_modify(|current| {
                if key(e) < key(current) {
                    *current = e;
                }
            })
            .or_insert(e);
    }

    let mut zones: BTreeMap<Option<&str>, Vec<LbEndpoint>> = BTreeMap::new();
    let serving = best
        .iter()
        .filter(|(_, e)| health(e.condition) != HealthStatus::Unhealthy);
    for ((ip, port), e) in serving {
        zones
            .entry(e.zone.as_deref())
            .or_default()
            .push(LbEndpoint {
                health_status: health(e.condition) as i32,
                host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                    address: Some(Address {
                        address: Some(address::Address::SocketAddress(SocketAddress {
                            address: canonical(ip, &e.address),
                            port_specifier: Some(socket_address::PortSpecifier::PortValue(
                                u32::from(*port),
                            )),
                            ..Default::default()
                        })),
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            });
    }
    let endpoints = zones
        .into_iter()
        .map(|(zone, lb_endpoints)| LocalityLbEndpoints {
            locality: zone.map(|z| Locality {
                zone: z.to_owned(),
                ..Default::default()
            }),
            lb_endpoints,
            ..Default::default()
        })
        .collect();
    (
        ClusterLoadAssignment {
            cluster_name: c.name.clone(),
            endpoints,
            ..Default::default()
        },
        problems,
    )
}

/// The address as Envoy should see it. Rust parses IPv4 only in its canonical dotted
/// form, so that text is reused as it is; IPv6 has many spellings and is re-printed.
fn canonical(ip: &IpAddr, text: &str) -> String {
    match ip {
        IpAddr::V4(_) => text.to_owned(),
        IpAddr::V6(v6) => v6.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(ready: bool, serving: bool, terminating: bool) -> model::EndpointCondition {
        model::EndpointCondition {
            ready,
            serving,
            terminating,
        }
    }

    fn ep(
        address: &str,
        port: u16,
        c: model::EndpointCondition,
        zone: Option<&str>,
    ) -> model::Endpoint {
        model::Endpoint {
            address: address.into(),
            port,
            condition: c,
            zone: zone.map(Into::into),
        }
    }

    fn cluster(endpoints: Vec<model::Endpoint>) -> model::Cluster {
        model::Cluster {
            name: "ns/web/80".into(),
            service: model::ServiceRef {
                namespace: "ns".into(),
                name: "web".into(),
                port: 80,
            },
            settings: Default::default(),
            endpoints,
        }
    }

    fn summary(cla: &ClusterLoadAssignment) -> Vec<(String, Vec<(String, i32)>)> {
        cla.endpoints
            .iter()
            .map(|l| {
                let zone = l
                    .locality
                    .as_ref()
                    .map(|l| l.zone.clone())
                    .unwrap_or_default();
                let eps = l
                    .lb_endpoints
                    .iter()
                    .map(|e| {
                        let Some(HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                            panic!()
                        };
                        let Some(address::Address::SocketAddress(sa)) =
                            &ep.address.as_ref().unwrap().address
                        else {
                            panic!()
                        };
                        let Some(socket_address::PortSpecifier::PortValue(port)) =
                            sa.port_specifier
                        else {
                            panic!()
                        };
                        (format!("{}:{port}", sa.address), e.health_status)
                    })
                    .collect();
                (zone, eps)
            })
            .collect()
    }

    #[test]
    fn health_mapping() {
        assert_eq!(health(cond(true, true, false)), HealthStatus::Healthy);
        assert_eq!(health(cond(true, true, true)), HealthStatus::Healthy);
        assert_eq!(health(cond(false, true, true)), HealthStatus::Draining);
        assert_eq!(health(cond(false, false, true)), HealthStatus::Unhealthy);
        assert_eq!(health(cond(false, true, false)), HealthStatus::Unhealthy);
        assert_eq!(health(cond(false, false, false)), HealthStatus::Unhealthy);
    }

    #[test]
    fn empty_cluster_gets_an_empty_assignment() {
        let (cla, problems) = load_assignment(&cluster(vec![]));
        assert_eq!(cla.cluster_name, "ns/web/80");
        assert!(cla.endpoints.is_empty());
        assert!(problems.is_empty());
    }

    #[test]
    fn grouped_by_zone_sorted_and_deduplicated() {
        let h = HealthStatus::Healthy as i32;
        let d = HealthStatus::Draining as i32;
        let endpoints = vec![
            ep("10.0.0.9", 80, cond(false, false, false), Some("b")),
            ep("10.0.0.10", 80, cond(true, true, false), Some("a")),
            ep("10.0.0.2", 80, cond(false, true, true), Some("a")),
            ep("10.0.0.3", 80, cond(true, true, false), None),
            // The same endpoint twice: the ready one wins, whatever the order.
            ep("10.0.0.9", 80, cond(true, true, false), Some("b")),
            ep("fd00::1", 8080, cond(true, true, false), Some("b")),
            ep("not-an-ip", 80, cond(true, true, false), None),
            ep("10.0.0.4", 0, cond(true, true, false), None),
        ];
        let (cla, problems) = load_assignment(&cluster(endpoints.clone()));
        let expected = vec![
            (String::new(), vec![("10.0.0.3:80".to_owned(), h)]),
            (
                "a".to_owned(),
                vec![
                    ("10.0.0.2:80".to_owned(), d),
                    ("10.0.0.10:80".to_owned(), h),
                ],
            ),
            (
                "b".to_owned(),
                vec![
                    ("10.0.0.9:80".to_owned(), h),
                    ("fd00::1:8080".to_owned(), h),
                ],
            ),
        ];
        assert_eq!(summary(&cla), expected);
        assert_eq!(problems.len(), 2, "{problems:?}");

        let mut reversed = endpoints;
        reversed.reverse();
        assert_eq!(load_assignment(&cluster(reversed)).0, cla);
    }

    #[test]
    fn endpoints_that_serve_nothing_are_left_out() {
        // A Pod still starting, and one terminating that stopped serving: neither may
        // count as a host, or panic mode would send requests to them.
        let endpoints = vec![
            ep("10.0.0.1", 80, cond(true, true, false), None),
            ep("10.0.0.2", 80, cond(false, false, false), None),
            ep("10.0.0.3", 80, cond(false, false, true), None),
            ep("10.0.0.4", 80, cond(false, true, true), None),
        ];
        let (cla, problems) = load_assignment(&cluster(endpoints));
        let h = HealthStatus::Healthy as i32;
        let d = HealthStatus::Draining as i32;
        assert_eq!(
            summary(&cla),
            [(
                String::new(),
                vec![("10.0.0.1:80".to_owned(), h), ("10.0.0.4:80".to_owned(), d)]
            )]
        );
        assert!(problems.is_empty());
    }

    #[test]
    fn ipv4_text_that_parses_is_canonical() {
        for text in ["10.0.0.1", "0.0.0.0", "255.255.255.255", "127.0.0.31"] {
            let ip: IpAddr = text.parse().expect("valid");
            assert_eq!(canonical(&ip, text), ip.to_string());
        }
        for text in ["010.0.0.1", "10.0.0.01", " 10.0.0.1", "10.0.0.1 "] {
            assert!(text.parse::<IpAddr>().is_err(), "{text:?} must not parse");
        }
        let ip: IpAddr = "2001:DB8::0:1".parse().expect("valid");
        assert_eq!(canonical(&ip, "2001:DB8::0:1"), "2001:db8::1");
    }
}
