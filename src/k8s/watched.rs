//! One watch of a kind, read by everyone who needs it.
//!
//! The API server is asked once per kind and process (issue: three watches of the same
//! Services cost three lists at every start and three event streams after): a [`Watched`]
//! reflects the kind into a store per watched namespace, and fans every event out to its
//! readers — change counters that wake a loop ([`Watched::notify`]), streams of the objects
//! events name, for a controller's triggers ([`Watched::objects`]), and [`View`]s, the
//! subset one reader cares about, kept in step so that reading it costs that subset, not
//! the whole kind.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tracing::warn;

use super::model_cache::{ObjectKey, key_of};

/// Which objects of a kind a reader cares about.
pub type Filter<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;

/// What one store of a watch takes for each of its events, given the store as it is: the
/// ProxyConfig watch shows each member of a batch as an object of its own (`batches`).
pub type Expand<K> = Box<dyn FnMut(watcher::Event<K>, &Store<K>) -> Vec<watcher::Event<K>> + Send>;

/// One kind, reflected in one store per watched namespace.
pub struct Watched<K: Resource + 'static>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    stores: Vec<Store<K>>,
    /// Which objects changed since [`Watched::take_touched`] was last called (when tracked).
    touched: Option<Arc<Mutex<Touches<K>>>>,
    /// Everyone an event is handed to.
    readers: Arc<Readers<K>>,
    /// Shared by every clone: the reflectors stop when the last one is dropped.
    _reflectors: Arc<Vec<TaskGuard>>,
}

/// Another handle on the same stores: one watch, several readers.
impl<K: Resource + 'static> Clone for Watched<K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    fn clone(&self) -> Self {
        Self {
            stores: self.stores.clone(),
            touched: self.touched.clone(),
            readers: self.readers.clone(),
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
    /// Reflects every API (one per namespace) until the last handle is dropped.
    pub fn start(apis: Vec<Api<K>>, config: watcher::Config) -> Self {
        Self::start_with(apis, config, None, None)
    }

    /// [`Watched::start`], also keeping which objects changed for [`Watched::take_touched`].
    /// Only one reader may take them: the snapshot builder.
    pub fn start_tracked(apis: Vec<Api<K>>, config: watcher::Config) -> Self {
        let touched = Arc::new(Mutex::new(Touches::<K>::default()));
        Self::start_with(apis, config, Some(touched), None)
    }

    /// [`Watched::start_tracked`], each store taking what `expand` (one per store) makes
    /// of its events: every reader sees what the store holds.
    pub fn start_tracked_expanded(
        apis: Vec<Api<K>>,
        config: watcher::Config,
        expand: &dyn Fn() -> Expand<K>,
    ) -> Self {
        let touched = Arc::new(Mutex::new(Touches::<K>::default()));
        Self::start_with(apis, config, Some(touched), Some(expand))
    }

    fn start_with(
        apis: Vec<Api<K>>,
        config: watcher::Config,
        touched: Option<Arc<Mutex<Touches<K>>>>,
        expand: Option<&dyn Fn() -> Expand<K>>,
    ) -> Self {
        let readers = Arc::new(Readers::default());
        let (stores, reflectors) = apis
            .into_iter()
            .enumerate()
            .map(|(i, api)| {
                let expand = expand.map(|make| make());
                reflect(
                    i,
                    api,
                    config.clone(),
                    readers.clone(),
                    touched.clone(),
                    expand,
                )
            })
            .unzip();
        Self {
            stores,
            touched,
            readers,
            _reflectors: Arc::new(reflectors),
        }
    }

    /// For tests: one store holding `objects`, listed once, with no watch behind it.
    #[cfg(test)]
    pub(crate) fn holding(objects: Vec<K>) -> Self {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for object in objects {
            writer.apply_watcher_event(&watcher::Event::InitApply(object));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        Self {
            stores: vec![store],
            touched: None,
            readers: Arc::new(Readers::default()),
            _reflectors: Arc::new(Vec::new()),
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

    /// Bumps `changes` at every event of this watch, for as long as `changes` lives.
    pub fn notify(&self, changes: &Arc<watch::Sender<u64>>) {
        self.readers.add(Reader::Counter {
            changes: Arc::downgrade(changes),
            filter: None,
            echo: None,
        });
    }

    /// Bumps `changes` at every event about an object `filter` passes (and at every
    /// relist, which may have dropped one), for as long as `changes` lives.
    pub fn notify_if(&self, changes: &Arc<watch::Sender<u64>>, filter: Filter<K>) {
        self.readers.add(Reader::Counter {
            changes: Arc::downgrade(changes),
            filter: Some(filter),
            echo: None,
        });
    }

    /// [`Watched::notify_if`] (every event when `filter` is None), but for an object
    /// written (created or updated) as `echo` says the reader's own write left it: the
    /// watch's echo of what the reader already knows. A deletion and a relist always count.
    pub fn notify_unless_echo(
        &self,
        changes: &Arc<watch::Sender<u64>>,
        filter: Option<Filter<K>>,
        echo: Filter<K>,
    ) {
        self.readers.add(Reader::Counter {
            changes: Arc::downgrade(changes),
            filter,
            echo: Some(echo),
        });
    }

    /// Every object an event names from now on — applied, deleted, or listed again — until
    /// the stream is dropped: what a controller's `watches` would give its mapper, without
    /// a watch of its own. Unbounded: a controller takes each at once.
    pub fn objects(&self) -> BoxStream<'static, Arc<K>> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.readers.add(Reader::Objects(sender));
        futures::stream::unfold(receiver, |mut receiver| async move {
            let object = receiver.recv().await?;
            Some((object, receiver))
        })
        .boxed()
    }

    /// The objects `filter` passes, kept in step with the watch.
    pub fn view(&self, filter: Filter<K>) -> View<K> {
        let state = Arc::new(ViewState {
            filter,
            maps: Mutex::new(vec![BTreeMap::new(); self.stores.len()]),
        });
        // Registered before it is filled, and filled under its own lock, which every
        // delivery takes: an event either is in the store when it is filled, or is
        // delivered after (an object applied twice is applied once).
        self.readers.add(Reader::View(Arc::downgrade(&state)));
        {
            let mut maps = state.lock();
            for (i, store) in self.stores.iter().enumerate() {
                maps[i] = state.matching(store);
            }
        }
        View {
            state,
            watched: self.clone(),
        }
    }
}

/// The part of a watched kind one reader cares about (the fleet's EndpointSlices among
/// every Service's, say).
pub struct View<K: Resource + 'static>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    state: Arc<ViewState<K>>,
    /// Keeps the watch alive, and knows when it has listed.
    watched: Watched<K>,
}

impl<K: Resource + 'static> Clone for View<K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            watched: self.watched.clone(),
        }
    }
}

impl<K> View<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    pub fn state(&self) -> Vec<Arc<K>> {
        self.state
            .lock()
            .iter()
            .flat_map(|map| map.values().cloned())
            .collect()
    }

    pub async fn ready(&self) -> bool {
        self.watched.ready().await
    }

    /// Bumps `changes` at every event about an object of this view.
    pub fn notify(&self, changes: &Arc<watch::Sender<u64>>) {
        self.watched.notify_if(changes, self.state.filter.clone());
    }
}

struct ViewState<K: Resource + 'static>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    filter: Filter<K>,
    /// One map per store of the watch, as the stores are per namespace.
    maps: Mutex<Vec<BTreeMap<ObjectKey, Arc<K>>>>,
}

impl<K> ViewState<K>
where
    K: Resource + Clone,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn lock(&self) -> MutexGuard<'_, Vec<BTreeMap<ObjectKey, Arc<K>>>> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn matching(&self, store: &Store<K>) -> BTreeMap<ObjectKey, Arc<K>> {
        store
            .state()
            .into_iter()
            .filter(|o| (self.filter)(o))
            .map(|o| (key_of(o.as_ref()), o))
            .collect()
    }

    /// Follows an event of store `i`, which the store has already taken.
    fn follow(&self, i: usize, store: &Store<K>, event: &watcher::Event<K>) {
        let mut maps = self.lock();
        let Some(map) = maps.get_mut(i) else { return };
        match event {
            watcher::Event::Apply(object) => {
                if (self.filter)(object) {
                    map.insert(key_of(object), Arc::new(object.clone()));
                } else {
                    // It may have stopped matching (a label taken off).
                    map.remove(&key_of(object));
                }
            }
            watcher::Event::Delete(object) => {
                map.remove(&key_of(object));
            }
            // The store keeps what it had until the relist is complete, then holds the new
            // list whole: so does the view.
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
            watcher::Event::InitDone => *map = self.matching(store),
        }
    }
}

/// Whom a watch's events go to.
struct Readers<K: Resource + 'static>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    readers: Mutex<Vec<Reader<K>>>,
}

impl<K: Resource + 'static> Default for Readers<K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    fn default() -> Self {
        Self {
            readers: Mutex::new(Vec::new()),
        }
    }
}

enum Reader<K: Resource + 'static>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    Counter {
        changes: Weak<watch::Sender<u64>>,
        filter: Option<Filter<K>>,
        /// Writes that are the reader's own, heard back: not a change to it.
        echo: Option<Filter<K>>,
    },
    Objects(mpsc::UnboundedSender<Arc<K>>),
    View(Weak<ViewState<K>>),
}

impl<K> Readers<K>
where
    K: Resource + Clone,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn lock(&self) -> MutexGuard<'_, Vec<Reader<K>>> {
        self.readers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, reader: Reader<K>) {
        self.lock().push(reader);
    }

    /// Hands an event of store `i` (already in the store) to every reader still there,
    /// and forgets those gone.
    fn deliver(&self, i: usize, store: &Store<K>, event: &watcher::Event<K>) {
        let object = match event {
            watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => {
                Some(o)
            }
            watcher::Event::Init | watcher::Event::InitDone => None,
        };
        self.lock().retain(|reader| match reader {
            Reader::Counter {
                changes,
                filter,
                echo,
            } => {
                let Some(changes) = changes.upgrade() else {
                    return false;
                };
                let concerned = match (filter, event) {
                    (Some(filter), watcher::Event::Apply(o) | watcher::Event::Delete(o)) => {
                        filter(o)
                    }
                    // A relist may drop anything: every counter hears each of its steps,
                    // without asking its filter (one that reads another store, as the
                    // Gateway controller's over Services scans the HTTPRoutes, would run
                    // once per object listed to no end).
                    _ => true,
                };
                let echoed = match (echo, event) {
                    (Some(echo), watcher::Event::Apply(object)) => echo(object),
                    _ => false,
                };
                if concerned && !echoed {
                    changes.send_modify(|n| *n += 1);
                }
                true
            }
            Reader::Objects(sender) => match object {
                Some(object) => sender.send(Arc::new(object.clone())).is_ok(),
                None => !sender.is_closed(),
            },
            Reader::View(state) => {
                let Some(state) = state.upgrade() else {
                    return false;
                };
                state.follow(i, store, event);
                true
            }
        });
    }
}

/// Aborts a background task when dropped.
pub struct TaskGuard(tokio::task::JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts a reflector for `api` (the watch's store `i`) and returns its store; every event
/// is noted in `touched` and handed to the readers once the store has it. The reflector
/// runs until the returned guard drops.
fn reflect<K>(
    i: usize,
    api: Api<K>,
    config: watcher::Config,
    readers: Arc<Readers<K>>,
    touched: Option<Arc<Mutex<Touches<K>>>>,
    expand: Option<Expand<K>>,
) -> (Store<K>, TaskGuard)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let (store, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let reader = store.clone();
    let task = tokio::spawn(async move {
        let events = watcher(api, config)
            .backoff(WatchBackoff::default())
            .modify(forget_bookkeeping);
        let events = match expand {
            // The store takes each event the expansion makes before the expansion sees the
            // next one of the watch.
            Some(mut expand) => {
                let store = reader.clone();
                let expanded = events.flat_map(move |event| {
                    let events: Vec<_> = match event {
                        Ok(event) => expand(event, &store).into_iter().map(Ok).collect(),
                        Err(error) => vec![Err(error)],
                    };
                    futures::stream::iter(events)
                });
                expanded.boxed()
            }
            None => events.boxed(),
        };
        let mut events = events.reflect(writer).boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => {
                    if let Some(touched) = &touched {
                        touched
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .note(&event);
                    }
                    readers.deliver(i, &reader, &event);
                }
                Err(error) => warn!(%kind, %error, "watch failed; retrying with backoff"),
            }
        }
    });
    (store, TaskGuard(task))
}

/// Drops what the API server keeps for its own bookkeeping and nothing here reads before
/// an object enters a store: `managedFields` (server-side apply's record of which manager
/// set which field, often as large as the spec) and kubectl's last-applied annotation (a
/// copy of the whole object as a client-side apply last sent it). At 10k routes the stores
/// hold ~40k objects; every reader sees them without these.
pub fn forget_bookkeeping<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = &mut meta.annotations
        && annotations.remove(LAST_APPLIED).is_some()
        && annotations.is_empty()
    {
        meta.annotations = None;
    }
}

/// kubectl's client-side apply record (Argo CD applies this way by default).
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

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

#[cfg(test)]
mod tests;
