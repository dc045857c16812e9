//! The assembly step: the one way into the route vocabulary. Every front-end ends here,
//! whatever it lowers from (a TrafficRoute's or a file's spec through [`super::resolve`],
//! a Gateway API HTTPRoute in `src/gateway/translate`), and only here is a
//! [`ResolvedRoute`] made:
//!
//! 1. [`check`]: each rule's parts ([`Draft`]) go through the rule and option checks
//!    ([`super::check::rule`]), as much of them as the front-end's [`Checks`] say;
//! 2. [`Checked::rule`]: once the front-end's lookup has made its backends clusters, the
//!    checked rule is named and its clusters take the rule's settings (load balancing
//!    policy, limits, outlier detection, health checking: a rule with settings has clusters
//!    of its own) → [`Rule`];
//! 3. [`assemble`]: hosts, TLS, [`Rule`]s and the listener → the route, with every
//!    cluster its rules send to and its version.
//!
//! A rule's checks run before its route is assembled, and apart from it: a Gateway's
//! virtual host gathers the rules of many HTTPRoutes, and one route's bad rule must be
//! that route's refusal, never its neighbours' (I9).
//!
//! Pure and deterministic (I6): the version is a digest of what the route serves, so the
//! same rules give the same version on every replica. The versions name ProxyConfigs in
//! running clusters: the recipe must not change, or every route re-rolls on upgrade.

use serde::Serialize;

use super::check::{self, Checks, Draft, SpecError};
use super::resolved::{
    ResolvedBackend, ResolvedCluster, ResolvedListener, ResolvedMirror, ResolvedRoute,
    ResolvedRule, ResolvedTls, ResolvedVirtualHost, SecretRef,
};
use super::spec::LoadBalancer;
use crate::hash;

/// A rule's parts that passed the checks, waiting for their name and backends.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked(Draft);

/// Runs the rule and option checks of `draft`, the rule at `at` (the path its messages
/// start with), as much as `checks` say.
pub fn check(at: &str, checks: Checks, draft: Draft) -> Result<Checked, SpecError> {
    check::rule(at, checks, &draft)?;
    Ok(Checked(draft))
}

impl Checked {
    /// The rule named `name`, sending to `backends` (the clusters of the front-end's
    /// lookup, with their weights), each cluster taking the rule's settings.
    pub fn rule(self, name: String, backends: Vec<ResolvedBackend>) -> Rule {
        let Draft {
            matches,
            redirect_https,
            redirect,
            options,
        } = self.0;
        let lb_policy = options.load_balancer.as_deref().and_then(cluster_policy);
        let backends = backends
            .into_iter()
            .map(|b| ResolvedBackend {
                cluster: ResolvedCluster {
                    lb_policy: lb_policy.clone(),
                    circuit_breaker: options.circuit_breaker.clone(),
                    outlier_detection: options.outlier_detection.clone(),
                    health_check: options.health_check.clone(),
                    ..b.cluster
                },
                ..b
            })
            .collect();
        Rule(ResolvedRule {
            name,
            matches,
            backends,
            redirect_https,
            redirect,
            unavailable_weight: 0,
            grpc: false,
            mirrors: Vec::new(),
            options,
        })
    }
}

/// A rule made by the assembly step, ready to be assembled into a route. It serializes as
/// the [`ResolvedRule`] it holds.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(transparent)]
pub struct Rule(ResolvedRule);

impl Rule {
    pub fn resolved(&self) -> &ResolvedRule {
        &self.0
    }

    /// The rule, answering 500 for a share of `weight` next to its backends' weights (the
    /// backends its front-end could not use).
    pub fn unavailable(mut self, weight: i32) -> Self {
        self.0.unavailable_weight = weight;
        self
    }

    /// The rule, serving gRPC calls: its unavailable share answered UNAVAILABLE.
    pub fn grpc(mut self) -> Self {
        self.0.grpc = true;
        self
    }

    /// The rule, copying its requests to `mirrors` too. A mirror's cluster is the plain
    /// one of its service port: the rule's settings are for the backends that answer.
    pub fn mirrored(mut self, mirrors: Vec<ResolvedMirror>) -> Self {
        self.0.mirrors = mirrors;
        self
    }

    /// The rule, its redirect sending to `port` when it names neither a scheme nor a port
    /// (the Gateway API's rule for a listener's port: such a redirect keeps it).
    pub fn redirecting_to_port(mut self, port: i32) -> Self {
        if let Some(r) = &mut self.0.redirect
            && r.scheme.is_none()
            && r.port.is_none()
        {
            r.port = Some(port);
        }
        self
    }

    /// The rule, its TLS backends' connections presenting the certificate of `secret`
    /// (a Gateway's client certificate: the clusters are then the Gateway's own).
    pub fn presenting(mut self, secret: &SecretRef) -> Self {
        let clusters = (self.0.backends.iter_mut().map(|b| &mut b.cluster))
            .chain(self.0.mirrors.iter_mut().map(|m| &mut m.cluster));
        for tls in clusters.filter_map(|c| c.tls.as_mut()) {
            tls.client_certificate = Some(secret.clone());
        }
        self
    }

    /// The rule of a route in namespace `from`, as a route in namespace `to` holds it
    /// (a Gateway's ProxyConfigs hold the rules of HTTPRoutes of other namespaces): a
    /// cluster's namespace is written out unless it is `to`.
    pub fn moved(mut self, from: &str, to: &str) -> Self {
        let clusters = (self.0.backends.iter_mut().map(|b| &mut b.cluster))
            .chain(self.0.mirrors.iter_mut().map(|m| &mut m.cluster));
        for cluster in clusters {
            let service_ns = cluster.namespace.as_deref().unwrap_or(from);
            cluster.namespace = (service_ns != to).then(|| service_ns.to_owned());
        }
        self
    }
}

/// The route of `rules` for `hosts`, served with `tls` on `listener` (None: the shared
/// listeners): its clusters, sorted and deduplicated, and its version.
pub fn assemble(
    hosts: Vec<String>,
    tls: Option<ResolvedTls>,
    rules: Vec<Rule>,
    listener: Option<ResolvedListener>,
) -> ResolvedRoute {
    let virtual_host = ResolvedVirtualHost {
        hosts,
        tls,
        rules: rules.into_iter().map(|r| r.0).collect(),
    };
    let clusters = referenced_clusters(&virtual_host);
    let version = version(&virtual_host, listener.as_ref());
    ResolvedRoute {
        virtual_host,
        clusters,
        version,
        listener,
    }
}

/// The version a route's live config announces: the digest of its virtual host, and of
/// the listener with it when it has one of its own (a Gateway's port).
fn version(virtual_host: &ResolvedVirtualHost, listener: Option<&ResolvedListener>) -> String {
    match listener {
        None => hash::digest_of(virtual_host),
        Some(listener) => hash::digest_of(&(virtual_host, listener)),
    }
}

/// The policy of the clusters of a rule with `lb`: None for round robin (the default
/// cluster); affinity without a policy is ring hash.
fn cluster_policy(lb: &LoadBalancer) -> Option<String> {
    match lb.policy.as_deref() {
        None if lb.affinity.is_some() => Some("ringHash".to_owned()),
        None | Some("roundRobin") => None,
        Some(policy) => Some(policy.to_owned()),
    }
}

/// Every cluster the rules of `virtual_host` send to or copy to, sorted and deduplicated.
fn referenced_clusters(virtual_host: &ResolvedVirtualHost) -> Vec<ResolvedCluster> {
    sorted_unique(virtual_host.rules.iter().flat_map(|r| {
        (r.backends.iter().map(|b| b.cluster.clone()))
            .chain(r.mirrors.iter().map(|m| m.cluster.clone()))
    }))
}

/// The clusters of `virtual_host` that only get copies: a switch needs them on every
/// Envoy, not their endpoints ready (a mirror with none drops its copies, and no client
/// sees it).
pub fn mirror_only_clusters(virtual_host: &ResolvedVirtualHost) -> Vec<ResolvedCluster> {
    let answering: Vec<&ResolvedCluster> = (virtual_host.rules.iter())
        .flat_map(|r| r.backends.iter().map(|b| &b.cluster))
        .collect();
    sorted_unique(
        (virtual_host.rules.iter())
            .flat_map(|r| r.mirrors.iter().map(|m| &m.cluster))
            .filter(|c| !answering.contains(c))
            .cloned(),
    )
}

/// `clusters` sorted and deduplicated: how a route's (and a probe's) clusters are listed.
pub fn sorted_unique(clusters: impl IntoIterator<Item = ResolvedCluster>) -> Vec<ResolvedCluster> {
    let mut clusters: Vec<_> = clusters.into_iter().collect();
    clusters.sort();
    clusters.dedup();
    clusters
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::spec::{Affinity, CircuitBreaker, RuleOptions};

    fn cluster(service: &str) -> ResolvedCluster {
        ResolvedCluster {
            service: service.into(),
            port: 80,
            ..ResolvedCluster::default()
        }
    }

    fn backend(service: &str, namespace: Option<&str>) -> ResolvedBackend {
        ResolvedBackend {
            cluster: ResolvedCluster {
                namespace: namespace.map(str::to_owned),
                ..cluster(service)
            },
            weight: 1,
            request_headers: None,
        }
    }

    fn rule(name: &str, options: RuleOptions, backends: Vec<ResolvedBackend>) -> Rule {
        let draft = Draft {
            options,
            ..Draft::default()
        };
        check("", Checks::Spec, draft)
            .expect("valid")
            .rule(name.into(), backends)
    }

    #[test]
    fn mirrors_are_clusters_of_the_route_and_those_only_mirrored_are_told_apart() {
        let mirror = |service: &str, namespace: Option<&str>| ResolvedMirror {
            cluster: backend(service, namespace).cluster,
            per_million: Some(500_000),
        };
        let rules = vec![
            rule("a", RuleOptions::default(), vec![backend("web", None)])
                .mirrored(vec![mirror("shadow", None), mirror("web", None)]),
            rule("b", RuleOptions::default(), vec![backend("api", None)])
                .mirrored(vec![mirror("audit", Some("other"))]),
        ];
        let route = assemble(vec!["a.example.com".into()], None, rules, None);
        let services = |clusters: &[ResolvedCluster]| -> Vec<String> {
            clusters.iter().map(|c| c.service.clone()).collect()
        };
        assert_eq!(services(&route.clusters), ["api", "shadow", "web", "audit"]);
        // `web` is mirrored to but also answers: its endpoints count.
        assert_eq!(
            services(&mirror_only_clusters(&route.virtual_host)),
            ["shadow", "audit"]
        );
        // Moved to the namespace of the mirror's Service, its namespace is implied.
        let moved = rule("c", RuleOptions::default(), vec![backend("web", None)])
            .mirrored(vec![mirror("audit", Some("other"))])
            .moved("apps", "other");
        assert_eq!(moved.resolved().mirrors[0].cluster.namespace, None);
        assert_eq!(
            moved.resolved().backends[0].cluster.namespace.as_deref(),
            Some("apps")
        );
    }

    #[test]
    fn the_version_is_the_virtual_hosts_digest_and_the_listeners_with_it() {
        let rules = || {
            vec![rule(
                "a",
                RuleOptions::default(),
                vec![backend("web", None)],
            )]
        };
        let shared = assemble(vec!["a.example.com".into()], None, rules(), None);
        assert_eq!(shared.version, hash::digest_of(&shared.virtual_host));
        let listener = ResolvedListener {
            name: "infra/edge/80/http".into(),
            port: 20000,
            probe_port: 10000,
            ..ResolvedListener::default()
        };
        let own = assemble(
            vec!["a.example.com".into()],
            None,
            rules(),
            Some(listener.clone()),
        );
        assert_eq!(own.virtual_host, shared.virtual_host);
        assert_eq!(
            own.version,
            hash::digest_of(&(&own.virtual_host, &listener))
        );
        assert_eq!(own.listener, Some(listener));
    }

    #[test]
    fn clusters_take_their_rules_settings_and_are_listed_once() {
        let limits = CircuitBreaker {
            max_requests: Some(10),
            ..CircuitBreaker::default()
        };
        let sticky = RuleOptions {
            load_balancer: Some(Box::new(LoadBalancer {
                policy: None,
                affinity: Some(Affinity {
                    source_ip: Some(true),
                    ..Affinity::default()
                }),
            })),
            circuit_breaker: Some(Box::new(limits.clone())),
            ..RuleOptions::default()
        };
        let route = assemble(
            vec!["a.example.com".into()],
            None,
            vec![
                rule("sticky", sticky, vec![backend("web", None)]),
                rule("plain", RuleOptions::default(), vec![backend("web", None)]),
                rule("again", RuleOptions::default(), vec![backend("web", None)]),
            ],
            None,
        );
        let sticky = ResolvedCluster {
            lb_policy: Some("ringHash".into()),
            circuit_breaker: Some(Box::new(limits)),
            ..cluster("web")
        };
        assert_eq!(route.clusters, [cluster("web"), sticky.clone()]);
        assert_eq!(route.virtual_host.rules[0].backends[0].cluster, sticky);
    }

    #[test]
    fn a_moved_rule_names_every_namespace_but_the_routes() {
        let moved = rule(
            "r",
            RuleOptions::default(),
            vec![
                backend("same", None),
                backend("gateway", Some("infra")),
                backend("other", Some("shop")),
            ],
        )
        .moved("apps", "infra");
        let namespaces: Vec<Option<&str>> = moved
            .resolved()
            .backends
            .iter()
            .map(|b| b.cluster.namespace.as_deref())
            .collect();
        assert_eq!(namespaces, [Some("apps"), None, Some("shop")]);
    }
}
