//! UDP for the rig: a backend answering each datagram with its name, and a bounded load of
//! datagrams, each from a socket of its own (a session of its own at the Envoy), each
//! waiting for its answer. What a UDP listener is judged by: a datagram left unanswered,
//! told apart by whether it reached a backend at all (dropped on its way there) or only
//! its answer was lost (dropped on its way back).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::load::{Answer, Turns, WORKERS};
use crate::{LoadReport, traffic_runtime};

/// How long a datagram's answer is waited for: on these machines an answer takes
/// milliseconds, a lost datagram never comes.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

/// Every load datagram carries an id of its own (`ping <id>`), unique in the process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// The ids of the datagrams some [`UdpEcho`] of this process received.
static RECEIVED: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

fn received(id: u64) {
    let mut set = RECEIVED.lock().unwrap_or_else(|p| p.into_inner());
    set.get_or_insert_with(HashSet::new).insert(id);
}

fn was_received(id: u64) -> bool {
    let set = RECEIVED.lock().unwrap_or_else(|p| p.into_inner());
    set.as_ref().is_some_and(|s| s.contains(&id))
}

/// The id a datagram's text (`ping <id>`) carries.
fn id_of(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text)
        .ok()?
        .strip_prefix("ping ")?
        .parse()
        .ok()
}

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
            while let Ok((n, from)) = socket.recv_from(&mut buffer).await {
                if let Some(id) = id_of(&buffer[..n]) {
                    received(id);
                }
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

/// A datagram that got no answer.
#[derive(Clone, Debug)]
pub struct Unanswered {
    /// When it was sent, from the start of the load.
    pub at: Duration,
    pub target: String,
    /// A backend received it: its answer was lost on the way back.
    pub reached_a_backend: bool,
}

/// What a [`DatagramLoad`] saw: every datagram in `report` (a failure for each one left
/// unanswered), and those in detail.
pub struct DatagramReport {
    pub report: LoadReport,
    pub unanswered: Vec<Unanswered>,
}

/// Bounded load of datagrams: `rate` per second in total, spread over `targets`, for at
/// most `duration`, each sent on its turn whether or not those before it were answered
/// (at most `rate` × [`ANSWER_TIMEOUT`] waiting at once). Each one is recorded with `at`
/// the time it was sent (from the start of the load), its backend the answer's text, or as
/// a failure when no answer came within [`ANSWER_TIMEOUT`].
pub struct DatagramLoad {
    started: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
    report: Arc<Mutex<LoadReport>>,
    unanswered: Arc<Mutex<Vec<(u64, Duration, String)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl DatagramLoad {
    pub fn start(targets: Vec<SocketAddr>, rate: u32, duration: Duration) -> DatagramLoad {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let report = Arc::new(Mutex::new(LoadReport::default()));
        let unanswered = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..WORKERS {
            let mut turns = Turns::new(w, rate, started, duration, stop.clone());
            let report = report.clone();
            let unanswered = unanswered.clone();
            let targets = targets.clone();
            tasks.push(traffic_runtime().spawn(async move {
                let mut asking = tokio::task::JoinSet::new();
                while let Some(i) = turns.next().await {
                    let target = targets[i % targets.len()];
                    let report = report.clone();
                    let unanswered = unanswered.clone();
                    asking.spawn(async move {
                        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                        let sent = Instant::now();
                        let at = sent.duration_since(started);
                        let (status, backend, body) = match ask(target, id).await {
                            Ok(backend) => (Some(200), backend, String::new()),
                            Err(e) => {
                                (unanswered.lock().unwrap_or_else(|p| p.into_inner())).push((
                                    id,
                                    at,
                                    target.to_string(),
                                ));
                                (None, "-".to_owned(), format!("datagram {id}: {e}"))
                            }
                        };
                        let answer = Answer {
                            at,
                            took: sent.elapsed(),
                            target: target.to_string(),
                            status,
                            backend,
                            headers: Vec::new(),
                            body,
                        };
                        (report.lock().unwrap_or_else(|p| p.into_inner())).record(answer);
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
            unanswered,
            tasks,
        }
    }

    /// When the load started: [`Unanswered::at`] counts from here.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Stops sending and waits for the answers still due.
    pub async fn finish(self) -> DatagramReport {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
        let mut report = (self.report.lock().unwrap_or_else(|p| p.into_inner())).clone();
        report.elapsed = self.started.elapsed();
        let unanswered = (self.unanswered.lock().unwrap_or_else(|p| p.into_inner()))
            .iter()
            .map(|(id, at, target)| Unanswered {
                at: *at,
                target: target.clone(),
                reached_a_backend: was_received(*id),
            })
            .collect();
        DatagramReport { report, unanswered }
    }
}

/// Datagram `id` from a new socket to `target`: the answer's text.
async fn ask(target: SocketAddr, id: u64) -> Result<String, String> {
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
        .send(format!("ping {id}").as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut buffer = [0u8; 1500];
    match tokio::time::timeout(ANSWER_TIMEOUT, socket.recv(&mut buffer)).await {
        Ok(Ok(n)) => Ok(String::from_utf8_lossy(&buffer[..n]).into_owned()),
        Ok(Err(e)) => Err(format!("receive: {e}")),
        Err(_) => Err(format!("no answer within {ANSWER_TIMEOUT:?}")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_datagrams_id_is_read_from_its_text() {
        assert_eq!(super::id_of(b"ping 42"), Some(42));
        assert_eq!(super::id_of(b"ping"), None);
        assert_eq!(super::id_of(b"pong 42"), None);
    }
}
