//! The bytes one Envoy receives per change, held to a record: they are deterministic (the
//! same seeded configuration, the same changes, one client at a time), and a code change
//! that makes a route change cost ten times the bytes would pass every other test. At
//! 1000 routes (`switchyard-bench` measures 10k; docs/benchmarks.md, "Bytes"), for a SotW
//! client, a delta client and a delta client served virtual hosts one by one.
//!
//! A figure more than 1 % off its record fails, either way: a regression must be fixed,
//! and a gain must be recorded, with `UPDATE_BYTES=1 cargo test -p switchyard-e2e --test
//! change_bytes`, so that the record stays what the code does.

use switchyard_e2e::change_bytes::{BytesResult, measure_bytes};

const RECORD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/testdata/change-bytes-1000.json"
);
const ROUTES: usize = 1000;
/// How far a figure may be off its record.
const TOLERANCE: f64 = 0.01;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bytes_of_a_change_stay_as_recorded() {
    let measured = measure_bytes(ROUTES).await.expect("measure the bytes");
    if std::env::var_os("UPDATE_BYTES").is_some() {
        let json = serde_json::to_string_pretty(&measured).expect("JSON");
        std::fs::write(RECORD, format!("{json}\n")).expect("write the record");
        return;
    }
    let recorded: Vec<BytesResult> =
        serde_json::from_str(&std::fs::read_to_string(RECORD).expect("the record"))
            .expect("the record's JSON");
    let mut off = Vec::new();
    for r in &recorded {
        let m = measured
            .iter()
            .find(|m| (&m.change, &m.protocol) == (&r.change, &r.protocol));
        let Some(m) = m else {
            off.push(format!("{} / {}: not measured", r.change, r.protocol));
            continue;
        };
        let ratio = m.total_bytes as f64 / r.total_bytes.max(1) as f64;
        if (ratio - 1.0).abs() > TOLERANCE {
            off.push(format!(
                "{} / {}: {} bytes in {} responses, recorded {} in {} ({:+.1} %)",
                r.change,
                r.protocol,
                m.total_bytes,
                m.responses,
                r.total_bytes,
                r.responses,
                (ratio - 1.0) * 100.0
            ));
        }
    }
    assert!(
        off.is_empty() && measured.len() == recorded.len(),
        "bytes per change differ from {RECORD} (UPDATE_BYTES=1 records what the code does now):\n{}",
        off.join("\n")
    );
}
