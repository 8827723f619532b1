//! Keys from a file of what upstream says it sent: JSON Lines, a JSON array or CSV (read by
//! `csv_file`), one key per record, found as a [`SentKey`] says.

use super::counted_key::CountedKey;
use super::record_cap::{over_cap, RecordCap, MAX_RECORD_BYTES};
use super::sent_key::SentKey;
use super::window::Window;
use anyhow::{Context, Result};
use serde::de::{Deserializer as _, SeqAccess, Visitor};
use serde_json::Value;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// The layout of a sent file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FileFormat {
    /// One JSON document per line: an object, or a bare string.
    Jsonl,
    /// One JSON array of objects or strings (a file that does not start with `[` is read as
    /// JSON Lines).
    Json,
    /// A header row, then one record per row.
    Csv,
}

impl FileFormat {
    /// The format a file's extension names: `.jsonl`, `.ndjson`, `.json` or `.csv`.
    pub fn from_extension(path: &Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "jsonl" | "ndjson" => Some(Self::Jsonl),
            "json" => Some(Self::Json),
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
    Key(CountedKey<'a>),
    /// The record's time is outside the reconciliation's window.
    Outside,
    /// The record has no usable key.
    Unreadable(Unreadable),
}

/// Reads the file at `path` in `format`, taking keys as `key` says, and hands each record to
/// `each`.
pub fn read_file(
    path: &Path,
    format: FileFormat,
    key: &SentKey,
    window: Option<&Window>,
    each: &mut dyn FnMut(Entry<'_>) -> Result<()>,
) -> Result<()> {
    let file = File::open(path).with_context(|| format!("cannot open the sent file `{}`", path.display()))?;
    let name = path.display().to_string();
    let input = BufReader::with_capacity(1 << 20, file);
    let read = match format {
        FileFormat::Jsonl => read_jsonl(input, &name, key, window, each),
        FileFormat::Json => read_json(input, &name, key, window, each),
        FileFormat::Csv => super::csv_file::read_csv(input, &name, key, window, each),
    };
    read.with_context(|| format!("reading the sent file `{name}`"))
}

/// Reads a JSON array element by element (an export of any size, never held whole); an element
/// without a usable key is unreadable at `<file>[<index>]`. Input that does not start with `[`
/// is read as JSON Lines. JSON that is not valid, or an element over [`MAX_RECORD_BYTES`], ends
/// the read with its place: past it, no element can be told from the next.
pub fn read_json(
    mut input: impl BufRead,
    name: &str,
    key: &SentKey,
    window: Option<&Window>,
    each: &mut dyn FnMut(Entry<'_>) -> Result<()>,
) -> Result<()> {
    // Past a byte-order mark and whitespace to the first byte.
    let mut at_start = true;
    let first = loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        if std::mem::take(&mut at_start) && buf.starts_with(BOM) {
            input.consume(BOM.len());
            continue;
        }
        match buf.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(i) => {
                let b = buf[i];
                input.consume(i);
                break b;
            }
            None => {
                let n = buf.len();
                input.consume(n);
            }
        }
    };
    if first != b'[' {
        return read_jsonl(input, name, key, window, each);
    }
    let (input, start) = RecordCap::new(input, MAX_RECORD_BYTES);
    let mut failed = None;
    let mut index = 0;
    let visitor = Elements {
        name,
        key,
        window,
        each,
        start: &start,
        index: &mut index,
        failed: &mut failed,
    };
    let mut de = serde_json::Deserializer::from_reader(input);
    // `end` refuses anything but whitespace after the array.
    let read = (&mut de).deserialize_seq(visitor).and_then(|()| de.end());
    if let Some(e) = failed {
        return Err(e);
    }
    read.map_err(|e| {
        if !e.is_io() {
            return anyhow::anyhow!("not a valid JSON array: {e}");
        }
        let e = std::io::Error::from(e);
        match over_cap(&e) {
            Some(cap) => anyhow::anyhow!(
                "element {index} of the array runs past {cap} bytes, the most one record may hold; \
                 the elements after it are not read"
            ),
            None => anyhow::Error::new(e).context("cannot read the array"),
        }
    })
}

/// Hands each element of a JSON array to `each`; an error of `each` is kept in `failed`.
struct Elements<'a, 'b> {
    name: &'a str,
    key: &'a SentKey,
    window: Option<&'a Window>,
    each: &'a mut dyn FnMut(Entry<'_>) -> Result<()>,
    /// Starts each element's byte count.
    start: &'a super::record_cap::RecordStart,
    /// The index of the element being read.
    index: &'b mut u64,
    failed: &'b mut Option<anyhow::Error>,
}

impl<'de> Visitor<'de> for Elements<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON array of objects or strings")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(value) = seq.next_element::<Value>()? {
            self.start.now();
            let index = *self.index;
            let entry = sent_entry(value, self.key, self.window);
            let handed = hand(entry, || format!("{}[{index}]", self.name), self.each);
            if let Err(e) = handed {
                *self.failed = Some(e);
                return Err(serde::de::Error::custom("stopped"));
            }
            *self.index += 1;
        }
        Ok(())
    }
}

/// Reads JSON Lines: each non-blank line is a JSON object or a bare JSON string, keyed as `key`
/// says. Blank lines carry no record and are passed over; a line over [`MAX_RECORD_BYTES`] (a
/// file with no line breaks, say) is unreadable, and only that much of it is held in memory.
pub fn read_jsonl(
    mut input: impl BufRead,
    name: &str,
    key: &SentKey,
    window: Option<&Window>,
    each: &mut dyn FnMut(Entry<'_>) -> Result<()>,
) -> Result<()> {
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        let length = read_capped_line(&mut input, &mut line, MAX_RECORD_BYTES)?;
        if length == 0 {
            return Ok(());
        }
        number += 1;
        if length > line.len() {
            let reason = format!("the line is {length} bytes, over the {MAX_RECORD_BYTES} a line may hold");
            hand(Err(reason), || format!("{name}:{number}"), each)?;
            continue;
        }
        let mut text = trim_line_end(&line);
        if number == 1 {
            text = text.strip_prefix(BOM).unwrap_or(text);
        }
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let entry = serde_json::from_slice(text)
            .map_err(|e| format!("not valid JSON: {e}"))
            .and_then(|value| sent_entry(value, key, window));
        hand(entry, || format!("{name}:{number}"), each)?;
    }
}

/// Reads one line, its newline included, into `line`, keeping at most `cap` bytes of it and
/// passing over the rest; returns the line's whole length (0 at the end of the input).
fn read_capped_line(input: &mut impl BufRead, line: &mut Vec<u8>, cap: usize) -> std::io::Result<usize> {
    let held = input.by_ref().take(cap as u64).read_until(b'\n', line)?;
    if held < cap || line.last() == Some(&b'\n') {
        return Ok(held);
    }
    Ok(held + input.skip_until(b'\n')?)
}

/// What a sent record is: outside the window, or its key.
pub(super) enum Sent {
    Key(CountedKey<'static>),
    Outside,
}

/// The entry of one sent JSON value (or CSV row as an object): outside `window`, or keyed as
/// `key` says; the error says why it has no usable key or time.
pub(super) fn sent_entry(value: Value, key: &SentKey, window: Option<&Window>) -> Result<Sent, String> {
    if let Some(w) = window {
        if !w.has_sent_value(&value)? {
            return Ok(Sent::Outside);
        }
    }
    key.of_value(value).map(Sent::Key)
}

/// Hands `entry` to `each`, naming it by `location` when it is unreadable.
pub(super) fn hand(
    entry: Result<Sent, String>,
    location: impl FnOnce() -> String,
    each: &mut dyn FnMut(Entry<'_>) -> Result<()>,
) -> Result<()> {
    match entry {
        Ok(Sent::Key(key)) => each(Entry::Key(key)),
        Ok(Sent::Outside) => each(Entry::Outside),
        Err(reason) => each(Entry::Unreadable(Unreadable {
            location: location(),
            reason,
        })),
    }
}

/// A key given as raw bytes (a CSV field, a header): non-empty UTF-8.
pub fn text_key(bytes: &[u8]) -> Result<&str, String> {
    match std::str::from_utf8(bytes) {
        Ok("") => Err("the key is empty".to_string()),
        Ok(key) => Ok(key),
        Err(_) => Err("the key is not valid UTF-8".to_string()),
    }
}

pub(super) const BOM: &[u8] = b"\xEF\xBB\xBF";

fn trim_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Helpers for the readers' tests.
#[cfg(test)]
pub(super) mod testing {
    use super::*;

    /// Keys and unreadable records in reading order, as `key` or `!location: reason`.
    pub fn collect(read: impl FnOnce(&mut dyn FnMut(Entry<'_>) -> Result<()>) -> Result<()>) -> Vec<String> {
        let mut out = Vec::new();
        read(&mut |e| {
            out.push(match e {
                Entry::Key(k) => k.to_string(),
                Entry::Outside => "-".to_string(),
                Entry::Unreadable(u) => format!("!{}: {}", u.location, u.reason),
            });
            Ok(())
        })
        .expect("read");
        out
    }

    /// A key taken from one field.
    pub fn field(name: &str) -> SentKey {
        SentKey::Field(name.to_string())
    }

    /// A key built with a template.
    pub fn template(t: &str) -> SentKey {
        SentKey::parse("unused", Some(t)).expect("a template")
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{collect, field, template};
    use super::*;
    use crate::reconcile::csv_file::read_csv;

    fn jsonl(text: &str) -> Vec<String> {
        collect(|each| read_jsonl(text.as_bytes(), "sent.jsonl", &field("idempotency_key"), None, each))
    }

    #[test]
    fn jsonl_reads_objects_bare_strings_and_numbers_keeping_repeats() {
        let got = jsonl(
            "{\"idempotency_key\":\"PAY-1:PAID\",\"amount\":3}\n\"PAY-2:PAID\"\r\n{\"idempotency_key\":42}\n\"PAY-1:PAID\"",
        );
        assert_eq!(got, ["PAY-1:PAID", "PAY-2:PAID", "42", "PAY-1:PAID"]);
    }

    #[test]
    fn a_line_past_the_cap_is_unreadable_and_only_the_cap_is_held() {
        let long = format!("\"{}\"\n", "x".repeat(MAX_RECORD_BYTES));
        let got = jsonl(&format!("\"A\"\n{long}\"B\""));
        assert_eq!(got.len(), 3, "the line after it is read");
        assert_eq!((got[0].as_str(), got[2].as_str()), ("A", "B"));
        let over = format!(
            "!sent.jsonl:2: the line is {} bytes, over the {MAX_RECORD_BYTES}",
            long.len()
        );
        assert!(got[1].starts_with(&over), "{}", got[1]);

        // Across buffer boundaries: a reader handing out 3 bytes at a time.
        let mut input = std::io::BufReader::with_capacity(3, &b"abcdefgh\nij\n\nk"[..]);
        let mut line = Vec::new();
        let mut lines = Vec::new();
        loop {
            line.clear();
            match read_capped_line(&mut input, &mut line, 4).expect("read") {
                0 => break,
                n => lines.push((n, String::from_utf8_lossy(&line).into_owned())),
            }
        }
        let expected = [(9, "abcd"), (3, "ij\n"), (1, "\n"), (1, "k")];
        assert_eq!(lines, expected.map(|(n, l)| (n, l.to_string())));
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
        let got = collect(|each| read_jsonl(text.as_bytes(), "f", &field("key"), None, each));
        assert_eq!(got, ["X", "Y"]);
    }

    #[test]
    fn jsonl_invalid_utf8_is_an_unreadable_line() {
        let text = b"\"A\"\n\"\xff\xfe\"\n\"B\"\n";
        let got = collect(|each| read_jsonl(&text[..], "f", &field("idempotency_key"), None, each));
        assert_eq!(got[0], "A");
        assert!(got[1].starts_with("!f:2: not valid JSON"), "{}", got[1]);
        assert_eq!(got[2], "B");
    }

    #[test]
    fn empty_files_have_no_records() {
        assert!(jsonl("").is_empty());
        assert!(jsonl("\n\n").is_empty());
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
        assert_eq!(
            FileFormat::from_extension(Path::new("sent.json")),
            Some(FileFormat::Json)
        );
        assert_eq!(FileFormat::from_extension(Path::new("sent.csv")), Some(FileFormat::Csv));
        assert_eq!(FileFormat::from_extension(Path::new("sent.txt")), None);
        assert_eq!(FileFormat::from_extension(Path::new("sent")), None);
    }

    fn json(text: &str, key: &SentKey) -> Vec<String> {
        collect(|each| read_json(text.as_bytes(), "sent.json", key, None, each))
    }

    #[test]
    fn a_json_array_is_read_element_by_element_and_bad_elements_are_located() {
        let got = json(
            "\u{feff} \n[{\"payment_id\":\"P1\",\"status\":\"PAID\"}, {\"payment_id\":\"P2\"}, \"x\",\n {\"payment_id\":7,\"status\":\"NEW\"}]",
            &template("{payment_id}:{status}"),
        );
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[0], "P1:PAID");
        assert!(got[1].starts_with("!sent.json[1]: cannot build the key"), "{}", got[1]);
        assert!(got[2].starts_with("!sent.json[2]: the value is a string"), "{}", got[2]);
        assert_eq!(got[3], "7:NEW");
        assert_eq!(
            json("[\"A\", {\"idempotency_key\": \"B\"}]", &field("idempotency_key")),
            ["A", "B"]
        );
        assert!(json("  \n ", &field("k")).is_empty(), "an empty file has no records");
        assert!(json("[]", &field("k")).is_empty());
        let trailing = read_json("[\"A\"] x".as_bytes(), "f", &field("k"), None, &mut |_| Ok(()));
        assert!(trailing.is_err(), "text after the array is refused");
    }

    #[test]
    fn a_json_array_element_past_the_cap_ends_the_read_at_its_index() {
        let long = "x".repeat(MAX_RECORD_BYTES);
        let mut got = Vec::new();
        let text = format!("[\"A\", \"{long}\", \"B\"]");
        let err = read_json(text.as_bytes(), "f", &field("k"), None, &mut |e| {
            got.push(format!("{e:?}"));
            Ok(())
        })
        .expect_err("an element past the cap");
        assert_eq!(got.len(), 1, "the element before it is read: {got:?}");
        let text = format!("{err:#}");
        assert!(
            text.contains(&format!("element 1 of the array runs past {MAX_RECORD_BYTES} bytes")),
            "{text}"
        );
        let fits = format!("[\"{}\", \"B\"]", "x".repeat(MAX_RECORD_BYTES - 8));
        assert_eq!(json(&fits, &field("k")).len(), 2, "an element within the cap is read");
    }

    #[test]
    fn a_json_file_that_is_not_an_array_is_read_as_json_lines() {
        assert_eq!(json("\"A\"\n{\"k\":\"B\"}\n", &field("k")), ["A", "B"]);
    }

    #[test]
    fn a_broken_json_array_is_an_error_with_its_place() {
        let err = read_json("[\"A\", {".as_bytes(), "f", &field("k"), None, &mut |_| Ok(())).expect_err("broken");
        assert!(format!("{err:#}").contains("line 1"), "{err:#}");
    }

    #[test]
    fn records_outside_the_window_are_told_apart_in_every_format() {
        let w = Window {
            from_ms: 1_000,
            to_ms: 2_000,
            grace_ms: 0,
            sent_time_field: Some("at".into()),
        };
        let jsonl = collect(|each| {
            read_jsonl(
                "{\"k\":\"A\",\"at\":1500}\n{\"k\":\"B\",\"at\":2500}\n{\"k\":\"C\"}\n".as_bytes(),
                "f",
                &field("k"),
                Some(&w),
                each,
            )
        });
        assert_eq!(jsonl, ["A", "-", "!f:3: the record has no time field `at`"]);
        let csv = collect(|each| {
            read_csv(
                "k,at\nA,1970-01-01T00:00:01.5Z\nB,500\nC,soon\n".as_bytes(),
                "f",
                &field("k"),
                Some(&w),
                each,
            )
        });
        assert_eq!(csv.len(), 3, "{csv:?}");
        assert_eq!(&csv[..2], ["A", "-"]);
        assert!(csv[2].starts_with("!f:4: time column `at`"), "{}", csv[2]);
        let templated = collect(|each| {
            read_csv(
                "id,at\nA,1999\nB,2000\n".as_bytes(),
                "f",
                &template("{id}"),
                Some(&w),
                each,
            )
        });
        assert_eq!(templated, ["A", "-"]);
        let err =
            read_csv("k\nA\n".as_bytes(), "f", &field("k"), Some(&w), &mut |_| Ok(())).expect_err("no time column");
        assert!(format!("{err:#}").contains("no time column `at`"), "{err:#}");
    }
}
