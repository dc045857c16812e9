//! Standalone configuration files: the example directory loads cleanly, and bad files are
//! reported with file and line.

use std::path::Path;

use switchyard::standalone::{LoadError, build::build, load_dir};

#[test]
fn example_directory_loads_and_resolves_without_problems() {
    let loaded = load_dir(Path::new("examples/standalone")).expect("example loads");
    let resolved = build(&loaded.file, &loaded.secrets, "token");
    assert!(resolved.problems.is_empty(), "{:?}", resolved.problems);
    let config = resolved.config;
    assert_eq!(config.virtual_hosts.len(), 1);
    let names: Vec<_> = config.clusters.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["default/shop-v1/8081", "default/shop-v2/8082"]);
    let translation = switchyard::translate::translate(&config);
    assert!(
        translation.problems.is_empty(),
        "{:?}",
        translation.problems
    );
}

#[test]
fn parse_errors_name_the_file_and_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("routes.yaml"),
        "routes:\n  - name: shop\n    spec:\n      hosts: [a.test]\n      colour: blue\n      rules: []\n",
    )
    .expect("write");
    let err = load_dir(dir.path()).expect_err("unknown field");
    match &err {
        LoadError::Parse { path, line, .. } => {
            assert!(path.ends_with("routes.yaml"));
            assert_eq!(*line, 5, "{err}");
        }
        other => panic!("expected a parse error, got {other}"),
    }
    assert!(err.to_string().contains("routes.yaml:5:"), "{err}");
}

#[test]
fn a_bad_route_is_left_out_and_the_others_stay() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("routes.yaml"),
        r#"
routes:
  - name: good
    spec:
      hosts: [good.test]
      rules: [ { backends: [ { service: app, port: 80 } ] } ]
  - name: bad
    spec:
      hosts: [bad.test]
      rules: [ { backends: [ { service: missing, port: 80 } ] } ]
services:
  - name: app
    endpoints: [ { address: 127.0.0.1, port: 80 } ]
"#,
    )
    .expect("write");
    let loaded = load_dir(dir.path()).expect("loads");
    let resolved = build(&loaded.file, &loaded.secrets, "token");
    assert_eq!(
        resolved.problems,
        ["route default/bad: Service \"missing\" does not exist in the route's namespace"]
    );
    assert_eq!(resolved.config.virtual_hosts.len(), 1);
    assert_eq!(resolved.config.virtual_hosts[0].name, "default/good");
}

#[test]
fn duplicate_routes_across_files_are_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let route = "routes:\n  - { name: shop, spec: { hosts: [a.test], rules: [] } }\n";
    std::fs::write(dir.path().join("a.yaml"), route).expect("write");
    std::fs::write(dir.path().join("b.yaml"), route).expect("write");
    let err = load_dir(dir.path()).expect_err("duplicate");
    assert!(
        err.to_string()
            .contains("b.yaml: route default/shop is defined twice"),
        "{err}"
    );
}
