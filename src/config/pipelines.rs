//! Validation of `pipelines:`: sources, keys, repartition, id mapping, routes and strategies.

use super::diagnostics::Collector;
use super::raw::{RawMapIds, RawPipeline, RawRoute, Text};
use super::validate::{kafka_name, positive_duration, required, Known, DEFAULT_RETENTION};
use crate::topology::partitioner::Partitioner;
use crate::topology::{
    CoPartitioning, CorrelationSpec, KeyTemplate, MapIds, MergeEmit, Output, Pipeline, Repartition, Route, Strategy,
    MERGE_STATE_FIELDS,
};
use globset::Glob;
use serde_saphyr::{Location, Spanned};
use std::collections::{BTreeMap, BTreeSet};

type RawPipelines = Spanned<Vec<Spanned<RawPipeline>>>;

/// Validates `pipelines:`, each against what it may refer to.
pub(super) fn pipelines(c: &mut Collector, raw: Option<RawPipelines>, known: &Known<'_>) -> Option<Vec<Pipeline>> {
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
        let label = p
            .value
            .name
            .as_ref()
            .map_or_else(|| format!("pipeline {}", i + 1), |n| format!("pipeline `{}`", n.value));
        match pipeline(c, p.value, at, &label, known) {
            Some(pipe) => {
                if !names.insert(pipe.name.clone()) {
                    c.at_loc(
                        at,
                        format!("{label}: the name is used by an earlier pipeline; names must be unique"),
                    );
                    ok = false;
                }
                if let Some(other) = used_sources.insert(pipe.source.clone(), pipe.name.clone()) {
                    c.at_loc(
                        at,
                        format!(
                            "{label}: source `{}` is already read by pipeline `{other}`; one pipeline per source",
                            pipe.source
                        ),
                    );
                    ok = false;
                }
                out.push(pipe);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn pipeline(c: &mut Collector, p: RawPipeline, at: Location, label: &str, known: &Known<'_>) -> Option<Pipeline> {
    let (sources, application_id) = (known.sources, known.application_id);
    let name = required(c, p.name, Some(at), &format!("{label} needs a `name`"))
        .and_then(|n| kafka_name(c, &n, "pipelines.name"))
        .filter(|n| {
            // Task directories and names are `<pipeline>-<partition>`, the live reconciler's
            // are `reconcile-<partition>` and the ID-mapping store's `global-mappings-<instance>`:
            // a pipeline of such a name would share them.
            // (`global-mappings-<anything>` too: instance ids are free text.)
            let reserved = [
                ("reconcile", "the live reconciler's tasks"),
                ("global-mappings", "the ID-mapping store"),
            ]
            .into_iter()
            .find(|(r, _)| n == r || (*r == "global-mappings" && n.starts_with("global-mappings-")));
            if let Some((r, what)) = reserved {
                c.at_loc(
                    at,
                    format!("{label}: the name `{n}` is reserved (`{r}` is {what}); choose another"),
                );
            }
            reserved.is_none()
        });
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
    let key = required(
        c,
        p.key,
        Some(at),
        &format!("{label} needs `key`, the business idempotency key template, e.g. \"{{payment_id}}:{{status}}\""),
    )
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
    let (repartition, co_partitioned) = match p.repartition {
        None => (Some(None), Some(None)),
        Some(r) => {
            let key = required(
                c,
                r.value.key,
                Some(r.referenced),
                &format!("{label}: `repartition` needs a `key` template, e.g. \"{{payment_id}}\""),
            )
            .and_then(|k| template(c, &k, label, "repartition.key"));
            let declared = match r.value.co_partitioned {
                None => Some(None),
                Some(name) => co_partitioner(c, &name, label).map(Some),
            };
            let topic = format!(
                "{}-{}-repartition",
                application_id.unwrap_or("app"),
                name.as_deref().unwrap_or("pipeline")
            );
            match (key, declared) {
                (Some(key), Some(Some(partitioner))) => (
                    Some(None),
                    Some(Some(CoPartitioning {
                        key,
                        partitioner,
                        former_hop: topic,
                    })),
                ),
                (Some(key), Some(None)) => (Some(Some(Repartition { key, topic })), Some(None)),
                _ => (None, None),
            }
        }
    };
    let routes = match p.routes {
        None => Some(vec![default_route()]),
        Some(rs) if rs.value.is_empty() => {
            c.at_loc(
                rs.referenced,
                format!("{label}: `routes` is empty; remove it to dedup every record with `ignore`, or add a route"),
            );
            None
        }
        Some(rs) => {
            let mut routes = Vec::new();
            let mut ok = true;
            for (i, r) in rs.value.into_iter().enumerate() {
                match route(c, r.value, r.referenced, &format!("{label}, route {}", i + 1)) {
                    Some(route) => routes.push(route),
                    None => ok = false,
                }
            }
            ok.then_some(routes)
        }
    };
    let map_ids = map_ids(c, p.map_ids.unwrap_or_default(), label);
    let records_mappings = routes
        .as_ref()
        .is_some_and(|rs| rs.iter().all(|r| r.strategy == Strategy::RecordMapping));
    let output = match (p.to, known.mapping_topic) {
        // A write-back pipeline writes to the mappings topic.
        (None, Some(mappings)) if records_mappings => Some(Output {
            topic: mappings.to_string(),
            key: None,
        }),
        (None, _) => {
            c.at_loc(at, format!("{label} needs `to: {{ topic: … }}`"));
            None
        }
        (Some(to), _) => {
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
                        format!("{label}: output topic `{t}` is its own input; that would loop forever"),
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
        co_partitioned: co_partitioned?,
        map_ids: map_ids?,
        routes: routes?,
        output: output?,
    })
}

fn map_ids(c: &mut Collector, raw: Vec<Spanned<RawMapIds>>, label: &str) -> Option<Vec<MapIds>> {
    let mut out = Vec::new();
    let mut ok = true;
    for (i, m) in raw.into_iter().enumerate() {
        let at = m.referenced;
        let label = format!("{label}, map_ids {}", i + 1);
        let mut field = |value: Option<Text>, name: &str| {
            let v = required(c, value, Some(at), &format!("{label} needs `{name}`"));
            ok &= v.is_some();
            v.map(|t| t.value).unwrap_or_default()
        };
        let spec = MapIds {
            field: field(m.value.field, "field"),
            from_system: field(m.value.from_system, "from_system"),
            to_system: field(m.value.to_system, "to_system"),
            into: field(m.value.into, "into"),
        };
        if let Some(on_missing) = m.value.on_missing.filter(|o| o.value != "pending_create") {
            c.at_loc(
                on_missing.referenced,
                format!(
                    "{label}: `on_missing: {}` is not offered; unknown ids are marked `pending_create`",
                    on_missing.value
                ),
            );
            ok = false;
        }
        for (name, system) in [("from_system", &spec.from_system), ("to_system", &spec.to_system)] {
            if system.contains(crate::processors::idmap::SYSTEM_SEPARATORS) {
                c.at_loc(
                    at,
                    format!("{label}: `{name}` may not contain `/` or `:` (the separators of ID-mapping keys)"),
                );
                ok = false;
            }
        }
        out.push(spec);
    }
    ok.then_some(out)
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
                    format!("{label}: `event_type` glob `{}` is invalid: {}", p.value, e.kind()),
                );
                None
            }
        },
    };
    let strategy = match &r.strategy {
        None => {
            c.at_loc(
                at,
                format!("{label} needs a `strategy`: `ignore`, `overwrite`, `merge` or `record_mapping`"),
            );
            None
        }
        Some(s) => match s.value.as_str() {
            "ignore" => ignore(c, &r, label),
            "overwrite" => overwrite(c, &r, at, label),
            "merge" => merge(c, &r, at, label),
            "record_mapping" => {
                reject_unused(c, label, "record_mapping", &r, &[]);
                Some(Strategy::RecordMapping)
            }
            other => {
                c.at_loc(s.referenced, format!("{label}: unknown strategy `{other}`; the strategies are `ignore`, `overwrite`, `merge` and `record_mapping`"));
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

/// Reports the route fields that `strategy` does not use (anything but `used`).
fn reject_unused(c: &mut Collector, label: &str, strategy: &str, r: &RawRoute, used: &[&str]) {
    let fields = [
        ("retention", r.retention.as_ref().map(|t| t.referenced)),
        ("entity", r.entity.as_ref().map(|t| t.referenced)),
        ("version", r.version.as_ref().map(|t| t.referenced)),
        ("increment_id", r.increment_id.as_ref().map(|t| t.referenced)),
        ("into", r.into.as_ref().map(|t| t.referenced)),
        ("emit", r.emit.as_ref().map(|t| t.referenced)),
        ("max_state_bytes", r.max_state_bytes.as_ref().map(|t| t.referenced)),
    ];
    for (name, at) in fields {
        if let (Some(loc), false) = (at, used.contains(&name)) {
            c.at_loc(
                loc,
                format!("{label}: `{name}` has no meaning for strategy `{strategy}`; remove it"),
            );
        }
    }
}

fn ignore(c: &mut Collector, r: &RawRoute, label: &str) -> Option<Strategy> {
    reject_unused(c, label, "ignore", r, &["retention"]);
    let retention = match &r.retention {
        None => DEFAULT_RETENTION,
        Some(t) => positive_duration(c, t, &format!("{label}: `retention`"))?,
    };
    Some(Strategy::Ignore { retention })
}

fn overwrite(c: &mut Collector, r: &RawRoute, at: Location, label: &str) -> Option<Strategy> {
    reject_unused(c, label, "overwrite", r, &["entity", "version"]);
    let entity = route_template(
        c,
        &r.entity,
        at,
        label,
        "overwrite",
        "entity",
        "\"{entity_type}:{entity_id}\"",
    );
    let version = route_template(c, &r.version, at, label, "overwrite", "version", "\"{version}\"");
    Some(Strategy::Overwrite {
        entity: entity?,
        version: version?,
    })
}

fn merge(c: &mut Collector, r: &RawRoute, at: Location, label: &str) -> Option<Strategy> {
    reject_unused(
        c,
        label,
        "merge",
        r,
        &["entity", "increment_id", "into", "emit", "max_state_bytes"],
    );
    let entity = route_template(c, &r.entity, at, label, "merge", "entity", "\"{cart_id}\"");
    let increment_id = route_template(c, &r.increment_id, at, label, "merge", "increment_id", "\"{line_id}\"");
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
    let into = match &r.into {
        None => "items".to_string(),
        Some(i) if MERGE_STATE_FIELDS.contains(&i.value.as_str()) => {
            c.at_loc(
                i.referenced,
                format!(
                    "{label}: `into: {}` is a field the merged state sets itself (`entity` is the entity, `increments` the count); name the array differently, e.g. `lines`",
                    i.value
                ),
            );
            return None;
        }
        Some(i) => i.value.clone(),
    };
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
            c.at_loc(
                at,
                format!("{label} uses strategy `{strategy}` but has no `{field}` template (e.g. {example})"),
            );
            None
        }
        Some(t) => template(c, t, label, field),
    }
}

/// The partitioner `repartition.co_partitioned` names; an unknown name is reported with the
/// names known and when the declaration is safe.
fn co_partitioner(c: &mut Collector, name: &Text, label: &str) -> Option<Partitioner> {
    if let Some(p) = Partitioner::named(name.value.trim()) {
        return Some(p);
    }
    let known: Vec<String> = Partitioner::NAMED
        .iter()
        .map(|(n, _, who)| format!("`{n}` ({who})"))
        .collect();
    c.at_loc(
        name.referenced,
        format!(
            "{label}: `repartition.co_partitioned` is `{}`; name the partitioner the source's producers use: {}. \
             Declare it only when every producer keys each record by exactly the text `repartition.key` renders \
             and the topic's partition count never changes: then every copy of an event is already on one \
             partition and the repartition hop is skipped. Otherwise remove `co_partitioned` and keep the hop",
            name.value,
            known.join(", ")
        ),
    );
    None
}

fn template(c: &mut Collector, t: &Text, label: &str, what: &str) -> Option<KeyTemplate> {
    match t.value.parse() {
        Ok(k) => Some(k),
        Err(e) => {
            c.at_loc(t.referenced, format!("{label}: `{what}` template `{}`: {e}", t.value));
            None
        }
    }
}
