//! The fleet a rollout must hear from: the ready endpoints of the Envoy Service's
//! EndpointSlices: the addresses the prober asks; and when they change.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::sync::watch;

use crate::k8s::watched::View;
use crate::prober::FleetResult;

/// The ready endpoints of the fleet's EndpointSlices, sorted and deduplicated: every Envoy
/// a rollout must hear from.
pub fn fleet_addresses(slices: &[Arc<EndpointSlice>]) -> Vec<String> {
    let mut out: Vec<String> = slices
        .iter()
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.iter().cloned())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The Pod behind each address of the fleet's EndpointSlices, where the slice names one.
pub fn fleet_pods(slices: &[Arc<EndpointSlice>]) -> BTreeMap<String, String> {
    (slices.iter())
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .filter_map(|e| {
            let target = e.target_ref.as_ref()?;
            let pod = target
                .name
                .as_ref()
                .filter(|_| target.kind.as_deref() == Some("Pod"))?;
            Some(e.addresses.iter().map(|a| (a.clone(), pod.clone())))
        })
        .flatten()
        .collect()
}

/// Whether every Envoy that holds `result` back (one at least) is connected to another
/// replica, as far as this one can tell: its Pod (the node id the chart gives an Envoy) is
/// not among the Envoys connected `here`, or its address names no Pod. Such an Envoy's
/// answer to a new snapshot reaches only the replica it is connected to, so nothing here
/// wakes a rollout waiting on it: only asking it again tells. While one connected here
/// still lags, its answer is what to wait for.
pub fn lagging_only_elsewhere(
    result: &FleetResult,
    pods: &BTreeMap<String, String>,
    here: &BTreeSet<String>,
) -> bool {
    !result.lagging.is_empty()
        && (result.lagging.iter())
            .all(|(address, _)| pods.get(address).is_none_or(|pod| !here.contains(pod)))
}

/// `result`, each Envoy that holds it back named by its Pod where there is one:
/// `pod (address)`, so that status says which Pod to look at.
pub fn named_by_pod(mut result: FleetResult, pods: &BTreeMap<String, String>) -> FleetResult {
    for (envoy, _) in &mut result.lagging {
        if let Some(pod) = pods.get(envoy.as_str()) {
            *envoy = format!("{pod} ({envoy})");
        }
    }
    result
}

/// Every Envoy asked passed, or there is none to ask.
pub fn passed(result: &FleetResult, envoys: &[String]) -> bool {
    result.all_ready() || envoys.is_empty()
}

/// The fleet's addresses (the ready endpoints of its EndpointSlices), published when they
/// change: an Envoy that stops being ready (a hung one, say) no longer holds a rollout
/// back, and one that becomes ready must be asked. A rollout waiting on the fleet looks
/// again at once, rather than when its timer fires, and drops a check in flight
/// ([`check_while_fleet_stays`]). Other events of the slices (a relist,
/// a change of ports or conditions that leaves the addresses as they were) wake nobody.
/// A front-end's controller holds it for as long as it runs.
pub struct FleetChanges {
    addresses: watch::Receiver<Vec<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl FleetChanges {
    pub fn new(fleet: &View<EndpointSlice>) -> FleetChanges {
        let events = Arc::new(watch::channel(0u64).0);
        fleet.notify(&events);
        let (publish, addresses) = watch::channel(fleet_addresses(&fleet.state()));
        let fleet = fleet.clone();
        let mut event = events.subscribe();
        let task = tokio::spawn(async move {
            // The watch bumps `events` only while it lives: held here.
            let _events = events;
            while event.changed().await.is_ok() {
                let now = fleet_addresses(&fleet.state());
                publish.send_if_modified(|addresses| {
                    let changed = *addresses != now;
                    *addresses = now;
                    changed
                });
            }
        });
        FleetChanges { addresses, task }
    }

    pub fn subscribe(&self) -> watch::Receiver<Vec<String>> {
        self.addresses.clone()
    }
}

impl Drop for FleetChanges {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `check` of `envoys`; None if the fleet lost or gained an Envoy meanwhile and
/// `may_drop`. A hung Envoy's probe takes the prober's whole timeout to fail; once it has
/// left the fleet, nobody needs that answer.
pub async fn check_while_fleet_stays<F, Fut>(
    fleet_changes: &mut watch::Receiver<Vec<String>>,
    check: &F,
    envoys: Vec<String>,
    may_drop: bool,
) -> Option<FleetResult>
where
    F: Fn(Vec<String>) -> Fut,
    Fut: Future<Output = FleetResult>,
{
    let asked = envoys.clone();
    let checking = check(envoys);
    if !may_drop {
        return Some(checking.await);
    }
    tokio::pin!(checking);
    loop {
        tokio::select! {
            result = &mut checking => return Some(result),
            changed = fleet_changes.changed() => {
                // (A watch that is gone changes nothing more: wait for the answer.)
                if changed.is_err() {
                    return Some(checking.await);
                }
                if *fleet_changes.borrow_and_update() != asked {
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::Endpoint;

    fn endpoint(address: &str, pod: Option<&str>) -> Endpoint {
        Endpoint {
            addresses: vec![address.to_owned()],
            target_ref: pod.map(|pod| ObjectReference {
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_check_in_flight_is_dropped_when_an_envoy_leaves_the_fleet() {
        let asked = vec!["198.18.0.4".to_owned(), "198.18.0.5".to_owned()];
        let (fleet, mut addresses) = watch::channel(asked.clone());
        // A hung Envoy's probe: no answer before the prober's timeout.
        let hung = |_: Vec<String>| futures::future::pending::<FleetResult>();
        let checking = check_while_fleet_stays(&mut addresses, &hung, asked.clone(), true);
        // (Bounded, so that a check that is not dropped fails the test.)
        let checking = tokio::time::timeout(Duration::from_secs(10), checking);
        let left = async {
            // An event that leaves the addresses as they were drops nothing.
            fleet.send_replace(asked.clone());
            tokio::task::yield_now().await;
            fleet.send_replace(vec!["198.18.0.5".to_owned()]);
        };
        let (checked, ()) = tokio::join!(checking, left);
        assert!(checked.is_ok_and(|c| c.is_none()), "the check went on");

        // Past the pass's time, the answer is waited for whatever happens.
        let answers = |envoys: Vec<String>| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            FleetResult {
                ready: envoys,
                lagging: Vec::new(),
            }
        };
        let checking = check_while_fleet_stays(&mut addresses, &answers, asked.clone(), false);
        let changed = async { fleet.send_replace(asked.clone()) };
        let (checked, _) = tokio::join!(checking, changed);
        assert_eq!(checked.map(|r| r.ready), Some(asked));
    }

    #[test]
    fn the_envoys_that_hold_a_rollout_back_are_named_by_their_pod() {
        let slice = EndpointSlice {
            endpoints: Some(vec![
                endpoint("198.18.0.4", Some("envoy-7d9f-x2")),
                endpoint("198.18.0.5", None),
            ]),
            ..Default::default()
        };
        let pods = fleet_pods(&[Arc::new(slice)]);
        let result = FleetResult {
            ready: vec!["198.18.0.6".into()],
            lagging: vec![
                ("198.18.0.4".into(), "unreachable".into()),
                ("198.18.0.5".into(), "serves version \"a\"".into()),
            ],
        };
        let named = named_by_pod(result, &pods);
        assert_eq!(named.lagging[0].0, "envoy-7d9f-x2 (198.18.0.4)");
        assert_eq!(named.lagging[1].0, "198.18.0.5");
        assert_eq!(named.ready, ["198.18.0.6"]);
    }

    #[test]
    fn envoys_are_elsewhere_unless_their_pod_is_connected_here() {
        let slice = EndpointSlice {
            endpoints: Some(vec![
                endpoint("198.18.0.4", Some("envoy-a")),
                endpoint("198.18.0.5", Some("envoy-b")),
                endpoint("198.18.0.6", None),
            ]),
            ..Default::default()
        };
        let pods = fleet_pods(&[Arc::new(slice)]);
        let here = BTreeSet::from(["envoy-a".to_owned()]);
        let lagging = |addresses: &[&str]| FleetResult {
            ready: Vec::new(),
            lagging: (addresses.iter())
                .map(|a| (a.to_string(), "serves version \"a\"".to_owned()))
                .collect(),
        };
        let elsewhere =
            |addresses: &[&str]| lagging_only_elsewhere(&lagging(addresses), &pods, &here);
        assert!(!elsewhere(&["198.18.0.4"]));
        assert!(elsewhere(&["198.18.0.5"]));
        // No Pod to tell by: it may be anywhere.
        assert!(elsewhere(&["198.18.0.6"]));
        assert!(elsewhere(&["198.18.0.5", "198.18.0.6"]));
        // One connected here lags too: its answer wakes the rollout.
        assert!(!elsewhere(&["198.18.0.4", "198.18.0.5"]));
        assert!(!elsewhere(&[]));
    }
}
