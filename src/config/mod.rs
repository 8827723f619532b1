//! Loading topology files: interpolation, YAML parsing, validation with every problem collected.

pub mod diagnostics;
pub mod interpolate;
pub mod pipelines;
pub mod raw;
pub mod reconcile;
pub mod validate;

use crate::topology::Topology;
use diagnostics::Collector;
pub use diagnostics::{ConfigError, Diagnostic};
use std::path::Path;

/// Reads and validates a topology file, with environment variables from the process.
pub fn load_file(path: &Path) -> Result<Topology, ConfigError> {
    let name = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => load_str(&name, &text, |var| std::env::var(var).ok()),
        Err(e) => {
            let mut c = Collector::new(name);
            c.at(0, 0, format!("cannot read the file: {e}"));
            c.finish(None)
        }
    }
}

/// Validates topology text; `file` names it in messages, `env` resolves `${VAR}`.
pub fn load_str(file: &str, text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Topology, ConfigError> {
    let mut c = Collector::new(file);
    let (text, unresolved) = interpolate::interpolate(text, env);
    for u in unresolved {
        c.at(u.line, u.column, u.message);
    }
    let raw: raw::RawTopology = match serde_saphyr::from_str(&text) {
        Ok(raw) => raw,
        Err(e) => {
            let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
            c.at(line, column, yaml_message(&e));
            return c.finish(None);
        }
    };
    let topology = validate::validate(raw, &mut c);
    c.finish(topology)
}

/// The parser's sentence without the location it repeats.
fn yaml_message(e: &serde_saphyr::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("invalid YAML").trim();
    format!("invalid YAML: {first}")
}
