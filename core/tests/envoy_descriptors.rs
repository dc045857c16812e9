//! `src/translate/envoy_descriptors.bin` is generated: the part of envoy-types' own
//! FileDescriptorSet (`src/generated/types.bin`, which the crate ships but does not expose)
//! that the JSON printer needs. Regenerating must change nothing, so that an upgrade of
//! envoy-types, or a new type packed into an `Any`, fails here until the file is
//! rewritten: `UPDATE_ENVOY_DESCRIPTORS=1 cargo test -p switchyard-core --test
//! envoy_descriptors`, then review and commit.
//!
//! The subset: the files that define `envoy_json::root_types()`, and every file they import,
//! transitively (a descriptor pool needs them all), with their options (the printer finds
//! the sensitive fields there), without their source code info (comments and line numbers,
//! which the printer does not use).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage};
use switchyard_core::translate::envoy_json;

/// The envoy-types this workspace builds with: its directory, from `cargo metadata` (the
/// version in Cargo.lock, wherever the registry keeps it).
fn envoy_types_dir() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--manifest-path",
        ])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo metadata: {e}"));
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let manifests: Vec<&str> = packages
        .iter()
        .filter(|p| p["name"] == "envoy-types")
        .filter_map(|p| p["manifest_path"].as_str())
        .collect();
    assert_eq!(
        manifests.len(),
        1,
        "one envoy-types in the tree: {manifests:?}"
    );
    Path::new(manifests[0])
        .parent()
        .expect("a manifest is in a directory")
        .to_path_buf()
}

fn subset(full: &DescriptorPool) -> Vec<u8> {
    let mut keep = BTreeSet::new();
    let mut todo: Vec<_> = envoy_json::root_types()
        .iter()
        .map(|name| {
            full.get_message_by_name(name)
                .unwrap_or_else(|| panic!("envoy-types has no {name}"))
                .parent_file()
        })
        .collect();
    while let Some(file) = todo.pop() {
        if keep.insert(file.name().to_owned()) {
            todo.extend(file.dependencies());
        }
    }
    // Each file as the pool encodes it, with its options' extensions (the printer reads
    // `(udpa.annotations.sensitive)`; prost-types' FileDescriptorProto would drop them),
    // and without its source code info, through a dynamic message that keeps them.
    let file_proto = full
        .get_message_by_name("google.protobuf.FileDescriptorProto")
        .expect("descriptor.proto is among envoy-types' files");
    let mut set = Vec::new();
    // The pool's order, in which every file comes after the files it imports.
    for file in full.files().filter(|f| keep.contains(f.name())) {
        let mut proto = DynamicMessage::decode(file_proto.clone(), file.encode_to_vec().as_slice())
            .expect("a file descriptor decodes");
        proto.clear_field_by_name("source_code_info");
        prost::encoding::bytes::encode(1, &proto.encode_to_vec(), &mut set);
    }
    set
}

#[test]
fn envoy_descriptors_are_the_subset_of_envoy_types() {
    let source = envoy_types_dir().join("src/generated/types.bin");
    let full =
        std::fs::read(&source).unwrap_or_else(|e| panic!("cannot read {}: {e}", source.display()));
    let full = DescriptorPool::decode(full.as_slice()).expect("envoy-types' descriptors");
    let generated = subset(&full);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/translate/envoy_descriptors.bin");
    if std::env::var_os("UPDATE_ENVOY_DESCRIPTORS").is_some() {
        std::fs::write(&path, &generated)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }
    let on_disk = std::fs::read(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "{} is stale ({} bytes, {} generated from {}); run \
         `UPDATE_ENVOY_DESCRIPTORS=1 cargo test -p switchyard-core --test envoy_descriptors` \
         and commit",
        path.display(),
        on_disk.len(),
        generated.len(),
        source.display()
    );
}
