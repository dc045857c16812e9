//! Builds the desired snapshot from the index, on every replica.
//!
//! The startup gate (I5): nothing is published before every watcher has its complete
//! initial list and the first full snapshot is built from it; only then does the xDS
//! server answer. Status writing is elsewhere and never waits here.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::{error, info, warn};

use super::address_map::AddressMap;
use super::index::Index;
use super::model_cache::{ModelCache, Settings, Step, Touched};
use super::to_model::{Inputs, TlsData};
use crate::api::{ProxyConfig, ProxyConfigRole};
use crate::metrics::Metrics;
use crate::model::ListenerSettings;
use crate::translate::{Problem, Translator};
use crate::xds::Desired;

/// At most one build per this interval: changes arriving within it are built together.
const DEBOUNCE: Duration = Duration::from_millis(10);

pub struct Builder {
    pub index: Index,
    pub client: Client,
    pub listeners: ListenerSettings,
    pub address_map: Option<AddressMap>,
    pub desired: Arc<Desired>,
    pub metrics: Metrics,
    /// What was left out of the last snapshot, for status and logs.
    pub problems: Arc<watch::Sender<Vec<Problem>>>,
}

impl Builder {
    pub async fn run(self) {
        let started = Instant::now();
        let mut changes = self.index.changes();
        if !self.index.ready().await {
            error!("a watcher stopped before its initial list; not serving xDS");
            return;
        }
        info!(
            after_ms = started.elapsed().as_millis() as u64,
            "every watcher has its initial list"
        );
        let mut secrets = SecretCache::default();
        // Hold what the last build was made of: each build rebuilds only what changed.
        let mut models = ModelCache::default();
        let mut translator = Translator::new();
        loop {
            changes.borrow_and_update();
            self.build_and_publish(&mut secrets, &mut models, &mut translator)
                .await;
            let built = Instant::now();
            if changes.changed().await.is_err() {
                return;
            }
            // A change after a quiet spell is built at once; changes that keep coming are
            // batched, one build per DEBOUNCE at most.
            tokio::time::sleep(DEBOUNCE.saturating_sub(built.elapsed())).await;
        }
    }

    async fn build_and_publish(
        &self,
        secrets: &mut SecretCache,
        models: &mut ModelCache,
        translator: &mut Translator,
    ) {
        // What changed, taken before anything is read (see `Watched::take_touched`).
        let proxy_configs_touched = self.index.proxy_configs.take_touched();
        let slices_touched = self.index.endpoint_slices.take_touched();
        let secrets_touched = self.index.tls_secrets.take_touched();
        // A ProxyConfig that stopped serving a Secret leaves it unused in the cache, which
        // is harmless; only one that serves one now may need its content.
        let tls_may_differ = secrets_touched.any()
            || secrets.failed
            || proxy_configs_touched.all
            || proxy_configs_touched.keys.iter().any(|key| {
                let pc = self.index.proxy_configs.get(key);
                pc.is_some_and(|pc| tls_secret_of(&pc).is_some())
            });
        if tls_may_differ {
            secrets.refresh(&self.client, &self.index).await;
        }

        let started = Instant::now();
        let settings = Settings {
            listeners: &self.listeners,
            address_map: self.address_map,
            secrets: &secrets.current,
        };
        let touched = (!proxy_configs_touched.all && !slices_touched.all).then_some(Touched {
            proxy_configs: proxy_configs_touched.keys,
            endpoint_slices: slices_touched.keys,
        });
        let step = touched.and_then(|touched| models.step(&settings, &touched, &self.index));
        let (step, mut problems) = match step {
            Some(step) => step,
            None => {
                let proxy_configs = self.index.proxy_configs.state();
                let slices = self.index.endpoint_slices.state();
                models.full(&Inputs {
                    listeners: self.listeners.clone(),
                    address_map: self.address_map,
                    proxy_configs: proxy_configs.iter().map(Arc::as_ref).collect(),
                    endpoint_slices: slices.iter().map(Arc::as_ref).collect(),
                    secrets: &secrets.current,
                })
            }
        };
        let full = matches!(step, Step::Full(_));
        let translation = match step {
            Step::Full(config) => translator.update(&config),
            Step::Changes(changes) => translator.apply(changes),
        };
        let elapsed = started.elapsed();
        problems.extend(translation.problems.iter().cloned());
        for problem in &problems {
            warn!(%problem, "left out of the configuration");
        }
        let snapshot = Arc::new(translation.snapshot);
        self.metrics.record_snapshot(&snapshot, elapsed);
        info!(
            version = snapshot.version(),
            proxy_configs = self.index.proxy_configs.count(),
            resources = snapshot.len(),
            left_out = problems.len(),
            build_ms = elapsed.as_secs_f64() * 1000.0,
            full,
            "snapshot built"
        );
        self.problems.send_replace(problems);
        if self.desired.publish_and_open(snapshot) {
            info!("first full snapshot built: serving xDS");
        }
    }
}

/// TLS Secret contents for the referenced Secrets only, refetched when their
/// resourceVersion changes.
#[derive(Default)]
struct SecretCache {
    entries: HashMap<(String, String), (String, TlsData)>,
    /// What the last refresh found, for the model.
    current: BTreeMap<(String, String), TlsData>,
    /// A Secret could not be read: try again at the next build.
    failed: bool,
}

impl SecretCache {
    /// Reads what live ProxyConfigs serve now (content only where the version changed).
    async fn refresh(&mut self, client: &Client, index: &Index) {
        let versions: HashMap<(String, String), String> = index
            .tls_secrets
            .state()
            .iter()
            .map(|s| {
                (
                    (s.namespace().unwrap_or_default(), s.name_any()),
                    s.resource_version().unwrap_or_default(),
                )
            })
            .collect();
        let wanted: Vec<(String, String)> = index
            .proxy_configs
            .state()
            .iter()
            .filter_map(|pc| tls_secret_of(pc))
            .collect();
        self.failed = false;
        let mut out = BTreeMap::new();
        for key in &wanted {
            let Some(version) = versions.get(key) else {
                continue;
            };
            let cached = self
                .entries
                .get(key)
                .filter(|(v, _)| v == version)
                .map(|(_, data)| data.clone());
            let data = match cached {
                Some(data) => Some(data),
                None => {
                    let api: Api<Secret> = Api::namespaced(client.clone(), &key.0);
                    match api.get(&key.1).await {
                        Ok(secret) => tls_data(&secret),
                        Err(error) => {
                            warn!(namespace = %key.0, name = %key.1, %error, "cannot read TLS Secret");
                            self.failed = true;
                            None
                        }
                    }
                }
            };
            if let Some(data) = data {
                self.entries
                    .insert(key.clone(), (version.clone(), data.clone()));
                out.insert(key.clone(), data);
            }
        }
        self.entries.retain(|k, _| wanted.contains(k));
        self.current = out;
    }
}

/// (namespace, name) of the TLS Secret a live ProxyConfig serves.
fn tls_secret_of(pc: &ProxyConfig) -> Option<(String, String)> {
    if pc.spec.role != ProxyConfigRole::Live {
        return None;
    }
    let tls = pc.spec.virtual_host.as_ref()?.tls.as_ref()?;
    Some((pc.namespace().unwrap_or_default(), tls.secret_name.clone()))
}

fn tls_data(secret: &Secret) -> Option<TlsData> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| {
        data.get(key)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    Some(TlsData {
        certificate_chain: text("tls.crt")?,
        private_key: text("tls.key")?,
    })
}
