//! The instructions one full translation takes, held to a record: a figure a code change
//! can lose without any other test noticing, and one that, unlike time, does not move
//! with the machine's load (callgrind counts instructions: two runs differ by 0.02 %).
//! `switchyard-bench --translate-once 1000` (the synthetic configuration of seed 42)
//! under `valgrind --tool=callgrind --toggle-collect='*translate*'`, in the build the
//! tests run (the record is the debug build's; docs/benchmarks.md gives release figures).
//!
//! A count more than 2 % off its record fails, either way: a regression must be fixed,
//! and a gain recorded, with `UPDATE_INSTRUCTIONS=1 cargo test -p switchyard-e2e --test
//! translation_instructions`.

use std::process::Command;

use switchyard_e2e::record::recorded_or_update;

const RECORD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/testdata/translation-instructions-1000.json"
);
const ROUTES: &str = "1000";
const TOLERANCE: f64 = 0.02;

/// Instructions collected inside the translation, as callgrind counts them.
fn measure() -> u64 {
    let out_file = tempfile::NamedTempFile::new().expect("a temporary file");
    let out = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.path().display()))
        .arg("--toggle-collect=*translate*")
        .arg(env!("CARGO_BIN_EXE_switchyard-bench"))
        .args(["--translate-once", ROUTES])
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run valgrind ({e}): install Debian's valgrind (e2e/provision.sh does, with the node packages)")
        });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "valgrind failed: {stderr}");
    stderr
        .lines()
        .find_map(|l| l.split("Collected :").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no instruction count in callgrind's output: {stderr}"))
}

#[test]
fn a_translation_takes_the_instructions_recorded() {
    if !cfg!(debug_assertions) {
        eprintln!("the record is the debug build's: nothing to compare in this build");
        return;
    }
    let measured = measure();
    let record = serde_json::json!({ "routes": 1000, "build": "debug", "instructions": measured });
    let Some(recorded) = recorded_or_update(RECORD, "UPDATE_INSTRUCTIONS", record, "instructions")
    else {
        return;
    };
    let ratio = measured as f64 / recorded;
    assert!(
        (ratio - 1.0).abs() <= TOLERANCE,
        "a translation of {ROUTES} routes took {measured} instructions, recorded {recorded} \
         ({:+.1} %) in {RECORD}: fix a regression; record a gain with UPDATE_INSTRUCTIONS=1",
        (ratio - 1.0) * 100.0
    );
}
