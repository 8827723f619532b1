//! Arbitrary bytes as a topology file through `tally validate`/`describe`'s loading path:
//! interpolation, YAML parsing, validation and topology building, then the describe text and
//! every diagnostic's message. Goal: an error for every bad file, never a panic or a blow-up.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tally_fuzz::fixed_env;

fuzz_target!(|data: &[u8]| {
    // `load_file` reads the file with `read_to_string`, so non-UTF-8 never reaches the parser.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match tally::config::load_str("fuzz.yaml", text, fixed_env) {
        Ok(topology) => {
            let _ = tally::topology::describe::describe(&topology);
            for pipeline in &topology.pipelines {
                let _ = pipeline.store_names();
            }
        }
        Err(e) => {
            assert!(
                !e.diagnostics.is_empty(),
                "a rejected topology names at least one problem"
            );
            let _ = e.to_string();
        }
    }
});
