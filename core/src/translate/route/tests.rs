use std::collections::HashMap;
use std::time::Duration;

use super::*;
use crate::translate::Inputs;

fn cluster(name: &str) -> model::Cluster {
    model::Cluster {
        name: name.into(),
        service: model::ServiceRef {
            namespace: "ns".into(),
            name: name.into(),
            port: 80,
        },
        settings: Default::default(),
        endpoints: vec![],
    }
}

fn forward(backends: &[(&str, u32)]) -> model::RouteAction {
    model::RouteAction::Forward(model::Forward {
        backends: backends
            .iter()
            .map(|(c, w)| model::WeightedCluster {
                cluster: c.to_string(),
                weight: *w,
                request_headers: model::HeaderEdits::default(),
            })
            .collect(),
        ..Default::default()
    })
}

fn simple_route(action: model::RouteAction) -> model::Route {
    model::Route {
        name: "r".into(),
        path: model::PathMatch::Prefix("/".into()),
        headers: vec![],
        method: None,
        query: Vec::new(),
        action,
        request_headers: Default::default(),
        response_headers: Default::default(),
    }
}

fn vhost(routes: Vec<model::Route>) -> model::VirtualHost {
    model::VirtualHost {
        listener: None,
        leaving: false,
        created: None,
        name: "ns/vh".into(),
        hosts: vec![
            "Example.com".into(),
            "example.com".into(),
            "a.example.com".into(),
        ],
        tls: None,
        routes,
    }
}

fn check(vh: &model::VirtualHost) -> Vec<String> {
    let clusters = [cluster("a"), cluster("b")];
    let mut bad = cluster("bad");
    bad.settings.connect_timeout = Duration::ZERO;
    let clusters: HashMap<String, model::Cluster> = clusters
        .into_iter()
        .chain([bad])
        .map(|c| (c.name.clone(), c))
        .collect();
    let invalid_clusters =
        HashMap::from([("bad".to_owned(), "connect timeout must be positive".into())]);
    let secrets = HashMap::new();
    let inputs = Inputs {
        clusters: &clusters,
        invalid_clusters: &invalid_clusters,
        secrets: &secrets,
    };
    validate_virtual_host(vh, &inputs)
}

#[test]
fn hosts_are_lowercased_sorted_and_deduplicated() {
    let vh = vhost(vec![]);
    assert_eq!(normalized_hosts(&vh), ["a.example.com", "example.com"]);
}

#[test]
fn valid_virtual_host() {
    let vh = vhost(vec![
        simple_route(forward(&[("a", 1)])),
        simple_route(forward(&[("a", 0), ("b", 5)])),
        simple_route(model::RouteAction::RedirectHttps),
    ]);
    assert_eq!(check(&vh), Vec::<String>::new());
}

#[test]
fn invalid_forward_actions() {
    let vh = vhost(vec![
        simple_route(forward(&[])),
        simple_route(forward(&[("a", 0), ("b", 0)])),
        simple_route(forward(&[("missing", 1)])),
        simple_route(forward(&[("bad", 1)])),
        simple_route(forward(&[("a", u32::MAX), ("b", 1)])),
    ]);
    assert_eq!(
        check(&vh),
        [
            "route \"r\": forward action has no backends",
            "route \"r\": backend weights sum to 0",
            "route \"r\": cluster \"missing\" is not defined",
            "route \"r\": cluster \"bad\" is invalid: connect timeout must be positive",
            "route \"r\": backend weights sum to 4294967296, more than 4294967295",
        ]
    );
}

#[test]
fn invalid_matches_and_edits() {
    let mut r = simple_route(forward(&[("a", 1)]));
    r.name = String::new();
    r.path = model::PathMatch::Regex("(".into());
    r.headers = vec![
        model::HeaderMatch {
            name: "x-a".into(),
            value: model::HeaderValueMatch::Prefix(String::new()),
            invert: false,
        },
        model::HeaderMatch {
            name: String::new(),
            value: model::HeaderValueMatch::Present,
            invert: false,
        },
    ];
    r.request_headers.set = vec![(":path".into(), "/x".into())];
    r.response_headers.add = vec![("x-b".into(), "a\r\nb".into())];
    r.response_headers.remove = vec!["host".into()];
    let errors = check(&vhost(vec![r]));
    assert_eq!(errors.len(), 6, "{errors:#?}");
    assert!(
        errors.iter().all(|e| e.starts_with("route #1: ")),
        "{errors:#?}"
    );
}

#[test]
fn empty_hosts_and_tls_wildcards() {
    let mut vh = vhost(vec![]);
    vh.hosts.clear();
    assert_eq!(check(&vh), ["virtual host has no hosts"]);
    vh.hosts = vec!["*".into()];
    vh.tls = Some(model::VirtualHostTls {
        secret: "missing".into(),
        redirect_http: true,
        listener_hostname: None,
    });
    let errors = check(&vh);
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(errors[0].contains("leading \"*.\""));
    assert_eq!(errors[1], "TLS secret \"missing\" is not defined");
}

#[test]
fn a_virtual_host_with_filter_configs_encodes_to_the_same_bytes_every_time() {
    let mut policed = model::Forward {
        cors: Some(Box::new(model::Cors {
            allow_origins: vec!["*".into()],
            ..Default::default()
        })),
        rate_limit: Some(model::RateLimit {
            requests: 1,
            per: Duration::from_secs(1),
            burst: 0,
        }),
        max_request_bytes: Some(10),
        ..Default::default()
    };
    policed.backends = vec![model::WeightedCluster {
        cluster: "a".into(),
        weight: 1,
        request_headers: model::HeaderEdits::default(),
    }];
    let routes = vec![
        simple_route(model::RouteAction::Forward(policed)),
        simple_route(forward(&[("b", 1)])),
    ];
    let vh = vhost(routes);
    let hosts = normalized_hosts(&vh);
    let first = encode_virtual_host(virtual_host(&vh, &hosts));
    // Each encoding builds new maps, each with an iteration order of its own.
    for _ in 0..20 {
        assert_eq!(encode_virtual_host(virtual_host(&vh, &hosts)), first);
    }
    let decoded = envoy_route::VirtualHost::decode(first.as_slice()).unwrap();
    assert_eq!(decoded, virtual_host(&vh, &hosts));
    assert_eq!(decoded.routes[0].typed_per_filter_config.len(), 3);
}

#[test]
fn route_translation() {
    let mut r = simple_route(forward(&[("a", 90), ("b", 10)]));
    r.path = model::PathMatch::Regex("^/v[0-9]+/".into());
    r.headers = vec![model::HeaderMatch {
        name: "x-canary".into(),
        value: model::HeaderValueMatch::Present,
        invert: true,
    }];
    r.request_headers = model::HeaderEdits {
        set: vec![("x-s".into(), "1".into())],
        add: vec![("x-a".into(), "2".into())],
        remove: vec!["x-r".into()],
    };
    let out = route(&r);
    let m = out.r#match.as_ref().unwrap();
    assert!(
        matches!(&m.path_specifier, Some(PathSpecifier::SafeRegex(re)) if re.regex == "^/v[0-9]+/")
    );
    assert!(m.headers[0].invert_match);
    assert_eq!(
        m.headers[0].header_match_specifier,
        Some(HeaderMatchSpecifier::PresentMatch(true))
    );
    let actions: Vec<i32> = out
        .request_headers_to_add
        .iter()
        .map(|h| h.append_action)
        .collect();
    assert_eq!(
        actions,
        [
            HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
            HeaderAppendAction::AppendIfExistsOrAdd as i32
        ]
    );
    assert_eq!(out.request_headers_to_remove, ["x-r"]);
    let Some(Action::Route(action)) = out.action else {
        panic!()
    };
    let Some(ClusterSpecifier::WeightedClusters(w)) = action.cluster_specifier else {
        panic!()
    };
    assert_eq!(
        w.clusters
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
}

#[test]
fn single_backend_uses_cluster() {
    let out = route(&simple_route(forward(&[("a", 3)])));
    let Some(Action::Route(action)) = out.action else {
        panic!()
    };
    assert_eq!(
        action.cluster_specifier,
        Some(ClusterSpecifier::Cluster("a".into()))
    );
}

#[test]
fn a_virtual_host_of_one_listener_answers_421_to_requests_tagged_by_another() {
    let mut vh = vhost(vec![simple_route(forward(&[("a", 1)]))]);
    let untagged = virtual_host(&vh, &normalized_hosts(&vh));
    assert_eq!(untagged.routes.len(), 1);
    assert!(untagged.request_headers_to_remove.is_empty());
    vh.tls = Some(model::VirtualHostTls {
        secret: "s".into(),
        redirect_http: false,
        listener_hostname: Some("*.example.com".into()),
    });
    let out = virtual_host(&vh, &normalized_hosts(&vh));
    assert_eq!(out.routes.len(), 2);
    let first = &out.routes[0];
    assert_eq!(first.name, MISDIRECTED_ROUTE);
    let Some(Action::DirectResponse(respond)) = &first.action else {
        panic!("{first:?}")
    };
    assert_eq!(respond.status, 421);
    // Tagged (an untagged request, the probe listener's, is routed) and not by this one.
    let headers = &first.r#match.as_ref().unwrap().headers;
    assert!(headers.iter().all(|h| h.name == LISTENER_HEADER));
    assert_eq!(
        headers[0].header_match_specifier,
        Some(HeaderMatchSpecifier::PresentMatch(true))
    );
    assert!(!headers[0].invert_match && headers[1].invert_match);
    let Some(HeaderMatchSpecifier::StringMatch(tag)) = &headers[1].header_match_specifier else {
        panic!()
    };
    assert_eq!(
        tag.match_pattern,
        Some(MatchPattern::Exact("*.example.com".into()))
    );
    assert_eq!(out.routes[1], untagged.routes[0]);
    assert_eq!(out.request_headers_to_remove, [LISTENER_HEADER]);
}

#[test]
fn redirect_and_require_tls() {
    let mut vh = vhost(vec![simple_route(model::RouteAction::RedirectHttps)]);
    vh.tls = Some(model::VirtualHostTls {
        secret: "s".into(),
        redirect_http: true,
        listener_hostname: None,
    });
    let out = virtual_host(&vh, &normalized_hosts(&vh));
    assert_eq!(out.require_tls, TlsRequirementType::All as i32);
    let Some(Action::Redirect(redirect)) = &out.routes[0].action else {
        panic!()
    };
    assert_eq!(
        redirect.scheme_rewrite_specifier,
        Some(redirect_action::SchemeRewriteSpecifier::HttpsRedirect(true))
    );
}
