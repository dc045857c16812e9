//! Every route served, seen from the data path: each route's host asked through an
//! Envoy's address until it answers 2xx. What a user sees, and nothing of Envoy's main
//! thread: its admin interface (a configuration dump, even its counters) takes seconds at
//! thousands of routes on this machine, time Envoy would not spend taking in xDS.

use std::time::{Duration, Instant};

use anyhow::Context as _;

/// Requests in flight at once while probing routes.
const PROBING_AT_ONCE: usize = 16;
/// How long one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Between two rounds of probes.
const ROUND_PAUSE: Duration = Duration::from_millis(50);

/// How far something got over a number of routes: when it got to every one of them
/// (from the start), or how many it got to within the time it had.
#[derive(Clone, Copy, Debug)]
pub struct Reached {
    pub every: Option<Duration>,
    pub count: usize,
}

/// Probes `hosts` through `url` in rounds until every one has answered 2xx once, or
/// `within` from `started` passed (then one last pass over the rest counts how many
/// were served).
///
/// A round walks the hosts not yet seen served, the last created first,
/// [`PROBING_AT_ONCE`] at a time, and ends at the first batch with a failure: routes are
/// mostly served in about the order they were created, so while nothing new is served a
/// round costs a batch of requests, not one per route (thousands of 404s a second would
/// take CPU from the control plane measured on the same cores).
pub async fn every_host_served(
    url: String,
    hosts: Vec<String>,
    (started, within): (Instant, Duration),
) -> anyhow::Result<Reached> {
    let client = probe_client()?;
    let mut pending: Vec<usize> = (0..hosts.len()).collect();
    let deadline = started + within;
    while Instant::now() < deadline {
        sweep(&client, &url, &hosts, &mut pending, true, deadline).await;
        if pending.is_empty() {
            return Ok(Reached {
                every: Some(started.elapsed()),
                count: hosts.len(),
            });
        }
        tokio::time::sleep(ROUND_PAUSE).await;
    }
    // Time for every batch to time out: the count is of every route, not of those the
    // pass got to.
    let batches = u32::try_from(pending.len().div_ceil(PROBING_AT_ONCE)).unwrap_or(u32::MAX);
    let last_pass = Instant::now() + PROBE_TIMEOUT.saturating_mul(batches.saturating_add(1));
    sweep(&client, &url, &hosts, &mut pending, false, last_pass).await;
    Ok(Reached {
        every: None,
        count: hosts.len() - pending.len(),
    })
}

/// How many of `hosts` do not answer 2xx through `url` now, in one pass (of at most
/// `within`).
pub async fn unserved(url: String, hosts: Vec<String>, within: Duration) -> anyhow::Result<usize> {
    let client = probe_client()?;
    let mut pending: Vec<usize> = (0..hosts.len()).collect();
    let deadline = Instant::now() + within;
    sweep(&client, &url, &hosts, &mut pending, false, deadline).await;
    Ok(pending.len())
}

fn probe_client() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(PROBE_TIMEOUT)
        .build()
        .context("an HTTP client for the probes")
}

/// Probes the hosts of `pending` (indices into `hosts`), the last first,
/// [`PROBING_AT_ONCE`] at a time, and takes those that answered 2xx out of it; with
/// `stop_at_failure`, stops after the first batch where one did not. Stops at `deadline`.
async fn sweep(
    client: &reqwest::Client,
    url: &str,
    hosts: &[String],
    pending: &mut Vec<usize>,
    stop_at_failure: bool,
    deadline: Instant,
) {
    let mut end = pending.len();
    while end > 0 && Instant::now() < deadline {
        let start = end.saturating_sub(PROBING_AT_ONCE);
        let batch = &pending[start..end];
        let answers =
            futures::future::join_all(batch.iter().map(|&i| answers_2xx(client, url, &hosts[i])))
                .await;
        let still: Vec<usize> = (batch.iter().zip(answers))
            .filter_map(|(&i, ok)| (!ok).then_some(i))
            .collect();
        let failed = !still.is_empty();
        pending.splice(start..end, still);
        if failed && stop_at_failure {
            return;
        }
        end = start;
    }
}

/// Whether a GET of `url` with Host `host` answers 2xx.
async fn answers_2xx(client: &reqwest::Client, url: &str, host: &str) -> bool {
    let answer = client
        .get(format!("{url}/"))
        .header("host", host)
        .send()
        .await;
    match answer {
        Ok(response) => {
            let ok = response.status().is_success();
            // Read to the end, so that the connection is used again.
            let _ = response.bytes().await;
            ok
        }
        Err(_) => false,
    }
}
