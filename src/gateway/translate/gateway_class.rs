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

fn conditions(crd_version: Option<&str>) -> Vec<Cond> {
    match crd_version {
        Some(v) if v != GATEWAY_API_VERSION => {
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
