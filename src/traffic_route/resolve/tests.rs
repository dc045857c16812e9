use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
use kube::api::ObjectMeta;

use super::*;
use crate::api::proxy_config::{ResolvedBackend, ResolvedCluster, ResolvedTls};
use crate::api::traffic_route::{
    Backend, HeaderEdits, HeaderMatch, Retries, RolloutSettings, RouteRule, RouteSpec, RouteTls,
    RuleMatch, RuleOptions, TrafficRouteSpec,
};
use crate::hash;

const NS: &str = "shop";

// --- builders -----------------------------------------------------------------------

struct Port {
    name: Option<&'static str>,
    port: i32,
    protocol: Option<&'static str>,
    app_protocol: Option<&'static str>,
}

fn port(port: i32) -> Port {
    Port {
        name: None,
        port,
        protocol: None,
        app_protocol: None,
    }
}

impl Port {
    fn named(mut self, name: &'static str) -> Self {
        self.name = Some(name);
        self
    }
    fn protocol(mut self, protocol: &'static str) -> Self {
        self.protocol = Some(protocol);
        self
    }
    fn app(mut self, app_protocol: &'static str) -> Self {
        self.app_protocol = Some(app_protocol);
        self
    }
}

fn service(name: &str, ports: Vec<Port>) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(NS.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(
                ports
                    .into_iter()
                    .map(|p| ServicePort {
                        name: p.name.map(str::to_owned),
                        port: p.port,
                        protocol: p.protocol.map(str::to_owned),
                        app_protocol: p.app_protocol.map(str::to_owned),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

fn by_number(service: &str, port: i32) -> Backend {
    Backend {
        service: service.to_owned(),
        port: Some(port),
        ..Backend::default()
    }
}

fn by_name(service: &str, port_name: &str) -> Backend {
    Backend {
        service: service.to_owned(),
        port_name: Some(port_name.to_owned()),
        ..Backend::default()
    }
}

fn weighted(mut backend: Backend, weight: i32) -> Backend {
    backend.weight = Some(weight);
    backend
}

fn rule(backends: Vec<Backend>) -> RouteRule {
    RouteRule {
        backends,
        ..RouteRule::default()
    }
}

fn route(hosts: &[&str], rules: Vec<RouteRule>) -> TrafficRoute {
    let mut route = TrafficRoute::new(
        "web",
        TrafficRouteSpec {
            route: RouteSpec {
                hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
                rules,
                ..RouteSpec::default()
            },
            ..TrafficRouteSpec::default()
        },
    );
    route.metadata.namespace = Some(NS.to_owned());
    route
}

fn one_backend(backend: Backend) -> TrafficRoute {
    route(&["shop.example.com"], vec![rule(vec![backend])])
}

fn cluster(service: &str, port: i32, port_name: &str, http2: bool) -> ResolvedCluster {
    ResolvedCluster {
        outlier_detection: None,
        health_check: None,
        circuit_breaker: None,
        namespace: None,
        service: service.to_owned(),
        port,
        port_name: port_name.to_owned(),
        http2,
        udp: false,
        lb_policy: None,
        tls: None,
    }
}

/// The usual namespace: `web` with a named and an h2c port, `api` with one unnamed port.
fn services() -> Vec<Service> {
    vec![
        service(
            "web",
            vec![
                port(80).named("http"),
                port(8081).named("grpc").app("kubernetes.io/h2c"),
            ],
        ),
        service("api", vec![port(8080)]),
    ]
}

/// [`resolve_route`] gives nothing but resolution errors.
fn resolve(route: &TrafficRoute, services: &[Service]) -> Result<ResolvedRoute, ResolveError> {
    let refs: Vec<&Service> = services.iter().collect();
    resolve_route(route, &refs).map_err(|e| match e {
        RouteError::Resolve(e) => e,
        other => panic!("not a resolution error: {other:?}"),
    })
}

fn invalid_message(result: Result<ResolvedRoute, ResolveError>) -> String {
    match result {
        Err(ResolveError::InvalidSpec(e)) => e.to_string(),
        other => panic!("expected InvalidSpec, got {other:?}"),
    }
}

// --- backends -----------------------------------------------------------------------

#[test]
fn port_by_number() {
    let resolved = resolve(&one_backend(by_number("web", 80)), &services()).unwrap();
    let expected = cluster("web", 80, "http", false);
    assert_eq!(resolved.clusters, vec![expected.clone()]);
    assert_eq!(
        resolved.virtual_host.rules[0].backends,
        vec![ResolvedBackend {
            cluster: expected,
            weight: 1,
            request_headers: None,
        }]
    );
}

#[test]
fn port_by_name() {
    let resolved = resolve(&one_backend(by_name("web", "http")), &services()).unwrap();
    assert_eq!(resolved.clusters, vec![cluster("web", 80, "http", false)]);
}

#[test]
fn unnamed_port_has_an_empty_port_name() {
    let resolved = resolve(&one_backend(by_number("api", 8080)), &services()).unwrap();
    assert_eq!(resolved.clusters, vec![cluster("api", 8080, "", false)]);
}

#[test]
fn app_protocol_h2c_or_grpc_means_http2() {
    for (app, http2) in [
        ("h2c", true),
        ("kubernetes.io/h2c", true),
        ("grpc", true),
        ("http", false),
        ("kubernetes.io/ws", false),
    ] {
        let services = [service("api", vec![port(8080).app(app)])];
        let resolved = resolve(&one_backend(by_number("api", 8080)), &services).unwrap();
        assert_eq!(resolved.clusters[0].http2, http2, "appProtocol {app}");
    }
    let resolved = resolve(&one_backend(by_name("web", "grpc")), &services()).unwrap();
    assert_eq!(resolved.clusters, vec![cluster("web", 8081, "grpc", true)]);
}

#[test]
fn missing_service() {
    let err = resolve(&one_backend(by_number("cart", 80)), &services()).unwrap_err();
    assert_eq!(
        err,
        ResolveError::ServiceNotFound {
            service: "cart".into()
        }
    );
    assert_eq!(err.reason(), "ServiceNotFound");
    assert_eq!(
        err.to_string(),
        "Service \"cart\" does not exist in the route's namespace"
    );
}

#[test]
fn a_service_of_another_namespace_is_not_found() {
    let mut elsewhere = service("cart", vec![port(80)]);
    elsewhere.metadata.namespace = Some("other".into());
    let err = resolve(&one_backend(by_number("cart", 80)), &[elsewhere]).unwrap_err();
    assert_eq!(err.reason(), "ServiceNotFound");
}

#[test]
fn missing_port_number() {
    let err = resolve(&one_backend(by_number("web", 81)), &services()).unwrap_err();
    assert_eq!(
        err,
        ResolveError::PortNotFound {
            service: "web".into(),
            port: "81".into()
        }
    );
    assert_eq!(err.reason(), "PortNotFound");
    assert_eq!(err.to_string(), "Service \"web\" has no port 81");
}

#[test]
fn missing_port_name() {
    let err = resolve(&one_backend(by_name("web", "admin")), &services()).unwrap_err();
    assert_eq!(
        err,
        ResolveError::PortNotFound {
            service: "web".into(),
            port: "admin".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "Service \"web\" has no port named \"admin\""
    );
    // An unnamed port cannot be found by name.
    let err = resolve(&one_backend(by_name("api", "http")), &services()).unwrap_err();
    assert_eq!(err.reason(), "PortNotFound");
}

#[test]
fn udp_ports_and_external_names_are_unsupported() {
    let dns = service("dns", vec![port(53).named("dns").protocol("UDP")]);
    let err = resolve(
        &one_backend(by_number("dns", 53)),
        std::slice::from_ref(&dns),
    )
    .unwrap_err();
    assert_eq!(err.reason(), "UnsupportedBackend");
    assert!(err.to_string().contains("port 53 is UDP"), "{err}");
    let err = resolve(&one_backend(by_name("dns", "dns")), &[dns]).unwrap_err();
    assert_eq!(err.reason(), "UnsupportedBackend");

    // 53/UDP and 53/TCP: the TCP one is used.
    let both = service(
        "dns",
        vec![
            port(53).named("dns-udp").protocol("UDP"),
            port(53).named("dns-tcp").protocol("TCP"),
        ],
    );
    let resolved = resolve(&one_backend(by_number("dns", 53)), &[both]).unwrap();
    assert_eq!(
        resolved.clusters,
        vec![cluster("dns", 53, "dns-tcp", false)]
    );

    let mut external = service("ext", vec![port(80)]);
    if let Some(spec) = external.spec.as_mut() {
        spec.type_ = Some("ExternalName".into());
    }
    let err = resolve(&one_backend(by_number("ext", 80)), &[external]).unwrap_err();
    assert_eq!(err.reason(), "UnsupportedBackend");
}

// --- rules, hosts, TLS --------------------------------------------------------------

#[test]
fn rules_hosts_and_tls_are_resolved_with_their_defaults() {
    let mut r = route(
        &["Shop.Example.com", "*.shop.example.com"],
        vec![
            RouteRule {
                name: Some("api".into()),
                matches: Some(RuleMatch {
                    path_prefix: Some("/api".into()),
                    ..RuleMatch::default()
                }),
                options: RuleOptions {
                    timeout: Some("1.5s".into()),
                    retries: Some(Box::new(Retries {
                        attempts: 2,
                        on: vec!["5xx".into()],
                        per_try_timeout: Some("250ms".into()),
                        ..Retries::default()
                    })),
                    rewrite_prefix: Some("/".into()),
                    ..RuleOptions::default()
                },
                ..rule(vec![
                    weighted(by_number("api", 8080), 90),
                    by_name("web", "http"),
                ])
            },
            rule(vec![by_number("web", 80)]),
            RouteRule {
                redirect_https: Some(true),
                ..RouteRule::default()
            },
        ],
    );
    r.spec.route.tls = Some(RouteTls {
        secret_name: "shop-cert".into(),
        redirect_http: None,
    });
    let resolved = resolve(&r, &services()).unwrap();
    let vh = &resolved.virtual_host;
    assert_eq!(vh.hosts, ["shop.example.com", "*.shop.example.com"]);
    assert_eq!(
        vh.tls,
        Some(ResolvedTls {
            namespace: None,
            secret_name: "shop-cert".into(),
            redirect_http: true,
            listener_hostname: None,
        })
    );
    let names: Vec<_> = vh.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["api", "rule-1", "rule-2"]);
    let api = &vh.rules[0];
    assert_eq!(api.matches, r.spec.route.rules[0].matches);
    assert_eq!(api.options.timeout.as_deref(), Some("1.5s"));
    assert_eq!(api.options.retries, r.spec.route.rules[0].options.retries);
    assert_eq!(api.options.rewrite_prefix.as_deref(), Some("/"));
    assert!(!api.redirect_https);
    let weights: Vec<_> = api.backends.iter().map(|b| b.weight).collect();
    assert_eq!(weights, [90, 1]);
    assert!(vh.rules[2].redirect_https);
    assert!(vh.rules[2].backends.is_empty());
    // web:80 is referenced twice (by name and by number): one cluster.
    assert_eq!(
        resolved.clusters,
        vec![
            cluster("api", 8080, "", false),
            cluster("web", 80, "http", false)
        ]
    );
    assert_eq!(resolved.version, hash::digest_of(vh));
}

#[test]
fn zero_weights_are_invalid() {
    let r = one_backend(weighted(by_number("web", 80), 0));
    let msg = invalid_message(resolve(&r, &services()));
    assert!(
        msg.contains("spec.rules[0].backends") && msg.contains("zero"),
        "{msg}"
    );

    // One zero weight among others is fine.
    let r = route(
        &["a.example.com"],
        vec![rule(vec![
            weighted(by_number("web", 80), 0),
            by_number("api", 8080),
        ])],
    );
    assert!(resolve(&r, &services()).is_ok());

    let r = one_backend(weighted(by_number("web", 80), -1));
    assert!(invalid_message(resolve(&r, &services())).contains("weight"));
}

#[test]
fn bad_duration_is_invalid() {
    let mut r = one_backend(by_number("web", 80));
    r.spec.route.rules[0].options.timeout = Some("5x".into());
    let err = resolve(&r, &services()).unwrap_err();
    assert_eq!(err.reason(), "InvalidSpec");
    let msg = err.to_string();
    assert!(
        msg.contains("spec.rules[0].timeout") && msg.contains("\"5x\""),
        "{msg}"
    );

    let mut r = one_backend(by_number("web", 80));
    r.spec.rollout = Some(RolloutSettings {
        drain_period: Some("10".into()),
        probe_deadline: None,
    });
    assert!(invalid_message(resolve(&r, &services())).contains("spec.rollout.drainPeriod"));

    let mut r = one_backend(by_number("web", 80));
    r.spec.route.rules[0].options.retries = Some(Box::new(Retries {
        attempts: 1,
        on: vec![],
        per_try_timeout: Some("fast".into()),
        ..Retries::default()
    }));
    assert!(invalid_message(resolve(&r, &services())).contains("perTryTimeout"));
}

#[test]
fn duplicate_hosts_are_invalid() {
    let r = route(
        &["shop.example.com", "SHOP.example.com"],
        vec![rule(vec![by_number("web", 80)])],
    );
    let msg = invalid_message(resolve(&r, &services()));
    assert!(
        msg.contains("spec.hosts[1]") && msg.contains("spec.hosts[0]"),
        "{msg}"
    );

    let r = route(&["bad host"], vec![rule(vec![by_number("web", 80)])]);
    invalid_message(resolve(&r, &services()));
    let r = route(&[], vec![rule(vec![by_number("web", 80)])]);
    invalid_message(resolve(&r, &services()));
}

#[test]
fn rules_need_backends_or_a_redirect_not_both() {
    let r = route(&["a.example.com"], vec![rule(vec![])]);
    let msg = invalid_message(resolve(&r, &services()));
    assert!(msg.contains("needs backends"), "{msg}");

    let mut r = one_backend(by_number("web", 80));
    r.spec.route.rules[0].redirect_https = Some(true);
    invalid_message(resolve(&r, &services()));

    let r = route(&["a.example.com"], vec![]);
    invalid_message(resolve(&r, &services()));
}

#[test]
fn other_schema_rules_are_checked_again() {
    type Edit = Box<dyn Fn(&mut RouteRule)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "exactly one of port, portName",
            Box::new(|r| r.backends[0].port_name = Some("http".into())),
        ),
        ("1..65535", Box::new(|r| r.backends[0].port = Some(70000))),
        (
            "at most one of pathPrefix",
            Box::new(|r| {
                r.matches = Some(RuleMatch {
                    path_prefix: Some("/a".into()),
                    path_exact: Some("/a".into()),
                    ..RuleMatch::default()
                })
            }),
        ),
        (
            "does not start with",
            Box::new(|r| {
                r.matches = Some(RuleMatch {
                    path_exact: Some("a".into()),
                    ..RuleMatch::default()
                })
            }),
        ),
        (
            "exactly one of exact, prefix, regex, present",
            Box::new(|r| {
                r.matches = Some(RuleMatch {
                    headers: vec![HeaderMatch {
                        name: "x-user".into(),
                        present: Some(false),
                        ..HeaderMatch::default()
                    }],
                    ..RuleMatch::default()
                })
            }),
        ),
        (
            "retries.attempts",
            Box::new(|r| {
                r.options.retries = Some(Box::new(Retries {
                    attempts: -1,
                    ..Retries::default()
                }))
            }),
        ),
        (
            "rewritePrefix",
            Box::new(|r| r.options.rewrite_prefix = Some("v2".into())),
        ),
        (
            "not a lower-case DNS label",
            Box::new(|r| r.name = Some("API".into())),
        ),
    ];
    for (expected, edit) in cases {
        let mut r = one_backend(by_number("web", 80));
        edit(&mut r.spec.route.rules[0]);
        let msg = invalid_message(resolve(&r, &services()));
        assert!(
            msg.contains(expected),
            "{msg:?} should contain {expected:?}"
        );
    }
}

#[test]
fn generated_rule_names_must_not_collide() {
    let r = route(
        &["a.example.com"],
        vec![
            RouteRule {
                name: Some("rule-1".into()),
                ..rule(vec![by_number("web", 80)])
            },
            rule(vec![by_number("web", 80)]),
        ],
    );
    let msg = invalid_message(resolve(&r, &services()));
    assert!(msg.contains("\"rule-1\""), "{msg}");
}

#[test]
fn an_invalid_spec_is_reported_before_a_missing_service() {
    let mut r = one_backend(by_number("cart", 80));
    r.spec.route.rules[0].options.idle_timeout = Some("5x".into());
    assert_eq!(
        resolve(&r, &services()).unwrap_err().reason(),
        "InvalidSpec"
    );
}

// --- determinism and versions -------------------------------------------------------

fn busy_route() -> TrafficRoute {
    route(
        &["shop.example.com"],
        vec![
            RouteRule {
                options: RuleOptions {
                    request_headers: Some(Box::new(HeaderEdits {
                        set: BTreeMap::from([("x-env".to_owned(), "prod".to_owned())]),
                        ..HeaderEdits::default()
                    })),
                    ..RuleOptions::default()
                },
                ..rule(vec![by_name("web", "grpc"), by_number("api", 8080)])
            },
            rule(vec![by_number("web", 80), by_number("cart", 9000)]),
        ],
    )
}

fn busy_services() -> Vec<Service> {
    let mut all = services();
    all.push(service("cart", vec![port(9000).named("http").app("h2c")]));
    all.push(service("unused", vec![port(1)]));
    let mut elsewhere = service("web", vec![port(80).named("other")]);
    elsewhere.metadata.namespace = Some("other".into());
    all.push(elsewhere);
    all
}

#[test]
fn deterministic_whatever_the_order_of_services() {
    let r = busy_route();
    let services = busy_services();
    let expected = resolve(&r, &services).unwrap();
    assert_eq!(
        expected.clusters,
        vec![
            cluster("api", 8080, "", false),
            cluster("cart", 9000, "http", true),
            cluster("web", 80, "http", false),
            cluster("web", 8081, "grpc", true),
        ]
    );
    // Every rotation, forwards and backwards.
    let n = services.len();
    for shift in 0..n {
        for reverse in [false, true] {
            let mut refs: Vec<&Service> = services.iter().collect();
            refs.rotate_left(shift);
            if reverse {
                refs.reverse();
            }
            assert_eq!(resolve_route(&r, &refs).unwrap(), expected);
        }
    }
}

#[test]
fn live_version_follows_the_content_only() {
    let services = busy_services();
    let base = resolve(&busy_route(), &services).unwrap();

    let mut reordered: Vec<Service> = services.clone();
    reordered.reverse();
    assert_eq!(
        resolve(&busy_route(), &reordered).unwrap().version,
        base.version
    );

    let mut edited = busy_route();
    if let Some(edits) = edited.spec.route.rules[0].options.request_headers.as_mut() {
        edits.set.insert("x-env".into(), "staging".into());
    }
    let changed = resolve(&edited, &services).unwrap();
    assert_ne!(changed.version, base.version);
    assert_eq!(changed.clusters, base.clusters);

    let live = |r: &ResolvedRoute| {
        proxy_config_spec("web", 3, ProxyConfigRole::Live, r, &[], None).version
    };
    assert_eq!(live(&base), base.version);
    assert_ne!(live(&changed), live(&base));
}

#[test]
fn live_spec_carries_the_routes_and_their_clusters() {
    let resolved = resolve(&busy_route(), &busy_services()).unwrap();
    let spec = proxy_config_spec(
        "web",
        7,
        ProxyConfigRole::Live,
        &resolved,
        &[cluster("old", 80, "", false)],
        None,
    );
    assert_eq!(spec.role, ProxyConfigRole::Live);
    assert_eq!(spec.route, "web");
    assert_eq!(spec.generation, 7);
    assert_eq!(spec.virtual_host.as_ref(), Some(&resolved.virtual_host));
    assert_eq!(spec.clusters, resolved.clusters);
    assert_eq!(spec.version, resolved.version);
}

#[test]
fn probe_spec_keeps_live_clusters_and_dedups() {
    let resolved = resolve(&busy_route(), &busy_services()).unwrap();
    let old = cluster("old", 80, "http", false);
    let extra = vec![
        cluster("web", 80, "http", false), // also new
        old.clone(),
        old.clone(),
    ];
    let spec = proxy_config_spec("web", 4, ProxyConfigRole::Probe, &resolved, &extra, None);
    assert_eq!(spec.role, ProxyConfigRole::Probe);
    assert_eq!(spec.generation, 4);
    assert_eq!(
        spec.virtual_host.as_ref(),
        Some(&resolved.virtual_host),
        "the routes go on trial"
    );
    let mut expected = resolved.clusters.clone();
    expected.push(old.clone());
    expected.sort();
    assert_eq!(spec.clusters, expected);
    // The live ones are only kept: "web" is live and new at once, so kept too.
    let mut kept = vec![cluster("web", 80, "http", false), old];
    kept.sort();
    assert_eq!(spec.kept_clusters, kept);
    assert_eq!(
        spec.version,
        hash::digest_of(&(&spec.clusters, &spec.kept_clusters, &resolved.virtual_host))
    );

    // The order of the extra clusters does not matter.
    let mut shuffled = extra.clone();
    shuffled.reverse();
    let again = proxy_config_spec("web", 4, ProxyConfigRole::Probe, &resolved, &shuffled, None);
    assert_eq!(again, spec);

    // Without extras, the probe covers exactly the new clusters.
    let bare = proxy_config_spec("web", 4, ProxyConfigRole::Probe, &resolved, &[], None);
    assert_eq!(bare.clusters, resolved.clusters);
    assert!(bare.kept_clusters.is_empty());
    assert_ne!(bare.version, spec.version);
}

#[test]
fn reasons() {
    let errors = [
        ResolveError::ServiceNotFound {
            service: "a".into(),
        },
        ResolveError::PortNotFound {
            service: "a".into(),
            port: "1".into(),
        },
        ResolveError::UnsupportedBackend {
            service: "a".into(),
            message: "m".into(),
        },
        ResolveError::InvalidSpec(SpecError {
            at: "a".into(),
            message: "m".into(),
        }),
    ];
    let reasons: Vec<_> = errors.iter().map(ResolveError::reason).collect();
    assert_eq!(
        reasons,
        [
            "ServiceNotFound",
            "PortNotFound",
            "UnsupportedBackend",
            "InvalidSpec"
        ]
    );
}
