use super::*;

fn owner(uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "switchyard.dev/v1alpha1".into(),
        kind: "TrafficRoute".into(),
        name: format!("route-{uid}"),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn unit_config(name: &str, owner_uid: &str, rules: usize) -> ProxyConfig {
    let rules: Vec<serde_json::Value> = (0..rules)
        .map(|i| serde_json::json!({ "name": format!("rule-{i}"), "match": { "pathPrefix": format!("/{i}") } }))
        .collect();
    let spec: ProxyConfigSpec = serde_json::from_value(serde_json::json!({
        "role": "probe", "route": name, "generation": 1, "version": format!("p-{name}"),
        "clusters": [],
        "virtualHost": { "hosts": [format!("{name}.test")], "rules": rules },
    }))
    .expect("spec");
    let mut pc = ProxyConfig::new(&format!("{name}-probe"), spec);
    pc.metadata.namespace = Some("shop".into());
    pc.metadata.owner_references = Some(vec![owner(owner_uid)]);
    pc.metadata.labels = Some([("switchyard.dev/route".to_owned(), name.to_owned())].into());
    pc.metadata.annotations =
        Some([(PROMOTED_AT.to_owned(), "2026-12-07T06:00:00Z".into())].into());
    pc
}

#[test]
fn a_batch_carries_each_member_as_its_own_object_would_and_every_owner_once() {
    let configs = [
        unit_config("web", "u1", 1),
        unit_config("api", "u2", 1),
        unit_config("api2", "u2", 1),
    ];
    let members: Vec<BatchMember> = configs.iter().map(member).collect();
    let batch = batch_object(ProxyConfigRole::Probe, members);
    assert_eq!(batch.metadata.name, None);
    assert_eq!(
        batch.metadata.generate_name.as_deref(),
        Some("batch-probe-")
    );
    assert_eq!(batch.labels()[BATCH_LABEL], "probe");
    let owners = batch.owner_references();
    let uids: Vec<&str> = owners.iter().map(|o| o.uid.as_str()).collect();
    assert_eq!(uids, ["u1", "u2"]);
    // An object has one controller at most: the batch is no one's.
    assert!(owners.iter().all(|o| o.controller.is_none()));
    // Each member, as the watch shows it, is the object the unit would have had.
    let mut created = batch.clone();
    created.metadata.name = Some("batch-probe-x7k2p".into());
    created.metadata.namespace = Some("shop".into());
    created.metadata.uid = Some("b-uid".into());
    for (own, member) in configs.iter().zip(&created.spec.members) {
        let shown = member_object(&created, member);
        assert_eq!(shown.name_any(), own.name_any());
        assert_eq!(shown.namespace(), own.namespace());
        assert_eq!(shown.spec, own.spec);
        assert_eq!(shown.labels(), own.labels());
        assert_eq!(shown.owner_references(), own.owner_references());
        assert_eq!(
            shown.annotations()[PROMOTED_AT],
            own.annotations()[PROMOTED_AT]
        );
    }
}

#[test]
fn batches_hold_members_up_to_their_size_and_one_larger_alone() {
    let entries = |sizes: &[usize]| -> Vec<(ProxyConfig, Reply)> {
        let configs =
            (sizes.iter().enumerate()).map(|(i, rules)| unit_config(&format!("r{i}"), "u", *rules));
        configs.map(|pc| (pc, oneshot::channel().0)).collect()
    };
    let one = serde_json::to_vec(&member(&unit_config("r0", "u", 1)))
        .expect("member")
        .len();
    // Three fit, the fourth starts a second batch.
    let chunked = chunks(entries(&[1, 1, 1, 1]), 3 * one + one / 2);
    let counts: Vec<usize> = chunked.iter().map(Vec::len).collect();
    assert_eq!(counts, [3, 1]);
    // One larger than a batch may be goes alone, between the others.
    let chunked = chunks(entries(&[1, 400, 1]), 3 * one);
    let names: Vec<Vec<String>> = (chunked.iter())
        .map(|c| c.iter().map(|(pc, _)| pc.name_any()).collect())
        .collect();
    assert_eq!(names, [["r0-probe"], ["r1-probe"], ["r2-probe"]]);
}
