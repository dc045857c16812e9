//! Asks every Envoy of the fleet whether it is ready for a switch, without touching any
//! backend (DESIGN.md, "Facts measured on real Envoy").
//!
//! - Endpoint check: `GET /` on the internal probe listener with `x-switchyard-probe: <id>`
//!   and the token. Envoy's health_check filter for that id answers 200 when every listed
//!   cluster is present, warm and has available hosts, 503 when not; 404 means the filter is
//!   not installed there yet. Fresh connection each time: a keep-alive connection would keep
//!   the probe listener's previous filter chain. The request says `connection: close`:
//!   neither side keeps it. Each such connection leaves a socket in TIME_WAIT, and with
//!   thousands of checks a minute every new connection searched through them for a free
//!   port: that is why version checks keep theirs.
//! - Version check: the same port with `Host: <secret probe host of the route>`; the live
//!   route configuration answers 200 with `x-switchyard-version`. Seeing version V proves the
//!   RouteConfiguration carrying V's routes is active on that Envoy. On the shared probe
//!   listener these go over kept-alive connections: a connection routes each request with
//!   the route configuration Envoy holds by its listener's name for it when the request
//!   comes (RDS), old connection or new, even one of a listener draining after a change.
//!   (Only a listener renamed to another route configuration, as turning virtual hosts one
//!   by one on or off does, leaves its old connections answering from the old one until
//!   they close.) A Gateway listener's probe twin is asked on a fresh connection: there
//!   the answer also proves the listener is up.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::Mutex;

use crate::model::version_probe_host;
use crate::translate::{ENDPOINT_PROBE_HOST, PROBE_ID_HEADER, PROBE_TOKEN_HEADER, VERSION_HEADER};

/// What an Envoy answered.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Ready,
    NotReady(String),
    /// No answer at all (connection refused, timeout): only then does the prober back off.
    Unreachable(String),
}

/// No answer: the whole error chain ("... connection refused"), which stays the same
/// from one attempt to the next while nothing changes.
fn unreachable(error: &reqwest::Error) -> Verdict {
    let mut why = format!("unreachable: {error}");
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        why.push_str(": ");
        why.push_str(&e.to_string());
        source = e.source();
    }
    Verdict::Unreachable(why)
}

/// The fleet's answers to one check.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetResult {
    pub ready: Vec<String>,
    /// Envoy address and why it is not ready.
    pub lagging: Vec<(String, String)>,
}

impl FleetResult {
    /// True when every Envoy answered ready, and there is at least one Envoy.
    pub fn all_ready(&self) -> bool {
        self.lagging.is_empty() && !self.ready.is_empty()
    }

    pub fn total(&self) -> usize {
        self.ready.len() + self.lagging.len()
    }
}

#[derive(Clone)]
pub struct Prober {
    /// A connection per check: endpoint checks, version checks on a Gateway listener's probe
    /// twin, and a version check asked again after its kept connection failed.
    fresh: reqwest::Client,
    /// For version checks on the shared probe listener: connections kept alive.
    kept: reqwest::Client,
    probe_port: u16,
    token: String,
    parallelism: usize,
    /// Per unreachable Envoy: when it may be asked again, its current backoff and why it
    /// was unreachable (reported unchanged while backing off: the reason ends up in a
    /// route's status, and a countdown there would rewrite the status on every check). Envoys
    /// that answer are asked whenever a rollout wants to know: an answer costs Envoy
    /// nothing, and a "not yet" for one route must not hold back the check of another.
    backoff: Arc<Mutex<HashMap<String, Backoff>>>,
}

struct Backoff {
    until: Instant,
    current: Duration,
    why: String,
}

/// Idle connections kept to one Envoy's probe port for version checks: about as many as
/// units check at once (a TrafficRoute controller runs up to 256 passes at once, a Gateway
/// pass moves up to 256 units, whose trials are asked there), so that the next burst of
/// checks finds them open instead of closing the surplus and connecting again.
const KEPT_PER_ENVOY: usize = 256;

const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

impl Prober {
    pub fn new(probe_port: u16, token: String) -> Result<Self, reqwest::Error> {
        let fresh = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(1))
            .build()?;
        let kept = reqwest::Client::builder()
            .pool_max_idle_per_host(KEPT_PER_ENVOY)
            .timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(1))
            .build()?;
        Ok(Self {
            fresh,
            kept,
            probe_port,
            token,
            parallelism: 32,
            backoff: Arc::default(),
        })
    }

    /// Does every Envoy have every cluster of endpoint probe `probe_id`, with endpoints?
    pub async fn check_endpoints(&self, envoys: &[String], probe_id: &str) -> FleetResult {
        self.check_fleet(envoys, |prober, envoy| {
            let probe_id = probe_id.to_string();
            async move { prober.endpoint_verdict(&envoy, &probe_id).await }
        })
        .await
    }

    /// Is every Envoy ready for a switch? It must have accepted the routes on trial (the
    /// trial `trial_id` answers `version`), and the endpoint probe `probe_id` must pass.
    pub async fn check_staged(
        &self,
        envoys: &[String],
        probe_id: &str,
        trial_id: &str,
        version: &str,
    ) -> FleetResult {
        self.check_fleet(envoys, |prober, envoy| {
            let host = version_probe_host(trial_id, &prober.token);
            let (probe_id, version) = (probe_id.to_string(), version.to_string());
            async move {
                match prober
                    .version_verdict(&envoy, prober.probe_port, &host, &version)
                    .await
                {
                    Verdict::Ready => prober.endpoint_verdict(&envoy, &probe_id).await,
                    Verdict::NotReady(why) => Verdict::NotReady(format!("routes on trial: {why}")),
                    unreachable => unreachable,
                }
            }
        })
        .await
    }

    /// Does every Envoy serve `version` of the route whose version probe id is `probe_id`?
    pub async fn check_version(
        &self,
        envoys: &[String],
        probe_id: &str,
        version: &str,
    ) -> FleetResult {
        self.check_version_on(envoys, self.probe_port, probe_id, version)
            .await
    }

    /// [`Prober::check_version`] on another internal port: a Gateway listener's probe twin,
    /// which answers with that listener's route configuration.
    pub async fn check_version_on(
        &self,
        envoys: &[String],
        port: u16,
        probe_id: &str,
        version: &str,
    ) -> FleetResult {
        self.check_fleet_on(envoys, port, |prober, envoy| {
            let host = version_probe_host(probe_id, &prober.token);
            let version = version.to_string();
            async move { prober.version_verdict(&envoy, port, &host, &version).await }
        })
        .await
    }

    async fn check_fleet<F, Fut>(&self, envoys: &[String], check: F) -> FleetResult
    where
        F: Fn(Prober, String) -> Fut,
        Fut: std::future::Future<Output = Verdict>,
    {
        self.check_fleet_on(envoys, self.probe_port, check).await
    }

    /// Asks every Envoy on `port`; an Envoy unreachable there backs off on that port only
    /// (a Gateway listener not up yet says nothing about the shared probe listener).
    async fn check_fleet_on<F, Fut>(&self, envoys: &[String], port: u16, check: F) -> FleetResult
    where
        F: Fn(Prober, String) -> Fut,
        Fut: std::future::Future<Output = Verdict>,
    {
        let verdicts: Vec<(String, Verdict)> = futures::stream::iter(envoys.iter().cloned())
            .map(|envoy| {
                let fut = check(self.clone(), envoy.clone());
                let this = self.clone();
                let key = format!("{envoy} {port}");
                async move {
                    if let Some(why) = this.backing_off(&key).await {
                        return (envoy, Verdict::Unreachable(why));
                    }
                    let verdict = fut.await;
                    this.record(&key, &verdict).await;
                    (envoy, verdict)
                }
            })
            .buffer_unordered(self.parallelism)
            .collect()
            .await;
        let mut result = FleetResult::default();
        for (envoy, verdict) in verdicts {
            match verdict {
                Verdict::Ready => result.ready.push(envoy),
                Verdict::NotReady(why) | Verdict::Unreachable(why) => {
                    result.lagging.push((envoy, why));
                }
            }
        }
        result.ready.sort();
        result.lagging.sort();
        result
    }

    /// Why this Envoy was last unreachable, while it is backing off.
    async fn backing_off(&self, envoy: &str) -> Option<String> {
        let backoff = self.backoff.lock().await;
        let entry = backoff.get(envoy)?;
        (Instant::now() < entry.until).then(|| entry.why.clone())
    }

    async fn record(&self, envoy: &str, verdict: &Verdict) {
        let mut backoff = self.backoff.lock().await;
        match verdict {
            Verdict::Ready | Verdict::NotReady(_) => {
                backoff.remove(envoy);
            }
            Verdict::Unreachable(why) => {
                let current = backoff
                    .get(envoy)
                    .map_or(FIRST_BACKOFF, |b| (b.current * 2).min(MAX_BACKOFF));
                let entry = Backoff {
                    until: Instant::now() + current,
                    current,
                    why: why.clone(),
                };
                backoff.insert(envoy.to_string(), entry);
            }
        }
    }

    fn url(envoy: &str, port: u16) -> String {
        if envoy.contains(':') && !envoy.starts_with('[') {
            format!("http://[{envoy}]:{port}/")
        } else {
            format!("http://{envoy}:{port}/")
        }
    }

    async fn endpoint_verdict(&self, envoy: &str, probe_id: &str) -> Verdict {
        let response = self
            .fresh
            .get(Self::url(envoy, self.probe_port))
            .header("host", ENDPOINT_PROBE_HOST)
            .header(reqwest::header::CONNECTION, "close")
            .header(PROBE_ID_HEADER, probe_id)
            .header(PROBE_TOKEN_HEADER, &self.token)
            .send()
            .await;
        match response {
            Ok(r) if r.status().as_u16() == 200 => Verdict::Ready,
            Ok(r) if r.status().as_u16() == 404 => {
                Verdict::NotReady("probe not installed yet".into())
            }
            Ok(r) if r.status().as_u16() == 503 => {
                Verdict::NotReady("clusters missing, warming or without ready endpoints".into())
            }
            Ok(r) => Verdict::NotReady(format!("unexpected status {}", r.status())),
            Err(e) => unreachable(&e),
        }
    }

    async fn version_verdict(&self, envoy: &str, port: u16, host: &str, version: &str) -> Verdict {
        let ask = |client: &reqwest::Client| {
            let request = client.get(Self::url(envoy, port)).header("host", host);
            request.send()
        };
        // A Gateway listener's probe twin is asked on a new connection: its answer also
        // proves that the listener is up, and a connection kept from an earlier listener on
        // that port would answer while the new one is not.
        let response = if port != self.probe_port {
            ask(&self.fresh).await
        } else {
            match ask(&self.kept).await {
                // A kept connection that Envoy closed as the request went out (a listener
                // draining after a change closes its idle ones): asked again on a new one.
                // Not after a timeout, which would hold a check of a hung Envoy twice as
                // long.
                Err(e) if !e.is_timeout() => ask(&self.fresh).await,
                answered => answered,
            }
        };
        match response {
            Ok(r) if r.status().as_u16() == 200 => {
                let seen = r
                    .headers()
                    .get(VERSION_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                if seen == version {
                    Verdict::Ready
                } else {
                    Verdict::NotReady(format!("serves version {seen:?}"))
                }
            }
            Ok(r) => Verdict::NotReady(format!("no live version yet (status {})", r.status())),
            Err(e) => unreachable(&e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loopback port nobody listens on.
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    }

    #[tokio::test]
    async fn an_unreachable_envoy_keeps_one_reason_while_backing_off() {
        let prober = Prober::new(closed_port(), "token".into()).expect("client");
        let envoys = vec!["127.0.0.1".to_string()];
        let first = prober.check_endpoints(&envoys, "probe").await;
        assert!(!first.all_ready());
        let (_, why) = &first.lagging[0];
        assert!(why.starts_with("unreachable: "), "{why}");
        assert!(why.contains("refused"), "the cause is in the reason: {why}");
        // Asked again at once: backing off, same words (a route's status stays put).
        for _ in 0..3 {
            let again = prober.check_endpoints(&envoys, "probe").await;
            assert_eq!(again, first);
        }
    }
}
