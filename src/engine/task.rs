//! A task: one partition of a consumed topic, the pipeline stage it feeds, its stores, and
//! what it produced in the open transaction.

use super::errors::EngineError;
use super::producer::{Outgoing, TxnProducer};
use crate::processors::dedup;
use crate::processors::idmap::pending_key;
use crate::processors::{Decision, Input, PipelineProcessor, Processed, Reason, Rejection};
use crate::store::{Change, TaskStore};
use crate::topology::{KeyTemplate, StoreKind};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::Message;
use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

/// Header naming the systems whose id an output lacks (pending-create).
pub const PENDING_CREATE_HEADER: &str = "tally.pending_create";
/// Header carrying the business idempotency key on outputs.
pub const IDEMPOTENCY_KEY_HEADER: &str = "tally.idempotency_key";
/// Machine-readable dead-letter reason.
pub const REASON_HEADER: &str = "tally.error.reason";
/// Human-readable detail of a dead-letter reason.
pub const DETAIL_HEADER: &str = "tally.error.detail";
/// Source topic of a dead-lettered record.
pub const SOURCE_TOPIC_HEADER: &str = "tally.source.topic";
/// Source partition of a dead-lettered record.
pub const SOURCE_PARTITION_HEADER: &str = "tally.source.partition";
/// Source offset of a dead-lettered record.
pub const SOURCE_OFFSET_HEADER: &str = "tally.source.offset";

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
    /// Dead-lettered by reason.
    pub dead_lettered: BTreeMap<Reason, u64>,
}

/// Why processing one record failed.
pub enum ProcessError {
    /// A Kafka call failed; the caller classifies it.
    Kafka(KafkaError),
    /// The store failed: the task cannot go on.
    Engine(EngineError),
}

/// What a task does with its records.
pub enum Work {
    /// Re-key and forward to the repartition topic (stateless).
    Repartition {
        /// The new message key.
        key: KeyTemplate,
        /// The repartition topic.
        topic: String,
    },
    /// Run the strategies against the task's stores.
    Process {
        /// The task's stores.
        store: TaskStore,
        /// `changelogs[i]` is the changelog topic of store `i`.
        changelogs: Vec<String>,
        /// True when the records come from a repartition topic (already counted as input).
        repartitioned: bool,
    },
}

/// Where a task writes besides its output.
pub struct Sinks {
    /// The dead-letter topic.
    pub dead_letter: String,
    /// The ID-mapping topic (pending-create markers), when configured.
    pub mappings: Option<String>,
}

/// One partition of a consumed topic with its pipeline stage.
pub struct Task {
    partition: i32,
    processor: PipelineProcessor,
    work: Work,
    dead_letter_topic: String,
    mappings_topic: Option<String>,
    correlation_header: String,
    next_offset: Option<i64>,
    counts: Counts,
}

impl Task {
    /// A task for `partition` doing `work`.
    pub fn new(partition: i32, processor: PipelineProcessor, work: Work, sinks: Sinks) -> Self {
        let correlation_header = processor
            .pipeline()
            .correlation
            .header
            .clone()
            .unwrap_or_else(|| "correlation_id".to_string());
        Self {
            partition,
            processor,
            work,
            dead_letter_topic: sinks.dead_letter,
            mappings_topic: sinks.mappings,
            correlation_header,
            next_offset: None,
            counts: Counts::default(),
        }
    }

    /// Name of the pipeline this task runs.
    pub fn pipeline_name(&self) -> &str {
        &self.processor.pipeline().name
    }

    /// The offset to commit for this partition, when records were consumed in this transaction.
    pub fn next_offset(&self) -> Option<i64> {
        self.next_offset
    }

    /// True for tasks reading a repartition topic (whose consumed records may be purged).
    pub fn reads_repartition_topic(&self) -> bool {
        matches!(
            self.work,
            Work::Process {
                repartitioned: true,
                ..
            }
        )
    }

    /// Runs one record, producing its output, forward or dead letter and changelog records.
    pub fn process(&mut self, msg: &BorrowedMessage<'_>, producer: &mut TxnProducer) -> Result<(), ProcessError> {
        let header_value = header_text(msg, &self.correlation_header);
        let input = Input {
            payload: msg.payload(),
            correlation_header: header_value,
            coordinates: (msg.topic(), msg.partition(), msg.offset()),
            now_ms: now_ms(),
        };
        match &mut self.work {
            Work::Repartition { key, topic } => {
                self.counts.records_in += 1;
                match self.processor.rekey(key, &input) {
                    Ok(new_key) => {
                        // The stateful stage reports dead letters with the original place.
                        let headers = copy_headers(msg, "")
                            .insert(header(SOURCE_TOPIC_HEADER, msg.topic()))
                            .insert(header(SOURCE_PARTITION_HEADER, &msg.partition().to_string()))
                            .insert(header(SOURCE_OFFSET_HEADER, &msg.offset().to_string()));
                        producer
                            .send(Outgoing {
                                topic,
                                partition: None,
                                key: Some(new_key.as_bytes()),
                                payload: msg.payload(),
                                headers,
                            })
                            .map_err(ProcessError::Kafka)?;
                        self.counts.repartitioned += 1;
                    }
                    Err(rejected) => dead_letter(
                        &self.dead_letter_topic,
                        &self.correlation_header,
                        &mut self.counts,
                        msg,
                        &rejected,
                        producer,
                    )?,
                }
            }
            Work::Process {
                store,
                changelogs,
                repartitioned,
            } => {
                if !*repartitioned {
                    self.counts.records_in += 1;
                }
                let processed = self
                    .processor
                    .process(&input, store)
                    .map_err(|e| ProcessError::Engine(EngineError::Fatal(anyhow::Error::new(e))))?;
                let changes = store.take_changes();
                match &processed.decision {
                    Decision::Emit {
                        idempotency_key,
                        output_key,
                        payload,
                        pending,
                    } => {
                        let mut headers = copy_headers(msg, &self.correlation_header)
                            .insert(header(&self.correlation_header, &processed.correlation_id))
                            .insert(header(IDEMPOTENCY_KEY_HEADER, idempotency_key));
                        if !pending.is_empty() {
                            let systems: Vec<&str> = pending.iter().map(|p| p.system.as_str()).collect();
                            headers = headers.insert(header(PENDING_CREATE_HEADER, &systems.join(",")));
                            self.counts.pending_created += 1;
                        }
                        // Markers let every instance count what still waits for a write-back.
                        if let Some(topic) = &self.mappings_topic {
                            for p in pending {
                                let marker = serde_json::json!({
                                    "correlation_id": processed.correlation_id,
                                    "idempotency_key": idempotency_key,
                                    "since_ms": input.now_ms,
                                })
                                .to_string();
                                producer
                                    .send(Outgoing {
                                        topic,
                                        partition: None,
                                        key: Some(pending_key(&p.system, &p.internal_id).as_bytes()),
                                        payload: Some(marker.as_bytes()),
                                        headers: OwnedHeaders::new(),
                                    })
                                    .map_err(ProcessError::Kafka)?;
                            }
                        }
                        producer
                            .send(Outgoing {
                                topic: &self.processor.pipeline().output.topic,
                                partition: None,
                                key: Some(output_key.as_bytes()),
                                payload: payload.as_deref().or(msg.payload()),
                                headers,
                            })
                            .map_err(ProcessError::Kafka)?;
                        self.counts.records_out += 1;
                    }
                    Decision::Mapping { records, .. } => {
                        let topic = &self.processor.pipeline().output.topic;
                        for (key, value) in records {
                            producer
                                .send(Outgoing {
                                    topic,
                                    partition: None,
                                    key: Some(key.as_bytes()),
                                    payload: value.as_deref().map(str::as_bytes),
                                    headers: OwnedHeaders::new(),
                                })
                                .map_err(ProcessError::Kafka)?;
                        }
                        self.counts.records_out += 1;
                    }
                    Decision::Stale {
                        idempotency_key,
                        version,
                        current,
                    } => {
                        if tracing::enabled!(tracing::Level::DEBUG) {
                            event_span(&processed.correlation_id, Some(idempotency_key))
                                .in_scope(|| tracing::debug!(version, current, "stale version dropped"));
                        }
                        self.counts.stale += 1;
                    }
                    Decision::Duplicate { idempotency_key } => {
                        if tracing::enabled!(tracing::Level::DEBUG) {
                            event_span(&processed.correlation_id, Some(idempotency_key))
                                .in_scope(|| tracing::debug!("duplicate dropped"));
                        }
                        self.counts.duplicates += 1;
                    }
                    Decision::Reject(_) => {}
                }
                send_changes(producer, changelogs, self.partition, changes)?;
                dead_letter(
                    &self.dead_letter_topic,
                    &self.correlation_header,
                    &mut self.counts,
                    msg,
                    &processed,
                    producer,
                )?;
            }
        }
        self.next_offset = Some(msg.offset() + 1);
        Ok(())
    }

    /// After the Kafka commit: applies the overlay with the delivered changelog offsets and
    /// hands back the transaction's counts.
    pub fn committed(&mut self, delivered: &HashMap<(String, i32), i64>) -> Result<Counts, EngineError> {
        if let Work::Process { store, changelogs, .. } = &mut self.work {
            let offsets: Vec<(usize, i64)> = changelogs
                .iter()
                .enumerate()
                .filter_map(|(i, topic)| delivered.get(&(topic.clone(), self.partition)).map(|&o| (i, o)))
                .collect();
            store.commit(&offsets).map_err(|e| {
                EngineError::Fatal(anyhow::Error::new(e).context("store write after a committed transaction"))
            })?;
        }
        self.next_offset = None;
        Ok(std::mem::take(&mut self.counts))
    }

    /// Deletes up to `limit` expired dedup keys in the open transaction; returns how many.
    pub fn expire(&mut self, now_ms: i64, producer: &mut TxnProducer, limit: usize) -> Result<usize, ProcessError> {
        let Work::Process { store, changelogs, .. } = &mut self.work else {
            return Ok(0);
        };
        let (Some(retention), Some(index)) = (
            self.processor.pipeline().max_retention(),
            self.processor
                .pipeline()
                .store_kinds()
                .iter()
                .position(|k| *k == StoreKind::Dedup),
        ) else {
            return Ok(0);
        };
        let deleted = dedup::expire(store, index, now_ms, retention, limit)
            .map_err(|e| ProcessError::Engine(EngineError::Fatal(anyhow::Error::new(e))))?;
        send_changes(producer, changelogs, self.partition, store.take_changes())?;
        self.counts.expired += deleted as u64;
        Ok(deleted)
    }

    /// After an abort: forgets the transaction's writes, position and counts.
    pub fn aborted(&mut self) {
        if let Work::Process { store, .. } = &mut self.work {
            store.abort();
        }
        self.next_offset = None;
        self.counts = Counts::default();
    }
}

/// Sends a rejected record (no-op for other decisions), with its original bytes and headers, to the dead-letter topic.
fn dead_letter(
    topic: &str,
    correlation_header: &str,
    counts: &mut Counts,
    msg: &BorrowedMessage<'_>,
    processed: &Processed,
    producer: &mut TxnProducer,
) -> Result<(), ProcessError> {
    let Decision::Reject(Rejection { reason, detail }) = &processed.decision else {
        return Ok(());
    };
    // A record that came through a repartition topic carries its source's place already.
    let (src_topic, src_partition, src_offset) = match (
        header_text(msg, SOURCE_TOPIC_HEADER),
        header_text(msg, SOURCE_PARTITION_HEADER),
        header_text(msg, SOURCE_OFFSET_HEADER),
    ) {
        (Some(t), Some(p), Some(o)) => (t.to_string(), p.to_string(), o.to_string()),
        _ => (
            msg.topic().to_string(),
            msg.partition().to_string(),
            msg.offset().to_string(),
        ),
    };
    event_span(&processed.correlation_id, None).in_scope(|| {
        tracing::warn!(
            reason = %reason,
            detail = %detail,
            topic = %src_topic,
            partition = %src_partition,
            offset = %src_offset,
            "record dead-lettered"
        )
    });
    let headers = copy_headers(msg, correlation_header)
        .insert(header(correlation_header, &processed.correlation_id))
        .insert(header(REASON_HEADER, reason.as_str()))
        .insert(header(DETAIL_HEADER, detail))
        .insert(header(SOURCE_TOPIC_HEADER, &src_topic))
        .insert(header(SOURCE_PARTITION_HEADER, &src_partition))
        .insert(header(SOURCE_OFFSET_HEADER, &src_offset));
    producer
        .send(Outgoing {
            topic,
            partition: None,
            key: msg.key(),
            payload: msg.payload(),
            headers,
        })
        .map_err(ProcessError::Kafka)?;
    *counts.dead_lettered.entry(*reason).or_default() += 1;
    Ok(())
}

/// The span of every log line about one event, so its correlation id is on each line.
fn event_span(correlation_id: &str, idempotency_key: Option<&str>) -> tracing::Span {
    tracing::info_span!("event", correlation_id, idempotency_key)
}

fn header_text<'a>(msg: &'a BorrowedMessage<'_>, key: &str) -> Option<&'a str> {
    msg.headers()?
        .iter()
        .find(|h| h.key == key)
        .and_then(|h| std::str::from_utf8(h.value?).ok())
}

/// Produces store changes to their changelog partition.
fn send_changes(
    producer: &mut TxnProducer,
    changelogs: &[String],
    partition: i32,
    changes: Vec<Change>,
) -> Result<(), ProcessError> {
    for change in changes {
        producer
            .send(Outgoing {
                topic: &changelogs[change.store],
                partition: Some(partition),
                key: Some(&change.key),
                payload: change.value.as_deref(),
                headers: OwnedHeaders::new(),
            })
            .map_err(ProcessError::Kafka)?;
    }
    Ok(())
}

fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header {
        key,
        value: Some(value),
    }
}

/// The input's headers, minus the ones tally sets itself (`skip` and `tally.*`).
fn copy_headers(msg: &BorrowedMessage<'_>, skip: &str) -> OwnedHeaders {
    let mut out = OwnedHeaders::new();
    if let Some(hs) = msg.headers() {
        for h in hs.iter() {
            if h.key != skip && !h.key.starts_with("tally.") {
                out = out.insert(Header {
                    key: h.key,
                    value: h.value,
                });
            }
        }
    }
    out
}

/// Wall-clock time in ms since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
