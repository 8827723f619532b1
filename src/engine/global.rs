//! Feeds the global ID-mapping store from the compacted mappings topic, on a thread of its own
//! (like a Kafka Streams global stream thread): at startup from the positions the store recorded
//! (the whole topic only on a first start), then tailing it.

use super::errors::{self, EngineError};
use super::health::{Health, Remedy};
use super::stable_end::{self, StableEnd};
use super::{clients, Shutdown};
use crate::metrics::Metrics;
use crate::store::global::MappingRecord;
use crate::store::write::CATCH_UP_BATCH_BYTES;
use crate::store::{GlobalMappings, StoreError};
use crate::topology::Topology;
use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The catch-up fails when it reads nothing for this long: a time limit on the whole catch-up
/// would stop every start once the topic holds more than that limit's worth of mappings.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a long catch-up logs its progress.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);
const GAUGE_INTERVAL: Duration = Duration::from_secs(5);
/// Records written to the store in one batch while catching up.
const BATCH: usize = 1_000;
/// Pause before reading a record again whose write to the store failed.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// The reader once the store holds the topic as of startup: [`Tail::run`] applies what comes
/// after, on a thread of its own.
pub struct Tail {
    consumer: BaseConsumer,
    topic: String,
    global: Arc<GlobalMappings>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
}

/// Reads the mappings topic into the store up to its end as of startup; returns the reader,
/// to tail the topic from there.
pub fn start(
    t: &Topology,
    topic: &str,
    global: Arc<GlobalMappings>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) -> Result<Tail> {
    let config = clients::global_reader(t);
    let consumer: BaseConsumer = config.create().context("creating the ID-mapping reader")?;
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(15))
        .with_context(|| format!("reading metadata of the mappings topic `{topic}`"))?;
    let partitions = md.topics().first().map_or(0, |t| t.partitions().len()) as i32;
    let limit = clients::open_transaction_limit(t);
    let mut ends = HashMap::new();
    for p in 0..partitions {
        let StableEnd { low, high } =
            stable_end::wait(&consumer, &config, topic, p, limit, &|| !shutdown.is_triggered())
                .with_context(|| format!("reading the end of `{topic}` partition {p}"))?;
        ends.insert(p, (low, high));
    }
    let starts = resume_points(&global, topic, &ends)?;
    let mut tpl = TopicPartitionList::new();
    for (p, from) in &starts {
        tpl.add_partition_offset(topic, *p, *from)?;
    }
    consumer.assign(&tpl).context("assigning the mappings topic")?;
    // Catch up to the ends seen at startup before any stream thread looks ids up.
    let started = Instant::now();
    // The topic is written in transactions, so it ends with a commit marker the consumer never
    // hands out: a partition is read to its end when the consumer's position reaches the end
    // seen at startup, not when the last record's offset + 1 does.
    let mut caught_up: HashMap<i32, bool> = ends
        .iter()
        .map(|(p, (low, high))| (*p, low >= high || starts.get(p) == Some(&Offset::Offset(*high))))
        .collect();
    let mut applied = 0u64;
    let mut batch: Vec<Owned> = Vec::with_capacity(BATCH);
    let mut batch_bytes = 0;
    let (mut last_read, mut last_progress) = (Instant::now(), Instant::now());
    while !caught_up.values().all(|d| *d) {
        if last_read.elapsed() > STALL_TIMEOUT {
            bail!(
                "reading the mappings topic `{topic}` to its end stalled: nothing arrived for {}s \
                 ({applied} records applied); check that the broker is reachable and leads every \
                 partition of the topic",
                STALL_TIMEOUT.as_secs()
            );
        }
        if shutdown.is_triggered() {
            bail!("stopping while reading the mappings topic `{topic}`");
        }
        if last_progress.elapsed() >= PROGRESS_INTERVAL {
            last_progress = Instant::now();
            tracing::info!(
                topic,
                applied,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "loading ID mappings"
            );
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                last_read = Instant::now();
                if m.offset() + 1 >= ends.get(&m.partition()).map_or(0, |(_, high)| *high) {
                    caught_up.insert(m.partition(), true);
                }
                if let Some(record) = Owned::of(&m) {
                    batch_bytes += record.key.len() + record.value.as_ref().map_or(0, String::len);
                    batch.push(record);
                }
                if batch.len() >= BATCH || batch_bytes >= CATCH_UP_BATCH_BYTES {
                    applied += write(&global, &mut batch).context("writing ID mappings to the local store")?;
                    batch_bytes = 0;
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                caught_up.insert(p, true);
            }
            // No retry passes a missing ACL: stop now with the fix, not after the catch-up timeout.
            Some(Err(e)) if errors::classify(&e) == errors::ErrorClass::Refused => {
                return Err(EngineError::from_kafka(e, &format!("reading the mappings topic `{topic}`")).into());
            }
            Some(Err(e)) => tracing::warn!(error = %e, "reading the mappings topic"),
            None => {
                if let Ok(positions) = consumer.position() {
                    for el in positions.elements() {
                        let reached = el.offset().to_raw().unwrap_or(-1);
                        if ends.get(&el.partition()).is_some_and(|(_, high)| reached >= *high) {
                            caught_up.insert(el.partition(), true);
                        }
                    }
                }
            }
        }
    }
    applied += write(&global, &mut batch).context("writing ID mappings to the local store")?;
    global.set_ready();
    publish(&global, &metrics);
    tracing::info!(
        topic,
        applied,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "ID mappings loaded"
    );
    Ok(Tail {
        consumer,
        topic: topic.to_string(),
        global,
        metrics,
        shutdown,
    })
}

/// Where each partition is read from: the store's recorded position, or the beginning after
/// the store was reset because it holds another topic or positions this topic does not have
/// (recreated, or truncated by DeleteRecords).
fn resume_points(
    global: &GlobalMappings,
    topic: &str,
    ends: &HashMap<i32, (i64, i64)>,
) -> Result<HashMap<i32, Offset>> {
    let mut starts = HashMap::new();
    let mut consistent = global.topic()?.as_deref() == Some(topic);
    for (p, (low, high)) in ends {
        match global.position(*p) {
            Ok(Some(pos)) if pos >= *low && pos <= *high => {
                starts.insert(*p, Offset::Offset(pos));
            }
            Err(StoreError::CorruptOffset(..)) => {
                tracing::warn!(
                    topic,
                    partition = p,
                    "the ID-mapping store's position is unreadable; reading the topic again"
                );
                consistent = false;
            }
            Err(e) => return Err(e.into()),
            Ok(Some(pos)) => {
                tracing::warn!(
                    topic,
                    partition = p,
                    position = pos,
                    low,
                    high,
                    "the ID-mapping store's position is outside the topic (recreated?); reading the topic again"
                );
                consistent = false;
            }
            Ok(None) => {
                starts.insert(*p, Offset::Beginning);
            }
        }
    }
    if !consistent {
        global.reset(topic)?;
        return Ok(ends.keys().map(|p| (*p, Offset::Beginning)).collect());
    }
    Ok(starts)
}

impl Tail {
    /// Applies new mapping records as they arrive until shutdown; a record whose write fails is
    /// read again after a pause rather than skipped. A refusal (a missing ACL, rejected
    /// credentials) ends it, with the fix in `health`: the stream threads would otherwise go on
    /// with mappings that no longer change.
    pub fn run(self, health: &Health) {
        let Self {
            consumer,
            topic,
            global,
            metrics,
            shutdown,
        } = self;
        if let Err(e) = tail(&consumer, &topic, &global, &metrics, &shutdown) {
            let why = format!("{e:#}");
            tracing::error!(error = %why, "stopping the instance");
            health.engine_failed(why, Remedy::Fix);
        }
    }
}

/// The loop of [`Tail::run`]; an error is a refusal.
fn tail(
    consumer: &BaseConsumer,
    topic: &str,
    global: &GlobalMappings,
    metrics: &Metrics,
    shutdown: &Shutdown,
) -> Result<(), EngineError> {
    let mut last_gauge = Instant::now();
    while !shutdown.is_triggered() {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let (partition, offset) = (m.partition(), m.offset());
                let mut one: Vec<Owned> = Owned::of(&m).into_iter().collect();
                if let Err(e) = write(global, &mut one) {
                    tracing::error!(error = %e, partition, offset, "cannot write an ID mapping to the local store; retrying");
                    if let Err(e) = consumer.seek(topic, partition, Offset::Offset(offset), Duration::from_secs(10)) {
                        tracing::error!(error = %e, "cannot rewind the mappings reader");
                    }
                    shutdown.wait(RETRY_PAUSE);
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) | None => {}
            // No retry passes a missing ACL: warning about it forever would hide it.
            Some(Err(e)) if errors::classify(&e) == errors::ErrorClass::Refused => {
                publish(global, metrics);
                return Err(EngineError::from_kafka(
                    e,
                    &format!("reading the mappings topic `{topic}`"),
                ));
            }
            Some(Err(e)) => tracing::warn!(error = %e, "reading the mappings topic"),
        }
        if last_gauge.elapsed() >= GAUGE_INTERVAL {
            publish(global, metrics);
            last_gauge = Instant::now();
        }
    }
    publish(global, metrics);
    Ok(())
}

/// A mappings record taken off the consumer.
struct Owned {
    partition: i32,
    offset: i64,
    key: String,
    value: Option<String>,
}

impl Owned {
    /// The record, unless its key or value is not UTF-8 (tally writes neither; such a record is
    /// skipped with a warning, never taken as a delete).
    fn of(m: &BorrowedMessage<'_>) -> Option<Self> {
        let key = m.key().map(std::str::from_utf8);
        let value = m.payload().map(std::str::from_utf8).transpose();
        match (key, value) {
            (Some(Ok(key)), Ok(value)) => Some(Self {
                partition: m.partition(),
                offset: m.offset(),
                key: key.to_string(),
                value: value.map(str::to_string),
            }),
            _ => {
                tracing::warn!(
                    partition = m.partition(),
                    offset = m.offset(),
                    "mappings record without a UTF-8 key and value skipped"
                );
                None
            }
        }
    }
}

/// Writes and empties `batch`; returns how many records it held.
fn write(global: &GlobalMappings, batch: &mut Vec<Owned>) -> Result<u64> {
    let records: Vec<MappingRecord<'_>> = batch
        .iter()
        .map(|o| MappingRecord {
            partition: o.partition,
            offset: o.offset,
            key: &o.key,
            value: o.value.as_deref(),
        })
        .collect();
    global.apply(&records)?;
    let n = batch.len() as u64;
    batch.clear();
    Ok(n)
}

fn publish(global: &GlobalMappings, metrics: &Metrics) {
    let c = global.counts();
    metrics.idmap_mappings.set(c.mappings as i64);
    metrics.idmap_pending.set(c.pending as i64);
}
