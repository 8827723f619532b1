//! What a reconciliation found: counts and the first examples of each anomaly for people, and
//! every anomaly in a report file for machines (`report_file.rs`), written as it is found.

use super::files::Unreadable;
use super::ledger::{Counts, Verdict};
use super::report_file::{ReportFile, ReportFormat};
use anyhow::Result;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// Which side of the comparison a record was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// What upstream says it sent.
    Sent,
    /// What tally processed.
    Processed,
}

impl Side {
    /// The name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Sent => "sent",
            Side::Processed => "processed",
        }
    }
}

/// The kinds of anomaly, in the order the summary lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Sent, never processed.
    Missing,
    /// Processed, never sent.
    Ghost,
    /// Sent, processed more than once.
    Duplicate,
    /// Sent, dead-lettered, never emitted.
    DeadLettered,
    /// A record without a usable key.
    Unreadable,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::Missing,
        Kind::Ghost,
        Kind::Duplicate,
        Kind::DeadLettered,
        Kind::Unreadable,
    ];

    /// The name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Missing => "missing",
            Kind::Ghost => "ghost",
            Kind::Duplicate => "duplicate",
            Kind::DeadLettered => "dead_lettered",
            Kind::Unreadable => "unreadable",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The counts of a reconciliation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Sent records with a key (repeats included).
    pub sent_records: u64,
    /// Distinct keys sent.
    pub sent_keys: u64,
    /// Processed records counted (outputs, or emitting trace records).
    pub processed_records: u64,
    /// Distinct keys processed.
    pub processed_keys: u64,
    /// Records read from the processed topic that do not count (trace records that are not
    /// outputs, other formats or nodes).
    pub skipped: u64,
    /// Sent records whose time is outside the window.
    pub outside_window_sent: u64,
    /// Processed records whose timestamp is outside the window (and its grace).
    pub outside_window_processed: u64,
    /// Keys sent, never processed.
    pub missing: u64,
    /// Keys processed, never sent.
    pub ghost: u64,
    /// Keys sent and processed more than once.
    pub duplicate: u64,
    /// Keys sent and never emitted because tally dropped them by its rules (duplicates of
    /// events already processed, stale versions): correct, not missing.
    pub dropped: u64,
    /// Keys sent, never emitted, dead-lettered: in the dead-letter topic, not missing.
    pub dead_lettered: u64,
    /// Sent records without a usable key.
    pub unreadable_sent: u64,
    /// Processed records without a usable key.
    pub unreadable_processed: u64,
}

/// The counts and the first examples of each anomaly.
#[derive(Debug, Clone, Default)]
pub struct Findings {
    /// The counts.
    pub summary: Summary,
    /// Up to the example limit per kind, indexed by `Kind`, as display lines.
    examples: [Vec<String>; 5],
}

impl Findings {
    /// The example lines kept for `kind`.
    pub fn examples(&self, kind: Kind) -> &[String] {
        &self.examples[kind.index()]
    }

    fn count(&self, kind: Kind) -> u64 {
        let s = &self.summary;
        match kind {
            Kind::Missing => s.missing,
            Kind::Ghost => s.ghost,
            Kind::Duplicate => s.duplicate,
            Kind::DeadLettered => s.dead_lettered,
            Kind::Unreadable => s.unreadable_sent + s.unreadable_processed,
        }
    }

    /// The human summary: counts, then the examples of each anomaly.
    pub fn render(&self, sent: &str, processed: &str) -> String {
        let s = &self.summary;
        let mut out = String::new();
        let _ = write!(
            out,
            "sent       {sent}: {} records, {} distinct keys",
            s.sent_records, s.sent_keys
        );
        if s.outside_window_sent > 0 {
            let _ = write!(out, " ({} records outside the window)", s.outside_window_sent);
        }
        out.push('\n');
        let _ = write!(
            out,
            "processed  {processed}: {} records, {} distinct keys",
            s.processed_records, s.processed_keys
        );
        if s.skipped > 0 {
            let _ = write!(out, " ({} records not counted: not outputs)", s.skipped);
        }
        if s.outside_window_processed > 0 {
            let _ = write!(out, " ({} records outside the window)", s.outside_window_processed);
        }
        out.push('\n');
        if s.dropped > 0 {
            let _ = writeln!(
                out,
                "{:<10} {:>10}  sent, dropped by the rules (duplicates, stale versions): not an anomaly",
                "dropped", s.dropped
            );
        }
        for kind in Kind::ALL {
            let what = match kind {
                Kind::Missing => "sent, never completed".to_string(),
                Kind::Ghost => "completed, never sent".to_string(),
                Kind::Duplicate => "completed more than once".to_string(),
                Kind::DeadLettered => "sent, dead-lettered, never completed".to_string(),
                Kind::Unreadable => format!(
                    "records without a usable key: {} sent, {} processed",
                    s.unreadable_sent, s.unreadable_processed
                ),
            };
            let count = self.count(kind);
            let _ = writeln!(out, "{:<10} {count:>10}  {what}", kind.as_str());
            let shown = self.examples(kind);
            for line in shown {
                let _ = writeln!(out, "    {line}");
            }
            if count > shown.len() as u64 && !shown.is_empty() {
                let _ = writeln!(out, "    … and {} more", count - shown.len() as u64);
            }
        }
        out
    }
}

/// Collects the findings and streams every anomaly to the report file, if any.
pub struct Report {
    findings: Findings,
    limit: usize,
    file: Option<ReportFile>,
}

impl Report {
    /// A report keeping `examples` examples per kind, writing `file` (path, format) when given.
    pub fn new(file: Option<(&Path, ReportFormat)>, examples: usize) -> Result<Self> {
        let file = file
            .map(|(path, format)| ReportFile::create(path, format))
            .transpose()?;
        Ok(Self {
            findings: Findings::default(),
            limit: examples,
            file,
        })
    }

    /// The counts so far, for the reading phases to add to.
    pub fn summary(&mut self) -> &mut Summary {
        &mut self.findings.summary
    }

    /// Records a record without a usable key.
    pub fn unreadable(&mut self, side: Side, u: &Unreadable) -> Result<()> {
        match side {
            Side::Sent => self.findings.summary.unreadable_sent += 1,
            Side::Processed => self.findings.summary.unreadable_processed += 1,
        }
        self.example(Kind::Unreadable, || {
            format!("{} {}: {}", side.as_str(), u.location, u.reason)
        });
        match &mut self.file {
            Some(f) => f.unreadable(side, u),
            None => Ok(()),
        }
    }

    /// Records a key's counts and, when they are an anomaly, reports it; `fields` (a JSON array)
    /// tells it from other keys of the same text.
    pub fn key(&mut self, key: &str, fields: Option<&str>, counts: Counts) -> Result<()> {
        let s = &mut self.findings.summary;
        s.sent_keys += u64::from(counts.sent > 0);
        s.processed_keys += u64::from(counts.processed > 0);
        let kind = match counts.verdict() {
            Verdict::Reconciled => return Ok(()),
            Verdict::Dropped => {
                s.dropped += 1;
                return Ok(());
            }
            Verdict::DeadLettered => {
                s.dead_lettered += 1;
                Kind::DeadLettered
            }
            Verdict::Missing => {
                s.missing += 1;
                Kind::Missing
            }
            Verdict::Ghost => {
                s.ghost += 1;
                Kind::Ghost
            }
            Verdict::Duplicate => {
                s.duplicate += 1;
                Kind::Duplicate
            }
        };
        self.example(kind, || {
            let shown = match fields {
                Some(fields) => format!("{key} {fields}"),
                None => key.to_string(),
            };
            match kind {
                Kind::Missing | Kind::DeadLettered => shown,
                _ => format!("{shown} (processed {}x)", counts.processed),
            }
        });
        match &mut self.file {
            Some(f) => f.anomaly(kind, key, fields, counts.processed),
            None => Ok(()),
        }
    }

    fn example(&mut self, kind: Kind, line: impl FnOnce() -> String) {
        let shown = &mut self.findings.examples[kind.index()];
        if shown.len() < self.limit {
            shown.push(line());
        }
    }

    /// Completes the report file (in place only now, so a failed run leaves none) and returns
    /// the findings.
    pub fn finish(self) -> Result<Findings> {
        if let Some(f) = self.file {
            f.finish(&self.findings.summary)?;
        }
        Ok(self.findings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::report_file::FORMAT;
    use std::os::unix::fs::PermissionsExt;

    fn counts(sent: u64, processed: u64) -> Counts {
        Counts {
            sent,
            processed,
            ..Counts::default()
        }
    }

    /// Feeds a fixed set of findings: one unreadable line, then keys in order.
    fn feed(report: &mut Report) {
        report
            .unreadable(
                Side::Sent,
                &Unreadable {
                    location: "sent.jsonl:7".into(),
                    reason: "not valid JSON, \"oops\"".into(),
                },
            )
            .expect("unreadable");
        for (key, c) in [
            ("a", counts(1, 1)),
            ("b,quoted\"", counts(1, 0)),
            ("c", counts(1, 3)),
            ("d", counts(0, 1)),
            ("e", counts(2, 0)),
            (
                "f",
                Counts {
                    dropped: 1,
                    ..counts(1, 0)
                },
            ),
            (
                "g",
                Counts {
                    dead_lettered: 1,
                    ..counts(1, 0)
                },
            ),
        ] {
            report.summary().sent_records += c.sent;
            report.summary().processed_records += c.processed;
            report.key(key, None, c).expect("key");
        }
    }

    fn expected_summary() -> Summary {
        Summary {
            sent_records: 7,
            sent_keys: 6,
            processed_records: 5,
            processed_keys: 3,
            skipped: 0,
            outside_window_sent: 0,
            outside_window_processed: 0,
            missing: 2,
            ghost: 1,
            duplicate: 1,
            dropped: 1,
            dead_lettered: 1,
            unreadable_sent: 1,
            unreadable_processed: 0,
        }
    }

    #[test]
    fn json_report_has_a_line_per_anomaly_then_the_summary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r.json");
        let mut report = Report::new(Some((&path, ReportFormat::Json)), 10).expect("report");
        feed(&mut report);
        let findings = report.finish().expect("finish");
        assert_eq!(findings.summary, expected_summary());
        let mode = std::fs::metadata(&path).expect("report").permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o644,
            "readable like any file, not private like a temporary one"
        );
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&path)
            .expect("read")
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        let expected = [
            serde_json::json!({"kind": "unreadable", "side": "sent", "location": "sent.jsonl:7", "reason": "not valid JSON, \"oops\""}),
            serde_json::json!({"kind": "missing", "idempotency_key": "b,quoted\"", "count": 0}),
            serde_json::json!({"kind": "duplicate", "idempotency_key": "c", "count": 3}),
            serde_json::json!({"kind": "ghost", "idempotency_key": "d", "count": 1}),
            serde_json::json!({"kind": "missing", "idempotency_key": "e", "count": 0}),
            serde_json::json!({"kind": "dead_lettered", "idempotency_key": "g", "count": 0}),
        ];
        assert_eq!(lines[..6], expected, "a key dropped by the rules (f) is no anomaly");
        let last = &lines[6];
        assert_eq!(last["kind"], "summary");
        assert_eq!(last["format"], FORMAT);
        assert_eq!(last["missing"], 2);
        assert_eq!(
            (&last["dropped"], &last["dead_lettered"]),
            (&serde_json::json!(1), &serde_json::json!(1))
        );
        assert_eq!(last["sent_keys"], 6);
        assert_eq!(lines.len(), 7);
    }

    #[test]
    fn csv_report_has_a_header_and_a_row_per_anomaly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r.csv");
        let mut report = Report::new(Some((&path, ReportFormat::Csv)), 10).expect("report");
        feed(&mut report);
        report.finish().expect("finish");
        let mut reader = csv::Reader::from_path(&path).expect("csv");
        assert_eq!(
            reader.headers().expect("headers"),
            vec!["kind", "idempotency_key", "count", "detail"]
        );
        let rows: Vec<Vec<String>> = reader
            .records()
            .map(|r| r.expect("row").iter().map(str::to_string).collect())
            .collect();
        let expected: Vec<Vec<String>> = [
            ["unreadable", "", "", "sent sent.jsonl:7: not valid JSON, \"oops\""],
            ["missing", "b,quoted\"", "0", ""],
            ["duplicate", "c", "3", ""],
            ["ghost", "d", "1", ""],
            ["missing", "e", "0", ""],
            ["dead_lettered", "g", "0", ""],
        ]
        .iter()
        .map(|r| r.iter().map(|s| s.to_string()).collect())
        .collect();
        assert_eq!(rows, expected);
    }

    #[test]
    fn a_key_told_apart_by_its_fields_is_reported_with_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fields = Some(r#"["X:Y","PAID"]"#);
        for format in [ReportFormat::Json, ReportFormat::Csv] {
            let path = dir.path().join("r");
            let mut report = Report::new(Some((&path, format)), 10).expect("report");
            report.key("X:Y:PAID", fields, counts(1, 0)).expect("key");
            report
                .key("X:Y:PAID", Some(r#"["X","Y:PAID"]"#), counts(1, 1))
                .expect("key");
            let findings = report.finish().expect("finish");
            assert_eq!(findings.summary.missing, 1);
            assert_eq!(findings.summary.sent_keys, 2);
            assert_eq!(findings.examples(Kind::Missing), [r#"X:Y:PAID ["X:Y","PAID"]"#]);
            let text = std::fs::read_to_string(&path).expect("read");
            let first = text
                .lines()
                .nth(usize::from(format == ReportFormat::Csv))
                .expect("a line");
            match format {
                ReportFormat::Json => assert_eq!(
                    serde_json::from_str::<serde_json::Value>(first).expect("json"),
                    serde_json::json!({"kind": "missing", "idempotency_key": "X:Y:PAID",
                        "idempotency_key_fields": ["X:Y", "PAID"], "count": 0})
                ),
                ReportFormat::Csv => assert_eq!(first, r#"missing,X:Y:PAID,0,"fields [""X:Y"",""PAID""]""#),
            }
        }
    }

    #[test]
    fn the_report_appears_only_when_finished() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r.json");
        let mut report = Report::new(Some((&path, ReportFormat::Json)), 10).expect("report");
        feed(&mut report);
        assert!(!path.exists());
        drop(report);
        assert!(!path.exists(), "an abandoned run leaves no report");
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("dir").count(),
            0,
            "nor a temporary file"
        );
    }

    #[test]
    fn the_summary_shows_counts_and_at_most_the_example_limit() {
        let mut report = Report::new(None, 1).expect("report");
        feed(&mut report);
        let findings = report.finish().expect("finish");
        assert_eq!(findings.examples(Kind::Missing), ["b,quoted\""]);
        assert_eq!(findings.examples(Kind::Ghost), ["d (processed 1x)"]);
        let text = findings.render("sent.jsonl", "topic out");
        assert!(
            text.contains("sent       sent.jsonl: 7 records, 6 distinct keys"),
            "{text}"
        );
        assert!(
            text.contains("processed  topic out: 5 records, 3 distinct keys"),
            "{text}"
        );
        assert!(text.contains("missing             2  sent, never completed"), "{text}");
        assert!(text.contains("… and 1 more"), "{text}");
        assert!(text.contains("duplicate           1"), "{text}");
        assert!(text.contains("sent sent.jsonl:7: not valid JSON"), "{text}");
    }
}
