//! The ProxyConfigs as this leader last had them from the API server itself: what a write
//! or a delete answered, or a read. A pass reads a ProxyConfig from the watch's store when
//! the store holds exactly that, and asks the API server otherwise (the store lags behind
//! our own writes, or someone else wrote). At 10k routes rolling out, two reads per pass
//! were most of the API server's work; writes still carry the resourceVersion they were
//! decided on, so a store that lags behind another writer costs a conflict, not a mistake.
//!
//! The same knowledge tells the watch's echo of this leader's own write from a change
//! (see [`Known::is_echo`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;

use super::PROMOTED_AT;
use crate::api::ProxyConfig;
use crate::k8s::model_cache::ObjectKey;

#[derive(Default)]
pub(super) struct Known(Mutex<State>);

#[derive(Default)]
struct State {
    /// What the API server last answered, by object: its resourceVersion, None for none.
    answered: HashMap<ObjectKey, Option<String>>,
    /// The writes sent and not answered yet, by object: what they ask for.
    sending: HashMap<ObjectKey, ProxyConfig>,
}

impl Known {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store's copy of `key` (None: there is none) when it is what this leader knows
    /// to be current; None when the API server must be asked.
    pub(super) fn stored_if_current(
        &self,
        key: &ObjectKey,
        stored: Option<Arc<ProxyConfig>>,
    ) -> Option<Option<ProxyConfig>> {
        let known = self.lock().answered.get(key).cloned()?;
        match (known, stored) {
            (None, None) => Some(None),
            (Some(version), Some(pc)) if pc.resource_version().as_ref() == Some(&version) => {
                Some(Some(pc.as_ref().clone()))
            }
            _ => None,
        }
    }

    /// Whether anything is known of `key`: what the API server answered, or a write on
    /// its way.
    pub(super) fn knows(&self, key: &ObjectKey) -> bool {
        let state = self.lock();
        state.answered.contains_key(key) || state.sending.contains_key(key)
    }

    /// The API server answered with `pc` (None: there is none).
    pub(super) fn saw(&self, key: ObjectKey, pc: Option<&ProxyConfig>) {
        let mut state = self.lock();
        state.sending.remove(&key);
        state
            .answered
            .insert(key, pc.and_then(|pc| pc.resource_version()));
    }

    /// A write of `pc` is on its way: until it is answered, the watch may bring it back
    /// first.
    pub(super) fn sending(&self, key: ObjectKey, pc: &ProxyConfig) {
        self.lock().sending.insert(key, pc.clone());
    }

    /// A write or delete failed: what the API server holds is unknown, and must be asked
    /// (it may have taken the write all the same), whatever the store shows.
    pub(super) fn unsure(&self, key: &ObjectKey) {
        let mut state = self.lock();
        state.sending.remove(key);
        // No object has an empty resourceVersion: the store never agrees with this.
        state.answered.insert(key.clone(), Some(String::new()));
    }

    /// Nothing of `key` needs keeping any more (its unit is gone).
    pub(super) fn forget(&self, key: &ObjectKey) {
        let mut state = self.lock();
        state.sending.remove(key);
        state.answered.remove(key);
    }

    /// The resourceVersion the API server last answered for `key` (None: none, or nothing
    /// known).
    pub(super) fn version(&self, key: &ObjectKey) -> Option<String> {
        self.lock().answered.get(key).cloned().flatten()
    }

    /// Whether `pc`, as a watch event brings it, is only this leader's own write heard
    /// back: the object the API server answered a write (or read) with, or what a write
    /// still unanswered asks for (its spec and promotion time), which the watch may bring
    /// before the answer. Such an event tells a pass nothing it does not know.
    pub(super) fn is_echo(&self, pc: &ProxyConfig) -> bool {
        let key = (pc.namespace().unwrap_or_default(), pc.name_any());
        let state = self.lock();
        let answered = state
            .answered
            .get(&key)
            .is_some_and(|v| v.is_some() && *v == pc.resource_version());
        let promoted_at = |p: &ProxyConfig| p.annotations().get(PROMOTED_AT).cloned();
        let sent = state
            .sending
            .get(&key)
            .is_some_and(|s| s.spec == pc.spec && promoted_at(s) == promoted_at(pc));
        answered || sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ProxyConfigSpec;

    fn pc(version: &str) -> Arc<ProxyConfig> {
        let spec: ProxyConfigSpec = serde_json::from_value(serde_json::json!({
            "role": "live", "route": "web", "generation": 1, "version": "v1",
            "virtualHost": { "hosts": ["a.test"], "rules": [] }, "clusters": [],
        }))
        .expect("spec");
        let mut pc = ProxyConfig::new("web-live", spec);
        pc.metadata.resource_version = Some(version.into());
        Arc::new(pc)
    }

    fn key() -> ObjectKey {
        ("shop".into(), "web-live".into())
    }

    #[test]
    fn the_store_is_read_only_when_it_holds_what_the_api_server_last_said() {
        let known = Known::default();
        // Nothing known yet: ask.
        assert!(known.stored_if_current(&key(), Some(pc("7"))).is_none());
        known.saw(key(), Some(&pc("8")));
        // The store lags behind our write, or holds a newer one of someone else's: ask.
        assert!(known.stored_if_current(&key(), Some(pc("7"))).is_none());
        assert!(known.stored_if_current(&key(), None).is_none());
        // The store caught up.
        let read = known.stored_if_current(&key(), Some(pc("8")));
        assert_eq!(
            read.flatten().and_then(|p| p.resource_version()),
            Some("8".into())
        );
        // Deleted: the store agrees only once the object is gone from it too.
        known.saw(key(), None);
        assert!(known.stored_if_current(&key(), Some(pc("8"))).is_none());
        assert!(matches!(known.stored_if_current(&key(), None), Some(None)));
        // A failed write: ask again, whatever the store shows.
        known.unsure(&key());
        assert!(known.knows(&key()));
        assert!(known.stored_if_current(&key(), None).is_none());
        assert!(known.stored_if_current(&key(), Some(pc("8"))).is_none());
        // Its unit gone: nothing kept.
        known.forget(&key());
        assert!(!known.knows(&key()));
    }

    #[test]
    fn an_echo_is_what_the_api_server_answered_or_what_a_write_on_its_way_asks_for() {
        let known = Known::default();
        let mut web = pc("7").as_ref().clone();
        web.metadata.namespace = Some("shop".into());
        // Nothing known: a change.
        assert!(!known.is_echo(&web));
        known.saw(key(), Some(&web));
        assert!(known.is_echo(&web));
        // Someone else's write.
        let mut other = web.clone();
        other.metadata.resource_version = Some("8".into());
        assert!(!known.is_echo(&other));
        // Our write, heard back before its answer: the same spec and promotion time.
        let mut ours = other.clone();
        ours.spec.version = "v2".into();
        ours.metadata.resource_version = Some("9".into());
        known.sending(key(), &ours);
        assert!(known.is_echo(&ours));
        assert!(!known.is_echo(&other));
        let mut promoted = ours.clone();
        promoted.metadata.annotations = Some([(PROMOTED_AT.to_owned(), "now".into())].into());
        assert!(!known.is_echo(&promoted));
        // Answered: from now on by its resourceVersion only.
        known.saw(key(), Some(&ours));
        assert!(known.is_echo(&ours));
        let mut again = ours.clone();
        again.metadata.resource_version = Some("10".into());
        assert!(!known.is_echo(&again));
        // A failed write is no echo, and what the API server holds is unknown.
        known.sending(key(), &again);
        known.unsure(&key());
        assert!(!known.is_echo(&again));
        assert!(!known.is_echo(&ours));
    }
}
