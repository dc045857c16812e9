//! Figures held to a record in `e2e/testdata`: stable enough (bytes, instructions, a
//! peak taken over the same work) that a code change moving them is worth a look, and
//! recorded anew, by setting the test's update variable, when the change is a gain.

use serde_json::Value;

/// With `update_var` set, writes `record` to `path` and returns None: nothing to compare.
/// Otherwise the figure `field` of the record at `path`.
pub fn recorded_or_update(path: &str, update_var: &str, record: Value, field: &str) -> Option<f64> {
    if std::env::var_os(update_var).is_some() {
        let json = serde_json::to_string_pretty(&record).expect("JSON");
        std::fs::write(path, format!("{json}\n"))
            .unwrap_or_else(|e| panic!("write the record {path}: {e}"));
        return None;
    }
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("the record {path}: {e}"));
    let recorded: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("the record {path}: {e}"));
    let figure = recorded[field].as_f64();
    Some(figure.unwrap_or_else(|| panic!("no figure {field} in the record {path}")))
}
