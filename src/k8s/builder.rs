//! Builds the desired snapshot from the index, on every replica.
//!
//! The startup gate (I5): nothing is published before every watcher has its complete
//! initial list and the first full snapshot is built from it; only then does the xDS
//! server answer. Status writing is elsewhere and never waits here.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use super::built_from::{BuildInputs, BuiltFrom};
use super::departed::{Departed, DepartedConfigs, drains_by_service};
use super::envoys::{Envoys, RouteVerdict, Snapshot};
use super::index::Index;
use super::model_cache::{ModelCache, ObjectKey, Objects, Settings, Step, Touched, key_of};
use super::tls_secrets::{TlsSecrets, tls_secrets_of};
use super::to_model::{Inputs, SERVICE_NAME_LABEL};
use crate::api::ProxyConfig;
use crate::metrics::Metrics;
use crate::model::ListenerSettings;
use crate::translate::{Cause, Problem, Quarantine, Translator};

/// At most one build per this interval: changes arriving within it are built together.
const DEBOUNCE: Duration = Duration::from_millis(10);

pub struct Builder {
    pub index: Index,
    pub listeners: ListenerSettings,
    /// How long the endpoints of a deleted Service, and the live configuration of a
    /// deleted route, keep serving (see [`Departed`], [`DepartedConfigs`]).
    pub hold: Duration,
    pub metrics: Metrics,
    /// What was left out of the last snapshot, for status and logs.
    pub problems: Arc<watch::Sender<Vec<Problem>>>,
    /// The Envoys connected here: they get the snapshots, and what they answer to route
    /// configurations decides which routes on trial are left out (see [`Quarantine`]).
    pub envoys: Arc<dyn Envoys>,
    /// What each published snapshot was built from, for the rollouts waiting on it.
    pub built_from: Arc<BuiltFrom>,
}

/// The last translation, before the quarantine: a verdict republishes it.
struct Built {
    snapshot: Snapshot,
    problems: Vec<Problem>,
    /// Its number in [`BuiltFrom`].
    build: u64,
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
        let mut secrets = TlsSecrets::default();
        // Hold what the last build was made of: each build rebuilds only what changed.
        let mut models = ModelCache::default();
        let mut translator = Translator::new();
        let mut departed = Held {
            slices: Departed::new(self.hold),
            configs: DepartedConfigs::new(self.hold),
        };
        let mut verdicts = self.envoys.verdicts();
        let mut quarantine = Quarantine::default();
        loop {
            changes.borrow_and_update();
            let built = self.build(&mut secrets, &mut models, &mut translator, &mut departed);
            self.publish(&built, &mut quarantine);
            let built_at = Instant::now();
            let release = departed.next_release();
            loop {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() {
                        return;
                    } else {
                        break;
                    },
                    // A held slice is due: build without it.
                    () = sleep_until(release) => break,
                    // An Envoy's answer may leave a route on trial out, or bring one back:
                    // the same translation is published again, at once.
                    Some(verdict) = verdicts.recv() => {
                        let (changed, config) = match &verdict {
                            RouteVerdict::Accepted(config) => (quarantine.accepted(config), config),
                            RouteVerdict::Refused { config, node, error } => {
                                (quarantine.refused(config, node, error), config)
                            }
                        };
                        debug!(
                            accepted = matches!(verdict, RouteVerdict::Accepted(_)),
                            version = %config.version,
                            changed,
                            left_out = quarantine.left_out(),
                            "route configuration verdict"
                        );
                        if changed {
                            self.publish(&built, &mut quarantine);
                        }
                    }
                }
            }
            // A change after a quiet spell is built at once; changes that keep coming are
            // batched, one build per DEBOUNCE at most.
            tokio::time::sleep(DEBOUNCE.saturating_sub(built_at.elapsed())).await;
        }
    }

    /// Publishes a translation, less the routes on trial that Envoys refused.
    fn publish(&self, built: &Built, quarantine: &mut Quarantine) {
        let snapshot = Arc::new(quarantine.apply(&built.snapshot));
        debug!(
            version = snapshot.version(),
            trials_left_out = quarantine.left_out(),
            "publishing"
        );
        let mut problems = built.problems.clone();
        problems.extend(quarantine.problems());
        log_new_problems(&self.problems.borrow(), &problems);
        self.metrics
            .trials_left_out
            .set(quarantine.left_out() as i64);
        self.problems.send_replace(problems);
        self.built_from.published(snapshot.version(), built.build);
        if self.envoys.publish(snapshot) {
            info!("first full snapshot built: serving xDS");
        }
    }

    fn build(
        &self,
        secrets: &mut TlsSecrets,
        models: &mut ModelCache,
        translator: &mut Translator,
        departed: &mut Held,
    ) -> Built {
        // What changed, taken before anything is read (see `Watched::take_touched`).
        let mut proxy_configs_touched = self.index.proxy_configs.take_touched();
        let released = departed.configs.update(
            std::mem::take(&mut proxy_configs_touched.deleted),
            |key| self.index.proxy_configs.get(key).is_some(),
            tokio::time::Instant::now(),
        );
        proxy_configs_touched.keys.extend(released);
        let mut slices_touched = self.index.endpoint_slices.take_touched();
        // Looked up only when a Service lost its last slice, then once for all of them.
        let drains = std::cell::OnceCell::new();
        let drain_of = |service: &(String, String)| {
            let configs = || drains_by_service(&self.index.proxy_configs.state());
            drains.get_or_init(configs).get(service).copied()
        };
        let released = departed.slices.update(
            std::mem::take(&mut slices_touched.deleted),
            || self.index.endpoint_slices.state(),
            drain_of,
            tokio::time::Instant::now(),
        );
        slices_touched.keys.extend(released);
        let secrets_touched = self.index.tls_secrets.take_touched();
        // A ProxyConfig that stopped serving a Secret leaves it unused in the map (the model
        // takes only Secrets a ProxyConfig names), with its last good content, until the
        // next refresh; only one that serves one now may need its content.
        let tls_may_differ = secrets_touched.any()
            || proxy_configs_touched.all
            || proxy_configs_touched.keys.iter().any(|key| {
                let pc = self.index.proxy_configs.get(key);
                pc.is_some_and(|pc| !tls_secrets_of(&pc).is_empty())
            });
        if tls_may_differ {
            secrets.refresh(&self.index);
        }

        let started = Instant::now();
        let settings = Settings {
            listeners: &self.listeners,
            secrets: &secrets.served,
        };
        let objects = WithDeparted {
            index: &self.index,
            departed,
        };
        let full = proxy_configs_touched.all || slices_touched.all;
        let build = self.built_from.built(build_inputs(
            &objects,
            (!full).then_some((&proxy_configs_touched.keys, &slices_touched.keys)),
        ));
        let touched = (!full).then_some(Touched {
            proxy_configs: proxy_configs_touched.keys,
            endpoint_slices: slices_touched.keys,
        });
        let clusters = |name: &str| translator.cluster(name);
        let step =
            touched.and_then(|touched| models.step(&settings, &touched, (&objects, &clusters)));
        let (step, mut problems) = match step {
            Some(step) => step,
            None => {
                let proxy_configs = departed.configs.with_held(self.index.proxy_configs.state());
                let slices = departed
                    .slices
                    .with_held(self.index.endpoint_slices.state());
                models.full(&Inputs {
                    listeners: self.listeners.clone(),
                    proxy_configs: proxy_configs.iter().map(Arc::as_ref).collect(),
                    endpoint_slices: slices.iter().map(Arc::as_ref).collect(),
                    secrets: &secrets.served,
                })
            }
        };
        let full = matches!(step, Step::Full(_));
        let translation = match step {
            Step::Full(config) => translator.update(&config),
            Step::Changes(changes) => translator.apply(changes),
        };
        let elapsed = started.elapsed();
        problems.extend(secrets.problems.iter().cloned());
        problems.extend(translation.problems.iter().cloned());
        let snapshot = translation.snapshot;
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
        Built {
            snapshot,
            problems,
            build,
        }
    }
}

/// What a build takes in, for [`BuiltFrom`]: the ProxyConfigs and EndpointSlices touched
/// (None: everything, a full build), as they are now.
fn build_inputs(
    objects: &WithDeparted<'_>,
    touched: Option<(&BTreeSet<ObjectKey>, &BTreeSet<ObjectKey>)>,
) -> BuildInputs {
    let Some((configs, slices)) = touched else {
        // Every ProxyConfig the build is made of, the held ones with them.
        let configs = (objects.departed.configs)
            .with_held(objects.index.proxy_configs.state())
            .iter()
            .map(|pc| (key_of(pc.as_ref()), Some(pc.spec.version.clone())))
            .collect();
        return BuildInputs {
            configs,
            full: true,
            ..BuildInputs::default()
        };
    };
    let mut inputs = BuildInputs::default();
    for key in configs {
        let version = objects.proxy_config(key).map(|pc| pc.spec.version.clone());
        inputs.configs.push((key.clone(), version));
    }
    for key in slices {
        let service = objects
            .endpoint_slice(key)
            .and_then(|slice| slice.labels().get(SERVICE_NAME_LABEL).cloned());
        match service {
            Some(service) => inputs.services.push((key.0.clone(), service)),
            None => inputs.namespaces.push(key.0.clone()),
        }
    }
    inputs
}

/// The index, with what is still held of deleted Services and routes.
struct WithDeparted<'a> {
    index: &'a Index,
    departed: &'a Held,
}

impl Objects for WithDeparted<'_> {
    fn proxy_config(&self, key: &ObjectKey) -> Option<Arc<ProxyConfig>> {
        self.index
            .proxy_configs
            .get(key)
            .or_else(|| self.departed.configs.get(key))
    }

    fn endpoint_slice(&self, key: &ObjectKey) -> Option<Arc<EndpointSlice>> {
        self.index
            .endpoint_slices
            .get(key)
            .or_else(|| self.departed.slices.get(key))
    }
}

/// What the builder keeps of deleted objects.
struct Held {
    slices: Departed,
    configs: DepartedConfigs,
}

impl Held {
    fn next_release(&self) -> Option<tokio::time::Instant> {
        [self.slices.next_release(), self.configs.next_release()]
            .into_iter()
            .flatten()
            .min()
    }
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Logs each problem that the last published list did not have: a flood of bad routes is
/// told once each, not again on every snapshot while it stays.
fn log_new_problems(before: &[Problem], now: &[Problem]) {
    let before: std::collections::BTreeSet<&Problem> = before.iter().collect();
    for problem in now.iter().filter(|p| !before.contains(p)) {
        if let Cause::TlsSecret { kept: true, .. } = problem.cause() {
            warn!(%problem, "TLS Secret cannot serve; its last good content does");
        } else {
            warn!(%problem, "left out of the configuration");
        }
    }
}
