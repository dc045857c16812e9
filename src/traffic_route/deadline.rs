//! `spec.rollout.probeDeadline`: how long a generation may wait for every Envoy to prove
//! readiness before its status says so (`Ready` False, reason `ProbeDeadlineExceeded`,
//! and an Event the first time); the rollout keeps retrying, and the route turns Ready by
//! itself once every Envoy proves it. Counted from when this replica first found the
//! generation waiting: a replica that takes the lead counts afresh. The same entry
//! remembers whether an Envoy's rejection of the generation was told in an Event.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::api::TrafficRoute;
use crate::duration;

/// The reason of `Ready` once a generation waited longer than its deadline.
pub const PROBE_DEADLINE_EXCEEDED: &str = "ProbeDeadlineExceeded";

/// The deadline of a route that sets none.
pub const DEFAULT_PROBE_DEADLINE: Duration = Duration::from_secs(300);

/// The route's probe deadline, or the default (its spec was validated before it got here).
pub fn probe_deadline(route: &TrafficRoute) -> Duration {
    (route.spec.rollout.as_ref())
        .and_then(|r| r.probe_deadline.as_deref())
        .and_then(|d| duration::parse(d).ok())
        .unwrap_or(DEFAULT_PROBE_DEADLINE)
}

/// Where a waiting generation stands against its deadline.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Not yet: `left` to go (the next check should not come later).
    Within { left: Duration },
    /// Waited `waited`; `first` when this is the check that found it out.
    Exceeded { waited: Duration, first: bool },
}

/// Per route (namespace, name): the generation waiting, since when, and whether its
/// deadline was told.
#[derive(Default)]
pub struct ProbeDeadlines {
    waiting: Mutex<HashMap<(String, String), Waiting>>,
}

struct Waiting {
    generation: i64,
    since: Instant,
    told: bool,
    /// Whether an Envoy's rejection of it was told.
    rejection_told: bool,
}

impl Waiting {
    /// The route's entry for `generation`: a newer generation starts afresh at `now`.
    fn of<'a>(
        waiting: &'a mut HashMap<(String, String), Waiting>,
        route: &(String, String),
        generation: i64,
        now: Instant,
    ) -> &'a mut Waiting {
        let entry = waiting
            .entry(route.clone())
            .or_insert_with(|| Waiting::new(generation, now));
        if entry.generation != generation {
            *entry = Waiting::new(generation, now);
        }
        entry
    }

    fn new(generation: i64, now: Instant) -> Waiting {
        Waiting {
            generation,
            since: now,
            told: false,
            rejection_told: false,
        }
    }
}

impl ProbeDeadlines {
    /// `generation` of `route` is still waiting at `now`.
    pub fn check(
        &self,
        route: &(String, String),
        generation: i64,
        deadline: Duration,
        now: Instant,
    ) -> Verdict {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let entry = Waiting::of(&mut waiting, route, generation, now);
        let waited = now.saturating_duration_since(entry.since);
        if waited < deadline {
            return Verdict::Within {
                left: deadline - waited,
            };
        }
        let first = !entry.told;
        entry.told = true;
        Verdict::Exceeded { waited, first }
    }

    /// An Envoy rejects `generation` of `route`, at `now`: true the first time only, when an
    /// Event should say so.
    pub fn first_rejection(&self, route: &(String, String), generation: i64, now: Instant) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let entry = Waiting::of(&mut waiting, route, generation, now);
        !std::mem::replace(&mut entry.rejection_told, true)
    }

    /// The route waits no more (served, rejected, or gone).
    pub fn done(&self, route: &(String, String)) {
        (self.waiting.lock().unwrap_or_else(|p| p.into_inner())).remove(route);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejection_is_told_once_per_generation() {
        let deadlines = ProbeDeadlines::default();
        let route = ("shop".to_owned(), "web".to_owned());
        let t0 = Instant::now();
        assert!(deadlines.first_rejection(&route, 2, t0));
        assert!(!deadlines.first_rejection(&route, 2, t0), "once");
        assert!(
            deadlines.first_rejection(&route, 3, t0),
            "a newer generation"
        );
        deadlines.done(&route);
        assert!(
            deadlines.first_rejection(&route, 3, t0),
            "after it was served"
        );
    }

    #[test]
    fn a_generation_is_timed_from_its_first_wait_and_told_once() {
        let deadlines = ProbeDeadlines::default();
        let route = ("shop".to_owned(), "web".to_owned());
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(
            deadlines.check(&route, 2, minute, t0),
            Verdict::Within { left: minute }
        );
        assert_eq!(
            deadlines.check(&route, 2, minute, at(45)),
            Verdict::Within {
                left: Duration::from_secs(15)
            }
        );
        assert_eq!(
            deadlines.check(&route, 2, minute, at(61)),
            Verdict::Exceeded {
                waited: Duration::from_secs(61),
                first: true
            }
        );
        assert_eq!(
            deadlines.check(&route, 2, minute, at(70)),
            Verdict::Exceeded {
                waited: Duration::from_secs(70),
                first: false
            }
        );
        // A newer generation starts its own count; so does one after it was served.
        assert_eq!(
            deadlines.check(&route, 3, minute, at(80)),
            Verdict::Within { left: minute }
        );
        deadlines.done(&route);
        assert_eq!(
            deadlines.check(&route, 3, minute, at(200)),
            Verdict::Within { left: minute }
        );
    }
}
