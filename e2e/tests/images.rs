//! The node tests run the operator from `localhost/switchyard:rig`, made by e2e/images.sh
//! without a container daemon. Users build the `Dockerfile`. This test keeps the two the
//! same where it matters: the user, the ports, the entrypoint and command, the binary's
//! path, and a base with nothing but the C runtime, CA certificates and users.

use std::path::PathBuf;
use std::process::Command;

fn images_dir() -> PathBuf {
    switchyard_e2e::kube::cache_bin_dir()
        .parent()
        .expect("the cache folder")
        .join("images")
}

/// `tar -xOf ARCHIVE MEMBER`: a member's bytes.
fn member(archive: &std::path::Path, name: &str) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(name)
        .output()
        .expect("run tar");
    assert!(
        out.status.success(),
        "tar -xOf {} {name}: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The instructions of the Dockerfile's last stage, as (INSTRUCTION, rest) pairs.
fn final_stage() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Dockerfile"))
        .expect("read the Dockerfile");
    let mut stage = Vec::new();
    let mut joined = String::new();
    for line in text.lines() {
        let line = line.trim_end();
        if line.trim_start().starts_with('#') {
            continue;
        }
        joined.push_str(line.trim_end_matches('\\'));
        if line.ends_with('\\') {
            joined.push(' ');
            continue;
        }
        let instruction = std::mem::take(&mut joined);
        let instruction = instruction.trim();
        if instruction.is_empty() {
            continue;
        }
        let (word, rest) = instruction.split_once(' ').unwrap_or((instruction, ""));
        if word.eq_ignore_ascii_case("FROM") {
            stage.clear();
        }
        stage.push((word.to_uppercase(), rest.trim().to_string()));
    }
    stage
}

fn json_words(rest: &str) -> Vec<String> {
    serde_json::from_str(rest).unwrap_or_else(|e| panic!("not an exec-form list: {rest}: {e}"))
}

#[test]
fn the_rig_operator_image_holds_what_the_dockerfile_final_stage_holds() {
    let archive = images_dir().join("switchyard.tar");
    assert!(
        archive.exists(),
        "no {}: run e2e/images.sh",
        archive.display()
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&member(&archive, "./manifest.json")).expect("manifest.json");
    let config_name = manifest[0]["Config"].as_str().expect("a config");
    let config: serde_json::Value =
        serde_json::from_slice(&member(&archive, &format!("./{config_name}"))).expect("config");
    let config = &config["config"];

    let stage = final_stage();
    let get = |word: &str| -> Vec<&String> {
        stage
            .iter()
            .filter(|(w, _)| w == word)
            .map(|(_, r)| r)
            .collect()
    };
    let user = get("USER");
    assert_eq!(config["User"].as_str(), user.last().map(|u| u.as_str()));
    let entrypoint = json_words(get("ENTRYPOINT").last().expect("an ENTRYPOINT"));
    assert_eq!(config["Entrypoint"], serde_json::json!(entrypoint));
    let cmd = json_words(get("CMD").last().expect("a CMD"));
    assert_eq!(config["Cmd"], serde_json::json!(cmd));
    let mut exposed: Vec<String> = get("EXPOSE")
        .iter()
        .flat_map(|r| r.split_whitespace())
        .map(|p| format!("{p}/tcp"))
        .collect();
    exposed.sort();
    let mut image_ports: Vec<String> = config["ExposedPorts"]
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    image_ports.sort();
    assert_eq!(image_ports, exposed);
    let copy = get("COPY");
    let binary = copy
        .iter()
        .find_map(|r| r.split_whitespace().last())
        .expect("a COPY of the binary");

    // The layer: the binary where the Dockerfile puts it; otherwise only the base.
    let layer = manifest[0]["Layers"][0].as_str().expect("a layer");
    let listing = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "tar -xOf '{}' './{layer}' | tar -t",
            archive.display()
        ))
        .output()
        .expect("list the layer");
    let files = String::from_utf8_lossy(&listing.stdout);
    let files: Vec<&str> = files
        .lines()
        .map(|f| f.trim_start_matches("./"))
        .filter(|f| !f.is_empty() && !f.ends_with('/'))
        .collect();
    assert!(
        files.contains(&binary.trim_start_matches('/')),
        "{binary} is not in the image: {files:?}"
    );
    for file in &files {
        let allowed = *file == binary.trim_start_matches('/')
            || file.starts_with("lib/")
            || file.starts_with("lib64/")
            || file.starts_with("usr/lib/")
            || [
                "etc/passwd",
                "etc/group",
                "etc/nsswitch.conf",
                "etc/hosts",
                "etc/resolv.conf",
                "etc/hostname",
                "etc/ssl/certs/ca-certificates.crt",
            ]
            .contains(file);
        assert!(
            allowed,
            "the image holds {file}, which the base has no place for"
        );
    }
    let passwd =
        String::from_utf8_lossy(&member_of_layer(&archive, layer, "./etc/passwd")).into_owned();
    assert!(
        passwd.contains(":65532:65532:"),
        "no user 65532 in /etc/passwd: {passwd}"
    );
}

fn member_of_layer(archive: &std::path::Path, layer: &str, name: &str) -> Vec<u8> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "tar -xOf '{}' './{layer}' | tar -xO '{name}'",
            archive.display()
        ))
        .output()
        .expect("read from the layer");
    assert!(out.status.success(), "no {name} in the layer");
    out.stdout
}
