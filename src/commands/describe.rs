//! `tally describe`: prints a topology's sources, steps, sinks and stores, as text or a graph.

use crate::config::{self, ConfigError};
use crate::topology::describe::describe;
use crate::topology::diagram;
use std::path::Path;

/// How `describe` prints a topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Indented text.
    #[default]
    Text,
    /// A Mermaid flowchart (renders in GitHub Markdown).
    Mermaid,
    /// A Graphviz graph (`dot -Tsvg`).
    Dot,
}

/// A topology file in `format`.
pub fn describe_file(path: &Path, format: Format) -> Result<String, ConfigError> {
    config::load_file(path).map(|t| match format {
        Format::Text => describe(&t),
        Format::Mermaid => diagram::mermaid(&t),
        Format::Dot => diagram::dot(&t),
    })
}
