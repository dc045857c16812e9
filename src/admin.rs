//! The admin HTTP port: `/healthz`, `/readyz` (the startup gate, I5), `/metrics`, and
//! `/debug/nodes` (what every connected Envoy has ACKed).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::xds::{Desired, NodeReport, Nodes};

#[derive(Clone)]
pub struct Admin {
    pub desired: Arc<Desired>,
    pub nodes: Nodes,
    pub registry: Arc<Registry>,
}

#[derive(Serialize)]
pub struct NodesView {
    /// The snapshot version every node should converge to (None before the gate opens).
    pub desired_version: Option<String>,
    pub nodes: Vec<Arc<NodeReport>>,
}

impl Admin {
    pub fn router(self) -> Router {
        Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .route("/debug/nodes", get(nodes))
            .with_state(self)
    }

    pub async fn serve(self, address: SocketAddr) -> anyhow::Result<()> {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|e| anyhow::anyhow!("cannot bind the admin port {address}: {e}"))?;
        axum::serve(listener, self.router()).await?;
        Ok(())
    }
}

async fn readyz(State(admin): State<Admin>) -> Response {
    if admin.desired.is_open() {
        (StatusCode::OK, "ready: serving xDS\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the first full snapshot is not built yet\n",
        )
            .into_response()
    }
}

async fn metrics(State(admin): State<Admin>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &admin.registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn nodes(State(admin): State<Admin>) -> Json<NodesView> {
    Json(NodesView {
        desired_version: admin.desired.current().map(|s| s.version().to_string()),
        nodes: admin.nodes.list(),
    })
}
