//! Golden tests of the first stage, resolution: `tests/golden/resolve/<case>/input.yaml`
//! (a TrafficRoute, the Services of its namespace, and optionally the route's live
//! ProxyConfig) gives exactly `expected.yaml`: the specs of the route's live and probe
//! ProxyConfigs, or why the route is refused. `UPDATE_GOLDEN=1` rewrites them.

use k8s_openapi::api::core::v1::Service;
use serde::Serialize;
use switchyard::api::{ProxyConfig, ProxyConfigRole, ProxyConfigSpec, TrafficRoute};
use switchyard::rollout::proxy_config_spec;
use switchyard::traffic_route::resolve::resolve_route;
use switchyard_e2e::golden;

const STAGE: &str = "resolve";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Outcome {
    /// The two ProxyConfig specs the rollout would write.
    Resolved {
        live: Box<ProxyConfigSpec>,
        probe: Box<ProxyConfigSpec>,
    },
    /// The condition the route would report.
    Refused { reason: String, message: String },
}

fn outcome(case: &str) -> Outcome {
    let docs = golden::documents(&golden::stage_dir(STAGE).join(case).join("input.yaml"));
    let routes: Vec<TrafficRoute> = golden::of_kind(&docs, "TrafficRoute");
    let [route] = routes.as_slice() else {
        panic!("{case}: input.yaml needs exactly one TrafficRoute");
    };
    let services: Vec<Service> = golden::of_kind(&docs, "Service");
    let live: Vec<ProxyConfig> = golden::of_kind(&docs, "ProxyConfig");
    let live_clusters = live
        .first()
        .map(|pc| pc.spec.clusters.clone())
        .unwrap_or_default();
    let name = route.metadata.name.as_deref().unwrap_or_default();
    let generation = route.metadata.generation.unwrap_or(1);
    let created = route.metadata.creation_timestamp.as_ref();
    match resolve_route(route, &services.iter().collect::<Vec<_>>()) {
        Ok(resolved) => Outcome::Resolved {
            live: Box::new(proxy_config_spec(
                name,
                generation,
                ProxyConfigRole::Live,
                &resolved,
                &[],
                created,
            )),
            probe: Box::new(proxy_config_spec(
                name,
                generation,
                ProxyConfigRole::Probe,
                &resolved,
                &live_clusters,
                created,
            )),
        },
        Err(e) => Outcome::Refused {
            reason: e.reason().to_owned(),
            message: e.to_string(),
        },
    }
}

#[test]
fn every_case_resolves_as_its_golden_file_says() {
    let cases = golden::cases(STAGE);
    assert!(!cases.is_empty());
    for case in cases {
        let actual = golden::to_yaml(&outcome(&case));
        golden::check(
            &golden::stage_dir(STAGE).join(&case).join("expected.yaml"),
            &actual,
        );
    }
}
