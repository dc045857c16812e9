//! The rollout of one TrafficRoute generation, as a pure decision: given what the API
//! server holds (the route, its live and probe ProxyConfigs) and what was verified in this
//! pass, the next step. The reconciler performs the step and asks again.
//!
//! Everything is derived from API state, so a restarted or new leader continues where the
//! old one was: verification is simply repeated, and live traffic is never pointed at a
//! cluster that was not verified on every Envoy in the same pass (I3).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{ProxyConfigRole, ProxyConfigSpec};

use super::spec::{RouteError, proxy_config_spec};
use switchyard_core::route::{ResolvedCluster, ResolvedRoute};

/// What the API server holds for one route.
pub struct Observed<'a> {
    pub route: &'a str,
    pub generation: i64,
    pub resolved: &'a Result<ResolvedRoute, RouteError>,
    pub live: Option<&'a ProxyConfigSpec>,
    pub probe: Option<&'a ProxyConfigSpec>,
    /// Time since the live config was last promoted (None if unknown).
    pub since_promoted: Option<Duration>,
    pub drain_period: Duration,
    /// Two-phase rollout; off only for tests that prove it matters.
    pub two_phase: bool,
    /// When the route was created: the live config carries it.
    pub created: Option<&'a Time>,
}

/// What was proven in this reconcile pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verified {
    /// Version of the probe config whose clusters every Envoy has, ready.
    pub endpoints: Option<String>,
    /// Live version every Envoy serves.
    pub live: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// The spec cannot be served: live stays as it is.
    Reject(RouteError),
    /// Write the probe config: the new clusters together with every live one.
    Stage(ProxyConfigSpec),
    /// Ask every Envoy whether the probe config's clusters are ready.
    VerifyEndpoints { probe_version: String },
    /// Write the live config.
    Promote(ProxyConfigSpec),
    /// Ask every Envoy whether it serves this live version.
    VerifyLive { version: String },
    /// Ready. Remove the probe config (and with it clusters no longer live) after `after`.
    Collect { after: Duration },
    /// Ready, nothing left to do.
    Done,
}

pub fn next_step(observed: &Observed<'_>, verified: &Verified) -> Step {
    let resolved = match observed.resolved {
        Ok(r) => r,
        Err(e) => return Step::Reject(e.clone()),
    };
    let mut live_spec = proxy_config_spec(
        observed.route,
        observed.generation,
        ProxyConfigRole::Live,
        resolved,
        &[],
        observed.created,
    );
    // Every replica holds a deleted Service's endpoints as long as its routes drain.
    live_spec.drain_period = Some(switchyard_core::duration::format(observed.drain_period));
    let is_live = observed
        .live
        .is_some_and(|l| l.version == live_spec.version);
    if is_live {
        // (A live config without the drain period, written before it was carried, gets it
        // with the route's next change: rewritten for it alone, every route would write
        // once after an upgrade, and for ever against a CRD too old to keep the field.)
        if observed.live.is_some_and(|l| {
            l.generation != observed.generation || l.route_created != live_spec.route_created
        }) {
            // Same content under a new generation (or a live config from before it carried
            // the route's age): nothing changes for Envoy's routes.
            return Step::Promote(live_spec);
        }
        if verified.live.as_deref() != Some(live_spec.version.as_str()) {
            return Step::VerifyLive {
                version: live_spec.version,
            };
        }
        if let (Some(probe), Some(live)) = (observed.probe, observed.live) {
            // Only the clusters the live configuration left need the drain period (I4): a
            // probe config holding none (a first generation, a change among the clusters
            // already live) goes at once, with its routes on trial and its endpoint
            // checks, which Envoy would otherwise carry through the drain for nothing.
            let leaving = probe.clusters.iter().any(|c| !live.clusters.contains(c));
            let waited = observed.since_promoted.unwrap_or(Duration::ZERO);
            let after = match leaving {
                true => observed.drain_period.saturating_sub(waited),
                false => Duration::ZERO,
            };
            return Step::Collect { after };
        }
        return Step::Done;
    }
    if !observed.two_phase {
        return Step::Promote(live_spec);
    }
    let mut live_clusters = observed
        .live
        .map(|l| l.clusters.clone())
        .unwrap_or_default();
    live_clusters.extend(still_draining(observed, resolved));
    // Every change is staged, even among clusters already live and warm: its routes go
    // on trial, and only what every Envoy accepted is promoted (I8).
    let probe_spec = proxy_config_spec(
        observed.route,
        observed.generation,
        ProxyConfigRole::Probe,
        resolved,
        &live_clusters,
        observed.created,
    );
    let staged = observed
        .probe
        .is_some_and(|p| p.version == probe_spec.version && p.clusters == probe_spec.clusters);
    if !staged {
        return Step::Stage(probe_spec);
    }
    if verified.endpoints.as_deref() != Some(probe_spec.version.as_str()) {
        return Step::VerifyEndpoints {
            probe_version: probe_spec.version,
        };
    }
    Step::Promote(live_spec)
}

/// The clusters an earlier promotion left that are still in their drain period (I4): the
/// probe config kept them, and a generation staged now replaces that probe config, so it
/// keeps them in turn, as it keeps the live ones. The drain is timed from the last
/// promotion: while promotions come quicker than the drain period, what they left stays
/// until one drain period passes without one. The new clusters of a generation staged and
/// not promoted never went live and are not kept (those it only mirrored to are, for that
/// time at most); nor is a cluster the new generation routes to: a rollback to it proves
/// it ready again, as any new cluster.
fn still_draining(observed: &Observed<'_>, resolved: &ResolvedRoute) -> Vec<ResolvedCluster> {
    let waited = observed.since_promoted.unwrap_or(Duration::ZERO);
    let (Some(probe), Some(live)) = (observed.probe, observed.live) else {
        return Vec::new();
    };
    if waited >= observed.drain_period {
        return Vec::new();
    }
    probe
        .kept_clusters
        .iter()
        .filter(|c| !live.clusters.contains(c) && !resolved.clusters.contains(c))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::proxy_config::{ResolvedCluster, ResolvedVirtualHost};
    use crate::k8s::fixtures::cluster;
    use switchyard_core::route::ResolveError;

    fn resolved(services: &[&str], header: &str) -> Result<ResolvedRoute, RouteError> {
        let virtual_host = ResolvedVirtualHost {
            hosts: vec![format!("web.test/{header}")],
            tls: None,
            rules: vec![],
        };
        Ok(ResolvedRoute {
            listener: None,
            version: crate::hash::digest_of(&(services, header)),
            virtual_host,
            clusters: services.iter().map(|s| cluster(s)).collect(),
        })
    }

    fn observed<'a>(
        resolved: &'a Result<ResolvedRoute, RouteError>,
        live: Option<&'a ProxyConfigSpec>,
        probe: Option<&'a ProxyConfigSpec>,
    ) -> Observed<'a> {
        Observed {
            route: "web",
            generation: 2,
            resolved,
            live,
            probe,
            since_promoted: Some(Duration::from_secs(1)),
            drain_period: Duration::from_secs(10),
            two_phase: true,
            created: None,
        }
    }

    fn spec(
        role: ProxyConfigRole,
        r: &Result<ResolvedRoute, RouteError>,
        generation: i64,
        extra: &[ResolvedCluster],
    ) -> ProxyConfigSpec {
        let mut spec = proxy_config_spec(
            "web",
            generation,
            role,
            r.as_ref().expect("resolved"),
            extra,
            None,
        );
        if role == ProxyConfigRole::Live {
            spec.drain_period = Some("10s".into());
        }
        spec
    }

    /// Runs the steps the way the reconciler does, with every check passing.
    fn walk(
        mut live: Option<ProxyConfigSpec>,
        mut probe: Option<ProxyConfigSpec>,
        r: &Result<ResolvedRoute, RouteError>,
    ) -> Vec<String> {
        let mut verified = Verified::default();
        let mut steps = Vec::new();
        for _ in 0..10 {
            let step = next_step(&observed(r, live.as_ref(), probe.as_ref()), &verified);
            steps.push(match &step {
                Step::Reject(_) => "reject".to_string(),
                Step::Stage(s) => format!(
                    "stage {}",
                    s.clusters
                        .iter()
                        .map(|c| c.service.as_str())
                        .collect::<Vec<_>>()
                        .join("+")
                ),
                Step::VerifyEndpoints { .. } => "verify-endpoints".into(),
                Step::Promote(s) => format!(
                    "promote {}",
                    s.clusters
                        .iter()
                        .map(|c| c.service.as_str())
                        .collect::<Vec<_>>()
                        .join("+")
                ),
                Step::VerifyLive { .. } => "verify-live".into(),
                Step::Collect { .. } => "collect".into(),
                Step::Done => "done".into(),
            });
            match step {
                Step::Stage(s) => probe = Some(s),
                Step::VerifyEndpoints { probe_version } => verified.endpoints = Some(probe_version),
                Step::Promote(s) => live = Some(s),
                Step::VerifyLive { version } => verified.live = Some(version),
                Step::Collect { .. } => probe = None,
                Step::Done | Step::Reject(_) => break,
            }
        }
        steps
    }

    #[test]
    fn a_new_service_is_staged_with_the_live_one_and_verified_before_promotion() {
        let old = resolved(&["blue"], "x");
        let live = spec(ProxyConfigRole::Live, &old, 1, &[]);
        let new = resolved(&["green"], "x");
        assert_eq!(
            walk(Some(live), None, &new),
            [
                "stage blue+green",
                "verify-endpoints",
                "promote green",
                "verify-live",
                "collect",
                "done"
            ]
        );
    }

    #[test]
    fn the_probe_asks_ready_endpoints_of_new_clusters_only() {
        // Whatever happened to blue (its Service deleted, scaled to zero), the switch
        // away from it must not wait for blue to be healthy: it is only kept.
        let old = resolved(&["blue"], "x");
        let live = spec(ProxyConfigRole::Live, &old, 1, &[]);
        let new = resolved(&["blue", "green"], "x");
        let step = next_step(&observed(&new, Some(&live), None), &Verified::default());
        let Step::Stage(probe) = step else {
            panic!("{step:?}")
        };
        let services = |list: &[ResolvedCluster]| -> Vec<String> {
            list.iter().map(|c| c.service.clone()).collect()
        };
        assert_eq!(services(&probe.clusters), ["blue", "green"]);
        assert_eq!(services(&probe.kept_clusters), ["blue"]);
    }

    #[test]
    fn changes_among_live_clusters_are_staged_for_their_routes_trial() {
        let old = resolved(&["blue"], "x");
        let live = spec(ProxyConfigRole::Live, &old, 1, &[]);
        let new = resolved(&["blue"], "y");
        assert_eq!(
            walk(Some(live), None, &new),
            [
                "stage blue",
                "verify-endpoints",
                "promote blue",
                "verify-live",
                "collect",
                "done"
            ]
        );
    }

    #[test]
    fn the_probe_carries_the_routes_to_be_promoted() {
        let new = resolved(&["blue"], "y");
        let probe = spec(ProxyConfigRole::Probe, &new, 2, &[]);
        let live = spec(ProxyConfigRole::Live, &new, 2, &[]);
        assert_eq!(probe.virtual_host, live.virtual_host);
        let other = resolved(&["blue"], "z");
        let mut changed = other.clone().expect("resolved");
        changed.virtual_host.hosts.push("other.example.com".into());
        let other_probe = proxy_config_spec("web", 2, ProxyConfigRole::Probe, &changed, &[], None);
        assert_ne!(
            probe.version, other_probe.version,
            "the routes on trial are part of the probe's version"
        );
    }

    #[test]
    fn the_first_generation_is_staged_too() {
        let new = resolved(&["blue"], "x");
        assert_eq!(
            walk(None, None, &new),
            [
                "stage blue",
                "verify-endpoints",
                "promote blue",
                "verify-live",
                "collect",
                "done"
            ]
        );
    }

    #[test]
    fn nothing_is_promoted_without_verification() {
        let old = resolved(&["blue"], "x");
        let live = spec(ProxyConfigRole::Live, &old, 1, &[]);
        let new = resolved(&["green"], "x");
        let probe = spec(
            ProxyConfigRole::Probe,
            &new,
            2,
            std::slice::from_ref(&live.clusters[0]),
        );
        let step = next_step(
            &observed(&new, Some(&live), Some(&probe)),
            &Verified::default(),
        );
        assert!(matches!(step, Step::VerifyEndpoints { .. }), "{step:?}");
        // Verified for another probe version does not count.
        let stale = Verified {
            endpoints: Some("other".into()),
            live: None,
        };
        let step = next_step(&observed(&new, Some(&live), Some(&probe)), &stale);
        assert!(matches!(step, Step::VerifyEndpoints { .. }), "{step:?}");
    }

    #[test]
    fn a_newer_generation_mid_rollout_restages_from_what_is_live() {
        let old = resolved(&["blue"], "x");
        let live = spec(ProxyConfigRole::Live, &old, 1, &[]);
        let staged = resolved(&["green"], "x");
        let probe = spec(ProxyConfigRole::Probe, &staged, 2, &live.clusters);
        let newer = resolved(&["yellow"], "x");
        let step = next_step(
            &observed(&newer, Some(&live), Some(&probe)),
            &Verified::default(),
        );
        let Step::Stage(s) = step else {
            panic!("{step:?}")
        };
        let services: Vec<_> = s.clusters.iter().map(|c| c.service.as_str()).collect();
        assert_eq!(
            services,
            ["blue", "yellow"],
            "never-live green goes, live blue stays"
        );
    }

    /// The services of the probe config staged for `newer` while green is live, promoted
    /// `ago`, over `probe`.
    fn staged_over(probe: &ProxyConfigSpec, newer: &str, ago: u64) -> Vec<String> {
        let r = resolved(&["green"], "x");
        let live = spec(ProxyConfigRole::Live, &r, 2, &[]);
        let newer = resolved(&[newer], "x");
        let observed = Observed {
            since_promoted: Some(Duration::from_secs(ago)),
            generation: 3,
            ..observed(&newer, Some(&live), Some(probe))
        };
        match next_step(&observed, &Verified::default()) {
            Step::Stage(s) => s.clusters.iter().map(|c| c.service.clone()).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_generation_staged_during_a_drain_keeps_the_draining_clusters() {
        // Green went live over blue 1 s ago: blue drains for 10 s in the probe config.
        let r = resolved(&["green"], "x");
        let draining = spec(ProxyConfigRole::Probe, &r, 2, &[cluster("blue")]);
        assert_eq!(staged_over(&draining, "red", 1), ["blue", "green", "red"]);
        // Once the drain period is over, blue goes with it.
        assert_eq!(staged_over(&draining, "red", 11), ["green", "red"]);
    }

    #[test]
    fn a_rollback_during_the_drain_proves_the_old_cluster_ready_again() {
        let r = resolved(&["green"], "x");
        let draining = spec(ProxyConfigRole::Probe, &r, 2, &[cluster("blue")]);
        let blue = resolved(&["blue"], "x");
        let live = spec(ProxyConfigRole::Live, &r, 2, &[]);
        let observed = Observed {
            generation: 3,
            ..observed(&blue, Some(&live), Some(&draining))
        };
        let Step::Stage(probe) = next_step(&observed, &Verified::default()) else {
            panic!("a rollback is staged")
        };
        let kept: Vec<&str> = probe
            .kept_clusters
            .iter()
            .map(|c| c.service.as_str())
            .collect();
        assert_eq!(
            kept,
            ["green"],
            "blue is asked for ready endpoints, not only kept"
        );
    }

    #[test]
    fn a_draining_cluster_outlasts_a_generation_that_was_never_promoted() {
        // Red was staged keeping green (live) and blue (draining), and not promoted: a
        // newer generation keeps blue until its drain is over, and drops never-live red.
        let red = resolved(&["red"], "x");
        let staged = spec(
            ProxyConfigRole::Probe,
            &red,
            3,
            &[cluster("green"), cluster("blue")],
        );
        assert_eq!(
            staged_over(&staged, "yellow", 5),
            ["blue", "green", "yellow"]
        );
        assert_eq!(staged_over(&staged, "yellow", 10), ["green", "yellow"]);
    }

    #[test]
    fn a_live_config_is_not_rewritten_for_its_drain_period_alone() {
        let r = resolved(&["green"], "x");
        let mut live = spec(ProxyConfigRole::Live, &r, 2, &[]);
        live.drain_period = None;
        let step = next_step(&observed(&r, Some(&live), None), &Verified::default());
        assert!(matches!(step, Step::VerifyLive { .. }), "{step:?}");
        // A change writes it.
        let changed = Observed {
            generation: 3,
            ..observed(&r, Some(&live), None)
        };
        match next_step(&changed, &Verified::default()) {
            Step::Promote(spec) => assert_eq!(spec.drain_period.as_deref(), Some("10s")),
            other => panic!("{other:?}"),
        }
    }

    /// The step once green is live and verified, 1 s after its promotion, with a probe
    /// config that also holds `kept` (the clusters live before).
    fn collection_with(kept: &str) -> Step {
        let r = resolved(&["green"], "x");
        let live = spec(ProxyConfigRole::Live, &r, 2, &[]);
        let probe = spec(ProxyConfigRole::Probe, &r, 2, &[cluster(kept)]);
        let verified = Verified {
            endpoints: None,
            live: Some(live.version.clone()),
        };
        next_step(&observed(&r, Some(&live), Some(&probe)), &verified)
    }

    #[test]
    fn collection_waits_for_the_drain_period() {
        let after = Duration::from_secs(9);
        assert_eq!(collection_with("blue"), Step::Collect { after });
    }

    #[test]
    fn a_probe_config_with_no_cluster_leaving_goes_at_once() {
        // A first generation, or a header change among the clusters already live.
        let after = Duration::ZERO;
        assert_eq!(collection_with("green"), Step::Collect { after });
    }

    #[test]
    fn an_unresolvable_spec_leaves_live_alone() {
        let err: Result<ResolvedRoute, RouteError> =
            Err(RouteError::Resolve(ResolveError::ServiceNotFound {
                service: "gone".into(),
            }));
        let live = spec(ProxyConfigRole::Live, &resolved(&["blue"], "x"), 1, &[]);
        assert!(matches!(
            next_step(&observed(&err, Some(&live), None), &Verified::default()),
            Step::Reject(_)
        ));
    }

    #[test]
    fn one_phase_mode_promotes_directly() {
        let old = resolved(&["blue"], "x");
        let live = spec(ProxyConfigRole::Live, &old, 1, &[]);
        let new = resolved(&["green"], "x");
        let mut o = observed(&new, Some(&live), None);
        o.two_phase = false;
        assert!(matches!(
            next_step(&o, &Verified::default()),
            Step::Promote(_)
        ));
    }
}
