//! One reconcile pass: the steps of [`super::shift::next_step`] performed, until the route
//! is Ready, waits on the fleet, or is refused.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::admission::admit;
use super::report::Report;
use super::shift::{Observed, Step, Verified, next_step};
use super::verify::{Verification, verify};
use super::{Context, DEFAULT_DRAIN, ENVOY_REJECTED, Error, FIELD_MANAGER, PROMOTED_AT};
use crate::api::ProxyConfigSpec;
use crate::api::{ProxyConfig, TrafficRoute};
use crate::duration;
use crate::k8s::resolve::{RouteError, resolve_route};
use crate::k8s::to_model::endpoint_probe_id;
use crate::model::trial_id;
use crate::prober::FleetResult;
use crate::translate::REFUSED_BY_ENVOY;

pub(super) async fn reconcile(
    route: Arc<TrafficRoute>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let namespace = route.namespace().unwrap_or_default();
    let name = route.name_any();
    let generation = route.metadata.generation.unwrap_or(0);
    debug!(route = %format!("{namespace}/{name}"), generation, "reconcile");
    let services = ctx.services.state();
    let in_namespace: Vec<&Service> = services
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace.as_str()))
        .map(Arc::as_ref)
        .collect();
    let resolved = resolve_route(&route, &in_namespace).and_then(|r| admit(&ctx, &route, r));

    let api: Api<ProxyConfig> = Api::namespaced(ctx.client.clone(), &namespace);
    let read = |e| Error::Read {
        route: format!("{namespace}/{name}"),
        source: e,
    };
    let (live_pc, probe_pc) = (live_name(&name), probe_name(&name));
    let (live, probe) = tokio::join!(api.get_opt(&live_pc), api.get_opt(&probe_pc));
    let (mut live, mut probe) = (live.map_err(read)?, probe.map_err(read)?);
    let drain = route
        .spec
        .rollout
        .as_ref()
        .and_then(|r| r.drain_period.as_deref())
        .and_then(|d| duration::parse(d).ok())
        .unwrap_or(DEFAULT_DRAIN);
    let mut verified = Verified::default();
    let mut report = Report::new(&route, generation);

    for _ in 0..8 {
        let since_promoted = live.as_ref().and_then(promoted_ago);
        let step = next_step(
            &Observed {
                route: &name,
                generation,
                resolved: &resolved,
                live: live.as_ref().map(|p| &p.spec),
                probe: probe.as_ref().map(|p| &p.spec),
                since_promoted,
                drain_period: drain,
                two_phase: ctx.settings.two_phase,
                created: route.metadata.creation_timestamp.as_ref(),
            },
            &verified,
        );
        match step {
            Step::Reject(error) => {
                report.rejected(&error, live.as_ref());
                publish(
                    &ctx,
                    &route,
                    &report,
                    Some((error.reason(), error.to_string())),
                )
                .await;
                return Ok(Action::requeue(Duration::from_secs(300)));
            }
            Step::Stage(spec) => {
                let written = apply(&ctx, &route, &probe_pc, spec, None).await;
                match written {
                    Ok(pc) => probe = Some(pc),
                    Err(error) => {
                        return refuse(&ctx, &route, &mut report, live.as_ref(), error).await;
                    }
                }
                debug!(route = %name, generation, "probe config written");
                report.phase("Staging", "staging new clusters on every Envoy");
            }
            Step::VerifyEndpoints { probe_version } => {
                let id = endpoint_probe_id(&namespace, &name, &probe_version);
                let trial = trial_id(&format!("{namespace}/{name}"));
                let prober = &ctx.settings.prober;
                let check = |envoys: Vec<String>| {
                    let (id, trial, version) = (&id, &trial, &probe_version);
                    async move { prober.check_staged(&envoys, id, trial, version).await }
                };
                let (result, after) = match verify(&ctx, &route, check).await {
                    Verification::Passed(_) => {
                        verified.endpoints = Some(probe_version);
                        continue;
                    }
                    Verification::Waiting(result, after) => (result, after),
                    Verification::Superseded => return Ok(Action::requeue(Duration::ZERO)),
                };
                let waiting = (
                    "VerifyingEndpoints",
                    "new clusters not ready, or routes on trial not accepted, on every Envoy",
                );
                return Ok(
                    requeue_waiting(&ctx, &route, &mut report, waiting, &result, after).await,
                );
            }
            Step::Promote(spec) => {
                let first = live.as_ref().is_none_or(|l| l.spec.version != spec.version);
                // The promotion time starts the drain period; a metadata-only promotion keeps it.
                let promoted_at = match (first, live.as_ref()) {
                    (false, Some(l)) => l.annotations().get(PROMOTED_AT).cloned(),
                    _ => Some(k8s_openapi::jiff::Timestamp::now().to_string()),
                };
                let written = apply(&ctx, &route, &live_pc, spec, promoted_at).await;
                match written {
                    Ok(pc) => live = Some(pc),
                    Err(error) => {
                        return refuse(&ctx, &route, &mut report, live.as_ref(), error).await;
                    }
                }
                debug!(route = %name, generation, "live config written");
                report.phase("VerifyingLive", "new routes sent to every Envoy");
                if first {
                    info!(route = %format!("{namespace}/{name}"), generation, "promoted");
                }
            }
            Step::VerifyLive { version } => {
                let id = format!("{namespace}/{name}");
                let prober = &ctx.settings.prober;
                let check = |envoys: Vec<String>| {
                    let (id, version) = (&id, &version);
                    async move { prober.check_version(&envoys, id, version).await }
                };
                let (result, after) = match verify(&ctx, &route, check).await {
                    Verification::Passed(result) => {
                        report.ready(live.as_ref(), &result);
                        verified.live = Some(version);
                        continue;
                    }
                    Verification::Waiting(result, after) => (result, after),
                    Verification::Superseded => return Ok(Action::requeue(Duration::ZERO)),
                };
                let waiting = ("VerifyingLive", "new routes not served by every Envoy yet");
                return Ok(
                    requeue_waiting(&ctx, &route, &mut report, waiting, &result, after).await,
                );
            }
            Step::Collect { after } => {
                if !after.is_zero() {
                    report.draining();
                    report.secrets(&ctx.secret_troubles(&route));
                    publish(
                        &ctx,
                        &route,
                        &report,
                        Some(("Ready", "served by every Envoy".into())),
                    )
                    .await;
                    return Ok(Action::requeue(after));
                }
                let deleted = api.delete(&probe_pc, &DeleteParams::default()).await;
                if let Err(e) = deleted
                    && !matches!(&e, kube::Error::Api(s) if s.code == 404)
                {
                    return Err(Error::Write {
                        name: probe_pc.clone(),
                        source: e,
                    });
                }
                probe = None;
            }
            Step::Done => {
                report.done();
                report.secrets(&ctx.secret_troubles(&route));
                publish(
                    &ctx,
                    &route,
                    &report,
                    Some(("Ready", "served by every Envoy".into())),
                )
                .await;
                return Ok(Action::requeue(Duration::from_secs(300)));
            }
        }
    }
    publish(&ctx, &route, &report, None).await;
    Ok(Action::requeue(Duration::from_millis(20)))
}

pub(super) fn live_name(route: &str) -> String {
    format!("{route}-live")
}

pub(super) fn probe_name(route: &str) -> String {
    format!("{route}-probe")
}

pub(super) fn promoted_ago(pc: &ProxyConfig) -> Option<Duration> {
    let text = pc.annotations().get(PROMOTED_AT)?;
    let at: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    let ago = k8s_openapi::jiff::Timestamp::now().duration_since(at);
    Duration::try_from(ago).ok()
}

/// Server-side applies a ProxyConfig owned by the route.
pub(super) async fn apply(
    ctx: &Context,
    route: &TrafficRoute,
    name: &str,
    spec: ProxyConfigSpec,
    promoted_at: Option<String>,
) -> Result<ProxyConfig, Error> {
    let namespace = route.namespace().unwrap_or_default();
    let api: Api<ProxyConfig> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut pc = ProxyConfig::new(name, spec);
    pc.metadata.owner_references = route.controller_owner_ref(&()).map(|o| vec![o]);
    pc.metadata.labels = Some([("switchyard.dev/route".to_string(), route.name_any())].into());
    pc.metadata.annotations = promoted_at.map(|at| [(PROMOTED_AT.to_string(), at)].into());
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&pc),
    )
    .await
    .map_err(|source| Error::Write {
        name: name.to_string(),
        source,
    })
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
    let Error::Write {
        name,
        source: kube::Error::Api(status),
    } = &error
    else {
        return Err(error);
    };
    if !matches!(status.code, 400 | 413 | 422) {
        return Err(error);
    }
    let refused = RouteError::WriteRefused {
        name: name.clone(),
        message: status.message.clone(),
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
    let event =
        (report.ready.1 == ENVOY_REJECTED).then(|| (ENVOY_REJECTED, report.ready.2.clone()));
    publish(ctx, route, report, event).await;
    // Routes on trial that Envoy refused wait for their own change, which reconciles them:
    // the fleet converging brings them nothing, and hundreds of them probing on every
    // convergence would slow everyone else's rollouts.
    let after = if troubles.iter().any(|t| t.starts_with(REFUSED_BY_ENVOY)) {
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
        c.type_ == "Ready" && c.status == "True" && c.observed_generation == Some(report.generation)
    });
    let is_ready = report.ready.0;
    ctx.status.set(
        &route.namespace().unwrap_or_default(),
        &route.name_any(),
        status,
    );
    let Some((reason, note)) = event else {
        return;
    };
    let reason_changed = !report.previous.iter().any(|c| {
        c.type_ == "Ready"
            && c.reason == report.ready.1
            && c.observed_generation == Some(report.generation)
    });
    if is_ready && was_ready && !reason_changed {
        return;
    }
    if report.ready.1 == ENVOY_REJECTED && !reason_changed {
        return;
    }
    let rejected_before = report.previous.iter().any(|c| {
        c.type_ == "Accepted"
            && c.status == "False"
            && c.observed_generation == Some(report.generation)
    });
    if !is_ready && rejected_before {
        return;
    }
    // A TLS Secret that went missing or bad is told under its own reason (Warning).
    let secret = matches!(report.ready.1.as_str(), "SecretNotFound" | "InvalidSecret");
    let (reason, note) = if secret {
        (report.ready.1.as_str(), report.ready.2.clone())
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
