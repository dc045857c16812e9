//! GatewayClasses: those naming Switchyard's controller are accepted, unless the
//! installed CRDs are of another Gateway API release than the one Switchyard speaks.

use super::{ClassOutcome, Cond, GATEWAY_API_VERSION, Inputs};

/// The status of each class of Switchyard's, sorted by name: Accepted, then
/// SupportedVersion.
pub fn outcomes(inputs: &Inputs<'_>) -> Vec<ClassOutcome> {
    let mut out: Vec<ClassOutcome> = inputs
        .classes
        .iter()
        .filter(|c| c.spec.controller_name == inputs.controller_name)
        .map(|c| ClassOutcome {
            name: c.metadata.name.clone().unwrap_or_default(),
            generation: c.metadata.generation.unwrap_or(0),
            conditions: conditions(inputs.crd_version),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Whether CRDs of release `version` are what Switchyard's types read: the same minor
/// release (patch releases change no schema).
pub fn supported(version: &str) -> bool {
    let minor = |v: &str| {
        let mut parts = v.trim_start_matches('v').split('.');
        (
            parts.next().map(str::to_owned),
            parts.next().map(str::to_owned),
        )
    };
    minor(version) == minor(GATEWAY_API_VERSION)
}

fn conditions(crd_version: Option<&str>) -> Vec<Cond> {
    match crd_version {
        Some(v) if !supported(v) => {
            let message = format!(
                "the installed Gateway API CRDs are {v}; Switchyard speaks {GATEWAY_API_VERSION}"
            );
            vec![
                Cond::no("Accepted", "UnsupportedVersion", message.clone()),
                Cond::no("SupportedVersion", "UnsupportedVersion", message),
            ]
        }
        _ => vec![
            Cond::yes("Accepted", "Accepted", "served by Switchyard"),
            Cond::yes(
                "SupportedVersion",
                "SupportedVersion",
                format!("Gateway API {GATEWAY_API_VERSION}"),
            ),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_releases_of_the_same_minor_are_supported() {
        assert!(supported("v1.7.0"));
        assert!(supported("v1.7.3"));
        assert!(!supported("v1.6.3"));
        assert!(!supported("v1.8.0"));
        assert!(!supported("v2.7.0"));
        assert!(!supported("garbage"));
    }
}
