//! The fleet a rollout must hear from: the ready endpoints of the Envoy Service's
//! EndpointSlices: the addresses the prober asks.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;

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

#[cfg(test)]
mod tests {
    use super::*;
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
}
