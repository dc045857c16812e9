//! Writes the status of every object Switchyard reports on — TrafficRoutes, GatewayClasses,
//! Gateways and their listeners, HTTPRoutes' parents — on its own task, rate-limited.
//! Front-ends hand it the status they want; the latest one per object wins, a status the
//! object already shows is never written (no churn, and a restarted leader rewrites only
//! what changed), and nothing else ever waits on it: slow or throttled status writes
//! cannot delay xDS (I5), nor a rollout's next step.
//!
//! Statuses wait in two queues, each first come, first written: progress first (a new
//! generation; a condition a user waits for — Accepted, Ready, Programmed, Served —
//! changed), then rejections and details (messages, phase, Envoy counts, a drain ending).
//! Hundreds of bad routes, or thousands of drains ending together, then cannot hold back
//! the Ready of a route every Envoy already serves (I9).
//!
//! Every write is conditional on the object as the front-end read it (its
//! resourceVersion): a status decided on an object that has changed since is refused
//! (409) and dropped, and the change that made it stale brings the front-end back with a
//! newer one. The writer's own earlier writes do not count as such a change: a store may
//! not have seen them yet, and the resourceVersion they left is used instead. Such a
//! status kept the lastTransitionTimes of the status it read, older than that write: its
//! conditions take the write's instead (a condition whose status the write already had
//! keeps the write's time; one that changed since is new).
//!
//! Several writes are in flight at once, one per object at most: under load one write
//! takes a few hundred milliseconds, and one at a time held the writer far below its QPS.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client, Resource};
use prometheus_client::metrics::gauge::Gauge;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tracing::{debug, warn};
use xxhash_rust::xxh3::{xxh3_64, xxh3_128};

use super::rate_limit::TokenBucket;

pub const FIELD_MANAGER: &str = "switchyard-status";

/// An object: its kind, namespace (empty for a cluster-scoped one) and name.
type Key = (String, String, String);

/// Status writes in flight at most. One at a time, under load (10k routes rolling out, a
/// write taking ~200 ms), wrote 4.4 statuses a second where 20 were allowed.
const WRITES_IN_FLIGHT: usize = 8;

/// The resourceVersions this writer's own writes left, remembered per object.
const OWN_WRITES_KEPT: usize = 8;

/// A kind whose status Switchyard writes, and how.
#[derive(Debug)]
pub struct StatusKind {
    resource: ApiResource,
    namespaced: bool,
    write: Write,
    /// The condition types whose change a user waits for: written first.
    progress: &'static [&'static str],
}

/// How a status is written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Write {
    /// Server-side apply under [`FIELD_MANAGER`]: a field no longer set is removed. The
    /// object shows a status only when it holds exactly that.
    Apply,
    /// A merge patch of `status` (its lists replaced whole): other writers' fields stay.
    /// The object shows a status when it holds every field of it as it is.
    Merge,
}

impl StatusKind {
    /// A kind that lives in namespaces.
    pub fn namespaced<K>(write: Write, progress: &'static [&'static str]) -> Self
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        Self {
            resource: ApiResource::erase::<K>(&()),
            namespaced: true,
            write,
            progress,
        }
    }

    /// A cluster-scoped kind.
    pub fn cluster<K>(write: Write, progress: &'static [&'static str]) -> Self
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>,
    {
        Self {
            resource: ApiResource::erase::<K>(&()),
            namespaced: false,
            write,
            progress,
        }
    }
}

/// A status a front-end wants an object to have.
pub struct StatusUpdate {
    pub kind: Arc<StatusKind>,
    /// Empty for a cluster-scoped object.
    pub namespace: String,
    pub name: String,
    pub status: Value,
    /// The status the object showed when it was read.
    pub shown: Option<Value>,
    /// The object's resourceVersion when it was read: the write is conditional on it.
    /// None (an object not read) writes unconditionally, with the times as given.
    pub read: Option<String>,
}

impl StatusUpdate {
    fn key(&self) -> Key {
        (
            self.kind.resource.kind.clone(),
            self.namespace.clone(),
            self.name.clone(),
        )
    }
}

/// A status waiting to be written, or in flight. It waits as JSON text: while a cold start's
/// thousands of statuses go out at the QPS they all wait here, and a tree of `Value`s takes
/// several times the memory of its text.
#[derive(Clone, Debug)]
struct Wanted {
    kind: Arc<StatusKind>,
    status: Box<str>,
    summary: Summary,
    read: Option<String>,
}

impl Wanted {
    fn new(kind: Arc<StatusKind>, status: &Value, read: Option<String>) -> Self {
        let text = status.to_string();
        Self {
            summary: kind.summary(&text, status),
            kind,
            status: text.into(),
            read,
        }
    }

    /// The lastTransitionTime of each of its conditions.
    fn transitions(&self) -> Box<[Transition]> {
        let mut status: Value = serde_json::from_str(&self.status).unwrap_or_default();
        let mut out = Vec::new();
        each_condition(&mut status, "", &mut |at, condition| {
            if let Some(time) = condition.get("lastTransitionTime").and_then(Value::as_str) {
                out.push(Transition {
                    condition: condition_digest(at, condition),
                    time: time.into(),
                });
            }
        });
        out.into_boxed_slice()
    }

    /// The same status with the lastTransitionTimes it has after `last`, the rule of
    /// [`condition_of`] with `last` as the status before: a condition `last` had at the
    /// same place with the same status keeps its time. Any other changed after `last` was
    /// written: it keeps its own time if that is not older (the front-end's moment of the
    /// change), else it is new now.
    fn transitions_after(self, last: &LastWrite) -> Self {
        let Ok(mut status) = serde_json::from_str::<Value>(&self.status) else {
            return self;
        };
        let now = Timestamp::now();
        each_condition(&mut status, "", &mut |at, condition| {
            let Some(own) = condition.get("lastTransitionTime") else {
                return;
            };
            let digest = condition_digest(at, condition);
            let time = match (last.transitions.iter()).find(|t| t.condition == digest) {
                Some(kept) => Value::from(&*kept.time),
                None if (own.as_str().and_then(|t| t.parse::<Timestamp>().ok()))
                    .is_some_and(|t| t.as_second() >= last.at.as_second()) =>
                {
                    return;
                }
                None => serde_json::to_value(Time(now)).unwrap_or_default(),
            };
            condition.insert("lastTransitionTime".into(), time);
        });
        Self::new(self.kind, &status, self.read)
    }
}

/// A condition at `at` of a status, by its type and status.
fn condition_digest(at: &str, condition: &serde_json::Map<String, Value>) -> u64 {
    let text = |k: &str| condition.get(k).and_then(Value::as_str).unwrap_or_default();
    xxh3_64(format!("{at}\n{}\n{}", text("type"), text("status")).as_bytes())
}

/// Calls `f` with every condition of a status, wherever it is (the status's own, a
/// listener's, a parent's), and its place: a listener, a route's parent or a policy's
/// ancestor by its name or reference, not its index (a parent gone moves the others up).
fn each_condition(
    value: &mut Value,
    at: &str,
    f: &mut dyn FnMut(&str, &mut serde_json::Map<String, Value>),
) {
    match value {
        Value::Object(fields) => {
            for (name, field) in fields.iter_mut() {
                let here = format!("{at}/{name}");
                if name == "conditions"
                    && let Value::Array(conditions) = field
                {
                    for condition in conditions.iter_mut().filter_map(Value::as_object_mut) {
                        f(&here, condition);
                    }
                } else {
                    each_condition(field, &here, f);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                each_condition(item, &format!("{at}/{}", identity(item, i)), f);
            }
        }
        _ => {}
    }
}

/// What tells the `i`th item of a list from the others: a route's parent or a policy's
/// ancestor by its reference and controller (two controllers may report on one Gateway),
/// a listener by its name, anything else by its index.
fn identity(item: &Value, i: usize) -> String {
    let text = |field: &str| item.get(field).map(Value::to_string);
    match (
        text("parentRef").or_else(|| text("ancestorRef")),
        text("name"),
    ) {
        (Some(reference), _) => reference + &text("controllerName").unwrap_or_default(),
        (None, Some(name)) => name,
        (None, None) => i.to_string(),
    }
}

/// What the writer remembers of the last status it wrote per object, for as long as it
/// runs: its summary and its conditions' lastTransitionTimes (at 10k routes the statuses
/// themselves took tens of MiB).
#[derive(Debug)]
struct LastWrite {
    summary: Summary,
    transitions: Box<[Transition]>,
    /// When the write was answered.
    at: Timestamp,
}

/// A condition of a status written: where it is, its type and its status, digested, and
/// its lastTransitionTime as written.
#[derive(Debug)]
struct Transition {
    condition: u64,
    time: Box<str>,
}

/// A status summarized: what a status waiting or shown is compared with the last one
/// written by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Summary {
    /// The status's JSON text, digested: object keys are sorted, so equal statuses have
    /// equal texts.
    whole: u128,
    /// Its observedGeneration and progress conditions, digested: what decides whether
    /// another status is progress over it.
    progress: u128,
    /// It rejects the object (`Accepted` is `False`): never progress.
    rejected: bool,
}

/// Hands statuses to the writer task; the task stops when the last handle drops.
#[derive(Clone)]
pub struct StatusWriter {
    shared: Arc<Shared>,
    _task: Arc<AbortOnDrop>,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Notify,
    /// How many statuses wait or are being written (`switchyard_status_writes_pending`).
    counted: Gauge,
}

impl Drop for Shared {
    /// The writer is gone (leadership lost): nothing is pending here any more.
    fn drop(&mut self) {
        self.counted.set(0);
    }
}

/// The statuses not written yet: the urgent ones first, each queue in arrival order; an
/// object has at most one, the latest, and keeps its place when it is replaced. With them,
/// what is remembered of the last status written per object (and the resourceVersions the
/// writes left), and the objects whose write is in flight.
#[derive(Default)]
struct Pending {
    urgent: Queue,
    later: Queue,
    written: HashMap<Key, LastWrite>,
    /// Per object, the resourceVersion each of this writer's last writes left, by the one
    /// it was made on.
    own: HashMap<Key, VecDeque<(String, String)>>,
    /// The objects whose write is in flight, and the status each write asks for.
    in_flight: HashMap<Key, Value>,
    /// A status taken out of its queue, waiting for the QPS.
    taken: bool,
}

#[derive(Default)]
struct Queue {
    order: VecDeque<Key>,
    statuses: HashMap<Key, Wanted>,
}

impl Queue {
    fn put(&mut self, key: Key, wanted: Wanted) {
        if self.statuses.insert(key.clone(), wanted).is_none() {
            self.order.push_back(key);
        }
    }

    /// The first status whose object is not `busy`.
    fn pop_except(&mut self, busy: &HashMap<Key, Value>) -> Option<(Key, Wanted)> {
        let mut i = 0;
        while let Some(key) = self.order.get(i) {
            if !self.statuses.contains_key(key) {
                // Replaced and taken out: a stale place.
                self.order.remove(i);
            } else if busy.contains_key(key) {
                i += 1;
            } else {
                let key = self.order.remove(i)?;
                let wanted = self.statuses.remove(&key)?;
                return Some((key, wanted));
            }
        }
        None
    }

    fn remove(&mut self, key: &Key) -> Option<Wanted> {
        // Its place in `order` is skipped when reached.
        self.statuses.remove(key)
    }
}

impl Pending {
    /// The status `update` wants. Nothing to write when the object shows it and this
    /// writer wrote nothing else since (the object may lag behind our own writes).
    /// Progress goes first, a rejection or a detail can wait; an object already waiting in
    /// the urgent queue stays there.
    fn put(&mut self, update: StatusUpdate) {
        let key = update.key();
        let StatusUpdate {
            kind,
            status,
            shown,
            read,
            ..
        } = update;
        let wanted = Wanted::new(kind, &status, read);
        let written = self.written.get(&key).map(|w| w.summary);
        let shows = shown
            .as_ref()
            .is_some_and(|s| wanted.kind.shows(s, &status));
        if shows && written.is_none_or(|w| w.whole == wanted.summary.whole) {
            self.remove(&key);
            return;
        }
        let before = written.or_else(|| shown.as_ref().map(|s| wanted.kind.summary_of(s)));
        let urgent = wanted.kind.is_progress(before.as_ref(), &wanted.summary);
        self.enqueue(key, wanted, urgent);
    }

    fn enqueue(&mut self, key: Key, wanted: Wanted, urgent: bool) {
        if self.urgent.statuses.contains_key(&key) || urgent {
            self.later.remove(&key);
            self.urgent.put(key, wanted);
        } else {
            self.later.put(key, wanted);
        }
    }

    /// The next status to write, of an object with no write in flight (see
    /// [`Pending::ready`]).
    fn pop(&mut self) -> Option<(Key, Wanted)> {
        loop {
            let (key, wanted) = self
                .urgent
                .pop_except(&self.in_flight)
                .or_else(|| self.later.pop_except(&self.in_flight))?;
            if let Some(wanted) = self.ready(&key, wanted) {
                return Some((key, wanted));
            }
        }
    }

    /// `wanted` as it is to be written: conditional on the object as read, or as this
    /// writer's own writes left it since, and then with the lastTransitionTimes the last
    /// of them gives (the read's were older). None when that is what this writer wrote
    /// last.
    fn ready(&self, key: &Key, mut wanted: Wanted) -> Option<Wanted> {
        let read = self.after_own_writes(key, wanted.read.clone());
        let last = self.written.get(key);
        if read != wanted.read
            && let Some(last) = last
        {
            wanted = wanted.transitions_after(last);
        }
        wanted.read = read;
        (last.map(|l| l.summary) != Some(wanted.summary)).then_some(wanted)
    }

    /// `read`, or the resourceVersion this writer's own writes made of it since.
    fn after_own_writes(&self, key: &Key, read: Option<String>) -> Option<String> {
        let mut version = read?;
        if let Some(own) = self.own.get(key) {
            // Each step follows one write; there are at most OWN_WRITES_KEPT of them.
            for _ in 0..own.len() {
                match own.iter().find(|(before, _)| *before == version) {
                    Some((_, after)) => version = after.clone(),
                    None => break,
                }
            }
        }
        Some(version)
    }

    fn remove(&mut self, key: &Key) -> Option<Wanted> {
        self.urgent.remove(key).or_else(|| self.later.remove(key))
    }

    /// Whether `object` (as a watch event brings it) is as one of this writer's own writes
    /// left it: at the resourceVersion a write left, or, before the write is answered,
    /// showing what it asks for at the generation that status observed (a change to the
    /// spec since shows a newer generation).
    fn is_echo(&self, kind: &StatusKind, object: &Value) -> bool {
        let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str);
        let key = (
            kind.resource.kind.clone(),
            text("/metadata/namespace").unwrap_or_default().to_owned(),
            text("/metadata/name").unwrap_or_default().to_owned(),
        );
        let version = text("/metadata/resourceVersion");
        let left = self
            .own
            .get(&key)
            .is_some_and(|own| own.iter().any(|(_, after)| Some(after.as_str()) == version));
        let status = object.get("status");
        let generation = object
            .pointer("/metadata/generation")
            .and_then(Value::as_i64);
        let sent = self.in_flight.get(&key).is_some_and(|sent| {
            status.is_some_and(|shown| kind.shows(shown, sent))
                && generation.is_some()
                && generation == observed_generation(sent)
        });
        left || sent
    }

    fn contains(&self, key: &Key) -> bool {
        self.urgent.statuses.contains_key(key) || self.later.statuses.contains_key(key)
    }

    fn wrote(&mut self, key: Key, wanted: Wanted, versions: Option<(String, String)>) {
        if let Some(step) = versions {
            let own = self.own.entry(key.clone()).or_default();
            own.push_back(step);
            if own.len() > OWN_WRITES_KEPT {
                own.pop_front();
            }
        }
        let last = LastWrite {
            summary: wanted.summary,
            transitions: wanted.transitions(),
            at: Timestamp::now(),
        };
        self.written.insert(key, last);
    }
}

impl StatusKind {
    /// Whether the object, showing `shown`, already has `status`.
    fn shows(&self, shown: &Value, status: &Value) -> bool {
        match self.write {
            Write::Apply => shown == status,
            Write::Merge => holds(shown, status),
        }
    }

    /// Whether `status` tells what a user waits for, compared with the status stored: a
    /// new generation, or a progress condition changed (status, reason or generation),
    /// and the object is not rejected (an Accepted that is False). Messages, the phase,
    /// Envoy counts and other conditions are details.
    fn is_progress(&self, stored: Option<&Summary>, status: &Summary) -> bool {
        let changed = stored.is_none_or(|stored| stored.progress != status.progress);
        !status.rejected && changed
    }

    /// `status`, summarized; `text` is its JSON text.
    fn summary(&self, text: &str, status: &Value) -> Summary {
        let conditions = self.progress_conditions(status);
        let rejected =
            (conditions.iter()).any(|((_, type_), (s, _, _))| type_ == "Accepted" && s == "False");
        let progress = format!("{:?}", (status.get("observedGeneration"), conditions));
        Summary {
            whole: xxh3_128(text.as_bytes()),
            progress: xxh3_128(progress.as_bytes()),
            rejected,
        }
    }

    fn summary_of(&self, status: &Value) -> Summary {
        self.summary(&status.to_string(), status)
    }

    /// Every condition of a progress type in `status`, wherever it is (the status's own,
    /// a listener's, a parent's), by its place and type: (status, reason, generation).
    fn progress_conditions(&self, status: &Value) -> Vec<((String, String), Conditional)> {
        let mut out = Vec::new();
        collect_conditions(status, "", self.progress, &mut out);
        out.sort();
        out
    }
}

type Conditional = (String, String, Option<i64>);

fn collect_conditions(
    value: &Value,
    at: &str,
    types: &[&str],
    out: &mut Vec<((String, String), Conditional)>,
) {
    match value {
        Value::Object(fields) => {
            for (name, field) in fields {
                let here = format!("{at}/{name}");
                if name == "conditions"
                    && let Value::Array(conditions) = field
                {
                    for c in conditions {
                        let text = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default();
                        if types.contains(&text("type")) {
                            out.push((
                                (here.clone(), text("type").to_string()),
                                (
                                    text("status").to_string(),
                                    text("reason").to_string(),
                                    c.get("observedGeneration").and_then(Value::as_i64),
                                ),
                            ));
                        }
                    }
                } else {
                    collect_conditions(field, &here, types, out);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                collect_conditions(item, &format!("{at}/{i}"), types, out);
            }
        }
        _ => {}
    }
}

/// Whether every field of `wanted` is in `held` as it is (the API server may hold more,
/// such as fields of other writers, or defaults).
pub fn holds(held: &Value, wanted: &Value) -> bool {
    match (held, wanted) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| holds(hv, v)) || v.is_null()),
        _ => held == wanted,
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl StatusWriter {
    /// Starts the writer task; at most `qps` writes per second. `pending` counts the
    /// statuses waiting or being written.
    pub fn start(client: Client, qps: f64, pending: Gauge) -> Self {
        let shared = Arc::new(Shared {
            pending: Mutex::default(),
            wake: Notify::new(),
            counted: pending,
        });
        let task = tokio::spawn(shared.clone().run(client, qps));
        Self {
            shared,
            _task: Arc::new(AbortOnDrop(task)),
        }
    }

    /// Asks for this status to be written (replacing any not yet written), unless the
    /// object already shows it.
    pub fn set(&self, update: StatusUpdate) {
        let mut pending = self.shared.lock();
        pending.put(update);
        self.shared.count(&pending);
        drop(pending);
        self.shared.wake.notify_one();
    }

    /// Whether an object of `kind` (serialized, as a watch event brings it) is only one of
    /// this writer's own status writes heard back: nothing its front-end has to look at
    /// again. Someone else's status, and any change to the spec, is not.
    pub fn is_echo(&self, kind: &StatusKind, object: &Value) -> bool {
        self.shared.lock().is_echo(kind, object)
    }
}

/// The newest generation a status says it observed (its conditions', wherever they are).
fn observed_generation(status: &Value) -> Option<i64> {
    match status {
        Value::Object(fields) => fields
            .iter()
            .filter_map(|(name, field)| match name.as_str() {
                "observedGeneration" => field.as_i64(),
                _ => observed_generation(field),
            })
            .max(),
        Value::Array(items) => items.iter().filter_map(observed_generation).max(),
        _ => None,
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, pending: &Pending) {
        let waiting = pending.urgent.statuses.len() + pending.later.statuses.len();
        let count = waiting + usize::from(pending.taken) + pending.in_flight.len();
        self.counted.set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    async fn run(self: Arc<Self>, client: Client, qps: f64) {
        // Up to one second's worth of writes at once: a lone rollout's few writes go out
        // at once, a burst of thousands is held to `qps`.
        let mut limit = TokenBucket::new(qps, qps);
        let mut writes = FuturesUnordered::new();
        loop {
            let next = if writes.len() < WRITES_IN_FLIGHT {
                let mut pending = self.lock();
                let next = pending.pop();
                // Taken out of its queue, it waits for the QPS: still pending.
                pending.taken = next.is_some();
                next
            } else {
                None
            };
            let Some((key, mut wanted)) = next else {
                tokio::select! {
                    Some((key, wanted, result)) = writes.next() => {
                        self.finished(key, wanted, result);
                    }
                    () = self.wake.notified() => {}
                }
                continue;
            };
            if let Some(wait) = limit.take(tokio::time::Instant::now()) {
                tokio::time::sleep(wait).await;
                // A newer status handed over meanwhile is the one to write, if any is.
                let mut pending = self.lock();
                if let Some(newer) = pending.remove(&key) {
                    match pending.ready(&key, newer) {
                        Some(newer) => wanted = newer,
                        None => {
                            pending.taken = false;
                            self.count(&pending);
                            continue;
                        }
                    }
                }
            }
            let mut pending = self.lock();
            pending.taken = false;
            let status: Value = match serde_json::from_str(&wanted.status) {
                Ok(status) => status,
                Err(error) => {
                    // Text this writer made from a `Value`: never seen to fail.
                    let (kind, namespace, name) = &key;
                    warn!(%kind, %namespace, %name, %error, "status unreadable; dropped");
                    self.count(&pending);
                    continue;
                }
            };
            pending.in_flight.insert(key.clone(), status.clone());
            self.count(&pending);
            drop(pending);
            writes.push(write(client.clone(), key, wanted, status));
        }
    }

    fn finished(
        &self,
        key: Key,
        wanted: Wanted,
        result: Result<Option<(String, String)>, kube::Error>,
    ) {
        let (_, namespace, name) = &key;
        let kind = &wanted.kind.resource.kind;
        let mut pending = self.lock();
        pending.in_flight.remove(&key);
        match result {
            Ok(versions) => {
                debug!(%kind, %namespace, %name, "status written");
                pending.wrote(key, wanted, versions);
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {
                pending.written.remove(&key);
                pending.own.remove(&key);
            }
            // Decided on an object that has changed since: the change brings a newer one.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                debug!(%kind, %namespace, %name, "status decided on a stale read; dropped");
            }
            Err(error) => {
                warn!(%kind, %namespace, %name, %error, "status write failed; will retry");
                // Retry unless a newer status arrived meanwhile.
                if !pending.contains(&key) {
                    let urgent = wanted.kind.is_progress(
                        pending.written.get(&key).map(|w| &w.summary),
                        &wanted.summary,
                    );
                    pending.enqueue(key, wanted, urgent);
                }
            }
        }
        self.count(&pending);
    }
}

/// What a write gave: the resourceVersion it was made on and the one it left.
type Written = Result<Option<(String, String)>, kube::Error>;

/// Writes one object's status, conditional on the resourceVersion it was decided on;
/// hands back what it wrote, and what it gave.
async fn write(client: Client, key: Key, wanted: Wanted, status: Value) -> (Key, Wanted, Written) {
    let (_, namespace, name) = &key;
    let kind = &wanted.kind;
    let api: Api<DynamicObject> = if kind.namespaced {
        Api::namespaced_with(client, namespace, &kind.resource)
    } else {
        Api::all_with(client, &kind.resource)
    };
    let mut metadata = json!({});
    if let Some(read) = &wanted.read {
        metadata["resourceVersion"] = json!(read);
    }
    let result = match kind.write {
        Write::Apply => {
            let patch = json!({
                "apiVersion": kind.resource.api_version,
                "kind": kind.resource.kind,
                "metadata": metadata,
                "status": status,
            });
            let params = PatchParams::apply(FIELD_MANAGER).force();
            api.patch_status(name, &params, &Patch::Apply(&patch)).await
        }
        Write::Merge => {
            let patch = json!({ "metadata": metadata, "status": status });
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
        }
    };
    let result = result.map(|object| wanted.read.clone().zip(object.metadata.resource_version));
    (key, wanted, result)
}

/// A condition that keeps its lastTransitionTime unless its status changes.
pub fn condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: i64,
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" };
    condition_of(previous, type_, status, reason, message, generation, now)
}

/// The one lastTransitionTime rule of every status Switchyard writes: a condition keeps
/// the time of the one it replaces while its status (True, False, Unknown) stays.
pub fn condition_of(
    previous: &[Condition],
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: i64,
    now: &Time,
) -> Condition {
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation: Some(generation),
        last_transition_time,
    }
}

#[cfg(test)]
mod tests;
