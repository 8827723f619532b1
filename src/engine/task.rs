//! A task: one input partition, its pipeline and stores, and what it produced in the open
//! transaction.

use super::errors::EngineError;
use super::producer::{Outgoing, TxnProducer};
use crate::processors::{Decision, Input, PipelineProcessor, Reason};
use crate::store::TaskStore;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::Message;
use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

/// Header carrying the business idempotency key on outputs.
pub const IDEMPOTENCY_KEY_HEADER: &str = "tally.idempotency_key";
/// Dead-letter headers.
pub const REASON_HEADER: &str = "tally.error.reason";
/// Human-readable detail of a dead-letter reason.
pub const DETAIL_HEADER: &str = "tally.error.detail";
/// Source coordinates of a dead-lettered record.
pub const SOURCE_TOPIC_HEADER: &str = "tally.source.topic";
/// Source partition of a dead-lettered record.
pub const SOURCE_PARTITION_HEADER: &str = "tally.source.partition";
/// Source offset of a dead-lettered record.
pub const SOURCE_OFFSET_HEADER: &str = "tally.source.offset";

/// Outcome counts of the open transaction, published to metrics only when it commits.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    /// Records consumed.
    pub records_in: u64,
    /// Records emitted.
    pub records_out: u64,
    /// Duplicates dropped.
    pub duplicates: u64,
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

/// One input partition with its pipeline and stores.
pub struct Task {
    partition: i32,
    processor: PipelineProcessor,
    store: TaskStore,
    changelogs: Vec<String>,
    dead_letter_topic: String,
    correlation_header: String,
    next_offset: Option<i64>,
    counts: Counts,
}

impl Task {
    /// A task over restored stores; `changelogs[i]` is the changelog of store `i`.
    pub fn new(
        partition: i32,
        processor: PipelineProcessor,
        store: TaskStore,
        changelogs: Vec<String>,
        dead_letter_topic: String,
    ) -> Self {
        let correlation_header = processor
            .pipeline()
            .correlation
            .header
            .clone()
            .unwrap_or_else(|| "correlation_id".to_string());
        Self {
            partition,
            processor,
            store,
            changelogs,
            dead_letter_topic,
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

    /// Runs one record and produces its output or dead letter and its changelog records.
    pub fn process(&mut self, msg: &BorrowedMessage<'_>, producer: &mut TxnProducer) -> Result<(), ProcessError> {
        let header_value = msg.headers().and_then(|h| {
            h.iter()
                .find(|h| h.key == self.correlation_header)
                .and_then(|h| h.value)
                .and_then(|v| std::str::from_utf8(v).ok())
        });
        let input = Input {
            payload: msg.payload(),
            correlation_header: header_value,
            coordinates: (msg.topic(), msg.partition(), msg.offset()),
            now_ms: now_ms(),
        };
        let processed = self
            .processor
            .process(&input, &mut self.store)
            .map_err(|e| ProcessError::Engine(EngineError::Fatal(anyhow::Error::new(e))))?;
        let pipeline = self.processor.pipeline();
        self.counts.records_in += 1;
        match &processed.decision {
            Decision::Emit {
                idempotency_key,
                output_key,
            } => {
                let headers = copy_headers(msg, &self.correlation_header)
                    .insert(header(&self.correlation_header, &processed.correlation_id))
                    .insert(header(IDEMPOTENCY_KEY_HEADER, idempotency_key));
                producer
                    .send(Outgoing {
                        topic: &pipeline.output.topic,
                        partition: None,
                        key: Some(output_key.as_bytes()),
                        payload: msg.payload(),
                        headers,
                    })
                    .map_err(ProcessError::Kafka)?;
                self.counts.records_out += 1;
            }
            Decision::Duplicate { idempotency_key } => {
                tracing::debug!(
                    correlation_id = %processed.correlation_id,
                    idempotency_key = %idempotency_key,
                    "duplicate dropped"
                );
                self.counts.duplicates += 1;
            }
            Decision::Reject(rejection) => {
                tracing::warn!(
                    correlation_id = %processed.correlation_id,
                    reason = %rejection.reason,
                    detail = %rejection.detail,
                    topic = msg.topic(),
                    partition = msg.partition(),
                    offset = msg.offset(),
                    "record dead-lettered"
                );
                let headers = copy_headers(msg, &self.correlation_header)
                    .insert(header(&self.correlation_header, &processed.correlation_id))
                    .insert(header(REASON_HEADER, rejection.reason.as_str()))
                    .insert(header(DETAIL_HEADER, &rejection.detail))
                    .insert(header(SOURCE_TOPIC_HEADER, msg.topic()))
                    .insert(header(SOURCE_PARTITION_HEADER, &msg.partition().to_string()))
                    .insert(header(SOURCE_OFFSET_HEADER, &msg.offset().to_string()));
                producer
                    .send(Outgoing {
                        topic: &self.dead_letter_topic,
                        partition: None,
                        key: msg.key(),
                        payload: msg.payload(),
                        headers,
                    })
                    .map_err(ProcessError::Kafka)?;
                *self.counts.dead_lettered.entry(rejection.reason).or_default() += 1;
            }
        }
        for change in self.store.take_changes() {
            producer
                .send(Outgoing {
                    topic: &self.changelogs[change.store],
                    partition: Some(self.partition),
                    key: Some(&change.key),
                    payload: change.value.as_deref(),
                    headers: OwnedHeaders::new(),
                })
                .map_err(ProcessError::Kafka)?;
        }
        self.next_offset = Some(msg.offset() + 1);
        Ok(())
    }

    /// After the Kafka commit: applies the overlay with the delivered changelog offsets and
    /// hands back the transaction's counts.
    pub fn committed(&mut self, delivered: &HashMap<(String, i32), i64>) -> Result<Counts, EngineError> {
        let offsets: Vec<(usize, i64)> = self
            .changelogs
            .iter()
            .enumerate()
            .filter_map(|(i, topic)| delivered.get(&(topic.clone(), self.partition)).map(|&o| (i, o)))
            .collect();
        self.store
            .commit(&offsets)
            .map_err(|e| EngineError::Fatal(anyhow::Error::new(e).context("store write after a committed transaction")))?;
        self.next_offset = None;
        Ok(std::mem::take(&mut self.counts))
    }

    /// After an abort: forgets the transaction's writes, position and counts.
    pub fn aborted(&mut self) {
        self.store.abort();
        self.next_offset = None;
        self.counts = Counts::default();
    }
}

fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header {
        key,
        value: Some(value),
    }
}

/// The input's headers, minus the ones tally sets itself.
fn copy_headers(msg: &BorrowedMessage<'_>, correlation_header: &str) -> OwnedHeaders {
    let mut out = OwnedHeaders::new();
    if let Some(hs) = msg.headers() {
        for h in hs.iter() {
            if h.key != correlation_header && !h.key.starts_with("tally.") {
                out = out.insert(Header {
                    key: h.key,
                    value: h.value,
                });
            }
        }
    }
    out
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
