//! Consistency of a snapshot: every name one resource refers to exists in the snapshot, and
//! nothing in it would make Envoy reject the route configuration or a listener for a reason
//! the translator is supposed to contain.

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::{
    FilterChain, Listener, filter, listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::{
    RouteConfiguration, header_matcher::HeaderMatchSpecifier, route::Action,
    route_action::ClusterSpecifier, route_match::PathSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
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
    DownstreamTlsContext, Secret,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::xds::r#type::matcher::v3::matcher::on_match;
use prost::{Message, Name};

use super::{cluster::eds_name, validate};
use crate::model;
use crate::xds::snapshot::{CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET};
use crate::xds::{Resource, Snapshot};

/// Checks that every route's clusters, every health check's clusters, every listener's
/// route configuration and every TLS context's secret exist in the snapshot; that every
/// EDS cluster has its ClusterLoadAssignment; that resource names match the names inside;
/// and that domains, virtual host names and SNI names are unique. All problems found are
/// returned, one per line.
pub fn check_consistency(snapshot: &Snapshot) -> Result<(), String> {
    let mut errors = Vec::new();
    let names = |type_url: &str| -> BTreeSet<String> {
        snapshot
            .resources(type_url)
            .map(|rs| rs.keys().cloned().collect())
            .unwrap_or_default()
    };
    let clusters = names(CLUSTER);
    let endpoints = names(ENDPOINT);
    let secrets = names(SECRET);
    let routes = names(ROUTE);

    for (type_url, resources) in snapshot.types() {
        for (name, resource) in resources {
            if resource.body.type_url != type_url {
                errors.push(format!(
                    "{name}: type {} filed under {type_url}",
                    resource.body.type_url
                ));
            }
        }
    }

    for r in each(snapshot, LISTENER) {
        let Some(listener) = decode::<Listener>(r, &mut errors) else {
            continue;
        };
        expect_name(r, &listener.name, &mut errors);
        check_udp_proxy(&listener, &clusters, &mut errors);
        let mut server_names: BTreeMap<String, String> = BTreeMap::new();
        for chain in listener
            .filter_chains
            .iter()
            .chain(&listener.default_filter_chain)
        {
            let at = format!("listener {:?} filter chain {:?}", listener.name, chain.name);
            check_chain(chain, &at, &routes, &clusters, &secrets, &mut errors);
            for sni in chain
                .filter_chain_match
                .iter()
                .flat_map(|m| &m.server_names)
            {
                if let Some(other) = server_names.insert(sni.clone(), chain.name.clone()) {
                    errors.push(format!("{at}: server name {sni:?} also in chain {other:?}"));
                }
            }
        }
    }

    for r in each(snapshot, ROUTE) {
        let Some(rc) = decode::<RouteConfiguration>(r, &mut errors) else {
            continue;
        };
        expect_name(r, &rc.name, &mut errors);
        check_route_configuration(&rc, &clusters, &mut errors);
    }

    for r in each(snapshot, CLUSTER) {
        let Some(cluster) = decode::<Cluster>(r, &mut errors) else {
            continue;
        };
        expect_name(r, &cluster.name, &mut errors);
        if cluster.eds_cluster_config.is_some() && !endpoints.contains(eds_name(&cluster)) {
            errors.push(format!(
                "cluster {:?}: ClusterLoadAssignment {:?} is not in the snapshot",
                cluster.name,
                eds_name(&cluster)
            ));
        }
    }
    for r in each(snapshot, ENDPOINT) {
        if let Some(cla) = decode::<ClusterLoadAssignment>(r, &mut errors) {
            expect_name(r, &cla.cluster_name, &mut errors);
        }
    }
    for r in each(snapshot, SECRET) {
        if let Some(secret) = decode::<Secret>(r, &mut errors) {
            expect_name(r, &secret.name, &mut errors);
        }
    }

    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

/// A route configuration's virtual hosts: unique names and domains, valid regular
/// expressions, clusters in the snapshot.
fn check_route_configuration(
    rc: &RouteConfiguration,
    clusters: &BTreeSet<String>,
    errors: &mut Vec<String>,
) {
    let mut vhost_names = BTreeSet::new();
    let mut domains: BTreeMap<String, String> = BTreeMap::new();
    for vh in &rc.virtual_hosts {
        if !vhost_names.insert(vh.name.clone()) {
            errors.push(format!(
                "route configuration {:?}: virtual host {:?} twice",
                rc.name, vh.name
            ));
        }
        if vh.domains.is_empty() {
            errors.push(format!("virtual host {:?} has no domains", vh.name));
        }
        for domain in &vh.domains {
            if let Some(other) = domains.insert(domain.to_ascii_lowercase(), vh.name.clone()) {
                errors.push(format!(
                    "domain {domain:?} in virtual hosts {other:?} and {:?}",
                    vh.name
                ));
            }
        }
        for route in &vh.routes {
            let at = format!("virtual host {:?} route {:?}", vh.name, route.name);
            let mut regexes = Vec::new();
            if let Some(m) = &route.r#match {
                if let Some(PathSpecifier::SafeRegex(re)) = &m.path_specifier {
                    regexes.push(re.regex.as_str());
                }
                for h in &m.headers {
                    if let Some(HeaderMatchSpecifier::StringMatch(s)) = &h.header_match_specifier
                        && let Some(MatchPattern::SafeRegex(re)) = &s.match_pattern
                    {
                        regexes.push(re.regex.as_str());
                    }
                }
            }
            for re in regexes {
                if let Err(e) = validate::regex(re) {
                    errors.push(format!("{at}: {e}"));
                }
            }
            let Some(Action::Route(action)) = &route.action else {
                continue;
            };
            let targets: Vec<&str> = match &action.cluster_specifier {
                Some(ClusterSpecifier::Cluster(c)) => vec![c.as_str()],
                Some(ClusterSpecifier::WeightedClusters(w)) => {
                    let total: u64 = w
                        .clusters
                        .iter()
                        .map(|c| u64::from(c.weight.map_or(0, |w| w.value)))
                        .sum();
                    if w.clusters.is_empty() || total == 0 {
                        errors.push(format!("{at}: weighted clusters with total weight 0"));
                    }
                    w.clusters.iter().map(|c| c.name.as_str()).collect()
                }
                other => {
                    errors.push(format!("{at}: unexpected cluster specifier {other:?}"));
                    vec![]
                }
            };
            let mirrored = action
                .request_mirror_policies
                .iter()
                .map(|m| m.cluster.as_str());
            for c in targets.into_iter().chain(mirrored) {
                // The share of 500s names a cluster no snapshot has, on purpose.
                if c != model::UNAVAILABLE_CLUSTER && !clusters.contains(c) {
                    errors.push(format!("{at}: cluster {c:?} is not in the snapshot"));
                }
            }
        }
    }
}

/// A UDP listener's proxy: one cluster, in the snapshot (or the unavailable one).
fn check_udp_proxy(listener: &Listener, clusters: &BTreeSet<String>, errors: &mut Vec<String>) {
    let at = format!("listener {:?}", listener.name);
    for f in &listener.listener_filters {
        let Some(listener_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
            continue;
        };
        if any.type_url != UdpProxyConfig::type_url() {
            continue;
        }
        let Some(proxy) = unpack::<UdpProxyConfig>(any, &at, errors) else {
            continue;
        };
        let route = match &proxy.route_specifier {
            Some(UdpRoutes::Matcher(m)) => (m.on_no_match.as_ref())
                .and_then(|o| match &o.on_match {
                    Some(on_match::OnMatch::Action(a)) => a.typed_config.as_ref(),
                    _ => None,
                })
                .and_then(|any| unpack::<UdpRoute>(any, &at, errors)),
            _ => None,
        };
        match route {
            Some(r) if r.cluster == model::UNAVAILABLE_CLUSTER || clusters.contains(&r.cluster) => {
            }
            Some(r) => errors.push(format!(
                "{at}: cluster {:?} is not in the snapshot",
                r.cluster
            )),
            None => errors.push(format!("{at}: udp_proxy without a route to a cluster")),
        }
    }
}

fn check_chain(
    chain: &FilterChain,
    at: &str,
    routes: &BTreeSet<String>,
    clusters: &BTreeSet<String>,
    secrets: &BTreeSet<String>,
    errors: &mut Vec<String>,
) {
    for f in &chain.filters {
        let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
            errors.push(format!("{at}: filter {:?} has no typed config", f.name));
            continue;
        };
        if any.type_url == TcpProxy::type_url() {
            let Some(proxy) = unpack::<TcpProxy>(any, at, errors) else {
                continue;
            };
            let targets: Vec<&str> = match &proxy.cluster_specifier {
                Some(TcpClusters::Cluster(c)) => vec![c.as_str()],
                Some(TcpClusters::WeightedClusters(w)) => {
                    if w.clusters.is_empty() || w.clusters.iter().any(|c| c.weight == 0) {
                        errors.push(format!("{at}: a weighted cluster of weight 0, or none"));
                    }
                    w.clusters.iter().map(|c| c.name.as_str()).collect()
                }
                None => {
                    errors.push(format!("{at}: tcp_proxy without a cluster"));
                    vec![]
                }
            };
            for c in targets {
                // The share of closed connections names a cluster no snapshot has.
                if c != model::UNAVAILABLE_CLUSTER && !clusters.contains(c) {
                    errors.push(format!("{at}: cluster {c:?} is not in the snapshot"));
                }
            }
            continue;
        }
        let Some(hcm) = unpack::<HttpConnectionManager>(any, at, errors) else {
            continue;
        };
        match &hcm.route_specifier {
            Some(RouteSpecifier::Rds(rds)) => {
                if !routes.contains(&rds.route_config_name) {
                    errors.push(format!(
                        "{at}: route configuration {:?} is not in the snapshot",
                        rds.route_config_name
                    ));
                }
            }
            // A TCP or TLS listener's probe port.
            Some(RouteSpecifier::RouteConfig(rc)) => {
                check_route_configuration(rc, clusters, errors);
            }
            other => errors.push(format!(
                "{at}: expected a route configuration, found {other:?}"
            )),
        }
        for (i, hf) in hcm.http_filters.iter().enumerate() {
            let Some(http_filter::ConfigType::TypedConfig(any)) = &hf.config_type else {
                errors.push(format!(
                    "{at}: http filter {:?} has no typed config",
                    hf.name
                ));
                continue;
            };
            let last = i + 1 == hcm.http_filters.len();
            if (any.type_url == Router::type_url()) != last {
                errors.push(format!(
                    "{at}: the router must be the last http filter, and only it"
                ));
            }
            if any.type_url == HealthCheck::type_url() {
                let Some(hc) = unpack::<HealthCheck>(any, at, errors) else {
                    continue;
                };
                for c in hc.cluster_min_healthy_percentages.keys() {
                    if !clusters.contains(c) {
                        errors.push(format!(
                            "{at}: health check cluster {c:?} is not in the snapshot"
                        ));
                    }
                }
            }
        }
    }
    if let Some(socket) = &chain.transport_socket {
        let Some(
            envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(
                any,
            ),
        ) = &socket.config_type
        else {
            errors.push(format!("{at}: transport socket has no typed config"));
            return;
        };
        let Some(tls) = unpack::<DownstreamTlsContext>(any, at, errors) else {
            return;
        };
        for sds in tls
            .common_tls_context
            .iter()
            .flat_map(|c| &c.tls_certificate_sds_secret_configs)
        {
            if !secrets.contains(&sds.name) {
                errors.push(format!(
                    "{at}: secret {:?} is not in the snapshot",
                    sds.name
                ));
            }
        }
    }
}

fn each<'a>(snapshot: &'a Snapshot, type_url: &str) -> impl Iterator<Item = &'a Resource> {
    snapshot
        .resources(type_url)
        .into_iter()
        .flat_map(|rs| rs.values().map(|r| r.as_ref()))
}

fn decode<M: Message + Default + Name>(r: &Resource, errors: &mut Vec<String>) -> Option<M> {
    unpack(&r.body, &r.name, errors)
}

fn unpack<M: Message + Default + Name>(any: &Any, at: &str, errors: &mut Vec<String>) -> Option<M> {
    if any.type_url != M::type_url() {
        // Not this type: the caller looks for something else (e.g. another filter).
        return None;
    }
    match M::decode(any.value.as_slice()) {
        Ok(m) => Some(m),
        Err(e) => {
            errors.push(format!("{at}: cannot decode {}: {e}", M::full_name()));
            None
        }
    }
}

fn expect_name(r: &Resource, inner: &str, errors: &mut Vec<String>) {
    if r.name != inner {
        errors.push(format!(
            "resource {:?} contains a message named {inner:?}",
            r.name
        ));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::translate::translate;

    fn config() -> model::Config {
        let cluster = model::Cluster {
            name: "ns/a/80".into(),
            service: model::ServiceRef {
                namespace: "ns".into(),
                name: "a".into(),
                port: 80,
            },
            settings: Default::default(),
            endpoints: vec![],
        };
        model::Config {
            gateway_listeners: Vec::new(),
            listeners: model::ListenerSettings {
                probe_token: "t".into(),
                ..Default::default()
            },
            virtual_hosts: vec![model::VirtualHost {
                listener: None,
                leaving: false,
                created: None,
                name: "ns/vh".into(),
                hosts: vec!["a.example.com".into()],
                tls: Some(model::VirtualHostTls {
                    secret: "ns/cert".into(),
                    redirect_http: false,
                    listener_hostname: None,
                }),
                routes: vec![model::Route {
                    name: "r".into(),
                    path: model::PathMatch::Prefix("/".into()),
                    headers: vec![],
                    method: None,
                    query: Vec::new(),
                    action: model::RouteAction::Forward(model::Forward {
                        backends: vec![model::WeightedCluster {
                            cluster: "ns/a/80".into(),
                            weight: 1,
                            request_headers: model::HeaderEdits::default(),
                        }],
                        ..Default::default()
                    }),
                    request_headers: Default::default(),
                    response_headers: Default::default(),
                }],
            }],
            clusters: vec![cluster],
            secrets: vec![model::TlsSecret {
                name: "ns/cert".into(),
                certificate_chain: "CERT".into(),
                private_key: "KEY".into(),
            }],
            endpoint_probes: vec![model::EndpointProbe {
                id: "p".into(),
                clusters: BTreeMap::from([("ns/a/80".into(), 1)]),
            }],
            version_probes: vec![],
        }
    }

    fn without(snapshot: &Snapshot, type_url: &str) -> Snapshot {
        Snapshot::new(snapshot.types().flat_map(|(t, rs)| {
            rs.values()
                .filter(move |_| t != type_url)
                .map(|r| Resource::clone(r))
        }))
    }

    #[test]
    fn translation_is_consistent() {
        let t = translate(&config());
        assert_eq!(t.problems, []);
        check_consistency(&t.snapshot).unwrap();
    }

    #[test]
    fn missing_references_are_found() {
        let snapshot = translate(&config()).snapshot;
        let e = check_consistency(&without(&snapshot, SECRET)).unwrap_err();
        assert!(
            e.contains("secret \"ns/cert\" is not in the snapshot"),
            "{e}"
        );
        let e = check_consistency(&without(&snapshot, ENDPOINT)).unwrap_err();
        assert!(
            e.contains("ClusterLoadAssignment \"ns/a/80\" is not in the snapshot"),
            "{e}"
        );
        let e = check_consistency(&without(&snapshot, ROUTE)).unwrap_err();
        assert!(
            e.contains("route configuration \"switchyard\" is not in the snapshot"),
            "{e}"
        );
        let e = check_consistency(&without(&snapshot, CLUSTER)).unwrap_err();
        assert!(
            e.contains("route \"r\": cluster \"ns/a/80\" is not in the snapshot"),
            "{e}"
        );
        assert!(
            e.contains("health check cluster \"ns/a/80\" is not in the snapshot"),
            "{e}"
        );
    }
}
