//! The leader election's rules, without I/O: when a leader renews and when it must stop
//! writing, when a follower may take the Lease, and what each of them writes to it.
//!
//! The rules are client-go's: the leader renews every few seconds and stops writing once
//! no renewal has gone through for `duration - grace`, measured on its own clock from the
//! moment it sent the last renewal that went through; a follower takes the Lease once it
//! has seen it unchanged for `duration` on its own clock. The follower saw the renewal
//! after it was sent, so the leader has stopped `grace` before any follower may lead,
//! whatever the two wall clocks say. Every write carries the resourceVersion it was
//! decided on: of two replicas taking the Lease at once, one is refused.

use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

/// The periods of one election, from the lease duration and grace the user set.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// How long the Lease holds for the others after a renewal.
    pub duration: Duration,
    /// Between the leader's fence and the moment another replica may lead; also what a
    /// follower allows the wall clocks to differ by when it judges a Lease it has not
    /// watched run out.
    pub grace: Duration,
    /// From sending a renewal that went through to the fence.
    pub fence_after: Duration,
    /// Between renewals, and between a follower's reads.
    pub renew_every: Duration,
}

impl Timing {
    pub fn new(duration_seconds: u64, grace_seconds: u64) -> Timing {
        let duration = Duration::from_secs(duration_seconds.max(1));
        let grace = Duration::from_secs(grace_seconds).clamp(duration / 10, duration / 2);
        let fence_after = duration - grace;
        Timing {
            duration,
            grace,
            fence_after,
            // Five renewals before the fence (client-go: every 2 s, fence at 10 s): one
            // slow or refused renewal costs nothing; a busy API server has seconds.
            renew_every: (fence_after / 5)
                .clamp(Duration::from_millis(100), Duration::from_secs(2)),
        }
    }

    /// How long one request to the Lease may take with `left` until the fence: until the
    /// fence (a slow answer that comes in time still counts), at least one renew period.
    pub fn request_within(&self, left: Duration) -> Duration {
        left.max(self.renew_every)
    }
}

/// The Lease as a follower last read it, and since when (on its own clock) it has read it
/// unchanged.
#[derive(Clone, Debug)]
pub struct Seen {
    holder: Option<String>,
    renewed: Option<SystemTime>,
    duration: Option<Duration>,
    version: Option<String>,
    since: Instant,
    /// The first read of this follower: it has watched nothing yet.
    first: bool,
}

impl Seen {
    /// `lease` read at `now`; `before` is what the previous read saw.
    pub fn of(lease: &Lease, now: Instant, before: Option<&Seen>) -> Seen {
        let spec = lease.spec.clone().unwrap_or_default();
        let version = lease.metadata.resource_version.clone();
        let since = match before {
            Some(before) if before.version == version => before.since,
            _ => now,
        };
        Seen {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            renewed: spec.renew_time.and_then(|t| wall_time(&t)),
            duration: (spec.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs),
            version,
            since,
            first: before.is_none(),
        }
    }

    /// `Ok` when `me` may take the Lease now; else how long until it may, at the earliest.
    /// A Lease is free when it has no holder, names `me` (a process before this one with
    /// the same identity), has been seen unchanged for its duration, or, at the first read,
    /// was renewed longer ago than its duration plus the grace by the wall clock (a Lease
    /// left behind by a replica long gone needs no watching; once watched, only this
    /// replica's clock counts).
    pub fn may_take(
        &self,
        me: &str,
        now: Instant,
        wall: SystemTime,
        timing: &Timing,
    ) -> Result<(), Duration> {
        if self.holder.as_deref().is_none_or(|h| h == me) {
            return Ok(());
        }
        let duration = self.duration.unwrap_or(timing.duration);
        let watched = (self.since + duration).saturating_duration_since(now);
        let left_long_ago = self.first
            && self
                .renewed
                .is_some_and(|renewed| renewed + duration + timing.grace <= wall);
        if watched.is_zero() || left_long_ago {
            Ok(())
        } else {
            Err(watched)
        }
    }
}

fn wall_time(time: &MicroTime) -> Option<SystemTime> {
    let since_epoch = Duration::try_from(time.0.duration_since(Timestamp::UNIX_EPOCH)).ok()?;
    Some(SystemTime::UNIX_EPOCH + since_epoch)
}

/// The Lease `me` writes to take it: over `read` (its resourceVersion the precondition),
/// or a new one. A change of holder counts a transition.
pub fn taken(
    read: Option<&Lease>,
    name: &str,
    namespace: &str,
    me: &str,
    timing: &Timing,
) -> Lease {
    let mut lease = read.cloned().unwrap_or_else(|| {
        let mut lease = Lease::default();
        lease.metadata.name = Some(name.to_string());
        lease.metadata.namespace = Some(namespace.to_string());
        lease
    });
    let before = lease.spec.take().unwrap_or_default();
    let now = MicroTime(Timestamp::now());
    let same_holder = before.holder_identity.as_deref() == Some(me);
    let transitions = before.lease_transitions.unwrap_or(0);
    lease.spec = Some(LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: i32::try_from(timing.duration.as_secs()).ok(),
        acquire_time: if same_holder {
            before.acquire_time.or_else(|| Some(now.clone()))
        } else {
            Some(now.clone())
        },
        renew_time: Some(now),
        lease_transitions: Some(if same_holder || read.is_none() {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        ..before
    });
    lease
}

/// The Lease `held` renewed now.
pub fn renewed(held: &Lease) -> Lease {
    let mut lease = held.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    lease
}

/// The Lease `held` with no holder: a follower watching it takes it at once.
pub fn released(held: &Lease) -> Lease {
    let mut lease = held.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    lease
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, version: &str, renewed_ago: Duration) -> Lease {
        let mut lease = Lease::default();
        lease.metadata.resource_version = Some(version.into());
        let renewed = SystemTime::now() - renewed_ago;
        let micros = renewed
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after the epoch")
            .as_micros();
        lease.spec = Some(LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(4),
            renew_time: Some(MicroTime(
                Timestamp::from_microsecond(i64::try_from(micros).expect("fits"))
                    .expect("a timestamp"),
            )),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        });
        lease
    }

    #[test]
    fn a_leader_stops_a_grace_before_the_others_may_lead_and_renews_five_times_before() {
        for (duration, grace) in [(15, 5), (4, 1), (2, 1), (60, 5), (10, 0), (1, 0), (5, 30)] {
            let timing = Timing::new(duration, grace);
            assert!(timing.fence_after < timing.duration, "{timing:?}");
            assert!(timing.grace >= timing.duration / 10, "{timing:?}");
            assert_eq!(
                timing.fence_after + timing.grace,
                timing.duration,
                "{timing:?}"
            );
            assert!(timing.renew_every * 5 <= timing.fence_after, "{timing:?}");
        }
        let defaults = Timing::new(15, 5);
        assert_eq!(defaults.fence_after, Duration::from_secs(10));
        assert_eq!(defaults.renew_every, Duration::from_secs(2));
    }

    #[test]
    fn a_request_may_take_until_the_fence_and_at_least_a_renew_period() {
        let timing = Timing::new(15, 5);
        assert_eq!(
            timing.request_within(Duration::from_secs(7)),
            Duration::from_secs(7)
        );
        assert_eq!(timing.request_within(Duration::ZERO), timing.renew_every);
    }

    #[test]
    fn a_follower_takes_a_lease_it_has_seen_unchanged_for_its_duration() {
        let timing = Timing::new(4, 1);
        let t0 = Instant::now();
        let wall = SystemTime::now();
        let first = Seen::of(&lease(Some("other"), "1", Duration::ZERO), t0, None);
        let wait = first.may_take("me", t0, wall, &timing).expect_err("held");
        assert!(wait <= Duration::from_secs(4), "{wait:?}");
        // Read again unchanged: still counted from the first read.
        let later = t0 + Duration::from_secs(3);
        let again = Seen::of(
            &lease(Some("other"), "1", Duration::ZERO),
            later,
            Some(&first),
        );
        assert!(again.may_take("me", later, wall, &timing).is_err());
        assert!(
            again
                .may_take("me", t0 + Duration::from_secs(4), wall, &timing)
                .is_ok()
        );
        // Renewed meanwhile: counted from the read that saw the renewal.
        let renewed = Seen::of(
            &lease(Some("other"), "2", Duration::ZERO),
            later,
            Some(&first),
        );
        assert!(
            renewed
                .may_take("me", t0 + Duration::from_secs(4), wall, &timing)
                .is_err()
        );
    }

    #[test]
    fn a_lease_left_long_ago_free_or_named_after_me_is_taken_at_once() {
        let timing = Timing::new(4, 1);
        let (now, wall) = (Instant::now(), SystemTime::now());
        let stale = Seen::of(
            &lease(Some("other"), "1", Duration::from_secs(6)),
            now,
            None,
        );
        assert!(stale.may_take("me", now, wall, &timing).is_ok());
        // Within duration + grace by the wall clock: the clocks may differ by the grace.
        let recent = Seen::of(
            &lease(Some("other"), "1", Duration::from_millis(4500)),
            now,
            None,
        );
        assert!(recent.may_take("me", now, wall, &timing).is_err());
        let free = Seen::of(&lease(None, "1", Duration::ZERO), now, None);
        assert!(free.may_take("me", now, wall, &timing).is_ok());
        let empty = Seen::of(&lease(Some(""), "1", Duration::ZERO), now, None);
        assert!(empty.may_take("me", now, wall, &timing).is_ok());
        let mine = Seen::of(&lease(Some("me"), "1", Duration::ZERO), now, None);
        assert!(mine.may_take("me", now, wall, &timing).is_ok());
    }

    #[test]
    fn taking_counts_a_transition_and_keeps_the_precondition() {
        let timing = Timing::new(4, 1);
        let read = lease(Some("other"), "7", Duration::from_secs(9));
        let taken = taken(Some(&read), "l", "ns", "me", &timing);
        assert_eq!(taken.metadata.resource_version.as_deref(), Some("7"));
        let spec = taken.spec.expect("a spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.lease_duration_seconds, Some(4));
        // Taken back by the same identity: no transition.
        let mine = lease(Some("me"), "8", Duration::from_secs(9));
        let again = super::taken(Some(&mine), "l", "ns", "me", &timing);
        assert_eq!(again.spec.expect("a spec").lease_transitions, Some(3));
        // A new Lease: named, no precondition.
        let new = super::taken(None, "l", "ns", "me", &timing);
        assert_eq!(new.metadata.name.as_deref(), Some("l"));
        assert_eq!(new.metadata.resource_version, None);
    }

    #[test]
    fn a_released_lease_has_no_holder_and_a_renewed_one_keeps_its_version() {
        let held = lease(Some("me"), "9", Duration::from_secs(1));
        let released = released(&held);
        assert_eq!(
            released
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.clone()),
            None
        );
        assert_eq!(released.metadata.resource_version.as_deref(), Some("9"));
        let renewed = renewed(&held);
        assert_eq!(renewed.metadata.resource_version.as_deref(), Some("9"));
        assert_ne!(
            renewed.spec.as_ref().and_then(|s| s.renew_time.clone()),
            held.spec.as_ref().and_then(|s| s.renew_time.clone())
        );
    }
}
