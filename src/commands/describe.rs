//! `tally describe`: prints a topology's sources, steps, sinks and stores.

use crate::config::{self, ConfigError};
use crate::topology::describe::describe;
use std::path::Path;

/// The text view of a topology file.
pub fn describe_file(path: &Path) -> Result<String, ConfigError> {
    config::load_file(path).map(|t| describe(&t))
}
