//! What a route needs beyond its own spec: no host an older route asks for, and nothing
//! Envoy would refuse.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::reflector::Store;

use super::resolve::{ResolvedRoute, resolve_route};
use super::routes::object_ref;
use super::{Context, is_others};
use crate::api::ProxyConfigRole;
use crate::api::TrafficRoute;
use crate::model::{Config as ModelConfig, ListenerSettings, TlsSecret};
use crate::rollout::{RouteError, live_name};
use crate::translate::translate;
use switchyard_core::hash::digest_of;
use switchyard_core::route::lower;

/// The translator's last verdict on each route's spec alone, with a digest of what it
/// judged: a route passes several times while it rolls out, and translating it on each
/// pass was a tenth of the operator's CPU while 2000 routes rolled out.
#[derive(Default)]
pub(crate) struct Verdicts(Mutex<HashMap<(String, String), Verdict>>);

/// A digest of the routes and clusters judged, and what the translator said of them.
type Verdict = (String, Result<(), String>);

impl Verdicts {
    /// The verdict on `route` for what `judged` digests, made by `judge` unless it is the
    /// last one made.
    fn get_or_judge(
        &self,
        routes: &Store<TrafficRoute>,
        route: (&str, &str),
        judged: String,
        judge: impl FnOnce() -> Result<(), String>,
    ) -> Result<(), String> {
        let key = (route.0.to_owned(), route.1.to_owned());
        if let Some((digest, verdict)) = self.lock().get(&key)
            && *digest == judged
        {
            return verdict.clone();
        }
        let verdict = judge();
        let mut verdicts = self.lock();
        // Routes deleted leave their verdicts behind; sweep them once they could be many.
        if verdicts.len() >= 2 * routes.len() + 64 {
            verdicts.retain(|(namespace, name), _| {
                let key = (namespace.clone(), name.clone());
                routes.get(&object_ref(&key)).is_some()
            });
        }
        verdicts.insert(key, (judged, verdict.clone()));
        verdict
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Verdict>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Context {
    /// The Services the route's backends name, from the watch's store. Resolving against
    /// these alone costs the route's size; indexing every Service of the namespace on each
    /// pass was most of the operator's CPU in a rollout of 10k routes in one namespace.
    pub(super) fn services_of(&self, route: &TrafficRoute) -> Vec<Arc<Service>> {
        service_keys(route)
            .into_iter()
            .filter_map(|key| self.services.get(&key))
            .collect()
    }
}

/// The Services the route's backends name, as (namespace, name), each once.
pub(super) fn service_keys(route: &TrafficRoute) -> Vec<(String, String)> {
    let namespace = route.namespace().unwrap_or_default();
    let mut names: Vec<&str> = (route.spec.route.rules.iter())
        .flat_map(|r| r.backends.iter().map(|b| b.service.as_str()))
        .collect();
    names.sort_unstable();
    names.dedup();
    (names.into_iter())
        .map(|name| (namespace.clone(), name.to_owned()))
        .collect()
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
    let judged = digest_of(&(&resolved.virtual_host, &resolved.clusters));
    let judge = || judge_alone(namespace, name, &resolved);
    match (ctx.verdicts).get_or_judge(&ctx.routes, (namespace, name), judged, judge) {
        Ok(()) => Ok(resolved),
        Err(message) => Err(RouteError::Rejected { message }),
    }
}

/// The translator's verdict on the route alone, lowered as it would serve live: the
/// message of its first problem, if it has one. TLS Secrets are checked where they are
/// read; here only the spec is judged.
fn judge_alone(namespace: &str, name: &str, resolved: &ResolvedRoute) -> Result<(), String> {
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
        Some(problem) => Err(problem.into_message()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;

    fn route(name: &str) -> TrafficRoute {
        let mut route = TrafficRoute::new(name, Default::default());
        route.metadata.namespace = Some("shop".into());
        route
    }

    #[test]
    fn a_route_is_judged_again_only_when_what_is_judged_changes() {
        let (routes, mut writer) = store();
        writer.apply_watcher_event(&Event::Apply(route("web")));
        let verdicts = Verdicts::default();
        let judged = std::cell::Cell::new(0);
        let judge = |verdict: Result<(), String>| {
            judged.set(judged.get() + 1);
            verdict
        };
        let web = ("shop", "web");
        let first = verdicts.get_or_judge(&routes, web, "a".into(), || judge(Ok(())));
        let again = verdicts.get_or_judge(&routes, web, "a".into(), || judge(Ok(())));
        assert_eq!((first, again, judged.get()), (Ok(()), Ok(()), 1));
        let refused = Err("no".to_string());
        let changed = verdicts.get_or_judge(&routes, web, "b".into(), || judge(refused.clone()));
        let kept = verdicts.get_or_judge(&routes, web, "b".into(), || judge(Ok(())));
        assert_eq!(
            (changed, kept.clone(), judged.get()),
            (refused.clone(), refused, 2)
        );
    }

    #[test]
    fn verdicts_of_routes_gone_are_swept_once_they_could_be_many() {
        let (routes, mut writer) = store();
        writer.apply_watcher_event(&Event::Apply(route("kept")));
        let verdicts = Verdicts::default();
        for i in 0..100 {
            let name = format!("gone-{i}");
            let judged = verdicts.get_or_judge(&routes, ("shop", &name), "a".into(), || Ok(()));
            assert_eq!(judged, Ok(()));
        }
        let kept = verdicts.get_or_judge(&routes, ("shop", "kept"), "a".into(), || Ok(()));
        assert_eq!(kept, Ok(()));
        // At most twice the routes there are, and a margin, before a sweep.
        assert!(verdicts.lock().len() <= 2 + 64);
        assert!(
            verdicts
                .lock()
                .contains_key(&("shop".into(), "kept".into()))
        );
    }
}
