//! Key templates such as `{payment_id}:{status}`: parsed once, rendered per record.

use super::rendered_key::{push_stored, RenderedKey, STORED_KEY_START};
use serde_json::{Map, Value};
use std::fmt;
use std::str::FromStr;

/// A parsed template: literal text and `{field}` (or `{a.b}` nested) references; `{field?}`
/// accepts an empty string as the field's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate {
    source: String,
    parts: Vec<Part>,
    /// Every character of the template's literals, once each.
    literal_chars: Vec<char>,
    /// Whether any two rendered keys may read alike whatever their fields hold: two or more
    /// fields, two of them side by side or one optional.
    always_may_read_alike: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    /// A field reference; `empty_ok` when written `{field?}`: an empty string is a value.
    Field {
        path: Vec<String>,
        empty_ok: bool,
    },
}

/// Why a template text could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `{` without its `}`.
    #[error("`{{` at character {0} is never closed; write `{{{{` for a literal brace")]
    Unclosed(usize),
    /// A `}` without an opening `{`.
    #[error("`}}` at character {0} has no opening `{{`; write `}}}}` for a literal brace")]
    StrayClose(usize),
    /// A `{` inside a field reference (`{payment_id:{status}`): a brace left unclosed.
    #[error("`{{` at character {1} is inside the field reference opened at character {0}; close that one first")]
    Nested(usize, usize),
    /// `{}` or a reference with an empty path segment.
    #[error("empty field reference `{{{0}}}`; name a field, e.g. `{{payment_id}}`")]
    EmptyField(String),
    /// A template that references no field would give every record the same key.
    #[error("the template references no field, so every record would get the same key")]
    NoField,
}

/// Why a record could not be given a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The field is absent or null.
    #[error("field `{0}` is missing or null")]
    Missing(String),
    /// The field is an object or an array.
    #[error("field `{0}` is an object or array, not a string, number or boolean")]
    NonScalar(String),
    /// The field is the empty string: every record with an empty id would share one key.
    #[error("field `{0}` is empty (write `{{{0}?}}` in the template if an empty value is a real value)")]
    Empty(String),
}

impl FromStr for KeyTemplate {
    type Err = TemplateError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|&(_, n)| n) == Some('{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().map(|&(_, n)| n) == Some('}') => {
                    chars.next();
                    literal.push('}');
                }
                '}' => return Err(TemplateError::StrayClose(i)),
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some((_, '}')) => break,
                            Some((j, '{')) => return Err(TemplateError::Nested(i, j)),
                            Some((_, ch)) => name.push(ch),
                            None => return Err(TemplateError::Unclosed(i)),
                        }
                    }
                    let (reference, empty_ok) = match name.trim_end().strip_suffix('?') {
                        Some(r) => (r, true),
                        None => (name.as_str(), false),
                    };
                    let path: Vec<String> = reference.split('.').map(|s| s.trim().to_string()).collect();
                    if path.iter().any(String::is_empty) {
                        return Err(TemplateError::EmptyField(name));
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Field { path, empty_ok });
                }
                other => literal.push(other),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        let fields = parts.iter().filter(|p| matches!(p, Part::Field { .. })).count();
        if fields == 0 {
            return Err(TemplateError::NoField);
        }
        let side_by_side = parts
            .windows(2)
            .any(|w| matches!(w, [Part::Field { .. }, Part::Field { .. }]));
        let optional = parts.iter().any(|p| matches!(p, Part::Field { empty_ok: true, .. }));
        let mut literal_chars: Vec<char> = parts
            .iter()
            .filter_map(|p| match p {
                Part::Literal(l) => Some(l.chars()),
                Part::Field { .. } => None,
            })
            .flatten()
            .collect();
        literal_chars.sort_unstable();
        literal_chars.dedup();
        Ok(Self {
            source: text.to_string(),
            parts,
            // With one field there is one way to split: the literals around it are fixed.
            literal_chars: if fields > 1 { literal_chars } else { Vec::new() },
            always_may_read_alike: fields > 1 && (side_by_side || optional),
        })
    }
}

impl fmt::Display for KeyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl KeyTemplate {
    /// The top-level fields the template reads (`payment_id` for `{payment_id}`, `order` for
    /// `{order.id}`).
    pub fn roots(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Field { path, .. } => path.first().map(String::as_str),
            Part::Literal(_) => None,
        })
    }

    /// The field references in template order (`["order", "id"]` for `{order.id}`).
    pub fn field_paths(&self) -> impl Iterator<Item = &[String]> {
        self.parts.iter().filter_map(|p| match p {
            Part::Field { path, .. } => Some(path.as_slice()),
            Part::Literal(_) => None,
        })
    }

    /// Builds the key for one JSON object, in both its forms (see [`RenderedKey`]).
    ///
    /// Keys are marked [`RenderedKey::may_read_alike`] by a test that is cheap and never misses:
    /// when every field is non-empty and free of the literals' characters, and no two fields are
    /// side by side, each literal can only match where the template put it, so the text splits
    /// back one way only (`rendered_key::tests` checks this by brute force).
    pub fn render_key(&self, doc: &Map<String, Value>) -> Result<RenderedKey, RenderError> {
        // Sized for a typical key at once: growing three strings was a visible share of a record.
        let mut text = String::with_capacity(64);
        let mut stored = String::with_capacity(96);
        stored.push(STORED_KEY_START);
        let mut value = String::with_capacity(48);
        let mut may_read_alike = self.always_may_read_alike;
        for part in &self.parts {
            let (kind, content) = match part {
                Part::Literal(literal) => ('l', literal.as_str()),
                Part::Field { path, empty_ok } => {
                    value.clear();
                    append_scalar(&mut value, lookup(doc, path), path, *empty_ok)?;
                    may_read_alike = may_read_alike || value.contains(self.literal_chars.as_slice());
                    ('f', value.as_str())
                }
            };
            text.push_str(content);
            push_stored(&mut stored, kind, content);
        }
        Ok(RenderedKey {
            text,
            stored,
            may_read_alike,
        })
    }

    /// Every stored key whose readable form is `text` (at most [`MAX_CANDIDATES`]): usually one,
    /// more when a field's value may hold a literal of the template (`{a}:{b}` and `x:y:z`).
    /// For operators who know a key as trace records and logs show it.
    pub fn stored_keys_for(&self, text: &str) -> Vec<String> {
        let mut found = Vec::new();
        let mut values = Vec::new();
        let mut steps = MAX_SPLIT_STEPS;
        self.split(text, 0, &mut values, &mut found, &mut steps);
        found
    }

    /// Matches `rest` against `parts[i..]`, `values` holding the fields matched so far; gives
    /// up when `steps` run out (adjacent fields over a long text have very many splits).
    fn split<'t>(
        &self,
        rest: &'t str,
        i: usize,
        values: &mut Vec<&'t str>,
        found: &mut Vec<String>,
        steps: &mut usize,
    ) {
        if found.len() >= MAX_CANDIDATES || *steps == 0 {
            return;
        }
        *steps -= 1;
        let Some(part) = self.parts.get(i) else {
            if rest.is_empty() {
                found.push(self.stored_of(values));
            }
            return;
        };
        match part {
            Part::Literal(literal) => {
                if let Some(after) = rest.strip_prefix(literal.as_str()) {
                    self.split(after, i + 1, values, found, steps);
                }
            }
            Part::Field { empty_ok, .. } => {
                let ends: Vec<usize> = match self.parts.get(i + 1) {
                    None => vec![rest.len()],
                    Some(Part::Literal(next)) => rest.match_indices(next.as_str()).map(|(at, _)| at).collect(),
                    Some(Part::Field { .. }) => (0..=rest.len()).filter(|&at| rest.is_char_boundary(at)).collect(),
                };
                for end in ends.into_iter().filter(|&end| end > 0 || *empty_ok) {
                    values.push(&rest[..end]);
                    self.split(&rest[end..], i + 1, values, found, steps);
                    values.pop();
                }
            }
        }
    }

    /// The stored key of the template with `values` as its fields, in order.
    fn stored_of(&self, values: &[&str]) -> String {
        let mut stored = String::from(STORED_KEY_START);
        let mut values = values.iter();
        for part in &self.parts {
            match part {
                Part::Literal(literal) => push_stored(&mut stored, 'l', literal),
                Part::Field { .. } => push_stored(&mut stored, 'f', values.next().copied().unwrap_or_default()),
            }
        }
        stored
    }

    /// Builds the readable key for one JSON object (repartition and output message keys).
    pub fn render(&self, doc: &Map<String, Value>) -> Result<String, RenderError> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Field { path, empty_ok } => append_scalar(&mut out, lookup(doc, path), path, *empty_ok)?,
            }
        }
        Ok(out)
    }
}

/// Most stored keys [`KeyTemplate::stored_keys_for`] returns for one readable key.
pub const MAX_CANDIDATES: usize = 64;
/// Most matching steps [`KeyTemplate::stored_keys_for`] takes.
const MAX_SPLIT_STEPS: usize = 100_000;

fn lookup<'a>(doc: &'a Map<String, Value>, path: &[String]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    rest.iter()
        .try_fold(doc.get(first)?, |value, segment| value.get(segment))
}

fn append_scalar(out: &mut String, value: Option<&Value>, path: &[String], empty_ok: bool) -> Result<(), RenderError> {
    match value {
        None | Some(Value::Null) => Err(RenderError::Missing(path.join("."))),
        Some(Value::String(s)) if s.is_empty() && !empty_ok => Err(RenderError::Empty(path.join("."))),
        Some(Value::String(s)) => {
            out.push_str(s);
            Ok(())
        }
        Some(Value::Number(n)) => {
            out.push_str(&canonical_number(n));
            Ok(())
        }
        Some(Value::Bool(b)) => {
            out.push_str(if *b { "true" } else { "false" });
            Ok(())
        }
        Some(Value::Array(_) | Value::Object(_)) => Err(RenderError::NonScalar(path.join("."))),
    }
}

/// Longest plain spelling of a number in a key; beyond it, the number is written `<digits>e<exp>`.
const PLAIN_DIGITS: usize = 40;

/// One number, one spelling, exactly, however the JSON wrote it: `1299`, `1299.0`, `1299.00`
/// and `1.299e3` are all `1299`, `12.50` is `12.5`, `-0` is `0`. JSON numbers are kept as their
/// text (serde_json's `arbitrary_precision`), so integers of any size stay exact: no two
/// distinct numbers share a spelling. Very large or small magnitudes are written
/// `<significant digits>e<exponent>` instead of hundreds of zeros.
pub fn canonical_number(n: &serde_json::Number) -> String {
    let text = n.to_string();
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.as_str()),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => match e.trim_start_matches('+').parse::<i64>() {
            Ok(e) => (m, e),
            // An exponent beyond 64 bits: its own text keeps it apart from every other number.
            Err(_) => return text,
        },
        None => (unsigned, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all: String = int.chars().chain(frac.chars()).collect();
    let digits = all.trim_start_matches('0');
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return "0".to_string();
    }
    // value = significant × 10^scale
    let scale = exponent
        .checked_sub(frac.len() as i64)
        .and_then(|s| s.checked_add((digits.len() - significant.len()) as i64));
    // An exponent at the edge of 64 bits: saturating would merge neighbours, so keep the text.
    let Some(scale) = scale else {
        return text;
    };
    let sign = if negative { "-" } else { "" };
    let len = significant.len() as i64;
    if scale >= 0 && len.saturating_add(scale) <= PLAIN_DIGITS as i64 {
        format!("{sign}{significant}{}", "0".repeat(scale as usize))
    } else if scale < 0 && scale >= -(PLAIN_DIGITS as i64) {
        let point = len + scale;
        if point > 0 {
            let (whole, part) = significant.split_at(point as usize);
            format!("{sign}{whole}.{part}")
        } else {
            format!("{sign}0.{}{significant}", "0".repeat((-point) as usize))
        }
    } else {
        format!("{sign}{significant}e{scale}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("test documents are objects"),
        }
    }

    #[test]
    fn renders_composite_business_keys() {
        let t: KeyTemplate = "{payment_id}:{status}".parse().expect("valid template");
        let d = doc(json!({"payment_id": "PAY-1", "status": "PAID", "amount": 12.5}));
        assert_eq!(t.render(&d), Ok("PAY-1:PAID".to_string()));
        let v: KeyTemplate = "{entity_type}:{entity_id}:v{version}".parse().expect("valid");
        let d = doc(json!({"entity_type": "customer", "entity_id": "C-1", "version": 17}));
        assert_eq!(v.render(&d), Ok("customer:C-1:v17".to_string()));
    }

    #[test]
    fn renders_nested_fields_and_escaped_braces() {
        let t: KeyTemplate = "{{{order.id}}}".parse().expect("valid template");
        let d = doc(json!({"order": {"id": 7}}));
        assert_eq!(t.render(&d), Ok("{7}".to_string()));
    }

    #[test]
    fn missing_null_and_non_scalar_fields_are_errors() {
        let t: KeyTemplate = "{a}:{b}".parse().expect("valid template");
        assert_eq!(t.render(&doc(json!({"a": 1}))), Err(RenderError::Missing("b".into())));
        assert_eq!(
            t.render(&doc(json!({"a": null, "b": 1}))),
            Err(RenderError::Missing("a".into()))
        );
        assert_eq!(
            t.render(&doc(json!({"a": [1], "b": 1}))),
            Err(RenderError::NonScalar("a".into()))
        );
    }

    #[test]
    fn roots_are_the_first_segment_of_each_field() {
        let t: KeyTemplate = "{order.id}:{status}-{order.line}".parse().expect("valid template");
        assert_eq!(t.roots().collect::<Vec<_>>(), ["order", "status", "order"]);
    }

    #[test]
    fn malformed_templates_are_rejected() {
        assert_eq!("{a".parse::<KeyTemplate>(), Err(TemplateError::Unclosed(0)));
        assert_eq!("a}".parse::<KeyTemplate>(), Err(TemplateError::StrayClose(1)));
        assert_eq!(
            "{a.}".parse::<KeyTemplate>(),
            Err(TemplateError::EmptyField("a.".into()))
        );
        assert_eq!("static".parse::<KeyTemplate>(), Err(TemplateError::NoField));
        assert_eq!(
            "{payment_id:{status}".parse::<KeyTemplate>(),
            Err(TemplateError::Nested(0, 12)),
            "a field literally named `payment_id:{{status` is a typo, not a field"
        );
    }

    #[test]
    fn one_number_has_one_exact_key_however_it_is_spelled_and_empty_values_are_refused() {
        let t: KeyTemplate = "{id}".parse().expect("valid template");
        let render = |spelling: &str| {
            let d: Map<String, Value> = serde_json::from_str(&format!(r#"{{"id": {spelling}}}"#)).expect("json");
            t.render(&d).expect("renders")
        };
        let same = [
            (
                &["1299", "1299.0", "1299.00", "1.299e3", "12990e-1", "1.299E+3"][..],
                "1299",
            ),
            (&["12.5", "12.50", "125e-1", "1.25e1"][..], "12.5"),
            (&["-7", "-7.0", "-0.7e1"][..], "-7"),
            (&["0", "-0", "0.000", "0e10"][..], "0"),
            (&["0.005", "5e-3", "0.50e-2"][..], "0.005"),
            (&["18446744073709551615"][..], "18446744073709551615"),
            (
                &["1e30", "1000000000000000000000000000000"][..],
                "1000000000000000000000000000000",
            ),
            (&["1e300"][..], "1e300"),
            (&["-25e-300", "-2.5e-299"][..], "-25e-300"),
        ];
        for (spellings, key) in same {
            for s in spellings {
                assert_eq!(render(s), key, "{s}");
            }
        }
        // Beyond 64 bits and beyond f64's 53 bits of mantissa, neighbours stay apart.
        assert_ne!(
            render("123456789012345678901234567890"),
            render("123456789012345678901234567891")
        );
        assert_ne!(render("9007199254740993"), render("9007199254740992"));
        assert_ne!(render("0.1000000000000000000001"), render("0.1"));
        assert_ne!(
            render("1.5e-9223372036854775808"),
            render("15e-9223372036854775808"),
            "no saturation"
        );
        assert_eq!(t.render(&doc(json!({"id": ""}))), Err(RenderError::Empty("id".into())));
    }

    #[test]
    fn a_readable_key_gives_back_every_stored_key_that_reads_so() {
        let t: KeyTemplate = "{payment_id}:{status}".parse().expect("template");
        let stored = |d: Value| t.render_key(&doc(d)).expect("renders").stored;
        assert_eq!(
            t.stored_keys_for("PAY-1:PAID"),
            vec![stored(json!({"payment_id": "PAY-1", "status": "PAID"}))]
        );
        // A colon inside a field: both readings, each the key of a real record.
        let both = t.stored_keys_for("A:B:C");
        assert_eq!(
            both,
            vec![
                stored(json!({"payment_id": "A", "status": "B:C"})),
                stored(json!({"payment_id": "A:B", "status": "C"}))
            ]
        );
        assert!(t.stored_keys_for("no-colon").is_empty());
        assert!(t.stored_keys_for(":PAID").is_empty(), "an empty field is no value here");
        let adjacent: KeyTemplate = "{a}{b}".parse().expect("template");
        assert_eq!(
            adjacent.stored_keys_for("xy").len(),
            1,
            "x|y only: fields are never empty"
        );
        let many: KeyTemplate = "{a}{b}{c}{d}".parse().expect("template");
        assert!(many.stored_keys_for(&"z".repeat(200)).len() <= MAX_CANDIDATES);
        let hopeless: KeyTemplate = "{a}{b}{c}:x".parse().expect("template");
        assert!(
            hopeless.stored_keys_for(&"z".repeat(5_000)).is_empty(),
            "bounded work, no match"
        );
        let escaped = t.stored_keys_for("a\\b:c");
        assert_eq!(escaped, vec![stored(json!({"payment_id": "a\\b", "status": "c"}))]);
    }

    #[test]
    fn an_empty_field_is_a_value_only_where_the_template_says_so() {
        let t: KeyTemplate = "{sku}:{batch?}".parse().expect("valid template");
        assert_eq!(t.render(&doc(json!({"sku": "S", "batch": ""}))), Ok("S:".to_string()));
        assert_eq!(
            t.render(&doc(json!({"sku": "", "batch": "7"}))),
            Err(RenderError::Empty("sku".into()))
        );
        assert_eq!(
            t.render(&doc(json!({"sku": "S"}))),
            Err(RenderError::Missing("batch".into())),
            "absent is not empty"
        );
        let empty = t.render_key(&doc(json!({"sku": "S", "batch": ""}))).expect("renders");
        let zero = t.render_key(&doc(json!({"sku": "S", "batch": "0"}))).expect("renders");
        assert_ne!(empty.stored, zero.stored);
        assert_eq!(t.roots().collect::<Vec<_>>(), ["sku", "batch"]);
        assert_eq!("{?}".parse::<KeyTemplate>(), Err(TemplateError::EmptyField("?".into())));
    }
}
