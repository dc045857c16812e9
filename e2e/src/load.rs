//! Bounded HTTP load and what it saw, on a runtime of its own.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The runtime that backends and load run on, apart from each test's own (single-threaded)
/// runtime: a test busy polling the apiserver or starting processes must not delay the
/// traffic it measures, nor time out its requests.
///
/// One per network namespace: its threads are born in the namespace of the thread that
/// asks first, so a node test (e2e/src/node), whose thread entered the node's namespace,
/// gets one whose connections start there.
pub fn traffic_runtime() -> tokio::runtime::Handle {
    static RUNTIMES: Mutex<BTreeMap<String, tokio::runtime::Runtime>> = Mutex::new(BTreeMap::new());
    let namespace = std::fs::read_link("/proc/thread-self/ns/net")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut runtimes = RUNTIMES.lock().unwrap_or_else(|p| p.into_inner());
    runtimes
        .entry(namespace)
        .or_insert_with(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("traffic")
                .enable_all()
                .build()
                .expect("traffic runtime")
        })
        .handle()
        .clone()
}

/// One non-2xx answer, with what is needed to tell why.
#[derive(Clone, Debug)]
pub struct Failure {
    /// From the start of the load: when the answer (or error) came; for a datagram
    /// ([`crate::datagrams::DatagramLoad`]), when it was sent.
    pub at: Duration,
    /// How long the request took.
    pub took: Duration,
    pub target: String,
    pub status: Option<u16>,
    pub body: String,
    /// Response headers (empty when there was no response).
    pub headers: Vec<(String, String)>,
}

#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    pub sent: usize,
    pub elapsed: Duration,
    pub by_status: BTreeMap<String, usize>,
    pub by_backend: BTreeMap<String, usize>,
    /// Requests sent through each target.
    pub by_target: BTreeMap<String, usize>,
    pub failures: Vec<Failure>,
}

/// An error with its sources ("error sending request: connection closed before message
/// completed"), so a transport failure in a report says what happened.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

impl LoadReport {
    pub fn non_2xx(&self) -> usize {
        self.failures.len()
    }

    /// Counts one answer (`status` None: no answer, `body` says why); a non-2xx one is a
    /// failure. True when it was 2xx.
    pub(crate) fn record(&mut self, answer: Answer) -> bool {
        self.sent += 1;
        *self.by_target.entry(answer.target.clone()).or_default() += 1;
        let key = answer.status.map_or("error".to_string(), |s| s.to_string());
        *self.by_status.entry(key).or_default() += 1;
        *self.by_backend.entry(answer.backend).or_default() += 1;
        let ok = answer.status.is_some_and(|s| (200..300).contains(&s));
        if !ok {
            self.failures.push(Failure {
                at: answer.at,
                took: answer.took,
                target: answer.target,
                status: answer.status,
                body: answer.body,
                headers: answer.headers,
            });
        }
        ok
    }
}

/// What one request of a load got.
pub(crate) struct Answer {
    pub at: Duration,
    pub took: Duration,
    pub target: String,
    pub status: Option<u16>,
    /// The `x-backend` header, or "-".
    pub backend: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// How many workers a bounded load spreads its requests over.
pub(crate) const WORKERS: usize = 8;

/// One worker's turns in a bounded load: `rate` requests per second in total over
/// [`WORKERS`] workers, for at most `duration` and at most the requests that fit in it,
/// until `stop`. Worker `w` takes requests w, w + WORKERS, ...
pub(crate) struct Turns {
    ticker: tokio::time::Interval,
    next: usize,
    limit: usize,
    started: Instant,
    duration: Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Turns {
    pub(crate) fn new(
        worker: usize,
        rate: u32,
        started: Instant,
        duration: Duration,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        let per_worker = Duration::from_secs_f64(WORKERS as f64 / rate.max(1) as f64);
        let mut ticker = tokio::time::interval(per_worker);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let max_requests = (rate as f64 * duration.as_secs_f64()).ceil() as usize + WORKERS;
        Self {
            ticker,
            next: worker,
            limit: max_requests * WORKERS,
            started,
            duration,
            stop,
        }
    }

    /// [`Turns::new`], the first turn a share of the period after the worker before's, so
    /// that the workers' requests come one every `1 / rate` seconds rather than all
    /// together once a period. Made on the runtime that polls it (its timer is that one's).
    pub(crate) fn staggered(
        worker: usize,
        rate: u32,
        started: Instant,
        duration: Duration,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        let mut turns = Self::new(worker, rate, started, duration, stop);
        let period = turns.ticker.period();
        let offset = period.mul_f64(worker as f64 / WORKERS as f64);
        let first = tokio::time::Instant::from_std(started) + offset;
        turns.ticker = tokio::time::interval_at(first, period);
        turns
            .ticker
            .set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        turns
    }

    /// Waits for this worker's next turn: the request's number, or None when the load is
    /// over.
    pub(crate) async fn next(&mut self) -> Option<usize> {
        if self.stop.load(std::sync::atomic::Ordering::Relaxed)
            || self.started.elapsed() >= self.duration
            || self.next >= self.limit
        {
            return None;
        }
        self.ticker.tick().await;
        let i = self.next;
        self.next += WORKERS;
        Some(i)
    }
}

/// Bounded load: `rate` requests per second in total, spread over `targets`
/// (base URLs like http://127.0.0.11:8080), for at most `duration`.
pub struct Load {
    started: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
    report: Arc<Mutex<LoadReport>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub fn start(targets: Vec<String>, host: &str, rate: u32, duration: Duration) -> Load {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let report = Arc::new(Mutex::new(LoadReport::default()));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..WORKERS {
            let mut turns = Turns::new(w, rate, started, duration, stop.clone());
            let report = report.clone();
            let targets = targets.clone();
            let host = host.to_string();
            tasks.push(traffic_runtime().spawn(async move {
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(2))
                    .build()
                    .expect("http client");
                while let Some(i) = turns.next().await {
                    let target = &targets[i % targets.len()];
                    let sent = Instant::now();
                    let result = client
                        .get(format!("{target}/"))
                        .header("host", &host)
                        .send()
                        .await;
                    let at = started.elapsed();
                    let (status, backend, headers, body) = match result {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let backend = r
                                .headers()
                                .get("x-backend")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("-")
                                .to_string();
                            let headers = r
                                .headers()
                                .iter()
                                .map(|(k, v)| {
                                    (k.to_string(), v.to_str().unwrap_or("?").to_string())
                                })
                                .collect();
                            (
                                Some(status),
                                backend,
                                headers,
                                r.text().await.unwrap_or_default(),
                            )
                        }
                        Err(e) => (None, "-".to_string(), Vec::new(), error_chain(&e)),
                    };
                    let answer = Answer {
                        at,
                        took: sent.elapsed(),
                        target: target.clone(),
                        status,
                        backend,
                        headers,
                        body,
                    };
                    report
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .record(answer);
                }
            }));
        }
        Load {
            started,
            stop,
            report,
            tasks,
        }
    }

    /// When the load started: [`Failure::at`] counts from here.
    pub fn started(&self) -> Instant {
        self.started
    }

    pub fn snapshot(&self) -> LoadReport {
        self.report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Lets the load run for `duration`, then finishes it.
    pub async fn finish_after(self, duration: Duration) -> LoadReport {
        tokio::time::sleep(duration.saturating_sub(self.started.elapsed())).await;
        self.finish().await
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

/// One plain HTTP/1.1 connection, kept alive until dropped: what a test looks at to tell
/// that a change left the connections open on a port untouched.
pub struct HttpConnection {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Empty<hyper::body::Bytes>>,
}

impl HttpConnection {
    /// Connects to `address` (at most 2 s).
    pub async fn connect(address: std::net::SocketAddr) -> Result<HttpConnection, String> {
        let connecting = async {
            let tcp = tokio::net::TcpStream::connect(address)
                .await
                .map_err(|e| format!("connect {address}: {e}"))?;
            let _ = tcp.set_nodelay(true);
            let (sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                    .await
                    .map_err(|e| format!("HTTP/1.1 with {address}: {}", error_chain(&e)))?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok(HttpConnection { sender })
        };
        tokio::time::timeout(Duration::from_secs(2), connecting)
            .await
            .unwrap_or_else(|_| Err(format!("connect {address}: timed out")))
    }

    /// Whether the server closed the connection (or said it would).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// GET `path` for `host` on this connection (at most 2 s): the status.
    pub async fn get(&mut self, host: &str, path: &str) -> Result<u16, String> {
        self.answer(host, path).await.map(|(status, _)| status)
    }

    /// GET `path` for `host` on this connection (at most 2 s): the status, and the backend
    /// that answered (`x-backend`, or "-").
    pub async fn answer(&mut self, host: &str, path: &str) -> Result<(u16, String), String> {
        let exchange = async {
            self.sender.ready().await.map_err(|e| error_chain(&e))?;
            let request = http::Request::get(path)
                .header(http::header::HOST, host)
                .body(http_body_util::Empty::new())
                .map_err(|e| e.to_string())?;
            let response =
                (self.sender.send_request(request).await).map_err(|e| error_chain(&e))?;
            let status = response.status().as_u16();
            let backend = (response.headers().get("x-backend"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned();
            http_body_util::BodyExt::collect(response.into_body())
                .await
                .map_err(|e| error_chain(&e))?;
            Ok((status, backend))
        };
        tokio::time::timeout(Duration::from_secs(2), exchange)
            .await
            .unwrap_or_else(|_| Err("timed out".to_string()))
    }
}
