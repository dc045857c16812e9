//! The load of a comparison: bounded requests at a steady rate to one address, every
//! answer kept with when it came, so that each change's moments can be read off it
//! afterwards: its first new answer, the first after which every answer is new.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::load::{Turns, WORKERS, traffic_runtime};

/// One answer (or its absence).
#[derive(Clone, Debug)]
pub struct Seen {
    /// When it was sent, from the start of the load.
    pub sent: Duration,
    /// When it came, from the start of the load.
    pub at: Duration,
    /// The HTTP status, or None when no answer came (connection refused, timeout).
    pub status: Option<u16>,
    /// The backend Pod that answered (`x-backend`), or "-".
    pub backend: String,
    /// The route's response header `x-sentinel`, or "-".
    pub sentinel: String,
    /// What kind of failure, for a non-2xx: see [`failure_kind`].
    pub failure: Option<String>,
}

impl Seen {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// A load running until finished (or its bound).
pub struct Observer {
    started: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Observer {
    /// `rate` requests per second to `url` with Host `host`, for at most `bound`.
    pub fn start(url: &str, host: &str, rate: u32, bound: Duration) -> Observer {
        let started = Instant::now();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..WORKERS)
            .map(|worker| {
                let stop = stop.clone();
                let (url, host, seen) = (format!("{url}/"), host.to_owned(), seen.clone());
                traffic_runtime().spawn(async move {
                    let mut turns = Turns::staggered(worker, rate, started, bound, stop);
                    let Ok(client) = reqwest::Client::builder()
                        .timeout(Duration::from_secs(2))
                        .build()
                    else {
                        return;
                    };
                    while turns.next().await.is_some() {
                        let sent = started.elapsed();
                        let answer = client.get(&url).header("host", &host).send().await;
                        let one = match answer {
                            Ok(response) => {
                                let status = response.status().as_u16();
                                let header = |name: &str| {
                                    (response.headers().get(name))
                                        .and_then(|v| v.to_str().ok())
                                        .unwrap_or("-")
                                        .to_owned()
                                };
                                let (backend, sentinel) =
                                    (header("x-backend"), header("x-sentinel"));
                                let body = response.text().await.unwrap_or_default();
                                let failure = (!(200..300).contains(&status))
                                    .then(|| failure_kind(status, &body));
                                (Some(status), backend, sentinel, failure)
                            }
                            Err(e) => {
                                let kind = if e.is_timeout() {
                                    "timeout"
                                } else {
                                    "no answer"
                                };
                                (None, "-".into(), "-".into(), Some(kind.to_owned()))
                            }
                        };
                        let (status, backend, sentinel, failure) = one;
                        let at = started.elapsed();
                        let seen_one = Seen {
                            sent,
                            at,
                            status,
                            backend,
                            sentinel,
                            failure,
                        };
                        seen.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(seen_one);
                    }
                })
            })
            .collect();
        Observer {
            started,
            stop,
            seen,
            tasks,
        }
    }

    /// When the load started: [`Seen::at`] counts from here.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Every answer so far, in the order they came.
    pub fn seen(&self) -> Vec<Seen> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        seen.sort_by_key(|s| s.at);
        seen
    }

    /// Stops the load; every answer, in the order they came.
    pub async fn finish(self) -> Vec<Seen> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        seen.sort_by_key(|s| s.at);
        seen
    }
}

/// A failure's kind as Envoy's response flags name it, read from what the client got (the
/// bodies Envoy writes for its own local replies): `UH` no healthy upstream, `UF` upstream
/// connection failure, `UC` upstream connection termination, `UO` overflow, `NR` no route
/// (404 with an empty body), `NC` no cluster (Envoy's 503 with an empty body), else the
/// status alone.
pub fn failure_kind(status: u16, body: &str) -> String {
    let flag = if body.contains("no healthy upstream") {
        "UH"
    } else if body.contains("reset reason: connection failure")
        || body.contains("reset reason: remote connection failure")
    {
        "UF"
    } else if body.contains("reset reason: connection termination") {
        "UC"
    } else if body.contains("reset reason: overflow") {
        "UO"
    } else if status == 404 && body.is_empty() {
        "NR"
    } else if status == 503 && body.is_empty() {
        "NC"
    } else {
        ""
    };
    if flag.is_empty() {
        status.to_string()
    } else {
        format!("{status} {flag}")
    }
}

/// Failures by kind.
pub fn failures(seen: &[Seen]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for kind in seen.iter().filter_map(|s| s.failure.as_ref()) {
        *out.entry(kind.clone()).or_insert(0) += 1;
    }
    out
}

/// When a change showed, from when it was made.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moments {
    /// The first new answer.
    pub first_new: Option<Duration>,
    /// The first answer after which every answer was new (the one after the last that
    /// was not).
    pub all_new: Option<Duration>,
    /// The last answer that was not new.
    pub last_old: Option<Duration>,
}

/// For a change made at `at` and the answers up to the next change (`until`): its
/// [`Moments`]. None where it never came.
pub fn moments(
    seen: &[Seen],
    at: Duration,
    until: Duration,
    new: impl Fn(&Seen) -> bool,
) -> Moments {
    let window: Vec<&Seen> = seen.iter().filter(|s| s.at >= at && s.at < until).collect();
    let first_new = window.iter().find(|s| new(s)).map(|s| s.at - at);
    let last_old = window.iter().rposition(|s| !new(s));
    let all_new = match last_old {
        None => window.first().map(|s| s.at - at),
        Some(i) => window.get(i + 1).map(|s| s.at - at),
    };
    let last_old = last_old.and_then(|i| window.get(i)).map(|s| s.at - at);
    Moments {
        first_new,
        all_new,
        last_old,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(ms: u64, sentinel: &str) -> Seen {
        Seen {
            sent: Duration::from_millis(ms.saturating_sub(1)),
            at: Duration::from_millis(ms),
            status: Some(200),
            backend: "svc-0-a".into(),
            sentinel: sentinel.into(),
            failure: None,
        }
    }

    #[test]
    fn a_change_is_seen_first_and_then_everywhere() {
        let answers = [
            answer(90, "1"),
            answer(110, "1"),
            answer(120, "2"),
            answer(130, "1"),
            answer(140, "2"),
            answer(150, "2"),
            answer(400, "3"),
        ];
        let new = |s: &Seen| s.sentinel == "2";
        let ms = Duration::from_millis;
        let seen = moments(&answers, ms(100), ms(300), new);
        assert_eq!(seen.first_new, Some(ms(20)));
        assert_eq!(seen.all_new, Some(ms(40)));
        assert_eq!(seen.last_old, Some(ms(30)));
        let seen = moments(&answers, ms(100), ms(125), new);
        assert_eq!((seen.first_new, seen.all_new), (Some(ms(20)), Some(ms(20))));
        let seen = moments(&answers, ms(100), ms(115), new);
        assert_eq!((seen.first_new, seen.all_new), (None, None));
    }

    #[test]
    fn envoys_own_replies_are_named_by_their_flag() {
        assert_eq!(failure_kind(503, "no healthy upstream"), "503 UH");
        assert_eq!(failure_kind(503, ""), "503 NC");
        assert_eq!(failure_kind(404, ""), "404 NR");
        assert_eq!(
            failure_kind(
                503,
                "upstream connect error or disconnect/reset before headers. reset reason: connection failure"
            ),
            "503 UF"
        );
        assert_eq!(failure_kind(500, "Internal Server Error"), "500");
    }
}
