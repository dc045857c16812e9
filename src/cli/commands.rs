//! The one-shot commands: they print or write something and end, with no server.

use std::time::Duration;

use anyhow::Context;

use super::{BootstrapArgs, CertgenArgs};
use switchyard::xds::Protocol;

pub(crate) async fn proxy_status(admins: &[String]) -> anyhow::Result<()> {
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
pub(crate) async fn proxy_status_through_api(
    namespace: &str,
    selector: &str,
) -> anyhow::Result<()> {
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

pub(crate) fn crdgen(out: &std::path::Path) -> anyhow::Result<()> {
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

pub(crate) fn certgen(args: CertgenArgs) -> anyhow::Result<()> {
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
pub(crate) fn translate_offline(
    path: &std::path::Path,
    stage: switchyard::offline::Stage,
    format: switchyard::offline::Format,
) -> anyhow::Result<()> {
    let output = switchyard::offline::run(path, stage, format)?;
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

pub(crate) fn bootstrap(args: &BootstrapArgs) -> anyhow::Result<String> {
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
