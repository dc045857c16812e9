//! Live versions the whole fleet was seen serving. A unit passes again and again once it
//! is served (its Services' endpoints change, its status write comes back, the controller
//! resyncs), and each pass asked every Envoy again for what they had just answered: 2906
//! of the 8114 "ready" answers of a 2000-route cold start came within 30 s of the route's
//! verification. A version seen is taken as served for [`RECHECK`], while the fleet has
//! the same addresses, until another version of the unit is promoted.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::prober::FleetResult;

/// A live version seen on every Envoy is asked again after this long.
pub const RECHECK: Duration = Duration::from_secs(30);

/// A unit: its namespace and name.
pub type UnitKey = (String, String);

/// The live version each unit was last seen served in, by which Envoys, and when.
#[derive(Default)]
pub struct ServedVersions {
    seen: Mutex<HashMap<UnitKey, Seen>>,
}

struct Seen {
    version: String,
    envoys: Vec<String>,
    result: FleetResult,
    at: Instant,
}

impl ServedVersions {
    /// What the fleet answered when every one of `envoys` (the fleet now) served `version`
    /// of `unit`, if that was less than [`RECHECK`] ago.
    pub fn seen(&self, unit: &UnitKey, version: &str, envoys: &[String]) -> Option<FleetResult> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let last = seen.get(unit)?;
        let same = last.version == version && last.envoys == envoys;
        (same && last.at.elapsed() < RECHECK).then(|| last.result.clone())
    }

    /// Every one of `envoys` (those the check that passed asked) serves `version` of
    /// `unit`, as `result` says.
    pub fn record(&self, unit: &UnitKey, version: &str, envoys: Vec<String>, result: &FleetResult) {
        let seen = Seen {
            version: version.to_owned(),
            envoys,
            result: result.clone(),
            at: Instant::now(),
        };
        (self.seen.lock().unwrap_or_else(|p| p.into_inner())).insert(unit.clone(), seen);
    }

    /// A new live version of `unit` was promoted (what was seen of the one before says
    /// nothing of it, a rollback to that one included: Envoys may serve the one between),
    /// or the unit is gone.
    pub fn forget(&self, unit: &UnitKey) {
        (self.seen.lock().unwrap_or_else(|p| p.into_inner())).remove(unit);
    }

    /// Forgets the units `keep` does not keep (those that are gone).
    pub fn retain(&self, keep: impl Fn(&UnitKey) -> bool) {
        (self.seen.lock().unwrap_or_else(|p| p.into_inner())).retain(|unit, _| keep(unit));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit() -> UnitKey {
        ("default".into(), "web".into())
    }

    fn fleet(addresses: &[&str]) -> Vec<String> {
        addresses.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn a_version_seen_on_the_same_fleet_is_not_asked_again() {
        let served = ServedVersions::default();
        let result = FleetResult {
            ready: fleet(&["198.18.0.1", "198.18.0.2"]),
            lagging: vec![],
        };
        served.record(&unit(), "v1", fleet(&["198.18.0.1", "198.18.0.2"]), &result);
        let now = fleet(&["198.18.0.1", "198.18.0.2"]);
        assert_eq!(served.seen(&unit(), "v1", &now), Some(result));
        // Another version, or an Envoy that joined or left, is asked.
        assert_eq!(served.seen(&unit(), "v2", &now), None);
        let joined = fleet(&["198.18.0.1", "198.18.0.2", "198.18.0.3"]);
        assert_eq!(served.seen(&unit(), "v1", &joined), None);
        assert_eq!(served.seen(&unit(), "v1", &fleet(&["198.18.0.1"])), None);
        served.retain(|_| false);
        assert_eq!(served.seen(&unit(), "v1", &now), None);
    }

    #[test]
    fn a_promotion_forgets_what_was_seen_before_it() {
        // v1 seen, v2 promoted and not seen everywhere, then v1 again: asked again.
        let served = ServedVersions::default();
        let now = fleet(&["198.18.0.1"]);
        served.record(&unit(), "v1", now.clone(), &FleetResult::default());
        served.forget(&unit());
        assert_eq!(served.seen(&unit(), "v1", &now), None);
    }
}
