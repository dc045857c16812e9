//! A whole environment in a few lines: a real kube-apiserver with the CRDs, a namespace,
//! N Envoys registered as the fleet Service, Switchyard operators, and backends each behind
//! its own Service and EndpointSlice.
//!
//! ```no_run
//! # async fn demo() {
//! use switchyard_e2e::rig::Rig;
//! let mut rig = Rig::start(3).await;
//! rig.add_backend("blue").await;
//! rig.start_operator("switchyard-1", &[]);
//! rig.apply_route("web", &Rig::route_yaml("web.test", &[("blue", 1)])).await;
//! rig.wait_ready("web", std::time::Duration::from_secs(30)).await;
//! # }
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use switchyard::api::{ProxyConfig, TrafficRoute};
use switchyard::xds::Protocol;

use crate::kube::{self as k, KubeApi};
use crate::local_range;
use crate::{Backend, Envoy, ListenerPorts, Switchyard};

pub const FLEET_NAMESPACE: &str = "switchyard-system";
pub const FLEET_SERVICE: &str = "envoy";
pub const HOST: &str = "web.test";
/// Operator flags for a short Lease (the default is 15 s): a replacement takes over in
/// seconds, and a leader whose renewals fail stops writing 3 s after its last one.
pub const SHORT_LEASE: [&str; 4] = [
    "--lease-duration-seconds",
    "4",
    "--lease-grace-seconds",
    "1",
];

/// One Pod of a Service: its address, and its server once started.
pub struct Pod {
    pub address: std::net::SocketAddr,
    pub server: Option<Backend>,
}

pub struct Rig {
    pub api: Arc<KubeApi>,
    pub client: Client,
    pub namespace: String,
    pub ports: ListenerPorts,
    pub envoy_addresses: Vec<String>,
    pub envoys: Vec<Envoy>,
    pub operators: Vec<Switchyard>,
    pub backends: BTreeMap<String, Backend>,
    /// gRPC backends (see [`Rig::add_grpc_backend`]).
    pub grpc_backends: BTreeMap<String, crate::grpc::GrpcBackend>,
    /// UDP backends (see [`Rig::add_udp_backend_unpublished`]).
    pub udp_backends: BTreeMap<String, crate::datagrams::UdpEcho>,
    /// Services of several Pods each (see [`Rig::add_pods`]).
    pub pods: BTreeMap<String, Vec<Pod>>,
    pub work: PathBuf,
    next_ip: u8,
    /// The xDS ports (Switchyard replicas) the Envoys connect to: the first operator's, or
    /// those given to [`Rig::connect_envoys_to`].
    envoy_xds_ports: Vec<u16>,
    /// Set by [`Rig::connect_envoys_to`]: the test starts the Envoys, not the first operator.
    envoys_by_test: bool,
    /// Envoys connected elsewhere than the others (see [`Rig::connect_envoy_to`]).
    xds_ports_of: BTreeMap<usize, Vec<u16>>,
    /// Envoy restarts so far, to keep each run's log.
    envoy_restarts: usize,
    /// The kubeconfig operators are started with (default: the API server's own).
    operator_kubeconfig: Option<PathBuf>,
    /// Added to the environment of operators started from now on.
    pub operator_env: Vec<(String, String)>,
    _dir: tempfile::TempDir,
}

/// Whether the route's current generation is Ready.
pub fn is_ready(route: &TrafficRoute) -> bool {
    let generation = route.metadata.generation;
    route.status.as_ref().is_some_and(|s| {
        s.observed_generation == generation
            && s.conditions.iter().any(|c| {
                c.type_ == "Ready" && c.status == "True" && c.observed_generation == generation
            })
    })
}

/// The rig's working directory (configs, logs); kept after the test when
/// SWITCHYARD_E2E_KEEP is set, to read the Envoy and operator logs of a failed run.
fn work_dir() -> tempfile::TempDir {
    let keep = std::env::var_os("SWITCHYARD_E2E_KEEP").is_some();
    let dir = tempfile::Builder::new()
        .prefix("switchyard-rig-")
        .disable_cleanup(keep)
        .tempdir()
        .expect("temp dir");
    if keep {
        eprintln!("rig work directory (kept): {}", dir.path().display());
    }
    dir
}

impl Rig {
    /// The apiserver (shared by the tests of one binary), CRDs applied, a fresh namespace,
    /// and `envoys` loopback addresses registered as the fleet (Envoys start with the
    /// first operator).
    pub async fn start(envoys: u8) -> Rig {
        Self::start_on(KubeApi::shared().await, envoys).await
    }

    /// [`Rig::start`] on an API server of the test's own (one started with flags of its
    /// own, say).
    pub async fn start_on(api: Arc<KubeApi>, envoys: u8) -> Rig {
        let dir = work_dir();
        let work = dir.path().to_path_buf();
        let client = api.client().await;
        api.install_crds().await;
        let namespace = k::unique_name("shop");
        k::create_namespace(&client, &namespace).await;
        k::create_namespace(&client, FLEET_NAMESPACE).await;
        // Each rig picks its own block of addresses, so tests can run side by side.
        let block = 100 + (std::process::id() as u8 % 20) * 5 + (free_block() % 5);
        let envoy_addresses: Vec<String> = (1..=envoys)
            .map(|i| local_range::address(block, i))
            .collect();
        let rig = Rig {
            api,
            client,
            namespace,
            ports: ListenerPorts::free(),
            envoy_addresses,
            envoys: Vec::new(),
            operators: Vec::new(),
            backends: BTreeMap::new(),
            grpc_backends: BTreeMap::new(),
            udp_backends: BTreeMap::new(),
            pods: BTreeMap::new(),
            work,
            next_ip: 0,
            envoy_xds_ports: Vec::new(),
            envoys_by_test: false,
            xds_ports_of: BTreeMap::new(),
            envoy_restarts: 0,
            operator_kubeconfig: None,
            operator_env: Vec::new(),
            _dir: dir,
        };
        rig.register_fleet().await;
        rig
    }

    /// The fleet Service's EndpointSlice lists every Envoy address.
    async fn register_fleet(&self) {
        k::apply_service(&self.client, FLEET_NAMESPACE, &self.fleet_service(), 8080).await;
        let endpoints: Vec<(String, u16, bool, bool, bool)> = self
            .envoy_addresses
            .iter()
            .map(|a| (a.clone(), self.ports.probe, true, true, false))
            .collect();
        let refs: Vec<k::EndpointSpec<'_>> = endpoints
            .iter()
            .map(|(a, p, r, s, t)| (a.as_str(), *p, *r, *s, *t))
            .collect();
        k::apply_endpoint_slice(&self.client, FLEET_NAMESPACE, &self.fleet_service(), &refs).await;
    }

    /// Each rig has its own fleet Service, named after its namespace.
    pub fn fleet_service(&self) -> String {
        format!("{FLEET_SERVICE}-{}", self.namespace)
    }

    /// Starts a Switchyard operator; the first one also starts the Envoys (delta, but
    /// every third SotW), connected to it.
    pub fn start_operator(&mut self, name: &str, extra: &[&str]) {
        self.start_operator_on(name, crate::free_port(), extra);
    }

    /// The Envoys will connect to these Switchyard replicas (xDS ports on 127.0.0.1, chosen
    /// up front with [`crate::free_port`]) and fail over between them. Envoy `i` lists them
    /// rotated by `i`: Envoy connects to the first listed replica that accepts, so with
    /// every replica up the fleet spreads over them. Operators then no longer start the
    /// Envoys: call [`Rig::start_envoys`].
    pub fn connect_envoys_to(&mut self, xds_ports: &[u16]) {
        assert!(
            self.envoys.is_empty(),
            "the Envoys are already running: choose their replicas before they start"
        );
        assert!(!xds_ports.is_empty(), "at least one replica");
        self.envoy_xds_ports = xds_ports.to_vec();
        self.envoys_by_test = true;
    }

    /// Envoy `i` connects to these xDS ports (a relay in front of a replica, say) instead of
    /// those of [`Rig::connect_envoys_to`].
    pub fn connect_envoy_to(&mut self, i: usize, xds_ports: &[u16]) {
        assert!(
            self.envoys.is_empty(),
            "the Envoys are already running: choose their replicas before they start"
        );
        self.xds_ports_of.insert(i, xds_ports.to_vec());
    }

    /// Starts the fleet's Envoys (after [`Rig::connect_envoys_to`]).
    pub fn start_envoys(&mut self) {
        assert!(self.envoys.is_empty(), "the Envoys are already running");
        assert!(
            !self.envoy_xds_ports.is_empty(),
            "no replicas to connect to: Rig::connect_envoys_to first"
        );
        for i in 0..self.envoy_addresses.len() {
            let envoy = self.spawn_envoy(i);
            self.envoys.push(envoy);
        }
    }

    /// [`Rig::start_operator`] serving xDS on `xds_port` (e.g. one that Envoys already list,
    /// see [`Rig::connect_envoys_to`], or the port of a replica that was killed).
    pub fn start_operator_on(&mut self, name: &str, xds_port: u16, extra: &[&str]) {
        let operator = Switchyard::start_operator_on(
            &self.work,
            name,
            self.operator_kubeconfig
                .as_ref()
                .unwrap_or(&self.api.kubeconfig),
            &format!("{FLEET_NAMESPACE}/{}", self.fleet_service()),
            self.ports,
            xds_port,
            &[
                &[
                    "--namespaces",
                    &self.namespace,
                    "--lease-name",
                    &self.lease_name(),
                ],
                extra,
            ]
            .concat(),
            &self.operator_env,
        );
        self.operators.push(operator);
        if self.envoys.is_empty() && !self.envoys_by_test {
            self.envoy_xds_ports = vec![xds_port];
            self.start_envoys();
        }
    }

    /// Envoy `i` of the fleet: its name, address, protocol and replicas never change.
    fn spawn_envoy(&self, i: usize) -> Envoy {
        self.spawn_envoy_with_args(i, &[])
    }

    fn spawn_envoy_with_args(&self, i: usize, args: &[&str]) -> Envoy {
        let protocol = if i % 3 == 2 {
            Protocol::Sotw
        } else {
            Protocol::Delta
        };
        let mut replicas = (self.xds_ports_of.get(&i))
            .unwrap_or(&self.envoy_xds_ports)
            .clone();
        let first = i % replicas.len();
        replicas.rotate_left(first);
        Envoy::start_with_args(
            &self.work,
            &format!("envoy-{i}"),
            &self.envoy_addresses[i],
            &replicas,
            protocol,
            args,
        )
    }

    /// Operators started from now on reach the API server through `address` (a
    /// [`crate::relay::Relay`] in front of it): a kubeconfig like the API server's, with
    /// that address.
    pub fn connect_operators_via(&mut self, address: std::net::SocketAddr) {
        let kubeconfig = std::fs::read_to_string(&self.api.kubeconfig).expect("read kubeconfig");
        let via = kubeconfig.replace(&self.api.server, &format!("https://{address}"));
        assert_ne!(via, kubeconfig, "the kubeconfig names {}", self.api.server);
        let path = self.work.join("kubeconfig-via-relay");
        std::fs::write(&path, via).expect("write kubeconfig");
        self.operator_kubeconfig = Some(path);
    }

    /// Operators started from now on reach the API server directly again.
    pub fn connect_operators_directly(&mut self) {
        self.operator_kubeconfig = None;
    }

    /// The operator started under `name`.
    pub fn operator(&self, name: &str) -> &Switchyard {
        self.operators
            .iter()
            .find(|o| o.process.name == name)
            .unwrap_or_else(|| panic!("no operator {name}"))
    }

    /// SIGKILLs the operator `name`; its handle (and log) stays in [`Rig::operators`].
    pub fn kill_operator(&mut self, name: &str) {
        self.operators
            .iter_mut()
            .find(|o| o.process.name == name)
            .unwrap_or_else(|| panic!("no operator {name}"))
            .process
            .kill();
    }

    /// Stops the operator `name` as Kubernetes stops a Pod (SIGTERM); whether it exited
    /// by itself within `within`.
    pub fn stop_operator(&mut self, name: &str, within: Duration) -> bool {
        self.operators
            .iter_mut()
            .find(|o| o.process.name == name)
            .unwrap_or_else(|| panic!("no operator {name}"))
            .process
            .terminate(within)
    }

    /// SIGKILLs Envoy `i` (its address stays in the fleet Service, as a pod's would until
    /// its readiness probe fails).
    pub fn kill_envoy(&mut self, i: usize) {
        self.envoys[i].process.kill();
    }

    /// Starts Envoy `i` again (killing it first if it runs): same node name, address,
    /// protocol and replicas, fresh state; the previous run's log is kept as
    /// `envoy-<i>.log.<n>`.
    pub fn restart_envoy(&mut self, i: usize) {
        self.restart_envoy_with_args(i, &[]);
    }

    /// [`Rig::restart_envoy`] with more command-line arguments for Envoy.
    pub fn restart_envoy_with_args(&mut self, i: usize, args: &[&str]) {
        self.envoys[i].process.kill();
        self.envoy_restarts += 1;
        let log = &self.envoys[i].process.log;
        let _ = std::fs::rename(
            log,
            log.with_extension(format!("log.{}", self.envoy_restarts)),
        );
        self.envoys[i] = self.spawn_envoy_with_args(i, args);
    }

    /// The leader Lease of this rig's operators (namespace `default`).
    pub fn lease_name(&self) -> String {
        format!("switchyard-{}", self.namespace)
    }

    /// Who holds the leader Lease (`spec.holderIdentity`), if anyone.
    pub async fn lease_holder(&self) -> Option<String> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "default");
        leases
            .get_opt(&self.lease_name())
            .await
            .unwrap_or_else(|e| panic!("get lease {}: {e}", self.lease_name()))
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    }

    /// Waits until the Lease holder satisfies `accept`; returns it and how long it took.
    pub async fn wait_lease_holder(
        &self,
        within: Duration,
        accept: impl Fn(Option<&str>) -> bool,
    ) -> (Option<String>, Duration) {
        let started = Instant::now();
        loop {
            let holder = self.lease_holder().await;
            if accept(holder.as_deref()) {
                return (holder, started.elapsed());
            }
            if started.elapsed() >= within {
                // What each replica said of the Lease is the only way to tell why.
                let logs: Vec<String> = self
                    .operators
                    .iter()
                    .map(|o| {
                        let lease_lines: Vec<String> = std::fs::read_to_string(&o.process.log)
                            .unwrap_or_default()
                            .lines()
                            .filter(|l| l.contains("lease") || l.contains("leader"))
                            .map(str::to_owned)
                            .collect();
                        format!(
                            "--- {} ---\n{}",
                            o.process.log.display(),
                            lease_lines.join("\n")
                        )
                    })
                    .collect();
                panic!(
                    "lease {}: holder {holder:?} still not accepted after {within:?}\n{}",
                    self.lease_name(),
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The route's ProxyConfig of `role` (`live` or `probe`), if the leader wrote one.
    pub async fn proxy_config(&self, route: &str, role: &str) -> Option<ProxyConfig> {
        Api::<ProxyConfig>::namespaced(self.client.clone(), &self.namespace)
            .get_opt(&format!("{route}-{role}"))
            .await
            .unwrap_or_else(|e| panic!("get ProxyConfig {route}-{role}: {e}"))
    }

    /// A backend answering with its name, behind Service `name` (port 80 → the backend).
    pub async fn add_backend(&mut self, name: &str) -> &Backend {
        let ip = self.next_backend_ip();
        let backend = Backend::start(name, &ip).await;
        self.register_backend(name, backend).await
    }

    /// A backend whose Service does not exist yet: [`Rig::recreate_service`] creates it
    /// with its EndpointSlice.
    pub async fn add_backend_without_service(&mut self, name: &str) {
        let ip = self.next_backend_ip();
        let backend = Backend::start(name, &ip).await;
        self.backends.insert(name.to_string(), backend);
    }

    /// A backend behind Service `name` of port 80 in `namespace` (which must exist), its
    /// endpoint ready.
    pub async fn add_backend_in(&mut self, namespace: &str, name: &str) {
        let ip = self.next_backend_ip();
        let backend = Backend::start(name, &ip).await;
        k::apply_service(&self.client, namespace, name, 80).await;
        let address = backend.address;
        let ip = address.ip().to_string();
        let endpoint = (ip.as_str(), address.port(), true, true, false);
        k::apply_endpoint_slice(&self.client, namespace, name, &[endpoint]).await;
        self.backends.insert(format!("{namespace}/{name}"), backend);
    }

    /// [`Rig::add_backend`] serving HTTPS with the certificate chain and key `identity`
    /// (PEM), on the Service's port 80 all the same; with `client_ca`, to clients presenting
    /// a certificate of that authority only.
    pub async fn add_tls_backend(
        &mut self,
        name: &str,
        identity: (&str, &str),
        client_ca: Option<&str>,
    ) -> &Backend {
        let ip = self.next_backend_ip();
        let backend = Backend::start_tls(name, &ip, identity, client_ca).await;
        self.register_backend(name, backend).await
    }

    /// A gRPC backend (`crate::grpc`) and its Service `name` on port 80; its EndpointSlice
    /// only once [`Rig::publish_grpc_endpoints`] is called (as a Pod becomes ready some
    /// time after its Service exists).
    pub async fn add_grpc_backend(&mut self, name: &str) -> std::net::SocketAddr {
        let ip = self.next_backend_ip();
        let backend = crate::grpc::GrpcBackend::start(name, &ip).await;
        k::apply_service(&self.client, &self.namespace, name, 80).await;
        let address = backend.address;
        self.grpc_backends.insert(name.to_string(), backend);
        address
    }

    /// The EndpointSlice of the gRPC backend `name`: its one endpoint, ready.
    pub async fn publish_grpc_endpoints(&self, name: &str) {
        let address = self.grpc_backends[name].address;
        let ip = address.ip().to_string();
        k::apply_endpoint_slice(
            &self.client,
            &self.namespace,
            name,
            &[(&ip, address.port(), true, true, false)],
        )
        .await;
    }

    /// Service `name` on port 80, its one ready endpoint `backend`.
    async fn register_backend(&mut self, name: &str, backend: Backend) -> &Backend {
        k::apply_service(&self.client, &self.namespace, name, 80).await;
        self.backends.insert(name.to_string(), backend);
        self.publish_endpoints(name).await;
        &self.backends[name]
    }

    /// [`Rig::add_backend`] (or, with `identity`, [`Rig::add_tls_backend`]) whose
    /// EndpointSlice comes only once [`Rig::publish_endpoints`] is called, as a Pod becomes
    /// ready some time after its Service exists.
    pub async fn add_backend_unpublished(&mut self, name: &str, identity: Option<(&str, &str)>) {
        let ip = self.next_backend_ip();
        let backend = match identity {
            None => Backend::start(name, &ip).await,
            Some(identity) => Backend::start_tls(name, &ip, identity, None).await,
        };
        k::apply_service(&self.client, &self.namespace, name, 80).await;
        self.backends.insert(name.to_string(), backend);
    }

    /// A UDP backend ([`crate::datagrams::UdpEcho`]) behind Service `name`, UDP port 80;
    /// its EndpointSlice only once [`Rig::publish_udp_endpoints`] is called.
    pub async fn add_udp_backend_unpublished(&mut self, name: &str) {
        let ip = self.next_backend_ip();
        let backend = crate::datagrams::UdpEcho::start(name, &ip).await;
        k::apply_udp_service(&self.client, &self.namespace, name, 80).await;
        self.udp_backends.insert(name.to_string(), backend);
    }

    /// The EndpointSlice of the UDP backend `name`: its one endpoint, ready.
    pub async fn publish_udp_endpoints(&self, name: &str) {
        let address = self.udp_backends[name].address;
        k::apply_udp_endpoint_slice(
            &self.client,
            &self.namespace,
            name,
            &[(&address.ip().to_string(), address.port(), true, true, false)],
        )
        .await;
    }

    /// The EndpointSlice of the backend `name`: its one endpoint, ready.
    pub async fn publish_endpoints(&self, name: &str) {
        let address = self.backends[name].address;
        k::apply_endpoint_slice(
            &self.client,
            &self.namespace,
            name,
            &[(&address.ip().to_string(), address.port(), true, true, false)],
        )
        .await;
    }

    /// A Service `name` of `n` Pods at fixed addresses, none of them started or ready yet:
    /// its EndpointSlice lists them not ready, and nothing listens there, as for Pods
    /// still starting. [`Rig::start_pod`] starts one.
    pub async fn add_pods(&mut self, name: &str, n: usize) {
        let mut pods = Vec::new();
        for _ in 0..n {
            let ip = self.next_backend_ip();
            let address = std::net::SocketAddr::new(ip.parse().expect("an IP"), crate::free_port());
            pods.push(Pod {
                address,
                server: None,
            });
        }
        k::apply_service(&self.client, &self.namespace, name, 80).await;
        self.pods.insert(name.to_string(), pods);
        self.apply_pods(name).await;
    }

    /// Starts Pod `i` of `name` and marks it ready.
    pub async fn start_pod(&mut self, name: &str, i: usize) {
        let pod = &mut self.pods.get_mut(name).expect("a Service of Pods")[i];
        pod.server = Some(Backend::start_on(name, pod.address).await);
        self.apply_pods(name).await;
    }

    /// Pod `i` of `name`, once started.
    pub fn pod(&self, name: &str, i: usize) -> &Backend {
        self.pods[name][i]
            .server
            .as_ref()
            .unwrap_or_else(|| panic!("Pod {i} of {name} is not started"))
    }

    async fn apply_pods(&self, name: &str) {
        let endpoints: Vec<(String, u16, bool)> = self.pods[name]
            .iter()
            .map(|p| {
                (
                    p.address.ip().to_string(),
                    p.address.port(),
                    p.server.is_some(),
                )
            })
            .collect();
        let refs: Vec<k::EndpointSpec<'_>> = endpoints
            .iter()
            .map(|(a, port, ready)| (a.as_str(), *port, *ready, *ready, false))
            .collect();
        k::apply_endpoint_slice(&self.client, &self.namespace, name, &refs).await;
    }

    /// Each backend has an address of its own.
    fn next_backend_ip(&mut self) -> String {
        self.next_ip += 1;
        local_range::address(200 + (std::process::id() % 50) as u8, self.next_ip)
    }

    /// Marks a backend's endpoint ready or not (its EndpointSlice condition).
    pub async fn set_ready(&self, name: &str, ready: bool) {
        self.set_endpoint(name, ready, ready, false).await;
    }

    /// Deletes a backend's Service and EndpointSlices, as deleting a Service does; its
    /// server keeps running, as Pods outlive their Service, until [`Rig::stop_backend`].
    pub async fn delete_service(&self, name: &str) {
        k::delete_endpoint_slices(&self.client, &self.namespace, name).await;
        k::delete_service(&self.client, &self.namespace, name).await;
    }

    /// Deletes a backend's EndpointSlices, not its Service: what the EndpointSlice
    /// controller does when a Service loses its selector, and what the operator sees first
    /// of a Service's deletion. Its server keeps running.
    pub async fn delete_endpoint_slices(&self, name: &str) {
        k::delete_endpoint_slices(&self.client, &self.namespace, name).await;
    }

    /// Creates a deleted backend's Service and EndpointSlice again, for the server that
    /// kept running (see [`Rig::delete_service`]).
    pub async fn recreate_service(&self, name: &str) {
        k::apply_service(&self.client, &self.namespace, name, 80).await;
        self.set_endpoint(name, true, true, false).await;
    }

    /// Sets the conditions of a backend's endpoint, as its Pod's life goes on: ready;
    /// terminating and still serving; terminating and done.
    pub async fn set_endpoint(&self, name: &str, ready: bool, serving: bool, terminating: bool) {
        let backend = &self.backends[name];
        let address = backend.address.ip().to_string();
        k::apply_endpoint_slice(
            &self.client,
            &self.namespace,
            name,
            &[(
                &address,
                backend.address.port(),
                ready,
                serving,
                terminating,
            )],
        )
        .await;
    }

    /// The backend's Service has no endpoint left (its slice stays, empty: scaled to zero).
    pub async fn clear_endpoints(&self, name: &str) {
        k::apply_endpoint_slice(&self.client, &self.namespace, name, &[]).await;
    }

    /// Stops a backend's server (its Pods are gone).
    pub fn stop_backend(&mut self, name: &str) {
        self.backends.remove(name);
    }

    /// Removes a backend: its EndpointSlices, Service and server.
    pub async fn remove_backend(&mut self, name: &str) {
        k::delete_endpoint_slices(&self.client, &self.namespace, name).await;
        k::delete_service(&self.client, &self.namespace, name).await;
        self.backends.remove(name);
    }

    /// A TrafficRoute spec (YAML) for `host` with weighted backends on port 80.
    pub fn route_yaml(host: &str, backends: &[(&str, u32)]) -> String {
        let mut yaml = format!("hosts: [\"{host}\"]\nrules:\n- backends:\n");
        for (service, weight) in backends {
            yaml.push_str(&format!(
                "  - {{ service: {service}, port: 80, weight: {weight} }}\n"
            ));
        }
        yaml
    }

    /// Applies a TrafficRoute with the given spec (YAML) by server-side apply.
    pub async fn apply_route(&self, name: &str, spec_yaml: &str) -> i64 {
        if let Err(message) = self.try_apply_route(name, spec_yaml).await {
            panic!("{message}");
        }
        self.route(name).await.metadata.generation.unwrap_or(0)
    }

    /// [`Rig::apply_route`], for a spec the API server may refuse: why it did.
    pub async fn try_apply_route(&self, name: &str, spec_yaml: &str) -> Result<(), String> {
        let manifest = format!(
            "apiVersion: switchyard.dev/v1alpha1\nkind: TrafficRoute\nmetadata:\n  name: {name}\n  namespace: {}\nspec:\n{}",
            self.namespace,
            spec_yaml
                .lines()
                .map(|l| format!("  {l}\n"))
                .collect::<String>()
        );
        let out = self
            .api
            .kubectl_input(
                [
                    "apply",
                    "--server-side",
                    "--field-manager",
                    "rig-user",
                    "-f",
                    "-",
                ],
                &manifest,
            )
            .await;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "kubectl apply failed: {}\n{manifest}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Deletes a TrafficRoute (its ProxyConfigs are the operator's to collect).
    pub async fn delete_route(&self, name: &str) {
        Api::<TrafficRoute>::namespaced(self.client.clone(), &self.namespace)
            .delete(name, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("delete route {name}: {e}"));
    }

    pub async fn route(&self, name: &str) -> TrafficRoute {
        Api::<TrafficRoute>::namespaced(self.client.clone(), &self.namespace)
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get route {name}: {e}"))
    }

    /// Waits until the route's current generation is Ready; returns how long it took.
    pub async fn wait_ready(&self, name: &str, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let route = self.route(name).await;
            if is_ready(&route) {
                return started.elapsed();
            }
            if started.elapsed() > within {
                let logs: Vec<String> = self
                    .operators
                    .iter()
                    .map(|o| o.process.log_tail())
                    .collect();
                let envoy_logs: Vec<String> = self
                    .envoys
                    .iter()
                    .map(|e| {
                        format!(
                            "{} ({}):\n{}",
                            e.process.name,
                            e.address,
                            e.process.log_tail()
                        )
                    })
                    .collect();
                panic!(
                    "route {name} generation {:?} not Ready within {within:?}: {:#?}\n--- operator logs ---\n{}\n--- Envoy logs ---\n{}",
                    route.metadata.generation,
                    route.status,
                    logs.join("\n---\n"),
                    envoy_logs.join("\n---\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until the route's status satisfies `accept`.
    pub async fn wait_status(
        &self,
        name: &str,
        within: Duration,
        accept: impl Fn(&switchyard::api::TrafficRouteStatus) -> bool,
    ) -> switchyard::api::TrafficRouteStatus {
        let started = Instant::now();
        loop {
            let route = self.route(name).await;
            if let Some(status) = route.status.as_ref().filter(|s| accept(s)) {
                return status.clone();
            }
            assert!(
                started.elapsed() < within,
                "route {name}: status never matched: {:#?}",
                route.status
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Base URLs of every Envoy's HTTP listener.
    pub fn targets(&self) -> Vec<String> {
        self.envoy_addresses
            .iter()
            .map(|a| format!("http://{a}:{}", self.ports.http))
            .collect()
    }

    /// One request through every Envoy; the backend names that answered (or the error).
    pub async fn answers(&self) -> Vec<String> {
        self.answers_for(HOST).await
    }

    /// [`Rig::answers`] for another host.
    pub async fn answers_for(&self, host: &str) -> Vec<String> {
        let mut out = Vec::new();
        for target in self.targets() {
            out.push(answer(get_host(&target, host).await).await);
        }
        out
    }

    /// A rig whose operator serves route "web" on `HOST` from `first`, Ready, with a
    /// backend behind a Service of each name in `backends`.
    pub async fn serving_web(backends: &[&str], first: &str) -> Rig {
        let mut rig = Rig::start(3).await;
        for backend in backends {
            rig.add_backend(backend).await;
        }
        rig.start_operator("switchyard-1", &[]);
        rig.apply_route("web", &Rig::route_yaml(HOST, &[(first, 1)]))
            .await;
        rig.wait_ready("web", Duration::from_secs(60)).await;
        rig
    }

    /// The reasons of the Events recorded about the object `name` in the rig's namespace.
    pub async fn event_reasons(&self, name: &str) -> Vec<String> {
        let selector = format!("involvedObject.name={name}");
        let events = self.events(&selector, "{.items[*].reason}").await;
        events.split_whitespace().map(str::to_owned).collect()
    }

    /// The messages of the Events recorded about the object `name` in the rig's namespace
    /// under `reason`, one per Event.
    pub async fn event_messages(&self, name: &str, reason: &str) -> Vec<String> {
        let selector = format!("involvedObject.name={name},reason={reason}");
        let jsonpath = "{range .items[*]}{.message}{\"\\n\"}{end}";
        let messages = self.events(&selector, jsonpath).await;
        messages.lines().map(str::to_owned).collect()
    }

    /// `kubectl get events` of the rig's namespace with this field selector, as `jsonpath`.
    async fn events(&self, selector: &str, jsonpath: &str) -> String {
        let output = format!("jsonpath={jsonpath}");
        let args = [
            "get",
            "events",
            "-n",
            &self.namespace,
            "--field-selector",
            selector,
            "-o",
            &output,
        ];
        self.api.kubectl_ok(args).await
    }

    /// Response header `name` for `host` through every Envoy ("-" when absent).
    pub async fn header_for(&self, host: &str, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        for target in self.targets() {
            out.push(match get_host(&target, host).await {
                Ok(r) => r
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_string(),
                Err(e) => format!("error {e}"),
            });
        }
        out
    }

    /// The operator's metrics, as Prometheus text.
    pub async fn operator_metrics(&self, name: &str) -> String {
        let port = self.operator(name).admin_port;
        let url = format!("http://127.0.0.1:{port}/metrics");
        reqwest::get(&url)
            .await
            .expect("metrics endpoint")
            .text()
            .await
            .expect("metrics text")
    }
}

impl Rig {
    /// The `x-sentinel` response header through every Envoy.
    pub async fn sentinels(&self) -> Vec<String> {
        let mut out = Vec::new();
        for target in self.targets() {
            out.push(match get(&target).await {
                Ok(r) => r
                    .headers()
                    .get("x-sentinel")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_string(),
                Err(e) => format!("error {e}"),
            });
        }
        out
    }

    /// `n` requests spread over every Envoy: how many each backend answered.
    pub async fn split(&self, n: usize) -> BTreeMap<String, usize> {
        let targets = self.targets();
        let mut seen = BTreeMap::new();
        for i in 0..n {
            let answer = answer(get(&targets[i % targets.len()]).await).await;
            *seen.entry(answer).or_default() += 1;
        }
        seen
    }
}

/// One GET for [`HOST`] through the Envoy at `target`.
async fn get(target: &str) -> Result<reqwest::Response, reqwest::Error> {
    get_host(target, HOST).await
}

async fn get_host(target: &str, host: &str) -> Result<reqwest::Response, reqwest::Error> {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    let client = CLIENT.get_or_init(|| {
        // No pooled connections: tests, each on its own runtime, share this client.
        reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(0)
            .build()
            .expect("client")
    });
    client
        .get(format!("{target}/"))
        .header("host", host)
        .send()
        .await
}

/// The backend's name for a 2xx, else what went wrong.
async fn answer(response: Result<reqwest::Response, reqwest::Error>) -> String {
    match response {
        Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
        Ok(r) => format!("status {}", r.status()),
        Err(e) => format!("error {e}"),
    }
}

/// A small number that differs between rigs started by one process.
fn free_block() -> u8 {
    use std::sync::atomic::{AtomicU8, Ordering};
    static NEXT: AtomicU8 = AtomicU8::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// HTTPS: TLS Secrets, routes that serve them, and the certificate each Envoy shows.
impl Rig {
    /// Every Envoy's HTTPS listener.
    pub fn https_targets(&self) -> Vec<std::net::SocketAddr> {
        self.envoy_addresses
            .iter()
            .map(|a| {
                let ip: std::net::IpAddr = a.parse().expect("an Envoy address");
                std::net::SocketAddr::new(ip, self.ports.https)
            })
            .collect()
    }

    /// [`Rig::route_yaml`] served over HTTPS with the TLS Secret `secret` (plain HTTP
    /// redirects to it).
    pub fn tls_route_yaml(host: &str, secret: &str, backends: &[(&str, u32)]) -> String {
        format!(
            "tls: {{ secretName: {secret} }}\n{}",
            Self::route_yaml(host, backends)
        )
    }

    /// The test certificate and key (PEM) of e2e/testdata, for `*.test`.
    pub fn testdata_tls() -> (String, String) {
        let read = |file: &str| {
            let path = format!("{}/testdata/{file}", env!("CARGO_MANIFEST_DIR"));
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        (read("tls.crt"), read("tls.key"))
    }

    /// A new self-signed certificate and key (PEM, ECDSA P-256) for `host`, made with
    /// Switchyard's certgen: each call gives another certificate.
    pub fn new_certificate(host: &str) -> (String, String) {
        let bundle = switchyard::certgen::generate(&[host.to_string()], 30).expect("certgen");
        (bundle.server.cert_pem, bundle.server.key_pem)
    }

    /// Creates the `kubernetes.io/tls` Secret `name`, or replaces its data in place (the
    /// way cert-manager renews a certificate).
    pub async fn apply_tls_secret(&self, name: &str, cert_pem: &str, key_pem: &str) {
        self.apply_secret_data(
            name,
            &[
                ("tls.crt", cert_pem.as_bytes()),
                ("tls.key", key_pem.as_bytes()),
            ],
        )
        .await;
    }

    /// Creates or replaces the `kubernetes.io/tls` Secret `name` with exactly `data`
    /// (which need not be a valid certificate and key).
    pub async fn apply_secret_data(&self, name: &str, data: &[(&str, &[u8])]) {
        use k8s_openapi::api::core::v1::Secret;
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Default::default()
        };
        Api::<Secret>::namespaced(self.client.clone(), &self.namespace)
            .patch(
                name,
                &kube::api::PatchParams::apply("rig-user").force(),
                &kube::api::Patch::Apply(&secret),
            )
            .await
            .unwrap_or_else(|e| panic!("apply Secret {name}: {e}"));
    }

    /// Deletes the Secret `name`.
    pub async fn delete_secret(&self, name: &str) {
        use k8s_openapi::api::core::v1::Secret;
        Api::<Secret>::namespaced(self.client.clone(), &self.namespace)
            .delete(name, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("delete Secret {name}: {e}"));
    }

    /// Through every Envoy, on a new connection: the fingerprint of the certificate served
    /// for `host` when the route answers 2xx, else what happened.
    pub async fn served_certificates(&self, host: &str) -> Vec<String> {
        let mut out = Vec::new();
        for address in self.https_targets() {
            out.push(match crate::https_get(address, host, "/").await {
                Ok((certificate, a)) if (200..300).contains(&a.status) => certificate,
                Ok((certificate, a)) => format!("{certificate} status {}", a.status),
                Err(e) => format!("error {e}"),
            });
        }
        out
    }

    /// Waits until every Envoy serves the certificate `fingerprint` for `host` on new
    /// connections; how long it took.
    pub async fn wait_certificate(
        &self,
        host: &str,
        fingerprint: &str,
        within: Duration,
    ) -> Duration {
        let started = Instant::now();
        loop {
            let served = self.served_certificates(host).await;
            if served.iter().all(|s| s == fingerprint) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "{host}: not every Envoy serves certificate {fingerprint} within {within:?}: {served:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
