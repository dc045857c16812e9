//! The backend of the node tests' images: an HTTP server that answers every request with
//! its Pod's name (body and `x-backend` header), like the rig's in-process backends.
//!
//! - `GET /ready` is the readiness probe: 503 until `READY_AFTER_MS` has passed since
//!   start (a slow start), and 503 again once SIGTERM came.
//! - On SIGTERM it keeps serving for `DRAIN_SECONDS` (default 5; Kubernetes takes a moment
//!   to take a terminating Pod out of every proxy), then stops accepting and lets the
//!   requests in flight finish.
//!
//! Settings from the environment: `PORT` (8080), `POD_NAME` (else the host name),
//! `VERSION` (sent as `x-version`), `READY_AFTER_MS` (0), `DRAIN_SECONDS` (5).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::http::{HeaderValue, StatusCode, header::HeaderMap};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::signal::unix::{SignalKind, signal};

struct Settings {
    port: u16,
    name: String,
    version: String,
    ready_after: Duration,
    drain: Duration,
}

fn env_number(name: &str, default: u64) -> anyhow::Result<u64> {
    match std::env::var(name) {
        Ok(value) => value
            .trim()
            .parse()
            .with_context(|| format!("{name}={value:?} is not a whole number")),
        Err(_) => Ok(default),
    }
}

fn settings() -> anyhow::Result<Settings> {
    let name = match std::env::var("POD_NAME") {
        Ok(name) if !name.is_empty() => name,
        _ => std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "backend".to_string()),
    };
    let port = env_number("PORT", 8080)?;
    Ok(Settings {
        port: u16::try_from(port).with_context(|| format!("PORT={port} is not a port"))?,
        name,
        version: std::env::var("VERSION").unwrap_or_default(),
        ready_after: Duration::from_millis(env_number("READY_AFTER_MS", 0)?),
        drain: Duration::from_secs(env_number("DRAIN_SECONDS", 5)?),
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let settings = settings()?;
    let started = Instant::now();
    let terminating = Arc::new(AtomicBool::new(false));

    let mut headers = HeaderMap::new();
    headers.insert(
        "x-backend",
        HeaderValue::from_str(&settings.name).context("POD_NAME is not a header value")?,
    );
    headers.insert(
        "x-version",
        HeaderValue::from_str(&settings.version).context("VERSION is not a header value")?,
    );
    let body = settings.name.clone();
    let ready_after = settings.ready_after;
    let ready_flag = terminating.clone();
    let app = axum::Router::new()
        .route(
            "/ready",
            get(move || async move {
                if ready_flag.load(Ordering::Relaxed) || started.elapsed() < ready_after {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::OK
                }
            }),
        )
        .fallback(move || async move { (headers, body).into_response() });

    let listener = tokio::net::TcpListener::bind(("0.0.0.0", settings.port))
        .await
        .with_context(|| format!("listen on port {}", settings.port))?;
    eprintln!(
        "{} listening on :{} (ready after {:?}, drain {:?})",
        settings.name, settings.port, settings.ready_after, settings.drain
    );
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let drain = settings.drain;
    let shutdown = async move {
        term.recv().await;
        terminating.store(true, Ordering::Relaxed);
        eprintln!("SIGTERM: serving {drain:?} more, then finishing what is in flight");
        tokio::time::sleep(drain).await;
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .context("serve")?;
    eprintln!("stopped");
    Ok(())
}
