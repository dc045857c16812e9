//! One pass over one unit: the steps [`next_step`] decides, performed, until the unit is
//! served, waits on the fleet, or cannot be served. Every front-end moves its units
//! through this one loop; what differs between front-ends (how long a pass may wait on the
//! fleet, what its status says after each step) is theirs to give as a [`Front`].
//!
//! Everything is derived from the ProxyConfigs the API server holds, so a new leader goes
//! on where the old one was; promotion only follows a verification of the same pass (I3).

use std::future::Future;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use switchyard_core::route::ResolvedRoute;

use super::proxy_configs::{Error, ProxyConfigs, UnitRef, promoted_ago, promotion_time};
use super::shift::{Observed, Step, Verified, next_step};
use super::spec::{RouteError, live_name, probe_name};
use crate::api::ProxyConfig;
use crate::prober::FleetResult;

/// Steps one pass takes at most before it hands over to the next (a pass normally ends
/// sooner: served, waiting on the fleet, or refused).
const MAX_STEPS: usize = 8;

/// What the engine needs to know of a unit for one pass.
pub struct Unit<'a> {
    /// Where its ProxyConfigs live, its name, who owns them.
    pub unit: UnitRef<'a>,
    /// The generation of the object that asks for it (live ProxyConfigs carry it).
    pub generation: i64,
    /// What it asks to serve, or why it cannot be served.
    pub resolved: &'a Result<ResolvedRoute, RouteError>,
    /// How long the old clusters stay after a promotion (I4).
    pub drain_period: Duration,
    /// Off only for tests that prove the two phases matter.
    pub two_phase: bool,
    /// When the object that asks for it was created: its live ProxyConfig carries it.
    pub created: Option<&'a Time>,
}

/// How asking the fleet ended.
#[derive(Debug)]
pub enum Verification {
    /// Every Envoy passed, or there is none to ask.
    Passed(FleetResult),
    /// Not yet: ask again after this long.
    Waiting(FleetResult, Duration),
    /// The unit changed meanwhile: this pass decided on what is no longer asked for.
    Superseded,
}

/// Which verification a unit waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The probe config's clusters ready, and the routes on trial accepted, everywhere.
    VerifyingEndpoints,
    /// The live version served everywhere.
    VerifyingLive,
}

/// A step done, for a front-end's clocks and status.
pub enum Done<'a> {
    /// The probe ProxyConfig written.
    Staged,
    /// Every Envoy holds the new clusters with ready endpoints and accepts the trial.
    EndpointsVerified,
    /// The live ProxyConfig written; `first`: with a version not live before.
    Promoted { first: bool },
    /// Every Envoy serves the live ProxyConfig.
    LiveVerified {
        live: Option<&'a ProxyConfig>,
        result: &'a FleetResult,
    },
}

/// What a front-end does where front-ends differ.
pub trait Front {
    /// Asks every Envoy whether it holds probe config `probe_version` ready.
    fn verify_endpoints(&mut self, probe_version: &str) -> impl Future<Output = Verification>;
    /// Asks every Envoy whether it serves live `version`.
    fn verify_live(&mut self, version: &str) -> impl Future<Output = Verification>;
    /// A step is done.
    fn done(&mut self, step: Done<'_>);
}

/// How a pass ended.
#[derive(Debug)]
pub enum End {
    /// The unit cannot be served as it is; what is live stays.
    Rejected(RouteError),
    /// The API server refuses one of its ProxyConfigs as invalid: it would again.
    Refused(RouteError),
    /// Waiting on the fleet for `version` (the probe's or the live one, by `phase`): ask
    /// again after `after`.
    Waiting {
        phase: Phase,
        version: String,
        result: FleetResult,
        after: Duration,
    },
    /// The unit changed meanwhile: pass again at once.
    Superseded,
    /// Every Envoy serves it; the old clusters go once the drain period is over, `after`
    /// from now.
    Draining { after: Duration },
    /// Every Envoy serves it, nothing left to do.
    Served,
    /// [`MAX_STEPS`] taken: pass again at once.
    MoreSteps,
}

/// A unit's ProxyConfigs as the pass found and left them.
#[derive(Default)]
pub struct Held {
    pub live: Option<ProxyConfig>,
    pub probe: Option<ProxyConfig>,
}

impl Held {
    /// `unit`'s ProxyConfigs, as the API server holds them.
    pub async fn read(proxy_configs: &ProxyConfigs, unit: &UnitRef<'_>) -> Result<Self, Error> {
        let (live, probe) = (live_name(unit.name), probe_name(unit.name));
        let (live, probe) = tokio::join!(
            proxy_configs.read(unit.namespace, &live),
            proxy_configs.read(unit.namespace, &probe),
        );
        Ok(Self {
            live: live?,
            probe: probe?,
        })
    }
}

/// Moves `unit` as far as it goes now. `held` is what the API server holds of its
/// ProxyConfigs, kept up to date with every write. A write that fails is an error, but
/// for a refusal (the API server finds the ProxyConfig invalid): [`End::Refused`].
pub async fn advance(
    proxy_configs: &ProxyConfigs,
    unit: &Unit<'_>,
    held: &mut Held,
    front: &mut impl Front,
) -> Result<End, Error> {
    let mut verified = Verified::default();
    for _ in 0..MAX_STEPS {
        let observed = Observed {
            route: unit.unit.name,
            generation: unit.generation,
            resolved: unit.resolved,
            live: held.live.as_ref().map(|p| &p.spec),
            probe: held.probe.as_ref().map(|p| &p.spec),
            since_promoted: held.live.as_ref().and_then(promoted_ago),
            drain_period: unit.drain_period,
            two_phase: unit.two_phase,
            created: unit.created,
        };
        match next_step(&observed, &verified) {
            Step::Reject(error) => return Ok(End::Rejected(error)),
            Step::Stage(spec) => {
                let name = probe_name(unit.unit.name);
                let current = held.probe.as_ref();
                // A first rollout's write may be shared with others that coincide.
                let written = match (&held.live, current) {
                    (None, None) => {
                        proxy_configs
                            .create_first(&unit.unit, &name, spec, None)
                            .await
                    }
                    _ => {
                        proxy_configs
                            .apply(&unit.unit, &name, spec, None, current)
                            .await
                    }
                };
                match refusal(written)? {
                    Ok(pc) => held.probe = Some(pc),
                    Err(refused) => return Ok(End::Refused(refused)),
                }
                front.done(Done::Staged);
            }
            Step::VerifyEndpoints { probe_version } => {
                match front.verify_endpoints(&probe_version).await {
                    Verification::Passed(_) => {}
                    Verification::Waiting(result, after) => {
                        let phase = Phase::VerifyingEndpoints;
                        return Ok(End::Waiting {
                            phase,
                            version: probe_version,
                            result,
                            after,
                        });
                    }
                    Verification::Superseded => return Ok(End::Superseded),
                }
                front.done(Done::EndpointsVerified);
                verified.endpoints = Some(probe_version);
            }
            Step::Promote(spec) => {
                let live = held.live.as_ref();
                let first = live.is_none_or(|l| l.spec.version != spec.version);
                let promoted_at = promotion_time(live, &spec.version);
                let name = live_name(unit.unit.name);
                let written = match live {
                    None => {
                        (proxy_configs.create_first(&unit.unit, &name, spec, promoted_at)).await
                    }
                    Some(_) => {
                        (proxy_configs.apply(&unit.unit, &name, spec, promoted_at, live)).await
                    }
                };
                match refusal(written)? {
                    Ok(pc) => held.live = Some(pc),
                    Err(refused) => return Ok(End::Refused(refused)),
                }
                front.done(Done::Promoted { first });
            }
            Step::VerifyLive { version } => {
                let result = match front.verify_live(&version).await {
                    Verification::Passed(result) => result,
                    Verification::Waiting(result, after) => {
                        let phase = Phase::VerifyingLive;
                        return Ok(End::Waiting {
                            phase,
                            version,
                            result,
                            after,
                        });
                    }
                    Verification::Superseded => return Ok(End::Superseded),
                };
                let live = held.live.as_ref();
                front.done(Done::LiveVerified {
                    live,
                    result: &result,
                });
                verified.live = Some(version);
            }
            // The probe config goes once the drain period is over, or at once when no
            // cluster leaves with it (I4).
            Step::Collect { after } => {
                if !after.is_zero() {
                    return Ok(End::Draining { after });
                }
                let name = probe_name(unit.unit.name);
                let current = held.probe.as_ref();
                (proxy_configs.delete(unit.unit.namespace, &name, current)).await?;
                held.probe = None;
            }
            Step::Done => return Ok(End::Served),
        }
    }
    Ok(End::MoreSteps)
}

/// A write refused for good, as the unit's error; any other failure stays an error.
fn refusal(written: Result<ProxyConfig, Error>) -> Result<Result<ProxyConfig, RouteError>, Error> {
    match written {
        Ok(pc) => Ok(Ok(pc)),
        Err(error) => match error.refusal() {
            Some((name, message)) => Ok(Err(RouteError::WriteRefused {
                name: name.to_owned(),
                message: message.to_owned(),
            })),
            None => Err(error),
        },
    }
}
