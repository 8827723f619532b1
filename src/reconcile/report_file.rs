//! The report file of a reconciliation, for machines: every anomaly as a JSON line or a CSV
//! row, written as it is found under a temporary name and put in place only when complete.

use super::files::Unreadable;
use super::report::{Kind, Side, Summary};
use anyhow::{Context, Result};
use serde::Serialize;
use std::io::{BufWriter, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tempfile::NamedTempFile;

/// The `format` of the JSON report's summary line.
pub const FORMAT: &str = "tally.reconcile/v1";

/// The layout of the report file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    /// JSON Lines: one object per anomaly, then one `summary` object.
    Json,
    /// CSV: `kind,idempotency_key,count,detail`, one row per anomaly.
    Csv,
}

/// One anomaly line of the JSON report.
#[derive(Serialize)]
struct KeyLine<'a> {
    kind: &'static str,
    idempotency_key: &'a str,
    /// Only on keys told apart from others of the same text by their fields.
    #[serde(skip_serializing_if = "Option::is_none")]
    idempotency_key_fields: Option<Vec<String>>,
    count: u64,
}

/// One unreadable-record line of the JSON report.
#[derive(Serialize)]
struct UnreadableLine<'a> {
    kind: &'static str,
    side: &'static str,
    location: &'a str,
    reason: &'a str,
}

/// The last line of the JSON report.
#[derive(Serialize)]
struct SummaryLine<'a> {
    kind: &'static str,
    format: &'static str,
    #[serde(flatten)]
    summary: &'a Summary,
}

/// The report file being written, under a temporary name next to its final path.
pub struct ReportFile {
    path: PathBuf,
    out: Out,
}

enum Out {
    Json(BufWriter<NamedTempFile>),
    // Boxed: the CSV writer's state is several times the size of the JSON variant.
    Csv(Box<csv::Writer<NamedTempFile>>),
}

impl ReportFile {
    /// Starts the report at `path` (a temporary file beside it until [`ReportFile::finish`]).
    pub fn create(path: &Path, format: ReportFormat) -> Result<Self> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let tmp = NamedTempFile::new_in(dir).with_context(|| {
            format!(
                "cannot create the report `{}`: is its directory writable?",
                path.display()
            )
        })?;
        // A temporary file is private (0600); the report is an ordinary file for others to read.
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o644))
            .with_context(|| format!("cannot create the report `{}`", path.display()))?;
        let out = match format {
            ReportFormat::Json => Out::Json(BufWriter::new(tmp)),
            ReportFormat::Csv => {
                let mut w = csv::Writer::from_writer(tmp);
                w.write_record(["kind", "idempotency_key", "count", "detail"])?;
                Out::Csv(Box::new(w))
            }
        };
        Ok(Self {
            path: path.to_path_buf(),
            out,
        })
    }

    /// Writes one key's anomaly; `fields` is the JSON array of its field values, when they
    /// tell it from other keys of the same text.
    pub fn anomaly(&mut self, kind: Kind, key: &str, fields: Option<&str>, count: u64) -> Result<()> {
        match &mut self.out {
            Out::Json(w) => json_line(
                w,
                &KeyLine {
                    kind: kind.as_str(),
                    idempotency_key: key,
                    idempotency_key_fields: fields.and_then(|f| serde_json::from_str(f).ok()),
                    count,
                },
            ),
            Out::Csv(w) => {
                let detail = fields.map(|f| format!("fields {f}")).unwrap_or_default();
                w.write_record([kind.as_str(), key, &count.to_string(), &detail])
                    .map_err(anyhow::Error::from)
            }
        }
        .with_context(|| format!("cannot write the report `{}`", self.path.display()))
    }

    /// Writes one record without a usable key.
    pub fn unreadable(&mut self, side: Side, u: &Unreadable) -> Result<()> {
        match &mut self.out {
            Out::Json(w) => json_line(
                w,
                &UnreadableLine {
                    kind: Kind::Unreadable.as_str(),
                    side: side.as_str(),
                    location: &u.location,
                    reason: &u.reason,
                },
            ),
            Out::Csv(w) => {
                let detail = format!("{} {}: {}", side.as_str(), u.location, u.reason);
                w.write_record([Kind::Unreadable.as_str(), "", "", &detail])
                    .map_err(anyhow::Error::from)
            }
        }
        .with_context(|| format!("cannot write the report `{}`", self.path.display()))
    }

    /// Writes the summary (JSON) and puts the file in place.
    pub fn finish(self, summary: &Summary) -> Result<()> {
        let context = || format!("cannot write the report `{}`", self.path.display());
        let tmp = match self.out {
            Out::Json(mut w) => {
                json_line(
                    &mut w,
                    &SummaryLine {
                        kind: "summary",
                        format: FORMAT,
                        summary,
                    },
                )
                .with_context(context)?;
                w.into_inner().map_err(|e| e.into_error()).with_context(context)?
            }
            Out::Csv(w) => w.into_inner().map_err(|e| e.into_error()).with_context(context)?,
        };
        tmp.persist(&self.path).map_err(|e| e.error).with_context(context)?;
        Ok(())
    }
}

fn json_line<W: Write>(w: &mut W, value: &impl Serialize) -> Result<()> {
    serde_json::to_writer(&mut *w, value)?;
    w.write_all(b"\n")?;
    Ok(())
}
