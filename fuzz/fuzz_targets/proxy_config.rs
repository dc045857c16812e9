//! ProxyConfig specs (JSON), as the snapshot builder of every replica takes them from the
//! API server, into the model and a consistent snapshot: whatever a leader (of any version)
//! wrote, a builder must never panic on it.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use switchyard::api::{ProxyConfig, ProxyConfigSpec};
use switchyard::k8s::to_model::{Inputs, build};
use switchyard_core::model::ListenerSettings;
use switchyard_fuzz::translate_and_check;

fuzz_target!(|data: &[u8]| {
    let Ok(specs) = serde_json::from_slice::<Vec<ProxyConfigSpec>>(data) else {
        return;
    };
    let pcs: Vec<ProxyConfig> = specs
        .into_iter()
        .enumerate()
        .map(|(i, spec)| {
            let mut pc = ProxyConfig::new(&format!("pc-{i}"), spec);
            pc.metadata.namespace = Some("shop".into());
            pc
        })
        .collect();
    let secrets = BTreeMap::new();
    let model = |pcs: &[ProxyConfig]| {
        build(&Inputs {
            listeners: ListenerSettings::default(),
            proxy_configs: pcs.iter().collect(),
            endpoint_slices: Vec::new(),
            secrets: &secrets,
        })
        .0
    };
    let before = model(&pcs[..pcs.len().min(1)]);
    translate_and_check(&model(&pcs), &before);
});
