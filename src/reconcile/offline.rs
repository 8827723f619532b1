//! Offline reconciliation: the keys upstream says it sent against the keys tally processed,
//! counted in a temporary RocksDB (memory does not grow with the key count) and compared in one
//! ordered scan that reports missing, ghost and duplicate keys.

use super::counted_key::Judge;
use super::files::{self, Entry, FileFormat, Unreadable};
use super::ledger::{Counter, Ledger};
use super::progress::Progress;
use super::records::{self, KeyHeaders, Keyed};
use super::report::{Findings, Report, Side, Summary};
use super::report_file::ReportFormat;
use super::sent_key::SentKey;
use super::topic;
use super::window::Window;
use crate::wire::{IDEMPOTENCY_KEY_FIELDS_HEADER, IDEMPOTENCY_KEY_HEADER};
use anyhow::{bail, Result};
use rdkafka::message::BorrowedMessage;
use rdkafka::{ClientConfig, Message};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// At most this many consumers read the processed topic, each its share of the partitions on a
/// thread of its own.
const PROCESSED_READERS: usize = 4;

/// The prefix of `--sent` that names a topic instead of a file.
pub const TOPIC_PREFIX: &str = "topic:";

/// Where the sent keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SentSource {
    /// A JSON Lines, JSON or CSV file.
    File {
        /// The file.
        path: PathBuf,
        /// Its layout.
        format: FileFormat,
    },
    /// A topic: the key is a record's idempotency-key header, else a field of its JSON value.
    Topic(String),
}

impl SentSource {
    /// Parses `--sent`: `topic:<name>`, or a file whose layout is `format` or follows from its
    /// extension.
    pub fn parse(arg: &str, format: Option<FileFormat>) -> Result<Self> {
        if let Some(topic) = arg.strip_prefix(TOPIC_PREFIX) {
            if topic.is_empty() {
                bail!("--sent `{arg}` names no topic; write `topic:<name>`");
            }
            if format.is_some() {
                bail!("--sent-format applies to files; --sent `{arg}` is a topic");
            }
            return Ok(Self::Topic(topic.to_string()));
        }
        let path = PathBuf::from(arg);
        let Some(format) = format.or_else(|| FileFormat::from_extension(&path)) else {
            bail!("cannot tell the format of `{arg}` from its extension; add --sent-format jsonl, json or csv");
        };
        Ok(Self::File { path, format })
    }

    /// How the summary names it.
    pub fn describe(&self) -> String {
        match self {
            Self::File { path, .. } => format!("file `{}`", path.display()),
            Self::Topic(t) => format!("topic `{t}`"),
        }
    }
}

/// What the processed topic holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProcessedKind {
    /// A pipeline's output topic: each record carries the `tally.idempotency_key` header.
    Output,
    /// A trace topic (`tally.trace/v1`): `COMPLETED` records with no outcome or
    /// `PENDING_CREATE` count as processed.
    Trace,
}

/// Everything one reconciliation needs.
pub struct Options {
    /// Where the sent keys come from.
    pub sent: SentSource,
    /// How a sent record's key is found.
    pub sent_key: SentKey,
    /// The period reconciled (everything when `None`).
    pub window: Option<Window>,
    /// The processed topic.
    pub processed: String,
    /// What the processed topic holds.
    pub processed_kind: ProcessedKind,
    /// With a trace topic: count only this node's records.
    pub trace_node: Option<String>,
    /// The Kafka client settings (see `topic::client_config`).
    pub kafka: ClientConfig,
    /// The report file and its format.
    pub report: Option<(PathBuf, ReportFormat)>,
    /// Examples of each anomaly kept for the summary.
    pub examples: usize,
    /// Where the temporary work database goes (the system's temporary directory when `None`).
    pub work_dir: Option<PathBuf>,
    /// Show progress on stderr when it is a terminal.
    pub progress: bool,
}

impl Options {
    /// How the summary names the processed topic.
    pub fn describe_processed(&self) -> String {
        match self.processed_kind {
            ProcessedKind::Output => format!("output topic `{}`", self.processed),
            ProcessedKind::Trace => format!("trace topic `{}`", self.processed),
        }
    }
}

/// Runs a reconciliation: reads both sides into the work database, compares them and writes
/// the report.
pub fn run(opts: &Options) -> Result<Findings> {
    let mut ledger = Ledger::create(opts.work_dir.as_deref())?;
    let report_file = opts.report.as_ref().map(|(p, f)| (p.as_path(), *f));
    let mut report = Report::new(report_file, opts.examples)?;
    read_sent(opts, &mut ledger, &mut report)?;
    read_processed(opts, &ledger, &mut report)?;
    let progress = Progress::start("comparing", "keys", opts.progress);
    let mut judge = Judge::default();
    let mut verdict = |text: &str, fields: Option<&str>, counts| report.key(text, fields, counts);
    ledger.scan(&mut |key, counts| {
        progress.inc();
        judge.key(key, counts, &mut verdict)
    })?;
    judge.finish(&mut verdict)?;
    progress.finish();
    report.finish()
}

/// Why a reconciliation fails, one phrase per reason; empty when it passes. Missing keys fail,
/// and so do unreadable sent records (each could hide a missing key); with `strict` ghosts,
/// duplicates, dead-lettered keys and unreadable processed records fail too. Keys dropped by the
/// rules (duplicates, stale versions) never fail: that is tally doing its job.
pub fn failures(s: &Summary, strict: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut fail = |n: u64, what: &str| {
        if n > 0 {
            out.push(format!("{n} {what}"));
        }
    };
    fail(s.missing, "missing");
    fail(s.unreadable_sent, "unreadable sent");
    if strict {
        fail(s.ghost, "ghost");
        fail(s.duplicate, "duplicate");
        fail(s.dead_lettered, "dead-lettered");
        fail(s.unreadable_processed, "unreadable processed");
    }
    out
}

fn read_sent(opts: &Options, ledger: &mut Ledger, report: &mut Report) -> Result<()> {
    let progress = Progress::start("reading sent keys", "records", opts.progress);
    let window = opts.window.as_ref();
    let mut read = Read::default();
    let report = Mutex::new(report);
    match &opts.sent {
        SentSource::File { path, format } => files::read_file(path, *format, &opts.sent_key, window, &mut |entry| {
            progress.inc();
            match entry {
                Entry::Key(key) => count(Keyed::Key(key), Side::Sent, ledger, &mut read, &report, String::new),
                Entry::Outside => {
                    read.outside_window += 1;
                    Ok(())
                }
                Entry::Unreadable(u) => lock(&report).unreadable(Side::Sent, &u),
            }
        })?,
        SentSource::Topic(name) => topic::read_to_end(&opts.kafka, name, &mut |m| {
            progress.inc();
            if window.is_some_and(|w| timestamp(m).is_some_and(|ms| !w.has_sent(ms))) {
                read.outside_window += 1;
                return Ok(());
            }
            let keyed = records::sent(key_headers(m), m.payload(), &opts.sent_key);
            count(keyed, Side::Sent, ledger, &mut read, &report, || location(m))
        })?,
    }
    progress.finish();
    let report = report.into_inner().unwrap_or_else(PoisonError::into_inner);
    let s = report.summary();
    s.sent_records += read.records;
    s.skipped += read.skipped;
    s.outside_window_sent += read.outside_window;
    Ok(())
}

/// Reads the processed topic with a reader per partition, up to `PROCESSED_READERS`, each
/// counting into the ledger through a writer of its own.
fn read_processed(opts: &Options, ledger: &Ledger, report: &mut Report) -> Result<()> {
    let progress = Progress::start("reading processed keys", "records", opts.progress);
    let window = opts.window.as_ref();
    let shared = ledger.shared();
    let report = Mutex::new(report);
    let readers = topic::read_to_end_in_parallel(
        &opts.kafka,
        &opts.processed,
        PROCESSED_READERS,
        &|| (shared.writer(), Read::default()),
        &|(writer, read), m| {
            progress.inc();
            if window.is_some_and(|w| timestamp(m).is_some_and(|ms| !w.has_processed(ms))) {
                read.outside_window += 1;
                return Ok(());
            }
            let keyed = match opts.processed_kind {
                ProcessedKind::Output => records::output(key_headers(m)),
                ProcessedKind::Trace => records::trace(m.payload(), opts.trace_node.as_deref()),
            };
            count(keyed, Side::Processed, writer, read, &report, || location(m))
        },
    )?;
    progress.finish();
    let report = report.into_inner().unwrap_or_else(PoisonError::into_inner);
    for (writer, read) in readers {
        writer.finish()?;
        let s = report.summary();
        s.processed_records += read.records;
        s.skipped += read.skipped;
        s.outside_window_processed += read.outside_window;
    }
    Ok(())
}

/// What one reader of a side counted, added to the summary when it is done.
#[derive(Default)]
struct Read {
    /// Records with a key.
    records: u64,
    /// Records that do not count.
    skipped: u64,
    /// Records outside the window.
    outside_window: u64,
    /// The last ledger key written, its buffer reused for the next.
    ledger_key: Vec<u8>,
}

/// The report, shared by the readers of a side; they lock it for an unreadable record only.
fn lock<'a, 'r>(report: &'a Mutex<&'r mut Report>) -> MutexGuard<'a, &'r mut Report> {
    report.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A record's timestamp in epoch milliseconds, when it has one.
fn timestamp(m: &BorrowedMessage<'_>) -> Option<i64> {
    m.timestamp().to_millis()
}

/// Adds what one record contributes; `location` names it when it is unreadable.
fn count(
    keyed: Keyed<'_>,
    side: Side,
    counter: &mut dyn Counter,
    read: &mut Read,
    report: &Mutex<&mut Report>,
    location: impl FnOnce() -> String,
) -> Result<()> {
    match keyed {
        Keyed::Key(key) => {
            read.records += 1;
            key.encode_into(&mut read.ledger_key);
            match side {
                Side::Sent => counter.sent(&read.ledger_key),
                Side::Processed => counter.processed(&read.ledger_key),
            }
        }
        Keyed::Settled(key, how) => {
            key.encode_into(&mut read.ledger_key);
            counter.settled(&read.ledger_key, how)
        }
        Keyed::Skipped => {
            read.skipped += 1;
            Ok(())
        }
        Keyed::Unreadable(reason) => lock(report).unreadable(
            side,
            &Unreadable {
                location: location(),
                reason,
            },
        ),
    }
}

/// `<topic>/<partition>/<offset>`, as trace event ids name records.
fn location(m: &BorrowedMessage<'_>) -> String {
    format!("{}/{}/{}", m.topic(), m.partition(), m.offset())
}

/// The record's `tally.idempotency_key` and `tally.idempotency_key.fields` headers.
fn key_headers<'a>(m: &'a BorrowedMessage<'_>) -> KeyHeaders<'a> {
    let mut found = KeyHeaders::default();
    for h in crate::engine::headers::entries(m) {
        if h.name == IDEMPOTENCY_KEY_HEADER.as_bytes() {
            found.text = found.text.or(h.value);
        } else if h.name == IDEMPOTENCY_KEY_FIELDS_HEADER.as_bytes() {
            found.fields = found.fields.or(h.value);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sent_names_a_topic_or_a_file_with_a_known_format() {
        assert_eq!(
            SentSource::parse("topic:payments.sent", None).expect("topic"),
            SentSource::Topic("payments.sent".into())
        );
        assert_eq!(
            SentSource::parse("out/sent.csv", None).expect("csv"),
            SentSource::File {
                path: "out/sent.csv".into(),
                format: FileFormat::Csv
            }
        );
        assert_eq!(
            SentSource::parse("sent.txt", Some(FileFormat::Jsonl)).expect("explicit"),
            SentSource::File {
                path: "sent.txt".into(),
                format: FileFormat::Jsonl
            }
        );
        assert!(SentSource::parse("sent.txt", None).is_err());
        assert!(SentSource::parse("topic:", None).is_err());
        assert!(SentSource::parse("topic:t", Some(FileFormat::Csv)).is_err());
    }

    #[test]
    fn missing_keys_and_unreadable_sent_records_fail_the_rest_only_when_strict() {
        let clean = Summary::default();
        assert!(failures(&clean, true).is_empty());
        let ghosts = Summary {
            ghost: 2,
            duplicate: 1,
            unreadable_processed: 3,
            ..Summary::default()
        };
        assert!(failures(&ghosts, false).is_empty());
        assert_eq!(
            failures(&ghosts, true),
            ["2 ghost", "1 duplicate", "3 unreadable processed"]
        );
        let lost = Summary {
            missing: 1,
            unreadable_sent: 4,
            ..Summary::default()
        };
        assert_eq!(failures(&lost, false), ["1 missing", "4 unreadable sent"]);
    }
}
