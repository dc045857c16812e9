//! Probes (see DESIGN.md): endpoint probes become `health_check` HTTP filters on the probe
//! listener; version probes become virtual hosts of the shared route configuration, reachable
//! only under a secret Host name.

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, HeaderMatcher, Route, RouteMatch, VirtualHost,
    header_matcher::HeaderMatchSpecifier, route::Action, route_match::PathSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter::ConfigType,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::Any;

use super::{
    Inputs, PROBE_CATCH_ALL_VHOST, PROBE_DOMAIN_SUFFIX, PROBE_ID_HEADER, PROBE_TOKEN_HEADER,
    Problem, READINESS_PATH, Subject, VERSION_HEADER, VERSION_PROBE_VHOST_PREFIX, proto,
    unique_by_name, validate,
};
use crate::model;

pub const HEALTH_CHECK_FILTER: &str = "envoy.filters.http.health_check";

/// The version probes to serve, sorted by id; the others are reported.
pub fn select_version_probes<'a>(
    probes: &'a [model::VersionProbe],
    problems: &mut Vec<Problem>,
) -> Vec<&'a model::VersionProbe> {
    let unique = unique_by_name(
        probes,
        |p| p.id.as_str(),
        ("version probe", Subject::VersionProbe),
        super::serde_content,
        problems,
    );
    let mut selected = Vec::new();
    for (id, p) in unique {
        let check = if id.is_empty() {
            Err("version probe id is empty".to_owned())
        } else {
            validate::header_value(&p.version).map_err(|e| format!("version {e}"))
        };
        match check {
            Ok(()) => selected.push(p),
            Err(e) => problems.push(Problem::new(Subject::VersionProbe(id.to_owned()), e)),
        }
    }
    selected
}

/// The virtual host answering a version probe: any path, 200, the version in a header.
/// A trial's routes follow that answer: Envoy has to accept them, and nothing reaches them.
pub fn version_probe_virtual_host(p: &model::VersionProbe, token: &str) -> VirtualHost {
    let answer = Route {
        name: "version".to_owned(),
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::Prefix("/".to_owned())),
            ..Default::default()
        }),
        response_headers_to_add: vec![proto::header(
            VERSION_HEADER,
            &p.version,
            HeaderAppendAction::OverwriteIfExistsOrAdd,
        )],
        action: Some(Action::DirectResponse(DirectResponseAction {
            status: 200,
            ..Default::default()
        })),
        ..Default::default()
    };
    VirtualHost {
        name: format!("{VERSION_PROBE_VHOST_PREFIX}{}", p.id),
        domains: vec![model::version_probe_host(&p.id, token).to_ascii_lowercase()],
        routes: std::iter::once(answer)
            .chain(p.routes.iter().map(super::route::route))
            .collect(),
        ..Default::default()
    }
}

/// The virtual host answering 404 to every probe host that no probe serves (yet), ahead of
/// any user virtual host, even a `*` one (Envoy prefers suffix wildcards to `*`).
pub fn catch_all_virtual_host() -> VirtualHost {
    VirtualHost {
        name: PROBE_CATCH_ALL_VHOST.to_owned(),
        domains: vec![format!("*{PROBE_DOMAIN_SUFFIX}")],
        routes: vec![Route {
            name: "not-installed".to_owned(),
            r#match: Some(RouteMatch {
                path_specifier: Some(PathSpecifier::Prefix("/".to_owned())),
                ..Default::default()
            }),
            action: Some(Action::DirectResponse(DirectResponseAction {
                status: 404,
                ..Default::default()
            })),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The endpoint probes to serve, sorted by id; the others are reported.
pub fn select_endpoint_probes<'a>(
    probes: &'a [model::EndpointProbe],
    inputs: &Inputs<'_>,
    problems: &mut Vec<Problem>,
) -> Vec<&'a model::EndpointProbe> {
    let unique = unique_by_name(
        probes,
        |p| p.id.as_str(),
        ("endpoint probe", Subject::EndpointProbe),
        super::serde_content,
        problems,
    );
    let mut selected = Vec::new();
    for (id, p) in unique {
        let mut errors = Vec::new();
        if id.is_empty() {
            errors.push("endpoint probe id is empty".to_owned());
        } else if let Err(e) = validate::header_value(id) {
            errors.push(format!("id {e}"));
        }
        for (cluster, pct) in &p.clusters {
            if let Some(e) = inputs.cluster_error(cluster) {
                errors.push(e);
            } else if *pct > 0
                && let Some(e) = inputs.switch_error(cluster)
            {
                errors.push(e);
            }
            if *pct > 100 {
                errors.push(format!(
                    "minimum healthy percentage {pct} for cluster {cluster:?} is more than 100"
                ));
            }
        }
        if errors.is_empty() {
            selected.push(p);
        } else {
            problems.extend(
                errors
                    .into_iter()
                    .map(|e| Problem::new(Subject::EndpointProbe(id.to_owned()), e)),
            );
        }
    }
    selected
}

fn exact_header(name: &str, value: &str) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_owned(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(MatchPattern::Exact(value.to_owned())),
            ..Default::default()
        })),
        ..Default::default()
    }
}

pub fn health_check(p: &model::EndpointProbe, token: &str) -> HealthCheck {
    HealthCheck {
        pass_through_mode: proto::bool_value(false),
        headers: vec![
            exact_header(PROBE_ID_HEADER, &p.id),
            exact_header(PROBE_TOKEN_HEADER, token),
        ],
        cluster_min_healthy_percentages: p
            .clusters
            .iter()
            .map(|(cluster, pct)| {
                (
                    cluster.clone(),
                    Percent {
                        value: f64::from(*pct),
                    },
                )
            })
            .collect(),
        ..Default::default()
    }
}

/// Packs a health check deterministically (it has a map field).
pub fn pack_health_check(h: HealthCheck) -> Any {
    proto::pack_bytes::<HealthCheck>(proto::encode_with_sorted_map(h, |h| {
        &mut h.cluster_min_healthy_percentages
    }))
}

/// The probe listener's filter answering the fleet's readiness probe ([`READINESS_PATH`]):
/// Envoy's own health, no cluster's, and no token (a kubelet cannot send a secret).
pub fn readiness_filter() -> HttpFilter {
    let check = HealthCheck {
        pass_through_mode: proto::bool_value(false),
        headers: vec![exact_header(":path", READINESS_PATH)],
        ..Default::default()
    };
    HttpFilter {
        name: HEALTH_CHECK_FILTER.to_owned(),
        config_type: Some(ConfigType::TypedConfig(pack_health_check(check))),
        ..Default::default()
    }
}

/// The probe listener's filter answering one endpoint probe: 200 when every listed cluster
/// has enough available hosts, 503 otherwise, without touching any backend.
pub fn health_check_filter(p: &model::EndpointProbe, token: &str) -> HttpFilter {
    HttpFilter {
        name: HEALTH_CHECK_FILTER.to_owned(),
        config_type: Some(ConfigType::TypedConfig(pack_health_check(health_check(
            p, token,
        )))),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use prost::Message;

    use super::*;

    fn probe(n: usize) -> model::EndpointProbe {
        model::EndpointProbe {
            id: "ns/route@3".into(),
            clusters: (0..n)
                .map(|i| (format!("ns/svc-{i}/80"), (i % 101) as u32))
                .collect(),
        }
    }

    #[test]
    fn health_check_filter_is_deterministic() {
        // Without the sorted map encoding, the 30 keys come out in a different order for
        // (almost) every HashMap, and this fails.
        let first = health_check_filter(&probe(30), "t0ken");
        for _ in 0..20 {
            assert_eq!(health_check_filter(&probe(30), "t0ken"), first);
        }
        let Some(ConfigType::TypedConfig(any)) = first.config_type else {
            panic!()
        };
        let decoded = HealthCheck::decode(any.value.as_slice()).unwrap();
        assert_eq!(decoded, health_check(&probe(30), "t0ken"));
        assert!(!decoded.pass_through_mode.unwrap().value);
        assert_eq!(
            decoded.cluster_min_healthy_percentages["ns/svc-7/80"].value,
            7.0
        );
        let headers: Vec<_> = decoded.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(headers, [PROBE_ID_HEADER, PROBE_TOKEN_HEADER]);
    }

    #[test]
    fn version_probe_answers_with_its_version() {
        let vp = model::VersionProbe {
            id: "ns/route".into(),
            version: "v7".into(),
            ..Default::default()
        };
        let vh = version_probe_virtual_host(&vp, "Secret");
        assert_eq!(vh.name, "switchyard-probe/ns/route");
        assert_eq!(
            vh.domains,
            [model::version_probe_host("ns/route", "Secret").to_ascii_lowercase()]
        );
        let route = &vh.routes[0];
        assert!(matches!(
            route.action,
            Some(Action::DirectResponse(DirectResponseAction {
                status: 200,
                ..
            }))
        ));
        let header = route.response_headers_to_add[0].header.as_ref().unwrap();
        assert_eq!(
            (header.key.as_str(), header.value.as_str()),
            (VERSION_HEADER, "v7")
        );
    }

    #[test]
    fn invalid_probes_are_reported() {
        let known = model::Cluster {
            name: "ns/a/80".into(),
            service: model::ServiceRef {
                namespace: "ns".into(),
                name: "a".into(),
                port: 80,
            },
            settings: Default::default(),
            endpoints: vec![],
        };
        let clusters = HashMap::from([(known.name.clone(), known.clone())]);
        let (invalid_clusters, secrets) = (HashMap::new(), HashMap::new());
        let inputs = Inputs {
            clusters: &clusters,
            invalid_clusters: &invalid_clusters,
            secrets: &secrets,
        };
        let probes = vec![
            model::EndpointProbe {
                id: "good".into(),
                clusters: BTreeMap::from([("ns/a/80".into(), 1)]),
            },
            model::EndpointProbe {
                id: "unknown".into(),
                clusters: BTreeMap::from([("ns/a/80".into(), 1), ("ns/b/80".into(), 0)]),
            },
            model::EndpointProbe {
                id: "too-much".into(),
                clusters: BTreeMap::from([("ns/a/80".into(), 101)]),
            },
        ];
        let mut problems = Vec::new();
        let selected = select_endpoint_probes(&probes, &inputs, &mut problems);
        assert_eq!(
            selected.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
            ["good"]
        );
        assert_eq!(
            problems,
            [
                Problem::new(
                    Subject::EndpointProbe("too-much".into()),
                    "minimum healthy percentage 101 for cluster \"ns/a/80\" is more than 100"
                ),
                Problem::new(
                    Subject::EndpointProbe("unknown".into()),
                    "cluster \"ns/b/80\" is not defined"
                ),
            ]
        );

        let versions = vec![
            model::VersionProbe {
                id: "b".into(),
                version: "1".into(),
                ..Default::default()
            },
            model::VersionProbe {
                id: "a".into(),
                version: "bad\r\n".into(),
                ..Default::default()
            },
        ];
        let mut problems = Vec::new();
        let selected = select_version_probes(&versions, &mut problems);
        assert_eq!(
            selected.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
            ["b"]
        );
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].subject(), &Subject::VersionProbe("a".into()));
    }
}
