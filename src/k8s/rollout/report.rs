//! The status a pass builds: phase, Envoy progress, and the three conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::{Context, ENVOY_REJECTED, ROUTE_CONFIGURATION};
use crate::api::TrafficRouteStatus;
use crate::api::traffic_route::EnvoyProgress;
use crate::api::{ProxyConfig, TrafficRoute};
use crate::k8s::resolve::RouteError;
use crate::k8s::status::condition;
use crate::k8s::tls_secrets::{SecretTrouble, secret_troubles};
use crate::prober::FleetResult;
use crate::translate::EVERY_ROUTE;

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

    /// Why a rollout may be stuck: what the snapshot builder left out of this route (its
    /// routes on trial among it, when an Envoy rejected them), and Envoys (connected here)
    /// that rejected other configuration. A rejected route configuration is the builder's
    /// to blame on one route; told here, it would be every route's.
    pub(super) fn troubles(&self, key: &(String, String)) -> Vec<String> {
        let id = format!("{}/{}", key.0, key.1);
        let mut out: Vec<String> = self
            .settings
            .problems
            .borrow()
            .iter()
            .filter(|p| p.virtual_host == id || p.virtual_host == EVERY_ROUTE)
            .map(|p| {
                if p.message.starts_with("Envoy ") {
                    p.message.clone()
                } else {
                    format!("left out: {}", p.message)
                }
            })
            .collect();
        for nack in self.settings.envoys.blocking_nacks() {
            if nack.kind != ROUTE_CONFIGURATION {
                out.push(format!(
                    "Envoy {} rejected {}: {}",
                    nack.node, nack.kind, nack.error
                ));
            }
        }
        out
    }
}

/// The status being built during one reconcile.
pub(super) struct Report {
    pub(super) previous: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    pub(super) generation: i64,
    pub(super) status: TrafficRouteStatus,
    pub(super) accepted: (bool, String, String),
    pub(super) ready: (bool, String, String),
    pub(super) progressing: (bool, String, String),
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
            accepted: (true, "Accepted".into(), "spec resolved".into()),
            ready: (false, "Progressing".into(), "rolling out".into()),
            progressing: (true, "Progressing".into(), "rolling out".into()),
        }
    }

    pub(super) fn phase(&mut self, phase: &str, message: &str) {
        self.status.phase = Some(phase.into());
        self.ready = (false, phase.into(), message.into());
        self.progressing = (true, phase.into(), message.into());
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

    /// Adds reasons a rollout is stuck; an Envoy's NACK becomes the condition's reason.
    pub(super) fn explain(&mut self, troubles: &[String]) {
        if troubles.is_empty() {
            return;
        }
        // Envoy's own words come first: they say what to fix.
        let detail = if troubles.iter().any(|t| t.starts_with("Envoy ")) {
            self.ready.1 = ENVOY_REJECTED.into();
            format!("{}; {}", troubles.join("; "), self.ready.2)
        } else {
            format!("{}; {}", self.ready.2, troubles.join("; "))
        };
        self.ready.2 = detail.clone();
        self.progressing.2 = detail;
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
        self.accepted = (false, reason.into(), message.clone());
        self.ready = (false, reason.into(), message.clone());
        self.progressing = (false, reason.into(), message);
    }

    pub(super) fn ready(&mut self, live: Option<&ProxyConfig>, result: &FleetResult) {
        self.status.live_generation = live.map(|l| l.spec.generation);
        self.status.envoys = Some(progress(result, Vec::new()));
        let message = format!(
            "served by every Envoy ({}/{})",
            result.ready.len(),
            result.total()
        );
        self.ready = (true, "Ready".into(), message);
        self.progressing = (true, "Draining".into(), "old clusters drain".into());
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
        let served = self.ready.0 && troubles.iter().all(|t| t.kept);
        self.ready = (
            served,
            reason.into(),
            format!("{}; {}", self.ready.2, messages.join("; ")),
        );
    }

    pub(super) fn done(&mut self) {
        self.status.phase = Some("Ready".into());
        if !self.ready.0 {
            self.ready = (true, "Ready".into(), "served by every Envoy".into());
        }
        self.progressing = (false, "Ready".into(), "rollout complete".into());
    }

    pub(super) fn build(&self) -> TrafficRouteStatus {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut status = self.status.clone();
        let make = |type_: &str, (ok, reason, message): &(bool, String, String)| {
            condition(
                &self.previous,
                type_,
                *ok,
                reason,
                message,
                self.generation,
                &now,
            )
        };
        status.conditions = vec![
            make("Accepted", &self.accepted),
            make("Ready", &self.ready),
            make("Progressing", &self.progressing),
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
