//! The index every replica builds its snapshot from: one watch each of ProxyConfigs,
//! EndpointSlices and TLS Secrets, which the leader's front-ends and the fleet's drain read
//! too (see [`super::watched`]).
//!
//! Each kind is reflected into a store per watched namespace (or one for all). The index is
//! ready once every store has received its complete initial list (I5); after that every
//! event bumps a change counter that the snapshot builder waits on, and names the object it
//! changed, so that a build looks at those objects alone (a relist names none: everything).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;

use super::batches::BatchView;
use super::model_cache::{ObjectKey, Objects};
use super::to_model::SERVICE_NAME_LABEL;
use super::watched::{Expand, View, Watched};
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

    /// This scope and `namespace` too.
    pub fn with(&self, namespace: &str) -> Scope {
        match self {
            Scope::All => Scope::All,
            Scope::Namespaces(list) if list.iter().any(|n| n == namespace) => self.clone(),
            Scope::Namespaces(list) => {
                let mut list = list.clone();
                list.push(namespace.to_string());
                Scope::Namespaces(list)
            }
        }
    }
}

/// What every replica watches to build its snapshot.
pub struct Index {
    /// Every member of a batch stored as a ProxyConfig of its own ([`super::batches`]).
    pub proxy_configs: Watched<ProxyConfig>,
    /// The batches behind them.
    pub batches: BatchView,
    /// EndpointSlices that belong to a Service, the fleet's among them: their namespace is
    /// watched too, whatever the scope.
    pub endpoint_slices: Watched<EndpointSlice>,
    /// TLS Secrets (type kubernetes.io/tls only), content included: the first snapshot
    /// after a start needs hundreds of them, and one GET each would hold the gate (I5).
    pub tls_secrets: Watched<Secret>,
    changes: Arc<watch::Sender<u64>>,
}

impl Index {
    /// Watches `scope` (and the fleet's namespace, for its EndpointSlices).
    pub fn start(client: &Client, scope: &Scope, fleet_namespace: &str) -> Self {
        let changes = Arc::new(watch::channel(0).0);
        let slices = watcher::Config::default().labels(SERVICE_NAME_LABEL);
        let secrets = watcher::Config::default().fields("type=kubernetes.io/tls");
        let batches = BatchView::default();
        let expand = || -> Expand<ProxyConfig> {
            let mut expander = batches.expander();
            Box::new(move |event, store| expander.expand(event, store))
        };
        let proxy_configs = Watched::start_tracked_expanded(
            scope.apis(client),
            watcher::Config::default(),
            &expand,
        );
        let index = Self {
            proxy_configs,
            batches,
            endpoint_slices: Watched::start_tracked(
                scope.with(fleet_namespace).apis(client),
                slices,
            ),
            tls_secrets: Watched::start_tracked(scope.apis(client), secrets),
            changes,
        };
        index.proxy_configs.notify(&index.changes);
        index.endpoint_slices.notify(&index.changes);
        index.tls_secrets.notify(&index.changes);
        index
    }

    /// The EndpointSlices of the fleet Service (namespace, name): every Envoy a rollout
    /// must hear from, and those whose Pods are terminating.
    pub fn fleet(&self, (namespace, name): &(String, String)) -> View<EndpointSlice> {
        let (namespace, name) = (namespace.clone(), name.clone());
        self.endpoint_slices
            .view(Arc::new(move |slice: &EndpointSlice| {
                slice.namespace().as_deref() == Some(namespace.as_str())
                    && slice.labels().get(SERVICE_NAME_LABEL) == Some(&name)
            }))
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

/// What the leader's front-ends read: the index's watches, and the Services watched for
/// them while this replica leads. Each kind once per process: the TrafficRoute controller,
/// the Gateway controller and the rollout engine read these, never a watch of their own.
#[derive(Clone)]
pub struct Watches {
    /// The namespaces watched (the fleet's as well, for Services and EndpointSlices).
    pub scope: Scope,
    pub proxy_configs: Watched<ProxyConfig>,
    pub batches: BatchView,
    /// Every Service in scope and in the fleet's namespace (where each Gateway gets one).
    pub services: Watched<Service>,
    pub tls_secrets: Watched<Secret>,
    /// The fleet Service's EndpointSlices.
    pub fleet: View<EndpointSlice>,
}

/// The parts of [`Watches`] every replica has from its start, before it leads.
#[derive(Clone)]
pub struct ForLeader {
    scope: Scope,
    fleet_namespace: String,
    proxy_configs: Watched<ProxyConfig>,
    batches: BatchView,
    tls_secrets: Watched<Secret>,
    fleet: View<EndpointSlice>,
}

impl ForLeader {
    pub fn new(index: &Index, scope: &Scope, fleet: View<EndpointSlice>, fleet_ns: &str) -> Self {
        Self {
            scope: scope.clone(),
            fleet_namespace: fleet_ns.to_string(),
            proxy_configs: index.proxy_configs.clone(),
            batches: index.batches.clone(),
            tls_secrets: index.tls_secrets.clone(),
            fleet,
        }
    }

    /// A term's watches: the Services are watched from here until they are dropped (a
    /// replica that does not lead has no use for them).
    pub fn start(&self, client: &Client) -> Watches {
        Watches {
            scope: self.scope.clone(),
            proxy_configs: self.proxy_configs.clone(),
            batches: self.batches.clone(),
            services: Watched::start(
                self.scope.with(&self.fleet_namespace).apis(client),
                watcher::Config::default(),
            ),
            tls_secrets: self.tls_secrets.clone(),
            fleet: self.fleet.clone(),
        }
    }
}

impl Watches {
    /// Resolves once every store holds its complete initial list; false if a watcher died.
    pub async fn ready(&self) -> bool {
        self.proxy_configs.ready().await
            && self.services.ready().await
            && self.tls_secrets.ready().await
            && self.fleet.ready().await
    }
}
