//! The key a topic record contributes to a reconciliation: a sent record, a tally output, or a
//! trace record in `tally.trace/v1` format.

use super::counted_key::CountedKey;
use super::files::text_key;
use super::sent_key::SentKey;
use crate::trace::FORMAT;
use serde::Deserialize;

/// What one topic record contributes.
#[derive(Debug, PartialEq, Eq)]
pub enum Keyed<'a> {
    /// It counts for this idempotency key.
    Key(CountedKey<'a>),
    /// A trace record of an event tally settled without an output: dropped by its rules or
    /// dead-lettered. The key is accounted for, not missing.
    Settled(CountedKey<'a>, Settlement),
    /// It is not one of the records counted (a trace record that is not an output, another
    /// format, another node); counted as skipped.
    Skipped,
    /// It should count but carries no usable key; the sentence says why.
    Unreadable(String),
}

/// How tally settled an event that has no output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Dropped by the rules: a duplicate of an event already processed, or a stale version.
    Dropped,
    /// Sent to the dead-letter topic.
    DeadLettered,
}

/// The key headers of a record: `tally.idempotency_key` and `tally.idempotency_key.fields`.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyHeaders<'a> {
    /// The key's text.
    pub text: Option<&'a [u8]>,
    /// Its field values, on the records whose text alone may not tell them.
    pub fields: Option<&'a [u8]>,
}

impl<'a> KeyHeaders<'a> {
    /// The key they carry, `None` without a text header.
    fn key(self) -> Option<Keyed<'a>> {
        let text = self.text?;
        let keyed = text_key(text).and_then(|text| CountedKey::with_fields_header(text, self.fields));
        Some(match keyed {
            Ok(key) => Keyed::Key(key),
            Err(reason) => Keyed::Unreadable(format!("header: {reason}")),
        })
    }
}

/// A sent record: the key in its idempotency-key headers when present, else found in its JSON
/// value as `key` says.
pub fn sent<'a>(headers: KeyHeaders<'a>, payload: Option<&[u8]>, key: &SentKey) -> Keyed<'a> {
    if let Some(keyed) = headers.key() {
        return keyed;
    }
    match payload {
        None => Keyed::Unreadable("no idempotency-key header and no value".to_string()),
        Some(p) => match key.of_json(p) {
            Ok(key) => Keyed::Key(key),
            Err(reason) => Keyed::Unreadable(format!("no idempotency-key header, and the value: {reason}")),
        },
    }
}

/// A record of a pipeline's output topic: the key in its idempotency-key headers.
pub fn output(headers: KeyHeaders<'_>) -> Keyed<'_> {
    headers
        .key()
        .unwrap_or_else(|| Keyed::Unreadable("no idempotency-key header".to_string()))
}

/// The fields of a trace record a reconciliation reads.
#[derive(Deserialize)]
struct TraceFields {
    format: Option<String>,
    idempotency_key: Option<String>,
    idempotency_key_fields: Option<Vec<String>>,
    node: Option<String>,
    status: Option<String>,
    outcome: Option<String>,
}

/// A trace record: it counts when it says an event was emitted, `COMPLETED` with no outcome or
/// with `PENDING_CREATE`; `COMPLETED` with another outcome (a duplicate, a stale version) and
/// `FAILED` (dead-lettered) settle the key without an output. With `node`, only that node's
/// records count. Records of other formats, and other statuses, are skipped.
pub fn trace(payload: Option<&[u8]>, node: Option<&str>) -> Keyed<'static> {
    let Some(payload) = payload else {
        return Keyed::Unreadable("a trace record without a value".to_string());
    };
    let fields: TraceFields = match serde_json::from_slice(payload) {
        Ok(f) => f,
        Err(e) => return Keyed::Unreadable(format!("not a trace record: {e}")),
    };
    if fields.format.as_deref() != Some(FORMAT) {
        return Keyed::Skipped;
    }
    if node.is_some_and(|n| fields.node.as_deref() != Some(n)) {
        return Keyed::Skipped;
    }
    let settled = match (fields.status.as_deref(), fields.outcome.as_deref()) {
        (Some("COMPLETED"), None | Some("PENDING_CREATE")) => None,
        // The redriven copy is an event of its own, counted when it completes.
        (Some("COMPLETED"), Some("REDRIVEN")) => return Keyed::Skipped,
        // An acknowledged failure is still a key that was never emitted.
        (Some("COMPLETED"), Some("DEAD_LETTER" | "ACKNOWLEDGED")) | (Some("FAILED"), _) => {
            Some(Settlement::DeadLettered)
        }
        (Some("COMPLETED"), Some(_)) => Some(Settlement::Dropped),
        _ => return Keyed::Skipped,
    };
    let key_fields = fields.idempotency_key_fields.as_deref();
    match (fields.idempotency_key, settled) {
        (Some(key), None) if !key.is_empty() => Keyed::Key(CountedKey::with_fields(key, key_fields)),
        (Some(key), Some(how)) if !key.is_empty() => Keyed::Settled(CountedKey::with_fields(key, key_fields), how),
        (_, None) => Keyed::Unreadable("a COMPLETED trace record without an idempotency_key".to_string()),
        // A record dead-lettered before it had a key (invalid JSON, a missing key field) names
        // no key to settle; the dead-letter topic holds it.
        (_, Some(_)) => Keyed::Skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Keyed<'static> {
        Keyed::Key(CountedKey::text(k.to_string()))
    }

    fn text(h: &str) -> KeyHeaders<'_> {
        KeyHeaders {
            text: Some(h.as_bytes()),
            fields: None,
        }
    }

    fn f(name: &str) -> SentKey {
        SentKey::Field(name.to_string())
    }

    fn bytes(s: &str) -> Option<&[u8]> {
        Some(s.as_bytes())
    }

    #[test]
    fn sent_records_prefer_the_header_then_the_value() {
        let object = bytes(r#"{"idempotency_key":"V"}"#);
        let none = KeyHeaders::default();
        assert_eq!(sent(text("H"), object, &f("idempotency_key")), key("H"));
        assert_eq!(sent(none, object, &f("idempotency_key")), key("V"));
        assert_eq!(sent(none, bytes(r#"{"k":"V"}"#), &f("k")), key("V"));
        assert_eq!(sent(none, bytes(r#""S""#), &f("idempotency_key")), key("S"));
        assert!(matches!(sent(none, None, &f("k")), Keyed::Unreadable(_)));
        assert!(matches!(sent(none, bytes("{oops"), &f("k")), Keyed::Unreadable(r) if r.contains("not valid JSON")));
        assert!(matches!(sent(text(""), None, &f("k")), Keyed::Unreadable(r) if r.contains("empty")));
    }

    #[test]
    fn outputs_need_the_header_and_carry_the_fields_when_tally_wrote_them() {
        assert_eq!(output(text("PAY-1:PAID")), key("PAY-1:PAID"));
        assert!(matches!(output(KeyHeaders::default()), Keyed::Unreadable(_)));
        let bad = KeyHeaders {
            text: Some(b"\xff".as_slice()),
            fields: None,
        };
        assert!(matches!(output(bad), Keyed::Unreadable(r) if r.contains("UTF-8")));
        let split = KeyHeaders {
            text: Some(b"X:Y:PAID".as_slice()),
            fields: Some(br#"["X","Y:PAID"]"#.as_slice()),
        };
        let fields = ["X".to_string(), "Y:PAID".to_string()];
        assert_eq!(
            output(split),
            Keyed::Key(CountedKey::with_fields("X:Y:PAID", Some(&fields)))
        );
        let garbled = KeyHeaders {
            fields: Some(b"X".as_slice()),
            ..split
        };
        assert!(matches!(output(garbled), Keyed::Unreadable(r) if r.contains("not a JSON array")));
    }

    fn record(status: &str, outcome: Option<&str>, key: Option<&str>) -> Vec<u8> {
        serde_json::json!({
            "format": "tally.trace/v1", "event_id": "in/0/1", "idempotency_key": key,
            "correlation_id": "c", "node": "app/payments", "status": status, "outcome": outcome,
            "timestamp_ms": 1,
        })
        .to_string()
        .into_bytes()
    }

    fn trace_of(status: &str, outcome: Option<&str>, key: Option<&str>, node: Option<&str>) -> Keyed<'static> {
        trace(Some(record(status, outcome, key).as_slice()), node)
    }

    #[test]
    fn emitting_completions_count_as_outputs_and_drops_and_dead_letters_settle_their_key() {
        assert_eq!(trace_of("COMPLETED", None, Some("K"), None), key("K"));
        assert_eq!(trace_of("COMPLETED", Some("PENDING_CREATE"), Some("K"), None), key("K"));
        let settled = |how| Keyed::Settled(CountedKey::text("K"), how);
        for (status, outcome, expected) in [
            ("COMPLETED", Some("DUPLICATE"), settled(Settlement::Dropped)),
            ("COMPLETED", Some("STALE"), settled(Settlement::Dropped)),
            ("FAILED", Some("DEAD_LETTER"), settled(Settlement::DeadLettered)),
            ("COMPLETED", Some("ACKNOWLEDGED"), settled(Settlement::DeadLettered)),
            ("COMPLETED", Some("REDRIVEN"), Keyed::Skipped),
            ("RECEIVED", None, Keyed::Skipped),
            ("PROCESSING", None, Keyed::Skipped),
        ] {
            assert_eq!(
                trace_of(status, outcome, Some("K"), None),
                expected,
                "{status}/{outcome:?}"
            );
        }
        assert_eq!(
            trace_of("FAILED", Some("DEAD_LETTER"), None, None),
            Keyed::Skipped,
            "a record dead-lettered before it had a key names none"
        );
    }

    #[test]
    fn trace_records_of_other_formats_or_nodes_are_skipped_and_garbage_is_unreadable() {
        let v2 = bytes(r#"{"format":"tally.trace/v2","status":"COMPLETED","idempotency_key":"K"}"#);
        assert_eq!(trace(v2, None), Keyed::Skipped);
        assert_eq!(
            trace_of("COMPLETED", None, Some("K"), Some("app/other")),
            Keyed::Skipped
        );
        assert_eq!(trace_of("COMPLETED", None, Some("K"), Some("app/payments")), key("K"));
        let mut with_fields: serde_json::Value =
            serde_json::from_slice(&record("COMPLETED", Some("DUPLICATE"), Some("X:Y:PAID"))).expect("json");
        with_fields["idempotency_key_fields"] = serde_json::json!(["X:Y", "PAID"]);
        let fields = ["X:Y".to_string(), "PAID".to_string()];
        assert_eq!(
            trace(Some(with_fields.to_string().as_bytes()), None),
            Keyed::Settled(CountedKey::with_fields("X:Y:PAID", Some(&fields)), Settlement::Dropped)
        );
        assert!(matches!(trace(bytes("not json"), None), Keyed::Unreadable(_)));
        assert!(matches!(trace(None, None), Keyed::Unreadable(_)));
        assert!(matches!(
            trace_of("COMPLETED", None, None, None),
            Keyed::Unreadable(r) if r.contains("without an idempotency_key")
        ));
    }
}
