//! tally's inputs watched from outside: the separately run reconciler compares each partition
//! tally consumes with the offset tally's group committed on it. A record appended there that
//! tally has not consumed while its partition made no progress for the threshold is reported,
//! once, with its coordinates, key and correlation id, so an event tally never touched (tally
//! stalled, crashed or not deployed) is found without any trace record of tally's.
//!
//! The state is small and changelogged with the alerts: per watched partition, the first
//! offset not yet reported, the record tally waits at and since when, and a few (end offset,
//! time) marks that bound when a record was appended whatever its producer stamped on it.

use crate::engine::emit::SourcePlace;
use crate::engine::headers;
use crate::engine::{clients, errors};
use crate::processors::correlation;
use crate::store::{codec, TaskStore};
use crate::topology::{Topology, Watch, WatchedTopic};
use anyhow::{Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Store index of the watch positions within a reconciler task.
pub const STORE: usize = 1;
/// How long one request to the cluster may take before the scan gives up until the next one.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long reading one partition's records may take in one scan.
const READ_TIMEOUT: Duration = Duration::from_secs(3);
/// (end offset, time) marks kept per partition.
const MARKS: usize = 16;
/// Largest payload parsed for an alert's key and correlation id; a larger record is reported
/// by its coordinates alone.
const MAX_PARSED_BYTES: usize = 1 << 20;

/// A record tally has not consumed, found stuck (the fields of its alert record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unprocessed {
    /// `<topic>/<partition>/<offset>` of the event in its source topic (the trace event id).
    pub event_id: String,
    /// The business idempotency key, when the record yields one.
    pub idempotency_key: Option<String>,
    /// The correlation id tally would give it.
    pub correlation_id: String,
    /// `<application_id>/<pipeline>` of the pipeline that should consume it.
    pub node: String,
    /// Where it waits: the watched topic, partition and offset.
    pub topic: String,
    /// Partition of `topic`.
    pub partition: i32,
    /// Offset in `topic`.
    pub offset: i64,
    /// Latest time it can have been appended, ms since the epoch.
    pub appended_ms: i64,
    /// Since when tally's group has not moved past the record it waits at.
    pub waiting_since_ms: i64,
}

/// What one scan of the watched partitions found.
#[derive(Debug, Default)]
pub struct WatchReport {
    /// Records appended beyond tally's committed offsets (about: control records count).
    pub unconsumed: u64,
    /// The longest time a watched partition has waited at one record, ms.
    pub longest_wait_ms: i64,
    /// Newly stuck records, each reported once.
    pub stuck: Vec<Unprocessed>,
    /// Partitions the scan could not look at this time (the cluster did not answer).
    pub skipped: usize,
    /// True when a watch position changed (written into the store's open transaction).
    pub changed: bool,
}

/// A watched partition's state, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct WatchState {
    /// First offset not yet reported.
    reported_to: i64,
    /// The first record tally's group has not consumed, when there is one.
    head: Option<i64>,
    /// Since when (ms) `head` has been the head.
    head_since_ms: i64,
    /// Where tally starts when its group has no offset here and starts at the end.
    floor: Option<i64>,
    /// (end offset, time seen ms), oldest first: a record below an end offset was appended
    /// before that time.
    marks: Vec<(i64, i64)>,
}

impl WatchState {
    /// The latest time the record at `offset` can have been appended: the first mark past it,
    /// or its timestamp if earlier (never later than `now_ms`). A timestamp at or before the
    /// epoch says nothing (a producer may set any, and `-1` stands for none).
    fn appended_ms(&self, offset: i64, timestamp_ms: Option<i64>, now_ms: i64) -> i64 {
        let seen = self
            .marks
            .iter()
            .find(|(end, _)| *end > offset)
            .map_or(now_ms, |(_, at)| *at);
        timestamp_ms
            .filter(|&ts| ts > 0)
            .map_or(seen, |ts| ts.min(seen))
            .min(now_ms)
    }

    /// Records that the partition ended at `end` at `now_ms`; drops marks below `from`.
    fn mark(&mut self, end: i64, from: i64, now_ms: i64) {
        if self.marks.last().is_none_or(|(e, _)| *e < end) {
            self.marks.push((end, now_ms));
        }
        // A mark at or below the first unconsumed offset bounds nothing any more.
        self.marks.retain(|(e, _)| *e > from);
        if self.marks.len() > MARKS {
            // Keep the oldest (they bound the oldest records) and the newest.
            self.marks.remove(1);
        }
    }
}

/// The watch of one reconciler task: the watched partitions `q` with `q % trace_partitions ==
/// partition`, so the reconciler's instances share them as they share the trace topic.
pub struct Watcher {
    watch: Watch,
    threshold_ms: i64,
    partition: i32,
    application_id: String,
    trace_topic: String,
    reader: ClientConfigHolder,
    /// When each partition was last scanned, ms.
    scanned: HashMap<(String, i32), i64>,
    /// Per partition, the committed offset whose records lost to retention were last reported:
    /// said once, not at every scan.
    lost_said: HashMap<(String, i32), i64>,
}

/// The reader's client settings and, once made, the reader.
struct ClientConfigHolder {
    config: rdkafka::ClientConfig,
    consumer: Option<BaseConsumer>,
}

impl Watcher {
    /// The watch of trace partition `partition` in the reconciler topology `t`.
    pub fn new(t: &Topology, watch: Watch, threshold: Duration, partition: i32, trace_topic: String) -> Self {
        Self {
            reader: ClientConfigHolder {
                config: clients::watch_reader(t, &watch.group),
                consumer: None,
            },
            application_id: watch.group.clone(),
            watch,
            threshold_ms: i64::try_from(threshold.as_millis()).unwrap_or(i64::MAX),
            partition,
            trace_topic,
            scanned: HashMap::new(),
            lost_said: HashMap::new(),
        }
    }

    /// Looks at every watched partition this task owns, writes their new state into `store`'s
    /// open transaction and returns what is stuck, at most `budget` newly stuck records.
    pub fn scan(&mut self, store: &mut TaskStore, now_ms: i64, budget: usize) -> Result<WatchReport> {
        let reader = self.reader.take()?;
        let result = self.scan_with(&reader, store, now_ms, budget);
        self.reader.consumer = Some(reader);
        result
    }

    fn scan_with(
        &mut self,
        consumer: &BaseConsumer,
        store: &mut TaskStore,
        now_ms: i64,
        budget: usize,
    ) -> Result<WatchReport> {
        let mut report = WatchReport::default();
        let trace_partitions = partition_count(consumer, &self.trace_topic)?.unwrap_or(1).max(1);
        for watched in &self.watch.topics {
            let Some(count) = partition_count(consumer, &watched.topic)? else {
                // A repartition topic appears when tally first starts.
                continue;
            };
            let owned: Vec<i32> = (0..count).filter(|q| q % trace_partitions == self.partition).collect();
            if owned.is_empty() {
                continue;
            }
            let committed = committed(consumer, &watched.topic, &owned)?;
            for q in owned {
                let ctx = PartitionScan {
                    watched,
                    partition: q,
                    committed: committed.get(&q).copied(),
                    last_scan_ms: self.scanned.insert((watched.topic.clone(), q), now_ms),
                    now_ms,
                };
                let budget_left = budget.saturating_sub(report.stuck.len());
                match self.scan_partition(consumer, store, &ctx, budget_left, &mut report) {
                    Ok(None) => {}
                    Ok(Some(log_start)) => {
                        let committed = ctx.committed.unwrap_or(log_start);
                        if self.lost_said.insert((watched.topic.clone(), q), committed) != Some(committed) {
                            tracing::warn!(
                                topic = %watched.topic,
                                partition = q,
                                committed,
                                log_start,
                                "records tally had not consumed were deleted by retention before it could (lost to tally: {})",
                                log_start - committed
                            );
                        }
                    }
                    Err(e) if errors::worth_waiting(&e) => {
                        tracing::debug!(topic = %watched.topic, partition = q, error = %format!("{e:#}"), "watch: partition skipped this scan");
                        report.skipped += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(report)
    }

    /// Scans one partition; returns the partition's log start when records tally had not
    /// consumed were deleted by retention.
    fn scan_partition(
        &self,
        consumer: &BaseConsumer,
        store: &mut TaskStore,
        ctx: &PartitionScan<'_>,
        budget: usize,
        report: &mut WatchReport,
    ) -> Result<Option<i64>> {
        let topic = ctx.watched.topic.as_str();
        let key = format!("{topic}/{}", ctx.partition).into_bytes();
        let mut state = load(store, &key)?;
        let before = state.clone();
        let (low, high) = consumer
            .fetch_watermarks(topic, ctx.partition, REQUEST_TIMEOUT)
            .with_context(|| format!("end offsets of {topic}[{}]", ctx.partition))?;
        let start = match ctx.committed {
            Some(c) => c,
            None if self.watch.from_earliest => low,
            None => *state.floor.get_or_insert(high),
        };
        let lost_to_retention = (start < low && ctx.committed.is_some()).then_some(low);
        let from = start.max(low);
        state.mark(high, from, ctx.now_ms);
        let head = if from < high {
            read(consumer, ctx, from, 1)?.into_iter().next()
        } else {
            None
        };
        match head {
            None => state.head = None,
            Some(first) => {
                if state.head != Some(first.offset) {
                    // tally reached this record after the last scan saw another head, and not
                    // before it was appended.
                    let appended = state.appended_ms(first.offset, first.timestamp_ms, ctx.now_ms);
                    state.head = Some(first.offset);
                    state.head_since_ms = appended.max(ctx.last_scan_ms.unwrap_or(i64::MIN));
                }
                report.unconsumed += (high - from).max(0) as u64;
                let waited = ctx.now_ms.saturating_sub(state.head_since_ms);
                report.longest_wait_ms = report.longest_wait_ms.max(waited);
                if waited >= self.threshold_ms && budget > 0 {
                    let at = state.reported_to.max(first.offset);
                    for record in read(consumer, ctx, at, budget)? {
                        let appended = state.appended_ms(record.offset, record.timestamp_ms, ctx.now_ms);
                        if ctx.now_ms.saturating_sub(appended) < self.threshold_ms {
                            break;
                        }
                        state.reported_to = record.offset + 1;
                        report
                            .stuck
                            .push(self.describe(ctx, record, appended, state.head_since_ms));
                    }
                }
            }
        }
        if state != before {
            store.put(STORE, &key, codec::encode(&state).context("encoding a watch position")?);
            report.changed = true;
        }
        Ok(lost_to_retention)
    }

    /// The alert's view of a stuck record.
    fn describe(&self, ctx: &PartitionScan<'_>, r: ReadRecord, appended_ms: i64, waiting_since_ms: i64) -> Unprocessed {
        Unprocessed {
            event_id: r.event_id,
            idempotency_key: r.idempotency_key,
            correlation_id: r.correlation_id,
            node: format!("{}/{}", self.application_id, ctx.watched.pipeline.name),
            topic: ctx.watched.topic.clone(),
            partition: ctx.partition,
            offset: r.offset,
            appended_ms,
            waiting_since_ms,
        }
    }
}

impl ClientConfigHolder {
    /// The reader, made on first use; put it back in `consumer` after use.
    fn take(&mut self) -> Result<BaseConsumer> {
        match self.consumer.take() {
            Some(c) => Ok(c),
            None => self
                .config
                .create()
                .context("cannot create the watch reader; check `kafka.properties`"),
        }
    }
}

/// One watched partition in one scan.
struct PartitionScan<'a> {
    watched: &'a WatchedTopic,
    partition: i32,
    /// tally's committed offset, when its group has one.
    committed: Option<i64>,
    /// When this watcher last scanned the partition (not kept across restarts).
    last_scan_ms: Option<i64>,
    now_ms: i64,
}

/// A record read for the watch: what an alert says of it, not its bytes (a scan may read
/// thousands of large records).
struct ReadRecord {
    offset: i64,
    timestamp_ms: Option<i64>,
    /// Its coordinates, or the source event's a repartition record carries.
    event_id: String,
    idempotency_key: Option<String>,
    correlation_id: String,
}

fn load(store: &TaskStore, key: &[u8]) -> Result<WatchState> {
    let bytes = match store.pending(STORE, key) {
        Some(pending) => pending.map(<[u8]>::to_vec),
        None => store.get(STORE, key).context("reading a watch position")?,
    };
    Ok(match bytes {
        None => WatchState::default(),
        Some(b) => codec::decode(&b).unwrap_or_else(|e| {
            // Written by a newer format: start the partition's watch over.
            tracing::warn!(error = %e, "unreadable watch position; starting that partition's watch over");
            WatchState::default()
        }),
    })
}

fn partition_count(consumer: &BaseConsumer, topic: &str) -> Result<Option<i32>> {
    let metadata = consumer
        .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
        .with_context(|| format!("metadata of `{topic}`"))?;
    Ok(metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map(|t| t.partitions().len() as i32)
        .filter(|n| *n > 0))
}

/// tally's group's committed offsets of `topic`'s `partitions`.
fn committed(consumer: &BaseConsumer, topic: &str, partitions: &[i32]) -> Result<HashMap<i32, i64>> {
    let mut tpl = TopicPartitionList::new();
    for q in partitions {
        tpl.add_partition(topic, *q);
    }
    let answer = consumer
        .committed_offsets(tpl, REQUEST_TIMEOUT)
        .with_context(|| format!("tally's committed offsets on `{topic}`"))?;
    Ok(answer
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}

/// Up to `max` committed records of the scanned partition from `from`, fewer at its end.
fn read(consumer: &BaseConsumer, ctx: &PartitionScan<'_>, from: i64, max: usize) -> Result<Vec<ReadRecord>> {
    let (topic, partition) = (ctx.watched.topic.as_str(), ctx.partition);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(from))
        .context("watch position")?;
    consumer.assign(&tpl).context("assigning the watch reader")?;
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut records = Vec::new();
    while records.len() < max && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(m)) if m.topic() == topic && m.partition() == partition && m.offset() >= from => {
                records.push(ReadRecord::of(&m, ctx.watched));
            }
            Some(Ok(_)) => {}
            Some(Err(KafkaError::PartitionEOF(p))) if p == partition => break,
            Some(Err(e)) => return Err(anyhow::Error::new(e).context(format!("reading {topic}[{partition}]"))),
        }
    }
    Ok(records)
}

impl ReadRecord {
    /// The record `m` of `watched`. Its `tally.source` headers name the event only on a
    /// repartition topic, where tally wrote them: on a source topic they are anyone's to set.
    fn of(m: &BorrowedMessage<'_>, watched: &WatchedTopic) -> Self {
        let pipeline = &watched.pipeline;
        let text = |name: &str| headers::text(m, name);
        let event_id = SourcePlace::of(m, watched.repartitioned).event_id();
        let doc = m
            .payload()
            .filter(|p| p.len() <= MAX_PARSED_BYTES)
            .and_then(|p| serde_json::from_slice::<Map<String, Value>>(p).ok());
        let mut idempotency_key = doc
            .as_ref()
            .and_then(|d| pipeline.key.render_key(d).ok())
            .map(|k| k.text);
        let seed = idempotency_key.as_deref().unwrap_or(&event_id);
        let mut correlation_id = correlation::resolve(
            &pipeline.correlation,
            text(pipeline.correlation_header()),
            doc.as_ref(),
            seed,
        );
        // An alert repeats both (the id twice): as long as a record allows, it could not be
        // written.
        correlation::shorten(&mut correlation_id);
        if let Some(key) = &mut idempotency_key {
            correlation::shorten(key);
        }
        Self {
            offset: m.offset(),
            timestamp_ms: m.timestamp().to_millis(),
            event_id,
            idempotency_key,
            correlation_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_counts_as_appended_no_later_than_the_first_end_seen_past_it() {
        let mut s = WatchState::default();
        s.mark(10, 0, 1_000);
        s.mark(20, 0, 2_000);
        // Stamped in the future by its producer: bounded by when the end passed it.
        assert_eq!(s.appended_ms(5, Some(9_999_999), 5_000), 1_000);
        assert_eq!(s.appended_ms(15, Some(9_999_999), 5_000), 2_000);
        // An earlier timestamp wins; past every mark, the clock.
        assert_eq!(s.appended_ms(15, Some(1_500), 5_000), 1_500);
        assert_eq!(s.appended_ms(25, None, 5_000), 5_000);
        // A timestamp at or before the epoch tells nothing: the marks and the clock do.
        for ts in [0, -1, i64::MIN] {
            assert_eq!(s.appended_ms(15, Some(ts), 5_000), 2_000, "{ts}");
            assert_eq!(s.appended_ms(25, Some(ts), 5_000), 5_000, "{ts}");
        }
    }

    #[test]
    fn marks_stay_bounded_and_forget_what_tally_consumed() {
        let mut s = WatchState::default();
        for i in 1..=40 {
            s.mark(i * 10, 0, i * 1_000);
        }
        assert_eq!(s.marks.len(), MARKS);
        assert_eq!(s.marks[0], (10, 1_000), "the oldest bound is kept");
        s.mark(400, 395, 41_000);
        assert_eq!(s.marks, vec![(400, 40_000)]);
    }
}
