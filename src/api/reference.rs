//! A Markdown reference of the CRDs, generated from their OpenAPI schemas, so the docs say
//! exactly what the API server enforces.

use std::fmt::Write;

use kube::CustomResourceExt;
use serde_json::Value;

use super::{ProxyConfig, TrafficRoute};

pub fn markdown() -> String {
    let mut out = String::from(
        "# CRD reference\n\nGenerated from the CRD schemas (`UPDATE_CRD_DOCS=1 cargo test --test crds`); do not edit.\n",
    );
    for crd in [TrafficRoute::crd(), ProxyConfig::crd()] {
        let Some(version) = crd.spec.versions.first() else {
            continue;
        };
        let _ = write!(
            out,
            "\n## {} ({}/{})\n\n",
            crd.spec.names.kind, crd.spec.group, version.name
        );
        let schema = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| serde_json::to_value(s).ok())
            .unwrap_or(Value::Null);
        out.push_str(
            "| field | type | required | description | validation |\n|---|---|---|---|---|\n",
        );
        for part in ["spec", "status"] {
            if let Some(node) = schema["properties"].get(part) {
                let required = schema["required"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|v| v == part));
                rows(&mut out, part, node, required);
            }
        }
    }
    out
}

fn rows(out: &mut String, path: &str, node: &Value, required: bool) {
    let kind = match node["type"].as_str() {
        Some("array") => format!("[]{}", node["items"]["type"].as_str().unwrap_or("object")),
        Some(t) => t.to_string(),
        None if node.get("anyOf").is_some() || node.get("x-kubernetes-int-or-string").is_some() => {
            "int or string".into()
        }
        None => "object".into(),
    };
    let mut rules = Vec::new();
    for key in [
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "pattern",
        "enum",
    ] {
        if let Some(v) = node.get(key).or_else(|| node["items"].get(key)) {
            rules.push(format!("{key} {}", v.to_string().replace('|', "\\|")));
        }
    }
    for rule in node["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(message) = rule["message"].as_str() {
            rules.push(message.replace('|', "\\|"));
        }
    }
    let description = node["description"]
        .as_str()
        .unwrap_or("")
        .replace('\n', " ")
        .replace('|', "\\|");
    let _ = writeln!(
        out,
        "| `{path}` | {kind} | {} | {description} | {} |",
        if required { "yes" } else { "" },
        rules.join("; ")
    );
    let (properties, required_list, prefix) = if node["type"] == "array" {
        (
            &node["items"]["properties"],
            &node["items"]["required"],
            format!("{path}[]"),
        )
    } else {
        (&node["properties"], &node["required"], path.to_string())
    };
    if let Some(map) = properties.as_object() {
        for (name, child) in map {
            let required = required_list
                .as_array()
                .is_some_and(|r| r.iter().any(|v| v == name.as_str()));
            rows(out, &format!("{prefix}.{name}"), child, required);
        }
    }
}
