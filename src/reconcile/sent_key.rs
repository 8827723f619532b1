//! How a sent record's idempotency key is found: one field that holds it, or the pipeline's own
//! key template applied to the record's fields (an export of upstream's rows, which has no key
//! column, gets exactly the key tally gives the same event).

use super::counted_key::CountedKey;
use crate::topology::KeyTemplate;
use anyhow::{anyhow, Result};
use serde_json::{Map, Value};

/// Where a sent record's key comes from.
#[derive(Debug, Clone)]
pub enum SentKey {
    /// A field (JSON) or column (CSV) holding the key; a bare JSON string is the key itself.
    Field(String),
    /// A key template, such as `{payment_id}:{status}`, rendered as tally renders it.
    Template(KeyTemplate),
}

impl SentKey {
    /// The key of the options: `template` when given (a key template), else `field`.
    pub fn parse(field: &str, template: Option<&str>) -> Result<Self> {
        match template {
            None => Ok(Self::Field(field.to_string())),
            Some(t) => t
                .parse::<KeyTemplate>()
                .map(Self::Template)
                .map_err(|e| anyhow!("--sent-key `{t}` is not a key template: {e}")),
        }
    }

    /// The key of a JSON object or, for a field, a bare string; a template's key carries its
    /// fields where tally's would.
    pub fn of_value(&self, value: Value) -> Result<CountedKey<'static>, String> {
        let key = match (self, value) {
            (Self::Field(_), Value::String(s)) => s,
            (Self::Field(field), Value::Object(mut map)) => match map.remove(field) {
                Some(Value::String(s)) => s,
                // Spelled as tally spells numbers in keys, so `1299.0` here matches `1299` there.
                Some(Value::Number(n)) => crate::topology::template::canonical_number(&n),
                Some(other) => return Err(format!("field `{field}` is {}, not a string", json_type(&other))),
                None => return Err(format!("the object has no field `{field}`")),
            },
            (Self::Field(field), other) => {
                return Err(format!(
                    "the value is {}, not an object with `{field}` or a string",
                    json_type(&other)
                ))
            }
            (Self::Template(t), Value::Object(map)) => return Self::render(t, &map),
            (Self::Template(t), other) => {
                return Err(format!(
                    "the value is {}, not an object to build `{t}` from",
                    json_type(&other)
                ))
            }
        };
        if key.is_empty() {
            return Err("the key is empty".to_string());
        }
        Ok(CountedKey::text(key))
    }

    /// The key in one JSON document (see [`SentKey::of_value`]).
    pub fn of_json(&self, document: &[u8]) -> Result<CountedKey<'static>, String> {
        let value: Value = serde_json::from_slice(document).map_err(|e| format!("not valid JSON: {e}"))?;
        self.of_value(value)
    }

    fn render(t: &KeyTemplate, map: &Map<String, Value>) -> Result<CountedKey<'static>, String> {
        let key = t
            .render_key(map)
            .map_err(|e| format!("cannot build the key `{t}`: {e}"))?;
        if key.text.is_empty() {
            return Err("the key is empty".to_string());
        }
        let fields = key.distinct_fields();
        Ok(CountedKey::with_fields(key.text, fields.as_deref()))
    }
}

/// The JSON type of `v`, as a phrase.
pub fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(spec: &SentKey, json: &str) -> Result<String, String> {
        spec.of_json(json.as_bytes()).map(|k| k.to_string())
    }

    #[test]
    fn a_template_builds_the_key_tally_builds() {
        let spec = SentKey::parse("ignored", Some("{payment_id}:{status}")).expect("template");
        assert_eq!(
            key(&spec, r#"{"payment_id":"PAY-1","status":"PAID","amount":3}"#),
            Ok("PAY-1:PAID".into())
        );
        assert_eq!(
            key(&spec, r#"{"payment_id":1299.0,"status":"PAID"}"#),
            Ok("1299:PAID".into()),
            "numbers are spelled as tally spells them"
        );
        assert_eq!(
            key(&spec, r#"{"payment_id":"X:Y","status":"PAID"}"#),
            Ok(r#"X:Y:PAID ["X:Y","PAID"]"#.into()),
            "fields where tally's output would carry them"
        );
        let missing = key(&spec, r#"{"payment_id":"PAY-1"}"#).expect_err("no status");
        assert!(missing.contains("status"), "{missing}");
        let bare = key(&spec, r#""PAY-1:PAID""#).expect_err("a string has no fields");
        assert!(bare.contains("not an object"), "{bare}");
        assert!(SentKey::parse("f", Some("{unclosed")).is_err());
    }

    #[test]
    fn a_field_takes_strings_numbers_and_bare_strings() {
        let spec = SentKey::parse("idempotency_key", None).expect("field");
        assert_eq!(key(&spec, r#"{"idempotency_key":"A"}"#), Ok("A".into()));
        assert_eq!(key(&spec, r#"{"idempotency_key":42}"#), Ok("42".into()));
        assert_eq!(key(&spec, r#""B""#), Ok("B".into()));
        assert_eq!(key(&spec, r#""""#), Err("the key is empty".into()));
        assert_eq!(
            key(&spec, r#"{"idempotency_key":null}"#),
            Err("field `idempotency_key` is null, not a string".into())
        );
    }
}
