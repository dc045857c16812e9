//! `switchyard status`: every Envoy connected to the given replicas, what it has ACKed
//! against what it should have, and any NACK — read from each replica's `/debug/nodes`,
//! by address or through the API server's Pod proxy.

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;

/// The admin port of the chart's operator container, when its Pod names none.
const DEFAULT_ADMIN_PORT: i32 = 9000;

/// Each running Pod of `selector` in `namespace`, by name, with its view, asked through
/// the API server's Pod proxy on the container port named `admin`.
pub async fn from_kubernetes(
    client: &Client,
    namespace: &str,
    selector: &str,
) -> anyhow::Result<Vec<(String, NodesView)>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .with_context(|| format!("listing Pods {selector} in {namespace}"))?;
    let mut views = Vec::new();
    for pod in list.items {
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if !running || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.name_any();
        let path = format!(
            "/api/v1/namespaces/{namespace}/pods/{name}:{}/proxy/debug/nodes",
            admin_port(&pod)
        );
        let request = http::Request::get(&path)
            .body(Vec::new())
            .context("building the proxy request")?;
        let text = client
            .request_text(request)
            .await
            .with_context(|| format!("asking Pod {name} through the API server"))?;
        let view: NodesView =
            serde_json::from_str(&text).with_context(|| format!("reading Pod {name}'s answer"))?;
        views.push((name, view));
    }
    Ok(views)
}

fn admin_port(pod: &Pod) -> i32 {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("admin"))
        .map_or(DEFAULT_ADMIN_PORT, |p| p.container_port)
}

#[derive(Debug, Deserialize)]
pub struct NodesView {
    pub desired_version: Option<String>,
    pub nodes: Vec<Node>,
}

#[derive(Debug, Deserialize)]
pub struct Node {
    pub node_id: String,
    pub peer: String,
    pub status: NodeStatus,
}

#[derive(Debug, Deserialize)]
pub struct NodeStatus {
    pub protocol: String,
    pub desired_version: Option<String>,
    pub synced: bool,
    pub blocked_by_nack: bool,
    pub types: std::collections::BTreeMap<String, TypeStatus>,
}

#[derive(Debug, Deserialize)]
pub struct TypeStatus {
    pub acked_version: Option<String>,
    pub acked_resources: usize,
    pub pending_nonce: Option<String>,
    pub last_nack: Option<Nack>,
}

#[derive(Debug, Deserialize)]
pub struct Nack {
    pub error: String,
}

const TYPES: [(&str, &str); 5] = [
    ("Cluster", "CDS"),
    ("ClusterLoadAssignment", "EDS"),
    ("Secret", "SDS"),
    ("Listener", "LDS"),
    ("RouteConfiguration", "RDS"),
];

/// One table for all replicas: (replica address, its view).
pub fn render(replicas: &[(String, NodesView)]) -> String {
    let mut rows = vec![vec![
        "ENVOY".to_string(),
        "REPLICA".into(),
        "XDS".into(),
        "STATE".into(),
        "CDS".into(),
        "EDS".into(),
        "SDS".into(),
        "LDS".into(),
        "RDS".into(),
    ]];
    let mut nacks = Vec::new();
    for (replica, view) in replicas {
        for node in &view.nodes {
            let s = &node.status;
            let state = if s.blocked_by_nack {
                "NACKED"
            } else if s.synced && s.desired_version == view.desired_version {
                "SYNCED"
            } else if s.desired_version.is_none() {
                "WAITING (gate closed)"
            } else {
                "SYNCING"
            };
            let mut row = vec![
                if node.node_id.is_empty() {
                    node.peer.clone()
                } else {
                    node.node_id.clone()
                },
                replica.clone(),
                s.protocol.to_uppercase(),
                state.to_string(),
            ];
            for (kind, short) in TYPES {
                row.push(match s.types.get(kind) {
                    None => "-".into(),
                    Some(t) => {
                        if let Some(nack) = &t.last_nack {
                            nacks.push(format!("{} {short}: {}", node.node_id, nack.error));
                        }
                        let version = t
                            .acked_version
                            .as_deref()
                            .map_or("none", |v| &v[..v.len().min(8)]);
                        let pending = if t.pending_nonce.is_some() { "*" } else { "" };
                        format!("{version}{pending} ({})", t.acked_resources)
                    }
                });
            }
            rows.push(row);
        }
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    for (replica, view) in replicas {
        out.push_str(&format!(
            "replica {replica}: desired snapshot {}\n",
            view.desired_version
                .as_deref()
                .unwrap_or("none (not ready)")
        ));
    }
    out.push_str("versions: first 8 characters of the ACKed version, * = a push awaits its ACK, (n) = resources\n");
    for nack in nacks {
        out.push_str(&format!("NACK {nack}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_synced_and_nacked_envoys() {
        let view: NodesView = serde_json::from_value(serde_json::json!({
            "desired_version": "abcdef0123456789",
            "nodes": [
                { "node_id": "envoy-a", "peer": "10.0.0.1:5000", "status": {
                    "protocol": "Delta", "desired_version": "abcdef0123456789", "synced": true, "blocked_by_nack": false,
                    "types": { "Cluster": { "acked_version": "1111111122", "acked_resources": 3, "pending_nonce": null, "last_nack": null } } } },
                { "node_id": "envoy-b", "peer": "10.0.0.2:5000", "status": {
                    "protocol": "Sotw", "desired_version": "abcdef0123456789", "synced": false, "blocked_by_nack": true,
                    "types": { "Cluster": { "acked_version": "1111111122", "acked_resources": 3, "pending_nonce": null, "last_nack": { "error": "bad cluster" } } } } }
            ]
        }))
        .expect("view");
        let text = render(&[("10.0.9.9:9000".into(), view)]);
        assert!(
            text.contains("envoy-a  10.0.9.9:9000  DELTA  SYNCED"),
            "{text}"
        );
        assert!(
            text.contains("envoy-b  10.0.9.9:9000  SOTW   NACKED"),
            "{text}"
        );
        assert!(text.contains("11111111 (3)"), "{text}");
        assert!(text.contains("NACK envoy-b CDS: bad cluster"), "{text}");
    }
}
