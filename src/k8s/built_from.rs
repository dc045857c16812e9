//! What each snapshot this replica published was built from: which ProxyConfig versions
//! and which Services' endpoints had changed in it. A rollout waiting for the Envoys to
//! hold its configuration asks them again when they converge on a snapshot with news for
//! it, not at every convergence: while thousands of routes roll out at once, the Envoys
//! converge several times a second, and each waiting route asked every time cost a probe
//! request per Envoy and a pass for nothing (20 probe requests per route in a cold start
//! of 2000 routes, where two are needed).
//!
//! Builds are numbered; each ProxyConfig is recorded with its version and the first
//! build that held that version, each Service with the last build whose endpoints of it
//! changed. A snapshot's version maps to its build for the last [`PUBLISHED_KEPT`]
//! published, and endpoint news only as long as one of those is older. Whatever is not
//! known here (an older snapshot, a configuration not built yet) counts as news, and a
//! full rebuild as news for every route: a route is woken too often rather than once too
//! few.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use super::model_cache::ObjectKey;

/// How many published snapshots are remembered by version.
const PUBLISHED_KEPT: usize = 256;

/// What a rollout waits for the Envoys to hold: one of its ProxyConfigs at a version, with
/// the endpoints of the Services it sends to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Awaited {
    pub config: ObjectKey,
    pub version: String,
    pub services: Vec<ObjectKey>,
}

/// What went into one build, as the builder saw it.
#[derive(Debug, Default)]
pub struct BuildInputs {
    /// ProxyConfigs added or changed (with their version) or gone (None).
    pub configs: Vec<(ObjectKey, Option<String>)>,
    /// Services whose EndpointSlices changed.
    pub services: Vec<ObjectKey>,
    /// Namespaces where a slice changed whose Service is not known any more.
    pub namespaces: Vec<String>,
    /// Everything was built again (a first build, a resync): news for every route, and
    /// `configs` are all the ProxyConfigs there are.
    pub full: bool,
}

#[derive(Default)]
pub struct BuiltFrom {
    ledger: Mutex<Ledger>,
}

#[derive(Default)]
struct Ledger {
    builds: u64,
    /// Each ProxyConfig's version, and the first build that held it.
    configs: HashMap<ObjectKey, (String, u64)>,
    /// The last build in which a Service's endpoints changed.
    services: HashMap<ObjectKey, u64>,
    /// The last build in which a slice of an unknown Service in the namespace changed.
    namespaces: HashMap<String, u64>,
    /// The last full build.
    full: u64,
    /// Published snapshot versions with their build, oldest first.
    published: VecDeque<(String, u64)>,
    /// Snapshots forgotten since endpoint news was last forgotten.
    forgotten: usize,
}

impl BuiltFrom {
    /// Records a build's inputs; its number, for [`BuiltFrom::published`].
    pub fn built(&self, inputs: BuildInputs) -> u64 {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        ledger.builds += 1;
        let build = ledger.builds;
        if inputs.full {
            let present: HashSet<&ObjectKey> = inputs.configs.iter().map(|(key, _)| key).collect();
            ledger.configs.retain(|key, _| present.contains(key));
        }
        for (key, version) in inputs.configs {
            match version {
                Some(version) => {
                    let entry = ledger
                        .configs
                        .entry(key)
                        .or_insert_with(|| (String::new(), 0));
                    if entry.0 != version {
                        *entry = (version, build);
                    }
                }
                None => {
                    ledger.configs.remove(&key);
                }
            }
        }
        for service in inputs.services {
            ledger.services.insert(service, build);
        }
        for namespace in inputs.namespaces {
            ledger.namespaces.insert(namespace, build);
        }
        if inputs.full {
            ledger.full = build;
        }
        build
    }

    /// Build `build` was published as snapshot `version`.
    pub fn published(&self, version: &str, build: u64) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        if ledger.published.len() == PUBLISHED_KEPT {
            ledger.published.pop_front();
            ledger.forget_endpoint_news();
        }
        ledger.published.push_back((version.to_owned(), build));
    }

    /// The build snapshot `version` was published from, if it is remembered.
    pub fn build_of(&self, version: &str) -> Option<u64> {
        let ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        ledger.build_of(version)
    }

    /// Whether snapshot `converged` was built from `awaited`'s configuration at its
    /// version (or later); true when the snapshot or the configuration is not known here.
    /// While it was not, those of the fleet's Envoys that converged on it cannot pass a
    /// check of that configuration.
    pub fn holds(&self, converged: &str, awaited: &Awaited) -> bool {
        let ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        let Some(converged) = ledger.build_of(converged) else {
            return true;
        };
        match ledger.configs.get(&awaited.config) {
            Some((version, build)) if *version == awaited.version => *build <= converged,
            // Another version: the one awaited is not built yet (or no longer).
            Some(_) => false,
            None => true,
        }
    }

    /// Whether snapshot `converged` holds something of `awaited` built after build
    /// `checked` (the build the Envoys had converged on when the route last asked them).
    /// True when the snapshot or the configuration is not known here; false while the
    /// configuration is known at another version than `awaited`'s.
    pub fn has_news(&self, converged: &str, awaited: &Awaited, checked: u64) -> bool {
        let ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        let Some(converged) = ledger.build_of(converged) else {
            return true;
        };
        let config = match ledger.configs.get(&awaited.config) {
            Some((version, build)) if *version == awaited.version => *build,
            Some(_) => return false,
            None => return true,
        };
        let endpoints = awaited.services.iter().flat_map(|service| {
            let namespace = ledger.namespaces.get(&service.0);
            ledger.services.get(service).into_iter().chain(namespace)
        });
        let latest = endpoints.copied().fold(config.max(ledger.full), u64::max);
        checked < latest && latest <= converged
    }
}

impl Ledger {
    /// Forgets endpoint news older than every snapshot remembered, once per
    /// [`PUBLISHED_KEPT`] snapshots forgotten: Services come and go (a revision each, for some users),
    /// and their entries would pile up. Such news is no news to any route: one that asked
    /// before it was woken by the first convergence on a snapshot with it (or, with the
    /// Envoys converged on no remembered snapshot, by every convergence).
    fn forget_endpoint_news(&mut self) {
        self.forgotten += 1;
        let Some(&(_, oldest)) = self.published.front() else {
            return;
        };
        if self.forgotten < PUBLISHED_KEPT {
            return;
        }
        self.forgotten = 0;
        self.services.retain(|_, build| *build >= oldest);
        self.namespaces.retain(|_, build| *build >= oldest);
    }

    fn build_of(&self, version: &str) -> Option<u64> {
        self.published
            .iter()
            .rev()
            .find(|(v, _)| v == version)
            .map(|(_, build)| *build)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ("shop".to_owned(), name.to_owned())
    }

    fn awaited(version: &str) -> Awaited {
        Awaited {
            config: key("r-probe"),
            version: version.to_owned(),
            services: vec![key("s")],
        }
    }

    fn config(name: &str, version: &str) -> BuildInputs {
        BuildInputs {
            configs: vec![(key(name), Some(version.to_owned()))],
            ..BuildInputs::default()
        }
    }

    #[test]
    fn a_route_hears_of_the_snapshot_that_first_holds_its_configuration_once() {
        let ledger = BuiltFrom::default();
        let other = ledger.built(config("r-probe", "v0"));
        ledger.published("s1", other);
        assert!(!ledger.has_news("s1", &awaited("v1"), 0), "not built yet");
        assert!(!ledger.holds("s1", &awaited("v1")));
        let ours = ledger.built(config("r-probe", "v1"));
        ledger.published("s2", ours);
        assert!(
            !ledger.has_news("s1", &awaited("v1"), 0),
            "not converged yet"
        );
        assert!(!ledger.holds("s1", &awaited("v1")));
        assert!(ledger.has_news("s2", &awaited("v1"), 0));
        assert!(ledger.holds("s2", &awaited("v1")));
        // Asked at s2: later snapshots of other routes are no news.
        let later = ledger.built(config("other", "y"));
        ledger.published("s3", later);
        assert!(!ledger.has_news("s3", &awaited("v1"), ours));
        // An older version of its configuration is not what it waits for.
        assert!(!ledger.has_news("s3", &awaited("v0"), 0));
    }

    #[test]
    fn endpoints_of_its_services_are_news_after_it_asked() {
        let ledger = BuiltFrom::default();
        let ours = ledger.built(config("r-probe", "v1"));
        ledger.published("s1", ours);
        let endpoints = ledger.built(BuildInputs {
            services: vec![key("s")],
            ..BuildInputs::default()
        });
        ledger.published("s2", endpoints);
        assert!(ledger.has_news("s2", &awaited("v1"), ours));
        // A slice whose Service is gone counts for every Service of its namespace.
        let unknown = ledger.built(BuildInputs {
            namespaces: vec!["shop".to_owned()],
            ..BuildInputs::default()
        });
        ledger.published("s3", unknown);
        assert!(ledger.has_news("s3", &awaited("v1"), endpoints));
    }

    #[test]
    fn what_is_not_known_here_is_news() {
        let ledger = BuiltFrom::default();
        assert!(ledger.has_news("never published", &awaited("v1"), 0));
        assert!(ledger.holds("never published", &awaited("v1")));
        let other = ledger.built(config("other", "x"));
        ledger.published("s0", other);
        assert!(
            ledger.has_news("s0", &awaited("v1"), 0),
            "a configuration not known"
        );
        assert!(ledger.holds("s0", &awaited("v1")));
        let ours = ledger.built(config("r-probe", "v1"));
        ledger.published("s1", ours);
        let full = ledger.built(BuildInputs {
            configs: vec![(key("r-probe"), Some("v2".to_owned()))],
            full: true,
            ..BuildInputs::default()
        });
        ledger.published("s2", full);
        assert!(ledger.has_news("s2", &awaited("v2"), ours));
        assert!(ledger.holds("s2", &awaited("v2")));
        // A full build records every configuration there is, and only those.
        let ledger = ledger.ledger.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(ledger.configs.len(), 1);
    }

    #[test]
    fn only_the_last_snapshots_are_remembered() {
        let ledger = BuiltFrom::default();
        let endpoints = ledger.built(BuildInputs {
            services: vec![key("gone")],
            ..BuildInputs::default()
        });
        ledger.published("s0", endpoints);
        for i in 1..=PUBLISHED_KEPT {
            let build = ledger.built(BuildInputs::default());
            ledger.published(&format!("s{i}"), build);
        }
        assert_eq!(ledger.build_of("s0"), None);
        assert_eq!(ledger.build_of("s1"), Some(2));
        // Endpoint news older than every snapshot remembered is forgotten, in one sweep
        // per as many snapshots as are remembered.
        for i in 2..PUBLISHED_KEPT {
            let build = ledger.built(BuildInputs::default());
            ledger.published(&format!("t{i}"), build);
        }
        assert!(
            !ledger
                .ledger
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .services
                .is_empty()
        );
        let build = ledger.built(BuildInputs::default());
        ledger.published("t", build);
        let ledger = ledger.ledger.lock().unwrap_or_else(|p| p.into_inner());
        assert!(ledger.services.is_empty());
    }
}
