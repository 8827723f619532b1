//! `${VAR}` / `${VAR:-default}` substitution in topology text, before YAML parsing.

/// An unset variable without a default, with its place in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    /// 1-based line of the `${`.
    pub line: u64,
    /// 1-based column of the `${`.
    pub column: u64,
    /// The sentence to show.
    pub message: String,
}

/// Replaces `${NAME}` and `${NAME:-default}` in YAML text using `lookup`; `$$` stands for a
/// literal `$`. A value inside a quoted YAML string is escaped for it (`"` and `\` in a
/// double-quoted one, `'` in a single-quoted one), so it arrives as it is: a password from the
/// environment may hold any character when written `"${PASSWORD}"`.
///
/// Line structure is preserved, so YAML locations still point into the original file.
pub fn interpolate(text: &str, lookup: impl Fn(&str) -> Option<String>) -> (String, Vec<Unresolved>) {
    substitute(text, lookup, Some(Quotes::default()))
}

/// [`interpolate`] for text that is not YAML (a command-line value): values go in as they are.
pub fn interpolate_plain(text: &str, lookup: impl Fn(&str) -> Option<String>) -> (String, Vec<Unresolved>) {
    substitute(text, lookup, None)
}

/// Where the YAML text around a reference stands: in which kind of scalar.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Scalar {
    /// Outside quotes (a plain scalar, a key, indentation).
    #[default]
    Plain,
    /// Inside `"…"`.
    Double,
    /// Inside `'…'`.
    Single,
}

/// Follows the YAML text between references, as far as quoting goes. A quote opens a quoted
/// scalar only where a scalar may start (after indentation, `: `, `- `, `[`, `{`, `,`, `? `),
/// so the `'` of `it's` does not; a comment's quotes are ignored.
#[derive(Debug, Default)]
struct Quotes {
    scalar: Scalar,
    /// The last character outside quotes on this line that is not a blank.
    last_solid: Option<char>,
    /// The character before, blank or not.
    last: Option<char>,
    /// A `\` just seen inside a double-quoted scalar.
    escaping: bool,
    /// A `'` just closed a single-quoted scalar (a second one right after is a literal `'`).
    single_closed: bool,
    /// The rest of the line is a comment.
    comment: bool,
}

impl Quotes {
    /// A new line starts; quoted scalars go on across lines.
    fn new_line(&mut self) {
        self.last_solid = None;
        self.last = None;
        self.comment = false;
        self.single_closed = false;
    }

    /// Follows template text (never a substituted value).
    fn feed(&mut self, text: &str) {
        for c in text.chars() {
            self.step(c);
        }
    }

    fn step(&mut self, c: char) {
        let reopened = std::mem::take(&mut self.single_closed);
        match self.scalar {
            _ if self.comment => {}
            Scalar::Double if self.escaping => self.escaping = false,
            Scalar::Double if c == '\\' => self.escaping = true,
            Scalar::Double if c == '"' => self.scalar = Scalar::Plain,
            Scalar::Double => {}
            Scalar::Single if c == '\'' => {
                self.scalar = Scalar::Plain;
                self.single_closed = true;
            }
            Scalar::Single => {}
            Scalar::Plain if c == '\'' && reopened => self.scalar = Scalar::Single,
            Scalar::Plain if c == '#' && self.last.is_none_or(char::is_whitespace) => self.comment = true,
            Scalar::Plain if (c == '"' || c == '\'') && self.scalar_may_start() => {
                self.scalar = if c == '"' { Scalar::Double } else { Scalar::Single };
            }
            Scalar::Plain => {}
        }
        if self.scalar == Scalar::Plain && !c.is_whitespace() {
            self.last_solid = Some(c);
        }
        self.last = Some(c);
    }

    fn scalar_may_start(&self) -> bool {
        let after_blank = self.last.is_none_or(char::is_whitespace);
        match self.last_solid {
            None => true,
            Some('[' | '{' | ',') => true,
            Some(':' | '-' | '?') => after_blank,
            Some(_) => false,
        }
    }

    /// `value` written so that the scalar it lands in reads it back unchanged.
    fn escape(&mut self, value: &str) -> String {
        match self.scalar {
            Scalar::Double => {
                let mut out = String::with_capacity(value.len());
                for c in value.chars() {
                    match c {
                        '\\' => out.push_str("\\\\"),
                        '"' => out.push_str("\\\""),
                        '\n' => out.push_str("\\n"),
                        '\r' => out.push_str("\\r"),
                        '\t' => out.push_str("\\t"),
                        c => out.push(c),
                    }
                }
                out
            }
            Scalar::Single => value.replace('\'', "''"),
            Scalar::Plain => {
                // What follows a plain value continues its scalar.
                if let Some(c) = value.chars().last() {
                    self.last = Some(c);
                    if !c.is_whitespace() {
                        self.last_solid = Some(c);
                    }
                }
                value.to_string()
            }
        }
    }
}

fn substitute(
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
    mut quotes: Option<Quotes>,
) -> (String, Vec<Unresolved>) {
    let mut out = String::with_capacity(text.len());
    let mut problems = Vec::new();
    for (line_no, line) in text.split_inclusive('\n').enumerate() {
        if let Some(q) = quotes.as_mut() {
            q.new_line();
        }
        let mut rest = line;
        let mut column = 1u64;
        while let Some(pos) = rest.find('$') {
            out.push_str(&rest[..pos]);
            if let Some(q) = quotes.as_mut() {
                q.feed(&rest[..pos]);
            }
            column += rest[..pos].chars().count() as u64;
            let after = &rest[pos + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                out.push('$');
                if let Some(q) = quotes.as_mut() {
                    q.feed("$");
                }
                rest = tail;
                column += 2;
                continue;
            }
            let Some(body_and_tail) = after.strip_prefix('{') else {
                out.push('$');
                if let Some(q) = quotes.as_mut() {
                    q.feed("$");
                }
                rest = after;
                column += 1;
                continue;
            };
            let Some(end) = body_and_tail.find('}') else {
                problems.push(Unresolved {
                    line: line_no as u64 + 1,
                    column,
                    message: "`${` is never closed with `}`; write `$${` for a literal `${`".to_string(),
                });
                out.push_str(&rest[pos..]);
                rest = "";
                break;
            };
            let body = &body_and_tail[..end];
            let (name, default) = match body.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (body, None),
            };
            let valid_name = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if !valid_name {
                problems.push(Unresolved {
                    line: line_no as u64 + 1,
                    column,
                    message: format!(
                        "`${{{body}}}` is not a valid variable reference; names use letters, digits and `_`"
                    ),
                });
            } else {
                let value = match (lookup(name), default) {
                    (Some(v), _) => Some(v),
                    (None, Some(d)) => Some(d.to_string()),
                    (None, None) => {
                        // Keep the reference so later checks do not report a cascade of
                        // "missing" values for this one problem.
                        out.push_str(&rest[pos..pos + body.len() + 3]);
                        problems.push(Unresolved {
                        line: line_no as u64 + 1,
                        column,
                        message: format!(
                            "environment variable `{name}` is not set and `${{{name}}}` has no default; set it or write `${{{name}:-default}}`"
                        ),
                        });
                        None
                    }
                };
                if let Some(value) = value {
                    match quotes.as_mut() {
                        Some(q) => out.push_str(&q.escape(&value)),
                        None => out.push_str(&value),
                    }
                }
            }
            column += body.chars().count() as u64 + 3;
            rest = &body_and_tail[end + 1..];
        }
        out.push_str(rest);
        if let Some(q) = quotes.as_mut() {
            q.feed(rest);
        }
    }
    (out, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "BROKER").then(|| "kafka:9092".to_string())
    }

    #[test]
    fn substitutes_set_variables_and_defaults() {
        let (out, problems) = interpolate("a: ${BROKER}\nb: ${MISSING:-x}\nc: $$5 $x\n", env);
        assert_eq!(out, "a: kafka:9092\nb: x\nc: $5 $x\n");
        assert!(problems.is_empty());
    }

    #[test]
    fn reports_every_unset_variable_with_its_place() {
        let (_, problems) = interpolate("a: ${ONE}\nbb: x ${TWO} ${BROKER}\n", env);
        let places: Vec<_> = problems.iter().map(|p| (p.line, p.column)).collect();
        assert_eq!(places, vec![(1, 4), (2, 7)]);
        assert!(problems[1].message.contains("`TWO`"));
    }

    #[test]
    fn a_value_in_a_quoted_string_arrives_as_it_is() {
        let nasty = [
            r#"p"q\w"#,
            "it's",
            "Tq9#v: *w&{x}%",
            "tab\there",
            r"C:\new",
            "'",
            r"\",
            "",
        ];
        for value in nasty {
            let lookup = |_: &str| Some(value.to_string());
            let text = "a: \"${P}\"\nb: '${P}'\nc: [\"x\", '${P}']\nd: {k: \"${P}\"} # it's \"${P}\"\n";
            let (out, problems) = interpolate(text, lookup);
            assert!(problems.is_empty());
            let parsed: std::collections::BTreeMap<String, serde_json::Value> =
                serde_saphyr::from_str(&out).unwrap_or_else(|e| panic!("{value:?}: {e}\n{out}"));
            assert_eq!(parsed["a"], value, "double-quoted, {out}");
            assert_eq!(parsed["b"], value, "single-quoted, {out}");
            assert_eq!(parsed["c"][1], value, "in a flow sequence, {out}");
            assert_eq!(parsed["d"]["k"], value, "in a flow mapping, {out}");
        }
    }

    #[test]
    fn quotes_inside_a_plain_scalar_or_a_comment_open_nothing() {
        let lookup = |_: &str| Some(r#"x"y"#.to_string());
        // The `'` of `it's` and the `"` in the comment leave the reference outside quotes: its
        // value goes in unescaped, as the YAML parser sees it.
        let (out, _) = interpolate("a: it's ${P}\n# \"${P}\nb: \"${P}\"\n", lookup);
        assert_eq!(out, "a: it's x\"y\n# \"x\"y\nb: \"x\\\"y\"\n");
        // Not YAML: as it is.
        let (out, _) = interpolate_plain("\"${P}\"", lookup);
        assert_eq!(out, r#""x"y""#);
    }

    #[test]
    fn reports_unclosed_and_invalid_references() {
        let (_, problems) = interpolate("a: ${9X}\nb: ${OPEN\n", env);
        assert_eq!(problems.len(), 2);
        assert!(problems[0].message.contains("not a valid variable"));
        assert!(problems[1].message.contains("never closed"));
    }
}
