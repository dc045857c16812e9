//! Property tests of the translator over random, valid-ish configurations (names drawn from
//! small pools so that references, duplicates and conflicts happen often; some values are
//! invalid on purpose).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster as EnvoyCluster;
use envoy_types::pb::envoy::config::core::v3::transport_socket;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter, listener_filter};
use envoy_types::pb::envoy::config::route::v3::{
    RouteConfiguration, route::Action, route_action::ClusterSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier, http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    TcpProxy, tcp_proxy::ClusterSpecifier as TcpClusters,
};
use envoy_types::pb::envoy::extensions::filters::udp::udp_proxy::v3::{
    Route as UdpRoute, UdpProxyConfig, udp_proxy_config::RouteSpecifier as UdpRoutes,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, UpstreamTlsContext,
};
use envoy_types::pb::xds::r#type::matcher::v3::matcher::on_match;
use proptest::prelude::*;
use proptest::sample::select;
use prost::{Message, Name};

use switchyard::model::*;
use switchyard::translate::{
    ROUTE_CONFIG_NAME, Translation, Translator, check_consistency, translate,
};
use switchyard::xds::snapshot::{CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET};

const CLUSTERS: &[&str] = &[
    "ns/a/80",
    "ns/b/80",
    "ns/c/8080",
    "other/d/80",
    "ns/missing/80",
];
const GATEWAY_LISTENERS: &[&str] = &["gw/http", "gw/https", "gw/other"];
const SECRETS: &[&str] = &["ns/cert", "ns/wild", "ns/missing-cert"];
const HOSTS: &[&str] = &[
    "a.example.com",
    "A.example.com",
    "b.example.com",
    "c.example.com",
    "d.example.com",
    "e.example.com",
    "f.example.com",
    "g.example.com",
    "*.c.example.com",
    "*.d.example.com",
];
const BAD_HOSTS: &[&str] = &["d.*", "*", ""];
const VHOSTS: &[&str] = &[
    "ns/a",
    "ns/b",
    "ns/c",
    "ns/d",
    "ns/e",
    "ns/f",
    "other/x",
    "other/y",
    "switchyard-probe/ns/a",
];
const REGEXES: &[&str] = &["^/v[0-9]+/", "/items/[a-z-]+$", "(?i)/x"];
const BAD_REGEXES: &[&str] = &["(unclosed", "[a-z&&b]", ""];
const HEADER_NAMES: &[&str] = &["x-user", "x-canary", "x-tenant"];
const BAD_HEADER_NAMES: &[&str] = &["host", ":path", ""];

/// Mostly `good`, sometimes `bad`.
fn mostly(
    good: &'static [&'static str],
    bad: &'static [&'static str],
) -> impl Strategy<Value = &'static str> + Clone {
    prop_oneof![60 => select(good.to_vec()), 1 => select(bad.to_vec())]
}
const PROBES: &[&str] = &["ns/a@1", "ns/a@2", "ns/b@1", ""];

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        (1u64..30).prop_map(Duration::from_secs),
        (1u64..5000).prop_map(Duration::from_millis),
    ]
}

fn endpoint() -> impl Strategy<Value = Endpoint> {
    (
        mostly(
            &["10.0.0.1", "10.0.0.2", "10.0.0.10", "fd00::1"],
            &["not-an-ip"],
        ),
        prop_oneof![30 => select(vec![80u16, 8080]), 1 => Just(0u16)],
        any::<(bool, bool, bool)>(),
        proptest::option::of(select(vec!["z1", "z2"])),
    )
        .prop_map(
            |(address, port, (ready, serving, terminating), zone)| Endpoint {
                address: address.into(),
                port,
                condition: EndpointCondition {
                    ready,
                    serving,
                    terminating,
                },
                zone: zone.map(Into::into),
                leaving: false,
            },
        )
}

fn cluster(name: &'static str) -> impl Strategy<Value = Cluster> {
    (
        prop_oneof![20 => Just(Duration::from_secs(2)), 1 => duration()],
        any::<bool>(),
        proptest::option::of((
            proptest::option::of(0u32..100),
            proptest::option::of(0u32..100),
        )),
        proptest::collection::vec(endpoint(), 0..5),
        // TLS to the endpoints, sometimes.
        proptest::option::weighted(0.2, any::<bool>()),
        // A UDP port, sometimes.
        proptest::bool::weighted(0.2),
        // Endpoints held after their slices were deleted, sometimes.
        proptest::bool::weighted(0.2),
    )
        .prop_map(
            move |(connect_timeout, http2, cb, mut endpoints, tls, udp, held)| Cluster {
                name: name.into(),
                service: ServiceRef {
                    namespace: "ns".into(),
                    name: name.into(),
                    port: 80,
                },
                settings: ClusterSettings {
                    outlier_detection: None,
                    health_check: None,
                    tls: tls.map(|with_names| switchyard::model::UpstreamTls {
                        sni: "backend.test".into(),
                        ca_certificates:
                            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
                        // Presenting a client certificate, which the config may not have.
                        client_certificate: with_names.then(|| SECRETS[0].to_owned()),
                        subject_alt_names: if with_names {
                            vec![switchyard::model::SubjectAltName::Uri("spiffe://b".into())]
                        } else {
                            Vec::new()
                        },
                    }),
                    lb_policy: Default::default(),
                    connect_timeout,
                    udp,
                    http2,
                    circuit_breakers: cb.map(|(max_connections, max_requests)| CircuitBreakers {
                        max_connections,
                        max_pending_requests: None,
                        max_requests,
                        max_retries: Some(3),
                    }),
                },
                endpoints: {
                    for endpoint in &mut endpoints {
                        endpoint.leaving = held;
                    }
                    endpoints
                },
            },
        )
}

/// Mostly one definition per name; sometimes a name twice, the same or different.
fn with_duplicates<T: Clone + std::fmt::Debug>(
    items: impl Strategy<Value = Vec<T>>,
    extra: impl Strategy<Value = T>,
) -> impl Strategy<Value = Vec<T>> {
    (
        items,
        prop_oneof![8 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)],
        extra,
    )
        .prop_map(|(mut items, dup, extra)| {
            match dup {
                1 => {
                    if let Some(first) = items.first().cloned() {
                        items.push(first);
                    }
                }
                2 => items.push(extra),
                _ => {}
            }
            items
        })
}

fn clusters() -> impl Strategy<Value = Vec<Cluster>> {
    let per_name: Vec<_> = CLUSTERS[..4]
        .iter()
        .map(|n| proptest::option::weighted(0.95, cluster(n)))
        .collect();
    with_duplicates(
        per_name.prop_map(|v| v.into_iter().flatten().collect()),
        cluster(CLUSTERS[0]),
    )
}

fn header_match() -> impl Strategy<Value = HeaderMatch> {
    (
        mostly(HEADER_NAMES, BAD_HEADER_NAMES),
        prop_oneof![
            select(vec!["yes", ""]).prop_map(|v| HeaderValueMatch::Exact(v.into())),
            mostly(&["pre"], &[""]).prop_map(|v| HeaderValueMatch::Prefix(v.into())),
            mostly(REGEXES, BAD_REGEXES).prop_map(|v| HeaderValueMatch::Regex(v.into())),
            Just(HeaderValueMatch::Present),
        ],
        any::<bool>(),
    )
        .prop_map(|(name, value, invert)| HeaderMatch {
            name: name.into(),
            value,
            invert,
        })
}

fn header_edits() -> impl Strategy<Value = HeaderEdits> {
    let pair = (
        mostly(&["x-a", "x-b"], &["host"]),
        mostly(&["1", "two"], &["bad\r\n"]),
    )
        .prop_map(|(k, v)| (k.to_owned(), v.to_owned()));
    (
        proptest::collection::vec(pair.clone(), 0..2),
        proptest::collection::vec(pair, 0..2),
        proptest::collection::vec(
            mostly(&["x-c", "server"], &[":authority"]).prop_map(String::from),
            0..2,
        ),
    )
        .prop_map(|(set, add, remove)| HeaderEdits { set, add, remove })
}

fn forward() -> impl Strategy<Value = Forward> {
    let backend = (
        mostly(&CLUSTERS[..4], &CLUSTERS[4..]),
        prop_oneof![1 => Just(0u32), 20 => 1u32..100],
    )
        .prop_map(|(c, weight)| WeightedCluster {
            cluster: c.into(),
            weight,
            request_headers: Default::default(),
        });
    (
        prop_oneof![60 => proptest::collection::vec(backend, 1..4), 1 => Just(Vec::new())],
        proptest::option::of(duration()),
        proptest::option::of(duration()),
        proptest::option::of((
            proptest::collection::vec(
                select(vec!["5xx", "connect-failure", "reset"]).prop_map(String::from),
                1..3,
            ),
            0u32..5,
            proptest::option::of(duration()),
            proptest::collection::vec(select(vec![500u32, 502, 503, 504]), 0..3),
            proptest::option::of((1u64..500).prop_map(Duration::from_millis)),
        )),
        proptest::option::of(select(vec!["/", "/v2/"]).prop_map(String::from)),
        proptest::bool::ANY,
    )
        .prop_map(
            |(backends, timeout, idle_timeout, retry, prefix_rewrite, websocket)| Forward {
                backends,
                timeout,
                idle_timeout,
                retry: retry.map(
                    |(retry_on, num_retries, per_try_timeout, retriable_status_codes, backoff)| {
                        Box::new(RetryPolicy {
                            retry_on,
                            num_retries,
                            per_try_timeout,
                            retriable_status_codes,
                            backoff,
                        })
                    },
                ),
                prefix_rewrite,
                websocket,
                ..Forward::default()
            },
        )
}

fn route() -> impl Strategy<Value = Route> {
    (
        select(vec!["r1", "r2", ""]),
        prop_oneof![
            select(vec!["/", "/api/"]).prop_map(|p| PathMatch::Prefix(p.into())),
            Just(PathMatch::Exact("/healthz".into())),
            Just(PathMatch::SegmentPrefix("/docs".into())),
            mostly(REGEXES, BAD_REGEXES).prop_map(|p| PathMatch::Regex(p.into())),
        ],
        proptest::collection::vec(header_match(), 0..2),
        prop_oneof![
            5 => forward().prop_map(RouteAction::Forward),
            1 => Just(RouteAction::RedirectHttps),
            1 => Just(RouteAction::Respond(500)),
            1 => Just(RouteAction::Redirect(switchyard::model::Redirect {
                scheme: Some("https".into()),
                host: Some("new.example.com".into()),
                port: None,
                path: Some(switchyard::model::RedirectPath::Prefix("/new".into())),
                status: 301,
            })),
        ],
        header_edits(),
        header_edits(),
    )
        .prop_map(
            |(name, path, headers, action, request_headers, response_headers)| Route {
                name: name.into(),
                path,
                headers,
                method: None,
                query: Vec::new(),
                action,
                request_headers,
                response_headers,
            },
        )
}

fn virtual_host(name: &'static str) -> impl Strategy<Value = VirtualHost> {
    (
        Just(name),
        prop_oneof![
            20 => proptest::collection::vec(mostly(HOSTS, BAD_HOSTS).prop_map(String::from), 1..3),
            1 => Just(Vec::new()),
        ],
        proptest::option::weighted(0.3, (mostly(&SECRETS[..2], &SECRETS[2..]), any::<bool>())),
        proptest::collection::vec(route(), 1..4),
        listener(),
    )
        .prop_map(|(name, hosts, tls, routes, listener)| VirtualHost {
            listener,
            leaving: false,
            created: None,
            name: name.into(),
            hosts,
            tls: tls.map(|(secret, redirect_http)| VirtualHostTls {
                secret: secret.into(),
                redirect_http,
                listener_hostname: None,
            }),
            routes,
        })
}

/// Mostly the shared listeners; else a Gateway listener, defined or not.
fn listener() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        6 => Just(None),
        2 => select(GATEWAY_LISTENERS[..2].to_vec()).prop_map(|l| Some(l.to_owned())),
        1 => Just(Some("gw/undefined".to_owned())),
    ]
}

/// Gateway listeners: a plain and a TLS one by those names, sometimes on a taken port.
fn gateway_listeners() -> impl Strategy<Value = Vec<GatewayListener>> {
    let one = (
        select(GATEWAY_LISTENERS.to_vec()),
        prop_oneof![6 => Just(20000u16), 1 => Just(8080), 1 => Just(20001)],
        any::<bool>(),
        proptest::option::weighted(0.5, select(SECRETS.to_vec())),
        // Client validation, and whether it falls back to serving any client.
        proptest::option::weighted(0.3, any::<bool>()),
        // Mostly requests; sometimes connections, forwarded whole.
        prop_oneof![
            4 => Just(ListenerProtocol::Http),
            1 => Just(ListenerProtocol::Tls),
            1 => Just(ListenerProtocol::Tcp),
            1 => Just(ListenerProtocol::Udp),
        ],
    )
        .prop_map(|(name, port, tls, default_secret, validation, protocol)| {
            let tls = tls && protocol.is_http();
            GatewayListener {
                default_secret: default_secret.filter(|_| tls).map(str::to_owned),
                client_validation: validation.filter(|_| tls).map(|insecure_fallback| {
                    switchyard::model::ClientValidation {
                        ca_certificates:
                            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
                        insecure_fallback,
                    }
                }),
                name: name.into(),
                port: if name.ends_with("https") && port == 20000 {
                    20001
                } else {
                    port
                },
                probe_port: port + 10000,
                tls,
                protocol,
            }
        });
    proptest::collection::vec(one, 0..3)
}

fn secret(name: &'static str) -> impl Strategy<Value = TlsSecret> {
    mostly(&["KEY1", "KEY2"], &[""]).prop_map(move |key| TlsSecret {
        name: name.into(),
        certificate_chain: format!("CERT for {name}"),
        private_key: key.into(),
    })
}

fn virtual_hosts() -> impl Strategy<Value = Vec<VirtualHost>> {
    let names = proptest::sample::subsequence(VHOSTS.to_vec(), 0..7);
    let vhosts =
        names.prop_flat_map(|names| names.into_iter().map(virtual_host).collect::<Vec<_>>());
    with_duplicates(vhosts, virtual_host(VHOSTS[0]))
}

fn secrets() -> impl Strategy<Value = Vec<TlsSecret>> {
    let per_name: Vec<_> = SECRETS[..2]
        .iter()
        .map(|n| proptest::option::weighted(0.9, secret(n)))
        .collect();
    with_duplicates(
        per_name.prop_map(|v| v.into_iter().flatten().collect()),
        secret(SECRETS[0]),
    )
}

fn endpoint_probe() -> impl Strategy<Value = EndpointProbe> {
    (
        mostly(&PROBES[..3], &PROBES[3..]),
        proptest::collection::btree_map(
            mostly(&CLUSTERS[..4], &CLUSTERS[4..]).prop_map(String::from),
            prop_oneof![4 => Just(0u32), 4 => Just(1), 4 => Just(100), 1 => Just(101)],
            0..3,
        ),
    )
        .prop_map(|(id, clusters)| EndpointProbe {
            id: id.into(),
            clusters,
        })
}

fn version_probe() -> impl Strategy<Value = VersionProbe> {
    (
        select(vec!["ns/a", "ns/b", "ns/c"]),
        mostly(&["1", "2-abc"], &["bad\n"]),
        listener(),
    )
        .prop_map(|(id, version, listener)| VersionProbe {
            id: id.into(),
            version: version.into(),
            listener,
            ..Default::default()
        })
}

fn config() -> impl Strategy<Value = Config> {
    (
        prop_oneof![10 => Just("t0k3n"), 1 => Just(""), 1 => Just("bad\ntoken")],
        virtual_hosts(),
        clusters(),
        secrets(),
        proptest::collection::vec(endpoint_probe(), 0..3),
        proptest::collection::vec(version_probe(), 0..3),
        gateway_listeners(),
        any::<bool>(),
    )
        .prop_map(
            |(
                token,
                virtual_hosts,
                clusters,
                secrets,
                endpoint_probes,
                version_probes,
                gateway_listeners,
                virtual_host_discovery,
            )| Config {
                gateway_listeners,
                listeners: ListenerSettings {
                    probe_token: token.into(),
                    virtual_host_discovery,
                    ..Default::default()
                },
                virtual_hosts,
                clusters,
                secrets,
                endpoint_probes,
                version_probes,
            },
        )
}

/// Part of `next`, part of `previous`: item i of each list is taken from `next` when bit
/// i of `mask` is set, and `previous`'s item i stays otherwise. Successive configurations
/// then share some inputs, change others, and add or drop the rest.
fn blend(previous: &Config, next: &Config, mask: u64) -> Config {
    fn pick<T: Clone>(previous: &[T], next: &[T], mask: u64) -> Vec<T> {
        let len = previous.len().max(next.len());
        (0..len)
            .filter_map(|i| {
                if mask & (1 << (i % 64)) != 0 {
                    next.get(i)
                } else {
                    previous.get(i)
                }
                .cloned()
            })
            .collect()
    }
    Config {
        gateway_listeners: if mask & 2 != 0 {
            next.gateway_listeners.clone()
        } else {
            previous.gateway_listeners.clone()
        },
        listeners: if mask & 1 != 0 {
            next.listeners.clone()
        } else {
            previous.listeners.clone()
        },
        virtual_hosts: pick(&previous.virtual_hosts, &next.virtual_hosts, mask),
        clusters: pick(&previous.clusters, &next.clusters, mask.rotate_left(13)),
        secrets: pick(&previous.secrets, &next.secrets, mask.rotate_left(29)),
        endpoint_probes: pick(
            &previous.endpoint_probes,
            &next.endpoint_probes,
            mask.rotate_left(41),
        ),
        version_probes: pick(
            &previous.version_probes,
            &next.version_probes,
            mask.rotate_left(53),
        ),
    }
}

/// A deterministic Fisher–Yates shuffle driven by a seed.
fn shuffle<T>(items: &mut [T], seed: &mut u64) {
    for i in (1..items.len()).rev() {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let j = ((*seed >> 33) % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

fn shuffled(config: &Config, mut seed: u64) -> Config {
    let mut c = config.clone();
    shuffle(&mut c.virtual_hosts, &mut seed);
    shuffle(&mut c.clusters, &mut seed);
    shuffle(&mut c.secrets, &mut seed);
    shuffle(&mut c.endpoint_probes, &mut seed);
    shuffle(&mut c.version_probes, &mut seed);
    shuffle(&mut c.gateway_listeners, &mut seed);
    for cluster in &mut c.clusters {
        shuffle(&mut cluster.endpoints, &mut seed);
    }
    c
}

/// Every (type, name, version, bytes) of a snapshot.
fn fingerprint(t: &Translation) -> Vec<(String, String, String, Vec<u8>)> {
    t.snapshot
        .types()
        .flat_map(|(type_url, rs)| {
            rs.values().map(move |r| {
                (
                    type_url.to_owned(),
                    r.name.clone(),
                    r.version.clone(),
                    r.body.value.clone(),
                )
            })
        })
        .collect()
}

fn decode<M: Message + Default>(bytes: &[u8]) -> M {
    M::decode(bytes).expect("decodes")
}

fn names(t: &Translation, type_url: &str) -> BTreeSet<String> {
    t.snapshot
        .resources(type_url)
        .map(|rs| rs.keys().cloned().collect())
        .unwrap_or_default()
}

/// Every route configuration served: over RDS, and inline in TCP and TLS listeners.
fn route_configurations(t: &Translation) -> Vec<RouteConfiguration> {
    let mut out: Vec<RouteConfiguration> = (t.snapshot.resources(ROUTE).unwrap().values())
        .map(|r| decode(&r.body.value))
        .collect();
    for r in t.snapshot.resources(LISTENER).unwrap().values() {
        let l: Listener = decode(&r.body.value);
        for f in l.filter_chains.iter().flat_map(|c| &c.filters) {
            if let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type
                && any.type_url == HttpConnectionManager::type_url()
                && let Some(RouteSpecifier::RouteConfig(rc)) =
                    decode::<HttpConnectionManager>(&any.value).route_specifier
            {
                out.push(rc);
            }
        }
    }
    out
}

/// A UDP listener's route: the virtual host it is named after, and its cluster.
fn udp_route(l: &Listener) -> Option<(String, String)> {
    let f = l
        .listener_filters
        .iter()
        .find(|f| f.name == "envoy.filters.udp_listener.udp_proxy")?;
    let Some(listener_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        return None;
    };
    let proxy: UdpProxyConfig = decode(&any.value);
    let Some(UdpRoutes::Matcher(m)) = proxy.route_specifier else {
        return None;
    };
    let Some(on_match::OnMatch::Action(action)) = m.on_no_match?.on_match else {
        return None;
    };
    let route: UdpRoute = decode(&action.typed_config?.value);
    Some((action.name, route.cluster))
}

/// What the listeners and routes of a snapshot refer to: (clusters, secrets).
/// The clusters and secrets the served routes, probes, TLS chains and clusters reference;
/// `defined`: the secrets of the config that can be served.
fn references(t: &Translation, defined: &BTreeSet<String>) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut clusters = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    let mut route_configs: Vec<RouteConfiguration> =
        (t.snapshot.resources(ROUTE).unwrap().values())
            .map(|r| decode(&r.body.value))
            .collect();
    // A TCP or TLS listener's, inline.
    for r in t.snapshot.resources(LISTENER).unwrap().values() {
        let l: Listener = decode(&r.body.value);
        for f in l.filter_chains.iter().flat_map(|c| &c.filters) {
            if let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type
                && any.type_url == HttpConnectionManager::type_url()
                && let Some(RouteSpecifier::RouteConfig(rc)) =
                    decode::<HttpConnectionManager>(&any.value).route_specifier
            {
                route_configs.push(rc);
            }
        }
    }
    for rc in &route_configs {
        for route in rc.virtual_hosts.iter().flat_map(|v| &v.routes) {
            if let Some(Action::Route(a)) = &route.action {
                match &a.cluster_specifier {
                    Some(ClusterSpecifier::Cluster(c)) => {
                        clusters.insert(c.clone());
                    }
                    Some(ClusterSpecifier::WeightedClusters(w)) => {
                        clusters.extend(w.clusters.iter().map(|c| c.name.clone()));
                    }
                    _ => {}
                }
            }
        }
    }
    for r in t.snapshot.resources(LISTENER).unwrap().values() {
        let l: Listener = decode(&r.body.value);
        // (The unavailable cluster is no cluster: every datagram is dropped.)
        if let Some((_, cluster)) = udp_route(&l).filter(|(_, c)| c != UNAVAILABLE_CLUSTER) {
            clusters.insert(cluster);
        }
        for chain in l.filter_chains.iter().chain(&l.default_filter_chain) {
            for f in &chain.filters {
                let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
                    continue;
                };
                if any.type_url == TcpProxy::type_url() {
                    match decode::<TcpProxy>(&any.value).cluster_specifier {
                        Some(TcpClusters::Cluster(c)) => {
                            clusters.insert(c);
                        }
                        Some(TcpClusters::WeightedClusters(w)) => {
                            clusters.extend(w.clusters.into_iter().map(|c| c.name));
                        }
                        None => {}
                    }
                    continue;
                }
                let hcm: HttpConnectionManager = decode(&any.value);
                for hf in &hcm.http_filters {
                    let Some(http_filter::ConfigType::TypedConfig(any)) = &hf.config_type else {
                        continue;
                    };
                    if any.type_url == HealthCheck::type_url() {
                        let hc: HealthCheck = decode(&any.value);
                        clusters.extend(hc.cluster_min_healthy_percentages.into_keys());
                    }
                }
            }
            if let Some(socket) = &chain.transport_socket
                && let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type
            {
                let tls: DownstreamTlsContext = decode(&any.value);
                secrets.extend(
                    tls.common_tls_context
                        .into_iter()
                        .flat_map(|c| c.tls_certificate_sds_secret_configs)
                        .map(|s| s.name),
                );
            }
        }
    }
    // A blend's clusters: the localities of its endpoints.
    for (name, r) in t.snapshot.resources(ENDPOINT).unwrap() {
        if name.starts_with("switchyard/blend/") {
            let cla: ClusterLoadAssignment = decode(&r.body.value);
            clusters.extend(
                (cla.endpoints.into_iter())
                    .filter_map(|l| l.locality.map(|l| l.sub_zone))
                    .filter(|c| c != UNAVAILABLE_CLUSTER),
            );
        }
    }
    // The secrets served clusters present to their backends, those the config can serve
    // (one it lacks is reported, and the cluster never warms: no switch reaches it).
    for r in t.snapshot.resources(CLUSTER).unwrap().values() {
        let c: EnvoyCluster = decode(&r.body.value);
        if let Some(socket) = &c.transport_socket
            && let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type
        {
            let tls: UpstreamTlsContext = decode(&any.value);
            secrets.extend(
                (tls.common_tls_context.into_iter())
                    .flat_map(|c| c.tls_certificate_sds_secret_configs)
                    .map(|s| s.name)
                    .filter(|name| defined.contains(name)),
            );
        }
    }
    (clusters, secrets)
}

proptest! {
    /// Incremental translation depends only on where it ends: after any sequence of
    /// changes, the translator holds exactly what a fresh translation of the same
    /// configuration gives.
    #[test]
    fn incremental_translation_equals_a_fresh_one(
        steps in proptest::collection::vec((config(), any::<u64>()), 1..6),
    ) {
        let mut translator = Translator::new();
        let mut current = Config::default();
        for (next, mask) in &steps {
            current = blend(&current, next, *mask);
            let incremental = translator.update(&current);
            let fresh = translate(&current);
            prop_assert_eq!(fingerprint(&incremental), fingerprint(&fresh));
            prop_assert_eq!(incremental.snapshot.version(), fresh.snapshot.version());
            prop_assert_eq!(&incremental.problems, &fresh.problems);
        }
    }

    #[test]
    fn translation_is_deterministic_whatever_the_input_order(config in config(), seed in any::<u64>()) {
        let first = translate(&config);
        let again = translate(&config);
        prop_assert_eq!(fingerprint(&first), fingerprint(&again));
        let reordered = translate(&shuffled(&config, seed));
        prop_assert_eq!(fingerprint(&first), fingerprint(&reordered));
        prop_assert_eq!(first.snapshot.version(), reordered.snapshot.version());
        prop_assert_eq!(&first.problems, &reordered.problems);
    }

    #[test]
    fn every_reference_resolves_within_the_snapshot(config in config()) {
        let t = translate(&config);
        if let Err(e) = check_consistency(&t.snapshot) {
            prop_assert!(false, "inconsistent snapshot:\n{}\nproblems: {:#?}", e, t.problems);
        }
        // Every listener uses the one route configuration; it is always there.
        prop_assert!(names(&t, ROUTE).contains(ROUTE_CONFIG_NAME));
        prop_assert!(names(&t, LISTENER).contains("http"));
        prop_assert!(names(&t, LISTENER).contains("probe"));
        // Every cluster has its load assignment, and nothing else does.
        prop_assert_eq!(names(&t, CLUSTER), names(&t, ENDPOINT));
        // Only what a served route, probe or TLS chain references is served.
        // A secret is served when it has a certificate and a key, and is not defined twice
        // with different contents (the translator leaves both out).
        let mut by_name: BTreeMap<&str, Vec<&switchyard::model::TlsSecret>> = BTreeMap::new();
        for s in &config.secrets {
            by_name.entry(s.name.as_str()).or_default().push(s);
        }
        let defined: BTreeSet<String> = by_name
            .into_iter()
            .filter(|(_, all)| all.iter().all(|s| *s == all[0]))
            .filter(|(_, all)| {
                !all[0].certificate_chain.trim().is_empty() && !all[0].private_key.trim().is_empty()
            })
            .map(|(name, _)| name.to_owned())
            .collect();
        let (clusters, secrets) = references(&t, &defined);
        prop_assert_eq!(names(&t, CLUSTER), clusters);
        prop_assert_eq!(names(&t, SECRET), secrets);
    }

    /// Endpoints held after their slices were deleted serve what is live on them, never a
    /// switch (I3): no endpoint probe served asks a cluster of only held endpoints for
    /// available hosts, whatever else is wrong with the config.
    #[test]
    fn held_endpoints_never_pass_for_a_switch(config in config()) {
        let t = translate(&config);
        let held: BTreeSet<&str> = (config.clusters.iter())
            .filter(|c| !c.endpoints.is_empty() && c.endpoints.iter().all(|e| e.leaving))
            .map(|c| c.name.as_str())
            .collect();
        for r in t.snapshot.resources(LISTENER).unwrap().values() {
            let l: Listener = decode(&r.body.value);
            let filters = (l.filter_chains.iter().chain(&l.default_filter_chain))
                .flat_map(|chain| &chain.filters);
            for f in filters {
                let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
                    continue;
                };
                if any.type_url != HttpConnectionManager::type_url() {
                    continue;
                }
                let hcm: HttpConnectionManager = decode(&any.value);
                for hf in &hcm.http_filters {
                    let Some(http_filter::ConfigType::TypedConfig(any)) = &hf.config_type else {
                        continue;
                    };
                    if any.type_url != HealthCheck::type_url() {
                        continue;
                    }
                    let hc: HealthCheck = decode(&any.value);
                    for (cluster, pct) in &hc.cluster_min_healthy_percentages {
                        prop_assert!(
                            pct.value == 0.0 || !held.contains(cluster.as_str()),
                            "probe asks held cluster {cluster:?} for {}%", pct.value
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_virtual_host_is_served_or_reported(config in config()) {
        let t = translate(&config);
        // User virtual hosts served (not the version probes' own), with their domains, in
        // the route configuration of their listener.
        let mut served: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
        // On a TCP or TLS listener, each one a filter chain named after it: its hosts are
        // its server names (none: every name).
        for r in t.snapshot.resources(LISTENER).unwrap().values() {
            let l: Listener = decode(&r.body.value);
            // On a UDP listener, the one its route is named after.
            if let Some((vhost, _)) = udp_route(&l)
                && let Some(vh) = config.virtual_hosts.iter().find(|h| h.name == vhost)
            {
                prop_assert_eq!(vh.listener.as_deref(), Some(l.name.as_str()));
                served.insert(vh.name.clone(), (vh.routes.len(), vec!["*".to_owned()]));
            }
            for chain in l.filter_chains.iter().filter(|c| c.name.contains('/')) {
                let Some(vh) = config.virtual_hosts.iter().find(|h| h.name == chain.name) else {
                    continue;
                };
                let forwards = chain.filters.iter().any(|f| f.name == "envoy.filters.network.tcp_proxy");
                if !forwards {
                    continue;
                }
                prop_assert_eq!(vh.listener.as_deref(), Some(l.name.as_str()));
                let names = chain.filter_chain_match.iter().flat_map(|m| m.server_names.clone());
                let mut domains: Vec<String> = names.collect();
                if domains.is_empty() {
                    // No server names: every name, so every host it holds ("*" among them).
                    let (_, hosts) = (vh.hosts.iter().map(|h| h.to_ascii_lowercase()))
                        .partition::<Vec<_>, _>(|h| h == "*");
                    domains = std::iter::once("*".to_owned()).chain(hosts).collect();
                }
                prop_assert!(
                    served.insert(vh.name.clone(), (vh.routes.len(), domains)).is_none(),
                    "{:?} served twice", vh.name
                );
            }
        }
        for rc in route_configurations(&t) {
            let name = &rc.name;
            for v in &rc.virtual_hosts {
                if v.domains.iter().any(|d| d.ends_with(".probe.switchyard.invalid")) {
                    continue;
                }
                let listener = config.virtual_hosts.iter().find(|h| h.name == v.name)
                    .and_then(|h| h.listener.as_deref())
                    .unwrap_or(ROUTE_CONFIG_NAME);
                prop_assert_eq!(listener, name.as_str(), "{:?} in the wrong route configuration", v.name);
                prop_assert!(
                    served.insert(v.name.clone(), (v.routes.len(), v.domains.clone())).is_none(),
                    "{:?} served twice", v.name
                );
            }
        }
        for vh in &config.virtual_hosts {
            let problems: Vec<&str> = t
                .problems
                .iter()
                .filter(|p| p.subject().virtual_host() == Some(vh.name.as_str()))
                .map(|p| p.message())
                .collect();
            let Some((routes, domains)) = served.get(&vh.name) else {
                prop_assert!(!problems.is_empty(), "{:?} neither served nor reported", vh.name);
                continue;
            };
            // Served as given: same routes, in the same order; for the hosts it holds,
            // each one it lost reported.
            let input = config.virtual_hosts.iter().find(|v| v.name == vh.name).unwrap();
            prop_assert_eq!(*routes, input.routes.len());
            for host in &vh.hosts {
                let host = host.to_ascii_lowercase();
                let lost = format!("host {host:?} is already served by");
                prop_assert!(
                    domains.contains(&host) != problems.iter().any(|p| p.starts_with(&lost)),
                    "{:?}: host {} served {:?}, problems {:?}", vh.name, host, domains, problems
                );
            }
            prop_assert!(
                problems.iter().all(|p| p.contains("is already served by")),
                "{:?} served despite {:?}", vh.name, problems
            );
        }
        // An HTTPS listener exists exactly when a served virtual host on it has TLS.
        let tls_served = |listener: Option<&str>| config
            .virtual_hosts
            .iter()
            .any(|v| v.listener.as_deref() == listener && v.tls.is_some() && served.contains_key(&v.name));
        prop_assert_eq!(names(&t, LISTENER).contains("https"), tls_served(None));
        for l in config.gateway_listeners.iter().filter(|l| l.tls) {
            if names(&t, LISTENER).contains(&format!("probe/{}", l.name)) {
                let exists = names(&t, LISTENER).contains(&l.name);
                // A usable default secret keeps it up without a TLS virtual host.
                if l.default_secret.is_none() {
                    prop_assert_eq!(exists, tls_served(Some(&l.name)));
                } else if tls_served(Some(&l.name)) {
                    prop_assert!(exists);
                }
            }
        }
    }
}
