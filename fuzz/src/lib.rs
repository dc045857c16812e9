//! What the fuzz targets share: inputs turned into snapshots the way Switchyard turns
//! them, and the checks every snapshot must pass.

use std::path::Path;

use switchyard::standalone::build;
use switchyard::standalone::file::{File, FileRoute, RouteSpec};
use switchyard_core::model::Config;
use switchyard_core::translate::{Translator, check_consistency, translate};

/// Translates `config` as the builders do and checks the snapshot: consistent (every name
/// a resource refers to exists), the same from scratch as after another configuration
/// (the incremental translator's promise), and the same twice (I6).
pub fn translate_and_check(config: &Config, before: &Config) {
    let full = translate(config);
    if let Err(errors) = check_consistency(&full.snapshot) {
        panic!("inconsistent snapshot:\n{errors}\nfrom {config:#?}");
    }
    let mut translator = Translator::new();
    translator.update(before);
    let incremental = translator.update(config);
    assert_eq!(
        incremental.snapshot.version(),
        full.snapshot.version(),
        "incremental translation differs from a full one for {config:#?}"
    );
    assert_eq!(
        translate(config).snapshot.version(),
        full.snapshot.version()
    );
}

/// The services the route specs of [`route_file`] can name.
const SERVICES: &str = r#"
services:
  - name: blue
    endpoints: [ { address: 127.0.0.1, port: 8081 }, { address: 127.0.0.2, port: 8081, ready: false } ]
  - name: green
    http2: true
    endpoints: [ { address: 127.0.0.3, port: 8082 } ]
  - { name: empty }
"#;

/// A standalone file of the fixed services and one route per spec.
pub fn route_file(specs: Vec<RouteSpec>) -> File {
    let mut file = match switchyard::standalone::parse(Path::new("services.yaml"), SERVICES) {
        Ok(file) => file,
        Err(e) => panic!("the fuzz services do not parse: {e}"),
    };
    file.routes = specs
        .into_iter()
        .enumerate()
        .map(|(i, spec)| FileRoute {
            name: format!("route-{i}"),
            namespace: "default".into(),
            spec,
        })
        .collect();
    file
}

/// The model of a standalone file, as the standalone watcher builds it (no secrets).
pub fn model_of(file: &File) -> Config {
    build::build(file, &[], "token").config
}
