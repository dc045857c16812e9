//! A standalone configuration file, as text: parsed (or refused with an error, never a
//! panic), built into the model and translated into a consistent snapshot.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use switchyard_fuzz::{model_of, route_file, translate_and_check};

fuzz_target!(|text: &str| {
    let Ok(file) = switchyard::standalone::parse(Path::new("fuzz.yaml"), text) else {
        return;
    };
    let config = model_of(&file);
    translate_and_check(&config, &model_of(&route_file(Vec::new())));
});
