//! Batches of ProxyConfigs as every reader of the watch sees them: each member as a
//! ProxyConfig of its own, named as the unit's own would be.
//!
//! When many units roll out for the first time at once (a start with thousands of routes
//! and none served yet, a sync creating hundreds), the engine writes their ProxyConfigs of
//! one role as one object, a batch ([`ProxyConfigSpec::members`]), instead of one object
//! each: every step of every unit still happens (staged, verified on every Envoy, promoted,
//! verified, collected), only the writes are shared. Everything downstream of the watch
//! (the model, the departed ones, the rollouts' reads, the orphan collectors) sees members,
//! never batches, so nothing there knows batches exist.
//!
//! Which object stands for a name, on every replica alike (I6): the unit's own ProxyConfig
//! of that name if there is one (a unit's later generations are written as its own
//! objects, which so take over from the batch); else, of the batches holding a member of
//! that name (two only when a write's answer was lost and the unit was written again),
//! the member of the highest generation, then of the batch created last, then of the
//! batch whose name sorts first. A member that stands for nothing is hidden, and the
//! engine takes it out of its batch ([`BatchView::hidden`]).
//!
//! No I/O: fed the watch's events one by one, with the store they go to, it returns the
//! events the store takes instead.
//!
//! [`ProxyConfigSpec::members`]: crate::api::ProxyConfigSpec::members

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;

use super::model_cache::{ObjectKey, key_of};
use crate::api::ProxyConfig;
use crate::api::proxy_config::{BATCH_LABEL, BatchMember, IN_BATCH, PROMOTED_AT};

/// Whether `pc` is a batch.
pub fn is_batch(pc: &ProxyConfig) -> bool {
    pc.labels().contains_key(BATCH_LABEL)
}

/// The batch `pc` stands in for when it is a member shown in its unit's place.
pub fn batch_of(pc: &ProxyConfig) -> Option<&str> {
    pc.annotations().get(IN_BATCH).map(String::as_str)
}

/// Member `member` of `batch`, as a ProxyConfig of its own. Its resourceVersion names the
/// batch object (its name and uid): a member never changes inside a batch, so a rewrite of
/// the batch that takes others out leaves it as it was.
pub fn member_object(batch: &ProxyConfig, member: &BatchMember) -> ProxyConfig {
    let mut annotations = BTreeMap::from([(IN_BATCH.to_owned(), batch.name_any())]);
    if let Some(at) = &member.promoted_at {
        annotations.insert(PROMOTED_AT.to_owned(), at.clone());
    }
    let metadata = ObjectMeta {
        name: Some(member.name.clone()),
        namespace: batch.metadata.namespace.clone(),
        labels: (!member.labels.is_empty()).then(|| member.labels.clone()),
        annotations: Some(annotations),
        owner_references: member.owner.clone().map(|o| vec![o]),
        resource_version: Some(member_version(&batch.name_any(), batch.uid().as_deref())),
        creation_timestamp: batch.metadata.creation_timestamp.clone(),
        deletion_timestamp: batch.metadata.deletion_timestamp.clone(),
        ..ObjectMeta::default()
    };
    ProxyConfig {
        metadata,
        spec: member.spec.clone(),
    }
}

/// The resourceVersion of a member of `batch` (of uid `uid`): it names the batch, so that
/// a reader who knows only the version knows where to read the member.
fn member_version(batch: &str, uid: Option<&str>) -> String {
    format!("{MEMBER_VERSION}{batch}/{}", uid.unwrap_or_default())
}

const MEMBER_VERSION: &str = "batch/";

/// The batch a member's resourceVersion names (see [`member_object`]).
pub fn batch_of_version(version: &str) -> Option<&str> {
    let rest = version.strip_prefix(MEMBER_VERSION)?;
    rest.split_once('/').map(|(batch, _)| batch)
}

/// What the watch's stores hold of batches, for the engine.
#[derive(Clone, Default)]
pub struct BatchView {
    /// One state per store of the watch (a store per watched namespace, or one for all).
    states: Arc<Mutex<Vec<Arc<Mutex<State>>>>>,
}

impl BatchView {
    /// The expansion for one more store of the watch.
    pub fn expander(&self) -> Expander {
        let state = Arc::new(Mutex::new(State::default()));
        lock(&self.states).push(state.clone());
        Expander { state }
    }

    /// Every batch, with its members that stand for nothing (see the module's doc).
    pub fn hidden(&self) -> Vec<(ObjectKey, Vec<String>)> {
        let states = lock(&self.states).clone();
        let mut hidden = Vec::new();
        for state in states {
            let state = lock(&state);
            for (batch, names) in &state.batches {
                let names: Vec<String> = names
                    .iter()
                    .filter(|name| {
                        let key = (batch.0.clone(), (*name).clone());
                        state.shown(&key) != Some(batch.1.as_str())
                    })
                    .cloned()
                    .collect();
                hidden.push((batch.clone(), names));
            }
        }
        hidden.sort();
        hidden
    }
}

impl BatchView {
    /// The batches holding a member named `key`, shown or not.
    pub fn holding(&self, key: &ObjectKey) -> Vec<String> {
        let states = lock(&self.states).clone();
        let mut batches = Vec::new();
        for state in states {
            let state = lock(&state);
            if let Some(holders) = state.holders.get(key) {
                batches.extend(holders.keys().map(|r| r.2.clone()));
            }
        }
        batches
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The expansion of one store's events.
pub struct Expander {
    state: Arc<Mutex<State>>,
}

/// Which of the batches holding one name stands for it: the first in this order, the
/// member of the highest generation, then of the batch created last (a unit written
/// again after an answer was lost), then of the batch whose name sorts first.
type Rank = (Reverse<i64>, Reverse<i64>, String);

fn rank(batch: &ProxyConfig, member: &BatchMember) -> Rank {
    let created = batch.metadata.creation_timestamp.as_ref();
    (
        Reverse(member.spec.generation),
        Reverse(created.map_or(0, |t| t.0.as_second())),
        batch.name_any(),
    )
}

/// The entry of `batch` among `holders`.
fn entry_of<'a>(
    holders: &'a mut BTreeMap<Rank, Option<Arc<ProxyConfig>>>,
    batch: &str,
) -> Option<&'a mut Option<Arc<ProxyConfig>>> {
    holders
        .iter_mut()
        .find(|(r, _)| r.2 == batch)
        .map(|(_, v)| v)
}

#[derive(Default)]
struct State {
    /// The units' own ProxyConfigs: a member of one of these names stays hidden.
    own: HashSet<ObjectKey>,
    /// Every batch, by key: the names of its members.
    batches: BTreeMap<ObjectKey, BTreeSet<String>>,
    /// Member name (namespace, name) → the batches holding one, by batch name; a hidden
    /// member's object is kept here (to show it when what hid it goes), a shown one is
    /// the store's.
    holders: HashMap<ObjectKey, BTreeMap<Rank, Option<Arc<ProxyConfig>>>>,
    /// A relist under way: the state it builds, which replaces this one when it is done.
    relist: Option<Box<State>>,
}

impl State {
    /// The batch whose member stands for `key`, if a member does.
    fn shown(&self, key: &ObjectKey) -> Option<&str> {
        if self.own.contains(key) {
            return None;
        }
        let holders = self.holders.get(key)?;
        holders.keys().next().map(|r| r.2.as_str())
    }

    /// Takes a batch's members as they are now (none: it is gone); returns the names
    /// whose holders changed.
    fn batch(&mut self, batch: &ProxyConfig, present: bool) -> Vec<ObjectKey> {
        let key = key_of(batch);
        let name = key.1.clone();
        let members: BTreeMap<&str, &BatchMember> = match present {
            true => (batch.spec.members.iter())
                .map(|m| (m.name.as_str(), m))
                .collect(),
            false => BTreeMap::new(),
        };
        let before = match present {
            true => self
                .batches
                .insert(key.clone(), members.keys().map(|n| n.to_string()).collect()),
            false => self.batches.remove(&key),
        }
        .unwrap_or_default();
        let mut changed = Vec::new();
        for gone in before.iter().filter(|n| !members.contains_key(n.as_str())) {
            let member = (key.0.clone(), gone.clone());
            if let Some(holders) = self.holders.get_mut(&member) {
                holders.retain(|r, _| r.2 != name);
                if holders.is_empty() {
                    self.holders.remove(&member);
                }
            }
            changed.push(member);
        }
        for (member_name, member) in members {
            if before.contains(member_name) {
                continue;
            }
            let object = Arc::new(member_object(batch, member));
            let rank = rank(batch, member);
            let member = (key.0.clone(), member_name.to_owned());
            (self.holders.entry(member.clone()).or_default()).insert(rank, Some(object));
            changed.push(member);
        }
        changed
    }
}

impl Expander {
    /// The events `store` takes for `event` of the watch.
    pub fn expand(
        &mut self,
        event: Event<ProxyConfig>,
        store: &Store<ProxyConfig>,
    ) -> Vec<Event<ProxyConfig>> {
        let mut state = lock(&self.state);
        match event {
            Event::Apply(pc) if is_batch(&pc) => {
                let changed = state.batch(&pc, true);
                show(&mut state, changed, store)
            }
            Event::Delete(pc) if is_batch(&pc) => {
                let changed = state.batch(&pc, false);
                show(&mut state, changed, store)
            }
            Event::Apply(pc) => {
                let key = key_of(&pc);
                // A member shown under this name until now is hidden from here on: keep it.
                if let Some(shown) = store.get(&object_ref(&key))
                    && let Some(batch) = batch_of(&shown)
                    && let Some(holders) = state.holders.get_mut(&key)
                    && let Some(kept) = entry_of(holders, batch)
                {
                    *kept = Some(shown);
                }
                state.own.insert(key);
                vec![Event::Apply(pc)]
            }
            Event::Delete(pc) => {
                let key = key_of(&pc);
                state.own.remove(&key);
                let mut events = vec![Event::Delete(pc)];
                events.extend(show(&mut state, vec![key], store));
                events
            }
            Event::Init => {
                state.relist = Some(Box::default());
                vec![Event::Init]
            }
            Event::InitApply(pc) => {
                let relist = state.relist.get_or_insert_with(Box::default);
                if is_batch(&pc) {
                    relist.batch(&pc, true);
                    return Vec::new();
                }
                relist.own.insert(key_of(&pc));
                vec![Event::InitApply(pc)]
            }
            Event::InitDone => {
                let mut relist = *state.relist.take().unwrap_or_default();
                let mut events = Vec::new();
                for (key, holders) in &mut relist.holders {
                    if relist.own.contains(key) {
                        continue;
                    }
                    if let Some(object) = holders.values_mut().next().and_then(Option::take) {
                        events.push(Event::InitApply(object.as_ref().clone()));
                    }
                }
                events.push(Event::InitDone);
                *state = relist;
                events
            }
        }
    }
}

/// The events that show, for each of `keys`, what stands for it now (see the module's
/// doc), where the store holds something else.
fn show(
    state: &mut State,
    keys: Vec<ObjectKey>,
    store: &Store<ProxyConfig>,
) -> Vec<Event<ProxyConfig>> {
    let mut events = Vec::new();
    for key in keys {
        if state.own.contains(&key) {
            continue;
        }
        let stored = store.get(&object_ref(&key));
        let stored_batch = stored.as_deref().and_then(batch_of).map(str::to_owned);
        let Some(holders) = state.holders.get_mut(&key) else {
            // No batch holds it any more: the member shown goes.
            if let Some(stored) = stored.filter(|_| stored_batch.is_some()) {
                events.push(Event::Delete(stored.as_ref().clone()));
            }
            continue;
        };
        let Some(first) = holders.keys().next().cloned() else {
            continue;
        };
        if stored_batch.as_deref() == Some(first.2.as_str()) {
            continue;
        }
        // The member shown until now (of another batch) is hidden from here on: keep it.
        if let (Some(stored), Some(batch)) = (&stored, &stored_batch)
            && let Some(slot) = entry_of(holders, batch)
        {
            *slot = Some(stored.clone());
        }
        if let Some(object) = holders.get_mut(&first).and_then(Option::take) {
            events.push(Event::Apply(object.as_ref().clone()));
        }
    }
    events
}

fn object_ref((namespace, name): &ObjectKey) -> ObjectRef<ProxyConfig> {
    ObjectRef::new(name).within(namespace)
}

#[cfg(test)]
mod tests;
