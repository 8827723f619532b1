//! Checks a parsed topology file and builds the `Topology`, collecting every problem on the way.

use super::diagnostics::Collector;
use super::raw::{RawPipeline, RawRoute, RawTopology, Text};
use crate::topology::{
    CorrelationSpec, KafkaSettings, KeyTemplate, MergeEmit, Output, Pipeline, Processing,
    Repartition, Route, Source, Strategy, Topology,
};
use globset::Glob;
use serde_saphyr::{Location, Spanned};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
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
];

/// Validates `raw`, reporting into `c`; returns the topology when nothing was wrong.
pub fn validate(raw: RawTopology, c: &mut Collector) -> Option<Topology> {
    let application_id = required(c, raw.application_id, None, "`application_id` is required")
        .and_then(|t| kafka_name(c, &t, "application_id"));

    let kafka = match raw.kafka {
        None => {
            c.at(
                0,
                0,
                "`kafka` section is required (at least `bootstrap_servers`)",
            );
            None
        }
        Some(k) => {
            let bootstrap = required(
                c,
                k.bootstrap_servers,
                None,
                "`kafka.bootstrap_servers` is required",
            );
            let mut properties = BTreeMap::new();
            for (name, value) in k.properties {
                if RESERVED_PROPERTIES.contains(&name.as_str()) {
                    c.at_loc(
                        value.referenced,
                        format!("kafka property `{name}` is set by tally itself; remove it (exactly-once needs tally's value)"),
                    );
                } else {
                    properties.insert(name, value.value.to_property());
                }
            }
            bootstrap.map(|b| KafkaSettings {
                bootstrap_servers: b.value,
                properties,
            })
        }
    };

    let processing = processing(c, raw.processing);
    let state_dir = raw
        .state
        .and_then(|s| s.dir)
        .map_or_else(|| PathBuf::from("./state"), |d| PathBuf::from(d.value));

    let sources = sources(c, raw.sources);
    let pipelines = pipelines(c, raw.pipelines, &sources, application_id.as_deref());

    let dead_letter_topic = match raw.dead_letter {
        None => {
            c.at(
                0,
                0,
                "`dead_letter.topic` is required: bad records are never dropped silently",
            );
            None
        }
        Some(d) => required(
            c,
            d.value.topic,
            Some(d.referenced),
            "`dead_letter.topic` is required",
        )
        .and_then(|t| kafka_name(c, &t, "dead_letter.topic")),
    };

    if let (Some(dlq), Some(pipes)) = (&dead_letter_topic, &pipelines) {
        for p in pipes {
            if &p.input_topic == dlq || &p.output.topic == dlq {
                c.at(0, 0, format!("pipeline `{}` reads or writes the dead-letter topic `{dlq}`; use a topic of its own", p.name));
            }
        }
    }

    Some(Topology {
        application_id: application_id?,
        kafka: kafka?,
        processing: processing?,
        state_dir,
        sources: sources?,
        pipelines: pipelines?,
        dead_letter_topic: dead_letter_topic?,
    })
    .filter(|_| c.is_empty())
}

fn required(
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

/// Topic names and ids that become part of topic names: Kafka's legal characters.
fn kafka_name(c: &mut Collector, t: &Text, what: &str) -> Option<String> {
    let ok = t.value.len() <= 200
        && t.value
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-'));
    if ok {
        Some(t.value.clone())
    } else {
        c.at_loc(
            t.referenced,
            format!(
                "`{what}` is `{}`: use at most 200 of the characters a-z A-Z 0-9 . _ -",
                t.value
            ),
        );
        None
    }
}

fn processing(c: &mut Collector, raw: Option<super::raw::RawProcessing>) -> Option<Processing> {
    let Some(p) = raw else {
        return Some(Processing {
            commit_interval: Duration::from_millis(100),
            threads: 1,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES as usize,
        });
    };
    let mut ok = true;
    if let Some(g) = &p.guarantee {
        if g.value != "exactly_once" {
            c.at_loc(
                g.referenced,
                format!(
                    "guarantee `{}` is not offered; tally runs `exactly_once` only",
                    g.value
                ),
            );
            ok = false;
        }
    }
    let mut bounded =
        |v: Option<Spanned<u64>>, default: u64, min: u64, max: u64, name: &str| match v {
            None => default,
            Some(s) if s.value >= min && s.value <= max => s.value,
            Some(s) => {
                c.at_loc(
                    s.referenced,
                    format!(
                        "`processing.{name}` is {}; use a value from {min} to {max}",
                        s.value
                    ),
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
    ok.then(|| Processing {
        commit_interval: Duration::from_millis(commit_ms),
        threads: threads as usize,
        max_record_bytes: max_bytes as usize,
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
                    format!(
                        "source `{name}`: format `{}` is not supported; use `json`",
                        f.value
                    ),
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

type RawPipelines = Spanned<Vec<Spanned<RawPipeline>>>;

fn pipelines(
    c: &mut Collector,
    raw: Option<RawPipelines>,
    sources: &Option<BTreeMap<String, Source>>,
    application_id: Option<&str>,
) -> Option<Vec<Pipeline>> {
    let Some(raw) = raw.filter(|p| !p.value.is_empty()) else {
        c.at(0, 0, "`pipelines` must define at least one pipeline");
        return None;
    };
    let mut out = Vec::new();
    let mut ok = true;
    let mut names = BTreeSet::new();
    let mut used_sources: BTreeMap<String, String> = BTreeMap::new();
    for (i, p) in raw.value.into_iter().enumerate() {
        let at = p.referenced;
        let label = p.value.name.as_ref().map_or_else(
            || format!("pipeline {}", i + 1),
            |n| format!("pipeline `{}`", n.value),
        );
        match pipeline(c, p.value, at, &label, sources, application_id) {
            Some(pipe) => {
                if !names.insert(pipe.name.clone()) {
                    c.at_loc(at, format!("{label}: the name is used by an earlier pipeline; names must be unique"));
                    ok = false;
                }
                if let Some(other) = used_sources.insert(pipe.source.clone(), pipe.name.clone()) {
                    c.at_loc(at, format!("{label}: source `{}` is already read by pipeline `{other}`; one pipeline per source", pipe.source));
                    ok = false;
                }
                out.push(pipe);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn pipeline(
    c: &mut Collector,
    p: RawPipeline,
    at: Location,
    label: &str,
    sources: &Option<BTreeMap<String, Source>>,
    application_id: Option<&str>,
) -> Option<Pipeline> {
    let name = required(c, p.name, Some(at), &format!("{label} needs a `name`"))
        .and_then(|n| kafka_name(c, &n, "pipelines.name"));
    let from = required(
        c,
        p.from,
        Some(at),
        &format!("{label} needs `from`: the name of a source"),
    );
    let input_topic = match (&from, sources) {
        (Some(f), Some(srcs)) => match srcs.get(&f.value) {
            Some(s) => Some(s.topic.clone()),
            None => {
                let known: Vec<&str> = srcs.keys().map(String::as_str).collect();
                c.at_loc(
                    f.referenced,
                    format!(
                        "{label}: `from: {}` names no source; known sources: {}",
                        f.value,
                        known.join(", ")
                    ),
                );
                None
            }
        },
        _ => None,
    };
    let key = required(c, p.key, Some(at), &format!("{label} needs `key`, the business idempotency key template, e.g. \"{{payment_id}}:{{status}}\""))
        .and_then(|k| template(c, &k, label, "key"));
    let correlation = match p.correlation_id {
        None => CorrelationSpec {
            header: Some("correlation_id".into()),
            field: Some("correlation_id".into()),
        },
        Some(cs) => CorrelationSpec {
            header: cs.header.map(|h| h.value),
            field: cs.field.map(|f| f.value),
        },
    };
    let repartition = match p.repartition {
        None => Some(None),
        Some(r) => required(
            c,
            r.value.key,
            Some(r.referenced),
            &format!("{label}: `repartition` needs a `key` template, e.g. \"{{payment_id}}\""),
        )
        .and_then(|k| template(c, &k, label, "repartition.key"))
        .map(|key| {
            let name = name.as_deref().unwrap_or("pipeline");
            Some(Repartition {
                key,
                topic: format!("{}-{name}-repartition", application_id.unwrap_or("app")),
            })
        }),
    };
    let routes = match p.routes {
        None => Some(vec![default_route()]),
        Some(rs) if rs.value.is_empty() => {
            c.at_loc(rs.referenced, format!("{label}: `routes` is empty; remove it to dedup every record with `ignore`, or add a route"));
            None
        }
        Some(rs) => {
            let mut routes = Vec::new();
            let mut ok = true;
            for (i, r) in rs.value.into_iter().enumerate() {
                match route(
                    c,
                    r.value,
                    r.referenced,
                    &format!("{label}, route {}", i + 1),
                ) {
                    Some(route) => routes.push(route),
                    None => ok = false,
                }
            }
            ok.then_some(routes)
        }
    };
    let output = match p.to {
        None => {
            c.at_loc(at, format!("{label} needs `to: {{ topic: … }}`"));
            None
        }
        Some(to) => {
            let topic = required(
                c,
                to.value.topic,
                Some(to.referenced),
                &format!("{label}: `to` needs a `topic`"),
            )
            .and_then(|t| kafka_name(c, &t, "to.topic"));
            let key = match to.value.key {
                None => Some(None),
                Some(k) => template(c, &k, label, "to.key").map(Some),
            };
            if let (Some(t), Some(input)) = (&topic, &input_topic) {
                if t == input {
                    c.at_loc(
                        to.referenced,
                        format!(
                            "{label}: output topic `{t}` is its own input; that would loop forever"
                        ),
                    );
                }
            }
            Some(Output {
                topic: topic?,
                key: key?,
            })
        }
    };
    Some(Pipeline {
        name: name?,
        source: from?.value,
        input_topic: input_topic?,
        key: key?,
        correlation,
        repartition: repartition?,
        routes: routes?,
        output: output?,
    })
}

fn default_route() -> Route {
    Route {
        event_type: "*".into(),
        matcher: None,
        strategy: Strategy::Ignore {
            retention: DEFAULT_RETENTION,
        },
    }
}

fn route(c: &mut Collector, r: RawRoute, at: Location, label: &str) -> Option<Route> {
    let pattern = r.when.as_ref().and_then(|w| w.event_type.clone());
    let matcher = match &pattern {
        None => Some(None),
        Some(p) => match Glob::new(&p.value) {
            Ok(g) => Some(Some(g.compile_matcher())),
            Err(e) => {
                c.at_loc(
                    p.referenced,
                    format!(
                        "{label}: `event_type` glob `{}` is invalid: {}",
                        p.value,
                        e.kind()
                    ),
                );
                None
            }
        },
    };
    let strategy = match &r.strategy {
        None => {
            c.at_loc(
                at,
                format!("{label} needs a `strategy`: `ignore`, `overwrite` or `merge`"),
            );
            None
        }
        Some(s) => match s.value.as_str() {
            "ignore" => ignore(c, &r, label),
            "overwrite" => overwrite(c, &r, at, label),
            "merge" => merge(c, &r, at, label),
            other => {
                c.at_loc(s.referenced, format!("{label}: unknown strategy `{other}`; the strategies are `ignore`, `overwrite` and `merge`"));
                None
            }
        },
    };
    Some(Route {
        event_type: pattern.map_or_else(|| "*".to_string(), |p| p.value),
        matcher: matcher?,
        strategy: strategy?,
    })
}

/// Reports fields that the route's strategy does not use.
fn unused(c: &mut Collector, label: &str, strategy: &str, fields: &[(&str, Option<Location>)]) {
    for (name, at) in fields {
        if let Some(loc) = at {
            c.at_loc(
                *loc,
                format!("{label}: `{name}` has no meaning for strategy `{strategy}`; remove it"),
            );
        }
    }
}

fn ignore(c: &mut Collector, r: &RawRoute, label: &str) -> Option<Strategy> {
    unused(
        c,
        label,
        "ignore",
        &[
            ("entity", r.entity.as_ref().map(|t| t.referenced)),
            ("version", r.version.as_ref().map(|t| t.referenced)),
            (
                "increment_id",
                r.increment_id.as_ref().map(|t| t.referenced),
            ),
            ("into", r.into.as_ref().map(|t| t.referenced)),
            ("emit", r.emit.as_ref().map(|t| t.referenced)),
            (
                "max_state_bytes",
                r.max_state_bytes.as_ref().map(|t| t.referenced),
            ),
        ],
    );
    let retention = match &r.retention {
        None => DEFAULT_RETENTION,
        Some(t) => match humantime::parse_duration(&t.value) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => {
                c.at_loc(
                    t.referenced,
                    format!("{label}: `retention` must be longer than zero"),
                );
                return None;
            }
            Err(e) => {
                c.at_loc(t.referenced, format!("{label}: `retention: {}` is not a duration ({e}); write e.g. `30d`, `12h`, `90s`", t.value));
                return None;
            }
        },
    };
    Some(Strategy::Ignore { retention })
}

fn overwrite(c: &mut Collector, r: &RawRoute, at: Location, label: &str) -> Option<Strategy> {
    unused(
        c,
        label,
        "overwrite",
        &[
            ("retention", r.retention.as_ref().map(|t| t.referenced)),
            (
                "increment_id",
                r.increment_id.as_ref().map(|t| t.referenced),
            ),
            ("into", r.into.as_ref().map(|t| t.referenced)),
            ("emit", r.emit.as_ref().map(|t| t.referenced)),
            (
                "max_state_bytes",
                r.max_state_bytes.as_ref().map(|t| t.referenced),
            ),
        ],
    );
    let entity = route_template(
        c,
        &r.entity,
        at,
        label,
        "overwrite",
        "entity",
        "\"{entity_type}:{entity_id}\"",
    );
    let version = route_template(
        c,
        &r.version,
        at,
        label,
        "overwrite",
        "version",
        "\"{version}\"",
    );
    Some(Strategy::Overwrite {
        entity: entity?,
        version: version?,
    })
}

fn merge(c: &mut Collector, r: &RawRoute, at: Location, label: &str) -> Option<Strategy> {
    unused(
        c,
        label,
        "merge",
        &[
            ("retention", r.retention.as_ref().map(|t| t.referenced)),
            ("version", r.version.as_ref().map(|t| t.referenced)),
        ],
    );
    let entity = route_template(c, &r.entity, at, label, "merge", "entity", "\"{cart_id}\"");
    let increment_id = route_template(
        c,
        &r.increment_id,
        at,
        label,
        "merge",
        "increment_id",
        "\"{line_id}\"",
    );
    let emit = match r.emit.as_ref().map(|e| (e.value.as_str(), e.referenced)) {
        None | Some(("state", _)) => Some(MergeEmit::State),
        Some(("increment", _)) => Some(MergeEmit::Increment),
        Some((other, loc)) => {
            c.at_loc(
                loc,
                format!("{label}: `emit: {other}` is not known; use `state` or `increment`"),
            );
            None
        }
    };
    let max_state_bytes = match &r.max_state_bytes {
        None => 1024 * 1024,
        Some(m) if m.value >= 64 => m.value as usize,
        Some(m) => {
            c.at_loc(
                m.referenced,
                format!("{label}: `max_state_bytes` is {}; use at least 64", m.value),
            );
            return None;
        }
    };
    let into = r
        .into
        .as_ref()
        .map_or_else(|| "increments".to_string(), |i| i.value.clone());
    Some(Strategy::Merge {
        entity: entity?,
        increment_id: increment_id?,
        into,
        emit: emit?,
        max_state_bytes,
    })
}

fn route_template(
    c: &mut Collector,
    value: &Option<Text>,
    at: Location,
    label: &str,
    strategy: &str,
    field: &str,
    example: &str,
) -> Option<KeyTemplate> {
    match value {
        None => {
            c.at_loc(at, format!("{label} uses strategy `{strategy}` but has no `{field}` template (e.g. {example})"));
            None
        }
        Some(t) => template(c, t, label, field),
    }
}

fn template(c: &mut Collector, t: &Text, label: &str, what: &str) -> Option<KeyTemplate> {
    match t.value.parse() {
        Ok(k) => Some(k),
        Err(e) => {
            c.at_loc(
                t.referenced,
                format!("{label}: `{what}` template `{}`: {e}", t.value),
            );
            None
        }
    }
}
