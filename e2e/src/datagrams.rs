//! UDP for the rig: a backend answering each datagram with its name, and a bounded load of
//! datagrams, each from a socket of its own (a session of its own at the Envoy), each
//! waiting for its answer. What a UDP listener is judged by: a datagram left unanswered.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::load::{Answer, Turns, WORKERS};
use crate::{LoadReport, traffic_runtime};

/// How long a datagram's answer is waited for: on these machines an answer takes
/// milliseconds, a lost datagram never comes.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

/// A UDP backend on `address`, answering every datagram with its name, until dropped.
pub struct UdpEcho {
    pub name: String,
    pub address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl UdpEcho {
    /// Listens on a free port of `ip`.
    pub async fn start(name: &str, ip: &str) -> UdpEcho {
        let socket = traffic_runtime()
            .spawn({
                let ip = ip.to_owned();
                async move { tokio::net::UdpSocket::bind((ip.as_str(), 0)).await }
            })
            .await
            .expect("the bind task")
            .unwrap_or_else(|e| panic!("a UDP socket on {ip}: {e}"));
        let address = socket.local_addr().expect("a local address");
        let answer = name.as_bytes().to_vec();
        let task = traffic_runtime().spawn(async move {
            let mut buffer = [0u8; 1500];
            while let Ok((_, from)) = socket.recv_from(&mut buffer).await {
                let _ = socket.send_to(&answer, from).await;
            }
        });
        UdpEcho {
            name: name.to_owned(),
            address,
            task,
        }
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Bounded load of datagrams: `rate` per second in total, spread over `targets`, for at
/// most `duration`, each sent on its turn (at most `rate` × [`ANSWER_TIMEOUT`] waiting for
/// their answers at once). Each one is recorded with `at` the time it was sent (from the start of
/// the load), its backend the answer's text, or as a failure when no answer came within
/// [`ANSWER_TIMEOUT`].
pub struct DatagramLoad {
    started: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
    report: Arc<Mutex<LoadReport>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl DatagramLoad {
    pub fn start(targets: Vec<SocketAddr>, rate: u32, duration: Duration) -> DatagramLoad {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let report = Arc::new(Mutex::new(LoadReport::default()));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..WORKERS {
            let mut turns = Turns::new(w, rate, started, duration, stop.clone());
            let report = report.clone();
            let targets = targets.clone();
            tasks.push(traffic_runtime().spawn(async move {
                // Open loop: each datagram is sent on its turn, whether or not those before
                // it were answered yet, so a loss does not slow the load down.
                let mut asking = tokio::task::JoinSet::new();
                while let Some(i) = turns.next().await {
                    let target = targets[i % targets.len()];
                    let report = report.clone();
                    asking.spawn(async move {
                        let sent = Instant::now();
                        let (status, backend, body) = match ask(target).await {
                            Ok(backend) => (Some(200), backend, String::new()),
                            Err(e) => (None, "-".to_owned(), e),
                        };
                        let answer = Answer {
                            at: sent.duration_since(started),
                            took: sent.elapsed(),
                            target: target.to_string(),
                            status,
                            backend,
                            headers: Vec::new(),
                            body,
                        };
                        report
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .record(answer);
                    });
                    while asking.try_join_next().is_some() {}
                }
                while asking.join_next().await.is_some() {}
            }));
        }
        DatagramLoad {
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

/// One datagram from a new socket to `target`: the answer's text.
async fn ask(target: SocketAddr) -> Result<String, String> {
    let local: SocketAddr = match target {
        SocketAddr::V4(_) => ([0, 0, 0, 0], 0).into(),
        SocketAddr::V6(_) => ([0u16; 8], 0).into(),
    };
    let socket = tokio::net::UdpSocket::bind(local)
        .await
        .map_err(|e| format!("bind: {e}"))?;
    socket
        .connect(target)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    socket
        .send(b"ping")
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut buffer = [0u8; 1500];
    match tokio::time::timeout(ANSWER_TIMEOUT, socket.recv(&mut buffer)).await {
        Ok(Ok(n)) => Ok(String::from_utf8_lossy(&buffer[..n]).into_owned()),
        Ok(Err(e)) => Err(format!("receive: {e}")),
        Err(_) => Err(format!("no answer within {ANSWER_TIMEOUT:?}")),
    }
}
