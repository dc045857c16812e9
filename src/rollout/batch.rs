//! Writing many units' ProxyConfigs as one object, when their first rollouts coincide.
//!
//! A first rollout writes a unit's probe ProxyConfig, then its live one; each is an API
//! request, and at a start with 10k routes to bring up (or a sync creating thousands) those
//! requests are most of what the API server does, and what paces the routes being served.
//! So a ProxyConfig to be created (the unit has none of that name) waits a moment
//! ([`Settings::window`]) for others of the same namespace and role: when enough come
//! ([`Settings::min`]), they are written as one batch ([`crate::api::ProxyConfigSpec::members`]),
//! else each as its own object, as always. Every step of every unit is the same: only the
//! write is shared. Every replica's watch shows each member as an object of its own
//! (`k8s::batches`); a unit's later generations are written as its own objects, which take
//! over from the member.
//!
//! A member leaves its batch when its unit's rollout collects it (a probe ProxyConfig),
//! when the unit is gone (the orphan collectors), or when it stands for nothing (its unit's
//! own object took over): [`Batches::sweep`]. Removals coming together are one rewrite of
//! the batch; the last one deletes it. A batch the API server refuses (too large, say)
//! leaves each unit to write its own, and be told its own refusal (I9).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::FIELD_MANAGER;
use super::proxy_configs::Error;
use crate::api::proxy_config::{BATCH_LABEL, BatchMember, PROMOTED_AT};
use crate::api::{ProxyConfig, ProxyConfigRole, ProxyConfigSpec};
use crate::k8s::batches::{BatchView, member_object};
use crate::k8s::model_cache::ObjectKey;

/// When ProxyConfigs to be created are written together.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// How long the first waits for others.
    pub window: Duration,
    /// Fewer than this many are each written alone.
    pub min: usize,
    /// A batch holds members of at most this many bytes (JSON) in all: the API server
    /// takes requests of up to 3 MiB, etcd values of up to 1.5 MiB.
    pub max_bytes: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            window: Duration::from_millis(20),
            min: 4,
            max_bytes: 512 * 1024,
        }
    }
}

/// How a create went.
#[derive(Debug)]
pub enum Created {
    /// Written in a batch: the member, as the watch shows it.
    Batched(Box<ProxyConfig>),
    /// Not enough came together (or the batch was refused): the caller writes its own.
    Alone,
}

type Reply = oneshot::Sender<Result<Created, Error>>;

/// A ProxyConfig to be created, and where to say how it went.
type Entry = (ProxyConfig, Reply);

/// The batches of one leader term (every front-end's).
pub struct Batches {
    client: Client,
    view: BatchView,
    settings: Settings,
    /// A queue per (namespace, role) of ProxyConfigs to be created.
    creates: Mutex<HashMap<(String, ProxyConfigRole), mpsc::UnboundedSender<Entry>>>,
    removals: mpsc::UnboundedSender<Removal>,
    removals_rx: Mutex<Option<mpsc::UnboundedReceiver<Removal>>>,
}

/// Members to take out of a batch; `reply` when they are out.
struct Removal {
    batch: ObjectKey,
    members: Vec<String>,
    reply: Option<oneshot::Sender<Result<(), Error>>>,
}

impl Batches {
    pub fn new(client: Client, view: BatchView, settings: Settings) -> Arc<Self> {
        let (removals, removals_rx) = mpsc::unbounded_channel();
        Arc::new(Self {
            client,
            view,
            settings,
            creates: Mutex::default(),
            removals,
            removals_rx: Mutex::new(Some(removals_rx)),
        })
    }

    /// Creates `pc` (a unit's ProxyConfig, named and namespaced) in a batch with others
    /// that come within the window, or says to write it alone.
    pub async fn create(self: &Arc<Self>, pc: ProxyConfig) -> Result<Created, Error> {
        if self.settings.window.is_zero() {
            return Ok(Created::Alone);
        }
        let key = (pc.namespace().unwrap_or_default(), pc.spec.role);
        let (reply, answer) = oneshot::channel();
        let queue = {
            let mut creates = self.creates.lock().unwrap_or_else(|p| p.into_inner());
            let queue = creates.entry(key.clone()).or_insert_with(|| {
                let (queue, entries) = mpsc::unbounded_channel();
                // The task holds no handle on `self`: it ends with the queue, when the
                // term's batches are dropped.
                let writer = Writer {
                    client: self.client.clone(),
                    settings: self.settings,
                };
                tokio::spawn(writer.write_creates(key.0.clone(), key.1, entries));
                queue
            });
            queue.clone()
        };
        if queue.send((pc, reply)).is_err() {
            return Ok(Created::Alone);
        }
        answer.await.unwrap_or(Ok(Created::Alone))
    }

    /// The batches holding a member named `key` (namespace, name).
    pub fn holding(&self, key: &ObjectKey) -> Vec<String> {
        self.view.holding(key)
    }

    /// Takes member `name` out of `batch` (of `namespace`).
    pub async fn remove(&self, namespace: &str, batch: &str, name: &str) -> Result<(), Error> {
        let (reply, answer) = oneshot::channel();
        let removal = Removal {
            batch: (namespace.to_owned(), batch.to_owned()),
            members: vec![name.to_owned()],
            reply: Some(reply),
        };
        if self.removals.send(removal).is_err() {
            return Ok(());
        }
        answer.await.unwrap_or(Ok(()))
    }

    /// Writes the removals, and takes out of their batches the members that stand for
    /// nothing (their unit's own object took over; a second copy), once a second. Runs
    /// until dropped.
    pub async fn sweep(self: Arc<Self>) {
        let Some(mut removals) = (self.removals_rx.lock())
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pending: BTreeMap<ObjectKey, Pending> = BTreeMap::new();
        loop {
            tokio::select! {
                removal = removals.recv() => {
                    let Some(removal) = removal else { return };
                    pending.entry(removal.batch).or_default().add(removal.members, removal.reply);
                    // Others coming at the same time go in the same rewrite.
                    tokio::time::sleep(self.settings.window).await;
                    while let Ok(removal) = removals.try_recv() {
                        pending.entry(removal.batch).or_default().add(removal.members, removal.reply);
                    }
                }
                _ = tick.tick() => {
                    for (batch, hidden) in self.view.hidden() {
                        if !hidden.is_empty() {
                            pending.entry(batch).or_default().add(hidden, None);
                        }
                    }
                }
            }
            for (batch, removal) in std::mem::take(&mut pending) {
                let result = self.take_out(&batch, &removal.members).await;
                if let Err(error) = &result {
                    warn!(namespace = %batch.0, batch = %batch.1, %error, "cannot take members out of a batch");
                }
                for reply in removal.replies {
                    let _ = reply.send(match &result {
                        Ok(()) => Ok(()),
                        Err(error) => Err(Error::Write {
                            name: batch.1.clone(),
                            source: copy(error.source()),
                        }),
                    });
                }
            }
        }
    }

    /// Rewrites `batch` without `members` (deletes it without any left), conditional on
    /// the batch as read just before.
    async fn take_out(&self, batch: &ObjectKey, members: &BTreeSet<String>) -> Result<(), Error> {
        let api: Api<ProxyConfig> = Api::namespaced(self.client.clone(), &batch.0);
        let write_error = |source| Error::Write {
            name: batch.1.clone(),
            source,
        };
        for _ in 0..3 {
            let read = api.get_opt(&batch.1).await.map_err(|source| Error::Read {
                name: batch.1.clone(),
                source,
            })?;
            let Some(mut current) = read else {
                return Ok(());
            };
            let before = current.spec.members.len();
            (current.spec.members).retain(|m| !members.contains(&m.name));
            if current.spec.members.len() == before {
                return Ok(());
            }
            let written = if current.spec.members.is_empty() {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: current.uid(),
                        resource_version: current.resource_version(),
                    }),
                    ..DeleteParams::default()
                };
                api.delete(&batch.1, &params).await.map(|_| ())
            } else {
                // A merge patch replaces the lists whole; its resourceVersion makes it
                // conditional on the batch as read.
                let patch = serde_json::json!({
                    "metadata": {
                        "resourceVersion": current.resource_version(),
                        "ownerReferences": owners(&current.spec.members),
                    },
                    "spec": { "members": current.spec.members },
                });
                let params = PatchParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..PatchParams::default()
                };
                (api.patch(&batch.1, &params, &Patch::Merge(&patch)).await).map(|_| ())
            };
            match written {
                Ok(()) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
                // Changed since read (the garbage collector dropped an owner): again.
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(source) => return Err(write_error(source)),
            }
        }
        Err(write_error(kube::Error::Service(
            "the batch kept changing while members were taken out".into(),
        )))
    }
}

/// Writes the creates of one namespace and role.
struct Writer {
    client: Client,
    settings: Settings,
}

impl Writer {
    /// Collects what comes within the window, and writes it: as batches when there are
    /// enough, else hands each back to be written alone. Runs while the queue lives.
    async fn write_creates(
        self,
        namespace: String,
        role: ProxyConfigRole,
        mut entries: mpsc::UnboundedReceiver<(ProxyConfig, Reply)>,
    ) {
        while let Some(first) = entries.recv().await {
            let mut waiting = vec![first];
            let until = tokio::time::Instant::now() + self.settings.window;
            while let Ok(Some(entry)) = tokio::time::timeout_at(until, entries.recv()).await {
                waiting.push(entry);
            }
            while let Ok(entry) = entries.try_recv() {
                waiting.push(entry);
            }
            let waiting = latest_of_each(waiting);
            if waiting.len() < self.settings.min {
                for (_, reply) in waiting {
                    let _ = reply.send(Ok(Created::Alone));
                }
                continue;
            }
            for chunk in chunks(waiting, self.settings.max_bytes) {
                self.write_batch(&namespace, role, chunk).await;
            }
        }
    }

    /// Creates one batch of `entries` and answers each.
    async fn write_batch(
        &self,
        namespace: &str,
        role: ProxyConfigRole,
        entries: Vec<(ProxyConfig, Reply)>,
    ) {
        let members: Vec<BatchMember> = entries.iter().map(|(pc, _)| member(pc)).collect();
        let batch = batch_object(role, members);
        let api: Api<ProxyConfig> = Api::namespaced(self.client.clone(), namespace);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        match api.create(&params, &batch).await {
            Ok(created) => {
                debug!(%namespace, batch = %created.name_any(), members = entries.len(), "batch written");
                for ((_, reply), member) in entries.into_iter().zip(&created.spec.members) {
                    let member = Box::new(member_object(&created, member));
                    let _ = reply.send(Ok(Created::Batched(member)));
                }
            }
            // Refused as invalid: each on its own, to be told its own refusal.
            Err(kube::Error::Api(s)) if matches!(s.code, 400 | 413 | 422) => {
                warn!(%namespace, message = %s.message, "a batch of ProxyConfigs refused: each written alone");
                for (_, reply) in entries {
                    let _ = reply.send(Ok(Created::Alone));
                }
            }
            Err(error) => {
                for (pc, reply) in entries {
                    let _ = reply.send(Err(Error::Write {
                        name: pc.name_any(),
                        source: copy(&error),
                    }));
                }
            }
        }
    }
}

/// An error told to each of several waiting on one request: the API server's status as
/// it is (the retry policy reads its code), anything else as its words.
fn copy(error: &kube::Error) -> kube::Error {
    match error {
        kube::Error::Api(status) => kube::Error::Api(status.clone()),
        other => kube::Error::Service(other.to_string().into()),
    }
}

#[derive(Default)]
struct Pending {
    members: BTreeSet<String>,
    replies: Vec<oneshot::Sender<Result<(), Error>>>,
}

impl Pending {
    fn add(&mut self, members: Vec<String>, reply: Option<oneshot::Sender<Result<(), Error>>>) {
        self.members.extend(members);
        self.replies.extend(reply);
    }
}

/// The entries whose pass still waits, the last of each name (a pass given up on, then
/// tried again, within one window).
fn latest_of_each(entries: Vec<Entry>) -> Vec<Entry> {
    let mut latest: Vec<Entry> = Vec::new();
    for entry in entries.into_iter().filter(|(_, reply)| !reply.is_closed()) {
        latest.retain(|(pc, _)| pc.name_any() != entry.0.name_any());
        latest.push(entry);
    }
    latest
}

/// A unit's ProxyConfig as a member of a batch.
fn member(pc: &ProxyConfig) -> BatchMember {
    BatchMember {
        name: pc.name_any(),
        labels: pc.labels().clone(),
        owner: pc.owner_references().first().cloned(),
        promoted_at: pc.annotations().get(PROMOTED_AT).cloned(),
        spec: pc.spec.clone(),
    }
}

/// A batch of `members` of `role`, to be created under a name of the API server's making.
fn batch_object(role: ProxyConfigRole, members: Vec<BatchMember>) -> ProxyConfig {
    let role_name = match role {
        ProxyConfigRole::Probe => "probe",
        ProxyConfigRole::Live => "live",
    };
    let versions: Vec<(&str, &str)> = members
        .iter()
        .map(|m| (m.name.as_str(), m.spec.version.as_str()))
        .collect();
    let spec = ProxyConfigSpec {
        role,
        route: String::new(),
        generation: 0,
        version: crate::hash::digest_of(&versions),
        virtual_host: None,
        clusters: Vec::new(),
        route_created: None,
        kept_clusters: Vec::new(),
        listener: None,
        drain_period: None,
        members,
    };
    let mut batch = ProxyConfig::new("", spec);
    batch.metadata.name = None;
    batch.metadata.generate_name = Some(format!("batch-{role_name}-"));
    batch.metadata.labels = Some([(BATCH_LABEL.to_owned(), role_name.to_owned())].into());
    batch.metadata.owner_references = Some(owners(&batch.spec.members));
    batch
}

/// The owners of a batch: every member's, once, none its controller (an object has at most
/// one). Kubernetes' garbage collector deletes the batch once they are all gone.
fn owners(members: &[BatchMember]) -> Vec<OwnerReference> {
    let mut owners: BTreeMap<String, OwnerReference> = BTreeMap::new();
    for owner in members.iter().filter_map(|m| m.owner.as_ref()) {
        let owner = OwnerReference {
            controller: None,
            block_owner_deletion: None,
            ..owner.clone()
        };
        owners.entry(owner.uid.clone()).or_insert(owner);
    }
    owners.into_values().collect()
}

/// `entries` in batches of members of at most `max_bytes` in all (one larger alone).
fn chunks(entries: Vec<(ProxyConfig, Reply)>, max_bytes: usize) -> Vec<Vec<(ProxyConfig, Reply)>> {
    let mut chunks: Vec<Vec<(ProxyConfig, Reply)>> = Vec::new();
    let mut bytes = 0;
    for entry in entries {
        let size = serde_json::to_vec(&member(&entry.0)).map_or(max_bytes, |b| b.len());
        match chunks.last_mut() {
            Some(chunk) if bytes + size <= max_bytes => chunk.push(entry),
            _ => {
                chunks.push(vec![entry]);
                bytes = 0;
            }
        }
        bytes += size;
    }
    chunks
}

#[cfg(test)]
mod tests;
