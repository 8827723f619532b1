//! Loading topology files: interpolation, YAML parsing, validation with every problem collected.

pub mod diagnostics;
pub mod interpolate;
pub mod pipelines;
pub mod queries;
pub mod raw;
pub mod reconcile;
pub mod schema;
pub mod state;
pub mod validate;

use crate::topology::Topology;
use diagnostics::Collector;
pub use diagnostics::{ConfigError, Diagnostic};
use std::path::Path;

/// Reads and validates a topology file, with environment variables from the process.
pub fn load_file(path: &Path) -> Result<Topology, ConfigError> {
    let name = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => load_str(&name, &text, |var| std::env::var(var).ok()),
        Err(e) => {
            let mut c = Collector::new(name);
            c.at(0, 0, format!("cannot read the file: {e}"));
            c.finish(None)
        }
    }
}

/// Validates topology text; `file` names it in messages, `env` resolves `${VAR}`.
pub fn load_str(file: &str, text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Topology, ConfigError> {
    let mut c = Collector::new(file);
    let (text, unresolved) = interpolate::interpolate(text, env);
    for u in unresolved {
        c.at(u.line, u.column, u.message);
    }
    let raw: raw::RawTopology = match serde_saphyr::from_str(&text) {
        Ok(raw) => raw,
        Err(e) => {
            let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
            c.at(line, column, yaml_message(&e));
            return c.finish(None);
        }
    };
    let topology = validate::validate(raw, &mut c);
    c.finish(topology)
}

/// The parser's sentence without the location it repeats.
fn yaml_message(e: &serde_saphyr::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("invalid YAML").trim();
    format!("invalid YAML: {first}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(yaml: &str) -> Vec<String> {
        match load_str("t.yaml", yaml, |_| None) {
            Ok(_) => vec![],
            Err(e) => e.to_string().lines().map(str::to_string).collect(),
        }
    }

    fn topology(app: &str, pipeline: &str, processing: &str, properties: &str) -> String {
        format!(
            "application_id: \"{app}\"\nkafka: {{ bootstrap_servers: b, properties: {{ {properties} }} }}\n\
             processing: {{ {processing} }}\nsources:\n  p: {{ topic: t }}\npipelines:\n  - name: \"{pipeline}\"\n    \
             from: p\n    key: \"{{id}}\"\n    to: {{ topic: o }}\ndead_letter: {{ topic: d }}\n"
        )
    }

    #[test]
    fn operator_mistakes_are_configuration_errors_with_their_place() {
        assert!(problems(&topology("app", "p", "commit_interval_ms: 100", "")).is_empty());
        let slow = problems(&topology("app", "p", "commit_interval_ms: 120000", ""));
        assert!(
            slow.iter()
                .any(|p| p.contains("t.yaml:3:") && p.contains("transaction.timeout.ms")),
            "{slow:?}"
        );
        assert!(problems(&topology(
            "app",
            "p",
            "commit_interval_ms: 120000",
            "transaction.timeout.ms: 300000"
        ))
        .is_empty());
        for bad in ["..", "."] {
            let found = problems(&topology(bad, "p", "", ""));
            assert!(found.iter().any(|p| p.contains("application_id")), "{bad}: {found:?}");
        }
        for name in ["reconcile", "global-mappings", "global-mappings-3"] {
            let reserved = problems(&topology("app", name, "", ""));
            assert!(reserved.iter().any(|p| p.contains("reserved")), "{name}: {reserved:?}");
        }
        assert!(problems(&topology("app", "reconcile-orders", "", "")).is_empty());
        let create = problems(&topology("app", "p", "", "allow.auto.create.topics: true"));
        assert!(
            create.iter().any(|p| p.contains("allow.auto.create.topics")),
            "{create:?}"
        );
        let member = problems(&topology("app", "p", "", "group.instance.id: x"));
        assert!(member.iter().any(|p| p.contains("group.instance.id")), "{member:?}");
        for scattering in ["random", "murmur3"] {
            let found = problems(&topology("app", "p", "", &format!("partitioner: {scattering}")));
            assert!(
                found
                    .iter()
                    .any(|p| p.contains("t.yaml:2:") && p.contains(scattering) && p.contains("murmur2_random")),
                "{scattering}: {found:?}"
            );
        }
        assert!(problems(&topology("app", "p", "", "partitioner: murmur2_random")).is_empty());
    }

    #[test]
    fn a_co_partitioned_source_skips_the_hop_and_an_unknown_partitioner_is_explained() {
        let yaml = |co: &str| {
            format!(
                "application_id: app\nkafka: {{ bootstrap_servers: b }}\nsources:\n  p: {{ topic: t }}\npipelines:\n  \
                 - name: pay\n    from: p\n    repartition: {{ key: \"{{id}}\", co_partitioned: {co} }}\n    \
                 key: \"{{id}}:{{status}}\"\n    to: {{ topic: o }}\ndead_letter: {{ topic: d }}\n"
            )
        };
        let t = load_str("t.yaml", &yaml("murmur2"), |_| None).expect("valid");
        let p = &t.pipelines[0];
        assert!(p.repartition.is_none(), "no repartition topic");
        let co = p.co_partitioned.as_ref().expect("declared");
        assert_eq!(
            (co.key.to_string(), co.partitioner.name()),
            ("{id}".to_string(), "murmur2")
        );
        assert_eq!(t.consumed_topics(), ["t"], "the stateful stage reads the source");
        let wrong = problems(&yaml("murmur3"));
        assert_eq!(wrong.len(), 2, "a heading and one problem: {wrong:?}");
        for part in [
            "t.yaml:8:",
            "murmur3",
            "`murmur2`",
            "`crc32`",
            "`fnv1a`",
            "partition count",
        ] {
            assert!(wrong[1].contains(part), "{part}: {wrong:?}");
        }
    }

    #[test]
    fn the_consumer_group_protocol_refuses_what_it_does_not_take() {
        let consumer = "group_protocol: consumer";
        assert!(problems(&topology("app", "p", consumer, "")).is_empty());
        assert!(problems(&topology(
            "app",
            "p",
            "group_protocol: classic",
            "session.timeout.ms: 6000"
        ))
        .is_empty());
        let timing = problems(&topology(
            "app",
            "p",
            consumer,
            "session.timeout.ms: 6000, heartbeat.interval.ms: 1000",
        ));
        for name in ["session.timeout.ms", "heartbeat.interval.ms"] {
            assert!(
                timing
                    .iter()
                    .any(|p| p.contains("t.yaml:2:") && p.contains(&format!("group.consumer.{name}"))),
                "{name}: {timing:?}"
            );
        }
        let standbys = problems(&topology(
            "app",
            "p",
            "group_protocol: consumer, num_standby_replicas: 1",
            "",
        ));
        assert!(
            standbys
                .iter()
                .any(|p| p.contains("t.yaml:3:") && p.contains("num_standby_replicas")),
            "{standbys:?}"
        );
        let unknown = problems(&topology("app", "p", "group_protocol: streams", ""));
        assert!(
            unknown.iter().any(|p| p.contains("`classic` or `consumer`")),
            "{unknown:?}"
        );
        let set_directly = problems(&topology("app", "p", "", "group.protocol: consumer"));
        assert!(
            set_directly.iter().any(|p| p.contains("group.protocol")),
            "{set_directly:?}"
        );
    }
}
