//! What the kubelet does with the chart's Envoy readiness probe, for rigs that have no
//! kubelet: `GET /ready` on each Envoy's probe port every 2 s with a 1 s timeout; two
//! failures in a row mark its endpoint not ready in the fleet's EndpointSlice, one
//! success ready again (charts/switchyard/templates/envoy.yaml).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::rig::Rig;

const PERIOD: Duration = Duration::from_secs(2);
const TIMEOUT: Duration = Duration::from_secs(1);
const FAILURE_THRESHOLD: u32 = 2;
/// Bound of the probe loop, whatever the test does.
const MAX_TIME: Duration = Duration::from_secs(300);

/// The probes, running until dropped.
pub struct KubeletProbes {
    /// When each Envoy's readiness changed in the EndpointSlice: (when, Envoy, ready).
    changes: Arc<Mutex<Vec<(Instant, usize, bool)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl KubeletProbes {
    /// Starts probing every Envoy of `rig`, all taken as ready to begin with.
    pub fn start(rig: &Rig) -> KubeletProbes {
        let changes = Arc::new(Mutex::new(Vec::new()));
        let urls: Vec<String> = (rig.envoy_addresses.iter())
            .map(|a| format!("http://{a}:{}/ready", rig.ports.probe))
            .collect();
        let slice = FleetSlice {
            client: rig.client.clone(),
            service: rig.fleet_service(),
            addresses: rig.envoy_addresses.clone(),
            port: rig.ports.probe,
        };
        let task = tokio::spawn(probe(urls, slice, changes.clone()));
        KubeletProbes { changes, task }
    }

    /// When Envoy `i` was last marked `ready` (or not) in the EndpointSlice.
    pub fn marked(&self, i: usize, ready: bool) -> Option<Instant> {
        let changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        (changes.iter().rev())
            .find(|(_, envoy, r)| *envoy == i && *r == ready)
            .map(|(at, _, _)| *at)
    }
}

impl Drop for KubeletProbes {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the probes write: the fleet Service's EndpointSlice.
struct FleetSlice {
    client: kube::Client,
    service: String,
    addresses: Vec<String>,
    port: u16,
}

async fn probe(
    urls: Vec<String>,
    slice: FleetSlice,
    changes: Arc<Mutex<Vec<(Instant, usize, bool)>>>,
) {
    let Ok(client) = reqwest::Client::builder().timeout(TIMEOUT).build() else {
        return;
    };
    let started = Instant::now();
    let mut ready = vec![true; urls.len()];
    let mut failures = vec![0u32; urls.len()];
    let mut tick = tokio::time::interval(PERIOD);
    while started.elapsed() < MAX_TIME {
        tick.tick().await;
        let answers =
            futures::future::join_all(urls.iter().map(|url| client.get(url).send())).await;
        let mut changed = false;
        for (i, answer) in answers.into_iter().enumerate() {
            let ok = answer.is_ok_and(|r| r.status().is_success());
            failures[i] = if ok { 0 } else { failures[i] + 1 };
            let now_ready = ok || (ready[i] && failures[i] < FAILURE_THRESHOLD);
            if now_ready != ready[i] {
                ready[i] = now_ready;
                changed = true;
                let mut log = changes.lock().unwrap_or_else(|p| p.into_inner());
                log.push((Instant::now(), i, now_ready));
            }
        }
        if changed {
            let refs: Vec<crate::kube::EndpointSpec<'_>> = (slice.addresses.iter())
                .zip(&ready)
                .map(|(a, r)| (a.as_str(), slice.port, *r, *r, false))
                .collect();
            crate::kube::apply_endpoint_slice(
                &slice.client,
                crate::rig::FLEET_NAMESPACE,
                &slice.service,
                &refs,
            )
            .await;
        }
    }
}
