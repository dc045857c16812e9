//! UDP Gateway listeners, through the whole translation.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::listener_filter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier as HcmRoutes;
use envoy_types::pb::envoy::extensions::filters::udp::udp_proxy::v3::{
    Route as UdpRoute, UdpProxyConfig, udp_proxy_config::RouteSpecifier,
};
use envoy_types::pb::xds::r#type::matcher::v3::matcher::on_match;
use prost::Message;

use super::super::stream::tests::{
    cluster, forwarding, gateway_listener, listener, port_of, probe, typed, vhost,
};
use super::super::{Translation, Translator, translate};
use super::{BLEND_PREFIX, UDP_PROXY_FILTER, probe_listener_name};
use crate::model;
use crate::xds::snapshot::{CLUSTER, ENDPOINT, LISTENER};

const UDP: &str = "ns/gw/53/udp";

fn endpoint(address: &str) -> model::Endpoint {
    model::Endpoint {
        address: address.into(),
        port: 5353,
        condition: model::EndpointCondition::READY,
        zone: None,
        leaving: false,
    }
}

/// A UDP port whose one virtual host sends to `backends`; clusters a, b and c with one
/// endpoint each.
fn config(backends: &[(&str, u32)], unavailable_weight: u32) -> model::Config {
    let clusters = [
        ("a", "198.18.0.1"),
        ("b", "198.18.0.2"),
        ("c", "198.18.0.3"),
    ]
    .into_iter()
    .map(|(name, address)| model::Cluster {
        endpoints: vec![endpoint(address)],
        ..cluster(name)
    })
    .collect();
    model::Config {
        listeners: model::ListenerSettings {
            probe_token: "token".into(),
            ..Default::default()
        },
        gateway_listeners: vec![gateway_listener(UDP, 20053, model::ListenerProtocol::Udp)],
        virtual_hosts: vec![vhost(
            "ns/dns",
            UDP,
            &["*"],
            forwarding(backends, unavailable_weight),
        )],
        clusters,
        secrets: Vec::new(),
        endpoint_probes: Vec::new(),
        version_probes: vec![probe("ns/dns", UDP, "v1")],
    }
}

/// The cluster a UDP listener sends every session to.
fn udp_cluster(t: &Translation) -> String {
    let udp = listener(t, UDP);
    assert_eq!(udp.listener_filters.len(), 1);
    assert_eq!(udp.listener_filters[0].name, UDP_PROXY_FILTER);
    let Some(listener_filter::ConfigType::TypedConfig(any)) = &udp.listener_filters[0].config_type
    else {
        panic!("a typed config");
    };
    let proxy = UdpProxyConfig::decode(any.value.as_slice()).expect("a UdpProxyConfig");
    let Some(RouteSpecifier::Matcher(matcher)) = proxy.route_specifier else {
        panic!("a matcher");
    };
    let Some(on_match::OnMatch::Action(action)) = matcher.on_no_match.and_then(|m| m.on_match)
    else {
        panic!("an action for every datagram");
    };
    assert_eq!(action.name, "ns/dns", "named after the virtual host");
    let route = action.typed_config.expect("a route");
    UdpRoute::decode(route.value.as_slice())
        .expect("a Route")
        .cluster
}

fn assignment(t: &Translation, name: &str) -> ClusterLoadAssignment {
    let resource = &t.snapshot.resources(ENDPOINT).expect("endpoints")[name];
    ClusterLoadAssignment::decode(resource.body.value.as_slice()).expect("an assignment")
}

/// Each locality of an assignment: its name, weight and endpoint addresses.
fn localities(cla: &ClusterLoadAssignment) -> Vec<(String, u32, Vec<String>)> {
    (cla.endpoints.iter())
        .map(|l| {
            let addresses = (l.lb_endpoints.iter())
                .map(|e| {
                    use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
                    let Some(HostIdentifier::Endpoint(e)) = &e.host_identifier else {
                        panic!("an endpoint");
                    };
                    let Some(address::Address::SocketAddress(s)) =
                        e.address.as_ref().and_then(|a| a.address.clone())
                    else {
                        panic!("a socket address");
                    };
                    let Some(socket_address::PortSpecifier::PortValue(port)) = s.port_specifier
                    else {
                        panic!("a port");
                    };
                    format!("{}:{port}", s.address)
                })
                .collect();
            let locality = l.locality.clone().expect("a locality");
            let weight = l.load_balancing_weight.expect("a weight").value;
            (locality.sub_zone, weight, addresses)
        })
        .collect()
}

#[test]
fn a_udp_port_sends_every_datagram_to_its_one_backend_and_answers_probes_over_tcp() {
    let t = translate(&config(&[("a", 1)], 0));
    assert_eq!(t.problems, [], "{:#?}", t.problems);
    let udp = listener(&t, UDP);
    assert_eq!(port_of(&udp.address), 20053);
    let Some(address::Address::SocketAddress(s)) = udp.address.and_then(|a| a.address) else {
        panic!("a socket address");
    };
    assert_eq!(s.protocol, socket_address::Protocol::Udp as i32);
    assert!(udp.udp_listener_config.is_some());
    assert!(udp.filter_chains.is_empty());
    assert_eq!(udp_cluster(&t), "a");

    // The probe port: a TCP listener of its own, right after the UDP one by name, whose
    // one chain answers the version probes from the port's route configuration, inline.
    let names: Vec<&String> = t
        .snapshot
        .resources(LISTENER)
        .expect("listeners")
        .keys()
        .collect();
    let at = names
        .iter()
        .position(|n| *n == UDP)
        .expect("the UDP listener");
    assert_eq!(*names[at + 1], probe_listener_name(UDP));
    let probes = listener(&t, &probe_listener_name(UDP));
    assert_eq!(port_of(&probes.address), 30053);
    assert_eq!(probes.filter_chains.len(), 1);
    assert!(probes.filter_chains[0].filter_chain_match.is_none());
    let hcm: HttpConnectionManager = typed(&probes.filter_chains[0].filters[0].config_type);
    let Some(HcmRoutes::RouteConfig(routes)) = hcm.route_specifier else {
        panic!("an inline route configuration");
    };
    let hosts: Vec<&str> = (routes.virtual_hosts.iter())
        .map(|v| v.name.as_str())
        .collect();
    assert!(hosts.contains(&"switchyard-probe/ns/dns"), "{hosts:?}");
    assert!(
        !hosts.contains(&"ns/dns"),
        "a user's virtual host is never answered there"
    );
    // No route configuration is served for the port over RDS.
    assert!(
        !t.snapshot
            .resources(crate::xds::snapshot::ROUTE)
            .is_some_and(|r| r.contains_key(UDP))
    );
}

#[test]
fn backends_by_weight_are_a_blend_of_their_endpoints_made_again_when_they_change() {
    let mut config = config(&[("a", 3), ("b", 1), ("c", 0)], 1);
    let mut translator = Translator::new();
    let t = translator.update(&config);
    assert_eq!(t.problems, [], "{:#?}", t.problems);
    let blend = udp_cluster(&t);
    assert!(blend.starts_with(BLEND_PREFIX), "{blend}");
    let cds = &t.snapshot.resources(CLUSTER).expect("clusters")[&blend];
    let cluster = Cluster::decode(cds.body.value.as_slice()).expect("a Cluster");
    assert!(
        cluster
            .common_lb_config
            .and_then(|c| c.locality_config_specifier)
            .is_some()
    );
    // Its sessions are not capped at Envoy's default 1024 connections.
    let limits = cluster.circuit_breakers.expect("limits").thresholds;
    assert_eq!(
        limits[0].max_connections.as_ref().map(|v| v.value),
        Some(u32::MAX)
    );
    // One locality per backend of weight above 0, weighted as it is; the unavailable
    // share goes to the discard port, where datagrams go no further.
    assert_eq!(
        localities(&assignment(&t, &blend)),
        [
            ("a".into(), 3, vec!["198.18.0.1:5353".into()]),
            ("b".into(), 1, vec!["198.18.0.2:5353".into()]),
            (
                model::UNAVAILABLE_CLUSTER.into(),
                1,
                vec!["127.0.0.1:9".into()]
            ),
        ]
    );

    // A backend's endpoints change: the blend's too, as a fresh translation makes them.
    config.clusters[1].endpoints.push(endpoint("198.18.0.4"));
    let t = translator.update(&config);
    assert_eq!(t.snapshot.version(), translate(&config).snapshot.version());
    assert_eq!(
        localities(&assignment(&t, &blend))[1].2,
        ["198.18.0.2:5353", "198.18.0.4:5353"]
    );

    // Other weights are another blend; the first goes once nothing uses it.
    config.virtual_hosts[0].routes = vec![forwarding(&[("a", 1), ("b", 1)], 0)];
    let t = translator.update(&config);
    assert_eq!(t.snapshot.version(), translate(&config).snapshot.version());
    let other = udp_cluster(&t);
    assert_ne!(other, blend);
    let clusters = t.snapshot.resources(CLUSTER).expect("clusters");
    assert!(clusters.contains_key(&other) && !clusters.contains_key(&blend));
    assert!(
        !t.snapshot
            .resources(ENDPOINT)
            .expect("endpoints")
            .contains_key(&blend)
    );

    // One backend again: no blend at all.
    config.virtual_hosts[0].routes = vec![forwarding(&[("c", 1)], 0)];
    let t = translator.update(&config);
    assert_eq!(udp_cluster(&t), "c");
    let clusters = t.snapshot.resources(CLUSTER).expect("clusters");
    assert!(!clusters.keys().any(|c| c.starts_with(BLEND_PREFIX)));
    assert_eq!(t.snapshot.version(), translate(&config).snapshot.version());
}

#[test]
fn without_a_usable_backend_every_datagram_is_dropped_and_without_a_route_refused() {
    // A rule none of whose backends can be used answers instead of forwarding.
    let mut refusing = config(&[("a", 1)], 0);
    refusing.virtual_hosts[0].routes[0].action = model::RouteAction::Respond(500);
    let t = translate(&refusing);
    assert_eq!(udp_cluster(&t), model::UNAVAILABLE_CLUSTER);
    // No virtual host served: no UDP listener (Envoy's port is closed), its probes still
    // answered.
    let mut bare = config(&[("a", 1)], 0);
    bare.virtual_hosts.clear();
    bare.version_probes = vec![probe("ns/gw-53", UDP, "l1")];
    let t = translate(&bare);
    let listeners = t.snapshot.resources(LISTENER).expect("listeners");
    assert!(!listeners.contains_key(UDP));
    assert!(listeners.contains_key(&probe_listener_name(UDP)));
}

#[test]
fn a_udp_virtual_host_has_no_host_name_and_no_tls() {
    let mut named = config(&[("a", 1)], 0);
    named.virtual_hosts[0].hosts = vec!["dns.example.com".into()];
    let t = translate(&named);
    let messages: Vec<&str> = t.problems.iter().map(|p| p.message()).collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("is UDP: datagrams have no host name")),
        "{messages:?}"
    );
    let listeners = t.snapshot.resources(LISTENER).expect("listeners");
    assert!(!listeners.contains_key(UDP), "not served");
}

#[test]
fn a_backend_named_twice_gets_both_its_weights() {
    let twice = super::target(&[("a".into(), 1), ("b".into(), 1), ("a".into(), 1)]);
    let super::Target::Blend(blend) = twice else {
        panic!("a blend");
    };
    assert_eq!(blend.members, [("a".to_owned(), 2), ("b".to_owned(), 1)]);
    // One backend named twice is that backend.
    let once = super::target(&[("a".into(), 1), ("a".into(), 3)]);
    assert_eq!(once, super::Target::Cluster("a".into()));
}

#[test]
fn a_udp_cluster_is_named_apart_from_the_tcp_port_of_its_number_and_not_capped() {
    let service = model::ServiceRef {
        namespace: "ns".into(),
        name: "dns".into(),
        port: 53,
    };
    let udp = model::ClusterSettings {
        udp: true,
        ..Default::default()
    };
    assert_eq!(
        model::cluster_name(&service, &Default::default()),
        "ns/dns/53"
    );
    assert_eq!(model::cluster_name(&service, &udp), "ns/dns/53/udp");
    let tuned = model::ClusterSettings {
        http2: true,
        ..udp.clone()
    };
    assert!(model::cluster_name(&service, &tuned).starts_with("ns/dns/53/udp/"));
    let c = super::super::cluster::cluster(&model::Cluster {
        name: "ns/dns/53/udp".into(),
        service,
        settings: udp,
        endpoints: Vec::new(),
    });
    let limits = c.circuit_breakers.expect("limits").thresholds;
    assert_eq!(
        limits[0].max_connections.as_ref().map(|v| v.value),
        Some(u32::MAX)
    );
}
