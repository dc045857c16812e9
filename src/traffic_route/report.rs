//! The status a pass builds: phase, Envoy progress, and the three conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use std::time::Duration;

use super::deadline::PROBE_DEADLINE_EXCEEDED;
use super::{Context, ENVOY_REJECTED, ROUTE_CONFIGURATION};
use crate::api::TrafficRouteStatus;
use crate::api::traffic_route::EnvoyProgress;
use crate::api::{ProxyConfig, TrafficRoute};
use crate::k8s::status::condition;
use crate::k8s::tls_secrets::{SecretTrouble, secret_troubles};
use crate::prober::FleetResult;
use crate::rollout::RouteError;
use crate::translate::{Cause, Problem, Subject};

impl Context {
    /// What this replica's snapshot builder says of the route's TLS Secret.
    pub(super) fn secret_troubles(&self, route: &TrafficRoute) -> Vec<SecretTrouble> {
        let id = format!(
            "{}/{}",
            route.namespace().unwrap_or_default(),
            route.name_any()
        );
        secret_troubles(&self.settings.problems.borrow(), &id)
    }

    /// Why a rollout may be stuck: what this replica's snapshot builder left out of this
    /// route, and what the whole fleet's Envoys said ([`FleetView`]: its routes on trial
    /// they refused, and NACKs of other configuration, whichever replica they are
    /// connected to). A rejected route configuration is the builders' to blame on one
    /// route; told here, it would be every route's.
    pub(super) fn troubles(&self, key: &(String, String)) -> Vec<Trouble> {
        let id = format!("{}/{}", key.0, key.1);
        let concerns = |p: &Problem| {
            p.subject().route() == Some(id.as_str()) || p.subject() == &Subject::EveryRoute
        };
        let fleet = self.settings.fleet.borrow();
        // What an Envoy said comes from the fleet's view, which holds this replica's too.
        let mut out: Vec<Trouble> = self
            .settings
            .problems
            .borrow()
            .iter()
            .filter(|p| concerns(p) && !p.from_an_envoy())
            .map(Trouble::of)
            .collect();
        out.extend(
            fleet
                .left_out
                .iter()
                .filter(|p| concerns(p))
                .map(Trouble::of),
        );
        for nack in &fleet.rejections {
            if nack.kind != ROUTE_CONFIGURATION {
                out.push(Trouble {
                    message: format!("Envoy {} rejected {}: {}", nack.node, nack.kind, nack.error),
                    in_envoys_words: true,
                    refused: false,
                });
            }
        }
        out
    }
}

/// A reason a rollout may be stuck, as its status tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Trouble {
    pub(super) message: String,
    /// An Envoy's own words (a NACK, a refusal): they say what to fix, and make the Ready
    /// reason.
    pub(super) in_envoys_words: bool,
    /// An Envoy refused the route's routes on trial: only the route's own change helps.
    pub(super) refused: bool,
}

impl Trouble {
    fn of(problem: &Problem) -> Trouble {
        let in_envoys_words = problem.in_envoys_words();
        Trouble {
            // Envoy's own words stand as they are.
            message: if in_envoys_words {
                problem.message().to_owned()
            } else {
                format!("left out: {}", problem.message())
            },
            in_envoys_words,
            refused: problem.cause() == Cause::Refused,
        }
    }
}

/// The conditions of a TrafficRoute's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ConditionType {
    /// The spec resolved and was admitted.
    Accepted,
    /// Every Envoy serves the current generation.
    Ready,
    /// A rollout is under way.
    Progressing,
}

impl ConditionType {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "Accepted",
            Self::Ready => "Ready",
            Self::Progressing => "Progressing",
        }
    }
}

/// One condition as a pass builds it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Condition {
    pub(super) ok: bool,
    pub(super) reason: String,
    pub(super) message: String,
}

impl Condition {
    fn new(ok: bool, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            ok,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// The status being built during one reconcile.
pub(super) struct Report {
    pub(super) previous: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    pub(super) generation: i64,
    pub(super) status: TrafficRouteStatus,
    pub(super) accepted: Condition,
    pub(super) ready: Condition,
    pub(super) progressing: Condition,
}

impl Report {
    pub(super) fn new(route: &TrafficRoute, generation: i64) -> Self {
        let previous = route
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let status = TrafficRouteStatus {
            observed_generation: Some(generation),
            live_generation: route.status.as_ref().and_then(|s| s.live_generation),
            ..TrafficRouteStatus::default()
        };
        Self {
            previous,
            generation,
            status,
            accepted: Condition::new(true, "Accepted", "spec resolved"),
            ready: Condition::new(false, "Progressing", "rolling out"),
            progressing: Condition::new(true, "Progressing", "rolling out"),
        }
    }

    pub(super) fn phase(&mut self, phase: &str, message: &str) {
        self.status.phase = Some(phase.into());
        self.ready = Condition::new(false, phase, message);
        self.progressing = Condition::new(true, phase, message);
    }

    pub(super) fn waiting(&mut self, phase: &str, message: &str, result: &FleetResult) {
        let lagging: Vec<String> = result
            .lagging
            .iter()
            .take(10)
            .map(|(envoy, why)| format!("{envoy}: {why}"))
            .collect();
        let detail = format!(
            "{message}: Envoys ready {}/{}; waiting for {}",
            result.ready.len(),
            result.total(),
            lagging.join(", ")
        );
        self.phase(phase, &detail);
        self.status.envoys = Some(progress(result, lagging));
    }

    /// The generation waited longer than its `probeDeadline`: Ready says so (the rollout
    /// goes on; Progressing stays as it was).
    pub(super) fn deadline_exceeded(&mut self, deadline: Duration, waited: Duration) {
        self.ready.reason = PROBE_DEADLINE_EXCEEDED.into();
        self.ready.message = format!(
            "not proven on every Envoy within the probe deadline ({deadline:?}; waited {}s, \
             still trying): {}",
            waited.as_secs(),
            self.ready.message
        );
    }

    /// Adds reasons a rollout is stuck; an Envoy's NACK becomes the condition's reason.
    pub(super) fn explain(&mut self, troubles: &[Trouble]) {
        if troubles.is_empty() {
            return;
        }
        let told: Vec<&str> = troubles.iter().map(|t| t.message.as_str()).collect();
        let told = told.join("; ");
        // Envoy's own words come first: they say what to fix.
        let detail = if troubles.iter().any(|t| t.in_envoys_words) {
            self.ready.reason = ENVOY_REJECTED.into();
            format!("{told}; {}", self.ready.message)
        } else {
            format!("{}; {told}", self.ready.message)
        };
        self.ready.message = detail.clone();
        self.progressing.message = detail;
    }

    pub(super) fn rejected(&mut self, error: &RouteError, live: Option<&ProxyConfig>) {
        let reason = error.reason();
        let mut message = error.to_string();
        if let Some(live) = live {
            message.push_str(&format!(
                "; generation {} keeps serving",
                live.spec.generation
            ));
        }
        self.status.phase = Some("Rejected".into());
        self.accepted = Condition::new(false, reason, message.clone());
        self.ready = Condition::new(false, reason, message.clone());
        self.progressing = Condition::new(false, reason, message);
    }

    pub(super) fn ready(&mut self, live: Option<&ProxyConfig>, result: &FleetResult) {
        self.status.live_generation = live.map(|l| l.spec.generation);
        self.status.envoys = Some(progress(result, Vec::new()));
        let message = format!(
            "served by every Envoy ({}/{})",
            result.ready.len(),
            result.total()
        );
        self.ready = Condition::new(true, "Ready", message);
        self.progressing = Condition::new(true, "Draining", "old clusters drain");
        self.status.phase = Some("Draining".into());
    }

    pub(super) fn draining(&mut self) {
        self.status.phase = Some("Draining".into());
    }

    /// A route whose TLS Secret is missing or cannot serve: still Ready while its last good
    /// certificate serves, with the reason and the Secret named; not Ready when it is left
    /// out.
    pub(super) fn secrets(&mut self, troubles: &[SecretTrouble]) {
        if troubles.is_empty() {
            return;
        }
        let reason = if troubles.iter().any(|t| t.missing) {
            "SecretNotFound"
        } else {
            "InvalidSecret"
        };
        let messages: Vec<&str> = troubles.iter().map(|t| t.message.as_str()).collect();
        let served = self.ready.ok && troubles.iter().all(|t| t.kept);
        let message = format!("{}; {}", self.ready.message, messages.join("; "));
        self.ready = Condition::new(served, reason, message);
    }

    pub(super) fn done(&mut self) {
        self.status.phase = Some("Ready".into());
        if !self.ready.ok {
            self.ready = Condition::new(true, "Ready", "served by every Envoy");
        }
        self.progressing = Condition::new(false, "Ready", "rollout complete");
    }

    pub(super) fn build(&self) -> TrafficRouteStatus {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut status = self.status.clone();
        let make = |type_: ConditionType, c: &Condition| {
            condition(
                &self.previous,
                type_.as_str(),
                c.ok,
                &c.reason,
                &c.message,
                self.generation,
                &now,
            )
        };
        status.conditions = vec![
            make(ConditionType::Accepted, &self.accepted),
            make(ConditionType::Ready, &self.ready),
            make(ConditionType::Progressing, &self.progressing),
        ];
        status
    }
}

pub(super) fn progress(result: &FleetResult, lagging: Vec<String>) -> EnvoyProgress {
    EnvoyProgress {
        ready: i32::try_from(result.ready.len()).unwrap_or(i32::MAX),
        total: i32::try_from(result.total()).unwrap_or(i32::MAX),
        lagging,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envoy_nack_becomes_the_reason_a_rollout_waits() {
        let route = TrafficRoute::new("web", Default::default());
        let mut report = Report::new(&route, 2);
        let result = FleetResult {
            ready: vec!["10.0.0.1".into()],
            lagging: vec![("10.0.0.2".into(), "serves version \"old\"".into())],
        };
        report.waiting(
            "VerifyingLive",
            "new routes not served by every Envoy yet",
            &result,
        );
        report.explain(&[Trouble {
            message: "Envoy envoy-b rejected RouteConfiguration: bad route".into(),
            in_envoys_words: true,
            refused: false,
        }]);
        let status = report.build();
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .expect("Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "EnvoyRejected")
        );
        assert!(
            ready.message.contains("Envoys ready 1/2"),
            "{}",
            ready.message
        );
        assert!(
            ready
                .message
                .contains("envoy-b rejected RouteConfiguration: bad route"),
            "{}",
            ready.message
        );
        assert_eq!(status.envoys.map(|e| (e.ready, e.total)), Some((1, 2)));
    }
}
