//! The key a reconciliation counts under: an event's readable idempotency key and, when tally
//! says that text alone may not tell two events apart, its field values; and how the counts of
//! one text are judged, together or apart.

use super::ledger::Counts;
use anyhow::Result;
use std::borrow::Cow;
use std::fmt;

/// A key as one record gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountedKey<'a> {
    /// The readable key (`X:Y:PAID`).
    pub text: Cow<'a, str>,
    /// Its field values as a JSON array (`["X:Y","PAID"]`), written one way only, when the
    /// record carries them.
    pub fields: Option<String>,
}

impl<'a> CountedKey<'a> {
    /// A key known by its text only.
    pub fn text(text: impl Into<Cow<'a, str>>) -> Self {
        Self {
            text: text.into(),
            fields: None,
        }
    }

    /// A key with the field values tally marked it with, if any.
    pub fn with_fields(text: impl Into<Cow<'a, str>>, fields: Option<&[String]>) -> Self {
        Self {
            text: text.into(),
            fields: fields.map(|f| serde_json::Value::from(f).to_string()),
        }
    }

    /// A key with the field values of a `tally.idempotency_key.fields` header, when present.
    pub fn with_fields_header(text: impl Into<Cow<'a, str>>, header: Option<&[u8]>) -> Result<Self, String> {
        let fields = match header {
            None => None,
            Some(bytes) => Some(
                serde_json::from_slice::<Vec<String>>(bytes)
                    .map_err(|e| format!("the key's fields header is not a JSON array of strings: {e}"))?,
            ),
        };
        Ok(Self::with_fields(text, fields.as_deref()))
    }

    /// Writes the key as the ledger keeps it into `out` (emptied first): the text with NUL and
    /// 0x01 escaped, a NUL, then the fields (none: nothing). Keys of one text are thus
    /// neighbours, the one without fields first.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.clear();
        let text = self.text.as_bytes();
        if text.iter().all(|&b| b > 1) {
            out.extend_from_slice(text);
        } else {
            for &b in text {
                match b {
                    0 => out.extend_from_slice(&[1, 1]),
                    1 => out.extend_from_slice(&[1, 2]),
                    other => out.push(other),
                }
            }
        }
        out.push(0);
        out.extend_from_slice(self.fields.as_deref().unwrap_or_default().as_bytes());
    }
}

impl fmt::Display for CountedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.fields {
            None => f.write_str(&self.text),
            Some(fields) => write!(f, "{} {fields}", self.text),
        }
    }
}

/// The ledger key's text part (through its NUL) and its fields; a key without a NUL (never
/// written by [`CountedKey::encode`]) is all text.
fn split(key: &[u8]) -> (&[u8], &[u8]) {
    match key.iter().position(|&b| b == 0) {
        Some(end) => key.split_at(end + 1),
        None => (key, &[]),
    }
}

/// The readable text of an escaped text part (through its NUL).
fn unescape(escaped: &[u8]) -> Cow<'_, str> {
    let escaped = escaped.strip_suffix(&[0]).unwrap_or(escaped);
    if !escaped.contains(&1) {
        // The ledger holds UTF-8 texts: the validating check is the quick one, the lossy
        // reading (chunk by chunk, several times slower per key) only a fallback.
        return std::str::from_utf8(escaped).map_or_else(|_| String::from_utf8_lossy(escaped), Cow::Borrowed);
    }
    let mut out = Vec::with_capacity(escaped.len());
    let mut bytes = escaped.iter();
    while let Some(&b) = bytes.next() {
        out.push(match (b, bytes.clone().next()) {
            (1, Some(&1)) => {
                bytes.next();
                0
            }
            (1, Some(&2)) => {
                bytes.next();
                1
            }
            (other, _) => other,
        });
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// How the keys of the text at hand are judged.
enum Mode {
    /// Some record gave the text without fields: every count of the text is judged as one key,
    /// as when no record carries fields; these are its counts so far.
    Together(Counts),
    /// Every record of the text carried fields: each field set is a key of its own.
    Apart,
}

/// Judges the ledger's keys, handed over in byte order, as the reconciliation counts them. The
/// keys of one text are judged apart by their fields only when every record of the text carried
/// them; a side that names the key by text only (a `--sent-field` export, records of a tally
/// that wrote no fields) cannot say which of them it meant, so then the text is one key.
#[derive(Default)]
pub struct Judge {
    /// The escaped text at hand, through its NUL.
    prefix: Vec<u8>,
    mode: Option<Mode>,
}

/// Hands a key's text, its fields and its counts on for a verdict.
pub type Verdict<'f> = dyn FnMut(&str, Option<&str>, Counts) -> Result<()> + 'f;

impl Judge {
    /// Takes one ledger key and its counts.
    pub fn key(&mut self, key: &[u8], counts: Counts, verdict: &mut Verdict<'_>) -> Result<()> {
        let (prefix, fields) = split(key);
        if self.prefix != prefix {
            self.finish(verdict)?;
            self.prefix.clear();
            self.prefix.extend_from_slice(prefix);
        }
        match &mut self.mode {
            Some(Mode::Together(held)) => {
                *held = held.plus(counts);
                Ok(())
            }
            // The key without fields sorts first among its text's, so none follows an `Apart`.
            Some(Mode::Apart) => verdict(&unescape(prefix), std::str::from_utf8(fields).ok(), counts),
            None if fields.is_empty() => {
                self.mode = Some(Mode::Together(counts));
                Ok(())
            }
            None => {
                self.mode = Some(Mode::Apart);
                verdict(&unescape(prefix), std::str::from_utf8(fields).ok(), counts)
            }
        }
    }

    /// Judges what is still held: call after the last key.
    pub fn finish(&mut self, verdict: &mut Verdict<'_>) -> Result<()> {
        match self.mode.take() {
            Some(Mode::Together(counts)) => verdict(&unescape(&self.prefix), None, counts),
            Some(Mode::Apart) | None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn counts(sent: u64, processed: u64) -> Counts {
        Counts {
            sent,
            processed,
            ..Counts::default()
        }
    }

    fn fields(values: &[&str]) -> Option<Vec<String>> {
        Some(values.iter().map(|v| v.to_string()).collect())
    }

    /// The verdicts over keys counted as given (key, fields, sent, processed), in ledger order.
    fn judge(counted: &[(&str, Option<Vec<String>>, u64, u64)]) -> Vec<String> {
        let mut ledger: BTreeMap<Vec<u8>, Counts> = BTreeMap::new();
        for (text, f, sent, processed) in counted {
            let mut key = Vec::new();
            CountedKey::with_fields(*text, f.as_deref()).encode_into(&mut key);
            let c = ledger.entry(key).or_default();
            *c = c.plus(counts(*sent, *processed));
        }
        let mut out = Vec::new();
        let mut judge = Judge::default();
        let mut verdict = |text: &str, fields: Option<&str>, c: Counts| {
            out.push(format!("{text} {} {}/{}", fields.unwrap_or("-"), c.sent, c.processed));
            Ok(())
        };
        for (key, c) in &ledger {
            judge.key(key, *c, &mut verdict).expect("judged");
        }
        judge.finish(&mut verdict).expect("judged");
        out
    }

    #[test]
    fn keys_that_read_alike_are_judged_apart_when_every_record_says_its_fields() {
        let lost = judge(&[
            ("X:Y:PAID", fields(&["X:Y", "PAID"]), 1, 0),
            ("X:Y:PAID", fields(&["X", "Y:PAID"]), 1, 1),
            ("A:PAID", None, 1, 1),
        ]);
        assert_eq!(
            lost,
            [
                "A:PAID - 1/1",
                r#"X:Y:PAID ["X","Y:PAID"] 1/1"#,
                r#"X:Y:PAID ["X:Y","PAID"] 1/0"#,
            ],
            "the lost one is found"
        );
    }

    #[test]
    fn a_text_named_without_fields_by_any_record_is_one_key() {
        let merged = judge(&[
            ("X:Y:PAID", None, 2, 0),
            ("X:Y:PAID", fields(&["X:Y", "PAID"]), 0, 1),
            ("X:Y:PAID", fields(&["X", "Y:PAID"]), 0, 1),
            ("Z", fields(&["Z"]), 1, 1),
        ]);
        assert_eq!(merged, ["X:Y:PAID - 2/2", r#"Z ["Z"] 1/1"#]);
    }

    #[test]
    fn texts_with_nul_and_control_bytes_stay_apart_and_read_back() {
        let texts = ["a", "a\0", "a\0b", "a\u{1}", "a\u{1}\u{2}", "a\u{2}", ""];
        let counted: Vec<_> = texts.iter().map(|t| (*t, None, 1, 1)).collect();
        let mut got = judge(&counted);
        got.sort();
        let mut want: Vec<String> = texts.iter().map(|t| format!("{t} - 1/1")).collect();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn a_fields_header_must_be_an_array_of_strings() {
        let ok = CountedKey::with_fields_header("X:Y:PAID", Some(br#"[ "X:Y" , "PAID" ]"#)).expect("reads");
        assert_eq!(ok.fields.as_deref(), Some(r#"["X:Y","PAID"]"#), "written one way only");
        assert!(CountedKey::with_fields_header("k", Some(b"[1]")).is_err());
        assert!(CountedKey::with_fields_header("k", Some(b"\xff")).is_err());
        assert_eq!(CountedKey::with_fields_header("k", None), Ok(CountedKey::text("k")));
    }
}
