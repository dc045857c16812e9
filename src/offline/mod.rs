//! `switchyard translate`: what Switchyard would serve for some files, with no cluster and
//! no Envoy. The input is a standalone configuration (a directory or one file), or
//! Kubernetes manifests, one file or a directory of them (TrafficRoutes, the Gateway API's
//! GatewayClasses, Gateways, ListenerSets, HTTPRoutes, GRPCRoutes, ReferenceGrants and
//! BackendTLSPolicies, Services, EndpointSlices, Namespaces, TLS Secrets, ConfigMaps; any
//! other kind is ignored). Each goes through the same steps as when it is served:
//! resolution (for Gateway API kinds, translation into units), lowering, translation; the
//! problems are those the status or the log would show.

mod gateway;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use serde::de::DeserializeOwned;

use crate::api::TrafficRoute;
use crate::k8s::tls_secrets::tls_data;
use crate::k8s::to_model::{self, Inputs, TlsData};
use crate::model::{Config, ListenerSettings};
use crate::standalone;
use crate::traffic_route::resolve::{live_proxy_config, resolve_route};
use crate::translate::{Subject, envoy_json, translate};

/// What `translate` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stage {
    /// The Envoy resources (Listeners, RouteConfigurations, Clusters,
    /// ClusterLoadAssignments, Secrets with keys redacted), as Envoy's /config_dump
    /// prints them: see [`envoy_json`].
    Xds,
    /// The routing model the translator gets, as YAML.
    Model,
}

/// How `translate` prints what it shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Yaml,
    Json,
}

/// The rendering, and every problem found on the way (the input's, then the
/// translator's).
pub struct Output {
    pub text: String,
    pub problems: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Standalone(#[from] standalone::LoadError),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Manifest { path: PathBuf, message: String },
    #[error(transparent)]
    Envoy(#[from] envoy_json::Error),
    #[error("cannot print: {0}")]
    Print(String),
}

pub fn run(path: &Path, stage: Stage, format: Format) -> Result<Output, Error> {
    let (config, mut problems) = if is_manifests(path)? {
        from_manifests(path)?
    } else {
        from_standalone(path)?
    };
    let translation = translate(&config);
    problems.extend(translation.problems.iter().map(|p| p.to_string()));
    let text = match stage {
        Stage::Xds => {
            // Every string on its one line, as Envoy and jq print them: a long type URL
            // folded over two lines would not diff or grep.
            let mut one_line = serde_saphyr::SerializerOptions::default();
            one_line.prefer_block_scalars = false;
            let json = envoy_json::snapshot_json(&translation.snapshot)?;
            print(&json, format, one_line)?
        }
        Stage::Model => print(&config, format, serde_saphyr::SerializerOptions::default())?,
    };
    Ok(Output { text, problems })
}

fn print<T: serde::Serialize>(
    value: &T,
    format: Format,
    yaml: serde_saphyr::SerializerOptions,
) -> Result<String, Error> {
    match format {
        Format::Yaml => serde_saphyr::to_string_with_options(value, yaml)
            .map_err(|e| Error::Print(e.to_string())),
        Format::Json => serde_json::to_string_pretty(value)
            .map(|json| json + "\n")
            .map_err(|e| Error::Print(e.to_string())),
    }
}

/// Kubernetes manifests, where a document names its `kind` or `apiVersion`: in the file,
/// or in a file of the directory. A standalone configuration names neither.
fn is_manifests(path: &Path) -> Result<bool, Error> {
    for file in files(path)? {
        let text = read(&file)?;
        if text
            .lines()
            .any(|l| l.starts_with("kind:") || l.starts_with("apiVersion:"))
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The file, or the YAML and JSON files of the directory, by name.
fn files(path: &Path) -> Result<Vec<PathBuf>, Error> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "json")
                )
        })
        .collect();
    files.sort();
    Ok(files)
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn from_standalone(path: &Path) -> Result<(Config, Vec<String>), Error> {
    let loaded = if path.is_dir() {
        standalone::load_dir(path)?
    } else {
        standalone::load_file(path)?
    };
    let built = standalone::build::build(&loaded.file, &loaded.secrets, "translate");
    Ok((built.config, built.problems))
}

/// The live ProxyConfig each TrafficRoute and each unit of a Gateway would get once
/// rolled out, and the model built from them as every replica builds it.
fn from_manifests(path: &Path) -> Result<(Config, Vec<String>), Error> {
    let docs = manifests(path)?;
    let routes: Vec<TrafficRoute> = of_kind(path, &docs, "TrafficRoute")?;
    let services: Vec<Service> = of_kind(path, &docs, "Service")?;
    let slices: Vec<EndpointSlice> = of_kind(path, &docs, "EndpointSlice")?;
    let secrets: Vec<Secret> = of_kind(path, &docs, "Secret")?;
    let gateway_api = gateway::Objects {
        classes: of_kind(path, &docs, "GatewayClass")?,
        gateways: of_kind(path, &docs, "Gateway")?,
        listener_sets: of_kind(path, &docs, "ListenerSet")?,
        routes: of_kind(path, &docs, "HTTPRoute")?,
        grpc_routes: of_kind(path, &docs, "GRPCRoute")?,
        tls_routes: of_kind(path, &docs, "TLSRoute")?,
        tcp_routes: of_kind(path, &docs, "TCPRoute")?,
        udp_routes: of_kind(path, &docs, "UDPRoute")?,
        grants: of_kind(path, &docs, "ReferenceGrant")?,
        services: services.clone(),
        namespaces: of_kind(path, &docs, "Namespace")?,
        secrets: secrets.clone(),
        config_maps: of_kind(path, &docs, "ConfigMap")?,
        backend_tls_policies: of_kind(path, &docs, "BackendTLSPolicy")?,
    };
    let (mut live, mut problems) = gateway::live_proxy_configs(&gateway_api);
    for route in &routes {
        let namespace = route.namespace().unwrap_or_else(|| "default".into());
        let name = route.name_any();
        let in_namespace: Vec<&Service> = services
            .iter()
            .filter(|s| s.namespace().unwrap_or_else(|| "default".into()) == namespace)
            .collect();
        match resolve_route(route, &in_namespace) {
            Ok(resolved) => {
                let mut pc = live_proxy_config(route, &resolved);
                pc.metadata.namespace = Some(namespace);
                live.push(pc);
            }
            Err(e) => problems.push(format!("{namespace}/{name}: {}: {e}", e.reason())),
        }
    }
    let mut served: BTreeMap<(String, String), TlsData> = BTreeMap::new();
    let mut broken = Vec::new();
    for secret in secrets
        .iter()
        .filter(|s| s.type_.as_deref() == Some("kubernetes.io/tls"))
    {
        let key = (
            secret.namespace().unwrap_or_else(|| "default".into()),
            secret.name_any(),
        );
        match tls_data(secret) {
            Ok(data) => {
                served.insert(key, data);
            }
            Err(why) => {
                problems.push(format!("TLS Secret {}/{}: {why}", key.0, key.1));
                broken.push(Subject::Secret(format!("{}/{}", key.0, key.1)));
            }
        }
    }
    let (config, built) = to_model::build(&Inputs {
        listeners: ListenerSettings {
            probe_token: "translate".into(),
            ..ListenerSettings::default()
        },
        proxy_configs: live.iter().collect(),
        endpoint_slices: slices.iter().collect(),
        secrets: &served,
    });
    // A Secret that is there but cannot serve was named above: not "not found" too.
    problems.extend(
        built
            .iter()
            .filter(|p| !broken.contains(p.subject()))
            .map(|p| p.to_string()),
    );
    Ok((config, problems))
}

/// Every document of the file, or of the directory's files in order.
fn manifests(path: &Path) -> Result<Vec<serde_json::Value>, Error> {
    let mut docs = Vec::new();
    for file in files(path)? {
        let text = read(&file)?;
        let in_file: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&text).map_err(|e| Error::Manifest {
                path: file.clone(),
                message: e.to_string(),
            })?;
        docs.extend(in_file.into_iter().filter(|d| !d.is_null()));
    }
    Ok(docs)
}

fn of_kind<T: DeserializeOwned>(
    path: &Path,
    docs: &[serde_json::Value],
    kind: &str,
) -> Result<Vec<T>, Error> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .map(|d| {
            serde_json::from_value(d.clone()).map_err(|e| Error::Manifest {
                path: path.to_path_buf(),
                message: format!("a {kind} named {}: {e}", d["metadata"]["name"]),
            })
        })
        .collect()
}
