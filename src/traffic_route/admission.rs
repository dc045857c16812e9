//! What a route needs beyond its own spec: no host an older route asks for, and nothing
//! Envoy would refuse.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::resolve::{ResolvedRoute, resolve_route};
use super::routes::object_ref;
use super::{Context, is_others};
use crate::api::ProxyConfigRole;
use crate::api::TrafficRoute;
use crate::model::{Config as ModelConfig, ListenerSettings, TlsSecret};
use crate::rollout::{RouteError, live_name};
use crate::translate::translate;
use switchyard_core::route::lower;

impl Context {
    /// The Services the route's backends name, from the watch's store. Resolving against
    /// these alone costs the route's size; indexing every Service of the namespace on each
    /// pass was most of the operator's CPU in a rollout of 10k routes in one namespace.
    pub(super) fn services_of(&self, route: &TrafficRoute) -> Vec<Arc<Service>> {
        let namespace = route.namespace().unwrap_or_default();
        let mut names: Vec<&str> = route
            .spec
            .route
            .rules
            .iter()
            .flat_map(|r| r.backends.iter().map(|b| b.service.as_str()))
            .collect();
        names.sort_unstable();
        names.dedup();
        names
            .into_iter()
            .filter_map(|name| self.services.get(&(namespace.clone(), name.to_owned())))
            .collect()
    }
}

/// The oldest route asking for one of this route's hosts, if it is older than this one:
/// (host, "namespace/name"). Age is creationTimestamp, then namespace/name, as the Gateway
/// API orders conflicts: the same answer on every replica, whatever came first. Creation
/// times count in seconds, so between routes created in the same second the one serving
/// the host keeps it before names decide: a route created right after another never takes
/// its host for its name. A route being deleted, or one whose spec does not resolve, asks
/// for nothing.
pub(super) fn older_claimant(
    ctx: &Context,
    route: &TrafficRoute,
    resolved: &ResolvedRoute,
) -> Option<(String, String)> {
    let namespace = route.metadata.namespace.as_deref().unwrap_or_default();
    let name = route.metadata.name.as_deref().unwrap_or_default();
    // Whether the route's live config serves the host now.
    let serves = |ns: &str, route: &str, host: &str| {
        ctx.proxy_configs
            .store()
            .get(&(ns.to_owned(), live_name(route)))
            .is_some_and(|pc| {
                pc.spec.role == ProxyConfigRole::Live
                    && !is_others(&pc)
                    && pc.spec.route == route
                    && pc
                        .spec
                        .virtual_host
                        .as_ref()
                        .is_some_and(|vh| vh.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)))
            })
    };
    let others: Vec<Arc<TrafficRoute>> = ctx
        .route_index
        .asking_for(&resolved.virtual_host.hosts)
        .into_iter()
        .filter(|(ns, n)| !(ns == namespace && n == name))
        .filter_map(|key| ctx.routes.get(&object_ref(&key)))
        .collect();
    let mut claimants: Vec<(Seniority<'_>, String, &TrafficRoute)> = Vec::new();
    for other in &others {
        if other.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(host) = resolved.virtual_host.hosts.iter().find(|h| {
            other
                .spec
                .route
                .hosts
                .iter()
                .any(|o| o.eq_ignore_ascii_case(h))
        }) else {
            continue;
        };
        let other_ns = other.metadata.namespace.as_deref().unwrap_or_default();
        let other_name = other.metadata.name.as_deref().unwrap_or_default();
        let me = seniority(
            route.metadata.creation_timestamp.as_ref(),
            serves(namespace, name, host),
            namespace,
            name,
        );
        let age = seniority(
            other.metadata.creation_timestamp.as_ref(),
            serves(other_ns, other_name, host),
            other_ns,
            other_name,
        );
        if age < me {
            claimants.push((age, host.clone(), other.as_ref()));
        }
    }
    claimants.sort_by(|a, b| a.0.cmp(&b.0));
    claimants.into_iter().find_map(|(_, host, other)| {
        let other_ns = other.namespace().unwrap_or_default();
        let services = ctx.services_of(other);
        let named: Vec<&Service> = services.iter().map(Arc::as_ref).collect();
        resolve_route(other, &named)
            .is_ok()
            .then(|| (host, format!("{other_ns}/{}", other.name_any())))
    })
}

/// Older first: creation time (unknown counts as newest), then serving the host, then
/// namespace, then name.
pub(super) type Seniority<'a> = (bool, Option<&'a Time>, bool, &'a str, &'a str);

pub(super) fn seniority<'a>(
    created: Option<&'a Time>,
    serves: bool,
    namespace: &'a str,
    name: &'a str,
) -> Seniority<'a> {
    (created.is_none(), created, !serves, namespace, name)
}

/// Checks that need more than the route's own spec: no host taken from another route, and
/// nothing Envoy would refuse (the translator's verdict on the route alone).
pub(super) fn admit(
    ctx: &Context,
    route: &TrafficRoute,
    resolved: ResolvedRoute,
) -> Result<ResolvedRoute, RouteError> {
    if let Some((host, route)) = older_claimant(ctx, route, &resolved) {
        return Err(RouteError::HostConflict { host, route });
    }
    let namespace = route.metadata.namespace.as_deref().unwrap_or_default();
    let name = route.metadata.name.as_deref().unwrap_or_default();
    // The translator's verdict on the route alone, lowered as it would serve live. TLS
    // Secrets are checked where they are read; here only the spec is judged.
    let part = lower::live(&lower::Live {
        default_secret: None,
        listener: None,
        namespace,
        route: name,
        version: &resolved.version,
        virtual_host: &resolved.virtual_host,
        clusters: &resolved.clusters,
        created: None,
        leaving: false,
    });
    let mut problems = part.problems.clone();
    let config = ModelConfig {
        gateway_listeners: Vec::new(),
        listeners: ListenerSettings {
            probe_token: "admission".into(),
            ..ListenerSettings::default()
        },
        virtual_hosts: part.virtual_host.into_iter().collect(),
        clusters: part
            .clusters
            .into_iter()
            .map(|(name, namespace, cluster)| lower::cluster(name, &namespace, &cluster, vec![]))
            .collect(),
        secrets: part
            .secret
            .iter()
            .map(|(namespace, secret)| TlsSecret {
                name: lower::secret_name(namespace, secret),
                certificate_chain: "-".into(),
                private_key: "-".into(),
            })
            .collect(),
        version_probes: part.version_probe.into_iter().collect(),
        endpoint_probes: Vec::new(),
    };
    problems.extend(translate(&config).problems);
    let id = format!("{namespace}/{name}");
    match problems
        .into_iter()
        .find(|p| p.subject().virtual_host() == Some(id.as_str()))
    {
        Some(problem) => Err(RouteError::Rejected {
            message: problem.into_message(),
        }),
        None => Ok(resolved),
    }
}
