//! Load of new connections: each request on a connection of its own, opened for it and
//! closed after it, plain or TLS (with a server name, accepting any certificate: a TLS
//! connection passed through is the backend's). What a TCP or TLS listener is judged by:
//! a connection refused, reset or left unanswered across a route's move is a failure.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::load::{Answer, Turns, WORKERS};
use crate::{HttpsConnection, LoadReport, error_chain, traffic_runtime};

/// How each connection is opened.
#[derive(Clone, Debug)]
pub enum Opening {
    /// Plain TCP; the request's Host is this name.
    Plain(String),
    /// TLS with this server name (and Host).
    Tls(String),
}

/// Bounded load of new connections: `rate` per second in total, spread over `targets`,
/// for at most `duration`; on each one GET / and its answer (the backend in `x-backend`).
pub struct ConnectionLoad {
    started: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
    report: Arc<Mutex<LoadReport>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ConnectionLoad {
    pub fn start(
        targets: Vec<SocketAddr>,
        opening: Opening,
        rate: u32,
        duration: Duration,
    ) -> ConnectionLoad {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let report = Arc::new(Mutex::new(LoadReport::default()));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..WORKERS {
            let mut turns = Turns::new(w, rate, started, duration, stop.clone());
            let report = report.clone();
            let targets = targets.clone();
            let opening = opening.clone();
            tasks.push(traffic_runtime().spawn(async move {
                // No connection is kept: every request opens its own.
                let plain = reqwest::Client::builder()
                    .timeout(Duration::from_secs(2))
                    .pool_max_idle_per_host(0)
                    .build()
                    .expect("http client");
                while let Some(i) = turns.next().await {
                    let address = targets[i % targets.len()];
                    let sent = Instant::now();
                    let result = match &opening {
                        Opening::Plain(host) => plain_get(&plain, address, host).await,
                        Opening::Tls(name) => tls_get(address, name).await,
                    };
                    let (status, backend, body) = match result {
                        Ok((status, backend)) => (Some(status), backend, String::new()),
                        Err(e) => (None, "-".to_owned(), e),
                    };
                    let answer = Answer {
                        at: started.elapsed(),
                        took: sent.elapsed(),
                        target: address.to_string(),
                        status,
                        backend,
                        headers: Vec::new(),
                        body,
                    };
                    report
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .record(answer);
                }
            }));
        }
        ConnectionLoad {
            started,
            stop,
            report,
            tasks,
        }
    }

    /// When the load started: [`crate::Failure::at`] counts from here.
    pub fn started(&self) -> Instant {
        self.started
    }

    pub async fn finish(self) -> LoadReport {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
        let mut report = self
            .report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        report.elapsed = self.started.elapsed();
        report
    }
}

/// GET / over a new plain connection: the status and the backend that answered.
async fn plain_get(
    client: &reqwest::Client,
    address: SocketAddr,
    host: &str,
) -> Result<(u16, String), String> {
    let answer = client
        .get(format!("http://{address}/"))
        .header("host", host)
        .header("connection", "close")
        .send()
        .await
        .map_err(|e| error_chain(&e))?;
    let status = answer.status().as_u16();
    let backend = (answer.headers().get("x-backend"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    answer.bytes().await.map_err(|e| error_chain(&e))?;
    Ok((status, backend))
}

/// GET / over a new TLS connection with server name `name`.
async fn tls_get(address: SocketAddr, name: &str) -> Result<(u16, String), String> {
    let mut connection = HttpsConnection::connect(address, name).await?;
    let answer = connection.get(name, "/").await.map_err(|(_, e)| e)?;
    let backend = answer.header("x-backend").unwrap_or("-").to_owned();
    Ok((answer.status, backend))
}
