//! Configuration problems, each with its place in the file and a plain sentence.

use std::fmt;

/// One problem found while loading a topology file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file the problem is in.
    pub file: String,
    /// 1-based line, 0 when the problem concerns the whole file.
    pub line: u64,
    /// 1-based column, 0 when unknown.
    pub column: u64,
    /// What is wrong and, where it helps, what to write instead.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (0, _) => write!(f, "{}: {}", self.file, self.message),
            (line, 0) => write!(f, "{}:{}: {}", self.file, line, self.message),
            (line, column) => write!(f, "{}:{}:{}: {}", self.file, line, column, self.message),
        }
    }
}

/// Every problem found in one or more files; loading fails when there is at least one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The problems, in file order.
    pub diagnostics: Vec<Diagnostic>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.diagnostics.len();
        writeln!(
            f,
            "{n} problem{} in the topology configuration:",
            if n == 1 { "" } else { "s" }
        )?;
        for d in &self.diagnostics {
            writeln!(f, "  - {d}")?;
        }
        Ok(())
    }
}

/// Collects diagnostics for one file while validation walks it.
#[derive(Debug)]
pub struct Collector {
    file: String,
    found: Vec<Diagnostic>,
}

impl Collector {
    /// Starts an empty collection for `file`.
    pub fn new(file: impl Into<String>) -> Self {
        Self {
            file: file.into(),
            found: Vec::new(),
        }
    }

    /// Records a problem at a line and column (0 when unknown).
    pub fn at(&mut self, line: u64, column: u64, message: impl Into<String>) {
        self.found.push(Diagnostic {
            file: self.file.clone(),
            line,
            column,
            message: message.into(),
        });
    }

    /// Records a problem at a parsed YAML location.
    pub fn at_loc(&mut self, loc: serde_saphyr::Location, message: impl Into<String>) {
        self.at(loc.line(), loc.column(), message);
    }

    /// True when nothing has been recorded.
    pub fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    /// Ends the collection: the value when it exists and nothing was found, every problem
    /// otherwise.
    pub fn finish<T>(mut self, value: Option<T>) -> Result<T, ConfigError> {
        match value {
            Some(v) if self.found.is_empty() => return Ok(v),
            None if self.found.is_empty() => self.at(0, 0, "the topology is incomplete"),
            _ => {}
        }
        self.found.sort_by_key(|d| (d.line, d.column));
        Err(ConfigError {
            diagnostics: self.found,
        })
    }
}
