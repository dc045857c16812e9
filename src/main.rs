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
use switchyard::k8s::address_map::AddressMap;
use switchyard::k8s::builder::Builder;
use switchyard::k8s::controller;
use switchyard::k8s::index::{Index, Scope};
use switchyard::k8s::leader::{LeaseSettings, run_when_leader};
use switchyard::metrics::Metrics;
use switchyard::model::ListenerSettings;
use switchyard::prober::Prober;
use switchyard::standalone;
use switchyard::xds::{AdsServer, Desired, Nodes, Ordering};

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
    Operator(OperatorArgs),
    /// Show every Envoy connected to the given replicas: ACKed versus desired, and NACKs.
    Status {
        /// Admin address of a replica (repeat for each), e.g. 127.0.0.1:9000.
        #[arg(long = "admin", default_value = "127.0.0.1:9000")]
        admins: Vec<String>,
    },
    /// Print the ClusterRole the operator needs (YAML).
    Rbac {
        #[arg(long, default_value = "switchyard")]
        name: String,
    },
    /// Write the CustomResourceDefinitions (crds/*.yaml) from the code.
    Crdgen {
        /// Directory to write into.
        #[arg(long, default_value = "crds")]
        out: PathBuf,
    },
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
    /// For single-host test rigs only: EndpointSlices cannot hold loopback addresses, so
    /// map a range onto another (FROM/LEN=TO/LEN, e.g. 198.18.0.0/16=127.0.0.0/16).
    #[arg(long, env = "SWITCHYARD_ENDPOINT_ADDRESS_MAP")]
    endpoint_address_map: Option<AddressMap>,
    /// DIAGNOSTIC ONLY: write the live config directly, without staging and verifying new
    /// clusters on every Envoy first. Drops requests; exists to show the two phases matter.
    #[arg(long, hide = true)]
    one_phase: bool,
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
    /// Secret that probe requests must carry. Every replica must use the same one.
    #[arg(long, env = "SWITCHYARD_PROBE_TOKEN", default_value = "")]
    probe_token: String,
    /// DIAGNOSTIC ONLY: push every change to Envoy at once, without make-before-break
    /// ordering. Drops requests during switches; exists to show that the ordering matters.
    #[arg(long, hide = true)]
    unordered_xds: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    standalone::file::duration_text::parse(text)
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
        Command::Operator(args) => run_operator(args).await,
        Command::Crdgen { out } => crdgen(&out),
        Command::Status { admins } => proxy_status(&admins).await,
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

fn crdgen(out: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for (file, yaml) in switchyard::api::crds()? {
        let path = out.join(file);
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
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
    serve(args.serve, desired, nodes, metrics, registry).await
}

async fn run_operator(args: OperatorArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.serve.probe_token.is_empty(),
        "--probe-token (SWITCHYARD_PROBE_TOKEN) is required: every replica must serve the same secret"
    );
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes (KUBECONFIG or in-cluster config)")?;
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
    let problems = Arc::new(tokio::sync::watch::channel(Vec::new()).0);
    let builder = Builder {
        index: Index::start(&client, &scope),
        address_map: args.endpoint_address_map,
        client: client.clone(),
        listeners: ListenerSettings {
            address: args.listeners.listen_address.clone(),
            http_port: args.listeners.http_port,
            https_port: args.listeners.https_port,
            probe_port: args.listeners.probe_port,
            probe_token: args.serve.probe_token.clone(),
        },
        desired: desired.clone(),
        metrics: metrics.clone(),
        problems: problems.clone(),
    };
    tokio::spawn(builder.run());

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
    let lead = {
        let client = client.clone();
        let scope = scope.clone();
        let envoy_service = args.envoy_service.clone();
        let address_map = args.endpoint_address_map;
        let two_phase = !args.one_phase;
        let status_qps = args.status_qps;
        let problems = problems.clone();
        let nodes = nodes.clone();
        move || {
            controller::run(
                client.clone(),
                controller::Settings {
                    scope: scope.clone(),
                    envoy_service: envoy_service.clone(),
                    address_map,
                    prober: prober.clone(),
                    status_qps,
                    two_phase,
                    problems: problems.subscribe(),
                    nodes: nodes.clone(),
                },
            )
        }
    };
    if args.one_phase {
        tracing::warn!(
            "two-phase rollout is OFF: live routes change before new clusters are proven ready"
        );
    }
    tokio::select! {
        result = serve(args.serve, desired, nodes, metrics, registry) => result,
        result = run_when_leader(client, lease, lead) => result,
    }
}

/// Runs the ADS server and the admin port until one fails or a signal arrives.
async fn serve(
    args: ServeArgs,
    desired: Arc<Desired>,
    nodes: Nodes,
    metrics: Metrics,
    registry: Registry,
) -> anyhow::Result<()> {
    let ordering = if args.unordered_xds {
        Ordering::AllAtOnce
    } else {
        Ordering::MakeBeforeBreak
    };
    let ads = AdsServer::new(desired.clone(), nodes.clone(), metrics, ordering);
    let admin = Admin {
        desired,
        nodes,
        registry: Arc::new(registry),
    };
    info!(xds = %args.xds_address, admin = %args.admin_address, "starting");
    let xds = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(ads.into_service())
        .serve(args.xds_address);
    tokio::select! {
        result = xds => result.with_context(|| format!("xDS server on {}", args.xds_address)),
        result = admin.serve(args.admin_address) => result,
        _ = shutdown_signal() => {
            info!("shutting down");
            Ok(())
        }
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
