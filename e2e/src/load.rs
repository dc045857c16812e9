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
    /// When the answer (or error) came, from the start of the load.
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
        let workers = 8usize;
        let per_worker = Duration::from_secs_f64(workers as f64 / rate.max(1) as f64);
        let started = Instant::now();
        let max_requests = (rate as f64 * duration.as_secs_f64()).ceil() as usize + workers;
        let mut tasks = Vec::new();
        for w in 0..workers {
            let stop = stop.clone();
            let report = report.clone();
            let targets = targets.clone();
            let host = host.to_string();
            tasks.push(traffic_runtime().spawn(async move {
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(2))
                    .build()
                    .expect("http client");
                let mut ticker = tokio::time::interval(per_worker);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut i = w;
                while !stop.load(std::sync::atomic::Ordering::Relaxed)
                    && started.elapsed() < duration
                    && i < max_requests * workers
                {
                    ticker.tick().await;
                    let target = &targets[i % targets.len()];
                    i += workers;
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
                    let mut report = report.lock().unwrap_or_else(|p| p.into_inner());
                    report.sent += 1;
                    let key = status.map_or("error".to_string(), |s| s.to_string());
                    *report.by_status.entry(key).or_default() += 1;
                    *report.by_backend.entry(backend).or_default() += 1;
                    *report.by_target.entry(target.clone()).or_default() += 1;
                    if !status.is_some_and(|s| (200..300).contains(&s)) {
                        report.failures.push(Failure {
                            at,
                            took: sent.elapsed(),
                            target: target.clone(),
                            status,
                            body,
                            headers,
                        });
                    }
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
