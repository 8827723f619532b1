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

/// Replaces `${NAME}` and `${NAME:-default}` using `lookup`; `$$` stands for a literal `$`.
///
/// Line structure is preserved, so YAML locations still point into the original file.
pub fn interpolate(text: &str, lookup: impl Fn(&str) -> Option<String>) -> (String, Vec<Unresolved>) {
    let mut out = String::with_capacity(text.len());
    let mut problems = Vec::new();
    for (line_no, line) in text.split_inclusive('\n').enumerate() {
        let mut rest = line;
        let mut column = 1u64;
        while let Some(pos) = rest.find('$') {
            out.push_str(&rest[..pos]);
            column += rest[..pos].chars().count() as u64;
            let after = &rest[pos + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                out.push('$');
                rest = tail;
                column += 2;
                continue;
            }
            let Some(body_and_tail) = after.strip_prefix('{') else {
                out.push('$');
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
                match (lookup(name), default) {
                    (Some(v), _) => out.push_str(&v),
                    (None, Some(d)) => out.push_str(d),
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
                    }
                }
            }
            column += body.chars().count() as u64 + 3;
            rest = &body_and_tail[end + 1..];
        }
        out.push_str(rest);
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
    fn reports_unclosed_and_invalid_references() {
        let (_, problems) = interpolate("a: ${9X}\nb: ${OPEN\n", env);
        assert_eq!(problems.len(), 2);
        assert!(problems[0].message.contains("not a valid variable"));
        assert!(problems[1].message.contains("never closed"));
    }
}
