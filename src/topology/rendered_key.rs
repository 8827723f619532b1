//! A key rendered for one record: the readable text people see and the stored form that keeps
//! every record's fields apart.

/// The first character of every stored key. Stores written by earlier versions hold text keys,
/// which start with it only when their first part is a field whose value starts with NUL.
pub const STORED_KEY_START: char = '\0';

/// A key rendered for one record, in two forms.
///
/// `text` is the template with its fields filled in (`SKU-1:WH:A:7`): what trace records, dead
/// letters and logs show. Two records can share it (`WH:A`+`7` and `WH`+`A:7`), so stores keep
/// `stored`: after [`STORED_KEY_START`], each part of the template as a kind (`l` literal, `f`
/// field), its text with `\` and NUL escaped, and a NUL. The NULs split it back into exactly
/// those parts, so distinct field values always give distinct stored keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedKey {
    /// The readable form.
    pub text: String,
    /// The unambiguous form stores use.
    pub stored: String,
    /// Whether another record's fields could give the same `text`: set when a field holds a
    /// character of the template's literals, or the template has two fields side by side or an
    /// optional one (`{f?}`). Never set for a template of one field. When it is not set, `text`
    /// splits back into the fields in one way only.
    pub may_read_alike: bool,
}

impl RenderedKey {
    /// The field values in template order, when `text` alone may not tell them
    /// ([`RenderedKey::may_read_alike`]): what outputs and trace records carry besides the text,
    /// so a reconciliation keeps apart events whose keys read alike.
    pub fn distinct_fields(&self) -> Option<Vec<String>> {
        if !self.may_read_alike {
            return None;
        }
        field_values(&self.stored)
    }
}

/// Appends one part to a stored key: its kind, its text with `\` and NUL escaped, a NUL.
pub(super) fn push_stored(stored: &mut String, kind: char, content: &str) {
    stored.push(kind);
    for c in content.chars() {
        match c {
            '\\' => stored.push_str("\\\\"),
            '\0' => stored.push_str("\\0"),
            other => stored.push(other),
        }
    }
    stored.push('\0');
}

/// The parts of a stored key in order, each as its kind and unescaped text; `None` when `stored`
/// is not a whole stored key (a text key an earlier version wrote, or one cut off).
fn parts(stored: &str) -> Option<Vec<(char, String)>> {
    let mut chars = stored.strip_prefix(STORED_KEY_START)?.chars();
    let mut parts = Vec::new();
    while let Some(kind) = chars.next() {
        let mut text = String::new();
        loop {
            match chars.next()? {
                '\0' => break,
                '\\' => text.push(match chars.next()? {
                    '0' => '\0',
                    other => other,
                }),
                c => text.push(c),
            }
        }
        parts.push((kind, text));
    }
    Some(parts)
}

/// The field values of a stored key, in template order: the inverse of the fields'
/// `push_stored`. `None` when `stored` is not a whole stored key.
pub fn field_values(stored: &str) -> Option<Vec<String>> {
    let parts = parts(stored)?;
    Some(
        parts
            .into_iter()
            .filter(|(kind, _)| *kind == 'f')
            .map(|(_, text)| text)
            .collect(),
    )
}

/// The readable form of a stored key (its parts' texts joined), for logs and errors; a key
/// that is not a stored key (a text key an earlier version wrote) is shown as it is, and one
/// cut off as far as it goes.
pub fn readable_key(stored: &str) -> String {
    let Some(parts) = stored.strip_prefix(STORED_KEY_START) else {
        return stored.to_string();
    };
    let mut text = String::with_capacity(parts.len());
    let mut chars = parts.chars();
    // Each part: its kind, its escaped text, a NUL.
    while chars.next().is_some() {
        loop {
            match chars.next() {
                None | Some('\0') => break,
                Some('\\') => match chars.next() {
                    Some('0') => text.push('\0'),
                    Some(other) => text.push(other),
                    None => break,
                },
                Some(c) => text.push(c),
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::KeyTemplate;
    use serde_json::{json, Value};

    fn render(template: &str, doc: Value) -> RenderedKey {
        let t: KeyTemplate = template.parse().expect("template");
        t.render_key(doc.as_object().expect("object")).expect("renders")
    }

    #[test]
    fn a_stored_key_reads_back_as_its_text_and_a_text_key_as_itself() {
        let key = render("{a}:{b}", json!({"a": "x\\y:", "b": "nul\u{0}z"}));
        assert_eq!(readable_key(&key.stored), key.text);
        assert_eq!(
            field_values(&key.stored),
            Some(vec!["x\\y:".to_string(), "nul\u{0}z".to_string()])
        );
        assert_eq!(readable_key("P-1:PAID"), "P-1:PAID");
        assert_eq!(readable_key("\0f"), "", "a cut-off key reads as far as it goes");
        assert_eq!(field_values("P-1:PAID"), None, "a text key has no fields to give");
        assert_eq!(field_values("\0fcut"), None);
    }

    #[test]
    fn fields_are_carried_exactly_when_the_text_could_read_as_other_fields() {
        let plain = render(
            "{payment_id}:{status}",
            json!({"payment_id": "PAY-1", "status": "PAID"}),
        );
        assert_eq!(plain.distinct_fields(), None);
        let left = render("{payment_id}:{status}", json!({"payment_id": "X:Y", "status": "PAID"}));
        let right = render("{payment_id}:{status}", json!({"payment_id": "X", "status": "Y:PAID"}));
        assert_eq!(left.text, right.text);
        assert_eq!(
            left.distinct_fields(),
            Some(vec!["X:Y".to_string(), "PAID".to_string()])
        );
        assert_eq!(
            right.distinct_fields(),
            Some(vec!["X".to_string(), "Y:PAID".to_string()])
        );
        // A field holding any character of a literal, not only the whole literal.
        let part = render("{a}->{b}", json!({"a": "x-", "b": "y"}));
        assert!(
            part.may_read_alike,
            "marked, though `x-->y` happens to split one way only"
        );
        let single = render("id:{id}", json!({"id": "a:b"}));
        assert_eq!(single.distinct_fields(), None, "one field splits back one way only");
        let adjacent = render("{a}{b}", json!({"a": "x", "b": "y"}));
        assert!(
            adjacent.may_read_alike,
            "xy could be x+y or xy+… with fields side by side"
        );
        let optional = render("{a}:{b?}", json!({"a": "x", "b": "y"}));
        assert!(
            optional.may_read_alike,
            "an optional field may be empty in another record"
        );
    }

    /// The claim `may_read_alike` rests on, checked by brute force: over small alphabets, every
    /// key it leaves unmarked has exactly one stored key for its text.
    #[test]
    fn an_unmarked_key_splits_back_one_way_only() {
        let templates = [
            "{a}-{b}",
            "{a}--{b}-{c}",
            "{a}-{b}--{c}",
            "-{a}-{b}-",
            "{a}ab{b}b{c}",
            "{a}:{b}:{c}",
        ];
        let alphabet = ['x', '-', 'a', 'b', ':'];
        let mut words = vec![String::new()];
        for _ in 0..3 {
            let longer: Vec<String> = words
                .iter()
                .flat_map(|w| alphabet.iter().map(move |c| format!("{w}{c}")))
                .collect();
            words.extend(longer);
        }
        words.retain(|w| !w.is_empty());
        words.sort();
        words.dedup();
        let mut unmarked = 0;
        for source in templates {
            let t: KeyTemplate = source.parse().expect("template");
            let fields: Vec<String> = t.roots().map(str::to_string).collect();
            for (i, a) in words.iter().enumerate() {
                for b in words.iter().skip(i % 7).step_by(7) {
                    let c = &words[(i * 31) % words.len()];
                    let doc: serde_json::Map<String, Value> = fields
                        .iter()
                        .cloned()
                        .zip([a, b, c].map(|v| Value::String(v.clone())))
                        .collect();
                    let key = t.render_key(&doc).expect("renders");
                    if !key.may_read_alike {
                        unmarked += 1;
                        assert_eq!(
                            t.stored_keys_for(&key.text),
                            vec![key.stored.clone()],
                            "{source}: {}",
                            key.text
                        );
                    }
                }
            }
        }
        assert!(unmarked > 1_000, "the check saw {unmarked} unmarked keys");
    }
}
