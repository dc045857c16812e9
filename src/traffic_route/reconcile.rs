//! One reconcile pass of a TrafficRoute: the route resolved and admitted, then moved by
//! the rollout engine ([`advance`]) as far as it goes now; what the engine ends with
//! becomes the route's status, an Event, and when to come back.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::admission::{admit, service_keys};
use super::deadline::{PROBE_DEADLINE_EXCEEDED, Verdict, probe_deadline};
use super::report::{ConditionType, Report};
use super::resolve::resolve_route;
use super::told::Tale;
use super::verify::verify;
use super::{Context, ENVOY_REJECTED};
use crate::api::{TrafficRoute, TrafficRouteStatus};
use crate::duration;
use crate::k8s::built_from::Awaited;
use crate::k8s::events::{Event, EventType};
use crate::k8s::status::StatusUpdate;
use crate::k8s::to_model::endpoint_probe_id;
use crate::metrics::StepLabel;
use crate::model::trial_id;
use crate::prober::FleetResult;
use crate::rollout::clock::RolloutStep;
use crate::rollout::executor::{Done, End, Front, Held, Phase, Unit, Verification, advance};
use crate::rollout::lagging::{ENVOYS_LAGGING, event_note};
use crate::rollout::proxy_configs::Error;
use crate::rollout::{DEFAULT_DRAIN, Owner, RouteError, UnitRef, live_name, probe_name};

pub(super) async fn reconcile(
    route: Arc<TrafficRoute>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let began = Instant::now();
    let namespace = route.namespace().unwrap_or_default();
    let name = route.name_any();
    let generation = route.metadata.generation.unwrap_or(0);
    debug!(route = %format!("{namespace}/{name}"), generation, "reconcile");
    let services = ctx.services_of(&route);
    let named: Vec<&Service> = services.iter().map(Arc::as_ref).collect();
    let resolved = resolve_route(&route, &named).and_then(|r| admit(&ctx, &route, r));
    let unit = Unit {
        unit: UnitRef {
            namespace: &namespace,
            name: &name,
            owner: Owner {
                reference: route.controller_owner_ref(&()),
                labels: Default::default(),
            },
        },
        generation,
        resolved: &resolved,
        drain_period: drain_period(&route),
        two_phase: ctx.settings.two_phase,
        created: route.metadata.creation_timestamp.as_ref(),
    };
    let mut held = Held::read(&ctx.proxy_configs, &unit.unit).await?;
    let mut pass = Pass {
        ctx: &ctx,
        route: &route,
        key: format!("{namespace}/{name}"),
        generation,
        report: Report::new(&route, generation),
        began,
    };
    let end = advance(&ctx.proxy_configs, &unit, &mut held, &mut pass).await;
    let (ctx, route, live) = (&*ctx, &*route, held.live.as_ref());
    let mut report = pass.report;
    let action = match end? {
        End::Rejected(error) => {
            ctx.clock.stop(&pass.key);
            ctx.deadlines.done(&(namespace.clone(), name.clone()));
            ctx.lagging.done(&(namespace.clone(), name.clone()));
            report.rejected(&error, live);
            let event = Some((error.reason(), error.to_string()));
            publish(ctx, route, &report, event).await;
            Action::requeue(Duration::from_secs(300))
        }
        End::Refused(refused) => refuse(ctx, route, &mut report, live, refused).await,
        End::Waiting {
            phase,
            result,
            after,
            ..
        } => requeue_waiting(ctx, route, &mut report, waiting(phase), &result, after).await,
        End::Superseded => Action::requeue(Duration::ZERO),
        End::Draining { after } => {
            report.draining();
            ready(ctx, route, &mut report, after).await
        }
        End::Served => {
            ctx.clock.stop(&pass.key);
            ctx.deadlines.done(&(namespace.clone(), name.clone()));
            ctx.lagging.done(&(namespace.clone(), name.clone()));
            report.done();
            ready(ctx, route, &mut report, Duration::from_secs(300)).await
        }
        End::MoreSteps => {
            publish(ctx, route, &report, None).await;
            Action::requeue(Duration::from_millis(20))
        }
    };
    Ok(action)
}

/// The route's drain period, or the default.
fn drain_period(route: &TrafficRoute) -> Duration {
    route
        .spec
        .rollout
        .as_ref()
        .and_then(|r| r.drain_period.as_deref())
        .and_then(|d| duration::parse(d).ok())
        .unwrap_or(DEFAULT_DRAIN)
}

/// The Ready phase and message while the route waits on `phase`.
fn waiting(phase: Phase) -> (&'static str, &'static str) {
    match phase {
        Phase::VerifyingEndpoints => (
            "VerifyingEndpoints",
            "new clusters not ready, or routes on trial not accepted, on every Envoy",
        ),
        Phase::VerifyingLive => ("VerifyingLive", "new routes not served by every Envoy yet"),
    }
}

/// One pass over one route, as the engine's [`Front`]: how it asks the fleet, and the
/// status it builds as the steps are done.
struct Pass<'a> {
    ctx: &'a Context,
    route: &'a TrafficRoute,
    /// "namespace/name".
    key: String,
    generation: i64,
    report: Report,
    /// When this pass began: a generation's first write is timed from it.
    began: Instant,
}

impl Pass<'_> {
    /// The route as the rollout's maps know it: (namespace, name).
    fn unit_key(&self) -> (String, String) {
        (
            self.route.namespace().unwrap_or_default(),
            self.route.name_any(),
        )
    }

    /// What a verification waits for the Envoys to hold: the route's `config` at
    /// `version`, with (for the endpoint check) the endpoints of the Services it names.
    fn awaited(&self, config: String, version: &str, with_endpoints: bool) -> Awaited {
        let services = match with_endpoints {
            true => service_keys(self.route),
            false => Vec::new(),
        };
        Awaited {
            config: (self.route.namespace().unwrap_or_default(), config),
            version: version.to_owned(),
            services,
        }
    }

    /// `step` done: its time into the step histogram.
    fn clocked(&self, step: RolloutStep) {
        let took = self
            .ctx
            .clock
            .step(&self.key, self.generation, step, self.began);
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
        debug!(route = %self.key, generation = self.generation, step = label.step, ms, "rollout step");
    }
}

impl Front for Pass<'_> {
    async fn verify_endpoints(&mut self, probe_version: &str) -> Verification {
        let (namespace, name) = (self.route.namespace(), self.route.name_any());
        let id = endpoint_probe_id(&namespace.unwrap_or_default(), &name, probe_version);
        let trial = trial_id(&self.key);
        let prober = &self.ctx.settings.prober;
        let check = |envoys: Vec<String>| {
            let (id, trial) = (&id, &trial);
            async move { prober.check_staged(&envoys, id, trial, probe_version).await }
        };
        let awaited = self.awaited(probe_name(&self.route.name_any()), probe_version, true);
        verify(self.ctx, self.route, &awaited, check).await
    }

    async fn verify_live(&mut self, version: &str) -> Verification {
        let unit = self.unit_key();
        if let Some(seen) = (self.ctx.served).seen(&unit, version, &self.ctx.envoys()) {
            debug!(route = %self.key, version, "live version seen served already");
            self.ctx.progressed(&unit);
            return Verification::Passed(seen);
        }
        let prober = &self.ctx.settings.prober;
        let id = &self.key;
        // The Envoys the last attempt asked: those a pass is recorded for.
        let asked = Mutex::new(Vec::new());
        let check = |envoys: Vec<String>| {
            *asked.lock().unwrap_or_else(|p| p.into_inner()) = envoys.clone();
            async move { prober.check_version(&envoys, id, version).await }
        };
        let awaited = self.awaited(live_name(&self.route.name_any()), version, false);
        let verdict = verify(self.ctx, self.route, &awaited, check).await;
        if let Verification::Passed(result) = &verdict {
            let asked = asked.into_inner().unwrap_or_else(|p| p.into_inner());
            self.ctx.served.record(&unit, version, asked, result);
        }
        verdict
    }

    fn done(&mut self, step: Done<'_>) {
        match step {
            Done::Staged => {
                self.clocked(RolloutStep::Staged);
                self.report
                    .phase("Staging", "staging new clusters on every Envoy");
            }
            Done::EndpointsVerified => self.clocked(RolloutStep::EndpointsVerified),
            Done::Promoted { first } => {
                if first {
                    self.ctx.served.forget(&self.unit_key());
                }
                self.clocked(RolloutStep::Promoted);
                self.report
                    .phase("VerifyingLive", "new routes sent to every Envoy");
                if first {
                    info!(route = %self.key, generation = self.generation, "promoted");
                }
            }
            Done::LiveVerified { live, result } => {
                self.clocked(RolloutStep::LiveVerified);
                self.report.ready(live, result);
            }
        }
    }
}

/// Publishes Ready (with what the route's TLS Secret says); come back after `after`.
async fn ready(
    ctx: &Context,
    route: &TrafficRoute,
    report: &mut Report,
    after: Duration,
) -> Action {
    report.secrets(&ctx.secret_troubles(route));
    let event = Some(("Ready", "served by every Envoy".into()));
    publish(ctx, route, report, event).await;
    Action::requeue(after)
}

/// A ProxyConfig write the API server refuses as invalid fails the same way every time:
/// the route is told (status, Event) and asked again only after a while or a change,
/// instead of retried every few seconds without a word.
async fn refuse(
    ctx: &Context,
    route: &TrafficRoute,
    report: &mut Report,
    live: Option<&crate::api::ProxyConfig>,
    refused: RouteError,
) -> Action {
    warn!(route = %route.name_any(), %refused, "cannot write the route's ProxyConfig");
    report.rejected(&refused, live);
    publish(
        ctx,
        route,
        report,
        Some((refused.reason(), refused.to_string())),
    )
    .await;
    Action::requeue(Duration::from_secs(300))
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
    // An Envoy's NACK is told once, when it becomes the reason the generation waits: the
    // next pass may come before the status saying so can be read back.
    let now = Instant::now();
    let rejected = report.ready.reason == ENVOY_REJECTED;
    let mut event = (rejected && (ctx.deadlines).first_rejection(&key, report.generation, now))
        .then(|| (ENVOY_REJECTED, report.ready.message.clone()));
    let deadline = probe_deadline(route);
    let mut after = after;
    match (ctx.deadlines).check(&key, report.generation, deadline, now) {
        Verdict::Within { left } => after = after.min(left),
        // Envoy's own words say more than the time waited.
        Verdict::Exceeded { .. } if rejected => {}
        Verdict::Exceeded { waited, first } => {
            report.deadline_exceeded(deadline, waited);
            if first {
                event = Some((PROBE_DEADLINE_EXCEEDED, report.ready.message.clone()));
            }
        }
    }
    // Envoys holding the generation back for a while are named (nothing more said yet).
    let lagging: Vec<String> = result.lagging.iter().map(|(e, _)| e.clone()).collect();
    if event.is_none() && !rejected && (ctx.lagging).tell(&key, &report.generation, &lagging, now) {
        event = Some((ENVOYS_LAGGING, report.ready.message.clone()));
    }
    publish(ctx, route, report, event).await;
    // Routes on trial that Envoy refused wait for their own change, which reconciles them:
    // the fleet converging brings them nothing, and hundreds of them probing on every
    // convergence would slow everyone else's rollouts.
    let after = if troubles.iter().any(|t| t.refused) {
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
    let json = |status: &TrafficRouteStatus| serde_json::to_value(status).ok();
    ctx.status.set(StatusUpdate {
        kind: super::STATUS.clone(),
        namespace: route.namespace().unwrap_or_default(),
        name: route.name_any(),
        status: json(&status).unwrap_or_default(),
        shown: route.status.as_ref().and_then(json),
        read: route.resource_version(),
    });
    let key = (route.namespace().unwrap_or_default(), route.name_any());
    let reason_changed = !report.previous.iter().any(|c| {
        c.type_ == ConditionType::Ready.as_str()
            && c.reason == report.ready.reason
            && c.observed_generation == Some(report.generation)
    });
    if reason_changed {
        (ctx.told).now(&key, report.generation, &report.ready.reason);
    } else {
        ctx.told.caught_up(&key);
    }
    let Some((reason, note)) = event else {
        return;
    };
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
    let tale = Tale {
        uid: route.uid().unwrap_or_default(),
        generation: report.generation,
        ready_reason: report.ready.reason.clone(),
        reason: reason.to_owned(),
        note: event_note(&note),
    };
    // The status read may trail what this replica told already.
    if ctx.told.already(&key, &tale) {
        return;
    }
    let event = Event {
        type_: if is_ready && !secret {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason: reason.into(),
        note: Some(tale.note.clone()),
        action: "Rollout".into(),
        secondary: None,
    };
    match ctx.recorder.publish(&event, &route.object_ref(&())).await {
        Ok(()) => {
            let exists = |(namespace, name): &(String, String)| {
                let key = ObjectRef::<TrafficRoute>::new(name).within(namespace);
                ctx.routes.get(&key).is_some()
            };
            (ctx.told).told(key, tale, ctx.routes.len(), exists)
        }
        Err(error) => warn!(%error, "cannot record an event"),
    }
}
