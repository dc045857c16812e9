//! The operator on a real kube-apiserver with real Envoys: a TrafficRoute becomes Ready
//! only when every Envoy serves it, and traffic shifts without a failed request.

use std::time::Duration;

use switchyard_e2e::Load;
use switchyard_e2e::rig::{HOST, Rig};

#[tokio::test]
async fn a_route_becomes_ready_and_shifts_to_a_new_service_without_drops() {
    let mut rig = Rig::start(3).await;
    rig.add_backend("blue").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("blue", 1)]))
        .await;
    let took = rig.wait_ready("web", Duration::from_secs(60)).await;
    eprintln!("first generation Ready in {took:?}");
    assert_eq!(rig.answers().await, ["blue", "blue", "blue"]);

    let load = Load::start(rig.targets(), HOST, 240, Duration::from_secs(60));
    for (i, color) in ["green", "yellow", "purple"].iter().enumerate() {
        rig.add_backend(color).await;
        rig.apply_route("web", &Rig::route_yaml(HOST, &[(color, 1)]))
            .await;
        let took = rig.wait_ready("web", Duration::from_secs(30)).await;
        eprintln!("shift {} to {color}: Ready in {took:?}", i + 1);
        // Ready means every Envoy serves it.
        assert_eq!(rig.answers().await, [*color; 3]);
    }
    let report = load.finish().await;
    eprintln!(
        "load: {} requests, by status {:?}, by backend {:?}",
        report.sent, report.by_status, report.by_backend
    );
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}
