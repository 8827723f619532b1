//! What a task writes into the open transaction besides changelogs: outputs, dead letters,
//! pending-create markers and trace records, with the headers tally sets and the counts.

use super::headers;
use super::producer::{Outgoing, TxnProducer};
use crate::processors::{correlation, Decision, Processed, Reason, Rejection};
use crate::store::Change;
use crate::topology::RenderedKey;
use crate::trace::{Outcome, Status, TraceRecord, TraceSink, FORMAT};
use crate::wire::{
    DETAIL_HEADER, IDEMPOTENCY_KEY_FIELDS_HEADER, IDEMPOTENCY_KEY_HEADER, PAYLOAD_OMITTED_HEADER,
    PENDING_CREATE_HEADER, REASON_HEADER, SOURCE_HEADER, SOURCE_KEY_HEADER, SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER, SOURCE_TOPIC_HEADER,
};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, OwnedHeaders};
use rdkafka::Message;
use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// The longest `tally.error.detail` written, in characters.
const MAX_DETAIL_CHARS: usize = 1024;
/// The longest topic name Kafka allows.
const MAX_TOPIC_NAME: usize = 249;

/// The message key a dead letter of `msg` carries: the source record's own. On a repartition
/// topic (`trusted`) that is the one its `tally.source.key` header kept; records written there
/// before that header existed fall back to their own key.
pub fn original_key<'a>(msg: &'a BorrowedMessage<'_>, trusted: bool) -> Option<&'a [u8]> {
    let kept = headers::entries(msg)
        .filter(|_| trusted)
        .find(|h| h.name == SOURCE_KEY_HEADER.as_bytes());
    match kept {
        Some(h) => h.value,
        None => msg.key(),
    }
}

/// Outcome counts of the open transaction, published to metrics only when it commits.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    /// Records consumed from a source topic.
    pub records_in: u64,
    /// Records forwarded to a repartition topic.
    pub repartitioned: u64,
    /// Records emitted.
    pub records_out: u64,
    /// Duplicates dropped.
    pub duplicates: u64,
    /// Stale versions dropped.
    pub stale: u64,
    /// Outputs emitted pending-create.
    pub pending_created: u64,
    /// Dedup keys deleted by expiry.
    pub expired: u64,
    /// Records of a co-partitioned source on a partition their key does not belong to.
    pub misplaced: u64,
    /// Dead-lettered by reason.
    pub dead_lettered: BTreeMap<Reason, u64>,
}

/// Why processing one record failed.
#[derive(Debug)]
pub enum ProcessError {
    /// A Kafka call failed; the caller classifies it.
    Kafka(KafkaError),
    /// The store failed: the task cannot go on.
    Engine(super::errors::EngineError),
}

/// Where an event came from: its source topic, partition and offset, kept across a repartition.
pub struct SourcePlace {
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: String,
    /// Source offset.
    pub offset: String,
}

impl SourcePlace {
    /// The place a consumed record stands for: its own, or, when `trusted` (a repartition topic
    /// only tally writes), the one its headers carry. On a source topic the headers are anyone's
    /// to set, and must not spoof dead-letter coordinates or trace event ids.
    pub fn of(msg: &BorrowedMessage<'_>, trusted: bool) -> Self {
        let carried = if trusted { Self::carried(msg) } else { None };
        carried.unwrap_or_else(|| Self {
            topic: msg.topic().to_string(),
            partition: msg.partition().to_string(),
            offset: msg.offset().to_string(),
        })
    }

    /// The place a repartitioned record's headers carry: the `tally.source` header, or the three
    /// `tally.source.*` headers of records written before it. The first occurrence of a header
    /// decides, as for every header tally reads. Only a place that could be real counts: anyone
    /// able to write to the repartition topic could otherwise name a topic of a megabyte, and
    /// the dead letter and trace records repeating it could never be written.
    fn carried(msg: &BorrowedMessage<'_>) -> Option<Self> {
        let (mut joined, mut topic, mut partition, mut offset) = (None, None, None, None);
        for h in headers::entries(msg) {
            let slot = match h.name {
                n if n == SOURCE_HEADER.as_bytes() => &mut joined,
                n if n == SOURCE_TOPIC_HEADER.as_bytes() => &mut topic,
                n if n == SOURCE_PARTITION_HEADER.as_bytes() => &mut partition,
                n if n == SOURCE_OFFSET_HEADER.as_bytes() => &mut offset,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(h.value.and_then(|v| std::str::from_utf8(v).ok()));
            }
        }
        if let Some(joined) = joined.flatten() {
            let mut parts = joined.rsplitn(3, '/');
            let (offset, partition, topic) = (parts.next()?, parts.next()?, parts.next()?);
            return Self::checked(topic, partition, offset);
        }
        Self::checked(topic.flatten()?, partition.flatten()?, offset.flatten()?)
    }

    /// The place, when `topic` is a name Kafka allows and `partition` and `offset` are numbers
    /// it could give, written as tally writes them.
    fn checked(topic: &str, partition: &str, offset: &str) -> Option<Self> {
        let legal = (1..=MAX_TOPIC_NAME).contains(&topic.len())
            && topic != "."
            && topic != ".."
            && topic
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        let partition = partition.parse::<i32>().ok().filter(|p| *p >= 0)?;
        let offset = offset.parse::<i64>().ok().filter(|o| *o >= 0)?;
        legal.then(|| Self {
            topic: topic.to_string(),
            partition: partition.to_string(),
            offset: offset.to_string(),
        })
    }

    /// The event id of trace records: `<topic>/<partition>/<offset>`, also the value of the
    /// `tally.source` header that carries the place across a repartition topic.
    pub fn event_id(&self) -> String {
        event_id(&self.topic, &self.partition, &self.offset)
    }

    /// The event id of a record read from its source topic (its own place), without the place.
    pub fn own_event_id(msg: &BorrowedMessage<'_>) -> String {
        event_id(msg.topic(), msg.partition(), msg.offset())
    }

    /// The headers that give a dead letter its source's coordinates.
    fn dead_letter_headers(&self, headers: OwnedHeaders) -> OwnedHeaders {
        headers
            .insert(header(SOURCE_TOPIC_HEADER, &self.topic))
            .insert(header(SOURCE_PARTITION_HEADER, &self.partition))
            .insert(header(SOURCE_OFFSET_HEADER, &self.offset))
    }
}

/// `<topic>/<partition>/<offset>`.
fn event_id(topic: &str, partition: impl std::fmt::Display, offset: impl std::fmt::Display) -> String {
    format!("{topic}/{partition}/{offset}")
}

/// A task's sinks and the counts of its open transaction.
pub struct Emitter {
    /// The task's partition (of its changelogs).
    pub partition: i32,
    /// The pipeline's output topic.
    pub output_topic: String,
    /// The dead-letter topic.
    pub dead_letter_topic: String,
    /// The ID-mapping topic (pending-create markers), when configured.
    pub mappings_topic: Option<String>,
    /// Trace settings of this node, when tracing.
    pub trace: Option<TraceSink>,
    /// The header the correlation id is read from and written to.
    pub correlation_header: String,
    /// True when the task reads a repartition topic, whose `tally.source.*` headers tally wrote.
    pub trusts_source_headers: bool,
    /// What the open transaction did.
    pub counts: Counts,
}

impl Emitter {
    /// Writes a trace record for the event at `place`, if this node traces that status.
    pub fn trace(
        &self,
        producer: &mut TxnProducer,
        event_id: &str,
        key: Option<&RenderedKey>,
        correlation_id: &str,
        status: Status,
        outcome: Option<Outcome>,
    ) -> Result<(), ProcessError> {
        let Some(sink) = &self.trace else { return Ok(()) };
        let fields = key.and_then(RenderedKey::distinct_fields);
        let encode = |correlation_id: &str| {
            let record = TraceRecord {
                format: FORMAT,
                event_id,
                idempotency_key: key.map(|k| k.text.as_str()),
                idempotency_key_fields: fields.clone(),
                correlation_id,
                node: &sink.node,
                status,
                outcome,
                timestamp_ms: now_ms(),
                reason: None,
            };
            let headers = OwnedHeaders::new().insert(header(&self.correlation_header, correlation_id));
            sink.encode(&record).map(|(k, v)| (k, v, headers))
        };
        let Some(mut record) = encode(correlation_id) else {
            return Ok(());
        };
        // The id is in the value and a header, escaped in the value (up to 6 bytes a byte): a
        // long one is shortened rather than refusing the record, so the trace records of a
        // refused record (written without its idempotency key) always fit.
        let fits = |(k, v, h): &(String, Vec<u8>, OwnedHeaders)| producer.fits(Some(k.as_bytes()), Some(v), Some(h));
        if !fits(&record) {
            if let Cow::Owned(shorter) = correlation::carried(correlation_id) {
                record = encode(&shorter).unwrap_or(record);
            }
        }
        let (k, v, headers) = record;
        producer
            .send(Outgoing {
                topic: &sink.topic,
                partition: None,
                key: Some(k.as_bytes()),
                payload: Some(&v),
                headers: Some(headers),
            })
            .map_err(ProcessError::Kafka)
    }

    /// Produces what a decision calls for and its terminal trace record; `place` holds the
    /// record's source place once someone has read it.
    pub fn decision(
        &mut self,
        producer: &mut TxnProducer,
        msg: &BorrowedMessage<'_>,
        place: &OnceCell<SourcePlace>,
        processed: &Processed,
        now_ms: i64,
    ) -> Result<(), ProcessError> {
        let corr = processed.correlation_id.as_str();
        let (key, status, outcome) = match &processed.decision {
            Decision::Emit {
                idempotency_key,
                output_key,
                payload,
                pending,
            } => {
                let mut headers = headers::copy_except(msg, &self.correlation_header)
                    .insert(header(&self.correlation_header, corr))
                    .insert(header(IDEMPOTENCY_KEY_HEADER, &idempotency_key.text));
                if let Some(fields) = idempotency_key.distinct_fields() {
                    let fields = serde_json::Value::from(fields).to_string();
                    headers = headers.insert(header(IDEMPOTENCY_KEY_FIELDS_HEADER, &fields));
                }
                if !pending.is_empty() {
                    let systems: Vec<&str> = pending.iter().map(|p| p.system.as_str()).collect();
                    headers = headers.insert(header(PENDING_CREATE_HEADER, &systems.join(",")));
                    self.counts.pending_created += 1;
                }
                let out = Outgoing {
                    topic: &self.output_topic,
                    partition: None,
                    key: Some(output_key.as_bytes()),
                    payload: payload.as_deref().or(msg.payload()),
                    headers: Some(headers),
                };
                producer.send(out).map_err(ProcessError::Kafka)?;
                // Markers let every instance count what still waits for a write-back.
                if let Some(topic) = &self.mappings_topic {
                    for p in pending {
                        let (key, marker) = p.marker(corr, &idempotency_key.text, now_ms);
                        let out = Outgoing {
                            topic,
                            partition: None,
                            key: Some(key.as_bytes()),
                            payload: Some(marker.as_bytes()),
                            headers: None,
                        };
                        producer.send(out).map_err(ProcessError::Kafka)?;
                    }
                }
                self.counts.records_out += 1;
                let outcome = (!pending.is_empty()).then_some(Outcome::PendingCreate);
                (Some(idempotency_key), Status::Completed, outcome)
            }
            Decision::Mapping {
                idempotency_key,
                records,
            } => {
                for (key, value) in records {
                    let out = Outgoing {
                        topic: &self.output_topic,
                        partition: None,
                        key: Some(key.as_bytes()),
                        payload: value.as_deref().map(str::as_bytes),
                        headers: None,
                    };
                    producer.send(out).map_err(ProcessError::Kafka)?;
                }
                self.counts.records_out += 1;
                (Some(idempotency_key), Status::Completed, None)
            }
            Decision::Stale {
                idempotency_key,
                version,
                current,
            } => {
                if tracing::enabled!(tracing::Level::DEBUG) {
                    event_span(corr, Some(&idempotency_key.text))
                        .in_scope(|| tracing::debug!(version, current, "stale version dropped"));
                }
                self.counts.stale += 1;
                (Some(idempotency_key), Status::Completed, Some(Outcome::Stale))
            }
            Decision::Duplicate { idempotency_key } => {
                if tracing::enabled!(tracing::Level::DEBUG) {
                    event_span(corr, Some(&idempotency_key.text)).in_scope(|| tracing::debug!("duplicate dropped"));
                }
                self.counts.duplicates += 1;
                (Some(idempotency_key), Status::Completed, Some(Outcome::Duplicate))
            }
            Decision::Reject(_) => {
                self.dead_letter(
                    producer,
                    msg,
                    place.get_or_init(|| SourcePlace::of(msg, self.trusts_source_headers)),
                    processed,
                )?;
                (None, Status::Failed, Some(Outcome::DeadLetter))
            }
        };
        if self.trace.is_none() {
            return Ok(());
        }
        let event_id = place
            .get_or_init(|| SourcePlace::of(msg, self.trusts_source_headers))
            .event_id();
        self.trace(producer, &event_id, key, corr, status, outcome)
    }

    /// Sends a rejected record, with its original bytes and headers, to the dead-letter topic.
    pub fn dead_letter(
        &mut self,
        producer: &mut TxnProducer,
        msg: &BorrowedMessage<'_>,
        place: &SourcePlace,
        processed: &Processed,
    ) -> Result<(), ProcessError> {
        let Decision::Reject(Rejection { reason, detail }) = &processed.decision else {
            return Ok(());
        };
        event_span(&processed.correlation_id, None).in_scope(|| {
            tracing::warn!(
                reason = %reason,
                detail = %detail,
                topic = %place.topic,
                partition = %place.partition,
                offset = %place.offset,
                "record dead-lettered"
            )
        });
        // Details are tally's sentences, but may quote input; a dead letter's header stays small.
        let detail = match detail.char_indices().nth(MAX_DETAIL_CHARS) {
            Some((cut, _)) => &detail[..cut],
            None => detail.as_str(),
        };
        let ours = |copied: OwnedHeaders, correlation_id: &str| {
            place.dead_letter_headers(
                copied
                    .insert(header(&self.correlation_header, correlation_id))
                    .insert(header(REASON_HEADER, reason.as_str()))
                    .insert(header(DETAIL_HEADER, detail)),
            )
        };
        // A dead letter must always fit: what makes it too large is left out, payload first,
        // then the key, then the input's own headers and the length of a long correlation id;
        // the reason and the source's coordinates (to fetch the original from the source
        // topic) always stay.
        let corr = processed.correlation_id.as_str();
        let mut key = original_key(msg, self.trusts_source_headers);
        let mut payload = msg.payload();
        let mut headers = ours(headers::copy_except(msg, &self.correlation_header), corr);
        if !producer.fits(key, payload, Some(&headers)) {
            let omitted = payload.map_or(0, <[u8]>::len).to_string();
            payload = None;
            headers = headers.insert(header(PAYLOAD_OMITTED_HEADER, &omitted));
            if !producer.fits(key, payload, Some(&headers)) {
                key = None;
            }
            if !producer.fits(key, payload, Some(&headers)) {
                headers = ours(OwnedHeaders::new(), &correlation::carried(corr))
                    .insert(header(PAYLOAD_OMITTED_HEADER, &omitted));
            }
        }
        let out = Outgoing {
            topic: &self.dead_letter_topic,
            partition: None,
            key,
            payload,
            headers: Some(headers),
        };
        producer.send(out).map_err(ProcessError::Kafka)?;
        *self.counts.dead_lettered.entry(*reason).or_default() += 1;
        Ok(())
    }

    /// Produces store changes to their changelog partition.
    pub fn changes<'a>(
        &self,
        producer: &mut TxnProducer,
        changelogs: &[String],
        changes: impl Iterator<Item = Change<'a>>,
    ) -> Result<(), ProcessError> {
        for change in changes {
            let out = Outgoing {
                topic: &changelogs[change.store],
                partition: Some(self.partition),
                key: Some(change.key),
                payload: change.value,
                headers: None,
            };
            producer.send(out).map_err(ProcessError::Kafka)?;
        }
        Ok(())
    }
}

/// The span of every log line about one event, so its correlation id is on each line.
fn event_span(correlation_id: &str, idempotency_key: Option<&str>) -> tracing::Span {
    tracing::info_span!("event", correlation_id, idempotency_key)
}

/// A text header.
pub fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header {
        key,
        value: Some(value),
    }
}

/// Wall-clock time in ms since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_carried_place_counts_only_when_it_could_be_real() {
        let place = SourcePlace::checked("payments.v2_in-1", "007", "42").expect("a real place");
        assert_eq!(
            place.event_id(),
            "payments.v2_in-1/7/42",
            "numbers as tally writes them"
        );
        let longest = "t".repeat(MAX_TOPIC_NAME);
        assert!(SourcePlace::checked(&longest, "0", "0").is_some());
        let too_long = "t".repeat(MAX_TOPIC_NAME + 1);
        for (topic, partition, offset) in [
            (too_long.as_str(), "0", "0"),
            ("", "0", "0"),
            (".", "0", "0"),
            ("..", "0", "0"),
            ("pay ments", "0", "0"),
            ("pay\u{e9}", "0", "0"),
            ("p", "-1", "0"),
            ("p", "0", "-1"),
            ("p", "x", "0"),
            ("p", "2147483648", "0"),
            ("p", "0", "1e3"),
            ("p", "0", ""),
        ] {
            assert!(
                SourcePlace::checked(topic, partition, offset).is_none(),
                "{topic:.20}/{partition}/{offset}"
            );
        }
    }
}
