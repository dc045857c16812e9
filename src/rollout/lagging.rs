//! Envoys that hold a unit's rollout back for a while are named in an Event, on whatever
//! object the front-end reports the unit on: once the same Envoys have held the same
//! version back for [`LAGGING_AFTER`], and once per version and set of Envoys. Status
//! names them from the first pass; the Event is what `kubectl describe` and an alert on
//! Warning Events see.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The reason of the Event recorded once a version has waited [`LAGGING_AFTER`] for the
/// same Envoys: which ones hold it back, and why.
pub const ENVOYS_LAGGING: &str = "EnvoysLagging";

/// How long a version waits on the same Envoys before an Event names them: far longer
/// than a rollout takes when every Envoy answers (tens of milliseconds), and than a hung
/// Envoy takes to stop being ready and leave the fleet (5 s), so it names the Envoys that
/// stay counted and hold the rollout back: a stuck xDS stream, a refusal. Timed from the
/// first pass that found the version waiting on them.
pub const LAGGING_AFTER: Duration = Duration::from_secs(10);

/// Per unit (namespace, name): the version waiting, the Envoys it waits on and since
/// when, and the Envoys an Event named last. `V` is what identifies a version of a unit
/// to its front-end: a TrafficRoute's generation, a Gateway unit's content version.
pub struct LaggingEnvoys<V> {
    units: Mutex<HashMap<(String, String), Lagging<V>>>,
}

struct Lagging<V> {
    version: V,
    envoys: Vec<String>,
    since: Instant,
    told: Option<Vec<String>>,
}

impl<V> Default for LaggingEnvoys<V> {
    fn default() -> Self {
        Self {
            units: Mutex::default(),
        }
    }
}

impl<V: PartialEq + Clone> LaggingEnvoys<V> {
    /// `version` of `unit` waits on `envoys` (those not proven yet) at `now`: true when an
    /// Event should name them, once they have held it back for [`LAGGING_AFTER`] and no
    /// Event named these same Envoys for it.
    pub fn tell(
        &self,
        unit: &(String, String),
        version: &V,
        envoys: &[String],
        now: Instant,
    ) -> bool {
        let mut units = self.units.lock().unwrap_or_else(|p| p.into_inner());
        let entry = units.entry(unit.clone()).or_insert_with(|| Lagging {
            version: version.clone(),
            envoys: envoys.to_vec(),
            since: now,
            told: None,
        });
        if entry.version != *version {
            *entry = Lagging {
                version: version.clone(),
                envoys: envoys.to_vec(),
                since: now,
                told: None,
            };
        }
        if entry.envoys != envoys {
            entry.envoys = envoys.to_vec();
            entry.since = now;
        }
        let long = now.saturating_duration_since(entry.since) >= LAGGING_AFTER;
        if !long || envoys.is_empty() || entry.told.as_deref() == Some(envoys) {
            return false;
        }
        entry.told = Some(envoys.to_vec());
        true
    }

    /// The unit waits no more (served, rejected, or gone).
    pub fn done(&self, unit: &(String, String)) {
        (self.units.lock().unwrap_or_else(|p| p.into_inner())).remove(unit);
    }

    /// Forgets every unit but those `waiting` keeps.
    pub fn retain(&self, waiting: impl Fn(&(String, String)) -> bool) {
        (self.units.lock().unwrap_or_else(|p| p.into_inner())).retain(|unit, _| waiting(unit));
    }
}

/// Cuts an Event's note to what the API server takes (1 KiB), on a character boundary.
pub fn event_note(note: &str) -> String {
    const MAX: usize = 1024;
    if note.len() <= MAX {
        return note.to_owned();
    }
    let mut end = MAX - '…'.len_utf8();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &note[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoys_holding_a_version_back_are_named_once_they_have_for_a_while() {
        let lagging = LaggingEnvoys::default();
        let unit = ("shop".to_owned(), "web".to_owned());
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let one = vec!["envoy-2 (198.18.0.3)".to_owned()];
        let two = vec!["envoy-1 (198.18.0.2)".to_owned(), one[0].clone()];
        assert!(!lagging.tell(&unit, &2, &one, t0));
        assert!(!lagging.tell(&unit, &2, &one, at(9)));
        assert!(lagging.tell(&unit, &2, &one, at(10)), "named");
        assert!(!lagging.tell(&unit, &2, &one, at(30)), "once");
        // Other Envoys are timed afresh, and named in their turn.
        assert!(!lagging.tell(&unit, &2, &two, at(31)));
        assert!(lagging.tell(&unit, &2, &two, at(41)));
        // A newer version starts its own count.
        assert!(!lagging.tell(&unit, &3, &two, at(42)));
        assert!(lagging.tell(&unit, &3, &two, at(52)));
        assert!(!lagging.tell(&unit, &3, &[], at(80)), "none lagging");
        // A unit that waited no more starts afresh.
        assert!(!lagging.tell(&unit, &3, &one, at(81)));
        lagging.retain(|_| false);
        assert!(!lagging.tell(&unit, &3, &one, at(91)), "forgotten");
        assert!(lagging.tell(&unit, &3, &one, at(101)));
    }

    #[test]
    fn a_long_note_is_cut_to_what_the_api_server_takes() {
        assert_eq!(event_note("short"), "short");
        let long = "é".repeat(700);
        let cut = event_note(&long);
        assert!(cut.len() <= 1024 && cut.ends_with('…'), "{}", cut.len());
    }
}
