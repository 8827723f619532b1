//! Correlation ids: taken from a header or field, else derived deterministically.

use crate::topology::CorrelationSpec;
use serde_json::{Map, Value};
use std::borrow::Cow;
use uuid::Uuid;

/// Namespace for derived ids, so the same seed gives the same id in every instance and replay.
const NAMESPACE: Uuid = Uuid::from_u128(0x6f1d_1c55_7a2e_4b8e_9c0d_2b7e_5a61_c0de);

/// The correlation id of a record: header, then payload field, then derived from `seed`.
pub fn resolve(
    spec: &CorrelationSpec,
    header_value: Option<&str>,
    doc: Option<&Map<String, Value>>,
    seed: &str,
) -> String {
    if let Some(h) = header_value.filter(|h| !h.is_empty()) {
        return h.to_string();
    }
    let field = spec.field.as_deref().and_then(|f| doc?.get(f)).and_then(|v| match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    });
    field.unwrap_or_else(|| derive(seed))
}

/// A deterministic id (UUIDv5) for a seed such as the idempotency key.
pub fn derive(seed: &str) -> String {
    Uuid::new_v5(&NAMESPACE, seed.as_bytes()).to_string()
}

/// The longest correlation id a dead letter or trace record of a refused record carries as it
/// came, measured as a JSON string's contents (escapes included); with the other parts tally
/// bounds, this keeps such records far under any write limit tally starts with
/// (`engine::admin::MIN_WRITE_LIMIT`).
pub const MAX_CARRIED_BYTES: usize = 1024;

/// `id`, or when it takes more than [`MAX_CARRIED_BYTES`] in JSON, the id [`derive`]d from it:
/// for tally's own records that would not fit with the whole id (an input may carry an id of
/// nearly a megabyte, or of control characters JSON writes in six bytes each).
pub fn carried(id: &str) -> Cow<'_, str> {
    if id.len() <= MAX_CARRIED_BYTES / 6 || (id.len() <= MAX_CARRIED_BYTES && json_len(id) <= MAX_CARRIED_BYTES) {
        Cow::Borrowed(id)
    } else {
        Cow::Owned(derive(id))
    }
}

/// The length of `text` written inside a JSON string: serde_json escapes `"`, `\` and control
/// characters, five of them in two bytes and the others in six (`\u0001`).
fn json_len(text: &str) -> usize {
    text.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\x08' | b'\t' | b'\n' | b'\x0c' | b'\r' => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

/// Replaces `text` by the id derived from it when it takes more than [`MAX_CARRIED_BYTES`] in
/// JSON (see [`carried`]).
pub fn shorten(text: &mut String) {
    let short = match carried(text) {
        Cow::Owned(short) => Some(short),
        Cow::Borrowed(_) => None,
    };
    if let Some(short) = short {
        *text = short;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> CorrelationSpec {
        CorrelationSpec {
            header: Some("correlation_id".into()),
            field: Some("correlation_id".into()),
        }
    }

    #[test]
    fn header_wins_then_field_then_derived() {
        let doc = json!({"correlation_id": "from-field"});
        let doc = doc.as_object();
        assert_eq!(resolve(&spec(), Some("from-header"), doc, "k"), "from-header");
        assert_eq!(resolve(&spec(), None, doc, "k"), "from-field");
        assert_eq!(resolve(&spec(), Some(""), None, "k"), derive("k"));
    }

    #[test]
    fn only_ids_over_the_limit_are_replaced_by_one_derived_from_them() {
        let limit = "c".repeat(MAX_CARRIED_BYTES);
        assert_eq!(carried(&limit), limit.as_str());
        let long = "c".repeat(MAX_CARRIED_BYTES + 1);
        assert_eq!(carried(&long), derive(&long));
        assert_ne!(carried(&long), carried(&"d".repeat(MAX_CARRIED_BYTES + 1)));
    }

    #[test]
    fn ids_are_measured_as_json_writes_them() {
        for text in ["\u{1}", "\"", "\\", "\n", "\u{1f}", "é", "\u{7f}"] {
            let escaped = serde_json::to_string(text).expect("json");
            assert_eq!(json_len(text), escaped.len() - 2, "{text:?}");
        }
        // 200 bytes, 1,200 in JSON: each would fill a trace record or alert sixfold.
        let control = "\u{1}".repeat(200);
        assert_eq!(carried(&control), derive(&control));
        let fits = "\u{1}".repeat(MAX_CARRIED_BYTES / 6);
        assert_eq!(carried(&fits), fits.as_str());
        let quotes = "\"".repeat(MAX_CARRIED_BYTES / 2);
        assert_eq!(carried(&quotes), quotes.as_str());
        let over = format!("{quotes}x");
        assert_eq!(carried(&over), derive(&over));
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        assert_eq!(derive("PAY-1:PAID"), derive("PAY-1:PAID"));
        assert_ne!(derive("PAY-1:PAID"), derive("PAY-1:SHIPPED"));
    }
}
