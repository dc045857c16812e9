//! The command line: every subcommand and its flags. `main.rs` composes what they ask for;
//! the one-shot commands (no server) are in [`commands`].

pub(crate) mod commands;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use switchyard::model::{AccessLog, ClientIp};

#[derive(Parser)]
#[command(
    name = "switchyard",
    version,
    about = "Shifts HTTP traffic between backends through Envoy without dropping a request"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Serve routes and endpoints from YAML files in a directory, without Kubernetes.
    Standalone(StandaloneArgs),
    /// Run in Kubernetes: watch ProxyConfigs, EndpointSlices and TLS Secrets, serve them
    /// over xDS; the leader resolves TrafficRoutes into ProxyConfigs and writes status.
    // Boxed: its flags make it far larger than the other commands.
    Operator(Box<OperatorArgs>),
    /// Show every Envoy connected to the given replicas: ACKed versus desired, and NACKs.
    Status {
        /// Admin address of a replica (repeat for each), e.g. 127.0.0.1:9000.
        #[arg(long = "admin", default_value = "127.0.0.1:9000")]
        admins: Vec<String>,
        /// Find the replicas through the Kubernetes API instead (kubeconfig, or in
        /// cluster): the operator's Pods, each asked through the API server's Pod proxy,
        /// as `kubectl` reaches them.
        #[arg(long, conflicts_with = "admins")]
        kubernetes: bool,
        /// With --kubernetes: the operator's namespace.
        #[arg(long, default_value = "switchyard-system")]
        namespace: String,
        /// With --kubernetes: the operator's Pods.
        #[arg(
            long,
            default_value = "app.kubernetes.io/part-of=switchyard,app.kubernetes.io/component=operator"
        )]
        selector: String,
    },
    /// Print the ClusterRole the operator needs (YAML).
    Rbac {
        #[arg(long, default_value = "switchyard")]
        name: String,
    },
    /// Make a CA, a server certificate for the xDS port and a client certificate for
    /// Envoy (mutual TLS for xDS): PEM files in --out, or Secrets with --kubernetes.
    Certgen(CertgenArgs),
    /// Print an Envoy bootstrap that points Envoy at Switchyard's ADS server (YAML, or
    /// JSON with --json): `envoy -c` it.
    Bootstrap(BootstrapArgs),
    /// Print what would be served for some files, with no cluster and no Envoy: a
    /// standalone configuration (directory or file), or Kubernetes manifests, a file or a
    /// directory of them (TrafficRoutes; GatewayClasses, Gateways, ListenerSets, HTTPRoutes,
    /// GRPCRoutes, TLSRoutes, TCPRoutes, UDPRoutes, ReferenceGrants, BackendTLSPolicies;
    /// Services, EndpointSlices, Namespaces, ConfigMaps, TLS Secrets). Problems go to
    /// stderr; exit status 1 if any.
    Translate {
        /// The directory or file.
        #[arg(short = 'f', long = "file", value_name = "PATH")]
        path: PathBuf,
        /// What to print: the Envoy resources, or the routing model.
        #[arg(long, value_enum, default_value = "xds")]
        stage: switchyard::offline::Stage,
        /// How to print it: YAML, or JSON (`jq`, and what Envoy's /config_dump gives).
        #[arg(short = 'o', long, value_enum, default_value = "yaml")]
        output: switchyard::offline::Format,
    },
    /// Write the CustomResourceDefinitions (crds/*.yaml) from the code.
    Crdgen {
        /// Directory to write into.
        #[arg(long, default_value = "crds")]
        out: PathBuf,
    },
}

#[derive(clap::Args)]
pub(crate) struct CertgenArgs {
    /// Directory to write ca.crt, ca.key, server.crt, server.key, client.crt and
    /// client.key into (keys readable by the owner only).
    #[arg(
        long,
        required_unless_present = "kubernetes",
        conflicts_with = "kubernetes"
    )]
    pub(crate) out: Option<PathBuf>,
    /// Print two kubernetes.io/tls Secrets (tls.crt, tls.key, ca.crt) for this namespace
    /// instead of writing files; the CA key is not kept.
    #[arg(long, value_name = "NAMESPACE")]
    pub(crate) kubernetes: Option<String>,
    /// A DNS name or IP address of the server certificate (repeat for each). Default:
    /// localhost, 127.0.0.1, ::1 and the names of the chart's xDS Service
    /// (--xds-service, in --namespace).
    #[arg(long = "dns", value_name = "NAME")]
    pub(crate) names: Vec<String>,
    /// Validity of every certificate, in days.
    #[arg(long, default_value_t = 365)]
    pub(crate) days: u32,
    /// The chart's xDS Service (<release>-xds), for the default names.
    #[arg(long, default_value = switchyard::certgen::DEFAULT_XDS_SERVICE)]
    pub(crate) xds_service: String,
    /// Its namespace, for the default names (default: the --kubernetes namespace, else
    /// switchyard-system).
    #[arg(long)]
    pub(crate) namespace: Option<String>,
    /// With --kubernetes: the operator's Secret (the chart's xds.tls.serverSecret).
    #[arg(long, default_value = "switchyard-xds-server-tls")]
    pub(crate) server_secret: String,
    /// With --kubernetes: Envoy's Secret (the chart's xds.tls.clientSecret).
    #[arg(long, default_value = "switchyard-xds-client-tls")]
    pub(crate) client_secret: String,
    /// Replace existing files in --out.
    #[arg(long)]
    pub(crate) force: bool,
}

#[derive(clap::Args)]
pub(crate) struct StandaloneArgs {
    /// Directory of *.yaml files (see README, "Standalone mode").
    #[arg(long, env = "SWITCHYARD_CONFIG")]
    pub(crate) config: PathBuf,
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
    /// How often the directory is checked for changes.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub(crate) poll_interval: Duration,
}

#[derive(clap::Args)]
pub(crate) struct OperatorArgs {
    /// Namespaces to watch (comma-separated); all when empty. TrafficRoutes, ProxyConfigs,
    /// Services, EndpointSlices, TLS Secrets, Gateways, HTTPRoutes and ReferenceGrants
    /// are watched there (Services and EndpointSlices in the fleet's namespace as well);
    /// GatewayClasses and Namespaces are cluster-wide.
    #[arg(long, env = "SWITCHYARD_NAMESPACES", value_delimiter = ',')]
    pub(crate) namespaces: Vec<String>,
    /// The Service whose ready endpoints are the Envoy fleet, as NAMESPACE/NAME. Every
    /// rollout proves readiness on each of them.
    #[arg(long, env = "SWITCHYARD_ENVOY_SERVICE", value_parser = parse_namespaced)]
    pub(crate) envoy_service: (String, String),
    #[command(flatten)]
    pub(crate) listeners: ListenerArgs,
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
    #[command(flatten)]
    pub(crate) leader: LeaderArgs,
    /// Status writes per second at most, of every kind together (they never delay xDS).
    #[arg(long, env = "SWITCHYARD_STATUS_QPS", default_value_t = 20.0)]
    pub(crate) status_qps: f64,
    /// API requests per second at most, on average (watches, reads, writes; the leader
    /// Lease has a client of its own). 0, the default: no client-side limit, as in
    /// controller-runtime, since the API server's Priority and Fairness protects it.
    #[arg(long, env = "SWITCHYARD_API_QPS", default_value_t = 0.0)]
    pub(crate) api_qps: f64,
    /// API requests at once before `--api-qps` paces them.
    #[arg(long, env = "SWITCHYARD_API_BURST", default_value_t = 100)]
    pub(crate) api_burst: u32,
    /// How long a deleted route keeps serving its hosts until another route takes them
    /// over, and the endpoints of a deleted Service that no live route uses keep serving
    /// (its Pods usually outlive it: a route repointed in the same sync must not lose its
    /// backends before the switch). A Service that live routes use is held for the longest
    /// of their drain periods instead. 0s: nothing is held.
    #[arg(long, env = "SWITCHYARD_HOLD", default_value = "10s", value_parser = parse_duration)]
    pub(crate) hold: Duration,
    /// How long the first ProxyConfigs of a unit with nothing live yet wait for others of
    /// its namespace, to be written with them as one batch when at least `--batch-min`
    /// come: a start or a sync bringing up thousands of routes then writes a batch where
    /// it wrote an object per route. 0s: each is written alone (batches already written
    /// still lose their members as they go).
    #[arg(long, env = "SWITCHYARD_BATCH_WINDOW", default_value = "20ms", value_parser = parse_duration)]
    pub(crate) batch_window: Duration,
    /// Fewer first ProxyConfigs than this (at least 2) coming within `--batch-window`
    /// are each written alone.
    #[arg(long, env = "SWITCHYARD_BATCH_MIN", default_value_t = 4)]
    pub(crate) batch_min: usize,
    /// DIAGNOSTIC ONLY: write the live config directly, without staging and verifying new
    /// clusters on every Envoy first. Drops requests; exists to show the two phases matter.
    #[arg(long, hide = true)]
    pub(crate) one_phase: bool,
    /// Also act on the Gateway API: GatewayClasses naming `--gateway-controller-name`,
    /// their Gateways and the routes attached to them. Needs the Gateway API CRDs.
    #[arg(long, env = "SWITCHYARD_GATEWAY_API")]
    pub(crate) gateway_api: bool,
    /// The GatewayClass controllerName Switchyard answers to.
    #[arg(
        long,
        env = "SWITCHYARD_GATEWAY_CONTROLLER_NAME",
        default_value = switchyard::gateway::translate::CONTROLLER_NAME
    )]
    pub(crate) gateway_controller_name: String,
    /// The type of the Service each Gateway gets in the fleet's namespace (its address):
    /// ClusterIP, NodePort or LoadBalancer.
    #[arg(
        long,
        env = "SWITCHYARD_GATEWAY_SERVICE_TYPE",
        default_value = "ClusterIP",
        value_parser = ["ClusterIP", "NodePort", "LoadBalancer"]
    )]
    pub(crate) gateway_service_type: String,
    /// How long a change of a served route waits for a Service or ReferenceGrant that its
    /// backendRefs name and that is not there yet (a GitOps sync applies objects in its own
    /// order), its last generation serving meanwhile, before it is served answering 500 as
    /// the Gateway API asks (0s: not at all). A route never served answers 500 at once.
    #[arg(
        long,
        env = "SWITCHYARD_GATEWAY_REFERENCE_GRACE",
        default_value = "5s",
        value_parser = parse_duration
    )]
    pub(crate) gateway_reference_grace: Duration,
}

#[derive(clap::Args)]
pub(crate) struct LeaderArgs {
    /// Namespace of the leader Lease (default: the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub(crate) lease_namespace: String,
    #[arg(
        long,
        env = "SWITCHYARD_LEASE_NAME",
        default_value = "switchyard-leader"
    )]
    pub(crate) lease_name: String,
    /// This replica's identity in the Lease (default: the pod name).
    #[arg(long, env = "POD_NAME")]
    pub(crate) identity: Option<String>,
    /// How long the Lease holds for the other replicas after a renewal: at most this long
    /// after the leader is gone, another leads.
    #[arg(long, env = "SWITCHYARD_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub(crate) lease_duration_seconds: u64,
    /// How long before the Lease can run out for the others the leader stops writing when
    /// its renewals are not going through (clamped to a tenth to a half of the duration);
    /// it renews every fifth of the rest, at most every 2 s.
    #[arg(long, env = "SWITCHYARD_LEASE_GRACE_SECONDS", default_value_t = 5)]
    pub(crate) lease_grace_seconds: u64,
}

pub(crate) fn parse_namespaced(text: &str) -> Result<(String, String), String> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("{text:?}: expected NAMESPACE/NAME")),
    }
}

/// Where every Envoy listens (identical on every replica).
#[derive(clap::Args)]
pub(crate) struct ListenerArgs {
    #[arg(long, env = "SWITCHYARD_LISTEN_ADDRESS", default_value = "0.0.0.0")]
    pub(crate) listen_address: String,
    #[arg(long, env = "SWITCHYARD_HTTP_PORT", default_value_t = 8080)]
    pub(crate) http_port: u16,
    #[arg(long, env = "SWITCHYARD_HTTPS_PORT", default_value_t = 8443)]
    pub(crate) https_port: u16,
    /// Internal port for readiness probes; the public Service must not expose it.
    #[arg(long, env = "SWITCHYARD_PROBE_PORT", default_value_t = 8090)]
    pub(crate) probe_port: u16,
    /// Envoy's access log of the public listeners, to its stdout: json (one object a
    /// line), text (Envoy's default line) or off.
    #[arg(long, env = "SWITCHYARD_ACCESS_LOG", default_value = "json", value_parser = ["json", "text", "off"])]
    pub(crate) access_log: String,
    /// Of every 100 requests, how many the access log records.
    #[arg(long, env = "SWITCHYARD_ACCESS_LOG_SAMPLE_PERCENT", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub(crate) access_log_sample_percent: u32,
    /// Proxies in front of the Envoys (an L7 load balancer: 1) whose X-Forwarded-For
    /// entries are believed: the client is the address this many from the right.
    #[arg(long, env = "SWITCHYARD_XFF_TRUSTED_HOPS", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=10))]
    pub(crate) xff_trusted_hops: u32,
    /// Read client addresses from PROXY protocol headers put before each connection by
    /// an L4 load balancer (connections without one are served too).
    #[arg(long, env = "SWITCHYARD_PROXY_PROTOCOL")]
    pub(crate) proxy_protocol: bool,
    /// Serve route configurations to delta-xDS Envoys one virtual host at a time (VHDS):
    /// a route change sends that route, not every route. SotW Envoys take them whole.
    /// `false` sends delta Envoys the whole route configuration too.
    #[arg(long, env = "SWITCHYARD_VIRTUAL_HOST_DISCOVERY", default_value_t = true,
          action = clap::ArgAction::Set, value_name = "true|false")]
    pub(crate) virtual_host_discovery: bool,
}

impl ListenerArgs {
    pub(crate) fn access_log(&self) -> AccessLog {
        AccessLog {
            // clap admits only the names format_named knows.
            format: AccessLog::format_named(&self.access_log).unwrap_or_default(),
            sample_percent: self.access_log_sample_percent,
        }
    }

    pub(crate) fn client_ip(&self) -> ClientIp {
        ClientIp {
            xff_trusted_hops: self.xff_trusted_hops,
            proxy_protocol: self.proxy_protocol,
        }
    }
}

#[derive(clap::Args)]
pub(crate) struct BootstrapArgs {
    /// Envoy's node id (how `switchyard status` names it).
    #[arg(long, default_value = "envoy")]
    pub(crate) node_id: String,
    /// Envoy's node cluster.
    #[arg(long, default_value = "switchyard")]
    pub(crate) node_cluster: String,
    /// HOST:PORT of a replica's xDS port; repeat for each replica (Envoy fails over).
    #[arg(
        long = "xds",
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:18000"
    )]
    pub(crate) xds: Vec<String>,
    /// xDS protocol: delta or sotw.
    #[arg(long, default_value = "delta", value_parser = ["delta", "sotw"])]
    pub(crate) protocol: String,
    /// Envoy's admin port, on loopback only (0: Envoy picks one).
    #[arg(long, default_value_t = 9901)]
    pub(crate) admin_port: u16,
    /// Bind every listener to this address instead of 0.0.0.0 (several Envoys on one host).
    #[arg(long, value_name = "IP")]
    pub(crate) listen_address: Option<std::net::IpAddr>,
    /// Mutual TLS to the xDS server: Envoy's client certificate (path as Envoy sees it).
    #[arg(long, value_name = "PATH", requires_all = ["xds_tls_key", "xds_tls_ca"])]
    pub(crate) xds_tls_cert: Option<String>,
    /// The private key of --xds-tls-cert.
    #[arg(long, value_name = "PATH", requires = "xds_tls_cert")]
    pub(crate) xds_tls_key: Option<String>,
    /// The CA that signed the xDS server's certificate.
    #[arg(long, value_name = "PATH", requires = "xds_tls_cert")]
    pub(crate) xds_tls_ca: Option<String>,
    /// JSON instead of YAML.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The bootstrap `switchyard bootstrap` prints.

#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// Where Envoys connect for ADS (gRPC, SotW and delta).
    #[arg(
        long,
        env = "SWITCHYARD_XDS_ADDRESS",
        default_value = "127.0.0.1:18000"
    )]
    pub(crate) xds_address: SocketAddr,
    /// /healthz, /readyz, /metrics, /debug/nodes.
    #[arg(
        long,
        env = "SWITCHYARD_ADMIN_ADDRESS",
        default_value = "127.0.0.1:9000"
    )]
    pub(crate) admin_address: SocketAddr,
    /// Serve xDS over TLS with this certificate (PEM). With --xds-tls-key and
    /// --xds-client-ca; read again when they change (new connections use the new files,
    /// open streams keep theirs).
    #[arg(long, env = "SWITCHYARD_XDS_TLS_CERT", value_name = "PEM")]
    pub(crate) xds_tls_cert: Option<PathBuf>,
    /// The private key of --xds-tls-cert (PEM).
    #[arg(long, env = "SWITCHYARD_XDS_TLS_KEY", value_name = "PEM")]
    pub(crate) xds_tls_key: Option<PathBuf>,
    /// Accept only Envoys whose client certificate one of these CAs signed (PEM bundle).
    #[arg(long, env = "SWITCHYARD_XDS_CLIENT_CA", value_name = "PEM")]
    pub(crate) xds_client_ca: Option<PathBuf>,
    /// Close an xDS stream whose Envoy has answered nothing (ACK or NACK) for this long
    /// while a response waits for its answer, so that it connects again (to another
    /// replica, if its Service picks one). Longer than Envoy holds the answer to a
    /// cluster response while a new cluster warms (its initial-fetch timeout, 15 s).
    #[arg(long, env = "SWITCHYARD_XDS_ANSWER_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub(crate) xds_answer_timeout: Duration,
    /// Secret that probe requests must carry. Every replica must use the same one.
    #[arg(long, env = "SWITCHYARD_PROBE_TOKEN", default_value = "")]
    pub(crate) probe_token: String,
    /// DIAGNOSTIC ONLY: push every change to Envoy at once, without make-before-break
    /// ordering. Drops requests during switches; exists to show that the ordering matters.
    #[arg(long, hide = true)]
    pub(crate) unordered_xds: bool,
}

pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    switchyard::duration::parse(text)
}
