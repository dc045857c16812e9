//! The snapshot every Envoy connected here serves in full: the one of the oldest build
//! among what each of them serves (see [`Holding`]). A rollout waiting for the Envoys to
//! hold its configuration asks them once that build holds it ([`BuiltFrom::holds`]).
//!
//! Not "the snapshot they all agree on": while thousands of routes roll out, a snapshot is
//! published every few hundred milliseconds and an Envoy taking seconds per update never
//! holds the newest, so they never agree, and every waiting route asked blindly on its
//! backoff timer (in a cold start of 10k routes, 58k of 95k probe requests were answered
//! 404 "not installed yet"). Each update an Envoy completes still leaves it serving the
//! snapshot it was planned from.
//!
//! An Envoy that serves nothing newer for [`STALLED`] while it is not synced (stuck, or
//! refusing) is left out: the rollouts' questions, not this, say what it holds, and the
//! others are not held back by it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::built_from::BuiltFrom;
use super::envoys::{Envoys, Holding};

/// How long an Envoy may serve nothing newer, while not synced, before it is left out.
pub const STALLED: Duration = Duration::from_secs(10);

pub struct Convergence {
    envoys: Arc<dyn Envoys>,
    built_from: Arc<BuiltFrom>,
    /// Each stream's snapshot served, and since when.
    progress: Mutex<HashMap<u64, (Option<String>, Instant)>>,
}

impl Convergence {
    pub fn new(envoys: Arc<dyn Envoys>, built_from: Arc<BuiltFrom>) -> Self {
        Self {
            envoys,
            built_from,
            progress: Mutex::default(),
        }
    }

    /// The version of the snapshot every Envoy connected here (but those stalled) serves
    /// in full, as of now; None when that is not known here: no Envoy counts, or one
    /// serves a snapshot this replica does not remember.
    pub fn version(&self) -> Option<String> {
        let holdings = self.envoys.holdings();
        let mut progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        oldest_served(&holdings, &mut progress, Instant::now(), |version: &str| {
            self.built_from.build_of(version)
        })
    }
}

/// Of the Envoys not stalled, the snapshot of the oldest build served, after `progress`
/// noted what each serves now (and forgot the streams gone).
fn oldest_served(
    holdings: &[Holding],
    progress: &mut HashMap<u64, (Option<String>, Instant)>,
    now: Instant,
    build_of: impl Fn(&str) -> Option<u64>,
) -> Option<String> {
    progress.retain(|stream, _| holdings.iter().any(|h| h.stream == *stream));
    let mut oldest: Option<(u64, &str)> = None;
    for holding in holdings {
        let (served, since) = progress
            .entry(holding.stream)
            .or_insert_with(|| (holding.serving.clone(), now));
        if *served != holding.serving {
            *served = holding.serving.clone();
            *since = now;
        }
        if !holding.synced && now.duration_since(*since) > STALLED {
            continue;
        }
        let version = holding.serving.as_deref()?;
        let build = build_of(version)?;
        if oldest.is_none_or(|(oldest, _)| build < oldest) {
            oldest = Some((build, version));
        }
    }
    oldest.map(|(_, version)| version.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(stream: u64, serving: Option<&str>, synced: bool) -> Holding {
        Holding {
            stream,
            serving: serving.map(str::to_owned),
            synced,
        }
    }

    /// Snapshot "vN" is build N.
    fn build_of(version: &str) -> Option<u64> {
        version.strip_prefix('v')?.parse().ok()
    }

    #[test]
    fn the_oldest_build_served_stands_for_every_envoy() {
        let mut progress = HashMap::new();
        let now = Instant::now();
        let mut oldest =
            |holdings: &[Holding], at| oldest_served(holdings, &mut progress, at, build_of);
        assert_eq!(oldest(&[], now), None, "no Envoy here: nothing known");
        let moving = [holding(1, Some("v7"), false), holding(2, Some("v5"), false)];
        assert_eq!(oldest(&moving, now).as_deref(), Some("v5"));
        let synced = [holding(1, Some("v7"), true), holding(2, Some("v7"), true)];
        assert_eq!(oldest(&synced, now).as_deref(), Some("v7"));
        let new = [holding(1, Some("v7"), true), holding(3, None, false)];
        assert_eq!(oldest(&new, now), None, "one serves nothing yet");
        let forgotten = [holding(1, Some("v7"), true), holding(2, Some("x"), false)];
        assert_eq!(
            oldest(&forgotten, now),
            None,
            "a snapshot not remembered here"
        );
    }

    #[test]
    fn an_envoy_serving_nothing_newer_for_long_is_left_out_until_it_moves() {
        let mut progress = HashMap::new();
        let start = Instant::now();
        let mut oldest =
            |holdings: &[Holding], at| oldest_served(holdings, &mut progress, at, build_of);
        let stuck = |newer| {
            [
                holding(1, Some(newer), false),
                holding(2, Some("v3"), false),
            ]
        };
        assert_eq!(oldest(&stuck("v8"), start).as_deref(), Some("v3"));
        let later = start + STALLED + Duration::from_millis(1);
        assert_eq!(
            oldest(&stuck("v9"), later).as_deref(),
            Some("v9"),
            "v3 stalled"
        );
        // It moves again: it counts again.
        let moved = [holding(1, Some("v9"), false), holding(2, Some("v4"), false)];
        assert_eq!(oldest(&moved, later).as_deref(), Some("v4"));
        // Synced, it never stalls: nothing newer is there to serve.
        let idle = [holding(1, Some("v9"), true), holding(2, Some("v9"), true)];
        let much_later = later + STALLED * 3;
        assert_eq!(oldest(&idle, later).as_deref(), Some("v9"));
        assert_eq!(oldest(&idle, much_later).as_deref(), Some("v9"));
        // Every Envoy stalled: nothing known.
        let all_stuck = [holding(1, Some("v9"), false), holding(2, Some("v9"), false)];
        assert_eq!(oldest(&all_stuck, much_later), None);
    }
}
