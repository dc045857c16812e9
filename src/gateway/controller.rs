//! The Gateway API controller, on the leader only: one watch per Gateway API kind (the
//! rest it reads from the process's watches), the whole translation again after any
//! change (it is pure and cheap), and the status of every object of Switchyard's handed
//! to the status writer every front-end shares (`k8s::status`), which writes what differs
//! from what the object shows. A condition keeps its lastTransitionTime while its status
//! stays.
//!
//! Each accepted Gateway gets a Service of its own ([`super::service`]): its address.
//! Each of its ports and hostnames is a unit ([`super::unit`]) that [`super::rollout`]
//! moves through the two-phase rollout; Programmed (Gateway and listener) and the routes'
//! `switchyard.dev/Served` say when every Envoy serves what they ask for.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::rollout::{Rollout, Sources};
use super::service::{self, GatewayKey, Wanted};
use super::service_writes;
use super::translate::{
    GatewayOutcome, Inputs, KnownCaBundle, KnownSecret, Translation, translate,
};
use super::unit;
use crate::api::ProxyConfig;
use crate::k8s::envoys::Envoys;
use crate::k8s::events::EventRecorder;
use crate::k8s::index::Watches;
use crate::k8s::status::StatusWriter;
use crate::prober::Prober;
use crate::translate::Problem;

mod grace;
mod policies;
mod services;
mod status;
mod stores;

use grace::Graces;
pub use status::SERVED;
use status::{Written, write_statuses};
use stores::{Echoes, Stores, owned};
pub use stores::{known, known_ca};

/// How long changes gather before the next translation. A change that comes when the
/// controller is idle, [`QUIET`] or more after the last one, starts a pass at once: a
/// user's lone change waits for nothing (the 10 ms of [`QUIET`] were a fifth of an
/// HTTPRoute's apply → Served). One that comes sooner, or while a pass runs, starts one
/// once no change came for [`QUIET`], or [`SETTLE`] after it, whichever is sooner: a
/// burst of events (a `kubectl apply` of many objects) costs a pass or two (a fixed 100 ms
/// after every event held each rollout step back 100 ms, ≈ 400 ms from an HTTPRoute's
/// apply to Served).
///
/// The echo of this controller's own writes is no change: a ProxyConfig the engine wrote
/// ([`crate::rollout::ProxyConfigs::echoes`]) and a status the status writer wrote
/// ([`StatusWriter::is_echo`]) come back as events, which counted, and an HTTPRoute applied
/// within [`QUIET`] of the Served status of the change before waited out [`QUIET`] in
/// front of its pass (≈ 11 ms of a header-only change's 45).
const SETTLE: Duration = Duration::from_millis(100);
const QUIET: Duration = Duration::from_millis(10);

/// A pass also runs this often without any change, to retry failed writes.
const RESYNC: Duration = Duration::from_secs(30);

pub struct Settings {
    /// The GatewayClass controllerName Switchyard answers to.
    pub controller_name: String,
    /// The Envoy fleet's Service (namespace, name): each Gateway's Service goes to its
    /// namespace, with its selector.
    pub fleet_service: (String, String),
    /// The type of each Gateway's Service: ClusterIP, NodePort or LoadBalancer.
    pub service_type: String,
    pub prober: Prober,
    /// Off only for tests that prove the two phases matter.
    pub two_phase: bool,
    /// The Envoys connected to this replica: a unit waiting on the fleet is looked at
    /// again when they answer.
    pub envoys: Arc<dyn Envoys>,
    /// The process's watches this controller reads, besides its own.
    pub watches: Watches,
    /// Writes the statuses, every front-end's.
    pub status: StatusWriter,
    /// What this replica's snapshot builder left out: a unit waiting on the fleet says
    /// what of it is its own.
    pub problems: watch::Receiver<Vec<Problem>>,
    /// How long a served route's change waits for a Service or ReferenceGrant its
    /// backendRefs name before it is served answering 500 (see [`grace`]).
    pub reference_grace: Duration,
    /// Where units' first ProxyConfigs may be written together (this term's, shared with
    /// the other front-ends).
    pub batches: Option<Arc<crate::rollout::Batches>>,
}

/// Runs until the returned future is dropped (when leadership is lost).
pub async fn run(client: Client, settings: Settings) {
    let changes = Arc::new(watch::channel(0).0);
    let mut changed = changes.subscribe();
    let controller = service::controller_label(&settings.controller_name);
    let sources = Sources {
        prober: settings.prober.clone(),
        fleet: settings.watches.fleet.clone(),
        problems: settings.problems.clone(),
        recorder: EventRecorder::new(&client),
        batches: settings.batches.clone(),
        envoys: settings.envoys.clone(),
    };
    let mut rollout = Rollout::new(
        client.clone(),
        settings.watches.proxy_configs.clone(),
        sources,
        controller,
        settings.two_phase,
    );
    let echoes = Echoes {
        proxy_configs: rollout.echoes(),
        status: settings.status.clone(),
    };
    let stores = Stores::start(
        &client,
        &settings.watches,
        &settings.fleet_service,
        &changes,
        &echoes,
    )
    .await;
    if !stores.ready().await {
        warn!("a Gateway API watch stopped before its initial list; not reconciling");
        return;
    }
    let mut answered = settings.envoys.changes();
    let mut release = CrdRelease::default();
    let mut graces = Graces::new(settings.reference_grace);
    // Where the search for a new port's fleet port goes on (see `service::allocate`).
    let mut next_fleet_port: Option<i32> = None;
    // When the last change was seen (long ago, at the start).
    let mut last_event: Option<tokio::time::Instant> = None;
    loop {
        let (wake, asked) = pass(
            &client,
            &settings,
            &stores,
            &mut rollout,
            (&mut release, &mut next_fleet_port, &mut graces),
            &answered,
        )
        .await;
        let waiting = wake.is_some();
        // A unit waits on the fleet only until shortly after its pass began: an Envoy's
        // answer that came after one still waiting last asked may be what it waits for,
        // and the next pass comes at once. Answers every waiting unit saw wake nobody.
        let latest = *answered.borrow_and_update();
        let asked_too_early = asked.is_some_and(|asked| latest > asked);
        // Changes that came while the pass ran: a burst may be under way.
        let busy = changed.has_changed().unwrap_or(false);
        if !asked_too_early {
            tokio::select! {
                result = changed.changed() => {
                    if result.is_err() { return }
                    let quiet = last_event.is_none_or(|at| at.elapsed() >= QUIET);
                    debug!(busy, quiet, "Gateway API change");
                    if busy || !quiet {
                        settle(&mut changed).await;
                    }
                    last_event = Some(tokio::time::Instant::now());
                }
                () = tokio::time::sleep(wake.unwrap_or(RESYNC)) => {}
                // An Envoy took a new snapshot: what a unit waits for may be there.
                Ok(()) = answered.changed(), if waiting => {}
            }
        }
        changed.mark_unchanged();
    }
}

/// Until no change came for [`QUIET`], or [`SETTLE`] has passed.
async fn settle(changed: &mut watch::Receiver<u64>) {
    let until = tokio::time::Instant::now() + SETTLE;
    loop {
        changed.mark_unchanged();
        let quiet = tokio::time::Instant::now() + QUIET;
        tokio::select! {
            result = changed.changed() => if result.is_err() { return },
            () = tokio::time::sleep_until(quiet.min(until)) => return,
        }
        if tokio::time::Instant::now() >= until {
            return;
        }
    }
}

/// One translation, the rollout of every unit, and the status writes they call for.
/// Returns when to come back, if sooner than the resync, and the pass's
/// [`super::rollout::Outcome::asked`].
async fn pass(
    client: &Client,
    settings: &Settings,
    stores: &Stores,
    rollout: &mut Rollout,
    (release, next_fleet_port, graces): (&mut CrdRelease, &mut Option<i32>, &mut Graces),
    answered: &watch::Receiver<u64>,
) -> (Option<Duration>, Option<u64>) {
    let classes = owned(&stores.classes);
    let gateways = owned(&stores.gateways);
    let routes = owned(&stores.routes);
    let grpc_routes = stores.grpc_routes.as_ref().map(owned).unwrap_or_default();
    let tls_routes = stores.tls_routes.as_ref().map(owned).unwrap_or_default();
    let tcp_routes = stores.tcp_routes.as_ref().map(owned).unwrap_or_default();
    let udp_routes = stores.udp_routes.as_ref().map(owned).unwrap_or_default();
    let grants = owned(&stores.grants);
    let services = owned(&stores.shared.services);
    let namespaces = owned(&stores.namespaces);
    let secrets: Vec<KnownSecret> = (stores.shared.tls_secrets.state().iter())
        .map(|s| known(s))
        .collect();
    let policies = stores
        .backend_tls_policies
        .as_ref()
        .map(owned)
        .unwrap_or_default();
    let listener_sets = stores.listener_sets.as_ref().map(owned).unwrap_or_default();
    let ca_bundles: Vec<KnownCaBundle> = (stores.config_maps.state().iter())
        .map(|c| known_ca(c))
        .collect();
    let crd_version = release.get(client).await;
    let inputs = Inputs {
        controller_name: &settings.controller_name,
        crd_version: crd_version.as_deref(),
        classes: &classes,
        gateways: &gateways,
        listener_sets: &listener_sets,
        routes: &routes,
        grpc_routes: &grpc_routes,
        tls_routes: &tls_routes,
        tcp_routes: &tcp_routes,
        udp_routes: &udp_routes,
        grants: &grants,
        services: &services,
        namespaces: &namespaces,
        secrets: &secrets,
        ca_bundles: &ca_bundles,
        backend_tls_policies: &policies,
    };
    let translation = translate(&inputs);
    // What is served: the same, but for routes whose change waits for an object.
    let now = tokio::time::Instant::now();
    let (lowered, waiting) = graces.review(&inputs, &translation, now);
    let served = (!waiting.is_empty()).then(|| translate(&lowered.inputs(&inputs)));
    let served = served.as_ref().unwrap_or(&translation);
    let grace_over = (waiting.values())
        .map(|w| w.until.saturating_duration_since(now))
        .min();
    debug!(
        classes = translation.classes.len(),
        gateways = translation.gateways.len(),
        routes = translation.routes.len(),
        grpc_routes = translation.grpc_routes.len(),
        tls_routes = translation.tls_routes.len(),
        tcp_routes = translation.tcp_routes.len(),
        udp_routes = translation.udp_routes.len(),
        "Gateway API translated"
    );
    let proxy_configs = owned(&stores.shared.proxy_configs);
    let existing = (services.as_slice(), proxy_configs.as_slice());
    let (fleet_ports, addresses) =
        sync_services(client, settings, served, existing, next_fleet_port).await;
    let units = unit::units(&served.gateways, &fleet_ports);
    let outcome = rollout.pass(&units, &gateways, answered).await;
    let written = Written {
        classes: &classes,
        gateways: &gateways,
        listener_sets: &listener_sets,
        routes: &routes,
        grpc_routes: &grpc_routes,
        tls_routes: &tls_routes,
        tcp_routes: &tcp_routes,
        udp_routes: &udp_routes,
        policies: &policies,
        addresses: &addresses,
        units: &units,
        outcome: &outcome,
        waiting: &waiting,
    };
    write_statuses(settings, &translation, &written);
    let wake = match (outcome.wake, grace_over) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    (wake, outcome.asked)
}

/// The release the installed Gateway CRD announces (its bundle-version annotation), read
/// again at most every [`RESYNC`]: once per pass, it was one API round trip in front of
/// every rollout step.
#[derive(Default)]
struct CrdRelease {
    /// What the last read found, and when.
    read: Option<(Option<String>, tokio::time::Instant)>,
}

impl CrdRelease {
    async fn get(&mut self, client: &Client) -> Option<String> {
        if let Some((release, at)) = &self.read
            && at.elapsed() < RESYNC
        {
            return release.clone();
        }
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        match crds.get_opt("gateways.gateway.networking.k8s.io").await {
            Ok(crd) => {
                let release = crd
                    .and_then(|crd| crd.metadata.annotations)
                    .and_then(|a| a.get("gateway.networking.k8s.io/bundle-version").cloned());
                self.read = Some((release.clone(), tokio::time::Instant::now()));
                release
            }
            // Asked again on the next pass.
            Err(error) => {
                debug!(%error, "cannot read the Gateway CRD's release");
                self.read.as_ref().and_then(|(release, _)| release.clone())
            }
        }
    }
}

/// The fleet ports of each Gateway (port → fleet port), and its addresses.
type Allocated = (
    BTreeMap<GatewayKey, Vec<(i32, i32)>>,
    BTreeMap<GatewayKey, Vec<(String, String)>>,
);

/// Writes each accepted Gateway's Service (when it differs from what is there), deletes
/// those of Gateways gone or no longer accepted; gives each Gateway's fleet ports, and its
/// addresses as its Service has them now.
async fn sync_services(
    client: &Client,
    settings: &Settings,
    translation: &Translation,
    (services, proxy_configs): (&[Service], &[ProxyConfig]),
    next_fleet_port: &mut Option<i32>,
) -> Allocated {
    let (fleet_ns, fleet_name) = &settings.fleet_service;
    let label = service::controller_label(&settings.controller_name);
    let (ours, others): (Vec<Service>, Vec<Service>) = services
        .iter()
        .filter(|s| s.metadata.namespace.as_deref() == Some(fleet_ns.as_str()))
        .filter(|s| service::gateway_of(s).is_some())
        .cloned()
        .partition(|s| service::written_by(s, &label));
    let selector = services
        .iter()
        .find(|s| {
            s.metadata.namespace.as_deref() == Some(fleet_ns.as_str())
                && s.metadata.name.as_deref() == Some(fleet_name.as_str())
        })
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.selector.clone())
        .filter(|s| !s.is_empty());
    let Some(selector) = selector else {
        warn!(
            fleet = %format!("{fleet_ns}/{fleet_name}"),
            "the fleet Service has no selector: Gateways get no Service of their own"
        );
        return (BTreeMap::new(), BTreeMap::new());
    };
    let wanted: Vec<Wanted> = translation
        .gateways
        .iter()
        .filter(|g| !g.ports.is_empty())
        .map(|g| Wanted {
            namespace: g.namespace.clone(),
            name: g.name.clone(),
            ports: service_ports(translation, g),
        })
        .collect();
    let listening: BTreeSet<i32> = (proxy_configs.iter())
        .filter_map(|pc| pc.spec.listener.as_ref())
        .map(|l| l.port)
        .collect();
    let from = next_fleet_port.unwrap_or_else(|| service::first_search(&ours));
    let (allocation, next) = service::allocate(&wanted, &ours, &others, &listening, from);
    *next_fleet_port = Some(next);
    let api: Api<Service> = Api::namespaced(client.clone(), fleet_ns);
    let mut addresses = BTreeMap::new();
    for (gateway, ports) in &allocation {
        let outcome = (translation.gateways.iter())
            .find(|g| (&g.namespace, &g.name) == (&gateway.0, &gateway.1));
        let infrastructure = outcome
            .map(|g| g.infrastructure.clone())
            .unwrap_or_default();
        let udp_ports: BTreeSet<i32> = (outcome.iter())
            .flat_map(|g| &g.ports)
            .filter(|p| p.protocol == "UDP")
            .map(|p| p.port)
            .collect();
        let desired = service::service(
            gateway,
            ports,
            &udp_ports,
            &infrastructure,
            (fleet_ns, &selector),
            &settings.service_type,
            &label,
        );
        let name = desired.metadata.name.clone().unwrap_or_default();
        let current = ours
            .iter()
            .find(|s| service::gateway_of(s).as_ref() == Some(gateway));
        if current.is_none_or(|c| !same_service(c, &desired)) {
            match service_writes::apply_as_read(&api, &desired, current).await {
                Ok(()) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    debug!(%name, "a Gateway's Service changed since it was read; the next pass reads it afresh");
                }
                Err(error) => {
                    warn!(%name, %error, "writing a Gateway's Service failed; retried on the next pass");
                }
            }
        }
        let found = current.map(service::addresses).unwrap_or_default();
        addresses.insert(gateway.clone(), found);
    }
    for stale in ours
        .iter()
        .filter(|s| service::gateway_of(s).is_some_and(|g| !allocation.contains_key(&g)))
    {
        let name = stale.metadata.name.clone().unwrap_or_default();
        match service_writes::delete_as_read(&api, stale).await {
            Ok(_) => debug!(%name, "Service of a Gateway gone deleted"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                debug!(%name, "a Gateway's Service changed since it was read; the next pass reads it afresh");
            }
            Err(error) => warn!(%name, %error, "deleting a Gateway's Service failed"),
        }
    }
    (allocation, addresses)
}

/// The ports of a Gateway's Service: those it serves, and those of its listeners that are
/// not valid (its own and its ListenerSets'). No Envoy listens on the fleet port of one of
/// those, so a client is refused at once, where a port the Service did not have would leave
/// it waiting for its connect timeout; and the port is there when the listener is fixed.
fn service_ports(translation: &Translation, gateway: &GatewayOutcome) -> BTreeSet<i32> {
    let key = (&gateway.namespace, &gateway.name);
    let of_sets = (translation.listener_sets.iter())
        .filter(|s| (&s.gateway.0, &s.gateway.1) == key)
        .flat_map(|s| s.listeners.iter());
    (gateway.ports.iter().map(|p| p.port))
        .chain(gateway.listeners.iter().chain(of_sets).map(|l| l.port))
        .collect()
}

/// Whether the Service there already is what Switchyard wants of it.
fn same_service(current: &Service, desired: &Service) -> bool {
    let spec = |s: &Service| {
        s.spec
            .as_ref()
            .map(|spec| (spec.type_.clone(), spec.selector.clone()))
    };
    let infrastructure = |s: &Service| {
        (s.metadata.annotations.as_ref())
            .and_then(|a| a.get(service::INFRASTRUCTURE_ANNOTATION))
            .cloned()
    };
    let protocols = |s: &Service| -> Vec<(i32, Option<String>)> {
        (s.spec.iter())
            .flat_map(|spec| spec.ports.iter().flatten())
            .map(|p| (p.port, p.protocol.clone()))
            .collect()
    };
    service::fleet_ports(current) == service::fleet_ports(desired)
        && protocols(current) == protocols(desired)
        && spec(current) == spec(desired)
        && current.metadata.labels == desired.metadata.labels
        && infrastructure(current) == infrastructure(desired)
}
