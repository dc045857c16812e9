//! What the session's tests share: resources, snapshots, and a look at responses.

use std::sync::Arc;

use envoy_types::pb::google::protobuf::Any;

use super::Response;
use crate::xds::snapshot::{
    self, CLUSTER, ENDPOINT, LISTENER, ROUTE, Resource, SECRET, Snapshot, short_type,
};

pub(super) fn res(type_url: &str, name: &str, content: &str) -> Resource {
    Resource::new(
        name,
        Any {
            type_url: type_url.to_string(),
            value: format!("{name}:{content}").into_bytes(),
        },
    )
}

/// A route to `cluster`, with the cluster and its endpoints.
pub(super) fn switch_to(cluster: &str) -> Arc<Snapshot> {
    Arc::new(Snapshot::new([
        res(CLUSTER, cluster, "c"),
        res(ENDPOINT, cluster, "e"),
        res(LISTENER, "http", "l"),
        res(ROUTE, "switchyard", &format!("to {cluster}")),
    ]))
}

pub(super) fn names(response: &Response) -> (String, Vec<String>, Vec<String>) {
    match response {
        Response::Sotw(r) => (
            short_type(&r.type_url).to_string(),
            r.resources
                .iter()
                .map(|a| String::from_utf8_lossy(&a.body.value).to_string())
                .collect(),
            vec![],
        ),
        Response::Delta(r) => (
            short_type(&r.type_url).to_string(),
            r.resources.iter().map(|a| a.name.clone()).collect(),
            r.removed_resources.clone(),
        ),
    }
}

pub(super) fn nonce(response: &Response) -> String {
    response.nonce().to_string()
}

pub(super) fn type_of(response: &Response) -> String {
    response.type_url().to_string()
}

/// What a server instance serves: http, https and probe listeners with their route
/// configurations, a cluster with endpoints for each of `clusters`, a secret.
pub(super) fn full_config(clusters: &[&str]) -> Arc<Snapshot> {
    let mut resources = vec![res(SECRET, "cert", "s")];
    for c in clusters {
        resources.push(res(CLUSTER, c, "c"));
        resources.push(res(ENDPOINT, c, "e"));
    }
    for l in ["http", "https", "probe"] {
        resources.push(res(LISTENER, l, "l"));
        resources.push(res(ROUTE, l, &format!("to {}", clusters.join(","))));
    }
    Arc::new(Snapshot::new(resources))
}

/// The names Envoy asks for by type when it holds `snapshot` (none: wildcard).
pub(super) fn subscription(snapshot: &Snapshot, type_url: &str) -> Vec<String> {
    if snapshot::is_wildcard_type(type_url) {
        return Vec::new();
    }
    snapshot
        .resources(type_url)
        .map(|rs| rs.keys().cloned().collect())
        .unwrap_or_default()
}
