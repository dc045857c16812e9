//! Golden tests of the Gateway API front-end: `tests/golden/gateway/<case>/input.yaml`
//! (GatewayClasses, Gateways, HTTPRoutes, ReferenceGrants and the Services, Namespaces and
//! Secrets they name) gives exactly `expected.yaml`: the status of every object of
//! Switchyard's and what each Gateway serves, in the route vocabulary.
//! `UPDATE_GOLDEN=1` rewrites them.

use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use switchyard::gateway::api::gatewayclasses::GatewayClass;
use switchyard::gateway::api::gateways::Gateway;
use switchyard::gateway::api::httproutes::HttpRoute;
use switchyard::gateway::api::referencegrants::ReferenceGrant;
use switchyard::gateway::controller::known;
use switchyard::gateway::translate::{CONTROLLER_NAME, Inputs, KnownSecret, translate};
use switchyard_e2e::golden;

const STAGE: &str = "gateway";

fn translated(case: &str) -> String {
    let docs = golden::documents(&golden::stage_dir(STAGE).join(case).join("input.yaml"));
    let classes: Vec<GatewayClass> = golden::of_kind(&docs, "GatewayClass");
    let gateways: Vec<Gateway> = golden::of_kind(&docs, "Gateway");
    let routes: Vec<HttpRoute> = golden::of_kind(&docs, "HTTPRoute");
    let grants: Vec<ReferenceGrant> = golden::of_kind(&docs, "ReferenceGrant");
    let services: Vec<Service> = golden::of_kind(&docs, "Service");
    let namespaces: Vec<Namespace> = golden::of_kind(&docs, "Namespace");
    let secrets: Vec<KnownSecret> = golden::of_kind::<Secret>(&docs, "Secret")
        .iter()
        .map(known)
        .collect();
    let translation = translate(&Inputs {
        controller_name: CONTROLLER_NAME,
        crd_version: None,
        classes: &classes,
        gateways: &gateways,
        routes: &routes,
        grants: &grants,
        services: &services,
        namespaces: &namespaces,
        secrets: &secrets,
    });
    golden::to_yaml(&translation)
}

#[test]
fn gateway_api_objects_translate_as_the_golden_files_say() {
    let cases = golden::cases(STAGE);
    assert!(!cases.is_empty(), "no cases under tests/golden/{STAGE}");
    for case in cases {
        let actual = translated(&case);
        golden::check(
            &golden::stage_dir(STAGE).join(&case).join("expected.yaml"),
            &actual,
        );
    }
}
