//! TrafficRoute specs (JSON, the form the API server hands over), checked, resolved against
//! fixed services, lowered and translated: refused with a reason or served consistently,
//! never a panic. The route before them is the first spec alone, so that the incremental
//! translator is exercised too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard::api::TrafficRouteSpec;
use switchyard_fuzz::{model_of, route_file, translate_and_check};

fuzz_target!(|data: &[u8]| {
    let Ok(specs) = serde_json::from_slice::<Vec<TrafficRouteSpec>>(data) else {
        return;
    };
    let specs: Vec<_> = specs.into_iter().map(|s| s.route).collect();
    let before = model_of(&route_file(specs.iter().take(1).cloned().collect()));
    let config = model_of(&route_file(specs));
    translate_and_check(&config, &before);
});
