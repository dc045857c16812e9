//! The snapshot every Envoy connected here serves in full: the one of the oldest build
//! among what each of them serves (see [`Holding`]). A rollout waiting for the Envoys to
//! hold its configuration asks them once that build holds it ([`BuiltFrom::holds`]).
//!
//! Not "the snapshot they all agree on": while thousands of routes roll out, a snapshot is
//! published every few hundred milliseconds and an Envoy taking seconds per update never
//! holds the newest, so they never agree, and every waiting route asked blindly on its
//! backoff timer (in a cold start of 10k routes, 58k of 95k probe requests were answered
//! 404 "not installed yet"). Each route step an Envoy completes still leaves it serving
//! the snapshot that step was planned from.
//!
//! An Envoy not synced that has served nothing newer for [`STALLED`] (stuck, or refusing)
//! is left out: the rollouts' checks of it, not this, say what it holds, and the others are
//! not held back by it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::built_from::BuiltFrom;
use super::envoys::{Envoys, Holding};

/// How long an Envoy may serve nothing newer, while not synced, before it is left out.
pub const STALLED: Duration = Duration::from_secs(10);

pub struct Convergence {
    envoys: Arc<dyn Envoys>,
    built_from: Arc<BuiltFrom>,
    /// Each stream's snapshot served, and since when it has served that or been synced.
    progress: Mutex<HashMap<u64, (Option<String>, Instant)>>,
}

/// What [`Convergence::read`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Reading {
    /// The version of the snapshot every Envoy connected here (but those stalled) serves
    /// in full; None when that is not known here: no Envoy counts, or one serves nothing
    /// yet or a snapshot this replica no longer remembers.
    pub version: Option<String>,
    /// When an Envoy counted now will have stalled, if it serves nothing newer by then:
    /// the reading changes at that moment without any Envoy saying anything.
    pub recheck_at: Option<Instant>,
}

impl Convergence {
    pub fn new(envoys: Arc<dyn Envoys>, built_from: Arc<BuiltFrom>) -> Self {
        Self {
            envoys,
            built_from,
            progress: Mutex::default(),
        }
    }

    /// The Envoys connected here as of now.
    pub fn read(&self) -> Reading {
        let holdings = self.envoys.holdings();
        let now = Instant::now();
        let mut progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        note_progress(&holdings, &mut progress, now);
        oldest_served(&holdings, &progress, now, |version: &str| {
            self.built_from.build_of(version)
        })
    }
}

/// Notes what each Envoy serves now, and forgets the streams gone: a stall clock starts
/// when an Envoy last served something new or was last seen synced.
fn note_progress(
    holdings: &[Holding],
    progress: &mut HashMap<u64, (Option<String>, Instant)>,
    now: Instant,
) {
    let streams: HashSet<u64> = holdings.iter().map(|h| h.stream).collect();
    progress.retain(|stream, _| streams.contains(stream));
    for holding in holdings {
        let (served, since) = progress
            .entry(holding.stream)
            .or_insert_with(|| (holding.serving.clone(), now));
        if *served != holding.serving || holding.synced {
            *served = holding.serving.clone();
            *since = now;
        }
    }
}

/// Of the Envoys not stalled (see [`note_progress`]), the snapshot of the oldest build
/// served; each version's build looked up once.
fn oldest_served(
    holdings: &[Holding],
    progress: &HashMap<u64, (Option<String>, Instant)>,
    now: Instant,
    build_of: impl Fn(&str) -> Option<u64>,
) -> Reading {
    let mut builds: HashMap<&str, Option<u64>> = HashMap::new();
    let mut oldest: Option<(u64, &str)> = None;
    let mut unknown = false;
    let mut recheck_at: Option<Instant> = None;
    for holding in holdings {
        if !holding.synced {
            let since = progress
                .get(&holding.stream)
                .map_or(now, |(_, since)| *since);
            let stalls_at = since + STALLED;
            if now > stalls_at {
                continue;
            }
            recheck_at = Some(recheck_at.map_or(stalls_at, |at| at.min(stalls_at)));
        }
        let Some(version) = holding.serving.as_deref() else {
            unknown = true;
            continue;
        };
        let Some(build) = *builds.entry(version).or_insert_with(|| build_of(version)) else {
            unknown = true;
            continue;
        };
        if oldest.is_none_or(|(oldest, _)| build < oldest) {
            oldest = Some((build, version));
        }
    }
    Reading {
        version: oldest
            .filter(|_| !unknown)
            .map(|(_, version)| version.to_owned()),
        recheck_at: recheck_at.map(|at| at + Duration::from_millis(1)),
    }
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

    /// The reading of `holdings` at `now`, after noting them.
    fn read(
        progress: &mut HashMap<u64, (Option<String>, Instant)>,
        holdings: &[Holding],
        now: Instant,
    ) -> Option<String> {
        note_progress(holdings, progress, now);
        oldest_served(holdings, progress, now, build_of).version
    }

    #[test]
    fn the_oldest_build_served_stands_for_every_envoy() {
        let mut progress = HashMap::new();
        let now = Instant::now();
        let mut oldest = |holdings: &[Holding]| read(&mut progress, holdings, now);
        assert_eq!(oldest(&[]), None, "no Envoy here: nothing known");
        let moving = [holding(1, Some("v7"), false), holding(2, Some("v5"), false)];
        assert_eq!(oldest(&moving).as_deref(), Some("v5"));
        let synced = [holding(1, Some("v7"), true), holding(2, Some("v7"), true)];
        assert_eq!(oldest(&synced).as_deref(), Some("v7"));
        let new = [holding(1, Some("v7"), true), holding(3, None, false)];
        assert_eq!(oldest(&new), None, "one serves nothing yet");
        let forgotten = [holding(2, Some("x"), false), holding(3, Some("v8"), false)];
        assert_eq!(oldest(&forgotten), None, "a snapshot not remembered here");
    }

    #[test]
    fn an_envoy_serving_nothing_newer_for_long_is_left_out_until_it_moves() {
        let mut progress = HashMap::new();
        let start = Instant::now();
        let stuck = |newer| {
            [
                holding(1, Some(newer), false),
                holding(2, Some("v3"), false),
            ]
        };
        note_progress(&stuck("v8"), &mut progress, start);
        let reading = oldest_served(&stuck("v8"), &progress, start, build_of);
        assert_eq!(reading.version.as_deref(), Some("v3"));
        let later = reading.recheck_at.expect("when envoy 2 stalls");
        assert!(later > start + STALLED);
        assert_eq!(
            read(&mut progress, &stuck("v9"), later).as_deref(),
            Some("v9"),
            "v3 stalled"
        );
        // It moves again: it counts again.
        let moved = [holding(1, Some("v9"), false), holding(2, Some("v4"), false)];
        assert_eq!(read(&mut progress, &moved, later).as_deref(), Some("v4"));
        // Synced, it never stalls: nothing newer is there to serve.
        let idle = [holding(1, Some("v9"), true), holding(2, Some("v9"), true)];
        let much_later = later + STALLED * 3;
        assert_eq!(read(&mut progress, &idle, later).as_deref(), Some("v9"));
        assert_eq!(
            read(&mut progress, &idle, much_later).as_deref(),
            Some("v9")
        );
        // Synced until a new snapshot came: its stall clock starts then, not when it last
        // served something new.
        let taking = [holding(1, Some("v9"), false), holding(2, Some("v9"), false)];
        let after_idle = much_later + Duration::from_secs(1);
        assert_eq!(
            read(&mut progress, &taking, after_idle).as_deref(),
            Some("v9")
        );
        // Every Envoy stalled: nothing known.
        let stalled = after_idle + STALLED + Duration::from_millis(1);
        assert_eq!(read(&mut progress, &taking, stalled), None);
    }

    #[test]
    fn every_stall_clock_runs_whatever_the_envoys_before_it_serve() {
        let mut progress = HashMap::new();
        let start = Instant::now();
        // Envoy 1 serves nothing yet; envoy 2 is stuck on v3.
        let both = [holding(1, None, false), holding(2, Some("v3"), false)];
        assert_eq!(read(&mut progress, &both, start), None);
        let later = start + STALLED + Duration::from_millis(1);
        assert_eq!(read(&mut progress, &both, later), None, "both stalled");
        let first_moves = [holding(1, Some("v5"), false), holding(2, Some("v3"), false)];
        assert_eq!(
            read(&mut progress, &first_moves, later).as_deref(),
            Some("v5"),
            "envoy 2 stalled since the start"
        );
    }
}
