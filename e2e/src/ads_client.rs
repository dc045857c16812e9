//! Simulated Envoys for scale tests and benchmarks: one ADS stream each, SotW or delta,
//! asking for resources the way Envoy does and ACKing everything.
//!
//! A client subscribes to clusters and listeners as wildcards, then to the
//! ClusterLoadAssignments its clusters name, and to the route configurations and secrets
//! its listeners name; a delta client, to the virtual hosts (VHDS) of each route
//! configuration it holds that has a `vhds` source, by the configuration's name as a
//! namespace. It keeps what it holds (type → name → version and body) and counts the
//! responses and bytes it receives per type. Clients are tokio tasks: a thousand of
//! them share a few HTTP/2 connections ([`connect_channels`]).

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{Node, transport_socket};
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};
use switchyard::xds::snapshot::{CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, VIRTUAL_HOST};
use switchyard::xds::{Protocol, Resource, Snapshot, localize, vhds};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

/// Streams per HTTP/2 connection: the server's default limit is 200 concurrent streams
/// (hyper's), and a client past it waits for a slot instead of connecting.
pub const STREAMS_PER_CHANNEL: usize = 100;

/// Large enough for every type of a 10k-route snapshot in one SotW response.
const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// What a client holds of one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The server's version (delta), or the content hash of the body (SotW, whose
    /// responses carry no per-resource version); both are the snapshot's version.
    pub version: String,
    pub body: Vec<u8>,
}

/// Responses and their encoded bytes received, of one type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Received {
    pub responses: u64,
    pub bytes: u64,
}

/// Received counts per type URL.
pub type Counts = BTreeMap<String, Received>;

/// What `now` has that `mark` had not: the traffic between two reads of [`AdsClient::received`].
pub fn received_since(now: &Counts, mark: &Counts) -> Counts {
    now.iter()
        .map(|(type_url, n)| {
            let m = mark.get(type_url).copied().unwrap_or_default();
            let diff = Received {
                responses: n.responses - m.responses,
                bytes: n.bytes - m.bytes,
            };
            (type_url.clone(), diff)
        })
        .filter(|(_, r)| r.responses > 0)
        .collect()
}

/// The names and versions a client should hold, per type: a snapshot's, computed once so
/// that a thousand waiting clients compare against it cheaply.
pub struct Target {
    types: BTreeMap<String, TargetType>,
}

struct TargetType {
    versions: BTreeMap<String, String>,
    fingerprint: u64,
}

impl Target {
    /// Everything `snapshot` holds: what any client holds of a snapshot without route
    /// configurations in parts (see [`Target::for_protocol`]).
    pub fn of(snapshot: &Snapshot) -> Self {
        Self::filtered(snapshot, |_, _| true)
    }

    /// What a client of `protocol` holds of `snapshot`. Where a route configuration also
    /// comes in parts (VHDS), a delta client holds the parts configuration, its virtual
    /// hosts and listeners that name the parts; a SotW client the whole configuration.
    pub fn for_protocol(snapshot: &Snapshot, protocol: Protocol) -> Self {
        let routes = snapshot.resources(ROUTE);
        let wholes: BTreeSet<&str> = routes
            .into_iter()
            .flat_map(|routes| routes.keys())
            .filter(|name| routes.is_some_and(|r| r.contains_key(&vhds::parts_name(name))))
            .map(String::as_str)
            .collect();
        if wholes.is_empty() {
            return Self::of(snapshot);
        }
        let parts: BTreeSet<String> = wholes.iter().map(|n| vhds::parts_name(n)).collect();
        match protocol {
            Protocol::Sotw => Self::filtered(snapshot, |type_url, name| {
                type_url != VIRTUAL_HOST && !(type_url == ROUTE && parts.contains(name))
            }),
            Protocol::Delta => {
                let in_parts = localize::serve_routes_in_parts(snapshot);
                Self::filtered(&in_parts, |type_url, name| {
                    !(type_url == ROUTE && wholes.contains(name))
                })
            }
        }
    }

    /// The resources of `snapshot` that `keep` (type URL, name) keeps.
    fn filtered(snapshot: &Snapshot, keep: impl Fn(&str, &str) -> bool) -> Self {
        let types = snapshot
            .types()
            .map(|(type_url, resources)| {
                let versions: BTreeMap<String, String> = resources
                    .values()
                    .filter(|r| keep(type_url, &r.name))
                    .map(|r| (r.name.clone(), r.version.clone()))
                    .collect();
                let fingerprint = versions
                    .iter()
                    .fold(0u64, |sum, (n, v)| sum.wrapping_add(entry_hash(n, v)));
                let target = TargetType {
                    versions,
                    fingerprint,
                };
                (type_url.to_string(), target)
            })
            .collect();
        Self { types }
    }
}

/// One simulated Envoy. Dropping it closes its stream.
pub struct AdsClient {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AdsClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AdsClient {
    /// Opens one ADS stream on `channel` and starts following the server.
    pub fn spawn(channel: Channel, protocol: Protocol, node_id: impl Into<String>) -> Self {
        let node = Node {
            id: node_id.into(),
            cluster: "simulated".into(),
            ..Default::default()
        };
        let mirror = Mirror {
            node_id: node.id.clone(),
            ..Mirror::default()
        };
        let shared = Arc::new(Shared {
            mirror: Mutex::new(mirror),
            progress: watch::channel(0).0,
        });
        let task = tokio::spawn({
            let shared = shared.clone();
            async move {
                let result = match protocol {
                    Protocol::Sotw => run_sotw(channel, node, &shared).await,
                    Protocol::Delta => run_delta(channel, node, &shared).await,
                };
                if let Err(error) = result {
                    shared.lock().failure = Some(format!("{error:#}"));
                    shared.progress.send_modify(|n| *n += 1);
                }
            }
        });
        Self { shared, task }
    }

    pub fn node_id(&self) -> String {
        self.shared.lock().node_id.clone()
    }

    /// Responses and bytes received so far, per type URL.
    pub fn received(&self) -> Counts {
        self.shared.lock().received.clone()
    }

    /// Everything the client holds: type URL → name → version and body.
    pub fn state(&self) -> BTreeMap<String, BTreeMap<String, Held>> {
        self.shared
            .lock()
            .types
            .iter()
            .filter(|(_, held)| !held.resources.is_empty())
            .map(|(type_url, held)| (type_url.clone(), held.resources.clone()))
            .collect()
    }

    /// Why the stream ended, if it did.
    pub fn failure(&self) -> Option<String> {
        self.shared.lock().failure.clone()
    }

    /// Waits until the client holds exactly `target` (names and versions of every type)
    /// and has ACKed it. Returns when it got there, as the client saw it.
    pub async fn wait_for(&self, target: &Target, timeout: Duration) -> anyhow::Result<Instant> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut progress = self.shared.progress.subscribe();
        loop {
            {
                let mirror = self.shared.lock();
                if let Some(failure) = &mirror.failure {
                    bail!("client stream failed: {failure}");
                }
                if mirror.holds(target) {
                    return Ok(mirror.updated_at);
                }
            }
            if tokio::time::timeout_at(deadline, progress.changed())
                .await
                .is_err()
            {
                bail!(
                    "client did not reach the target within {timeout:?}; it differs in: {}",
                    self.shared.lock().differences(target)
                );
            }
        }
    }
}

/// `count` connections to the ADS server on 127.0.0.1:`port`.
pub async fn connect_channels(port: u16, count: usize) -> anyhow::Result<Vec<Channel>> {
    let endpoint = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .context("the ADS address")?
        .connect_timeout(Duration::from_secs(5));
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count {
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("connecting to the ADS server on port {port}"))?;
        channels.push(channel);
    }
    Ok(channels)
}

/// `sotw` SotW clients then `delta` delta clients, [`STREAMS_PER_CHANNEL`] to a
/// connection, node ids `sotw-N` and `delta-N`.
pub async fn spawn_fleet(port: u16, sotw: usize, delta: usize) -> anyhow::Result<Vec<AdsClient>> {
    let total = sotw + delta;
    let channels = connect_channels(port, total.div_ceil(STREAMS_PER_CHANNEL).max(1)).await?;
    let clients = (0..total)
        .map(|i| {
            let channel = channels[i / STREAMS_PER_CHANNEL].clone();
            if i < sotw {
                AdsClient::spawn(channel, Protocol::Sotw, format!("sotw-{i}"))
            } else {
                AdsClient::spawn(channel, Protocol::Delta, format!("delta-{}", i - sotw))
            }
        })
        .collect();
    Ok(clients)
}

/// Waits for every client to hold `target`; returns when each got there, in order.
pub async fn wait_all(
    clients: &[AdsClient],
    target: &Target,
    timeout: Duration,
) -> anyhow::Result<Vec<Instant>> {
    let waits = clients.iter().map(|client| async move {
        client
            .wait_for(target, timeout)
            .await
            .with_context(|| format!("client {}", client.node_id()))
    });
    futures::future::try_join_all(waits).await
}

struct Shared {
    mirror: Mutex<Mirror>,
    /// Bumped after every response is applied and ACKed, and when the stream fails.
    progress: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Mirror> {
        // Plain data: a panic elsewhere leaves nothing half-done worth refusing to read.
        self.mirror.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn touch(&self) {
        self.progress.send_modify(|n| *n += 1);
    }
}

/// What the client holds and has received, shared between its task and its readers.
struct Mirror {
    node_id: String,
    types: BTreeMap<String, TypeHeld>,
    received: Counts,
    failure: Option<String>,
    updated_at: Instant,
}

impl Default for Mirror {
    fn default() -> Self {
        Self {
            node_id: String::new(),
            types: BTreeMap::new(),
            received: Counts::new(),
            failure: None,
            updated_at: Instant::now(),
        }
    }
}

/// Resources of one type, with a sum of hashes of (name, version) kept up to date so that
/// comparing with a target is cheap until it is likely equal.
#[derive(Default)]
struct TypeHeld {
    resources: BTreeMap<String, Held>,
    fingerprint: u64,
    /// Names added, changed or removed since the client last followed their references
    /// ([`Subscriptions::update`]): a change costs the client what it changed, as it
    /// costs Envoy, not a walk of everything held.
    touched: BTreeSet<String>,
}

impl TypeHeld {
    fn insert(&mut self, name: String, held: Held) {
        self.fingerprint = self
            .fingerprint
            .wrapping_add(entry_hash(&name, &held.version));
        self.touched.insert(name.clone());
        if let Some(old) = self.resources.insert(name.clone(), held) {
            self.fingerprint = self
                .fingerprint
                .wrapping_sub(entry_hash(&name, &old.version));
        }
    }

    fn remove(&mut self, name: &str) {
        if let Some(old) = self.resources.remove(name) {
            self.fingerprint = self
                .fingerprint
                .wrapping_sub(entry_hash(name, &old.version));
            self.touched.insert(name.to_owned());
        }
    }

    /// Forgets what is not subscribed, as Envoy does; true if that was anything. Virtual
    /// hosts are subscribed by namespace (their route configuration's name), everything
    /// else by name. Also forgets what a response still in flight brought after its name
    /// was dropped.
    fn keep_subscribed(&mut self, type_url: &str, names: Option<&BTreeMap<String, usize>>) -> bool {
        let subscribed = |name: &str| {
            let name = if type_url == VIRTUAL_HOST {
                vhds::namespace(name)
            } else {
                name
            };
            names.is_some_and(|names| names.contains_key(name))
        };
        self.keep(subscribed)
    }

    /// Forgets every resource not named in `names`.
    fn keep_only(&mut self, names: &BTreeSet<String>) {
        self.keep(|name| names.contains(name));
    }

    /// Forgets every resource whose name `keep` refuses; true if that was any.
    fn keep(&mut self, keep: impl Fn(&str) -> bool) -> bool {
        let gone: Vec<String> = self
            .resources
            .keys()
            .filter(|name| !keep(name))
            .cloned()
            .collect();
        for name in &gone {
            self.remove(name);
        }
        !gone.is_empty()
    }
}

impl Mirror {
    fn holds(&self, target: &Target) -> bool {
        let empty = TypeHeld::default();
        let held = |type_url: &str| self.types.get(type_url).unwrap_or(&empty);
        let extra = self
            .types
            .iter()
            .any(|(t, h)| !h.resources.is_empty() && !target.types.contains_key(t));
        if extra {
            return false;
        }
        let likely = target.types.iter().all(|(t, want)| {
            let have = held(t);
            have.resources.len() == want.versions.len() && have.fingerprint == want.fingerprint
        });
        // The fingerprints match: confirm entry by entry.
        likely
            && target.types.iter().all(|(t, want)| {
                held(t)
                    .resources
                    .iter()
                    .zip(&want.versions)
                    .all(|((n, h), (wn, wv))| n == wn && &h.version == wv)
            })
    }

    /// A short description of how the held state differs from `target`, for errors.
    fn differences(&self, target: &Target) -> String {
        let empty = BTreeMap::new();
        let mut lines = Vec::new();
        for (type_url, want) in &target.types {
            let have = self.types.get(type_url).map_or(&empty, |h| &h.resources);
            let missing = want
                .versions
                .iter()
                .filter(|(n, v)| have.get(*n).map(|h| &h.version) != Some(*v))
                .count();
            let extra = have
                .keys()
                .filter(|n| !want.versions.contains_key(*n))
                .count();
            if missing + extra > 0 {
                lines.push(format!(
                    "{}: {missing} missing or outdated, {extra} extra",
                    short(type_url)
                ));
            }
        }
        if lines.is_empty() {
            "nothing (an ACK may be missing)".to_string()
        } else {
            lines.join("; ")
        }
    }

    fn count(&mut self, type_url: &str, bytes: usize) {
        let received = self.received.entry(type_url.to_string()).or_default();
        received.responses += 1;
        received.bytes += bytes as u64;
    }
}

fn entry_hash(name: &str, version: &str) -> u64 {
    // DefaultHasher::new() has fixed keys: the same in the target and in every client.
    let mut hasher = DefaultHasher::new();
    (name, version).hash(&mut hasher);
    hasher.finish()
}

fn short(type_url: &str) -> &str {
    type_url.rsplit('.').next().unwrap_or(type_url)
}

/// The names one cluster or listener makes the client ask for, by type.
#[derive(Clone, Default)]
struct References {
    /// Version of the resource these were read from.
    version: String,
    names: Vec<(&'static str, String)>,
}

/// A subscription that changes: the names it gains and loses.
struct Change {
    type_url: &'static str,
    subscribed: Vec<String>,
    unsubscribed: Vec<String>,
    /// It named nothing before.
    was_empty: bool,
}

/// What the client asks for beyond the wildcards, and the references it derived them
/// from (kept per resource, so unchanged resources are not decoded again).
#[derive(Default)]
struct Subscriptions {
    /// Whether route configurations with a `vhds` source make the client ask for their
    /// virtual hosts: Envoy does VHDS over delta xDS only.
    vhds: bool,
    /// Source type URL (CLUSTER, LISTENER, ROUTE) → resource name → what it refers to.
    references: BTreeMap<&'static str, BTreeMap<String, References>>,
    /// Type URL → names subscribed (ENDPOINT, ROUTE, SECRET; VIRTUAL_HOST: namespaces),
    /// each with how many held resources refer to it: subscribed while that is not 0.
    names: BTreeMap<&'static str, BTreeMap<String, usize>>,
}

impl Subscriptions {
    fn new(protocol: Protocol) -> Self {
        Self {
            vhds: protocol == Protocol::Delta,
            ..Self::default()
        }
    }

    /// After a response of `type_url`: re-reads the references of what it changed,
    /// forgets what the client no longer subscribes to, and follows on (a listener that
    /// stops naming a route configuration drops that configuration's virtual hosts too).
    /// Returns the subscriptions that change, in the order found.
    fn follow(&mut self, type_url: &str, mirror: &mut Mirror) -> anyhow::Result<Vec<Change>> {
        let mut changes = Vec::new();
        let mut next = vec![type_url.to_string()];
        while let Some(type_url) = next.pop() {
            let held = mirror.types.entry(type_url.clone()).or_default();
            let found = self.update(&type_url, held)?;
            for change in &found {
                // Only a name dropped can leave something held unsubscribed: then every
                // name held is looked at, once.
                let held = mirror.types.entry(change.type_url.to_string()).or_default();
                let names = self.names.get(change.type_url);
                if !change.unsubscribed.is_empty() && held.keep_subscribed(change.type_url, names) {
                    next.push(change.type_url.to_string());
                }
            }
            changes.extend(found);
        }
        Ok(changes)
    }

    /// Re-reads the references of the clusters, listeners or route configurations
    /// changed since the last call, and returns the types whose subscription changes.
    fn update(&mut self, type_url: &str, held: &mut TypeHeld) -> anyhow::Result<Vec<Change>> {
        let touched = std::mem::take(&mut held.touched);
        let (source, derived): (&'static str, &[&'static str]) = match type_url {
            CLUSTER => (CLUSTER, &[ENDPOINT]),
            LISTENER => (LISTENER, &[ROUTE, SECRET]),
            ROUTE if self.vhds => (ROUTE, &[VIRTUAL_HOST]),
            _ => return Ok(Vec::new()),
        };
        let references = self.references.entry(source).or_default();
        // The derived names whose count moved, and whether each was subscribed before.
        let mut moved: BTreeMap<(&'static str, String), bool> = BTreeMap::new();
        let mut count = |(t, name): &(&'static str, String), up: bool| {
            let counts = self.names.entry(t).or_default();
            let n = counts.entry(name.clone()).or_default();
            moved.entry((*t, name.clone())).or_insert(*n > 0);
            if up {
                *n += 1;
            } else {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(name);
                }
            }
        };
        for name in touched {
            let resource = held.resources.get(&name);
            let known = references.get(&name);
            if let (Some(resource), Some(known)) = (resource, known)
                && known.version == resource.version
            {
                continue;
            }
            for reference in references.remove(&name).into_iter().flat_map(|r| r.names) {
                count(&reference, false);
            }
            let Some(resource) = resource else {
                continue;
            };
            let names = references_of(type_url, &name, &resource.body)
                .with_context(|| format!("decoding {} {name}", short(type_url)))?;
            for reference in &names {
                count(reference, true);
            }
            let version = resource.version.clone();
            references.insert(name, References { version, names });
        }
        let mut changes = Vec::new();
        for &derived_type in derived {
            let counts = self.names.get(derived_type);
            let now = |name: &String| counts.is_some_and(|c| c.contains_key(name));
            let mut change = Change {
                type_url: derived_type,
                subscribed: Vec::new(),
                unsubscribed: Vec::new(),
                was_empty: false,
            };
            for ((t, name), before) in &moved {
                match (*t == derived_type, *before, now(name)) {
                    (true, false, true) => change.subscribed.push(name.clone()),
                    (true, true, false) => change.unsubscribed.push(name.clone()),
                    _ => {}
                }
            }
            if change.subscribed.is_empty() && change.unsubscribed.is_empty() {
                continue;
            }
            let after = counts.map_or(0, BTreeMap::len);
            change.was_empty = after + change.unsubscribed.len() == change.subscribed.len();
            changes.push(change);
        }
        Ok(changes)
    }

    /// Names to send with a SotW request of this type (wildcards send none).
    fn names_of(&self, type_url: &str) -> Vec<String> {
        self.names
            .get(type_url)
            .map(|names| names.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// The names a cluster (its ClusterLoadAssignment), a listener (route configurations of
/// its HTTP connection managers, secrets of its TLS contexts) or a route configuration
/// with a `vhds` source (its virtual hosts' namespace, its own name) refers to.
fn references_of(
    type_url: &str,
    name: &str,
    body: &[u8],
) -> anyhow::Result<Vec<(&'static str, String)>> {
    let mut names = Vec::new();
    if type_url == ROUTE {
        if has_vhds(body)? {
            names.push((VIRTUAL_HOST, name.to_string()));
        }
    } else if type_url == CLUSTER {
        let cluster = Cluster::decode(body)?;
        if let Some(eds) = &cluster.eds_cluster_config {
            let name = if eds.service_name.is_empty() {
                cluster.name.clone()
            } else {
                eds.service_name.clone()
            };
            names.push((ENDPOINT, name));
        }
    } else if type_url == LISTENER {
        let listener = Listener::decode(body)?;
        for chain in listener
            .filter_chains
            .iter()
            .chain(&listener.default_filter_chain)
        {
            chain_references(chain, &mut names)?;
        }
    }
    Ok(names)
}

/// Whether a RouteConfiguration has its `vhds` field (9) set. Read from the top-level
/// fields only: an inline configuration at 10k routes is most of a megabyte, and every
/// client re-reads it on every change.
fn has_vhds(body: &[u8]) -> anyhow::Result<bool> {
    const VHDS: u32 = 9;
    let mut rest = body;
    while !rest.is_empty() {
        let (tag, wire_type) = prost::encoding::decode_key(&mut rest)?;
        if tag == VHDS {
            return Ok(true);
        }
        prost::encoding::skip_field(wire_type, tag, &mut rest, Default::default())?;
    }
    Ok(false)
}

fn chain_references(
    chain: &FilterChain,
    names: &mut Vec<(&'static str, String)>,
) -> anyhow::Result<()> {
    for f in &chain.filters {
        if let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type
            && let Some(hcm) = unpack::<HttpConnectionManager>(any)?
            && let Some(RouteSpecifier::Rds(rds)) = &hcm.route_specifier
        {
            names.push((ROUTE, rds.route_config_name.clone()));
        }
    }
    if let Some(socket) = &chain.transport_socket
        && let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type
        && let Some(tls) = unpack::<DownstreamTlsContext>(any)?
        && let Some(common) = &tls.common_tls_context
    {
        for sds in &common.tls_certificate_sds_secret_configs {
            names.push((SECRET, sds.name.clone()));
        }
    }
    Ok(())
}

fn unpack<M: Message + Default + Name>(any: &Any) -> anyhow::Result<Option<M>> {
    if any.type_url != M::type_url() {
        return Ok(None);
    }
    let message =
        M::decode(any.value.as_slice()).with_context(|| format!("decoding {}", M::full_name()))?;
    Ok(Some(message))
}

async fn send<T>(tx: &mpsc::Sender<T>, request: T) -> anyhow::Result<()> {
    tx.send(request)
        .await
        .map_err(|_| anyhow::anyhow!("the request stream is closed"))
}

async fn run_sotw(channel: Channel, node: Node, shared: &Shared) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel(64);
    for (i, type_url) in [CLUSTER, LISTENER].into_iter().enumerate() {
        let request = DiscoveryRequest {
            node: (i == 0).then(|| node.clone()),
            type_url: type_url.to_string(),
            ..Default::default()
        };
        send(&tx, request).await?;
    }
    let mut grpc =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut responses = grpc
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .context("opening a SotW stream")?
        .into_inner();
    let mut subscriptions = Subscriptions::new(Protocol::Sotw);
    // Per type: (version_info, nonce) of the last response, echoed by later requests.
    let mut last: BTreeMap<String, (String, String)> = BTreeMap::new();
    loop {
        let Some(mut response) = responses.message().await.context("reading a response")? else {
            bail!("the server ended the stream");
        };
        let type_url = response.type_url.clone();
        let bytes = response.encoded_len();
        let changes = {
            let mut mirror = shared.lock();
            mirror.count(&type_url, bytes);
            let held = mirror.types.entry(type_url.clone()).or_default();
            apply_sotw(held, &mut response).context("applying a SotW response")?;
            subscriptions.follow(&type_url, &mut mirror)?
        };
        // New names first (Envoy asks for the endpoints of new clusters before it ACKs
        // them), then the ACK.
        for change in changes {
            let (version_info, response_nonce) =
                last.get(change.type_url).cloned().unwrap_or_default();
            let request = DiscoveryRequest {
                type_url: change.type_url.to_string(),
                resource_names: subscriptions.names_of(change.type_url),
                version_info,
                response_nonce,
                ..Default::default()
            };
            send(&tx, request).await?;
        }
        let ack = DiscoveryRequest {
            type_url: type_url.clone(),
            resource_names: subscriptions.names_of(&type_url),
            version_info: response.version_info.clone(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        };
        send(&tx, ack).await?;
        last.insert(type_url, (response.version_info, response.nonce));
        shared.lock().updated_at = Instant::now();
        shared.touch();
    }
}

/// A SotW response of listeners or clusters is the whole set of its type; one of another
/// type may carry only what changed, and what it leaves out is kept, as Envoy keeps it
/// (names no longer asked for are forgotten by the subscriptions). Applied in place:
/// most of it is what the client already holds.
fn apply_sotw(held: &mut TypeHeld, response: &mut DiscoveryResponse) -> anyhow::Result<()> {
    let whole = response.type_url == CLUSTER || response.type_url == LISTENER;
    let mut names = BTreeSet::new();
    for any in std::mem::take(&mut response.resources) {
        let name = name_of(&any.value)
            .context("reading a resource's name")?
            .to_string();
        // Unchanged bodies keep their version: hashing every body of every response would
        // cost the simulation more than the server.
        if held
            .resources
            .get(&name)
            .is_none_or(|h| h.body != any.value)
        {
            // Versioned as the server's snapshot versions its resources.
            let resource = Resource::new(name.clone(), any);
            let held_now = Held {
                version: resource.version,
                body: resource.body.value,
            };
            held.insert(resource.name, held_now);
        }
        names.insert(name);
    }
    if whole {
        held.keep_only(&names);
    }
    Ok(())
}

/// Field 1, the name in every served type (Cluster, ClusterLoadAssignment, Listener,
/// RouteConfiguration, Secret), read in place: the rest of a large body is skipped.
fn name_of(body: &[u8]) -> anyhow::Result<&str> {
    let mut rest = body;
    while !rest.is_empty() {
        let (tag, wire_type) = prost::encoding::decode_key(&mut rest)?;
        if tag == 1 && wire_type == prost::encoding::WireType::LengthDelimited {
            let len = usize::try_from(prost::encoding::decode_varint(&mut rest)?)?;
            let name = rest.get(..len).context("a name past the end of the body")?;
            return Ok(std::str::from_utf8(name)?);
        }
        prost::encoding::skip_field(wire_type, tag, &mut rest, Default::default())?;
    }
    Ok("")
}

async fn run_delta(channel: Channel, node: Node, shared: &Shared) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel(64);
    // Empty first requests: the legacy wildcard subscription Envoy uses for CDS and LDS.
    for (i, type_url) in [CLUSTER, LISTENER].into_iter().enumerate() {
        let request = DeltaDiscoveryRequest {
            node: (i == 0).then(|| node.clone()),
            type_url: type_url.to_string(),
            ..Default::default()
        };
        send(&tx, request).await?;
    }
    let mut grpc =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut responses = grpc
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .context("opening a delta stream")?
        .into_inner();
    let mut subscriptions = Subscriptions::new(Protocol::Delta);
    loop {
        let Some(mut response) = responses.message().await.context("reading a response")? else {
            bail!("the server ended the stream");
        };
        let type_url = response.type_url.clone();
        let bytes = response.encoded_len();
        let changes = {
            let mut mirror = shared.lock();
            mirror.count(&type_url, bytes);
            let held = mirror.types.entry(type_url.clone()).or_default();
            apply_delta(held, &mut response);
            subscriptions.follow(&type_url, &mut mirror)?
        };
        for change in changes {
            // A first request that names nothing would be a wildcard subscription.
            if change.was_empty && change.subscribed.is_empty() {
                continue;
            }
            let request = DeltaDiscoveryRequest {
                type_url: change.type_url.to_string(),
                resource_names_subscribe: change.subscribed,
                resource_names_unsubscribe: change.unsubscribed,
                ..Default::default()
            };
            send(&tx, request).await?;
        }
        let ack = DeltaDiscoveryRequest {
            type_url,
            response_nonce: response.nonce,
            ..Default::default()
        };
        send(&tx, ack).await?;
        shared.lock().updated_at = Instant::now();
        shared.touch();
    }
}

fn apply_delta(held: &mut TypeHeld, response: &mut DeltaDiscoveryResponse) {
    for resource in std::mem::take(&mut response.resources) {
        let body = resource.resource.map(|any| any.value).unwrap_or_default();
        held.insert(
            resource.name,
            Held {
                version: resource.version,
                body,
            },
        );
    }
    for name in &response.removed_resources {
        held.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
    use envoy_types::pb::envoy::config::core::v3::{AggregatedConfigSource, ConfigSource};
    use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, Vhds, VirtualHost};

    use super::*;

    fn route_config(name: &str, hosts: usize, vhds: bool) -> Vec<u8> {
        RouteConfiguration {
            name: name.into(),
            virtual_hosts: (0..hosts)
                .map(|i| VirtualHost {
                    name: format!("host-{i}"),
                    domains: vec![format!("h{i}.example.com")],
                    ..Default::default()
                })
                .collect(),
            vhds: vhds.then(|| Vhds {
                config_source: Some(ConfigSource {
                    config_source_specifier: Some(ConfigSourceSpecifier::Ads(
                        AggregatedConfigSource {},
                    )),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn a_route_configuration_with_a_vhds_source_is_told_from_its_top_level_fields() {
        assert!(has_vhds(&route_config("r+vhds", 0, true)).expect("reads"));
        assert!(has_vhds(&route_config("r", 3, true)).expect("reads"));
        assert!(!has_vhds(&route_config("r", 3, false)).expect("reads"));
        assert!(!has_vhds(&[]).expect("an empty configuration has none"));
        // A virtual host past the end of the body: an error, not a panic.
        let mut cut = route_config("r", 3, false);
        cut.truncate(cut.len() - 2);
        assert!(has_vhds(&cut).is_err());
    }

    #[test]
    fn a_delta_client_asks_for_the_virtual_hosts_of_configurations_in_parts_only() {
        let mut held = TypeHeld::default();
        let put = |held: &mut TypeHeld, name: &str, vhds: bool| {
            let body = route_config(name, 2, vhds);
            let version = format!("v-{name}-{vhds}");
            held.insert(name.to_string(), Held { version, body });
        };
        put(&mut held, "a", false);
        put(&mut held, "b+vhds", true);
        let mut delta = Subscriptions::new(Protocol::Delta);
        let changes = delta.update(ROUTE, &mut held).expect("reads");
        let [change] = changes.as_slice() else {
            panic!("one change expected");
        };
        assert_eq!(change.type_url, VIRTUAL_HOST);
        assert_eq!(change.subscribed, ["b+vhds"]);
        assert!(change.unsubscribed.is_empty() && change.was_empty);
        assert!(held.touched.is_empty(), "followed");

        assert!(delta.update(ROUTE, &mut held).expect("reads").is_empty());
        put(&mut held, "a", true);
        let changes = delta.update(ROUTE, &mut held).expect("reads");
        let [change] = changes.as_slice() else {
            panic!("one change expected");
        };
        assert_eq!(change.subscribed, ["a"]);
        assert!(!change.was_empty);

        held.remove("b+vhds");
        put(&mut held, "a", false);
        let changes = delta.update(ROUTE, &mut held).expect("reads");
        let [change] = changes.as_slice() else {
            panic!("one change expected");
        };
        assert!(change.subscribed.is_empty(), "unsubscribes only");
        assert_eq!(change.unsubscribed, ["a", "b+vhds"]);
        assert_eq!(delta.names_of(VIRTUAL_HOST), Vec::<String>::new());

        let mut sotw = Subscriptions::new(Protocol::Sotw);
        put(&mut held, "b+vhds", true);
        assert!(
            sotw.update(ROUTE, &mut held).expect("reads").is_empty(),
            "VHDS is delta only"
        );
    }

    #[test]
    fn a_name_two_resources_refer_to_stays_subscribed_until_neither_does() {
        let cluster = |name: &str, service: &str| {
            use envoy_types::pb::envoy::config::cluster::v3::cluster::EdsClusterConfig;
            Cluster {
                name: name.into(),
                eds_cluster_config: Some(EdsClusterConfig {
                    service_name: service.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let mut held = TypeHeld::default();
        let mut subscriptions = Subscriptions::new(Protocol::Delta);
        for name in ["a", "b"] {
            let body = cluster(name, "shared");
            held.insert(
                name.into(),
                Held {
                    version: name.into(),
                    body,
                },
            );
        }
        let changes = subscriptions.update(CLUSTER, &mut held).expect("reads");
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].subscribed, ["shared"]);
        held.remove("a");
        assert!(
            subscriptions
                .update(CLUSTER, &mut held)
                .expect("reads")
                .is_empty()
        );
        assert_eq!(subscriptions.names_of(ENDPOINT), ["shared"]);
        held.remove("b");
        let changes = subscriptions.update(CLUSTER, &mut held).expect("reads");
        assert_eq!(changes[0].unsubscribed, ["shared"]);
        assert!(subscriptions.names_of(ENDPOINT).is_empty());
    }

    #[test]
    fn unsubscribing_a_namespace_forgets_its_virtual_hosts() {
        let mut held = TypeHeld::default();
        for name in ["a+vhds/x", "a+vhds/y", "b+vhds/x"] {
            let version = "1".to_string();
            let body = Vec::new();
            held.insert(name.to_string(), Held { version, body });
        }
        let subscribed = BTreeMap::from([("b+vhds".to_string(), 1)]);
        assert!(held.keep_subscribed(VIRTUAL_HOST, Some(&subscribed)));
        let names: Vec<&String> = held.resources.keys().collect();
        assert_eq!(names, ["b+vhds/x"]);
        assert!(!held.keep_subscribed(VIRTUAL_HOST, Some(&subscribed)));
        assert!(held.keep_subscribed(VIRTUAL_HOST, None));
        assert!(held.resources.is_empty());
    }
}
