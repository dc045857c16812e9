//! How long each step of a rollout took: the time from the step before it (the first one:
//! from the beginning of the pass that made it), for the `switchyard_rollout_step_seconds`
//! histogram. Where a switch spends its time, without reading logs.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The steps of a rollout, in order; the one-phase path skips the first two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutStep {
    /// The probe ProxyConfig written.
    Staged,
    /// Every Envoy holds the new clusters with ready endpoints and accepts the trial.
    EndpointsVerified,
    /// The live ProxyConfig written.
    Promoted,
    /// Every Envoy serves the new routes: Ready, handed to the status writer.
    LiveVerified,
}

impl RolloutStep {
    /// A step that writes a ProxyConfig: one can start a generation's clock.
    fn writes(self) -> bool {
        matches!(self, RolloutStep::Staged | RolloutStep::Promoted)
    }

    pub fn label(self) -> &'static str {
        match self {
            RolloutStep::Staged => "staged",
            RolloutStep::EndpointsVerified => "endpoints_verified",
            RolloutStep::Promoted => "promoted",
            RolloutStep::LiveVerified => "live_verified",
        }
    }
}

/// Per route ("namespace/name"): the generation rolling out and when its last step was.
/// A generation's clock starts with its first write (from the beginning of that pass) and
/// stops when it is live and verified; the passes that only verify again what is already
/// live time nothing.
#[derive(Default)]
pub struct RolloutClock {
    last: Mutex<HashMap<String, (i64, Instant)>>,
}

impl RolloutClock {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (i64, Instant)>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `step` of `route` at `generation` is done, in a pass that began at `pass_began`:
    /// the time since the step before it, or since `pass_began` for the generation's first
    /// write. None when that generation's clock does not run.
    pub fn step(
        &self,
        route: &str,
        generation: i64,
        step: RolloutStep,
        pass_began: Instant,
    ) -> Option<Duration> {
        let now = Instant::now();
        let mut last = self.lock();
        let since = match last.get(route) {
            Some((g, at)) if *g == generation => *at,
            _ if step.writes() => pass_began,
            _ => return None,
        };
        if step == RolloutStep::LiveVerified {
            last.remove(route);
        } else {
            last.insert(route.to_owned(), (generation, now));
        }
        Some(now.saturating_duration_since(since))
    }

    /// The route needs no more steps (it is rejected, or done): its clock stops.
    pub fn stop(&self, route: &str) {
        self.lock().remove(route);
    }

    #[cfg(test)]
    fn running(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_counts_from_the_one_before_and_the_first_from_its_pass() {
        let clock = RolloutClock::default();
        let began = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let staged = clock.step("ns/web", 2, RolloutStep::Staged, began);
        let staged = staged.expect("a write starts the clock");
        assert!(staged >= Duration::from_millis(20));
        let verified = clock.step("ns/web", 2, RolloutStep::EndpointsVerified, Instant::now());
        assert!(verified.expect("running") < staged);
        assert!(
            clock
                .step("ns/web", 2, RolloutStep::Promoted, began)
                .is_some()
        );
        assert!(
            clock
                .step("ns/web", 2, RolloutStep::LiveVerified, began)
                .is_some()
        );
        assert_eq!(clock.running(), 0, "live and verified: stopped");
    }

    #[test]
    fn verifying_again_what_is_live_times_nothing() {
        let clock = RolloutClock::default();
        let again = clock.step("ns/web", 2, RolloutStep::LiveVerified, Instant::now());
        assert_eq!(again, None);
        let endpoints = clock.step("ns/web", 2, RolloutStep::EndpointsVerified, Instant::now());
        assert_eq!(endpoints, None);
        assert_eq!(clock.running(), 0);
    }

    #[test]
    fn a_new_generation_restarts_the_clock_and_stop_ends_it() {
        let clock = RolloutClock::default();
        assert!(
            clock
                .step("ns/web", 2, RolloutStep::Staged, Instant::now())
                .is_some()
        );
        let old = clock.step("ns/web", 3, RolloutStep::EndpointsVerified, Instant::now());
        assert_eq!(old, None, "generation 3 has written nothing yet");
        assert!(
            clock
                .step("ns/web", 3, RolloutStep::Staged, Instant::now())
                .is_some()
        );
        let verified = clock.step("ns/web", 2, RolloutStep::EndpointsVerified, Instant::now());
        assert_eq!(verified, None, "generation 2 was superseded");
        clock.stop("ns/web");
        assert_eq!(clock.running(), 0);
    }
}
