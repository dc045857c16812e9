//! `switchyard translate`: what Switchyard would serve for some files, with no cluster and
//! no Envoy. The input is a standalone configuration (a directory or one file), or
//! Kubernetes manifests (TrafficRoutes, Services, EndpointSlices, TLS Secrets; any other
//! kind is ignored). Each goes through the same steps as when it is served: resolution,
//! lowering, translation; the problems are those the routes' status or the log would show.

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
use crate::translate::{Subject, render, translate};

/// What `translate` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stage {
    /// The Envoy resources (Listeners, RouteConfigurations, Clusters,
    /// ClusterLoadAssignments, Secrets with keys redacted).
    Xds,
    /// The routing model the translator gets, as YAML.
    Model,
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
}

pub fn run(path: &Path, stage: Stage) -> Result<Output, Error> {
    let (config, mut problems) = if is_manifests(path)? {
        from_manifests(path)?
    } else {
        from_standalone(path)?
    };
    let translation = translate(&config);
    problems.extend(translation.problems.iter().map(|p| p.to_string()));
    let text = match stage {
        Stage::Xds => render::render_snapshot(&translation.snapshot),
        Stage::Model => serde_saphyr::to_string(&config).unwrap_or_else(|e| format!("# {e}\n")),
    };
    Ok(Output { text, problems })
}

/// A standalone directory is a directory; a single file is Kubernetes manifests when a
/// document names its `kind`.
fn is_manifests(path: &Path) -> Result<bool, Error> {
    if path.is_dir() {
        return Ok(false);
    }
    let text = read(path)?;
    Ok(text
        .lines()
        .any(|l| l.starts_with("kind:") || l.starts_with("apiVersion:")))
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

/// The live ProxyConfig each TrafficRoute would get once rolled out, and the model built
/// from them as every replica builds it.
fn from_manifests(path: &Path) -> Result<(Config, Vec<String>), Error> {
    let docs = manifests(path)?;
    let routes: Vec<TrafficRoute> = of_kind(path, &docs, "TrafficRoute")?;
    let services: Vec<Service> = of_kind(path, &docs, "Service")?;
    let slices: Vec<EndpointSlice> = of_kind(path, &docs, "EndpointSlice")?;
    let secrets: Vec<Secret> = of_kind(path, &docs, "Secret")?;
    let mut problems = Vec::new();
    let mut live = Vec::new();
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

fn manifests(path: &Path) -> Result<Vec<serde_json::Value>, Error> {
    let text = read(path)?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| Error::Manifest {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
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
