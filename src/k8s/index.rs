//! Watchers feeding in-memory stores: the index every replica builds its snapshot from.
//!
//! Each kind is reflected into a store per watched namespace (or one for all). The index is
//! ready once every store has received its complete initial list (I5); after that every
//! event bumps a change counter that the snapshot builder waits on.

use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::warn;

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
    _reflectors: Vec<TaskGuard>,
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
        let (stores, reflectors) = apis
            .into_iter()
            .map(|api| reflect(api, config.clone(), changes.clone()))
            .unzip();
        Self {
            stores,
            _reflectors: reflectors,
        }
    }

    pub fn state(&self) -> Vec<Arc<K>> {
        self.stores.iter().flat_map(|s| s.state()).collect()
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

/// Starts a reflector for `api` and returns its store; every event bumps `changes`.
/// The reflector runs until the returned guard drops.
pub(super) fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    changes: Arc<watch::Sender<u64>>,
) -> (Store<K>, TaskGuard)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let (store, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, config)
            .default_backoff()
            .reflect(writer)
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(_) => changes.send_modify(|n| *n += 1),
                Err(error) => warn!(%kind, %error, "watch failed; retrying with backoff"),
            }
        }
    });
    (store, TaskGuard(task))
}

/// What every replica watches to build its snapshot.
pub struct Index {
    pub proxy_configs: Watched<ProxyConfig>,
    /// EndpointSlices that belong to a Service.
    pub endpoint_slices: Watched<EndpointSlice>,
    /// TLS Secrets, metadata only: content is fetched for referenced ones alone.
    pub tls_secrets: Watched<PartialObjectMeta<Secret>>,
    changes: Arc<watch::Sender<u64>>,
}

impl Index {
    pub fn start(client: &Client, scope: &Scope) -> Self {
        let changes = Arc::new(watch::channel(0).0);
        let slices = watcher::Config::default().labels(SERVICE_NAME_LABEL);
        let secrets = watcher::Config::default().fields("type=kubernetes.io/tls");
        Self {
            proxy_configs: Watched::start(scope.apis(client), watcher::Config::default(), &changes),
            endpoint_slices: Watched::start(scope.apis(client), slices, &changes),
            // Api<PartialObjectMeta<_>> asks for metadata only.
            tls_secrets: Watched::start(
                scope.apis::<PartialObjectMeta<Secret>>(client),
                secrets,
                &changes,
            ),
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
