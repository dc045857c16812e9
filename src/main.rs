use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use prometheus_client::registry::Registry;
use tracing::info;
use tracing_subscriber::EnvFilter;

use switchyard::admin::Admin;
use switchyard::gateway;
use switchyard::k8s::address_map::AddressMap;
use switchyard::k8s::builder::Builder;
use switchyard::k8s::envoys::Envoys;
use switchyard::k8s::fleet_drain;
use switchyard::k8s::fleet_report::{self, FleetView, ReportSettings, Reports};
use switchyard::k8s::index::{Index, Scope};
use switchyard::k8s::leader::{LeaseSettings, run_when_leader};
use switchyard::k8s::rate_limit::ApiRateLimit;
use switchyard::metrics::Metrics;
use switchyard::model::{AccessLog, ClientIp, ListenerSettings};
use switchyard::prober::Prober;
use switchyard::serving::Serving;
use switchyard::standalone;
use switchyard::traffic_route;
use switchyard::xds::{AdsServer, Desired, Nodes, Ordering, Protocol};
use switchyard::xds_tls::{ReloadingTls, TlsFiles};

#[derive(Parser)]
#[command(
    name = "switchyard",
    version,
    about = "Shifts HTTP traffic between backends through Envoy without dropping a request"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
    /// standalone configuration (directory or file), or Kubernetes manifests (TrafficRoutes,
    /// Services, EndpointSlices, TLS Secrets). Problems go to stderr; exit status 1 if any.
    Translate {
        /// The directory or file.
        #[arg(short = 'f', long = "file", value_name = "PATH")]
        path: PathBuf,
        /// What to print: the Envoy resources, or the routing model.
        #[arg(long, value_enum, default_value = "xds")]
        stage: switchyard::offline::Stage,
    },
    /// Write the CustomResourceDefinitions (crds/*.yaml) from the code.
    Crdgen {
        /// Directory to write into.
        #[arg(long, default_value = "crds")]
        out: PathBuf,
    },
}

#[derive(clap::Args)]
struct CertgenArgs {
    /// Directory to write ca.crt, ca.key, server.crt, server.key, client.crt and
    /// client.key into (keys readable by the owner only).
    #[arg(
        long,
        required_unless_present = "kubernetes",
        conflicts_with = "kubernetes"
    )]
    out: Option<PathBuf>,
    /// Print two kubernetes.io/tls Secrets (tls.crt, tls.key, ca.crt) for this namespace
    /// instead of writing files; the CA key is not kept.
    #[arg(long, value_name = "NAMESPACE")]
    kubernetes: Option<String>,
    /// A DNS name or IP address of the server certificate (repeat for each). Default:
    /// localhost, 127.0.0.1, ::1 and the names of the chart's xDS Service
    /// (--xds-service, in --namespace).
    #[arg(long = "dns", value_name = "NAME")]
    names: Vec<String>,
    /// Validity of every certificate, in days.
    #[arg(long, default_value_t = 365)]
    days: u32,
    /// The chart's xDS Service (<release>-xds), for the default names.
    #[arg(long, default_value = switchyard::certgen::DEFAULT_XDS_SERVICE)]
    xds_service: String,
    /// Its namespace, for the default names (default: the --kubernetes namespace, else
    /// switchyard-system).
    #[arg(long)]
    namespace: Option<String>,
    /// With --kubernetes: the operator's Secret (the chart's xds.tls.serverSecret).
    #[arg(long, default_value = "switchyard-xds-server-tls")]
    server_secret: String,
    /// With --kubernetes: Envoy's Secret (the chart's xds.tls.clientSecret).
    #[arg(long, default_value = "switchyard-xds-client-tls")]
    client_secret: String,
    /// Replace existing files in --out.
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args)]
struct StandaloneArgs {
    /// Directory of *.yaml files (see README, "Standalone mode").
    #[arg(long, env = "SWITCHYARD_CONFIG")]
    config: PathBuf,
    #[command(flatten)]
    serve: ServeArgs,
    /// How often the directory is checked for changes.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    poll_interval: Duration,
}

#[derive(clap::Args)]
struct OperatorArgs {
    /// Namespaces to watch (comma-separated); all when empty.
    #[arg(long, env = "SWITCHYARD_NAMESPACES", value_delimiter = ',')]
    namespaces: Vec<String>,
    /// The Service whose ready endpoints are the Envoy fleet, as NAMESPACE/NAME. Every
    /// rollout proves readiness on each of them.
    #[arg(long, env = "SWITCHYARD_ENVOY_SERVICE", value_parser = parse_namespaced)]
    envoy_service: (String, String),
    #[command(flatten)]
    listeners: ListenerArgs,
    #[command(flatten)]
    serve: ServeArgs,
    #[command(flatten)]
    leader: LeaderArgs,
    /// Status writes per second at most (they never delay xDS).
    #[arg(long, env = "SWITCHYARD_STATUS_QPS", default_value_t = 20.0)]
    status_qps: f64,
    /// API requests per second at most, on average (watches, reads, writes; the leader
    /// Lease has a client of its own). 0, the default: no client-side limit, as in
    /// controller-runtime, since the API server's Priority and Fairness protects it.
    #[arg(long, env = "SWITCHYARD_API_QPS", default_value_t = 0.0)]
    api_qps: f64,
    /// API requests at once before `--api-qps` paces them.
    #[arg(long, env = "SWITCHYARD_API_BURST", default_value_t = 100)]
    api_burst: u32,
    /// For single-host test rigs only: EndpointSlices cannot hold loopback addresses, so
    /// map a range onto another (FROM/LEN=TO/LEN, e.g. 198.18.0.0/16=127.0.0.0/16).
    #[arg(long, env = "SWITCHYARD_ENDPOINT_ADDRESS_MAP")]
    endpoint_address_map: Option<AddressMap>,
    /// How long the endpoints of a deleted Service keep serving the routes that still use
    /// them (its Pods usually outlive it: a route repointed in the same sync must not lose
    /// its backends before the switch), and a deleted route keeps serving its hosts until
    /// another route takes them over (0: both go at once).
    #[arg(long, env = "SWITCHYARD_HOLD", default_value = "10s", value_parser = parse_duration)]
    hold: Duration,
    /// DIAGNOSTIC ONLY: write the live config directly, without staging and verifying new
    /// clusters on every Envoy first. Drops requests; exists to show the two phases matter.
    #[arg(long, hide = true)]
    one_phase: bool,
    /// Also act on the Gateway API: GatewayClasses naming `--gateway-controller-name`,
    /// their Gateways and the HTTPRoutes attached to them. Needs the Gateway API CRDs.
    #[arg(long, env = "SWITCHYARD_GATEWAY_API")]
    gateway_api: bool,
    /// The GatewayClass controllerName Switchyard answers to.
    #[arg(
        long,
        env = "SWITCHYARD_GATEWAY_CONTROLLER_NAME",
        default_value = switchyard::gateway::translate::CONTROLLER_NAME
    )]
    gateway_controller_name: String,
    /// The type of the Service each Gateway gets in the fleet's namespace (its address):
    /// ClusterIP, NodePort or LoadBalancer.
    #[arg(
        long,
        env = "SWITCHYARD_GATEWAY_SERVICE_TYPE",
        default_value = "ClusterIP",
        value_parser = ["ClusterIP", "NodePort", "LoadBalancer"]
    )]
    gateway_service_type: String,
}

#[derive(clap::Args)]
struct LeaderArgs {
    /// Namespace of the leader Lease (default: the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    #[arg(
        long,
        env = "SWITCHYARD_LEASE_NAME",
        default_value = "switchyard-leader"
    )]
    lease_name: String,
    /// This replica's identity in the Lease (default: the pod name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    #[arg(long, env = "SWITCHYARD_LEASE_DURATION_SECONDS", default_value_t = 15)]
    lease_duration_seconds: u64,
    #[arg(long, env = "SWITCHYARD_LEASE_GRACE_SECONDS", default_value_t = 5)]
    lease_grace_seconds: u64,
}

fn parse_namespaced(text: &str) -> Result<(String, String), String> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("{text:?}: expected NAMESPACE/NAME")),
    }
}

/// Where every Envoy listens (identical on every replica).
#[derive(clap::Args)]
struct ListenerArgs {
    #[arg(long, env = "SWITCHYARD_LISTEN_ADDRESS", default_value = "0.0.0.0")]
    listen_address: String,
    #[arg(long, env = "SWITCHYARD_HTTP_PORT", default_value_t = 8080)]
    http_port: u16,
    #[arg(long, env = "SWITCHYARD_HTTPS_PORT", default_value_t = 8443)]
    https_port: u16,
    /// Internal port for readiness probes; the public Service must not expose it.
    #[arg(long, env = "SWITCHYARD_PROBE_PORT", default_value_t = 8090)]
    probe_port: u16,
    /// Envoy's access log of the public listeners, to its stdout: json (one object a
    /// line), text (Envoy's default line) or off.
    #[arg(long, env = "SWITCHYARD_ACCESS_LOG", default_value = "json", value_parser = ["json", "text", "off"])]
    access_log: String,
    /// Of every 100 requests, how many the access log records.
    #[arg(long, env = "SWITCHYARD_ACCESS_LOG_SAMPLE_PERCENT", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    access_log_sample_percent: u32,
    /// Proxies in front of the Envoys (an L7 load balancer: 1) whose X-Forwarded-For
    /// entries are believed: the client is the address this many from the right.
    #[arg(long, env = "SWITCHYARD_XFF_TRUSTED_HOPS", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=10))]
    xff_trusted_hops: u32,
    /// Read client addresses from PROXY protocol headers put before each connection by
    /// an L4 load balancer (connections without one are served too).
    #[arg(long, env = "SWITCHYARD_PROXY_PROTOCOL")]
    proxy_protocol: bool,
    /// Serve route configurations to delta-xDS Envoys one virtual host at a time (VHDS):
    /// a route change sends that route, not every route. SotW Envoys take them whole.
    /// `false` sends delta Envoys the whole route configuration too.
    #[arg(long, env = "SWITCHYARD_VIRTUAL_HOST_DISCOVERY", default_value_t = true,
          action = clap::ArgAction::Set, value_name = "true|false")]
    virtual_host_discovery: bool,
}

impl ListenerArgs {
    fn access_log(&self) -> AccessLog {
        AccessLog {
            // clap admits only the names format_named knows.
            format: AccessLog::format_named(&self.access_log).unwrap_or_default(),
            sample_percent: self.access_log_sample_percent,
        }
    }

    fn client_ip(&self) -> ClientIp {
        ClientIp {
            xff_trusted_hops: self.xff_trusted_hops,
            proxy_protocol: self.proxy_protocol,
        }
    }
}

#[derive(clap::Args)]
struct BootstrapArgs {
    /// Envoy's node id (how `switchyard status` names it).
    #[arg(long, default_value = "envoy")]
    node_id: String,
    /// Envoy's node cluster.
    #[arg(long, default_value = "switchyard")]
    node_cluster: String,
    /// HOST:PORT of a replica's xDS port; repeat for each replica (Envoy fails over).
    #[arg(
        long = "xds",
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:18000"
    )]
    xds: Vec<String>,
    /// xDS protocol: delta or sotw.
    #[arg(long, default_value = "delta", value_parser = ["delta", "sotw"])]
    protocol: String,
    /// Envoy's admin port, on loopback only (0: Envoy picks one).
    #[arg(long, default_value_t = 9901)]
    admin_port: u16,
    /// Bind every listener to this address instead of 0.0.0.0 (several Envoys on one host).
    #[arg(long, value_name = "IP")]
    listen_address: Option<std::net::IpAddr>,
    /// Mutual TLS to the xDS server: Envoy's client certificate (path as Envoy sees it).
    #[arg(long, value_name = "PATH", requires_all = ["xds_tls_key", "xds_tls_ca"])]
    xds_tls_cert: Option<String>,
    /// The private key of --xds-tls-cert.
    #[arg(long, value_name = "PATH", requires = "xds_tls_cert")]
    xds_tls_key: Option<String>,
    /// The CA that signed the xDS server's certificate.
    #[arg(long, value_name = "PATH", requires = "xds_tls_cert")]
    xds_tls_ca: Option<String>,
    /// JSON instead of YAML.
    #[arg(long)]
    json: bool,
}

/// The bootstrap `switchyard bootstrap` prints.
fn bootstrap(args: &BootstrapArgs) -> anyhow::Result<String> {
    use switchyard::bootstrap::{Bootstrap, XdsTls};
    let xds = args
        .xds
        .iter()
        .map(|address| {
            let (host, port) = address
                .rsplit_once(':')
                .with_context(|| format!("--xds {address:?}: expected HOST:PORT"))?;
            let port = port
                .parse::<u16>()
                .with_context(|| format!("--xds {address:?}: port {port:?} is not a port"))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            anyhow::ensure!(!host.is_empty(), "--xds {address:?}: the host is empty");
            Ok((host.to_string(), port))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let tls = match (&args.xds_tls_cert, &args.xds_tls_key, &args.xds_tls_ca) {
        (Some(cert), Some(key), Some(ca)) => Some(XdsTls {
            cert: cert.clone(),
            key: key.clone(),
            ca: ca.clone(),
        }),
        _ => None,
    };
    let yaml = Bootstrap {
        node_id: args.node_id.clone(),
        node_cluster: args.node_cluster.clone(),
        xds,
        protocol: if args.protocol == "sotw" {
            Protocol::Sotw
        } else {
            Protocol::Delta
        },
        admin_address: "127.0.0.1".into(),
        admin_port: args.admin_port,
        listen_address: args.listen_address.map(|a| a.to_string()),
        tls,
    }
    .to_yaml();
    if !args.json {
        return Ok(yaml);
    }
    let value: serde_json::Value =
        serde_saphyr::from_str(&yaml).context("reading the bootstrap back")?;
    Ok(format!("{}\n", serde_json::to_string_pretty(&value)?))
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Where Envoys connect for ADS (gRPC, SotW and delta).
    #[arg(
        long,
        env = "SWITCHYARD_XDS_ADDRESS",
        default_value = "127.0.0.1:18000"
    )]
    xds_address: SocketAddr,
    /// /healthz, /readyz, /metrics, /debug/nodes.
    #[arg(
        long,
        env = "SWITCHYARD_ADMIN_ADDRESS",
        default_value = "127.0.0.1:9000"
    )]
    admin_address: SocketAddr,
    /// Serve xDS over TLS with this certificate (PEM). With --xds-tls-key and
    /// --xds-client-ca; read again when they change (new connections use the new files,
    /// open streams keep theirs).
    #[arg(long, env = "SWITCHYARD_XDS_TLS_CERT", value_name = "PEM")]
    xds_tls_cert: Option<PathBuf>,
    /// The private key of --xds-tls-cert (PEM).
    #[arg(long, env = "SWITCHYARD_XDS_TLS_KEY", value_name = "PEM")]
    xds_tls_key: Option<PathBuf>,
    /// Accept only Envoys whose client certificate one of these CAs signed (PEM bundle).
    #[arg(long, env = "SWITCHYARD_XDS_CLIENT_CA", value_name = "PEM")]
    xds_client_ca: Option<PathBuf>,
    /// Secret that probe requests must carry. Every replica must use the same one.
    #[arg(long, env = "SWITCHYARD_PROBE_TOKEN", default_value = "")]
    probe_token: String,
    /// DIAGNOSTIC ONLY: push every change to Envoy at once, without make-before-break
    /// ordering. Drops requests during switches; exists to show that the ordering matters.
    #[arg(long, hide = true)]
    unordered_xds: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    switchyard::duration::parse(text)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Standalone(args) => run_standalone(args).await,
        Command::Operator(args) => run_operator(*args).await,
        Command::Crdgen { out } => crdgen(&out),
        Command::Translate { path, stage } => translate_offline(&path, stage),
        Command::Certgen(args) => certgen(args),
        Command::Bootstrap(args) => {
            print!("{}", bootstrap(&args)?);
            Ok(())
        }
        Command::Status {
            admins,
            kubernetes,
            namespace,
            selector,
        } => {
            if kubernetes {
                proxy_status_through_api(&namespace, &selector).await
            } else {
                proxy_status(&admins).await
            }
        }
        Command::Rbac { name } => {
            let role = switchyard::k8s::rbac::cluster_role(&name);
            print!("{}", serde_saphyr::to_string(&role)?);
            Ok(())
        }
    }
}

async fn proxy_status(admins: &[String]) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let mut views = Vec::new();
    for admin in admins {
        let url = if admin.starts_with("http") {
            format!("{admin}/debug/nodes")
        } else {
            format!("http://{admin}/debug/nodes")
        };
        let text = client
            .get(&url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .with_context(|| format!("asking {url}"))?
            .text()
            .await?;
        let view: switchyard::proxy_status::NodesView =
            serde_json::from_str(&text).with_context(|| format!("reading {url}"))?;
        views.push((admin.clone(), view));
    }
    print!("{}", switchyard::proxy_status::render(&views));
    Ok(())
}

/// `switchyard status --kubernetes`: every operator Pod's `/debug/nodes`, through the API
/// server's Pod proxy (the caller needs `get` on `pods` and `pods/proxy`).
async fn proxy_status_through_api(namespace: &str, selector: &str) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (kubeconfig or in-cluster)")?;
    let views = switchyard::proxy_status::from_kubernetes(&client, namespace, selector).await?;
    if views.is_empty() {
        anyhow::bail!("no running Pod in {namespace} matches {selector}");
    }
    print!("{}", switchyard::proxy_status::render(&views));
    Ok(())
}

fn crdgen(out: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for (file, yaml) in switchyard::api::crds()? {
        let path = out.join(file);
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    // The reference lives in docs/ when crds/ is the repository's.
    let docs = out.join("../docs/crd-reference.md");
    if docs.parent().is_some_and(|d| d.is_dir()) {
        std::fs::write(&docs, switchyard::api::reference::markdown())
            .with_context(|| format!("writing {}", docs.display()))?;
        println!("wrote {}", docs.display());
    }
    Ok(())
}

fn certgen(args: CertgenArgs) -> anyhow::Result<()> {
    let names = if args.names.is_empty() {
        let namespace = args
            .namespace
            .as_deref()
            .or(args.kubernetes.as_deref())
            .unwrap_or(switchyard::certgen::DEFAULT_NAMESPACE);
        switchyard::certgen::default_server_names(&args.xds_service, namespace)
    } else {
        args.names.clone()
    };
    let bundle = switchyard::certgen::generate(&names, args.days)?;
    if let Some(namespace) = &args.kubernetes {
        print!(
            "{}",
            bundle.kubernetes_secrets(namespace, &args.server_secret, &args.client_secret)?
        );
        eprintln!(
            "Secrets {} and {} for namespace {namespace}; server names: {}",
            args.server_secret,
            args.client_secret,
            names.join(", ")
        );
    } else if let Some(out) = &args.out {
        for path in bundle.write(out, args.force)? {
            println!("wrote {}", path.display());
        }
        println!("server names: {}", names.join(", "));
    }
    Ok(())
}

/// `switchyard translate`: the rendering on stdout, the problems on stderr.
fn translate_offline(
    path: &std::path::Path,
    stage: switchyard::offline::Stage,
) -> anyhow::Result<()> {
    let output = switchyard::offline::run(path, stage)?;
    print!("{}", output.text);
    for problem in &output.problems {
        eprintln!("problem: {problem}");
    }
    if !output.problems.is_empty() {
        eprintln!(
            "{} problem(s): what they name is not served",
            output.problems.len()
        );
        std::process::exit(1);
    }
    Ok(())
}

async fn run_standalone(args: StandaloneArgs) -> anyhow::Result<()> {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let desired = Arc::new(Desired::new());
    let nodes = Nodes::default();
    let probe_token = if args.serve.probe_token.is_empty() {
        // Standalone runs one replica: a token of its own is enough.
        switchyard::hash::digest(
            format!("{:?}{}", std::time::SystemTime::now(), std::process::id()).as_bytes(),
        )
    } else {
        args.serve.probe_token.clone()
    };
    let watcher = standalone::Watcher {
        dir: args.config.clone(),
        probe_token,
        poll_interval: args.poll_interval,
        desired: desired.clone(),
        metrics: metrics.clone(),
    };
    tokio::spawn(watcher.run());
    serve(
        args.serve,
        desired,
        nodes,
        metrics,
        registry,
        shutdown_signal(),
    )
    .await
}

async fn run_operator(args: OperatorArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.serve.probe_token.is_empty(),
        "--probe-token (SWITCHYARD_PROBE_TOKEN) is required: every replica must serve the same secret"
    );
    let config = kube::Config::infer()
        .await
        .context("connecting to Kubernetes (KUBECONFIG or in-cluster config)")?;
    let client = api_client(config.clone(), args.api_qps, args.api_burst)?;
    // Lease renewals never queue behind a burst of reconciles.
    let lease_client = kube::Client::try_from(config).context("building the Lease client")?;
    // An empty SWITCHYARD_NAMESPACES means all of them.
    let namespaces: Vec<String> = args
        .namespaces
        .iter()
        .filter(|n| !n.is_empty())
        .cloned()
        .collect();
    let scope = if namespaces.is_empty() {
        Scope::All
    } else {
        Scope::Namespaces(namespaces)
    };
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let desired = Arc::new(Desired::new());
    let nodes = Nodes::default();
    // The Kubernetes side sees the xDS server only as the Envoys it serves.
    let envoys: Arc<dyn Envoys> = Arc::new(Serving {
        desired: desired.clone(),
        nodes: nodes.clone(),
    });
    let problems = Arc::new(tokio::sync::watch::channel(Vec::new()).0);
    let index = Index::start(&client, &scope);
    let proxy_configs = index.proxy_configs.clone();
    let builder = Builder {
        index,
        address_map: args.endpoint_address_map,
        hold: args.hold,
        listeners: ListenerSettings {
            access_log: args.listeners.access_log(),
            client_ip: args.listeners.client_ip(),
            address: args.listeners.listen_address.clone(),
            http_port: args.listeners.http_port,
            https_port: args.listeners.https_port,
            probe_port: args.listeners.probe_port,
            probe_token: args.serve.probe_token.clone(),
            virtual_host_discovery: args.listeners.virtual_host_discovery,
        },
        metrics: metrics.clone(),
        problems: problems.clone(),
        envoys: envoys.clone(),
    };
    tokio::spawn(builder.run());
    // Every replica: the Envoys connected here are drained when their Pods terminate.
    tokio::spawn(fleet_drain::run(
        client.clone(),
        args.envoy_service.clone(),
        envoys.clone(),
    ));

    let prober = Prober::new(args.listeners.probe_port, args.serve.probe_token.clone())
        .context("building the probe client")?;
    let identity = args
        .leader
        .identity
        .clone()
        .unwrap_or_else(|| format!("switchyard-{}", std::process::id()));
    let lease = LeaseSettings {
        namespace: args.leader.lease_namespace.clone(),
        name: args.leader.lease_name.clone(),
        identity,
        duration_seconds: args.leader.lease_duration_seconds,
        grace_seconds: args.leader.lease_grace_seconds,
    };
    // Every replica reports its Envoys' NACKs; the leader reads the others' reports.
    let report_settings = ReportSettings {
        namespace: lease.namespace.clone(),
        lease_name: lease.name.clone(),
        identity: lease.identity.clone(),
        pod: std::env::var("POD_NAME")
            .ok()
            .zip(std::env::var("POD_UID").ok()),
    };
    tokio::spawn(fleet_report::publish(
        client.clone(),
        report_settings.clone(),
        envoys.clone(),
        problems.subscribe(),
    ));
    let lead = {
        let client = client.clone();
        let scope = scope.clone();
        let envoy_service = args.envoy_service.clone();
        let address_map = args.endpoint_address_map;
        let two_phase = !args.one_phase;
        let status_qps = args.status_qps;
        let problems = problems.clone();
        let envoys = envoys.clone();
        let metrics = metrics.clone();
        let proxy_configs = proxy_configs.clone();
        let gateway_api = args.gateway_api.then(|| {
            (
                args.gateway_controller_name.clone(),
                args.gateway_service_type.clone(),
            )
        });
        move || {
            // This term's view of the fleet: its Envoys and the other replicas' reports.
            let (reports, report_changes) = Reports::watch(&client, &report_settings);
            let (fleet_tx, fleet) = tokio::sync::watch::channel(FleetView::default());
            let fleet_view = fleet_report::keep_fleet_view(
                reports,
                report_changes,
                envoys.clone(),
                problems.subscribe(),
                fleet_tx,
                (
                    metrics.fleet_envoys_rejecting.clone(),
                    metrics.fleet_routes_refused.clone(),
                ),
            );
            let gateways = gateway_api.clone().map(|(controller_name, service_type)| {
                let settings = gateway::controller::Settings {
                    controller_name,
                    fleet_service: envoy_service.clone(),
                    service_type,
                    prober: prober.clone(),
                    address_map,
                    two_phase,
                    envoys: envoys.clone(),
                };
                gateway::controller::run(client.clone(), settings)
            });
            let rollout = traffic_route::run(
                client.clone(),
                traffic_route::Settings {
                    scope: scope.clone(),
                    envoy_service: envoy_service.clone(),
                    address_map,
                    prober: prober.clone(),
                    status_qps,
                    two_phase,
                    problems: problems.subscribe(),
                    envoys: envoys.clone(),
                    fleet,
                    metrics: metrics.clone(),
                    proxy_configs: proxy_configs.clone(),
                },
            );
            async move {
                // All run while leading; none ends the others.
                let gateways = async {
                    if let Some(gateways) = gateways {
                        gateways.await;
                    }
                };
                tokio::join!(rollout, gateways, fleet_view);
            }
        }
    };
    if args.serve.xds_tls_cert.is_none() {
        tracing::warn!(
            "xDS is served in plaintext: any pod that reaches the xDS port can read the \
             configuration (TLS keys included); set --xds-tls-cert, --xds-tls-key and \
             --xds-client-ca (chart: xds.tls.enabled)"
        );
    }
    if args.one_phase {
        tracing::warn!(
            "two-phase rollout is OFF: live routes change before new clusters are proven ready"
        );
    }
    // The leader's first pass reconciles every route at once; started before the first
    // snapshot, it would compete with the initial lists for the API server and hold the
    // startup gate (I5). A replica that cannot serve xDS has no business leading either.
    let mut first_snapshot = desired.subscribe();
    // One stop for both halves: a signal, or the xDS server failing.
    let stopping = Arc::new(tokio::sync::watch::channel(false).0);
    {
        let stopping = stopping.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            stopping.send_replace(true);
        });
    }
    let lead_once_serving = {
        let (before_first, while_leading) = (stopped(&stopping), stopped(&stopping));
        async move {
            tokio::select! {
                first = first_snapshot.wait_for(Option::is_some) => {
                    if first.is_err() {
                        anyhow::bail!("the snapshot builder stopped before the first snapshot");
                    }
                }
                () = before_first => return Ok(()),
            }
            run_when_leader(lease_client, lease, lead, while_leading).await
        }
    };
    let mut leading = tokio::spawn(lead_once_serving);
    tokio::select! {
        result = serve(args.serve, desired, nodes, metrics, registry, stopped(&stopping)) => {
            // The leader steps down too, and releases the Lease before the process ends.
            stopping.send_replace(true);
            let _ = tokio::time::timeout(Duration::from_secs(6), &mut leading).await;
            result
        }
        result = &mut leading => result.context("the leader task")?,
    }
}

/// Completes once `stopping` says so (or its sender is gone).
fn stopped(stopping: &tokio::sync::watch::Sender<bool>) -> impl Future<Output = ()> + use<> {
    let mut receiver = stopping.subscribe();
    async move {
        let _ = receiver.wait_for(|stop| *stop).await;
    }
}

/// A kube client whose requests are held to `qps` on average, `burst` at once (0 qps: no
/// limit).
fn api_client(config: kube::Config, qps: f64, burst: u32) -> anyhow::Result<kube::Client> {
    let builder =
        kube::client::ClientBuilder::try_from(config).context("building the API client")?;
    Ok(if qps > 0.0 {
        builder.with_layer(&ApiRateLimit::new(qps, burst)).build()
    } else {
        builder.build()
    })
}

/// Runs the ADS server and the admin port until one fails or `stop` completes.
async fn serve(
    args: ServeArgs,
    desired: Arc<Desired>,
    nodes: Nodes,
    metrics: Metrics,
    registry: Registry,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let ordering = if args.unordered_xds {
        Ordering::AllAtOnce
    } else {
        Ordering::MakeBeforeBreak
    };
    let admin = Admin {
        desired: desired.clone(),
        nodes: nodes.clone(),
        registry: Arc::new(registry),
    };
    let tls = match xds_tls_files(&args)? {
        Some(files) => {
            Some(ReloadingTls::load(files).context("the xDS TLS certificate, key or client CA")?)
        }
        None => None,
    };
    info!(
        xds = %args.xds_address,
        admin = %args.admin_address,
        xds_tls = if tls.is_some() { "mutual TLS" } else { "plaintext" },
        "starting"
    );
    let reload_failures = metrics.xds_tls_reload_failures.clone();
    let ads = AdsServer::new(desired.clone(), nodes.clone(), metrics, ordering);
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(ads.into_service());
    let xds = async {
        match tls {
            Some(tls) => {
                let incoming = tls.incoming(args.xds_address).await?;
                tokio::spawn(tls.keep_reloading(reload_failures));
                router.serve_with_incoming(incoming).await?;
            }
            None => router.serve(args.xds_address).await?,
        }
        anyhow::Ok(())
    };
    tokio::select! {
        result = xds => result.with_context(|| format!("xDS server on {}", args.xds_address)),
        result = admin.serve(args.admin_address) => result,
        () = stop => {
            info!("shutting down");
            Ok(())
        }
    }
}

/// The ADS server's TLS files: its certificate and key, and the client CA whose signature
/// every Envoy's certificate must bear. None without the flags (plaintext). Read again
/// whenever they change (see [`switchyard::xds_tls`]).
fn xds_tls_files(args: &ServeArgs) -> anyhow::Result<Option<TlsFiles>> {
    match (&args.xds_tls_cert, &args.xds_tls_key, &args.xds_client_ca) {
        (None, None, None) => Ok(None),
        (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: ca.clone(),
        })),
        _ => anyhow::bail!(
            "--xds-tls-cert, --xds-tls-key and --xds-client-ca go together: \
             Switchyard serves xDS with mutual TLS or not at all"
        ),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
