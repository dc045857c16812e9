//! The composition root: the only place that knows every part. It builds the serving
//! pipeline every replica runs (index → builder → xDS server), the front-ends the leader
//! runs over the rollout engine, and the admin port; the command line is in `cli`.

mod cli;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use prometheus_client::registry::Registry;
use tracing::info;
use tracing_subscriber::EnvFilter;

use k8s_openapi::api::coordination::v1::Lease;
use switchyard::admin::Admin;
use switchyard::gateway;
use switchyard::k8s::api_client;
use switchyard::k8s::builder::Builder;
use switchyard::k8s::built_from::BuiltFrom;
use switchyard::k8s::envoys::Envoys;
use switchyard::k8s::fleet_drain;
use switchyard::k8s::fleet_report::{self, FleetView, ReportSettings, Reports};
use switchyard::k8s::index::{ForLeader, Index, Scope};
use switchyard::k8s::leader::gate::WriteGate;
use switchyard::k8s::leader::{LeaseMetrics, LeaseSettings, run_when_leader};
use switchyard::k8s::rate_limit::ApiRateLimit;
use switchyard::k8s::status::StatusWriter;
use switchyard::k8s::watched::Watched;
use switchyard::metrics::Metrics;
use switchyard::model::ListenerSettings;
use switchyard::prober::Prober;
use switchyard::serving::Serving;
use switchyard::standalone;
use switchyard::traffic_route;
use switchyard::xds::{AdsServer, Desired, Nodes, Ordering};

use cli::commands::{
    bootstrap, certgen, crdgen, proxy_status, proxy_status_through_api, translate_offline,
};
use cli::{Cli, Command, OperatorArgs, ServeArgs, StandaloneArgs};
use switchyard::xds_tls::{ReloadingTls, TlsFiles};

/// jemalloc, not glibc's malloc: a replica is many threads allocating and freeing small
/// objects at once (watches, passes, xDS streams), where glibc's allocator was ≈ 35 % of the
/// xDS server's samples in a fan-out and 28 % of the operator's in a cold start
/// (docs/benchmarks.md, "The allocator" and "Where a cold start's CPU goes").
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
        Command::Translate {
            path,
            stage,
            output,
        } => translate_offline(&path, stage, output),
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
    // One budget of API requests for the replica's reads and the leader's writes alike.
    let rate_limit = (args.api_qps > 0.0).then(|| ApiRateLimit::new(args.api_qps, args.api_burst));
    let client = api_client(config.clone(), rate_limit.clone(), None)?;
    // The Lease watch's news never queue behind a burst of reconciles.
    let lease_client = unlimited_client(config.clone())?;
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
    let lease_metrics = LeaseMetrics::register(&mut registry);
    let desired = Arc::new(Desired::new());
    let nodes = Nodes::default();
    // The Kubernetes side sees the xDS server only as the Envoys it serves.
    let envoys: Arc<dyn Envoys> = Arc::new(Serving {
        desired: desired.clone(),
        nodes: nodes.clone(),
    });
    let problems = Arc::new(tokio::sync::watch::channel(Vec::new()).0);
    let built_from = Arc::new(BuiltFrom::default());
    // Each kind is watched once in this process; the leader's front-ends read these too.
    let index = Index::start(&client, &scope, &args.envoy_service.0);
    let fleet_slices = index.fleet(&args.envoy_service);
    let for_leader = ForLeader::new(&index, &scope, fleet_slices.clone(), &args.envoy_service.0);
    let builder = Builder {
        index,
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
        built_from: built_from.clone(),
    };
    tokio::spawn(builder.run());
    // Every replica: the Envoys connected here are drained when their Pods terminate.
    tokio::spawn(fleet_drain::run(fleet_slices, envoys.clone()));

    let prober = Prober::new(args.listeners.probe_port, args.serve.probe_token.clone())
        .context("building the probe client")?;
    let identity = args.leader.identity.clone().unwrap_or_else(unique_identity);
    let lease = LeaseSettings {
        namespace: args.leader.lease_namespace.clone(),
        name: args.leader.lease_name.clone(),
        identity,
        duration_seconds: args.leader.lease_duration_seconds,
        grace_seconds: args.leader.lease_grace_seconds,
    };
    // One watch of the Leases in their namespace: the leader election's Lease (to hear it
    // released) and the replicas' reports. On the Lease client: a renewal's and a
    // release's news never queue behind a burst of reconciles either.
    let leases = Watched::<Lease>::start(
        vec![kube::Api::namespaced(
            lease_client.clone(),
            &lease.namespace,
        )],
        kube::runtime::watcher::Config::default(),
    );
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
        let config = config.clone();
        let rate_limit = rate_limit.clone();
        let leases = leases.clone();
        let envoy_service = args.envoy_service.clone();
        let two_phase = !args.one_phase;
        let status_qps = args.status_qps;
        let batching = switchyard::rollout::batch::Settings {
            window: args.batch_window,
            min: args.batch_min.max(2),
            ..Default::default()
        };
        let problems = problems.clone();
        let envoys = envoys.clone();
        let metrics = metrics.clone();
        let gateway_api = args.gateway_api.then(|| {
            (
                args.gateway_controller_name.clone(),
                args.gateway_service_type.clone(),
                args.gateway_reference_grace,
            )
        });
        move |gate: WriteGate| {
            // Every write of this term goes through its gate (reads too: a term that may
            // not write has nothing to read for).
            let client = match api_client(config.clone(), rate_limit.clone(), Some(gate)) {
                Ok(client) => client,
                Err(error) => {
                    // Built from the configuration every other client was built from: it
                    // cannot fail unless something is badly wrong; never lead without it.
                    tracing::error!(error = %format!("{error:#}"), "cannot build the leader's API client");
                    std::process::exit(1);
                }
            };
            // This term's view of the fleet: its Envoys and the other replicas' reports.
            let (reports, report_changes) = Reports::watch(&leases, &report_settings);
            // The Services are watched while leading only; the rest since the start.
            let watches = for_leader.start(&client);
            // Every front-end's first ProxyConfigs, written together when they coincide.
            // (With a window of 0 nothing new is batched; the batches there are still lose
            // their members as they go.)
            let batches = Some(switchyard::rollout::Batches::new(
                client.clone(),
                watches.batches.clone(),
                batching,
            ));
            // One writer of every front-end's statuses, rate-limited together.
            let status = StatusWriter::start(
                client.clone(),
                status_qps,
                metrics.status_writes_pending.clone(),
            );
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
            let gateways = gateway_api
                .clone()
                .map(|(controller_name, service_type, grace)| {
                    let settings = gateway::controller::Settings {
                        controller_name,
                        fleet_service: envoy_service.clone(),
                        service_type,
                        prober: prober.clone(),
                        two_phase,
                        envoys: envoys.clone(),
                        watches: watches.clone(),
                        status: status.clone(),
                        problems: problems.subscribe(),
                        reference_grace: grace,
                        batches: batches.clone(),
                    };
                    gateway::controller::run(client.clone(), settings)
                });
            let rollout = traffic_route::run(
                client.clone(),
                traffic_route::Settings {
                    prober: prober.clone(),
                    status,
                    two_phase,
                    problems: problems.subscribe(),
                    envoys: envoys.clone(),
                    built_from: built_from.clone(),
                    fleet,
                    metrics: metrics.clone(),
                    watches,
                    batches: batches.clone(),
                },
            );
            async move {
                // All run while leading; none ends the others.
                let gateways = async {
                    if let Some(gateways) = gateways {
                        gateways.await;
                    }
                };
                // Members taken out of their batches, and those standing for nothing.
                let sweep = async {
                    if let Some(batches) = batches {
                        batches.sweep().await;
                    }
                };
                tokio::join!(rollout, gateways, fleet_view, sweep);
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
        let election_config = config.clone();
        async move {
            tokio::select! {
                first = first_snapshot.wait_for(Option::is_some) => {
                    if first.is_err() {
                        anyhow::bail!("the snapshot builder stopped before the first snapshot");
                    }
                }
                () = before_first => return Ok(()),
            }
            // The election has a connection of its own, driven by its own thread.
            let election_client = move || unlimited_client(election_config);
            run_when_leader(
                election_client,
                lease,
                &leases,
                lease_metrics,
                lead,
                while_leading,
            )
            .await
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

/// An identity no other process has (a process id alone repeats in every container):
/// two processes of one identity would both take the Lease as their own.
fn unique_identity() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    format!("switchyard-{}-{nanos:08x}", std::process::id())
}

/// Completes once `stopping` says so (or its sender is gone).
fn stopped(stopping: &tokio::sync::watch::Sender<bool>) -> impl Future<Output = ()> + use<> {
    let mut receiver = stopping.subscribe();
    async move {
        let _ = receiver.wait_for(|stop| *stop).await;
    }
}

/// A kube client whose requests are held to `rate_limit` when there is one, and that sends
/// each only while `gate` is open when there is one.
fn api_client(
    config: kube::Config,
    rate_limit: Option<ApiRateLimit>,
    gate: Option<WriteGate>,
) -> anyhow::Result<kube::Client> {
    let builder = api_client::builder(config)?.with_layer(&user_agent());
    // The gate outside the rate limit: a request waiting for the gate holds no token.
    Ok(match (rate_limit, gate) {
        (None, None) => builder.build(),
        (Some(limit), None) => builder.with_layer(&limit).build(),
        (None, Some(gate)) => builder.with_layer(&gate).build(),
        (Some(limit), Some(gate)) => builder.with_layer(&limit).with_layer(&gate).build(),
    })
}

/// A kube client of its own connection, with no client-side limit.
fn unlimited_client(config: kube::Config) -> anyhow::Result<kube::Client> {
    api_client(config, None, None)
}

/// Names Switchyard in every API request (`switchyard/<version>`), for the API server's
/// audit log and request logs.
fn user_agent() -> tower_http::set_header::SetRequestHeaderLayer<http::HeaderValue> {
    tower_http::set_header::SetRequestHeaderLayer::if_not_present(
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("switchyard/", env!("CARGO_PKG_VERSION"))),
    )
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
    // Shorter, and an Envoy warming a new cluster would be cut off while it rightly waits.
    anyhow::ensure!(
        args.xds_answer_timeout >= Duration::from_secs(1),
        "--xds-answer-timeout {:?} is too short: at least 1s (30s by default)",
        args.xds_answer_timeout
    );
    let ads = AdsServer::new(desired.clone(), nodes.clone(), metrics, ordering)
        .with_answer_timeout(args.xds_answer_timeout);
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
