use std::time::Duration;
use switchyard_e2e::free_port;
use switchyard_e2e::rig::{HOST, Rig};

#[tokio::test]
async fn which_replica() {
    let mut rig = Rig::start(6).await;
    rig.add_backend("blue").await;
    let a = free_port();
    let b = free_port();
    rig.connect_envoys_to(&[a, b]);
    let op = switchyard_e2e::Switchyard::start_operator_on(
        &rig.work,
        "switchyard-2",
        &rig.api.kubeconfig,
        &format!("switchyard-system/{}", rig.fleet_service()),
        rig.ports,
        b,
        &[
            "--namespaces",
            &rig.namespace,
            "--lease-name",
            &rig.lease_name(),
        ],
    );
    rig.operators.push(op);
    tokio::time::sleep(Duration::from_secs(2)).await;
    rig.start_operator_on("switchyard-1", a, &[]);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("blue", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for o in &rig.operators {
        let n = o.nodes().await;
        let ids: Vec<_> = n["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["node_id"].clone())
            .collect();
        eprintln!("{} -> {:?}", o.process.name, ids);
    }
    eprintln!("holder {:?}", rig.lease_holder().await);
}
