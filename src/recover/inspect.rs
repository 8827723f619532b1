//! `tally inspect`: everything the topics say about one event, found by its idempotency key or
//! its correlation id: its trace records at every node, its outputs, its dead letters, the
//! live reconciler's alerts about it and its stores' entries, in time order, so an operator
//! can locate where it stopped (for an event tally never consumed, the alert says where it
//! waits). An entity key finds the entity's versions and merged state.

use crate::engine::headers;
use crate::reconcile::topic::{self, read_to_end};
use crate::recover::state;
use crate::topology::Topology;
use crate::wire::{
    IDEMPOTENCY_KEY_HEADER, REASON_HEADER, SOURCE_OFFSET_HEADER, SOURCE_PARTITION_HEADER, SOURCE_TOPIC_HEADER,
};
use anyhow::{bail, Context, Result};
use rdkafka::message::BorrowedMessage;
use rdkafka::Message;
use serde::Serialize;
use std::collections::BTreeSet;
use std::time::Duration;

/// What to look for.
#[derive(Debug, Clone)]
pub enum Query {
    /// A business idempotency key, as trace records and outputs show it (`PAY-1:PAID`).
    Key(String),
    /// A correlation id.
    Correlation(String),
    /// An entity key, as an `overwrite` or `merge` route's `entity` template renders it: only
    /// the stores are searched.
    Entity(String),
}

/// One record that names the event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sighting {
    /// `trace`, `output`, `dead_letter`, `alert` or `state`.
    pub kind: &'static str,
    /// `<topic>/<partition>/<offset>` of the record.
    pub at: String,
    /// Its timestamp, ms since the epoch.
    pub timestamp_ms: i64,
    /// What it says: node and status for a trace record, pipeline for an output, reason and
    /// source for a dead letter.
    pub detail: String,
}

impl Sighting {
    /// One line for a terminal.
    pub fn render(&self) -> String {
        format!(
            "{}  {:<11} {:<40} {}",
            super::timestamp_text(self.timestamp_ms),
            self.kind,
            self.at,
            self.detail
        )
    }
}

/// Reads the trace topic, every output topic and the dead-letter topic of `t` to their ends
/// and returns the records that name the event, oldest first.
pub fn run(t: &Topology, query: &Query) -> Result<Vec<Sighting>> {
    let properties: Vec<(String, String)> = t.kafka.properties.clone().into_iter().collect();
    let reader = topic::client_config(&t.kafka.bootstrap_servers, &properties)?;
    if let Query::Entity(entity) = query {
        let mut found = state::sightings(t, &reader, &[], std::slice::from_ref(entity))?;
        found.sort_by(|a, b| (a.timestamp_ms, &a.at).cmp(&(b.timestamp_ms, &b.at)));
        return Ok(found);
    }
    let mut found = Vec::new();
    // The idempotency keys the event has: its stores' entries are looked up by them.
    let mut keys = BTreeSet::new();
    if let Query::Key(k) = query {
        keys.insert(k.clone());
    }
    if let Some(trace) = &t.trace {
        let context = || format!("reading the trace topic `{}`", trace.topic);
        let mut events = BTreeSet::new();
        read_to_end(&reader, &trace.topic, &mut |m| {
            if let Some((s, event, key)) = trace_sighting(m, query, None) {
                found.push(s);
                events.extend(event);
                keys.extend(key);
            }
            Ok(())
        })
        .with_context(context)?;
        // A node that has not computed the key (the repartition node), a redrive and an
        // acknowledgement name the event only by its id: a second pass takes every record of
        // the events found.
        if !events.is_empty() {
            found.clear();
            read_to_end(&reader, &trace.topic, &mut |m| {
                found.extend(trace_sighting(m, query, Some(&events)).map(|(s, _, _)| s));
                Ok(())
            })
            .with_context(context)?;
        }
    }
    let outputs: BTreeSet<(&str, &str, &str)> = t
        .pipelines
        .iter()
        .map(|p| (p.output.topic.as_str(), p.name.as_str(), p.correlation_header()))
        .collect();
    for (topic, pipeline, correlation_header) in outputs {
        read_to_end(&reader, topic, &mut |m| {
            if names(m, query, correlation_header) {
                found.push(sighting(m, "output", format!("pipeline {pipeline}")));
            }
            Ok(())
        })
        .with_context(|| format!("reading the output topic `{topic}`"))?;
    }
    let correlation_headers: BTreeSet<&str> = t.pipelines.iter().map(|p| p.correlation_header()).collect();
    read_to_end(&reader, &t.dead_letter_topic, &mut |m| {
        if correlation_headers.iter().any(|h| names(m, query, h)) {
            let text = |name| headers::text(m, name).unwrap_or("?");
            let detail = format!(
                "reason {}, from {}/{}/{}",
                text(REASON_HEADER),
                text(SOURCE_TOPIC_HEADER),
                text(SOURCE_PARTITION_HEADER),
                text(SOURCE_OFFSET_HEADER)
            );
            found.push(sighting(m, "dead_letter", detail));
        }
        Ok(())
    })
    .with_context(|| format!("reading the dead-letter topic `{}`", t.dead_letter_topic))?;
    if let Some(r) = &t.reconcile {
        let mut waiting = Vec::new();
        read_to_end(&reader, &r.alerts_topic, &mut |m| {
            if let Some((s, place)) = alert_sighting(m, query) {
                found.push(s);
                waiting.extend(place.map(|p| (found.len() - 1, p)));
            }
            Ok(())
        })
        .with_context(|| format!("reading the alerts topic `{}`", r.alerts_topic))?;
        if !waiting.is_empty() {
            let positions = group_positions(&reader, &t.application_id, waiting.iter().map(|(_, p)| p))?;
            for (i, place) in waiting {
                let now = match positions.get(&(place.0.clone(), place.1)) {
                    Some(&at) if at > place.2 => format!("; tally's group has consumed it since (now at {at})"),
                    Some(&at) => format!("; tally's group still waits at offset {at}"),
                    None => "; tally's group has no offset there yet".to_string(),
                };
                found[i].detail.push_str(&now);
            }
        }
    }
    let keys: Vec<String> = keys.into_iter().collect();
    found.extend(state::sightings(t, &reader, &keys, &[])?);
    if found.is_empty() && t.trace.is_none() {
        bail!("nothing found, and the topology writes no trace records: only outputs and dead letters were searched");
    }
    found.sort_by(|a, b| (a.timestamp_ms, &a.at).cmp(&(b.timestamp_ms, &b.at)));
    Ok(found)
}

/// True when an output or dead letter carries the key or correlation id in its headers.
fn names(m: &BorrowedMessage<'_>, query: &Query, correlation_header: &str) -> bool {
    match query {
        Query::Key(k) => headers::text(m, IDEMPOTENCY_KEY_HEADER) == Some(k.as_str()),
        Query::Correlation(c) => headers::text(m, correlation_header) == Some(c.as_str()),
        Query::Entity(_) => false,
    }
}

/// The fields of a trace record `inspect` shows.
#[derive(serde::Deserialize)]
struct TraceFields {
    event_id: Option<String>,
    idempotency_key: Option<String>,
    correlation_id: Option<String>,
    node: Option<String>,
    status: Option<String>,
    outcome: Option<String>,
    reason: Option<String>,
}

/// The trace record `m` when it names the event (by the query, or, given `events`, by its
/// event id), with its event id and idempotency key.
fn trace_sighting(
    m: &BorrowedMessage<'_>,
    query: &Query,
    events: Option<&BTreeSet<String>>,
) -> Option<(Sighting, Option<String>, Option<String>)> {
    let fields: TraceFields = serde_json::from_slice(m.payload()?).ok()?;
    let matches = match (events, query) {
        (Some(events), _) => fields.event_id.as_ref().is_some_and(|e| events.contains(e)),
        (None, Query::Key(k)) => fields.idempotency_key.as_deref() == Some(k.as_str()),
        (None, Query::Correlation(c)) => fields.correlation_id.as_deref() == Some(c.as_str()),
        (None, Query::Entity(_)) => false,
    };
    if !matches {
        return None;
    }
    let mut detail = format!(
        "{} {}",
        fields.node.as_deref().unwrap_or("?"),
        fields.status.as_deref().unwrap_or("?")
    );
    if let Some(o) = fields.outcome {
        detail.push_str(&format!(" ({o})"));
    }
    if let Some(r) = fields.reason {
        detail.push_str(&format!(", reason: {r}"));
    }
    detail.push_str(&format!(", event {}", fields.event_id.as_deref().unwrap_or("?")));
    match query {
        Query::Key(_) => detail.push_str(&format!(
            ", correlation {}",
            fields.correlation_id.as_deref().unwrap_or("?")
        )),
        Query::Correlation(_) | Query::Entity(_) => {
            detail.push_str(&format!(", key {}", fields.idempotency_key.as_deref().unwrap_or("?")))
        }
    }
    Some((sighting(m, "trace", detail), fields.event_id, fields.idempotency_key))
}

/// Where an event waits: topic, partition, offset.
type Place = (String, i32, i64);

/// The fields of an alert record `inspect` shows.
#[derive(serde::Deserialize)]
struct AlertFields {
    kind: Option<String>,
    event_id: Option<String>,
    idempotency_key: Option<String>,
    correlation_id: Option<String>,
    node: Option<String>,
    topic: Option<String>,
    partition: Option<i32>,
    offset: Option<i64>,
    age_ms: Option<i64>,
}

/// The alert record `m` when it names the event, with where the event waits when the alert
/// says it was not consumed.
fn alert_sighting(m: &BorrowedMessage<'_>, query: &Query) -> Option<(Sighting, Option<Place>)> {
    let fields: AlertFields = serde_json::from_slice(m.payload()?).ok()?;
    let matches = match query {
        Query::Key(k) => fields.idempotency_key.as_deref() == Some(k.as_str()),
        Query::Correlation(c) => fields.correlation_id.as_deref() == Some(c.as_str()),
        Query::Entity(_) => false,
    };
    if !matches {
        return None;
    }
    let place = match (fields.topic, fields.partition, fields.offset) {
        (Some(t), Some(p), Some(o)) => Some((t, p, o)),
        _ => None,
    };
    let mut detail = format!(
        "{} at {}, event {}, {} s old",
        fields.kind.as_deref().unwrap_or("?"),
        fields.node.as_deref().unwrap_or("?"),
        fields.event_id.as_deref().unwrap_or("?"),
        fields.age_ms.unwrap_or(0) / 1000
    );
    if let Some((t, p, o)) = &place {
        detail.push_str(&format!(", not consumed from {t}/{p}/{o}"));
    }
    Some((sighting(m, "alert", detail), place))
}

/// The committed offsets of `group` on the partitions of `places`.
fn group_positions<'a>(
    reader: &rdkafka::ClientConfig,
    group: &str,
    places: impl Iterator<Item = &'a Place>,
) -> Result<std::collections::HashMap<(String, i32), i64>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let mut config = reader.clone();
    config.set("group.id", group).set("enable.auto.commit", "false");
    let consumer: BaseConsumer = config.create().context("creating a consumer to read tally's offsets")?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    for (topic, partition, _) in places {
        if tpl.find_partition(topic, *partition).is_none() {
            tpl.add_partition(topic, *partition);
        }
    }
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .with_context(|| format!("reading the committed offsets of group `{group}`"))?;
    Ok(committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            rdkafka::Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
            _ => None,
        })
        .collect())
}

fn sighting(m: &BorrowedMessage<'_>, kind: &'static str, detail: String) -> Sighting {
    Sighting {
        kind,
        at: format!("{}/{}/{}", m.topic(), m.partition(), m.offset()),
        timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
        detail,
    }
}
