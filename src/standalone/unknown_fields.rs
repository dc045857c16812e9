//! Unknown fields in standalone files, with where they are. The route vocabulary denies
//! no unknown fields (an older replica must read what a newer CRD allows); a file written
//! by hand, though, deserves to hear about a misspelt key. So the document is walked against the JSON schema of
//! [`File`](super::file::File), the schema the types derive.

use schemars::Schema;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use serde_saphyr::Spanned;

/// A key that no type of the format knows: its path (`routes[0].rules[1].matchh`), line
/// and column.
#[derive(Debug, PartialEq, Eq)]
pub struct UnknownField {
    pub path: String,
    pub line: u64,
    pub column: u64,
}

/// The first unknown field of `text`, a YAML document that already deserialized into
/// the type whose schema is `schema`.
pub fn first_unknown(text: &str, schema: &Schema) -> Option<UnknownField> {
    let node: Spanned<Node> = serde_saphyr::from_str(text).ok()?;
    let root = schema.as_value();
    let defs = root
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    Walk { defs: &defs }.node(&node, root, String::new())
}

/// A YAML document as a tree; each node knows where it starts.
enum Node {
    Map(Vec<(Spanned<String>, Spanned<Node>)>),
    Seq(Vec<Spanned<Node>>),
    Scalar,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Node::Map(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_str<E>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        Node::deserialize(deserializer)
    }
}

struct Walk<'a> {
    defs: &'a Map<String, Value>,
}

/// What a schema says of an object: its properties, and whether other keys are allowed
/// (a map's `additionalProperties`, with the schema of its values).
#[derive(Default)]
struct Shape<'a> {
    properties: Vec<(&'a str, &'a Value)>,
    items: Vec<&'a Value>,
    additional: Option<&'a Value>,
    open: bool,
}

impl<'a> Walk<'a> {
    fn node(&self, node: &Spanned<Node>, schema: &'a Value, path: String) -> Option<UnknownField> {
        let mut shape = Shape::default();
        self.shape(schema, &mut shape, 0);
        match &node.value {
            Node::Map(entries) => {
                if shape.open {
                    return None;
                }
                for (key, value) in entries {
                    let child = join(&path, &key.value);
                    let known = shape
                        .properties
                        .iter()
                        .find(|(name, _)| *name == key.value)
                        .map(|(_, s)| *s)
                        .or(shape.additional);
                    match known {
                        Some(schema) => {
                            if let Some(found) = self.node(value, schema, child) {
                                return Some(found);
                            }
                        }
                        None => {
                            return Some(UnknownField {
                                path: child,
                                line: key.referenced.line(),
                                column: key.referenced.column(),
                            });
                        }
                    }
                }
                None
            }
            Node::Seq(items) => {
                let schema = shape.items.first()?;
                items
                    .iter()
                    .enumerate()
                    .find_map(|(i, item)| self.node(item, schema, format!("{path}[{i}]")))
            }
            Node::Scalar => None,
        }
    }

    /// Collects what `schema` allows, through `$ref`, `allOf`, `anyOf` and `oneOf`.
    fn shape(&self, schema: &'a Value, shape: &mut Shape<'a>, depth: usize) {
        let Some(object) = schema.as_object() else {
            // `true`: anything goes.
            shape.open |= schema.as_bool() == Some(true);
            return;
        };
        if depth > 32 {
            shape.open = true;
            return;
        }
        if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
            match reference
                .strip_prefix("#/$defs/")
                .and_then(|name| self.defs.get(name))
            {
                Some(target) => self.shape(target, shape, depth + 1),
                None => shape.open = true,
            }
        }
        for key in ["allOf", "anyOf", "oneOf"] {
            for sub in object
                .get(key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                self.shape(sub, shape, depth + 1);
            }
        }
        if let Some(properties) = object.get("properties").and_then(Value::as_object) {
            shape
                .properties
                .extend(properties.iter().map(|(k, v)| (k.as_str(), v)));
        }
        match object.get("additionalProperties") {
            Some(Value::Bool(false)) | None => {}
            Some(Value::Bool(true)) => shape.open = true,
            Some(values) => shape.additional = Some(values),
        }
        if let Some(items) = object.get("items") {
            shape.items.push(items);
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::standalone::file::File;

    fn unknown(text: &str) -> Option<UnknownField> {
        first_unknown(text, &schemars::schema_for!(File))
    }

    #[test]
    fn known_fields_pass_at_every_depth() {
        let text = "routes:\n  - name: a\n    spec:\n      hosts: [a.test]\n      tls: { secretName: c }\n      rules:\n        - match: { pathPrefix: /, headers: [ { name: x, present: true } ] }\n          backends: [ { service: s, port: 80 } ]\n          timeout: 1s\n          retries: { attempts: 1, on: [5xx] }\n          responseHeaders: { set: { x-any-name: v } }\nservices:\n  - { name: s, endpoints: [ { address: 127.0.0.1, port: 80 } ] }\n";
        assert_eq!(unknown(text), None);
    }

    #[test]
    fn an_unknown_key_is_found_with_its_line_inside_the_route_spec() {
        let route = "routes:\n  - name: a\n    spec:\n      hosts: [a.test]\n      colour: blue\n";
        assert_eq!(
            unknown(route),
            Some(UnknownField {
                path: "routes[0].spec.colour".into(),
                line: 5,
                column: 7
            })
        );
        let rule = "routes:\n  - name: a\n    spec:\n      rules:\n        - backends: []\n          timout: 1s\n";
        let found = unknown(rule).expect("unknown");
        assert_eq!(found.path, "routes[0].spec.rules[0].timout");
        assert_eq!(found.line, 6);
    }
}
