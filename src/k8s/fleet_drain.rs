//! Which Envoys of the fleet are about to stop: the terminating endpoints of the fleet
//! Service, by Pod name, which is the Envoy's node id (the chart's bootstrap sets
//! `--service-node` to it). Every replica hands them to its xDS server, which drains
//! their connections before the Pod's preStop sleep ends and Envoy exits: otherwise a
//! client's next request on a kept-alive connection meets a closed socket.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::sync::watch;
use tracing::info;

use super::envoys::Envoys;
use super::watched::View;

/// The Pods behind terminating endpoints of these slices.
pub fn terminating_pods<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> BTreeSet<String> {
    slices
        .into_iter()
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.terminating) == Some(true))
        .filter_map(|e| e.target_ref.as_ref())
        .filter(|r| r.kind.as_deref() == Some("Pod"))
        .filter_map(|r| r.name.clone())
        .collect()
}

/// Keeps the Envoys' draining set equal to the fleet's terminating Pods (the fleet
/// Service's slices), until the program ends.
pub async fn run(slices: View<EndpointSlice>, envoys: Arc<dyn Envoys>) {
    let changes = Arc::new(watch::channel(0u64).0);
    let mut changed = changes.subscribe();
    slices.notify(&changes);
    let mut draining = BTreeSet::new();
    loop {
        let now = terminating_pods(slices.state().iter().map(|s| s.as_ref()));
        if now != draining {
            info!(envoys = ?now, "draining the Envoys of terminating Pods");
            draining = now.clone();
            envoys.set_draining(now);
        }
        if changed.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};

    use super::*;

    fn endpoint(pod: &str, terminating: Option<bool>) -> Endpoint {
        Endpoint {
            addresses: vec!["198.18.0.9".into()],
            conditions: Some(EndpointConditions {
                ready: Some(terminating != Some(true)),
                serving: Some(true),
                terminating,
            }),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_terminating_pods_drain() {
        let slice = EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(vec![
                endpoint("envoy-a", Some(true)),
                endpoint("envoy-b", Some(false)),
                endpoint("envoy-c", None),
            ]),
            ..Default::default()
        };
        let mut no_ref = endpoint("ignored", Some(true));
        no_ref.target_ref = None;
        let other = EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(vec![no_ref, endpoint("envoy-d", Some(true))]),
            ..Default::default()
        };
        assert_eq!(
            terminating_pods([&slice, &other]),
            BTreeSet::from(["envoy-a".to_string(), "envoy-d".to_string()])
        );
    }
}
