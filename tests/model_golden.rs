//! Golden tests of the stage before translation, the model, from each front-end:
//! - `tests/golden/model/<case>/input.yaml`: ProxyConfigs, EndpointSlices and TLS Secrets,
//!   as the API server holds them, give exactly `model.yaml`;
//! - `tests/golden/standalone/<case>/files/`: a standalone configuration directory gives
//!   exactly `model.yaml` (the case `example` reads `examples/standalone`).
//!
//! Each `model.yaml` lists what was left out, then the model. `UPDATE_GOLDEN=1` rewrites.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::Serialize;
use switchyard::api::ProxyConfig;
use switchyard::k8s::to_model::{Inputs, TlsData, build};
use switchyard::model::{Config, ListenerSettings};
use switchyard::standalone::{build::build as build_files, load_dir};
use switchyard_e2e::golden;

#[derive(Serialize)]
struct Golden<'a> {
    left_out: Vec<String>,
    model: &'a Config,
}

fn listeners() -> ListenerSettings {
    ListenerSettings {
        probe_token: "golden-token".into(),
        ..ListenerSettings::default()
    }
}

/// A TLS Secret's content as the builder gets it (its PEM checks are tested elsewhere).
fn tls_data(secret: &Secret) -> Option<((String, String), TlsData)> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| {
        data.get(key)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    let key = (
        secret.metadata.namespace.clone().unwrap_or_default(),
        secret.metadata.name.clone().unwrap_or_default(),
    );
    Some((
        key,
        TlsData {
            certificate_chain: text("tls.crt")?,
            private_key: text("tls.key")?,
        },
    ))
}

fn kubernetes_case(dir: &Path) -> String {
    let docs = golden::documents(&dir.join("input.yaml"));
    let proxy_configs: Vec<ProxyConfig> = golden::of_kind(&docs, "ProxyConfig");
    let slices: Vec<EndpointSlice> = golden::of_kind(&docs, "EndpointSlice");
    let secrets: Vec<Secret> = golden::of_kind(&docs, "Secret");
    let secrets: BTreeMap<_, _> = secrets.iter().filter_map(tls_data).collect();
    let (model, problems) = build(&Inputs {
        listeners: listeners(),
        proxy_configs: proxy_configs.iter().collect(),
        endpoint_slices: slices.iter().collect(),
        secrets: &secrets,
    });
    golden::to_yaml(&Golden {
        left_out: problems.iter().map(|p| p.to_string()).collect(),
        model: &model,
    })
}

fn standalone_case(files: &Path) -> String {
    let loaded =
        load_dir(files).unwrap_or_else(|e| panic!("{}: does not load: {e}", files.display()));
    let built = build_files(&loaded.file, &loaded.secrets, "golden-token");
    golden::to_yaml(&Golden {
        left_out: built.problems,
        model: &built.config,
    })
}

fn standalone_files(case: &str) -> PathBuf {
    if case == "example" {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/standalone")
    } else {
        golden::stage_dir("standalone").join(case).join("files")
    }
}

#[test]
fn kubernetes_objects_lower_as_the_golden_files_say() {
    let cases = golden::cases("model");
    assert!(!cases.is_empty());
    for case in cases {
        let dir = golden::stage_dir("model").join(&case);
        golden::check(&dir.join("model.yaml"), &kubernetes_case(&dir));
    }
}

#[test]
fn standalone_files_lower_as_the_golden_files_say() {
    let cases = golden::cases("standalone");
    assert!(cases.contains(&"example".to_owned()));
    for case in cases {
        let dir = golden::stage_dir("standalone").join(&case);
        golden::check(
            &dir.join("model.yaml"),
            &standalone_case(&standalone_files(&case)),
        );
    }
}
