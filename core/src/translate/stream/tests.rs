//! TCP and TLS Gateway listeners, through the whole translation.

use envoy_types::pb::envoy::config::listener::v3::{Listener, filter, listener_filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
use prost::Message;

use super::super::{Translator, translate};
use super::TCP_PROXY_FILTER;
use crate::model;
use crate::xds::snapshot::{LISTENER, ROUTE, SECRET};

const TLS: &str = "ns/gw/443/tls";
const TCP: &str = "ns/gw/5432/tcp";

pub(in crate::translate) fn cluster(name: &str) -> model::Cluster {
    model::Cluster {
        name: name.into(),
        service: model::ServiceRef {
            namespace: "ns".into(),
            name: name.into(),
            port: 80,
        },
        settings: Default::default(),
        endpoints: Vec::new(),
    }
}

pub(in crate::translate) fn forwarding(
    backends: &[(&str, u32)],
    unavailable_weight: u32,
) -> model::Route {
    model::Route {
        name: "r".into(),
        path: model::PathMatch::Prefix("/".into()),
        headers: Vec::new(),
        method: None,
        query: Vec::new(),
        action: model::RouteAction::Forward(model::Forward {
            backends: (backends.iter())
                .map(|(c, w)| model::WeightedCluster {
                    cluster: (*c).into(),
                    weight: *w,
                    request_headers: Default::default(),
                })
                .collect(),
            unavailable_weight,
            ..Default::default()
        }),
        request_headers: Default::default(),
        response_headers: Default::default(),
    }
}

pub(in crate::translate) fn vhost(
    name: &str,
    listener: &str,
    hosts: &[&str],
    route: model::Route,
) -> model::VirtualHost {
    model::VirtualHost {
        name: name.into(),
        listener: Some(listener.into()),
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        tls: None,
        routes: vec![route],
        leaving: false,
        created: None,
    }
}

pub(in crate::translate) fn gateway_listener(
    name: &str,
    port: u16,
    protocol: model::ListenerProtocol,
) -> model::GatewayListener {
    model::GatewayListener {
        name: name.into(),
        port,
        probe_port: port + 10000,
        tls: false,
        default_secret: None,
        client_validation: None,
        protocol,
    }
}

pub(in crate::translate) fn probe(id: &str, listener: &str, version: &str) -> model::VersionProbe {
    model::VersionProbe {
        id: id.into(),
        version: version.into(),
        listener: Some(listener.into()),
        ..Default::default()
    }
}

/// A TLS port with a passthrough and a terminating virtual host, and a TCP port.
fn config() -> model::Config {
    let mut terminate = vhost(
        "ns/terminate",
        TLS,
        &["tls.example.com"],
        forwarding(&[("b", 3), ("c", 1)], 0),
    );
    terminate.tls = Some(model::VirtualHostTls {
        secret: "ns/cert".into(),
        redirect_http: false,
        listener_hostname: None,
    });
    model::Config {
        listeners: model::ListenerSettings {
            probe_token: "token".into(),
            ..Default::default()
        },
        gateway_listeners: vec![
            gateway_listener(TLS, 20443, model::ListenerProtocol::Tls),
            gateway_listener(TCP, 25432, model::ListenerProtocol::Tcp),
        ],
        virtual_hosts: vec![
            vhost(
                "ns/passthrough",
                TLS,
                &["abc.example.com"],
                forwarding(&[("a", 1)], 0),
            ),
            terminate,
            vhost("ns/db", TCP, &["*"], forwarding(&[("a", 1)], 1)),
        ],
        clusters: vec![cluster("a"), cluster("b"), cluster("c")],
        secrets: vec![model::TlsSecret {
            name: "ns/cert".into(),
            certificate_chain: "CERT".into(),
            private_key: "KEY".into(),
        }],
        endpoint_probes: Vec::new(),
        version_probes: vec![
            probe("ns/passthrough", TLS, "p1"),
            probe("ns/terminate", TLS, "t1"),
            probe("ns/db", TCP, "d1"),
            probe("ns/gw-443", TLS, "l1"),
        ],
    }
}

pub(in crate::translate) fn listener(t: &super::super::Translation, name: &str) -> Listener {
    let resource = &t.snapshot.resources(LISTENER).expect("listeners")[name];
    Listener::decode(resource.body.value.as_slice()).expect("a Listener")
}

pub(in crate::translate) fn typed<M: Message + Default>(config: &Option<filter::ConfigType>) -> M {
    let Some(filter::ConfigType::TypedConfig(any)) = config else {
        panic!("a typed config");
    };
    M::decode(any.value.as_slice()).expect("decodes")
}

pub(in crate::translate) fn port_of(
    address: &Option<envoy_types::pb::envoy::config::core::v3::Address>,
) -> u32 {
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
    let Some(address::Address::SocketAddress(s)) = address.as_ref().and_then(|a| a.address.clone())
    else {
        panic!("a socket address");
    };
    let Some(socket_address::PortSpecifier::PortValue(p)) = s.port_specifier else {
        panic!("a port");
    };
    p
}

#[test]
fn a_tls_port_forwards_each_server_name_whole_and_answers_its_probes_itself() {
    let t = translate(&config());
    assert_eq!(t.problems, [], "{:#?}", t.problems);
    let tls = listener(&t, TLS);
    assert_eq!(port_of(&tls.address), 20443);
    let extra: Vec<u32> = (tls.additional_addresses.iter())
        .map(|a| port_of(&a.address))
        .collect();
    assert_eq!(extra, [30443]);
    let inspectors: Vec<&str> = tls
        .listener_filters
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(inspectors, ["envoy.filters.listener.tls_inspector"]);
    assert!(matches!(
        tls.listener_filters[0].config_type,
        Some(listener_filter::ConfigType::TypedConfig(_))
    ));
    let chains: Vec<&str> = tls.filter_chains.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(chains, ["ns/passthrough", "ns/terminate", "probe"]);

    // Passed through: matched by name over TLS, not decrypted, to its one cluster.
    let passthrough = &tls.filter_chains[0];
    let m = passthrough.filter_chain_match.clone().expect("a match");
    assert_eq!(m.server_names, ["abc.example.com"]);
    assert_eq!(m.transport_protocol, "tls");
    assert!(passthrough.transport_socket.is_none());
    assert_eq!(passthrough.filters[0].name, TCP_PROXY_FILTER);
    let proxy: TcpProxy = typed(&passthrough.filters[0].config_type);
    assert_eq!(
        proxy.cluster_specifier,
        Some(ClusterSpecifier::Cluster("a".into()))
    );
    assert_eq!(proxy.access_log.len(), 1, "each connection is logged");

    // Terminated: decrypted with its secret, then to its clusters by weight.
    let terminate = &tls.filter_chains[1];
    let socket = terminate.transport_socket.clone().expect("TLS");
    let Some(envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(
        any,
    )) = socket.config_type
    else {
        panic!("a typed transport socket");
    };
    let context = DownstreamTlsContext::decode(any.value.as_slice()).unwrap();
    let sds = &context
        .common_tls_context
        .unwrap()
        .tls_certificate_sds_secret_configs;
    assert_eq!(sds[0].name, "ns/cert");
    let proxy: TcpProxy = typed(&terminate.filters[0].config_type);
    let Some(ClusterSpecifier::WeightedClusters(w)) = proxy.cluster_specifier else {
        panic!("weighted clusters");
    };
    let weights: Vec<(&str, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), c.weight))
        .collect();
    assert_eq!(weights, [("b", 3), ("c", 1)]);
    assert!(
        t.snapshot
            .resources(SECRET)
            .unwrap()
            .contains_key("ns/cert")
    );

    // The probe port: plain HTTP, routed with the listener's own route configuration,
    // inline: no RDS resource for it.
    let probe = &tls.filter_chains[2];
    let m = probe.filter_chain_match.clone().expect("a match");
    assert_eq!(m.destination_port.map(|p| p.value), Some(30443));
    let hcm: HttpConnectionManager = typed(&probe.filters[0].config_type);
    let Some(RouteSpecifier::RouteConfig(routes)) = hcm.route_specifier else {
        panic!("an inline route configuration");
    };
    assert_eq!(routes.name, TLS);
    let vhosts: Vec<&str> = routes
        .virtual_hosts
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    for id in ["ns/passthrough", "ns/terminate", "ns/gw-443"] {
        let name = format!("{}{id}", super::super::VERSION_PROBE_VHOST_PREFIX);
        assert!(vhosts.contains(&name.as_str()), "{name} in {vhosts:?}");
    }
    // Its user virtual hosts are its filter chains, never routes of the probe port; the
    // probes answer by themselves (an inline configuration's clusters are checked, and
    // the share of closed connections names none).
    assert!(!vhosts.iter().any(|v| v.starts_with("ns/")), "{vhosts:?}");
    assert_eq!(routes.validate_clusters.map(|v| v.value), Some(false));
    let rds = t.snapshot.resources(ROUTE).unwrap();
    assert!(
        !rds.contains_key(TLS) && !rds.contains_key(TCP),
        "{:?}",
        rds.keys().collect::<Vec<_>>()
    );
}

#[test]
fn a_tcp_port_forwards_every_connection_to_its_one_virtual_host() {
    let t = translate(&config());
    let tcp = listener(&t, TCP);
    assert!(
        tcp.listener_filters.is_empty(),
        "no inspector: the server may speak first"
    );
    let db = &tcp.filter_chains[0];
    assert_eq!(db.name, "ns/db");
    assert!(db.filter_chain_match.is_none(), "every connection");
    let proxy: TcpProxy = typed(&db.filters[0].config_type);
    let Some(ClusterSpecifier::WeightedClusters(w)) = proxy.cluster_specifier else {
        panic!("weighted clusters");
    };
    // The share of backends the front-end could not use: a cluster Envoy does not have,
    // so such a connection is closed.
    let weights: Vec<(&str, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), c.weight))
        .collect();
    assert_eq!(weights, [("a", 1), (model::UNAVAILABLE_CLUSTER, 1)]);
    assert_eq!(tcp.filter_chains[1].name, "probe");
}

#[test]
fn a_proxy_protocol_header_is_read_before_the_server_name() {
    let mut config = config();
    config.listeners.client_ip.proxy_protocol = true;
    let t = translate(&config);
    let names = |l: &Listener| -> Vec<String> {
        l.listener_filters.iter().map(|f| f.name.clone()).collect()
    };
    assert_eq!(
        names(&listener(&t, TLS)),
        [
            "envoy.filters.listener.proxy_protocol",
            "envoy.filters.listener.tls_inspector"
        ]
    );
    assert_eq!(
        names(&listener(&t, TCP)),
        ["envoy.filters.listener.proxy_protocol"]
    );
}

#[test]
fn a_version_change_is_the_listeners_own_and_incremental_translation_agrees() {
    let mut config = config();
    let mut translator = Translator::new();
    let before = translator.update(&config);
    assert_eq!(
        before.snapshot.version(),
        translate(&config).snapshot.version()
    );
    // The terminating host moves to one cluster, at a new version.
    config.virtual_hosts[1].routes = vec![forwarding(&[("c", 1)], 0)];
    config.version_probes[1].version = "t2".into();
    let after = translator.update(&config);
    assert_eq!(
        after.snapshot.version(),
        translate(&config).snapshot.version()
    );
    let old = listener(&before, TLS);
    let new = listener(&after, TLS);
    // Only its chain and the probe chain (its answer) changed: Envoy drains no other.
    assert_eq!(old.filter_chains[0], new.filter_chains[0]);
    assert_ne!(old.filter_chains[1], new.filter_chains[1]);
    assert_ne!(old.filter_chains[2], new.filter_chains[2]);
    assert_eq!(listener(&before, TCP), listener(&after, TCP));
    // A version probe alone changing is a listener change too.
    config.version_probes[2].version = "d2".into();
    let probed = translator.update(&config);
    assert_ne!(listener(&after, TCP), listener(&probed, TCP));
    assert_eq!(
        probed.snapshot.version(),
        translate(&config).snapshot.version()
    );
}

#[test]
fn what_a_connection_listener_cannot_serve_is_refused() {
    let mut config = config();
    config.virtual_hosts.push(vhost(
        "ns/named",
        TCP,
        &["db.example.com"],
        forwarding(&[("a", 1)], 0),
    ));
    let mut two = vhost(
        "ns/two",
        TLS,
        &["two.example.com"],
        forwarding(&[("a", 1)], 0),
    );
    two.routes.push(forwarding(&[("b", 1)], 0));
    config.virtual_hosts.push(two);
    let t = translate(&config);
    let problems: Vec<String> = t.problems.iter().map(|p| p.to_string()).collect();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("ns/named") && p.contains("only host is \"*\"")),
        "{problems:#?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("ns/two") && p.contains("one route")),
        "{problems:#?}"
    );
    let chains: Vec<String> = (listener(&t, TLS).filter_chains.iter())
        .map(|c| c.name.clone())
        .collect();
    assert!(!chains.contains(&"ns/two".to_owned()));
}
