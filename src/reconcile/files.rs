//! Keys from a file of what upstream says it sent: JSON Lines or CSV, one key per record.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// The layout of a sent file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FileFormat {
    /// One JSON document per line: an object with the key field, or a bare string.
    Jsonl,
    /// A header row, then one record per row; the key is one named column.
    Csv,
}

impl FileFormat {
    /// The format a file's extension names: `.jsonl`, `.ndjson`, `.json` or `.csv`.
    pub fn from_extension(path: &Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "jsonl" | "ndjson" | "json" => Some(Self::Jsonl),
            "csv" => Some(Self::Csv),
            _ => None,
        }
    }
}

/// A record that carries no usable key: where it is and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// `<file>:<line>`, or `<topic>/<partition>/<offset>`.
    pub location: String,
    /// What is wrong with it, in a sentence.
    pub reason: String,
}

/// One record read from a source of keys.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry<'a> {
    /// The record's idempotency key.
    Key(&'a str),
    /// The record has no usable key.
    Unreadable(Unreadable),
}

/// Reads the file at `path` in `format`, taking keys from `field`, and hands each record to `each`.
pub fn read_file(
    path: &Path,
    format: FileFormat,
    field: &str,
    each: &mut dyn FnMut(Entry<'_>) -> Result<()>,
) -> Result<()> {
    let file = File::open(path).with_context(|| format!("cannot open the sent file `{}`", path.display()))?;
    let name = path.display().to_string();
    let input = BufReader::with_capacity(1 << 20, file);
    let read = match format {
        FileFormat::Jsonl => read_jsonl(input, &name, field, each),
        FileFormat::Csv => read_csv(input, &name, field, each),
    };
    read.with_context(|| format!("reading the sent file `{name}`"))
}

/// Reads JSON Lines: each non-blank line is a JSON object whose `field` is the key, or a bare
/// JSON string. Blank lines carry no record and are passed over.
pub fn read_jsonl(
    mut input: impl BufRead,
    name: &str,
    field: &str,
    each: &mut dyn FnMut(Entry<'_>) -> Result<()>,
) -> Result<()> {
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        number += 1;
        let mut text = trim_line_end(&line);
        if number == 1 {
            text = text.strip_prefix(BOM).unwrap_or(text);
        }
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match json_key(text, field) {
            Ok(key) => each(Entry::Key(&key))?,
            Err(reason) => each(Entry::Unreadable(Unreadable {
                location: format!("{name}:{number}"),
                reason,
            }))?,
        }
    }
}

/// Reads CSV with a header row; the key is the column named `field`. An empty input has no
/// records; a header without that column is an error (the whole file would be unreadable).
pub fn read_csv(
    input: impl Read,
    name: &str,
    field: &str,
    each: &mut dyn FnMut(Entry<'_>) -> Result<()>,
) -> Result<()> {
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(input);
    let headers = reader.byte_headers().context("cannot read the header row")?.clone();
    if headers.is_empty() {
        return Ok(());
    }
    let column = headers.iter().enumerate().position(|(i, h)| {
        let name = if i == 0 { h.strip_prefix(BOM).unwrap_or(h) } else { h };
        name == field.as_bytes()
    });
    let Some(column) = column else {
        let names: Vec<String> = headers
            .iter()
            .map(|h| String::from_utf8_lossy(h).into_owned())
            .collect();
        bail!(
            "the header row has no column `{field}` (it has: {}); name the key column with --sent-field",
            names.join(", ")
        );
    };
    let mut record = csv::ByteRecord::new();
    loop {
        match reader.read_byte_record(&mut record) {
            Ok(false) => return Ok(()),
            Ok(true) => {
                let line = record.position().map_or(0, csv::Position::line);
                let end = reader.position().line();
                let unreadable = |reason: String| Unreadable {
                    location: format!("{name}:{line}"),
                    reason,
                };
                match record.get(column) {
                    None => each(Entry::Unreadable(unreadable(format!(
                        "the row has {} field(s), no `{field}` column",
                        record.len()
                    ))))?,
                    Some(key) if key.contains(&b'\n') => each(Entry::Unreadable(unreadable(format!(
                        "the key runs over lines {line}-{end}: an unbalanced quote?"
                    ))))?,
                    Some(key) => match text_key(key) {
                        Ok(key) => each(Entry::Key(key))?,
                        Err(reason) => each(Entry::Unreadable(unreadable(reason)))?,
                    },
                }
            }
            Err(e) => match e.position() {
                Some(p) => each(Entry::Unreadable(Unreadable {
                    location: format!("{name}:{}", p.line()),
                    reason: format!("not valid CSV: {e}"),
                }))?,
                None => return Err(e).context("cannot read a CSV record"),
            },
        }
    }
}

/// The key in one JSON document: a bare string, or `field` of an object (a string, or a
/// number in its canonical spelling). The error says what is wrong with the document.
pub fn json_key(document: &[u8], field: &str) -> Result<String, String> {
    let value: serde_json::Value = serde_json::from_slice(document).map_err(|e| format!("not valid JSON: {e}"))?;
    let key = match value {
        serde_json::Value::String(s) => s,
        serde_json::Value::Object(mut map) => match map.remove(field) {
            Some(serde_json::Value::String(s)) => s,
            // Spelled as tally spells numbers in keys, so `1299.0` here matches `1299` there.
            Some(serde_json::Value::Number(n)) => crate::topology::template::canonical_number(&n),
            Some(other) => return Err(format!("field `{field}` is {}, not a string", json_type(&other))),
            None => return Err(format!("the object has no field `{field}`")),
        },
        other => {
            return Err(format!(
                "the value is {}, not an object with `{field}` or a string",
                json_type(&other)
            ))
        }
    };
    if key.is_empty() {
        return Err("the key is empty".to_string());
    }
    Ok(key)
}

/// A key given as raw bytes (a CSV field, a header): non-empty UTF-8.
pub fn text_key(bytes: &[u8]) -> Result<&str, String> {
    match std::str::from_utf8(bytes) {
        Ok("") => Err("the key is empty".to_string()),
        Ok(key) => Ok(key),
        Err(_) => Err("the key is not valid UTF-8".to_string()),
    }
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

fn trim_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys and unreadable records in reading order, as `key` or `!location: reason`.
    fn collect(read: impl FnOnce(&mut dyn FnMut(Entry<'_>) -> Result<()>) -> Result<()>) -> Vec<String> {
        let mut out = Vec::new();
        read(&mut |e| {
            out.push(match e {
                Entry::Key(k) => k.to_string(),
                Entry::Unreadable(u) => format!("!{}: {}", u.location, u.reason),
            });
            Ok(())
        })
        .expect("read");
        out
    }

    fn jsonl(text: &str) -> Vec<String> {
        collect(|each| read_jsonl(text.as_bytes(), "sent.jsonl", "idempotency_key", each))
    }

    fn csv(text: &str) -> Vec<String> {
        collect(|each| read_csv(text.as_bytes(), "sent.csv", "idempotency_key", each))
    }

    #[test]
    fn jsonl_reads_objects_bare_strings_and_numbers_keeping_repeats() {
        let got = jsonl(
            "{\"idempotency_key\":\"PAY-1:PAID\",\"amount\":3}\n\"PAY-2:PAID\"\r\n{\"idempotency_key\":42}\n\"PAY-1:PAID\"",
        );
        assert_eq!(got, ["PAY-1:PAID", "PAY-2:PAID", "42", "PAY-1:PAID"]);
    }

    #[test]
    fn jsonl_reports_each_bad_line_with_its_number_and_goes_on() {
        let got = jsonl(concat!(
            "\"A\"\n",
            "{\"idempotency_key\":\"B\"\n",
            "\n",
            "{\"other\":\"C\"}\n",
            "{\"idempotency_key\":null}\n",
            "[1,2]\n",
            "\"\"\n",
            "\"D\"\n",
        ));
        assert_eq!(got.len(), 7, "{got:?}");
        assert_eq!(got[0], "A");
        assert!(got[1].starts_with("!sent.jsonl:2: not valid JSON"), "{}", got[1]);
        assert_eq!(got[2], "!sent.jsonl:4: the object has no field `idempotency_key`");
        assert_eq!(got[3], "!sent.jsonl:5: field `idempotency_key` is null, not a string");
        assert_eq!(
            got[4],
            "!sent.jsonl:6: the value is an array, not an object with `idempotency_key` or a string"
        );
        assert_eq!(got[5], "!sent.jsonl:7: the key is empty");
        assert_eq!(got[6], "D");
    }

    #[test]
    fn jsonl_field_is_configurable_and_a_bom_is_ignored() {
        let text = "\u{feff}{\"key\":\"X\"}\n{\"key\":\"Y\"}\n";
        let got = collect(|each| read_jsonl(text.as_bytes(), "f", "key", each));
        assert_eq!(got, ["X", "Y"]);
    }

    #[test]
    fn jsonl_invalid_utf8_is_an_unreadable_line() {
        let text = b"\"A\"\n\"\xff\xfe\"\n\"B\"\n";
        let got = collect(|each| read_jsonl(&text[..], "f", "idempotency_key", each));
        assert_eq!(got[0], "A");
        assert!(got[1].starts_with("!f:2: not valid JSON"), "{}", got[1]);
        assert_eq!(got[2], "B");
    }

    #[test]
    fn empty_files_have_no_records() {
        assert!(jsonl("").is_empty());
        assert!(jsonl("\n\n").is_empty());
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
    fn csv_without_the_key_column_is_an_error_naming_the_columns() {
        let err = read_csv("a,b\n1,2\n".as_bytes(), "f", "idempotency_key", &mut |_| Ok(())).expect_err("no column");
        let text = format!("{err:#}");
        assert!(
            text.contains("no column `idempotency_key`") && text.contains("a, b"),
            "{text}"
        );
    }

    #[test]
    fn formats_follow_the_extension() {
        assert_eq!(
            FileFormat::from_extension(Path::new("a/sent.JSONL")),
            Some(FileFormat::Jsonl)
        );
        assert_eq!(
            FileFormat::from_extension(Path::new("sent.ndjson")),
            Some(FileFormat::Jsonl)
        );
        assert_eq!(FileFormat::from_extension(Path::new("sent.csv")), Some(FileFormat::Csv));
        assert_eq!(FileFormat::from_extension(Path::new("sent.txt")), None);
        assert_eq!(FileFormat::from_extension(Path::new("sent")), None);
    }
}
