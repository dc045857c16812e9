//! Tests of the whole translation: what is served, what is left out, and why.

use std::collections::BTreeMap;
use std::time::Duration;

use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use prost::Message;

use super::*;
use crate::xds::snapshot::{CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET};

fn cluster(name: &str) -> model::Cluster {
    model::Cluster {
        name: name.into(),
        service: model::ServiceRef {
            namespace: "ns".into(),
            name: name.into(),
            port: 80,
        },
        settings: Default::default(),
        endpoints: vec![model::Endpoint {
            address: "10.0.0.1".into(),
            port: 8080,
            condition: model::EndpointCondition::READY,
            zone: None,
            leaving: false,
        }],
    }
}

fn forward_to(cluster: &str) -> model::Route {
    model::Route {
        name: format!("to-{cluster}"),
        path: model::PathMatch::Prefix("/".into()),
        headers: vec![],
        method: None,
        query: Vec::new(),
        action: model::RouteAction::Forward(model::Forward {
            backends: vec![model::WeightedCluster {
                cluster: cluster.into(),
                weight: 1,
                request_headers: model::HeaderEdits::default(),
            }],
            ..Default::default()
        }),
        request_headers: Default::default(),
        response_headers: Default::default(),
    }
}

fn vhost(name: &str, hosts: &[&str], cluster: &str) -> model::VirtualHost {
    model::VirtualHost {
        listener: None,
        leaving: false,
        created: None,
        name: name.into(),
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        tls: None,
        routes: vec![forward_to(cluster)],
    }
}

fn tls(mut vh: model::VirtualHost, secret: &str) -> model::VirtualHost {
    vh.tls = Some(model::VirtualHostTls {
        secret: secret.into(),
        redirect_http: true,
        listener_hostname: None,
    });
    vh
}

fn secret(name: &str) -> model::TlsSecret {
    model::TlsSecret {
        name: name.into(),
        certificate_chain: "CERT".into(),
        private_key: "KEY".into(),
    }
}

fn config() -> model::Config {
    model::Config {
        listeners: model::ListenerSettings {
            probe_token: "token".into(),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn names(t: &Translation, type_url: &str) -> Vec<String> {
    t.snapshot
        .resources(type_url)
        .map(|rs| rs.keys().cloned().collect())
        .unwrap_or_default()
}

fn route_config(t: &Translation) -> RouteConfiguration {
    let r = &t.snapshot.resources(ROUTE).unwrap()[ROUTE_CONFIG_NAME];
    RouteConfiguration::decode(r.body.value.as_slice()).unwrap()
}

/// The served virtual hosts, but for the probe catch-all that is always there.
fn vhost_names(t: &Translation) -> Vec<String> {
    route_config(t)
        .virtual_hosts
        .into_iter()
        .map(|v| v.name)
        .filter(|n| n != PROBE_CATCH_ALL_VHOST)
        .collect()
}

fn translate_ok(config: &model::Config) -> Translation {
    let t = translate(config);
    check_consistency(&t.snapshot).unwrap();
    t
}

#[test]
fn empty_config_still_has_listeners_and_the_route_configuration() {
    let t = translate_ok(&config());
    assert_eq!(names(&t, LISTENER), ["http", "probe"]);
    assert_eq!(names(&t, ROUTE), ["switchyard"]);
    assert!(names(&t, CLUSTER).is_empty());
    assert!(t.problems.is_empty());
    let rc = route_config(&t);
    assert_eq!(rc.virtual_hosts.len(), 1);
    assert_eq!(rc.virtual_hosts[0].name, PROBE_CATCH_ALL_VHOST);
    assert_eq!(rc.request_headers_to_remove, [PROBE_TOKEN_HEADER]);
}

#[test]
fn probe_hosts_never_reach_a_user_backend() {
    use envoy_types::pb::envoy::config::route::v3::route::Action;
    let mut c = config();
    c.clusters = vec![cluster("a")];
    c.virtual_hosts = vec![
        vhost("ns/default", &["*"], "a"),
        vhost("ns/squatter", &["x.probe.switchyard.invalid"], "a"),
        vhost(PROBE_CATCH_ALL_VHOST, &["fine.example.com"], "a"),
    ];
    let t = translate_ok(&c);
    assert_eq!(vhost_names(&t), ["ns/default"]);
    assert_eq!(
        t.problems,
        [
            Problem::new(
                "ns/squatter",
                "host \"x.probe.switchyard.invalid\" is reserved for Switchyard's probes"
            ),
            Problem::new(
                PROBE_CATCH_ALL_VHOST,
                "virtual host name \"switchyard-probe\" is reserved for a probe"
            ),
        ]
    );
    // Envoy prefers a suffix wildcard to "*": a probe host that no probe serves (yet),
    // including ENDPOINT_PROBE_HOST, gets a 404 from Envoy itself.
    let rc = route_config(&t);
    let catch_all = rc
        .virtual_hosts
        .iter()
        .find(|v| v.name == PROBE_CATCH_ALL_VHOST)
        .unwrap();
    assert_eq!(catch_all.domains, [format!("*{PROBE_DOMAIN_SUFFIX}")]);
    assert!(ENDPOINT_PROBE_HOST.ends_with(PROBE_DOMAIN_SUFFIX));
    assert!(model::version_probe_host("ns/a", "token").ends_with(PROBE_DOMAIN_SUFFIX));
    assert!(matches!(
        &catch_all.routes[0].action,
        Some(Action::DirectResponse(d)) if d.status == 404
    ));
}

#[test]
fn only_referenced_clusters_are_served() {
    let mut c = config();
    c.clusters = vec![cluster("used"), cluster("unused"), cluster("probed")];
    c.virtual_hosts = vec![vhost("ns/a", &["a.example.com"], "used")];
    c.endpoint_probes = vec![model::EndpointProbe {
        id: "p".into(),
        clusters: BTreeMap::from([("probed".into(), 1)]),
    }];
    let t = translate_ok(&c);
    assert_eq!(names(&t, CLUSTER), ["probed", "used"]);
    assert_eq!(names(&t, ENDPOINT), ["probed", "used"]);
    assert!(t.problems.is_empty());
}

#[test]
fn a_cluster_of_a_rejected_virtual_host_is_not_served() {
    let mut c = config();
    c.clusters = vec![cluster("a")];
    let mut bad = vhost("ns/bad", &["bad.example.com"], "a");
    bad.routes.push(forward_to("missing"));
    c.virtual_hosts = vec![bad];
    let t = translate_ok(&c);
    assert!(names(&t, CLUSTER).is_empty());
    assert_eq!(
        t.problems,
        [Problem::new(
            "ns/bad",
            "route \"to-missing\": cluster \"missing\" is not defined"
        )]
    );
}

#[test]
fn the_version_probe_of_a_rejected_virtual_host_is_not_served() {
    let mut c = config();
    c.clusters = vec![cluster("a")];
    c.virtual_hosts = vec![
        vhost("ns/bad", &["bad.example.com"], "missing"),
        vhost("ns/good", &["good.example.com"], "a"),
    ];
    c.version_probes = ["ns/bad", "ns/good"]
        .map(|id| model::VersionProbe {
            id: id.into(),
            version: "v1".into(),
            ..Default::default()
        })
        .into();
    let t = translate_ok(&c);
    // Otherwise "verify live" would pass for routes that serve nothing.
    let served: Vec<String> = vhost_names(&t)
        .into_iter()
        .filter(|n| n.starts_with(VERSION_PROBE_VHOST_PREFIX))
        .collect();
    assert_eq!(served, [format!("{VERSION_PROBE_VHOST_PREFIX}ns/good")]);
}

#[test]
fn a_shared_host_goes_to_the_first_by_name_and_the_others_serve_the_rest() {
    let mut c = config();
    c.clusters = vec![cluster("a")];
    c.virtual_hosts = vec![
        vhost("ns/c", &["other.example.com"], "a"),
        vhost("ns/b", &["Shared.example.com", "other.example.com"], "a"),
        vhost("ns/a", &["shared.example.com"], "a"),
    ];
    let t = translate_ok(&c);
    // ns/b loses "shared" to ns/a and keeps "other", which ns/c then cannot have.
    assert_eq!(vhost_names(&t), ["ns/a", "ns/b"]);
    assert_eq!(
        t.problems,
        [
            Problem::new(
                "ns/b",
                "host \"shared.example.com\" is already served by virtual host \"ns/a\""
            ),
            Problem::new(
                "ns/c",
                "host \"other.example.com\" is already served by virtual host \"ns/b\""
            ),
        ]
    );
    let rc = route_config(&t);
    let b = rc
        .virtual_hosts
        .iter()
        .find(|v| v.name == "ns/b")
        .expect("ns/b");
    assert_eq!(b.domains, ["other.example.com"]);
}

#[test]
fn the_oldest_virtual_host_gets_a_shared_host_whatever_its_name() {
    let mut c = config();
    c.clusters = vec![cluster("a")];
    let mut young = vhost("ns/a", &["x.example.com"], "a");
    young.created = Some(2_000);
    let mut old = vhost("ns/z", &["x.example.com"], "a");
    old.created = Some(1_000);
    let unknown = vhost("ns/0", &["x.example.com"], "a");
    c.virtual_hosts = vec![young, unknown, old];
    let t = translate_ok(&c);
    assert_eq!(vhost_names(&t), ["ns/z"]);
    let losers: Vec<String> = t.problems.iter().map(|p| p.subject().to_string()).collect();
    assert_eq!(losers, ["ns/0", "ns/a"]);
}

#[test]
fn an_invalid_virtual_host_claims_no_host() {
    let mut c = config();
    c.clusters = vec![cluster("a")];
    c.virtual_hosts = vec![
        vhost("ns/a", &["x.example.com"], "missing"),
        vhost("ns/b", &["x.example.com"], "a"),
    ];
    let t = translate_ok(&c);
    assert_eq!(vhost_names(&t), ["ns/b"]);
    assert_eq!(t.problems.len(), 1);
    assert_eq!(t.problems[0].subject().virtual_host(), Some("ns/a"));
}

#[test]
fn a_leaving_virtual_host_yields_its_hosts_and_serves_the_rest() {
    let mut c = config();
    c.clusters = vec![cluster("a"), cluster("b")];
    let mut old = vhost("ns/a", &["x.example.com", "y.example.com"], "a");
    old.leaving = true;
    c.virtual_hosts = vec![old, vhost("ns/b", &["x.example.com"], "b")];
    let t = translate_ok(&c);
    // "ns/a" sorts first, but leaves: "ns/b" takes x, and "ns/a" serves y.
    assert_eq!(vhost_names(&t), ["ns/a", "ns/b"]);
    assert_eq!(t.problems.len(), 1, "{:#?}", t.problems);
    assert_eq!(t.problems[0].subject().virtual_host(), Some("ns/a"));
    // Alone, a leaving virtual host serves.
    c.virtual_hosts.truncate(1);
    assert_eq!(vhost_names(&translate_ok(&c)), ["ns/a"]);
}

#[test]
fn version_probes_win_their_names_and_domains() {
    let mut c = config();
    c.clusters = vec![cluster("a")];
    let probe_host = model::version_probe_host("ns/r", "token");
    c.version_probes = vec![model::VersionProbe {
        id: "ns/r".into(),
        version: "v1".into(),
        ..Default::default()
    }];
    c.virtual_hosts = vec![
        vhost("a-thief", &[&probe_host], "a"),
        vhost("switchyard-probe/ns/r", &["fine.example.com"], "a"),
    ];
    let t = translate_ok(&c);
    assert_eq!(vhost_names(&t), ["switchyard-probe/ns/r"]);
    assert_eq!(t.problems.len(), 2, "{:#?}", t.problems);
    assert!(
        t.problems[0]
            .message()
            .contains("is reserved for Switchyard's probes")
    );
    assert!(t.problems[1].message().contains("reserved for a probe"));
    let rc = route_config(&t);
    assert_eq!(rc.virtual_hosts[1].name, "switchyard-probe/ns/r");
    assert_eq!(rc.virtual_hosts[1].domains, [probe_host]);
}

#[test]
fn tls_resources_follow_the_served_virtual_hosts() {
    let mut c = config();
    c.clusters = vec![cluster("a")];
    c.secrets = vec![secret("used"), secret("unused")];
    c.virtual_hosts = vec![
        tls(vhost("ns/a", &["a.example.com"], "a"), "used"),
        tls(vhost("ns/b", &["b.example.com"], "a"), "missing"),
    ];
    let t = translate_ok(&c);
    assert_eq!(names(&t, SECRET), ["used"]);
    assert_eq!(names(&t, LISTENER), ["http", "https", "probe"]);
    assert_eq!(
        t.problems,
        [Problem::new(
            "ns/b",
            "TLS secret \"missing\" is not defined"
        )]
    );

    // Without a served TLS virtual host there is no HTTPS listener and no secret.
    c.virtual_hosts.remove(0);
    let t = translate_ok(&c);
    assert_eq!(names(&t, LISTENER), ["http", "probe"]);
    assert!(names(&t, SECRET).is_empty());
}

#[test]
fn a_served_cluster_that_presents_a_client_certificate_has_it_served() {
    let mut c = config();
    let mut presenting = cluster("a");
    presenting.settings.tls = Some(model::UpstreamTls {
        sni: "a.backend".into(),
        ca_certificates: "CA".into(),
        subject_alt_names: Vec::new(),
        client_certificate: Some("client".into()),
    });
    c.clusters = vec![presenting, cluster("b")];
    c.secrets = vec![secret("client")];
    c.virtual_hosts = vec![vhost("ns/a", &["a.example.com"], "a")];
    let mut translator = Translator::new();
    let t = translator.update(&c);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert_eq!(names(&t, SECRET), ["client"]);
    // No plain-text virtual host needs an HTTPS listener for it.
    assert_eq!(names(&t, LISTENER), ["http", "probe"]);
    // The cluster no longer served, nor is its secret (the same translator, incrementally).
    c.virtual_hosts = vec![vhost("ns/a", &["a.example.com"], "b")];
    let t = translator.update(&c);
    assert_eq!(names(&t, CLUSTER), ["b"]);
    assert!(names(&t, SECRET).is_empty());
}

#[test]
fn every_listener_uses_the_shared_route_configuration() {
    let mut c = config();
    c.clusters = vec![cluster("a")];
    c.secrets = vec![secret("s")];
    c.virtual_hosts = vec![tls(vhost("ns/a", &["a.example.com"], "a"), "s")];
    let t = translate_ok(&c);
    for (name, r) in t.snapshot.resources(LISTENER).unwrap() {
        let l = Listener::decode(r.body.value.as_slice()).unwrap();
        let text = render::render_any(&r.body);
        assert_eq!(
            text.matches("route_config_name: \"switchyard\"").count(),
            l.filter_chains.len(),
            "{name}"
        );
    }
}

#[test]
fn ambiguous_definitions_are_left_out() {
    let mut c = config();
    let mut other = cluster("a");
    other.settings.connect_timeout = Duration::from_secs(9);
    c.clusters = vec![cluster("a"), other, cluster("b"), cluster("b")];
    c.virtual_hosts = vec![
        vhost("ns/a", &["a.example.com"], "a"),
        vhost("ns/b", &["b.example.com"], "b"),
        vhost("ns/dup", &["d1.example.com"], "b"),
        vhost("ns/dup", &["d2.example.com"], "b"),
    ];
    let t = translate_ok(&c);
    assert_eq!(vhost_names(&t), ["ns/b"]);
    assert_eq!(
        t.problems,
        [
            Problem::new(
                Subject::Cluster("a".into()),
                "cluster \"a\" is defined 2 times with 2 different contents; all are left out"
            ),
            Problem::new("ns/a", "route \"to-a\": cluster \"a\" is not defined"),
            Problem::new(
                "ns/dup",
                "virtual host \"ns/dup\" is defined 2 times with 2 different contents; all are left out"
            ),
        ]
    );
}

#[test]
fn a_cluster_envoy_would_reject_rejects_its_routes_and_probes() {
    let mut c = config();
    let mut bad = cluster("bad");
    bad.settings.connect_timeout = Duration::ZERO;
    c.clusters = vec![bad];
    c.virtual_hosts = vec![vhost("ns/a", &["a.example.com"], "bad")];
    c.endpoint_probes = vec![model::EndpointProbe {
        id: "p".into(),
        clusters: BTreeMap::from([("bad".into(), 0)]),
    }];
    let t = translate_ok(&c);
    assert!(names(&t, CLUSTER).is_empty());
    let reported: Vec<_> = t.problems.iter().map(|p| p.subject().to_string()).collect();
    assert_eq!(reported, ["ns/a", "probe/p"]);
    assert!(
        t.problems[0]
            .message()
            .contains("connect timeout must be positive")
    );
}

#[test]
fn bad_endpoints_are_reported_per_cluster() {
    let mut c = config();
    let mut a = cluster("a");
    a.endpoints[0].address = "web-0.example".into();
    c.clusters = vec![a];
    c.virtual_hosts = vec![vhost("ns/a", &["a.example.com"], "a")];
    let t = translate_ok(&c);
    assert_eq!(names(&t, CLUSTER), ["a"]);
    assert_eq!(
        t.problems,
        [Problem::new(
            Subject::Cluster("a".into()),
            "endpoint address \"web-0.example\" is not an IP address; left out"
        )]
    );
}

/// A deleted Service's endpoints are held, leaving: the cluster keeps serving what is live
/// on it, its endpoints unchanged, but an endpoint probe that asks them ready for a switch
/// is left out and says why (I3), until the Service has endpoints of its own again;
/// incrementally as from scratch.
#[test]
fn held_endpoints_serve_what_is_live_but_never_pass_for_a_switch() {
    let mut c = config();
    c.clusters = vec![cluster("old"), cluster("new")];
    c.virtual_hosts = vec![vhost("ns/a", &["a.example.com"], "old")];
    c.endpoint_probes = vec![model::EndpointProbe {
        id: "ns/a/2".into(),
        clusters: BTreeMap::from([("old".into(), 0), ("new".into(), 1)]),
    }];
    let ready = translate_ok(&c);
    assert!(ready.problems.is_empty(), "{:?}", ready.problems);
    assert_eq!(names(&ready, CLUSTER), ["new", "old"]);

    let mut held = c.clone();
    for endpoint in held.clusters.iter_mut().flat_map(|c| &mut c.endpoints) {
        endpoint.leaving = true;
    }
    let mut translator = Translator::new();
    translator.update(&c);
    let applied = translator.apply(Changes {
        clusters: held.clusters.iter().cloned().map(Edit::Put).collect(),
        ..Changes::default()
    });
    assert_eq!(applied, translate_ok(&held));
    // The live cluster is served as before; the probe and the cluster only it used are not.
    assert_eq!(names(&applied, CLUSTER), ["old"]);
    let endpoints = |t: &Translation, name: &str| {
        let found = t.snapshot.resources(ENDPOINT).and_then(|rs| rs.get(name));
        found.map(|r| r.body.value.clone())
    };
    assert_eq!(endpoints(&applied, "old"), endpoints(&ready, "old"));
    assert_eq!(applied.problems.len(), 1, "{:?}", applied.problems);
    assert_eq!(
        applied.problems[0].subject(),
        &Subject::EndpointProbe("ns/a/2".into())
    );
    assert!(
        applied.problems[0]
            .message()
            .contains("cluster \"new\" has only held endpoints"),
        "{}",
        applied.problems[0].message()
    );

    // The Service back with endpoints of its own: the probe is served again.
    let back = translator.apply(Changes {
        clusters: c.clusters.iter().cloned().map(Edit::Put).collect(),
        ..Changes::default()
    });
    assert_eq!(back, ready);
}

/// Found by fuzzing (fuzz/fuzz_targets/proxy_config.rs): a probe whose routes on trial
/// named a cluster the model lacks was served, routing to nothing. It is left out, says
/// why, and comes back (incrementally too) once the cluster does, which its routes on
/// trial then keep served (a use, like a virtual host's), endpoint probe or not.
#[test]
fn routes_on_trial_are_served_only_with_their_clusters() {
    let mut c = config();
    c.clusters = vec![cluster("a")];
    c.version_probes = vec![model::VersionProbe {
        id: "ns/a".into(),
        version: "1".into(),
        routes: vec![forward_to("b")],
        ..Default::default()
    }];
    let t = translate_ok(&c);
    let probe_vhost = format!("{VERSION_PROBE_VHOST_PREFIX}ns/a");
    assert!(
        !vhost_names(&t).contains(&probe_vhost),
        "{:?}",
        vhost_names(&t)
    );
    assert_eq!(t.problems.len(), 1, "{:?}", t.problems);
    assert_eq!(
        t.problems[0].subject(),
        &Subject::VersionProbe("ns/a".into())
    );
    assert!(
        t.problems[0].message().contains("route on trial"),
        "{}",
        t.problems[0].message()
    );

    let mut translator = Translator::new();
    translator.update(&c);
    c.clusters.push(cluster("b"));
    let incremental = translator.update(&c);
    check_consistency(&incremental.snapshot).unwrap();
    assert!(vhost_names(&incremental).contains(&probe_vhost));
    assert!(
        incremental.problems.is_empty(),
        "{:?}",
        incremental.problems
    );
    assert_eq!(
        incremental.snapshot.version(),
        translate(&c).snapshot.version()
    );
}

#[test]
fn an_invalid_probe_token_disables_probes_only() {
    let mut c = config();
    c.listeners.probe_token = "bad\ntoken".into();
    c.clusters = vec![cluster("a")];
    c.virtual_hosts = vec![vhost("ns/a", &["a.example.com"], "a")];
    c.version_probes = vec![model::VersionProbe {
        id: "ns/a".into(),
        version: "1".into(),
        ..Default::default()
    }];
    c.endpoint_probes = vec![model::EndpointProbe {
        id: "p".into(),
        clusters: BTreeMap::from([("a".into(), 1)]),
    }];
    let t = translate_ok(&c);
    assert_eq!(vhost_names(&t), ["ns/a"]);
    assert_eq!(t.problems.len(), 1);
    assert_eq!(t.problems[0].subject(), &Subject::Listeners);
}

#[test]
fn input_order_does_not_matter() {
    let mut c = config();
    c.clusters = vec![cluster("a"), cluster("b"), cluster("c")];
    c.secrets = vec![secret("s1"), secret("s2")];
    c.virtual_hosts = vec![
        tls(
            vhost("ns/a", &["a.example.com", "www.a.example.com"], "a"),
            "s1",
        ),
        tls(vhost("ns/b", &["b.example.com"], "b"), "s2"),
        vhost("ns/c", &["c.example.com"], "c"),
        vhost("ns/c2", &["c.example.com"], "missing"),
    ];
    c.endpoint_probes = vec![
        model::EndpointProbe {
            id: "p1".into(),
            clusters: BTreeMap::from([("a".into(), 1), ("b".into(), 0)]),
        },
        model::EndpointProbe {
            id: "p2".into(),
            clusters: BTreeMap::from([("c".into(), 100)]),
        },
    ];
    c.version_probes = vec![
        model::VersionProbe {
            id: "ns/a".into(),
            version: "1".into(),
            ..Default::default()
        },
        model::VersionProbe {
            id: "ns/b".into(),
            version: "2".into(),
            ..Default::default()
        },
    ];
    let first = translate_ok(&c);
    let mut reversed = c.clone();
    reversed.clusters.reverse();
    reversed.secrets.reverse();
    reversed.virtual_hosts.reverse();
    reversed.endpoint_probes.reverse();
    reversed.version_probes.reverse();
    for e in &mut reversed.clusters {
        e.endpoints.reverse();
    }
    let second = translate_ok(&reversed);
    assert_eq!(first, second);
    assert_eq!(first.snapshot.version(), second.snapshot.version());
    assert_eq!(
        render::render_snapshot(&first.snapshot),
        render::render_snapshot(&second.snapshot)
    );
}

#[test]
fn problems_display() {
    let p = Problem::new("ns/a", "virtual host has no hosts");
    assert_eq!(p.to_string(), "ns/a: virtual host has no hosts");
}

/// The path the builders take on a change: apply only the edits.
#[test]
fn applied_changes_end_where_a_fresh_translation_does() {
    let mut before = config();
    before.clusters = vec![cluster("ns/a/80"), cluster("ns/b/80")];
    before.virtual_hosts = vec![
        vhost("ns/one", &["one.example"], "ns/a/80"),
        vhost("ns/two", &["two.example"], "ns/b/80"),
    ];
    let mut translator = Translator::new();
    translator.update(&before);

    // Route one switches to a brand-new cluster; cluster b loses its endpoints.
    let mut after = before.clone();
    after.clusters.push(cluster("ns/c/80"));
    after.virtual_hosts[0] = vhost("ns/one", &["one.example"], "ns/c/80");
    after.clusters[1].endpoints.clear();
    let applied = translator.apply(Changes {
        clusters: vec![
            Edit::Put(cluster("ns/c/80")),
            Edit::Put(after.clusters[1].clone()),
        ],
        virtual_hosts: vec![Edit::Put(after.virtual_hosts[0].clone())],
        ..Changes::default()
    });
    assert_eq!(applied, translate_ok(&after));
    // The cluster no route uses any more left CDS and EDS.
    assert_eq!(names(&applied, CLUSTER), ["ns/b/80", "ns/c/80"]);
    assert_eq!(names(&applied, ENDPOINT), ["ns/b/80", "ns/c/80"]);

    // Removing the route that held a host lets a later one take it.
    let mut last = after.clone();
    last.virtual_hosts[1].hosts = vec!["one.example".into()];
    translator.update(&last);
    assert_eq!(vhost_names(&translator.translation()), ["ns/one"]);
    last.virtual_hosts.remove(0);
    let removed = translator.apply(Changes {
        virtual_hosts: vec![Edit::Remove("ns/one".into())],
        ..Changes::default()
    });
    assert_eq!(removed, translate_ok(&last));
    assert_eq!(vhost_names(&removed), ["ns/two"]);
}

#[test]
fn route_configurations_are_also_served_in_parts_when_asked() {
    use crate::xds::snapshot::VIRTUAL_HOST;
    use crate::xds::vhds;
    use envoy_types::pb::envoy::config::route::v3::VirtualHost;

    let mut config = config();
    config.listeners.virtual_host_discovery = true;
    config.clusters = vec![cluster("a"), cluster("b")];
    config.virtual_hosts = vec![
        vhost("shop/web", &["web.test"], "a"),
        vhost("shop/api", &["api.test"], "a"),
    ];
    let mut translator = Translator::new();
    let t = translator.update(&config);
    check_consistency(&t.snapshot).unwrap();
    let parts = vhds::parts_name(ROUTE_CONFIG_NAME);
    assert_eq!(
        names(&t, ROUTE),
        [ROUTE_CONFIG_NAME.to_owned(), parts.clone()]
    );
    let shell = &t.snapshot.resources(ROUTE).unwrap()[&parts];
    let shell = RouteConfiguration::decode(shell.body.value.as_slice()).unwrap();
    assert!(shell.virtual_hosts.is_empty() && shell.vhds.is_some());
    assert_eq!(shell.request_headers_to_remove, [PROBE_TOKEN_HEADER]);
    // Every virtual host of the whole one, each named after its resource.
    let hosts = t.snapshot.resources(VIRTUAL_HOST).unwrap().clone();
    assert_eq!(hosts.len(), route_config(&t).virtual_hosts.len());
    for (name, resource) in &hosts {
        let vh = VirtualHost::decode(resource.body.value.as_slice()).unwrap();
        assert_eq!(&vh.name, name);
        assert_eq!(vhds::namespace(name), parts);
    }

    // One route changed: one virtual host resource changed, the rest are the same.
    config.virtual_hosts[0] = vhost("shop/web", &["web.test"], "b");
    let t = translator.update(&config);
    let changed: Vec<&String> = t
        .snapshot
        .resources(VIRTUAL_HOST)
        .unwrap()
        .iter()
        .filter(|(name, r)| hosts.get(*name).is_none_or(|old| old.version != r.version))
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        changed,
        [&vhds::virtual_host_name(ROUTE_CONFIG_NAME, "shop/web")]
    );

    // Turned off: only the whole one, as if never on.
    config.listeners.virtual_host_discovery = false;
    let t = translator.update(&config);
    assert_eq!(names(&t, ROUTE), [ROUTE_CONFIG_NAME]);
    assert!(t.snapshot.resources(VIRTUAL_HOST).is_none());
    assert_eq!(t.snapshot.version(), translate(&config).snapshot.version());
}

#[test]
fn a_gateway_listeners_route_configuration_is_served_in_parts_whole() {
    use crate::xds::snapshot::VIRTUAL_HOST;
    use crate::xds::vhds;

    let mut config = config();
    config.listeners.virtual_host_discovery = true;
    config.gateway_listeners = vec![model::GatewayListener {
        name: "ns/gw/80/http".into(),
        port: 9080,
        probe_port: 9081,
        tls: false,
        default_secret: None,
        client_validation: None,
        protocol: model::ListenerProtocol::Http,
    }];
    config.clusters = vec![cluster("a")];
    let mut vh = vhost("ns/web", &["web.test"], "a");
    vh.listener = Some("ns/gw/80/http".into());
    config.virtual_hosts = vec![vh];
    config.version_probes = vec![model::VersionProbe {
        id: "ns/web".into(),
        version: "1".into(),
        listener: Some("ns/gw/80/http".into()),
        ..Default::default()
    }];
    let mut translator = Translator::new();
    for t in [translator.update(&config), translate(&config)] {
        for rc in [ROUTE_CONFIG_NAME, "ns/gw/80/http"] {
            let inline = &t.snapshot.resources(ROUTE).unwrap()[rc];
            let inline = RouteConfiguration::decode(inline.body.value.as_slice()).unwrap();
            let whole: Vec<String> = inline
                .virtual_hosts
                .iter()
                .map(|v| vhds::virtual_host_name(rc, &v.name))
                .collect();
            let parts: Vec<String> = t
                .snapshot
                .resources(VIRTUAL_HOST)
                .unwrap()
                .keys()
                .filter(|n| vhds::namespace(n) == vhds::parts_name(rc))
                .cloned()
                .collect();
            assert_eq!(parts, whole, "{rc}");
        }
    }
}
