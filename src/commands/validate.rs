//! `tally validate`: checks topology files and lists every problem.

use crate::config;
use std::path::PathBuf;

/// Validates each file; prints `ok` or its problems. Returns true when all are valid.
pub fn validate(files: &[PathBuf]) -> bool {
    let mut all_ok = true;
    for f in files {
        match config::load_file(f) {
            Ok(t) => println!(
                "ok: {} (application `{}`, {} pipeline(s))",
                f.display(),
                t.application_id,
                t.pipelines.len()
            ),
            Err(e) => {
                all_ok = false;
                eprint!("{e}");
            }
        }
    }
    all_ok
}
