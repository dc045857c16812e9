//! The operator needs nothing beyond `switchyard rbac`: run it with a ServiceAccount token
//! bound to exactly that ClusterRole through a rollout, and see no 403.

use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams};
use switchyard::k8s::rbac::cluster_role;
use switchyard::xds::Protocol;
use switchyard_e2e::rig::{FLEET_NAMESPACE, HOST, Rig};
use switchyard_e2e::{Envoy, Switchyard};

#[tokio::test]
async fn the_generated_cluster_role_is_enough_for_a_rollout() {
    let mut rig = Rig::start(2).await;
    rig.add_backend("blue").await;
    rig.add_backend("green").await;
    let name = format!("switchyard-{}", rig.namespace);
    let apply = PatchParams::apply("rbac-test").force();
    let accounts: Api<ServiceAccount> = Api::namespaced(rig.client.clone(), &rig.namespace);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("switchyard".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .patch("switchyard", &apply, &Patch::Apply(&account))
        .await
        .expect("service account");
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(rig.client.clone())
        .patch(&name, &apply, &Patch::Apply(&cluster_role(&name)))
        .await
        .expect("cluster role");
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "switchyard".into(),
            namespace: Some(rig.namespace.clone()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(rig.client.clone())
        .patch(&name, &apply, &Patch::Apply(&binding))
        .await
        .expect("binding");

    // A kubeconfig that is the admin one with the ServiceAccount's token instead.
    let token = rig
        .api
        .kubectl_ok([
            "create",
            "token",
            "switchyard",
            "-n",
            &rig.namespace,
            "--duration",
            "1h",
        ])
        .await;
    let admin = rig
        .api
        .token
        .clone()
        .expect("a local apiserver with an admin token");
    let text = std::fs::read_to_string(&rig.api.kubeconfig).expect("kubeconfig");
    assert!(text.contains(&admin));
    let kubeconfig = rig.work.join("switchyard-sa.kubeconfig");
    std::fs::write(&kubeconfig, text.replace(&admin, token.trim())).expect("write kubeconfig");

    let lease = format!("switchyard-{}", rig.namespace);
    let operator = Switchyard::start_operator(
        &rig.work,
        "switchyard-sa",
        &kubeconfig,
        &format!("{FLEET_NAMESPACE}/{}", rig.fleet_service()),
        rig.ports,
        &["--namespaces", &rig.namespace, "--lease-name", &lease],
    );
    let _envoys: Vec<Envoy> = rig
        .envoy_addresses
        .iter()
        .enumerate()
        .map(|(i, a)| {
            Envoy::start(
                &rig.work,
                &format!("envoy-sa-{i}"),
                a,
                operator.xds_port,
                Protocol::Delta,
            )
        })
        .collect();
    rig.operators.push(operator);
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("blue", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    rig.apply_route("web", &Rig::route_yaml(HOST, &[("green", 1)]))
        .await;
    rig.wait_ready("web", Duration::from_secs(30)).await;
    assert_eq!(rig.answers().await, ["green", "green"]);
    let log = std::fs::read_to_string(&rig.operators[0].process.log).unwrap_or_default();
    let denied: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("code: 403") || l.contains("forbidden") || l.contains("Forbidden"))
        .collect();
    assert!(
        denied.is_empty(),
        "the operator was denied something:\n{}",
        denied.join("\n")
    );
}
