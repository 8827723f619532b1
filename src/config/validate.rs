//! Checks a parsed topology file and builds the `Topology`, collecting every problem on the way.

use super::diagnostics::Collector;
use super::raw::{RawTopology, Text};
use crate::topology::partitioner::Partitioner;
use crate::topology::{GroupProtocol, IdMapping, KafkaSettings, Processing, Source, Strategy, Topology, TraceSettings};
use crate::trace::Level;
use serde_saphyr::{Location, Spanned};
use std::collections::BTreeMap;
use std::time::Duration;

/// Default time a dedup key is remembered (the seed's 30 days).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
const DEFAULT_MAX_RECORD_BYTES: u64 = 1024 * 1024;

/// librdkafka properties that tally sets itself, so a topology may not override them.
const RESERVED_PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "isolation.level",
    "transactional.id",
    "enable.idempotence",
    "partition.assignment.strategy",
    "group.instance.id",
    // Chosen with `processing.group_protocol`, which also decides what else tally sets.
    "group.protocol",
    // Forced off: a changelog deleted while tally runs must not come back uncompacted.
    "allow.auto.create.topics",
];

/// The librdkafka property choosing how tally's producers partition keyed records.
const PARTITIONER: &str = "partitioner";

/// librdkafka's `transaction.timeout.ms` as tally sets it, unless `kafka.properties` does.
const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 60_000;

/// Validates `raw`, reporting into `c`; returns the topology when nothing was wrong.
pub fn validate(raw: RawTopology, c: &mut Collector) -> Option<Topology> {
    let application_id = required(c, raw.application_id, None, "`application_id` is required")
        .and_then(|t| kafka_name(c, &t, "application_id"));

    let mut property_at = BTreeMap::new();
    let kafka = match raw.kafka {
        None => {
            c.at(0, 0, "`kafka` section is required (at least `bootstrap_servers`)");
            None
        }
        Some(k) => {
            let bootstrap = required(c, k.bootstrap_servers, None, "`kafka.bootstrap_servers` is required");
            let mut properties = BTreeMap::new();
            for (name, value) in k.properties {
                property_at.insert(name.clone(), value.referenced);
                if RESERVED_PROPERTIES.contains(&name.as_str()) {
                    c.at_loc(
                        value.referenced,
                        format!("kafka property `{name}` is set by tally itself; remove it (exactly-once needs tally's value)"),
                    );
                } else {
                    properties.insert(name, value.value.to_property());
                }
            }
            let unknown = (Partitioner::of(&properties) == Partitioner::Unknown)
                .then(|| properties.get(PARTITIONER).zip(property_at.get(PARTITIONER)))
                .flatten();
            if let Some((name, &at)) = unknown {
                let known: Vec<&str> = Partitioner::PROPERTY_VALUES.iter().map(|(n, _)| *n).collect();
                c.at_loc(
                    at,
                    format!(
                        "kafka property `partitioner` is `{name}`, which does not send every record of a key to one \
                         partition: the repartition hop would scatter an event's copies over tasks and duplicates \
                         would pass; use one of {} (or remove it: `consistent_random`)",
                        known.join(", ")
                    ),
                );
            }
            bootstrap.map(|b| KafkaSettings {
                bootstrap_servers: b.value,
                properties,
            })
        }
    };

    let commit_at = raw
        .processing
        .as_ref()
        .and_then(|p| p.commit_interval_ms.as_ref())
        .map(|s| s.referenced);
    let processing = processing(c, raw.processing);
    if let (Some(p), Some(k), Some(at)) = (&processing, &kafka, commit_at) {
        let timeout_ms = k
            .properties
            .get("transaction.timeout.ms")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(DEFAULT_TRANSACTION_TIMEOUT_MS);
        let interval_ms = p.commit_interval.as_millis() as u64;
        // A transaction stays open for the interval plus its commit; past the timeout the
        // broker aborts it, so every transaction would fail.
        if interval_ms.saturating_mul(2) > timeout_ms {
            c.at_loc(
                at,
                format!(
                    "`processing.commit_interval_ms` is {interval_ms} but transactions time out after \
                     {timeout_ms} ms (`transaction.timeout.ms`): the broker would abort every transaction; \
                     use at most half the timeout, or raise `kafka.properties.transaction.timeout.ms`"
                ),
            );
        }
    }
    if processing
        .as_ref()
        .is_some_and(|p| p.group_protocol == GroupProtocol::Consumer)
    {
        // librdkafka refuses to create a consumer with these under KIP-848: the broker (or the
        // group's config) holds the session and heartbeat times, and assigns itself.
        for name in ["session.timeout.ms", "heartbeat.interval.ms"] {
            if let Some(at) = property_at.get(name) {
                c.at_loc(
                    *at,
                    format!(
                        "kafka property `{name}` does not apply under `processing.group_protocol: consumer`: \
                         the broker's `group.consumer.{name}` (or the group's `consumer.{name}`, set with \
                         kafka-configs.sh --entity-type groups) decides it; remove it here"
                    ),
                );
            }
        }
    }
    let state = super::state::state(c, raw.state);

    let sources = sources(c, raw.sources);
    let id_mapping = raw.id_mapping.map(|m| id_mapping(c, m));
    let trace = raw.trace.map(|t| trace(c, t));
    let reconcile = raw
        .reconcile
        .map(|r| super::reconcile::reconcile(c, r, trace.is_some()));
    let queries = raw.queries.map(|q| {
        let protocol = processing.as_ref().map(|p| p.group_protocol);
        super::queries::queries(c, q, protocol)
    });
    let known = Known {
        sources: sources.as_ref(),
        application_id: application_id.as_deref(),
        mapping_topic: id_mapping.as_ref().and_then(|m| m.as_ref()).map(|m| m.topic.as_str()),
    };
    let pipelines = super::pipelines::pipelines(c, raw.pipelines, &known);
    if let Some(pipes) = &pipelines {
        let needs_mapping = pipes
            .iter()
            .any(|p| !p.map_ids.is_empty() || p.routes.iter().any(|r| r.strategy == Strategy::RecordMapping));
        if needs_mapping && id_mapping.is_none() {
            c.at(
                0,
                0,
                "a pipeline uses `map_ids` or `record_mapping` but there is no `id_mapping: { topic: … }` section",
            );
        }
    }

    let dead_letter_topic = match raw.dead_letter {
        None => {
            c.at(
                0,
                0,
                "`dead_letter.topic` is required: bad records are never dropped silently",
            );
            None
        }
        Some(d) => required(c, d.value.topic, Some(d.referenced), "`dead_letter.topic` is required")
            .and_then(|t| kafka_name(c, &t, "dead_letter.topic")),
    };

    if let (Some(dlq), Some(pipes)) = (&dead_letter_topic, &pipelines) {
        for p in pipes {
            if &p.input_topic == dlq || &p.output.topic == dlq {
                c.at(
                    0,
                    0,
                    format!(
                        "pipeline `{}` reads or writes the dead-letter topic `{dlq}`; use a topic of its own",
                        p.name
                    ),
                );
            }
        }
    }

    Some(Topology {
        application_id: application_id?,
        kafka: kafka?,
        processing: processing?,
        state_dir: state.dir,
        state_cleanup_delay: state.cleanup_delay?,
        state_memory: state.memory?,
        sources: sources?,
        pipelines: pipelines?,
        dead_letter_topic: dead_letter_topic?,
        trace: match trace {
            None => None,
            Some(t) => Some(t?),
        },
        reconcile: match reconcile {
            None => None,
            Some(r) => Some(r?),
        },
        id_mapping: match id_mapping {
            None => None,
            Some(m) => Some(m?),
        },
        queries: match queries {
            None => None,
            Some(q) => q.ok()?,
        },
    })
    .filter(|_| c.is_empty())
}

/// What pipelines may refer to, validated before them.
pub(super) struct Known<'a> {
    /// The sources, when they were valid.
    pub sources: Option<&'a BTreeMap<String, Source>>,
    /// The application id, when it was valid.
    pub application_id: Option<&'a str>,
    /// The ID-mapping topic, when configured.
    pub mapping_topic: Option<&'a str>,
}

fn trace(c: &mut Collector, raw: Spanned<super::raw::RawTrace>) -> Option<TraceSettings> {
    let topic = required(c, raw.value.topic, Some(raw.referenced), "`trace.topic` is required")
        .and_then(|t| kafka_name(c, &t, "trace.topic"));
    let level = match raw.value.level.as_ref().map(|l| (l.value.as_str(), l.referenced)) {
        None | Some(("terminal", _)) => Some(Level::Terminal),
        Some(("all", _)) => Some(Level::All),
        Some((other, at)) => {
            c.at_loc(
                at,
                format!("`trace.level: {other}` is not known; use `all` or `terminal`"),
            );
            None
        }
    };
    Some(TraceSettings {
        topic: topic?,
        level: level?,
    })
}

fn id_mapping(c: &mut Collector, raw: Spanned<super::raw::RawIdMapping>) -> Option<IdMapping> {
    let topic = required(
        c,
        raw.value.topic,
        Some(raw.referenced),
        "`id_mapping.topic` is required",
    )
    .and_then(|t| kafka_name(c, &t, "id_mapping.topic"));
    let partitions = match raw.value.partitions {
        None => 3,
        Some(p) if (1..=1000).contains(&p.value) => p.value as i32,
        Some(p) => {
            c.at_loc(
                p.referenced,
                format!("`id_mapping.partitions` is {}; use 1 to 1000", p.value),
            );
            return None;
        }
    };
    Some(IdMapping {
        topic: topic?,
        partitions,
    })
}

pub(super) fn required(
    c: &mut Collector,
    value: Option<Text>,
    parent: Option<Location>,
    message: &str,
) -> Option<Text> {
    match value {
        Some(v) if !v.value.trim().is_empty() => Some(v),
        Some(v) => {
            c.at_loc(v.referenced, format!("{message}; it is empty here"));
            None
        }
        None => {
            match parent {
                Some(loc) => c.at_loc(loc, message),
                None => c.at(0, 0, message),
            }
            None
        }
    }
}

/// A duration written like `30d`, `5m` or `90s`, longer than zero; `what` names the setting.
pub(super) fn positive_duration(c: &mut Collector, t: &Text, what: &str) -> Option<Duration> {
    match humantime::parse_duration(&t.value) {
        Ok(d) if !d.is_zero() => Some(d),
        Ok(_) => {
            c.at_loc(t.referenced, format!("{what} must be longer than zero"));
            None
        }
        Err(e) => {
            c.at_loc(
                t.referenced,
                format!(
                    "{what} `{}` is not a duration ({e}); write e.g. `30d`, `12h`, `90s`",
                    t.value
                ),
            );
            None
        }
    }
}

/// Topic names and ids that become part of topic names: Kafka's legal characters.
pub(super) fn kafka_name(c: &mut Collector, t: &Text, what: &str) -> Option<String> {
    let ok = t.value.len() <= 200
        && t.value
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-'));
    // Kafka refuses `.` and `..` as topic names, and as directory names (the application id,
    // pipeline names) they would put state in the parent directory.
    let dots = t.value.is_empty() || t.value.chars().all(|ch| ch == '.');
    if ok && !dots {
        Some(t.value.clone())
    } else {
        c.at_loc(
            t.referenced,
            format!(
                "`{what}` is `{}`: use at most 200 of the characters a-z A-Z 0-9 . _ -, not only dots",
                t.value
            ),
        );
        None
    }
}

fn processing(c: &mut Collector, raw: Option<super::raw::RawProcessing>) -> Option<Processing> {
    let p = raw.unwrap_or_default();
    let mut ok = true;
    if let Some(g) = &p.guarantee {
        if g.value != "exactly_once" {
            c.at_loc(
                g.referenced,
                format!("guarantee `{}` is not offered; tally runs `exactly_once` only", g.value),
            );
            ok = false;
        }
    }
    let mut bounded = |v: Option<Spanned<u64>>, default: u64, min: u64, max: u64, name: &str| match v {
        None => default,
        Some(s) if s.value >= min && s.value <= max => s.value,
        Some(s) => {
            c.at_loc(
                s.referenced,
                format!("`processing.{name}` is {}; use a value from {min} to {max}", s.value),
            );
            ok = false;
            default
        }
    };
    let commit_ms = bounded(p.commit_interval_ms, 100, 1, 600_000, "commit_interval_ms");
    let threads = bounded(p.threads, 1, 1, 64, "threads");
    let max_bytes = bounded(
        p.max_record_bytes,
        DEFAULT_MAX_RECORD_BYTES,
        1,
        100 * 1024 * 1024,
        "max_record_bytes",
    );
    let expiry_ms = bounded(
        p.expiry_scan_interval_ms,
        60_000,
        100,
        86_400_000,
        "expiry_scan_interval_ms",
    );
    let standbys_at = p.num_standby_replicas.as_ref().map(|n| n.referenced);
    let standbys = bounded(p.num_standby_replicas, 0, 0, 8, "num_standby_replicas");
    let group_protocol = match p.group_protocol.as_ref().map(|g| (g.value.as_str(), g.referenced)) {
        None | Some(("classic", _)) => GroupProtocol::Classic,
        Some(("consumer", _)) => GroupProtocol::Consumer,
        Some((other, at)) => {
            c.at_loc(
                at,
                format!("`processing.group_protocol` is `{other}`; use `classic` or `consumer`"),
            );
            ok = false;
            GroupProtocol::Classic
        }
    };
    if let (GroupProtocol::Consumer, Some(at)) = (group_protocol, standbys_at) {
        if standbys > 0 {
            // Standbys are placed from the group's member assignments, which Kafka describes
            // (DescribeGroups) for classic groups only.
            c.at_loc(
                at,
                "`processing.num_standby_replicas` needs `group_protocol: classic` (standbys are placed from \
                 the classic group's member assignments); use 0 or the classic protocol",
            );
            ok = false;
        }
    }
    ok.then(|| Processing {
        commit_interval: Duration::from_millis(commit_ms),
        threads: threads as usize,
        max_record_bytes: max_bytes as usize,
        static_membership: p.static_membership.is_some_and(|s| s.value),
        expiry_scan_interval: Duration::from_millis(expiry_ms),
        num_standby_replicas: standbys as usize,
        group_protocol,
    })
}

type RawSources = Spanned<BTreeMap<String, Spanned<super::raw::RawSource>>>;

fn sources(c: &mut Collector, raw: Option<RawSources>) -> Option<BTreeMap<String, Source>> {
    let Some(raw) = raw.filter(|s| !s.value.is_empty()) else {
        c.at(0, 0, "`sources` must name at least one input topic");
        return None;
    };
    let mut out = BTreeMap::new();
    let mut ok = true;
    for (name, src) in raw.value {
        if let Some(f) = &src.value.format {
            if f.value != "json" {
                c.at_loc(
                    f.referenced,
                    format!("source `{name}`: format `{}` is not supported; use `json`", f.value),
                );
                ok = false;
            }
        }
        let message = format!("source `{name}` needs a `topic`");
        match required(c, src.value.topic, Some(src.referenced), &message)
            .and_then(|t| kafka_name(c, &t, &format!("sources.{name}.topic")))
        {
            Some(topic) => {
                out.insert(name, Source { topic });
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}
