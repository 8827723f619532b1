//! Record decoding: the JSON object of a record value, keeping only the top-level fields a
//! pipeline reads when it reads only some (decoding every field was the largest share of the
//! per-record CPU after allocation, and it happened on both sides of a repartition hop).

use super::rejection::{Reason, Rejection};
use crate::topology::template::KeyTemplate;
use crate::topology::{Pipeline, Strategy};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;

/// Which top-level fields of a record a pipeline reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fields {
    /// Every field: the record is rewritten or merged, so all of it is needed.
    All,
    /// Only these, sorted (the roots of its key templates, `event_type`, the correlation
    /// field; at a repartition hop, the roots of the hop's key).
    Only(Vec<String>),
}

impl Fields {
    /// The fields `pipeline` reads: all of them when it maps ids, merges or records mappings
    /// (those rewrite or store the whole record), else the roots of every template it renders.
    pub fn of(pipeline: &Pipeline) -> Self {
        let needs_all = !pipeline.map_ids.is_empty()
            || pipeline
                .routes
                .iter()
                .any(|r| matches!(r.strategy, Strategy::Merge { .. } | Strategy::RecordMapping));
        if needs_all {
            return Fields::All;
        }
        let mut names: Vec<String> = vec!["event_type".to_string()];
        names.extend(pipeline.correlation.field.iter().cloned());
        let mut templates = vec![&pipeline.key];
        templates.extend(pipeline.repartition.as_ref().map(|r| &r.key));
        templates.extend(pipeline.co_partitioned.as_ref().map(|c| &c.key));
        templates.extend(pipeline.output.key.as_ref());
        for route in &pipeline.routes {
            if let Strategy::Overwrite { entity, version } = &route.strategy {
                templates.extend([entity, version]);
            }
        }
        names.extend(templates.iter().flat_map(|t| t.roots()).map(str::to_string));
        names.sort();
        names.dedup();
        Fields::Only(names)
    }

    /// The fields a repartition hop reads to re-key a record: the roots of `template` only.
    pub fn of_template(template: &KeyTemplate) -> Self {
        let mut names: Vec<String> = template.roots().map(str::to_string).collect();
        names.sort();
        names.dedup();
        Fields::Only(names)
    }

    /// Decodes a record value that must be a JSON object of at most `max_bytes`, keeping the
    /// fields this set names. The whole value is checked either way: invalid JSON anywhere, or
    /// invalid UTF-8, is rejected as before.
    pub fn decode(&self, payload: Option<&[u8]>, max_bytes: usize) -> Result<Map<String, Value>, Rejection> {
        let Some(bytes) = payload else {
            return Err(Rejection::new(Reason::InvalidJson, "the record has no value"));
        };
        if bytes.len() > max_bytes {
            let detail = format!("{} bytes exceeds max_record_bytes {max_bytes}", bytes.len());
            return Err(Rejection::new(Reason::Oversize, detail));
        }
        let invalid = |e: &dyn fmt::Display| Rejection::new(Reason::InvalidJson, format!("not valid JSON: {e}"));
        let names = match self {
            Fields::Only(names) if bytes.trim_ascii_start().first() == Some(&b'{') => names,
            // Not an object (or every field wanted): the full decode says which.
            _ => {
                return match serde_json::from_slice::<Value>(bytes) {
                    Ok(Value::Object(map)) => Ok(map),
                    Ok(_) => Err(Rejection::new(
                        Reason::NotAnObject,
                        "the value is JSON but not an object",
                    )),
                    Err(e) => Err(invalid(&e)),
                }
            }
        };
        // Skipped strings are not decoded, so UTF-8 is checked up front for all of them.
        let text = std::str::from_utf8(bytes).map_err(|e| invalid(&e))?;
        let mut de = serde_json::Deserializer::from_str(text);
        let map = Selected(names).deserialize(&mut de).map_err(|e| invalid(&e))?;
        de.end().map_err(|e| invalid(&e))?;
        Ok(map)
    }
}

/// Deserializes a JSON object, keeping the named fields and skipping (but checking) the rest.
struct Selected<'a>(&'a [String]);

impl<'de> DeserializeSeed<'de> for Selected<'_> {
    type Value = Map<String, Value>;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Selected<'_> {
    type Value = Map<String, Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key_seed(FieldName)? {
            // A scan, not a binary search: the names are few, and `==` compares lengths before
            // bytes, so most keys are passed over without a memcmp call.
            if self.0.iter().any(|n| n.as_str() == key) {
                // A repeated field keeps its last value, as a full decode does.
                map.insert(key.into_owned(), access.next_value::<Value>()?);
            } else {
                access.next_value::<IgnoredAny>()?;
            }
        }
        Ok(map)
    }
}

/// An object key, borrowed from the input unless it has escapes.
struct FieldName;

impl<'de> DeserializeSeed<'de> for FieldName {
    type Value = Cow<'de, str>;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for FieldName {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only(names: &[&str]) -> Fields {
        let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        v.sort();
        Fields::Only(v)
    }

    fn reason(r: Result<Map<String, Value>, Rejection>) -> Reason {
        r.expect_err("rejected").reason
    }

    #[test]
    fn keeps_only_the_named_fields_with_their_whole_values() {
        let doc = br#"{"a":1,"skip":{"deep":[1,2,{"x":"y"}]},"b":{"c":"d"},"e\u0074":"t","z":null}"#;
        let map = only(&["a", "b", "et"]).decode(Some(doc), 1024).expect("decodes");
        let want = serde_json::json!({"a": 1, "b": {"c": "d"}, "et": "t"});
        assert_eq!(Value::Object(map), want);
        let all = Fields::All.decode(Some(doc), 1024).expect("decodes");
        assert_eq!(all.len(), 5);
    }

    #[test]
    fn a_repeated_field_keeps_its_last_value_like_a_full_decode() {
        let doc = br#"{"a":1,"a":2}"#;
        let full = Fields::All.decode(Some(doc), 64).expect("decodes");
        let some = only(&["a"]).decode(Some(doc), 64).expect("decodes");
        assert_eq!(some, full);
        assert_eq!(some.get("a"), Some(&Value::from(2)));
    }

    #[test]
    fn bad_json_anywhere_is_rejected_even_in_skipped_fields() {
        let f = only(&["a"]);
        assert_eq!(
            reason(f.decode(Some(br#"{"a":1,"skip":[1,}"#), 64)),
            Reason::InvalidJson
        );
        assert_eq!(reason(f.decode(Some(br#"{"a":1} trailing"#), 64)), Reason::InvalidJson);
        assert_eq!(
            reason(f.decode(Some(b"{\"a\":1,\"s\":\"\xff\"}"), 64)),
            Reason::InvalidJson
        );
        assert_eq!(reason(f.decode(Some(b"[1,2]"), 64)), Reason::NotAnObject);
        assert_eq!(reason(f.decode(Some(b" \"text\""), 64)), Reason::NotAnObject);
        assert_eq!(reason(f.decode(None, 64)), Reason::InvalidJson);
        assert_eq!(reason(f.decode(Some(br#"{"a":"0123456789"}"#), 8)), Reason::Oversize);
    }
}
