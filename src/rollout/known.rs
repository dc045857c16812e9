//! The ProxyConfigs as this leader last had them from the API server itself: what a write
//! or a delete answered, or a read. A pass reads a ProxyConfig from the watch's store when
//! the store holds exactly that, and asks the API server otherwise (the store lags behind
//! our own writes, or someone else wrote). At 10k routes rolling out, two reads per pass
//! were most of the API server's work; writes still carry the resourceVersion they were
//! decided on, so a store that lags behind another writer costs a conflict, not a mistake.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;

use crate::api::ProxyConfig;
use crate::k8s::model_cache::ObjectKey;

#[derive(Default)]
pub(super) struct Known(Mutex<HashMap<ObjectKey, Option<String>>>);

impl Known {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Option<String>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store's copy of `key` (None: there is none) when it is what this leader knows
    /// to be current; None when the API server must be asked.
    pub(super) fn stored_if_current(
        &self,
        key: &ObjectKey,
        stored: Option<Arc<ProxyConfig>>,
    ) -> Option<Option<ProxyConfig>> {
        let known = self.lock().get(key).cloned()?;
        match (known, stored) {
            (None, None) => Some(None),
            (Some(version), Some(pc)) if pc.resource_version().as_ref() == Some(&version) => {
                Some(Some(pc.as_ref().clone()))
            }
            _ => None,
        }
    }

    /// The API server answered with `pc` (None: there is none).
    pub(super) fn saw(&self, key: ObjectKey, pc: Option<&ProxyConfig>) {
        self.lock()
            .insert(key, pc.and_then(|pc| pc.resource_version()));
    }

    /// A write or delete failed: what the API server holds is unknown.
    pub(super) fn forget(&self, key: &ObjectKey) {
        self.lock().remove(key);
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
        // A failed write: ask again.
        known.forget(&key());
        assert!(known.stored_if_current(&key(), None).is_none());
    }
}
