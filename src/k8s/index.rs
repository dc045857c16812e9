//! Watchers feeding in-memory stores: the index every replica builds its snapshot from.
//!
//! Each kind is reflected into a store per watched namespace (or one for all). The index is
//! ready once every store has received its complete initial list (I5); after that every
//! event bumps a change counter that the snapshot builder waits on, and names the object it
//! changed, so that a build looks at those objects alone (a relist names none: everything).

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::warn;

use super::model_cache::{ObjectKey, Objects, key_of};
use super::to_model::SERVICE_NAME_LABEL;
use crate::api::ProxyConfig;

/// Which namespaces Switchyard watches.
#[derive(Clone, Debug, PartialEq)]
pub enum Scope {
    All,
    Namespaces(Vec<String>),
}

impl Scope {
    pub fn apis<K>(&self, client: &Client) -> Vec<Api<K>>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        match self {
            Scope::All => vec![Api::all(client.clone())],
            Scope::Namespaces(list) => list
                .iter()
                .map(|ns| Api::namespaced(client.clone(), ns))
                .collect(),
        }
    }
}

/// One kind, reflected in one store per watched namespace.
pub struct Watched<K: Resource + 'static>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    stores: Vec<Store<K>>,
    /// Which objects changed since [`Watched::take_touched`] was last called (when tracked).
    touched: Option<Arc<Mutex<Touches<K>>>>,
    /// Shared by every clone: the reflectors stop when the last one is dropped.
    _reflectors: Arc<Vec<TaskGuard>>,
}

/// Another handle on the same stores: one watch, several readers (the snapshot builder and
/// the leader read the same ProxyConfigs).
impl<K: Resource + 'static> Clone for Watched<K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    fn clone(&self) -> Self {
        Self {
            stores: self.stores.clone(),
            touched: self.touched.clone(),
            _reflectors: self._reflectors.clone(),
        }
    }
}

/// The objects of one kind that watch events named since they were last taken.
#[derive(Debug, PartialEq)]
pub struct Touches<K> {
    /// A (re)list happened, or nothing was taken yet: any object may have changed.
    pub all: bool,
    pub keys: BTreeSet<ObjectKey>,
    /// The objects deleted, as they last were (the store no longer has them).
    pub deleted: Vec<K>,
}

impl<K> Default for Touches<K> {
    fn default() -> Self {
        Self {
            all: true,
            keys: BTreeSet::new(),
            deleted: Vec::new(),
        }
    }
}

impl<K: Resource + Clone> Touches<K> {
    /// Nothing changed.
    fn none() -> Self {
        Self {
            all: false,
            keys: BTreeSet::new(),
            deleted: Vec::new(),
        }
    }

    /// Something changed.
    pub fn any(&self) -> bool {
        self.all || !self.keys.is_empty()
    }

    fn note(&mut self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(object) => {
                self.keys.insert(key_of(object));
            }
            watcher::Event::Delete(object) => {
                self.keys.insert(key_of(object));
                self.deleted.push(object.clone());
            }
            // A relist replaces the store at InitDone, dropping what was deleted meanwhile
            // without an event for it.
            watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => {
                self.all = true;
            }
        }
    }
}

impl<K> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    /// Reflects every API (one per namespace) until this is dropped.
    pub fn start(
        apis: Vec<Api<K>>,
        config: watcher::Config,
        changes: &Arc<watch::Sender<u64>>,
    ) -> Self {
        Self::start_with(apis, config, changes, None)
    }

    /// [`Watched::start`], also keeping which objects changed for [`Watched::take_touched`].
    pub fn start_tracked(
        apis: Vec<Api<K>>,
        config: watcher::Config,
        changes: &Arc<watch::Sender<u64>>,
    ) -> Self {
        let touched = Arc::new(Mutex::new(Touches::<K>::default()));
        Self::start_with(apis, config, changes, Some(touched))
    }

    fn start_with(
        apis: Vec<Api<K>>,
        config: watcher::Config,
        changes: &Arc<watch::Sender<u64>>,
        touched: Option<Arc<Mutex<Touches<K>>>>,
    ) -> Self {
        let (stores, reflectors) = apis
            .into_iter()
            .map(|api| reflect(api, config.clone(), changes.clone(), touched.clone()))
            .unzip();
        Self {
            stores,
            touched,
            _reflectors: Arc::new(reflectors),
        }
    }

    pub fn state(&self) -> Vec<Arc<K>> {
        self.stores.iter().flat_map(|s| s.state()).collect()
    }

    /// How many objects the stores hold.
    pub fn count(&self) -> usize {
        self.stores.iter().map(Store::len).sum()
    }

    /// The object named `key` as it is now.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<K>> {
        let reference = ObjectRef::new(&key.1).within(&key.0);
        self.stores.iter().find_map(|s| s.get(&reference))
    }

    /// What changed since the last call (everything, when not tracked). Taken before the
    /// objects are read: an event that comes in between is in the next take, and looking
    /// at an object twice is harmless.
    pub fn take_touched(&self) -> Touches<K> {
        let Some(touched) = &self.touched else {
            return Touches::default();
        };
        let mut touched = touched.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *touched, Touches::none())
    }

    pub async fn ready(&self) -> bool {
        for store in &self.stores {
            if store.wait_until_ready().await.is_err() {
                return false;
            }
        }
        true
    }
}

/// Aborts a background task when dropped.
pub struct TaskGuard(tokio::task::JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts a reflector for `api` and returns its store; every event is noted in `touched`
/// and bumps `changes`. The reflector runs until the returned guard drops.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    changes: Arc<watch::Sender<u64>>,
    touched: Option<Arc<Mutex<Touches<K>>>>,
) -> (Store<K>, TaskGuard)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let (store, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, config)
            .backoff(WatchBackoff::default())
            .reflect(writer)
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => {
                    if let Some(touched) = &touched {
                        touched
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .note(&event);
                    }
                    changes.send_modify(|n| *n += 1);
                }
                Err(error) => warn!(%kind, %error, "watch failed; retrying with backoff"),
            }
        }
    });
    (store, TaskGuard(task))
}

/// How a failed watch retries: after 100 ms, doubling up to 1 s, where kube-runtime's
/// default goes up to 30 s. After an API server restart the stores (and rollouts) catch up
/// within about a second of the API being back; a request a second per watch is little
/// load on an API server that is down. A successful event starts it over.
#[derive(Clone, Debug)]
pub struct WatchBackoff {
    next: Duration,
}

impl WatchBackoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(1);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (now * 2).min(Self::MAX);
        Some(now)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// What every replica watches to build its snapshot.
pub struct Index {
    pub proxy_configs: Watched<ProxyConfig>,
    /// EndpointSlices that belong to a Service.
    pub endpoint_slices: Watched<EndpointSlice>,
    /// TLS Secrets (type kubernetes.io/tls only), content included: the first snapshot
    /// after a start needs hundreds of them, and one GET each would hold the gate (I5).
    pub tls_secrets: Watched<Secret>,
    changes: Arc<watch::Sender<u64>>,
}

impl Index {
    pub fn start(client: &Client, scope: &Scope) -> Self {
        let changes = Arc::new(watch::channel(0).0);
        let slices = watcher::Config::default().labels(SERVICE_NAME_LABEL);
        let secrets = watcher::Config::default().fields("type=kubernetes.io/tls");
        Self {
            proxy_configs: Watched::start_tracked(
                scope.apis(client),
                watcher::Config::default(),
                &changes,
            ),
            endpoint_slices: Watched::start_tracked(scope.apis(client), slices, &changes),
            tls_secrets: Watched::start_tracked(scope.apis(client), secrets, &changes),
            changes,
        }
    }

    /// Resolves once every store holds its complete initial list; false if a watcher died.
    pub async fn ready(&self) -> bool {
        self.proxy_configs.ready().await
            && self.endpoint_slices.ready().await
            && self.tls_secrets.ready().await
    }

    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

impl Objects for Index {
    fn proxy_config(&self, key: &ObjectKey) -> Option<Arc<ProxyConfig>> {
        self.proxy_configs.get(key)
    }

    fn endpoint_slice(&self, key: &ObjectKey) -> Option<Arc<EndpointSlice>> {
        self.endpoint_slices.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str) -> EndpointSlice {
        crate::k8s::fixtures::slice(name, "web")
    }

    #[test]
    fn events_name_their_objects_and_a_relist_names_everything() {
        let mut touches = Touches::none();
        touches.note(&watcher::Event::Apply(slice("a")));
        touches.note(&watcher::Event::Delete(slice("b")));
        touches.note(&watcher::Event::Apply(slice("a")));
        assert!(!touches.all);
        let keys: Vec<ObjectKey> = touches.keys.iter().cloned().collect();
        assert_eq!(
            keys,
            [
                ("shop".to_string(), "a".to_string()),
                ("shop".to_string(), "b".to_string())
            ]
        );
        // A relist (after a watch expired, say) may drop objects without a Delete.
        let deleted: Vec<_> = touches.deleted.iter().map(key_of).collect();
        assert_eq!(deleted, [("shop".to_string(), "b".to_string())]);
        touches.note(&watcher::Event::<EndpointSlice>::Init);
        assert!(touches.all);
        // Nothing taken yet: everything.
        assert!(Touches::<EndpointSlice>::default().all);
    }

    #[test]
    fn a_failed_watch_retries_within_a_second_and_starts_over_after_an_event() {
        use kube::runtime::utils::Backoff;
        let mut backoff = WatchBackoff::default();
        let waits: Vec<u64> = backoff
            .by_ref()
            .take(6)
            .map(|d| d.as_millis() as u64)
            .collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        backoff.reset();
        assert_eq!(backoff.next(), Some(Duration::from_millis(100)));
    }
}
