//! ClusterLoadAssignments: a cluster's endpoints, grouped by zone, with their health.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::HealthStatus;

use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

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

/// One endpoint a load assignment lists.
struct Listed<'a> {
    address: Cow<'a, str>,
    port: u16,
    health: HealthStatus,
}

/// A zone (or none) and the endpoints listed in it.
type Zone<'a> = (Option<&'a str>, Vec<Listed<'a>>);

/// The endpoints a cluster's load assignment lists, by zone (no zone first, then zones
/// and endpoints in order), and the endpoints that were left out.
///
/// Endpoints that are neither ready nor serving while terminating are left out, as
/// kube-proxy leaves them out: listed as UNHEALTHY, they would count as hosts, and with
/// fewer than half of the hosts healthy Envoy's panic mode sends requests to every host,
/// Pods that do not listen yet included (1 of 3 Pods ready: 2 requests in 3 fail).
/// Terminating Pods that still serve stay, DRAINING: panic mode may still use them, and
/// they answer.
fn listed(c: &model::Cluster) -> (Vec<Zone<'_>>, Vec<String>) {
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

    let mut zones: BTreeMap<Option<&str>, Vec<Listed<'_>>> = BTreeMap::new();
    let serving = best
        .iter()
        .filter(|(_, e)| health(e.condition) != HealthStatus::Unhealthy);
    for ((ip, port), e) in serving {
        zones.entry(e.zone.as_deref()).or_default().push(Listed {
            address: canonical(ip, &e.address),
            port: *port,
            health: health(e.condition),
        });
    }
    (zones.into_iter().collect(), problems)
}

/// The load assignment of a cluster, named after it, encoded, and the endpoints that were
/// left out (see [`listed`]). A cluster without endpoints gets an empty assignment (it
/// warms, with no host).
///
/// Written directly, the same bytes prost writes for the `ClusterLoadAssignment` (a unit
/// test holds them equal): a full build encodes 100k endpoints, and as prost structs that
/// is a `String` and five nested messages per endpoint, each length computed again at
/// every level.
pub fn encoded_load_assignment(c: &model::Cluster) -> (Vec<u8>, Vec<String>) {
    let (zones, problems) = listed(c);
    let mut len = string_field_len(1, &c.name);
    for (zone, listed) in &zones {
        len += field_len(2, locality_lb_endpoints_len(*zone, listed));
    }
    let mut out = Vec::with_capacity(len);
    string_field(1, &c.name, &mut out);
    for (zone, listed) in &zones {
        message_key(2, locality_lb_endpoints_len(*zone, listed), &mut out);
        if let Some(zone) = zone {
            message_key(1, string_field_len(2, zone), &mut out);
            string_field(2, zone, &mut out);
        }
        for e in listed {
            message_key(2, lb_endpoint_len(e), &mut out);
            // Fields in tag order, as prost writes them: the host, then its health.
            let socket = socket_address_len(e);
            let address = field_len(1, socket);
            let endpoint = field_len(1, address);
            message_key(1, endpoint, &mut out);
            message_key(1, address, &mut out);
            message_key(1, socket, &mut out);
            string_field(2, &e.address, &mut out);
            varint_field_always(3, u64::from(e.port), &mut out);
            varint_field(2, e.health as u64, &mut out);
        }
    }
    debug_assert_eq!(out.len(), len);
    (out, problems)
}

// Encoded lengths, as prost computes them (proto3: empty strings and zero numbers are not
// written, but a set oneof field or message always is).

fn locality_lb_endpoints_len(zone: Option<&str>, listed: &[Listed<'_>]) -> usize {
    let locality = zone.map_or(0, |z| field_len(1, string_field_len(2, z)));
    locality
        + listed
            .iter()
            .map(|e| field_len(2, lb_endpoint_len(e)))
            .sum::<usize>()
}

fn lb_endpoint_len(e: &Listed<'_>) -> usize {
    let host = field_len(1, field_len(1, field_len(1, socket_address_len(e))));
    varint_field_len(2, e.health as u64) + host
}

fn socket_address_len(e: &Listed<'_>) -> usize {
    string_field_len(2, &e.address) + key_len(3) + encoded_len_varint(u64::from(e.port))
}

fn field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn string_field_len(tag: u32, value: &str) -> usize {
    if value.is_empty() {
        0
    } else {
        field_len(tag, value.len())
    }
}

fn varint_field_len(tag: u32, value: u64) -> usize {
    if value == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(value)
    }
}

fn message_key(tag: u32, len: usize, out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(len as u64, out);
}

fn string_field(tag: u32, value: &str, out: &mut Vec<u8>) {
    if !value.is_empty() {
        message_key(tag, value.len(), out);
        out.extend_from_slice(value.as_bytes());
    }
}

fn varint_field(tag: u32, value: u64, out: &mut Vec<u8>) {
    if value != 0 {
        varint_field_always(tag, value, out);
    }
}

fn varint_field_always(tag: u32, value: u64, out: &mut Vec<u8>) {
    encode_key(tag, WireType::Varint, out);
    encode_varint(value, out);
}

/// The address as Envoy should see it. Rust parses IPv4 only in its canonical dotted
/// form, so that text is reused as it is; IPv6 has many spellings and is re-printed.
fn canonical<'a>(ip: &IpAddr, text: &'a str) -> Cow<'a, str> {
    match ip {
        IpAddr::V4(_) => Cow::Borrowed(text),
        IpAddr::V6(v6) => Cow::Owned(v6.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::{
        Address, Locality, SocketAddress, address, socket_address,
    };
    use envoy_types::pb::envoy::config::endpoint::v3::{
        ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
        lb_endpoint::HostIdentifier,
    };
    use prost::Message;

    /// The load assignment as prost structs: the reference the encoding is held to.
    fn load_assignment(c: &model::Cluster) -> (ClusterLoadAssignment, Vec<String>) {
        let (zones, problems) = listed(c);
        let endpoints = zones
            .into_iter()
            .map(|(zone, listed)| LocalityLbEndpoints {
                locality: zone.map(|z| Locality {
                    zone: z.to_owned(),
                    ..Default::default()
                }),
                lb_endpoints: listed.into_iter().map(lb_endpoint).collect(),
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

    fn lb_endpoint(e: Listed<'_>) -> LbEndpoint {
        LbEndpoint {
            health_status: e.health as i32,
            host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: e.address.into_owned(),
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                            e.port,
                        ))),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

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
            leaving: false,
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
    fn the_encoding_is_the_bytes_prost_writes() {
        let zones = [None, Some(""), Some("a"), Some("zone-b")];
        let conditions = [
            cond(true, true, false),
            cond(false, true, true),
            cond(false, false, false),
        ];
        let mut cases = vec![
            cluster(vec![]),
            model::Cluster {
                name: String::new(),
                ..cluster(vec![ep("10.0.0.1", 80, conditions[0], None)])
            },
        ];
        // Sizes across the one- and two-byte length boundaries, every health and zone,
        // ports of one to three varint bytes, IPv4 and IPv6 spellings, duplicates.
        for n in [1usize, 2, 7, 20, 130, 1000] {
            let endpoints = (0..n)
                .map(|i| {
                    let address = if i % 5 == 4 {
                        format!("FD00::{i:x}")
                    } else {
                        format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)
                    };
                    let port = [1u16, 80, 8080, 65535][i % 4];
                    ep(&address, port, conditions[i % 3], zones[i % 4])
                })
                .chain([ep("10.0.0.0", 1, conditions[0], Some("a"))])
                .collect();
            cases.push(cluster(endpoints));
        }
        for c in &cases {
            let (expected, problems) = load_assignment(c);
            let (encoded, encoded_problems) = encoded_load_assignment(c);
            assert_eq!(
                encoded,
                expected.encode_to_vec(),
                "{} endpoints",
                c.endpoints.len()
            );
            assert_eq!(encoded_problems, problems);
            assert_eq!(
                ClusterLoadAssignment::decode(encoded.as_slice()).expect("decodes"),
                expected
            );
        }
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
