//! ReferenceGrants: the owners of a namespace allowing objects of another namespace to
//! refer to theirs (an HTTPRoute to a Service, a Gateway to a Secret).

use crate::gateway::api::referencegrants::ReferenceGrant;

/// One side of a reference: the group and kind of an object in a namespace.
#[derive(Clone, Copy, Debug)]
pub struct Side<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
}

/// Whether `from` may refer to the object `name` of `to`. A reference within one
/// namespace needs no grant; across namespaces, a grant in the target's namespace must
/// list both sides (the target by name, or all of its kind).
pub fn permits(grants: &[ReferenceGrant], from: Side<'_>, to: Side<'_>, name: &str) -> bool {
    if from.namespace == to.namespace {
        return true;
    }
    grants
        .iter()
        .filter(|g| g.metadata.namespace.as_deref() == Some(to.namespace))
        .any(|g| {
            let from_listed = g.spec.from.iter().any(|f| {
                f.group == from.group && f.kind == from.kind && f.namespace == from.namespace
            });
            let to_listed = g.spec.to.iter().any(|t| {
                t.group == to.group
                    && t.kind == to.kind
                    && t.name.as_deref().is_none_or(|n| n == name)
            });
            from_listed && to_listed
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::api::referencegrants::{
        ReferenceGrantFrom, ReferenceGrantSpec, ReferenceGrantTo,
    };

    fn grant(namespace: &str, from_ns: &str, to_name: Option<&str>) -> ReferenceGrant {
        let mut g = ReferenceGrant::new(
            "g",
            ReferenceGrantSpec {
                from: vec![ReferenceGrantFrom {
                    group: "gateway.networking.k8s.io".into(),
                    kind: "HTTPRoute".into(),
                    namespace: from_ns.into(),
                }],
                to: vec![ReferenceGrantTo {
                    group: String::new(),
                    kind: "Service".into(),
                    name: to_name.map(String::from),
                }],
            },
        );
        g.metadata.namespace = Some(namespace.into());
        g
    }

    const ROUTE: Side<'static> = Side {
        group: "gateway.networking.k8s.io",
        kind: "HTTPRoute",
        namespace: "web",
    };

    fn service(namespace: &str) -> Side<'_> {
        Side {
            group: "",
            kind: "Service",
            namespace,
        }
    }

    #[test]
    fn the_same_namespace_needs_no_grant() {
        assert!(permits(&[], ROUTE, service("web"), "a"));
        assert!(!permits(&[], ROUTE, service("backends"), "a"));
    }

    #[test]
    fn a_grant_counts_only_in_the_target_namespace_and_for_what_it_names() {
        let all = [grant("backends", "web", None)];
        assert!(permits(&all, ROUTE, service("backends"), "a"));
        let one = [grant("backends", "web", Some("b"))];
        assert!(!permits(&one, ROUTE, service("backends"), "a"));
        assert!(permits(&one, ROUTE, service("backends"), "b"));
        let elsewhere = [grant("web", "web", None)];
        assert!(!permits(&elsewhere, ROUTE, service("backends"), "a"));
        let other_source = [grant("backends", "other", None)];
        assert!(!permits(&other_source, ROUTE, service("backends"), "a"));
    }
}
