//! `switchyard translate`, as a user runs it: each case of `tests/golden/cli/<case>/` runs
//! the binary with the arguments in `args.txt` (paths from the repository root) and gives
//! exactly `stdout.txt`, and `stderr.txt` (the problems, then the exit status).
//! `UPDATE_GOLDEN=1` rewrites them.

use std::process::Command;

use switchyard_e2e::golden;

const STAGE: &str = "cli";

#[test]
fn translate_prints_what_would_be_served_and_the_problems() {
    let cases = golden::cases(STAGE);
    assert!(cases.len() >= 3, "{cases:?}");
    for case in cases {
        let dir = golden::stage_dir(STAGE).join(&case);
        let args = std::fs::read_to_string(dir.join("args.txt")).expect("args.txt");
        let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .arg("translate")
            .args(args.split_whitespace())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("RUST_BACKTRACE")
            .output()
            .expect("switchyard translate runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = format!(
            "{}exit {}\n",
            String::from_utf8_lossy(&out.stderr),
            out.status.code().unwrap_or(-1)
        );
        golden::check(&dir.join("stdout.txt"), &stdout);
        golden::check(&dir.join("stderr.txt"), &stderr);
    }
}
