//! One reconcile pass: the steps of [`crate::rollout::shift::next_step`] performed, until the route
//! is Ready, waits on the fleet, or is refused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::admission::admit;
use super::report::{ConditionType, Report};
use super::resolve::{ResolvedRoute, resolve_route};
use super::verify::{Verification, verify};
use super::{Context, ENVOY_REJECTED};
use crate::api::ProxyConfigSpec;
use crate::api::{ProxyConfig, TrafficRoute};
use crate::duration;
use crate::k8s::to_model::endpoint_probe_id;
use crate::metrics::StepLabel;
use crate::model::trial_id;
use crate::prober::FleetResult;
use crate::rollout::clock::RolloutStep;
use crate::rollout::proxy_configs::Error;
use crate::rollout::shift::{Observed, Step, Verified, next_step};
use crate::rollout::{
    DEFAULT_DRAIN, Owner, RouteError, UnitRef, live_name, probe_name, promoted_ago, promotion_time,
};
use crate::translate::is_refusal;

/// Steps one pass takes at most before it hands over to the next (a pass normally ends
/// sooner: Ready, waiting on the fleet, or refused).
const MAX_STEPS: usize = 8;

pub(super) async fn reconcile(
    route: Arc<TrafficRoute>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let mut pass = Pass::read(&ctx, &route).await?;
    for _ in 0..MAX_STEPS {
        let step = next_step(&pass.observed(), &pass.verified);
        let next = match step {
            Step::Reject(error) => pass.reject(error).await,
            Step::Stage(spec) => pass.stage(spec).await?,
            Step::VerifyEndpoints { probe_version } => pass.verify_endpoints(probe_version).await,
            Step::Promote(spec) => pass.promote(spec).await?,
            Step::VerifyLive { version } => pass.verify_live(version).await,
            Step::Collect { after } => pass.collect(after).await?,
            Step::Done => pass.done().await,
        };
        if let Next::End(action) = next {
            return Ok(action);
        }
    }
    publish(&ctx, &route, &pass.report, None).await;
    Ok(Action::requeue(Duration::from_millis(20)))
}

/// After a step: take the next one, or end the pass with this action.
enum Next {
    Step,
    End(Action),
}

/// One pass over one route: what it read, what it proved, and the status it builds.
struct Pass<'a> {
    ctx: &'a Context,
    route: &'a TrafficRoute,
    namespace: String,
    name: String,
    generation: i64,
    resolved: Result<ResolvedRoute, RouteError>,
    live: Option<ProxyConfig>,
    probe: Option<ProxyConfig>,
    drain: Duration,
    verified: Verified,
    report: Report,
    /// When this pass began: a generation's first write is timed from it.
    began: Instant,
}

impl<'a> Pass<'a> {
    /// Resolves and admits the route, and reads its two ProxyConfigs.
    async fn read(ctx: &'a Context, route: &'a TrafficRoute) -> Result<Self, Error> {
        let began = Instant::now();
        let namespace = route.namespace().unwrap_or_default();
        let name = route.name_any();
        let generation = route.metadata.generation.unwrap_or(0);
        debug!(route = %format!("{namespace}/{name}"), generation, "reconcile");
        let services = ctx.services_of(route);
        let named: Vec<&Service> = services.iter().map(Arc::as_ref).collect();
        let resolved = resolve_route(route, &named).and_then(|r| admit(ctx, route, r));
        let (live_pc, probe_pc) = (live_name(&name), probe_name(&name));
        let (live, probe) = tokio::join!(
            ctx.proxy_configs.read(&namespace, &live_pc),
            ctx.proxy_configs.read(&namespace, &probe_pc)
        );
        let drain = route
            .spec
            .rollout
            .as_ref()
            .and_then(|r| r.drain_period.as_deref())
            .and_then(|d| duration::parse(d).ok())
            .unwrap_or(DEFAULT_DRAIN);
        Ok(Self {
            ctx,
            route,
            live: live?,
            probe: probe?,
            namespace,
            name,
            generation,
            resolved,
            drain,
            verified: Verified::default(),
            report: Report::new(route, generation),
            began,
        })
    }

    fn observed(&self) -> Observed<'_> {
        Observed {
            route: &self.name,
            generation: self.generation,
            resolved: &self.resolved,
            live: self.live.as_ref().map(|p| &p.spec),
            probe: self.probe.as_ref().map(|p| &p.spec),
            since_promoted: self.live.as_ref().and_then(promoted_ago),
            drain_period: self.drain,
            two_phase: self.ctx.settings.two_phase,
            created: self.route.metadata.creation_timestamp.as_ref(),
        }
    }

    /// `step` done: its time into the step histogram.
    fn clocked(&self, step: RolloutStep) {
        let route = format!("{}/{}", self.namespace, self.name);
        let took = self
            .ctx
            .clock
            .step(&route, self.generation, step, self.began);
        let Some(took) = took else {
            return;
        };
        let label = StepLabel { step: step.label() };
        let metrics = &self.ctx.settings.metrics;
        metrics
            .rollout_step_seconds
            .get_or_create(&label)
            .observe(took.as_secs_f64());
        let ms = took.as_secs_f64() * 1000.0;
        debug!(%route, generation = self.generation, step = label.step, ms, "rollout step");
    }

    async fn reject(&mut self, error: RouteError) -> Next {
        self.ctx
            .clock
            .stop(&format!("{}/{}", self.namespace, self.name));
        self.report.rejected(&error, self.live.as_ref());
        let event = Some((error.reason(), error.to_string()));
        publish(self.ctx, self.route, &self.report, event).await;
        Next::End(Action::requeue(Duration::from_secs(300)))
    }

    async fn stage(&mut self, spec: ProxyConfigSpec) -> Result<Next, Error> {
        let probe_name = probe_name(&self.name);
        let current = self.probe.as_ref();
        match self.apply(&probe_name, spec, None, current).await {
            Ok(pc) => self.probe = Some(pc),
            Err(error) => return self.refused(error).await,
        }
        self.clocked(RolloutStep::Staged);
        self.report
            .phase("Staging", "staging new clusters on every Envoy");
        Ok(Next::Step)
    }

    async fn verify_endpoints(&mut self, probe_version: String) -> Next {
        let (namespace, name) = (&self.namespace, &self.name);
        let id = endpoint_probe_id(namespace, name, &probe_version);
        let trial = trial_id(&format!("{namespace}/{name}"));
        let prober = &self.ctx.settings.prober;
        let check = |envoys: Vec<String>| {
            let (id, trial, version) = (&id, &trial, &probe_version);
            async move { prober.check_staged(&envoys, id, trial, version).await }
        };
        let (result, after) = match verify(self.ctx, self.route, check).await {
            Verification::Passed(_) => {
                self.clocked(RolloutStep::EndpointsVerified);
                self.verified.endpoints = Some(probe_version);
                return Next::Step;
            }
            Verification::Waiting(result, after) => (result, after),
            Verification::Superseded => return Next::End(Action::requeue(Duration::ZERO)),
        };
        let waiting = (
            "VerifyingEndpoints",
            "new clusters not ready, or routes on trial not accepted, on every Envoy",
        );
        let (ctx, route) = (self.ctx, self.route);
        Next::End(requeue_waiting(ctx, route, &mut self.report, waiting, &result, after).await)
    }

    async fn promote(&mut self, spec: ProxyConfigSpec) -> Result<Next, Error> {
        let live = self.live.as_ref();
        let first = live.is_none_or(|l| l.spec.version != spec.version);
        let promoted_at = promotion_time(live, &spec.version);
        let live_name = live_name(&self.name);
        match self.apply(&live_name, spec, promoted_at, live).await {
            Ok(pc) => self.live = Some(pc),
            Err(error) => return self.refused(error).await,
        }
        self.clocked(RolloutStep::Promoted);
        self.report
            .phase("VerifyingLive", "new routes sent to every Envoy");
        if first {
            let route = format!("{}/{}", self.namespace, self.name);
            info!(%route, generation = self.generation, "promoted");
        }
        Ok(Next::Step)
    }

    async fn verify_live(&mut self, version: String) -> Next {
        let id = format!("{}/{}", self.namespace, self.name);
        let prober = &self.ctx.settings.prober;
        let check = |envoys: Vec<String>| {
            let (id, version) = (&id, &version);
            async move { prober.check_version(&envoys, id, version).await }
        };
        let (result, after) = match verify(self.ctx, self.route, check).await {
            Verification::Passed(result) => {
                self.clocked(RolloutStep::LiveVerified);
                self.report.ready(self.live.as_ref(), &result);
                self.verified.live = Some(version);
                return Next::Step;
            }
            Verification::Waiting(result, after) => (result, after),
            Verification::Superseded => return Next::End(Action::requeue(Duration::ZERO)),
        };
        let waiting = ("VerifyingLive", "new routes not served by every Envoy yet");
        let (ctx, route) = (self.ctx, self.route);
        Next::End(requeue_waiting(ctx, route, &mut self.report, waiting, &result, after).await)
    }

    /// Removes the probe config once the drain period is over (I4); until then, Ready.
    async fn collect(&mut self, after: Duration) -> Result<Next, Error> {
        if !after.is_zero() {
            self.report.draining();
            return Ok(self.ready(after).await);
        }
        let probe_name = probe_name(&self.name);
        let current = self.probe.as_ref();
        (self.ctx.proxy_configs)
            .delete(&self.namespace, &probe_name, current)
            .await?;
        self.probe = None;
        Ok(Next::Step)
    }

    async fn done(&mut self) -> Next {
        self.ctx
            .clock
            .stop(&format!("{}/{}", self.namespace, self.name));
        self.report.done();
        self.ready(Duration::from_secs(300)).await
    }

    /// Publishes Ready (with what the route's TLS Secret says) and ends the pass.
    async fn ready(&mut self, after: Duration) -> Next {
        self.report.secrets(&self.ctx.secret_troubles(self.route));
        let event = Some(("Ready", "served by every Envoy".into()));
        publish(self.ctx, self.route, &self.report, event).await;
        Next::End(Action::requeue(after))
    }

    /// Applies one of the route's ProxyConfigs, owned by the route, conditional on
    /// `current` (the object as this pass read or wrote it).
    async fn apply(
        &self,
        name: &str,
        spec: ProxyConfigSpec,
        promoted_at: Option<String>,
        current: Option<&ProxyConfig>,
    ) -> Result<ProxyConfig, Error> {
        let unit = UnitRef {
            namespace: &self.namespace,
            name: &self.name,
            owner: Owner {
                reference: self.route.controller_owner_ref(&()),
                labels: Default::default(),
            },
        };
        (self.ctx.proxy_configs)
            .apply(&unit, name, spec, promoted_at, current)
            .await
    }

    /// A write that failed: refused for good (the route says so), or an error to retry.
    async fn refused(&mut self, error: Error) -> Result<Next, Error> {
        let (ctx, route, live) = (self.ctx, self.route, self.live.as_ref());
        refuse(ctx, route, &mut self.report, live, error)
            .await
            .map(Next::End)
    }
}

/// A ProxyConfig write the API server refuses as invalid fails the same way every time:
/// the route is told (status, Event) and asked again only after a while or a change,
/// instead of retried every few seconds without a word. Any other error is retried.
pub(super) async fn refuse(
    ctx: &Context,
    route: &TrafficRoute,
    report: &mut Report,
    live: Option<&ProxyConfig>,
    error: Error,
) -> Result<Action, Error> {
    let Some((name, message)) = error.refusal() else {
        return Err(error);
    };
    let refused = RouteError::WriteRefused {
        name: name.to_owned(),
        message: message.to_owned(),
    };
    warn!(route = %route.name_any(), %refused, "cannot write the route's ProxyConfig");
    report.rejected(&refused, live);
    publish(
        ctx,
        route,
        report,
        Some((refused.reason(), refused.to_string())),
    )
    .await;
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// A verification that is not done yet: says why in the status and asks to be reconciled
/// again after `after`.
pub(super) async fn requeue_waiting(
    ctx: &Context,
    route: &TrafficRoute,
    report: &mut Report,
    (phase, message): (&str, &str),
    result: &FleetResult,
    after: Duration,
) -> Action {
    report.waiting(phase, message, result);
    let key = (route.namespace().unwrap_or_default(), route.name_any());
    let troubles = ctx.troubles(&key);
    report.explain(&troubles);
    // An Envoy's NACK is told once, when it becomes the reason the rollout waits.
    let event = (report.ready.reason == ENVOY_REJECTED)
        .then(|| (ENVOY_REJECTED, report.ready.message.clone()));
    publish(ctx, route, report, event).await;
    // Routes on trial that Envoy refused wait for their own change, which reconciles them:
    // the fleet converging brings them nothing, and hundreds of them probing on every
    // convergence would slow everyone else's rollouts.
    let after = if troubles.iter().any(|t| is_refusal(t)) {
        ctx.progressed(&key);
        Duration::from_secs(300)
    } else {
        after
    };
    debug!(route = %key.1, generation = report.generation, ?after, "requeued");
    Action::requeue(after)
}

/// Hands the status to the writer; records an Event when Ready flips, the spec is rejected
/// (under the rejection's reason) or an Envoy rejects the configuration.
pub(super) async fn publish(
    ctx: &Context,
    route: &TrafficRoute,
    report: &Report,
    event: Option<(&str, String)>,
) {
    let status = report.build();
    let was_ready = report.previous.iter().any(|c| {
        c.type_ == ConditionType::Ready.as_str()
            && c.status == "True"
            && c.observed_generation == Some(report.generation)
    });
    let is_ready = report.ready.ok;
    ctx.status.set(
        &route.namespace().unwrap_or_default(),
        &route.name_any(),
        status,
        route.status.as_ref(),
    );
    let Some((reason, note)) = event else {
        return;
    };
    let reason_changed = !report.previous.iter().any(|c| {
        c.type_ == ConditionType::Ready.as_str()
            && c.reason == report.ready.reason
            && c.observed_generation == Some(report.generation)
    });
    if is_ready && was_ready && !reason_changed {
        return;
    }
    if report.ready.reason == ENVOY_REJECTED && !reason_changed {
        return;
    }
    let rejected_before = report.previous.iter().any(|c| {
        c.type_ == ConditionType::Accepted.as_str()
            && c.status == "False"
            && c.observed_generation == Some(report.generation)
    });
    if !is_ready && rejected_before {
        return;
    }
    // A TLS Secret that went missing or bad is told under its own reason (Warning).
    let secret = matches!(
        report.ready.reason.as_str(),
        "SecretNotFound" | "InvalidSecret"
    );
    let (reason, note) = if secret {
        (report.ready.reason.as_str(), report.ready.message.clone())
    } else {
        (reason, note)
    };
    let event = Event {
        type_: if is_ready && !secret {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason: reason.into(),
        note: Some(note),
        action: "Rollout".into(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &route.object_ref(&())).await {
        warn!(%error, "cannot record an event");
    }
}
