//! Sent keys from a CSV file with a header row: one column holds the key, or a key template
//! is built from the row's columns.

use super::counted_key::CountedKey;
use super::files::{hand, sent_entry, text_key, Entry, Unreadable, BOM};
use super::record_cap::{over_cap, RecordCap, RecordStart, MAX_RECORD_BYTES};
use super::sent_key::SentKey;
use super::window::Window;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::io::Read;

/// Reads CSV with a header row. The key is the column a field names, or a key template built
/// from the row's columns (cells are text: `1299.0` stays `1299.0`). An empty input has no
/// records; a header without a needed column is an error (the whole file would be unreadable),
/// and so is a row over [`MAX_RECORD_BYTES`] (an unbalanced quote, most likely: past it no row
/// can be told from the next).
pub fn read_csv(
    input: impl Read,
    name: &str,
    key: &SentKey,
    window: Option<&Window>,
    each: &mut dyn FnMut(Entry<'_>) -> Result<()>,
) -> Result<()> {
    let (input, start) = RecordCap::new(input, MAX_RECORD_BYTES);
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(input);
    let headers = reader.byte_headers().context("cannot read the header row")?.clone();
    start.now();
    if headers.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let h = if i == 0 { h.strip_prefix(BOM).unwrap_or(h) } else { h };
            String::from_utf8_lossy(h).into_owned()
        })
        .collect();
    let time_column = match window {
        None => None,
        Some(w) => {
            let field = w.time_field().map_err(anyhow::Error::msg)?;
            let found = names.iter().position(|n| n == field);
            Some(found.with_context(|| {
                format!(
                    "the header row has no time column `{field}` (it has: {})",
                    names.join(", ")
                )
            })?)
        }
    };
    let field = match key {
        SentKey::Field(field) => field.as_str(),
        SentKey::Template(t) => {
            let missing: Vec<&str> = t.roots().filter(|r| !names.iter().any(|n| n == r)).collect();
            if !missing.is_empty() {
                bail!(
                    "the header row has no column {} for `{t}` (it has: {})",
                    missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", "),
                    names.join(", ")
                );
            }
            return read_csv_rows(reader, &start, name, &names, key, window, each);
        }
    };
    let Some(column) = names.iter().position(|n| n == field) else {
        bail!(
            "the header row has no column `{field}` (it has: {}); name the key column with --sent-field, \
             or build the key from the columns with --sent-key",
            names.join(", ")
        );
    };
    let mut record = csv::ByteRecord::new();
    loop {
        let row_line = reader.position().line();
        let read = reader.read_byte_record(&mut record);
        start.now();
        match read {
            Ok(false) => return Ok(()),
            Ok(true) => {
                let line = record.position().map_or(0, csv::Position::line);
                let end = reader.position().line();
                let unreadable = |reason: String| Unreadable {
                    location: format!("{name}:{line}"),
                    reason,
                };
                let outside = time_column.zip(window).map(|(i, w)| {
                    let cell = record.get(i).unwrap_or_default();
                    w.has_sent_text(&String::from_utf8_lossy(cell)).map(|inside| !inside)
                });
                match (outside, record.get(column)) {
                    (Some(Err(reason)), _) => each(Entry::Unreadable(unreadable(reason)))?,
                    (Some(Ok(true)), _) => each(Entry::Outside)?,
                    (_, None) => each(Entry::Unreadable(unreadable(format!(
                        "the row has {} field(s), no `{field}` column",
                        record.len()
                    ))))?,
                    (_, Some(key)) if key.contains(&b'\n') => each(Entry::Unreadable(unreadable(format!(
                        "the key runs over lines {line}-{end}: an unbalanced quote?"
                    ))))?,
                    (_, Some(key)) => match text_key(key) {
                        Ok(key) => each(Entry::Key(CountedKey::text(key)))?,
                        Err(reason) => each(Entry::Unreadable(unreadable(reason)))?,
                    },
                }
            }
            Err(e) => match e.position() {
                Some(p) => each(Entry::Unreadable(Unreadable {
                    location: format!("{name}:{}", p.line()),
                    reason: format!("not valid CSV: {e}"),
                }))?,
                None => return Err(unread(e, name, row_line)),
            },
        }
    }
}

/// The template-keyed rows of a CSV file (see [`read_csv`]).
fn read_csv_rows(
    mut reader: csv::Reader<impl Read>,
    start: &RecordStart,
    name: &str,
    columns: &[String],
    key: &SentKey,
    window: Option<&Window>,
    each: &mut dyn FnMut(Entry<'_>) -> Result<()>,
) -> Result<()> {
    let mut record = csv::StringRecord::new();
    loop {
        let row_line = reader.position().line();
        let read = reader.read_record(&mut record);
        start.now();
        match read {
            Ok(false) => return Ok(()),
            Ok(true) => {
                let row: serde_json::Map<String, Value> = columns
                    .iter()
                    .zip(record.iter())
                    .map(|(c, v)| (c.clone(), Value::String(v.to_string())))
                    .collect();
                let line = record.position().map_or(0, csv::Position::line);
                hand(
                    sent_entry(Value::Object(row), key, window),
                    || format!("{name}:{line}"),
                    each,
                )?;
            }
            Err(e) => match e.position() {
                Some(p) => each(Entry::Unreadable(Unreadable {
                    location: format!("{name}:{}", p.line()),
                    reason: format!("not a valid CSV row of text: {e}"),
                }))?,
                None => return Err(unread(e, name, row_line)),
            },
        }
    }
}

/// Why the read of the row at `line` ended: a row over the cap, or the file's own error.
fn unread(e: csv::Error, name: &str, line: u64) -> anyhow::Error {
    if let csv::ErrorKind::Io(io) = e.kind() {
        if let Some(cap) = over_cap(io) {
            return anyhow::anyhow!(
                "{name}:{line}: the row runs past {cap} bytes, the most one record may hold (an \
                 unbalanced quote?); the rows after it are not read"
            );
        }
    }
    anyhow::Error::new(e).context("cannot read a CSV record")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::files::testing::{collect, field, template};

    fn csv(text: &str) -> Vec<String> {
        collect(|each| read_csv(text.as_bytes(), "sent.csv", &field("idempotency_key"), None, each))
    }

    /// The error of reading `text` keyed as `key`, with its causes.
    fn csv_error(text: &str, key: &SentKey) -> String {
        let err = read_csv(text.as_bytes(), "f", key, None, &mut |_| Ok(())).expect_err("refused");
        format!("{err:#}")
    }

    #[test]
    fn an_empty_file_has_no_records() {
        assert!(csv("").is_empty());
        assert!(csv("idempotency_key\n").is_empty());
    }

    #[test]
    fn csv_reads_the_named_column_with_quoting() {
        let got = csv("amount,idempotency_key\n3,PAY-1:PAID\n4,\"PAY-2:PA,ID\"\r\n5,\"PAY-\"\"3\"\"\"\n6,PAY-1:PAID\n");
        assert_eq!(got, ["PAY-1:PAID", "PAY-2:PA,ID", "PAY-\"3\"", "PAY-1:PAID"]);
    }

    #[test]
    fn csv_reports_short_rows_empty_keys_and_runaway_quotes_by_line() {
        let got = csv("amount,idempotency_key\n1,A\n2\n3,\n4,B\n5,\"C\n6,D\n");
        assert_eq!(got[0], "A");
        assert_eq!(
            got[1],
            "!sent.csv:3: the row has 1 field(s), no `idempotency_key` column"
        );
        assert_eq!(got[2], "!sent.csv:4: the key is empty");
        assert_eq!(got[3], "B");
        assert!(
            got[4].starts_with("!sent.csv:6: the key runs over lines 6-"),
            "{}",
            got[4]
        );
        assert_eq!(got.len(), 5, "{got:?}");
    }

    #[test]
    fn a_row_past_the_cap_ends_the_read_at_its_line() {
        // Past the cap by more than the 8 KiB the CSV reader may have buffered before the row.
        let runaway = format!("k\nA\n\"B\n{}", "x,\n".repeat(MAX_RECORD_BYTES / 3 + 4096));
        for key in [field("k"), template("{k}")] {
            let mut got = Vec::new();
            let err = read_csv(runaway.as_bytes(), "sent.csv", &key, None, &mut |e| {
                got.push(format!("{e:?}"));
                Ok(())
            })
            .expect_err("a row past the cap");
            assert_eq!(got.len(), 1, "the row before it is read: {got:?}");
            let text = format!("{err:#}");
            assert!(
                text.starts_with(&format!("sent.csv:3: the row runs past {MAX_RECORD_BYTES} bytes")),
                "{text}"
            );
        }
        let header = format!("{}\n", "k".repeat(MAX_RECORD_BYTES + 1));
        let text = csv_error(&header, &field("k"));
        assert!(text.contains("header row") && text.contains("runs past"), "{text}");
    }

    #[test]
    fn csv_without_the_key_column_is_an_error_naming_the_columns() {
        let text = csv_error("a,b\n1,2\n", &field("idempotency_key"));
        assert!(
            text.contains("no column `idempotency_key`") && text.contains("a, b"),
            "{text}"
        );
    }

    #[test]
    fn csv_rows_build_the_key_from_their_columns() {
        let got = collect(|each| {
            read_csv(
                "status,amount,payment_id\nPAID,3,P1\nNEW,4,\n".as_bytes(),
                "sent.csv",
                &template("{payment_id}:{status}"),
                None,
                each,
            )
        });
        assert_eq!(got[0], "P1:PAID");
        assert!(got[1].starts_with("!sent.csv:3: cannot build the key"), "{}", got[1]);
        let text = csv_error("a,status\n1,2\n", &template("{payment_id}:{status}"));
        assert!(
            text.contains("no column `payment_id`") && text.contains("a, status"),
            "{text}"
        );
    }
}
