//! The `queries:` section: whether the read-only HTTP query API is served, and the URL template
//! other instances redirect a query to.

use super::diagnostics::Collector;
use super::raw::RawQueries;
use crate::topology::{GroupProtocol, QuerySettings};
use serde_saphyr::Spanned;

/// Checks `queries:`: `Ok(None)` when off, `Err(())` after reporting every problem.
/// `protocol` is the group protocol when `processing:` was valid.
pub(super) fn queries(
    c: &mut Collector,
    raw: Spanned<RawQueries>,
    protocol: Option<GroupProtocol>,
) -> Result<Option<QuerySettings>, ()> {
    let at = raw.referenced;
    let q = raw.value;
    let enabled = q.enabled.as_ref().is_some_and(|e| e.value);
    let mut ok = true;
    if let (Some(e), Some(GroupProtocol::Consumer)) = (&q.enabled, protocol) {
        if e.value {
            // Owners are found in the classic group's member assignments (DescribeGroups).
            c.at_loc(
                e.referenced,
                "`queries.enabled` needs `processing.group_protocol: classic`: a key's owner is found in the \
                 classic group's member assignments; use the classic protocol or leave queries off",
            );
            ok = false;
        }
    }
    let url = match q.advertised_url {
        // Checked even when off, so a mistake shows before someone turns queries on.
        Some(url) => {
            let problems = url_problems(&url.value);
            for p in &problems {
                c.at_loc(url.referenced, format!("`queries.advertised_url` `{}`: {p}", url.value));
            }
            ok &= problems.is_empty();
            Some(url.value)
        }
        None if enabled => {
            c.at_loc(
                at,
                "`queries.advertised_url` is required when queries are enabled: the URL other instances \
                 redirect a query to, e.g. \"http://{instance}.tally-headless:8080\"",
            );
            ok = false;
            None
        }
        None => None,
    };
    if !ok {
        return Err(());
    }
    Ok(url
        .filter(|_| enabled)
        .map(|advertised_url| QuerySettings { advertised_url }))
}

/// What is wrong with an advertised URL template, each as a sentence.
fn url_problems(url: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Some(rest) = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")) else {
        found.push("it must start with `http://` or `https://`".to_string());
        return found;
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#']) {
        found.push("it must have no path, query or fragment: the query's own path is appended to it".to_string());
    }
    if !authority.contains(QuerySettings::PLACEHOLDER) {
        found.push(format!(
            "it has no `{}`: every instance would redirect to the same address, and a query sent to an \
             instance that does not own the key would come back to it; write `{}` where the owner's \
             instance id goes (in Kubernetes the pod name: `http://{{instance}}.<headless service>:<port>`)",
            QuerySettings::PLACEHOLDER,
            QuerySettings::PLACEHOLDER
        ));
    }
    let rest = authority.replace(QuerySettings::PLACEHOLDER, "");
    if rest.contains(['{', '}']) {
        found.push(format!(
            "`{}` is the only placeholder it may hold",
            QuerySettings::PLACEHOLDER
        ));
    }
    let bad: String = rest
        .chars()
        // A path, query or fragment is reported above.
        .filter(|c| {
            !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']' | '{' | '}' | '/' | '?' | '#'))
        })
        .collect();
    if !bad.is_empty() {
        found.push(format!("a host and port cannot hold the characters `{bad}`"));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_need_a_scheme_the_placeholder_and_no_path() {
        assert!(url_problems("http://{instance}.tally-headless:8080").is_empty());
        assert!(url_problems("https://127.0.0.1:{instance}/").is_empty());
        assert_eq!(url_problems("ftp://{instance}").len(), 1);
        assert_eq!(url_problems("{instance}:8080").len(), 1, "no scheme");
        let all = url_problems("http://tally:8080/queries?x={id}");
        assert_eq!(all.len(), 4, "path, placeholder, other braces, the `=`: {all:?}");
        assert!(all[0].contains("no path"));
        assert!(all[1].contains("no `{instance}`"));
    }
}

#[cfg(test)]
mod file_tests {
    fn problems(processing: &str, queries: &str) -> Vec<String> {
        let yaml = format!(
            "application_id: app\nkafka: {{ bootstrap_servers: b }}\nprocessing: {{ {processing} }}\n\
             sources:\n  p: {{ topic: t }}\npipelines:\n  - name: p\n    from: p\n    key: \"{{id}}\"\n    \
             to: {{ topic: o }}\ndead_letter: {{ topic: d }}\n{queries}"
        );
        match crate::config::load_str("t.yaml", &yaml, |_| None) {
            Ok(_) => vec![],
            Err(e) => e.diagnostics.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn every_problem_of_the_section_is_reported_with_its_place() {
        assert!(problems("", "").is_empty(), "off by default");
        assert!(problems("", "queries: { enabled: false }\n").is_empty());
        let on = "queries: { enabled: true, advertised_url: \"http://{instance}.svc:8080\" }\n";
        let t = crate::config::load_str(
            "t.yaml",
            &format!(
                "application_id: app\nkafka: {{ bootstrap_servers: b }}\nsources:\n  p: {{ topic: t }}\n\
                 pipelines:\n  - name: p\n    from: p\n    key: \"{{id}}\"\n    to: {{ topic: o }}\n\
                 dead_letter: {{ topic: d }}\n{on}"
            ),
            |_| None,
        )
        .expect("valid");
        let q = t.queries.expect("enabled");
        assert_eq!(q.url_of("tally-1").as_deref(), Some("http://tally-1.svc:8080"));
        assert_eq!(q.url_of("a/b"), None, "an instance id that is no host name");

        let missing = problems("", "queries: { enabled: true }\n");
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(missing[0].starts_with("t.yaml:12:") && missing[0].contains("advertised_url` is required"));

        let all = problems(
            "group_protocol: consumer",
            "queries:\n  enabled: true\n  advertised_url: \"ftp://{instance}\"\n",
        );
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(
            all[0].starts_with("t.yaml:13:") && all[0].contains("group_protocol: classic"),
            "{all:?}"
        );
        assert!(
            all[1].starts_with("t.yaml:14:") && all[1].contains("http://"),
            "{all:?}"
        );

        let off_but_wrong = problems("", "queries: { advertised_url: \"http://fixed:8080/q\" }\n");
        assert_eq!(off_but_wrong.len(), 2, "checked even when off: {off_but_wrong:?}");
        assert!(off_but_wrong.iter().all(|p| p.starts_with("t.yaml:12:")));
    }
}
