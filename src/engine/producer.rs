//! The transactional producer of a stream thread, and the changelog offsets it delivered.

use super::errors::{classify, ErrorClass, TxnStep};
use super::faults::{self, Point};
use super::Shutdown;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext, Message, TopicPartitionList};
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often `await_deliveries` looks at the in-flight count.
const DELIVERY_CHECK: Duration = Duration::from_micros(500);
/// The longest one transactional call blocks. A timed-out call is repeated (librdkafka keeps
/// its state) within the wait's budget, so a stop request is noticed between calls and a broker
/// back within the budget completes the step.
const CALL: Duration = Duration::from_secs(5);
/// The longest an abort waits: one that cannot finish costs nothing, since the next producer
/// of the transactional id aborts what it left open.
const ABORT_WAIT: Duration = Duration::from_secs(10);

/// Highest delivered offset per (topic, partition) of the records sent to a fixed partition
/// (the changelogs) since the last take.
type Delivered = HashMap<(String, i32), i64>;

/// The delivery opaque of a record whose offset is tracked (sent to a fixed partition).
const TRACKED: usize = 1;
/// The delivery opaque of a record whose offset nobody needs.
const UNTRACKED: usize = 0;

/// Records the offsets of delivered changelog records, so stores can note which changelog
/// offset they reflect.
#[derive(Default)]
pub struct DeliveryTracker {
    /// Highest delivered offset per partition, by topic: looked up by the report's `&str`, so a
    /// delivery report allocates nothing once its topic was seen. The names are tally's own
    /// changelog topics, so the fast hasher serves.
    delivered: Mutex<FxHashMap<String, FxHashMap<i32, i64>>>,
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, tracked: usize) {
        // Outputs and repartitioned records (two of the three records a repartitioned input
        // makes) need no bookkeeping, nor do failed deliveries: they make the transaction
        // abortable.
        if tracked != TRACKED {
            return;
        }
        if let Ok(m) = result {
            if let Ok(mut d) = self.delivered.lock() {
                if !d.contains_key(m.topic()) {
                    d.insert(m.topic().to_string(), FxHashMap::default());
                }
                if let Some(partitions) = d.get_mut(m.topic()) {
                    let e = partitions.entry(m.partition()).or_insert(m.offset());
                    *e = (*e).max(m.offset());
                }
            }
        }
    }
}

/// One outgoing record.
pub struct Outgoing<'a> {
    /// Destination topic.
    pub topic: &'a str,
    /// Fixed partition (changelogs), or `None` to partition by key. Only records sent to a
    /// fixed partition have their delivered offset returned by [`TxnProducer::commit`].
    pub partition: Option<i32>,
    /// Message key.
    pub key: Option<&'a [u8]>,
    /// Message value; `None` is a tombstone.
    pub payload: Option<&'a [u8]>,
    /// Message headers; `None` for none (no header list is built or parsed at all).
    pub headers: Option<OwnedHeaders>,
}

/// A transactional producer with the transaction begun lazily on the first send.
///
/// Threaded: a background thread serves delivery reports, which `abort_transaction` waits for;
/// on a producer nobody polls during the call, an abort blocks until its timeout.
pub struct TxnProducer {
    producer: ThreadedProducer<DeliveryTracker>,
    in_transaction: bool,
    timeout: Duration,
    limit: usize,
    /// Once triggered, each wait has at most `stop_budget` left.
    shutdown: Shutdown,
    stop_budget: Duration,
}

/// Bytes a record takes in a batch beyond its key, value and header bytes: the batch header
/// (61), the record's varints and attributes, with room to spare.
const RECORD_OVERHEAD: usize = 256;

/// The size a record takes on the wire, as the producer's and the broker's limits count it.
pub fn record_size(key: Option<&[u8]>, payload: Option<&[u8]>, headers: Option<&OwnedHeaders>) -> usize {
    let header_bytes: usize = headers
        .into_iter()
        .flat_map(|h| super::headers::list(h.as_borrowed()))
        .map(|h| h.name.len() + h.value.map_or(0, <[u8]>::len) + 10)
        .sum();
    key.map_or(0, <[u8]>::len) + payload.map_or(0, <[u8]>::len) + header_bytes + RECORD_OVERHEAD
}

impl TxnProducer {
    /// Creates the producer and initialises transactions, fencing older producers of the same
    /// transactional id (and aborting what they left open). Records larger than `limit` bytes
    /// are refused before librdkafka sees them (see [`TxnProducer::send`]). Waits last up to
    /// `timeout`, or `stop_budget` once `shutdown` is triggered: the last commit of a stopping
    /// instance must not outlast its termination grace period when the cluster is away (what
    /// it cannot commit, the next owner processes again).
    pub fn new(
        config: &ClientConfig,
        timeout: Duration,
        limit: usize,
        shutdown: Shutdown,
        stop_budget: Duration,
    ) -> KafkaResult<Self> {
        let producer = Self {
            producer: config.create_with_context(DeliveryTracker::default())?,
            in_transaction: false,
            timeout,
            limit,
            shutdown,
            stop_budget,
        };
        producer.retry(timeout, |call| producer.producer.init_transactions(call))?;
        Ok(producer)
    }

    /// True when a record of this shape fits the limit.
    pub fn fits(&self, key: Option<&[u8]>, payload: Option<&[u8]>, headers: Option<&OwnedHeaders>) -> bool {
        record_size(key, payload, headers) <= self.limit
    }

    /// True when a record of `bytes` key and value bytes and no headers fits the limit.
    pub fn fits_bytes(&self, bytes: usize) -> bool {
        bytes <= self.largest_bytes()
    }

    /// The most key and value bytes a record without headers may hold.
    pub fn largest_bytes(&self) -> usize {
        self.limit.saturating_sub(RECORD_OVERHEAD)
    }

    /// True while a transaction is open.
    pub fn in_transaction(&self) -> bool {
        self.in_transaction
    }

    /// Opens a transaction unless one is open.
    pub fn begin(&mut self) -> KafkaResult<()> {
        if !self.in_transaction {
            self.producer.begin_transaction()?;
            self.in_transaction = true;
        }
        Ok(())
    }

    /// Sends a record inside the open transaction (opening one if needed), waiting while the
    /// local queue is full.
    ///
    /// A record over the limit fails with `MessageSizeTooLarge` before it is enqueued, so the
    /// transaction stays healthy: enqueued, librdkafka would refuse it the same way, or the
    /// broker would (a topic's `max.message.bytes`) and fail the whole transaction at commit.
    pub fn send(&mut self, out: Outgoing<'_>) -> KafkaResult<()> {
        if !self.fits(out.key, out.payload, out.headers.as_ref()) {
            return Err(KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge));
        }
        self.begin()?;
        let tracked = if out.partition.is_some() { TRACKED } else { UNTRACKED };
        let mut record: BaseRecord<'_, [u8], [u8], usize> = BaseRecord::with_opaque_to(out.topic, tracked);
        if let Some(h) = out.headers {
            record = record.headers(h);
        }
        if let Some(p) = out.partition {
            record = record.partition(p);
        }
        if let Some(k) = out.key {
            record = record.key(k);
        }
        if let Some(v) = out.payload {
            record = record.payload(v);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Adds the consumed offsets to the transaction and commits it. Returns the highest
    /// delivered offset per fixed partition (see [`Outgoing::partition`]), or the error with the
    /// step it came from (the step decides whether an abort is safe: see
    /// [`super::errors::recovery`]).
    pub fn commit(
        &mut self,
        offsets: &TopicPartitionList,
        group: &ConsumerGroupMetadata,
    ) -> Result<Delivered, (KafkaError, TxnStep)> {
        self.begin().map_err(|e| (e, TxnStep::Produce))?;
        let started = Instant::now();
        // The offsets go first: their round trips to the two coordinators (AddOffsetsToTxn,
        // TxnOffsetCommit) then overlap the last produce requests' acknowledgements instead of
        // following them. Order does not matter to the outcome: a record that fails after the
        // offsets joined makes the transaction abortable, and it is aborted whole.
        if offsets.count() > 0 {
            self.retry(self.timeout, |call| {
                self.producer.send_offsets_to_transaction(offsets, group, call)
            })
            .map_err(|e| (e, TxnStep::SendOffsets))?;
        }
        if faults::hit(Point::CommitAbortable) {
            return Err((
                KafkaError::MessageProduction(RDKafkaErrorCode::RebalanceInProgress),
                TxnStep::SendOffsets,
            ));
        }
        let offsets_at = Instant::now();
        self.await_deliveries();
        let delivered_at = Instant::now();
        self.retry(self.timeout, |call| self.producer.commit_transaction(call))
            .map_err(|e| (e, TxnStep::EndTxn))?;
        if faults::hit(Point::CommitOutcomeUnknown) {
            return Err((
                KafkaError::MessageProduction(RDKafkaErrorCode::OperationTimedOut),
                TxnStep::EndTxn,
            ));
        }
        self.in_transaction = false;
        tracing::debug!(
            offsets_us = offsets_at.duration_since(started).as_micros() as u64,
            deliveries_us = delivered_at.duration_since(offsets_at).as_micros() as u64,
            commit_us = delivered_at.elapsed().as_micros() as u64,
            offsets = %describe(offsets),
            "transaction committed"
        );
        Ok(self.take_delivered())
    }

    /// Waits (up to the timeout) until every record sent has its delivery report.
    ///
    /// `commit_transaction` flushes too, but its flush (librdkafka in event mode, as rust-rdkafka
    /// sets it) measured ~100 ms whenever any record was still in flight, although the in-flight
    /// count, watched here, reached zero after a few ms: a missed wake-up, not broker time. The
    /// stream thread is blocked for the whole commit, so it cost over half of a drain's time.
    fn await_deliveries(&self) {
        let started = Instant::now();
        while self.producer.in_flight_count() > 0 && started.elapsed() < self.budget(self.timeout) {
            std::thread::sleep(DELIVERY_CHECK);
        }
    }

    /// Aborts the open transaction, if any, and forgets its delivered offsets. An abort that
    /// fails is not tried again: the transaction is left to the next producer of the id.
    pub fn abort(&mut self) -> KafkaResult<()> {
        if self.in_transaction {
            self.in_transaction = false;
            self.retry(self.timeout.min(ABORT_WAIT), |call| {
                self.producer.abort_transaction(call)
            })?;
        }
        self.take_delivered();
        Ok(())
    }

    /// What is left of a wait of `budget`: all of it, or the stop budget once stopping.
    fn budget(&self, budget: Duration) -> Duration {
        if self.shutdown.is_triggered() {
            budget.min(self.stop_budget)
        } else {
            budget
        }
    }

    /// Repeats `call` (given how long it may block) while it fails with a retriable error, up to
    /// `budget`; a stop request noticed meanwhile shortens what is left to the stop budget.
    fn retry(&self, budget: Duration, mut call: impl FnMut(Duration) -> KafkaResult<()>) -> KafkaResult<()> {
        let mut deadline = Instant::now() + self.budget(budget);
        let mut stopping = self.shutdown.is_triggered();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match call(left.clamp(Duration::from_millis(100), CALL)) {
                Err(e) if classify(&e) == ErrorClass::Retriable && Instant::now() < deadline => {
                    tracing::debug!(error = %e, "retriable Kafka error, retrying");
                    if !stopping && self.shutdown.is_triggered() {
                        stopping = true;
                        deadline = deadline.min(Instant::now() + self.stop_budget);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                other => return other,
            }
        }
    }

    fn take_delivered(&self) -> Delivered {
        let Ok(mut by_topic) = self.producer.context().delivered.lock() else {
            return Delivered::new();
        };
        let mut delivered = Delivered::new();
        for (topic, partitions) in by_topic.iter_mut() {
            delivered.extend(partitions.drain().map(|(p, o)| ((topic.clone(), p), o)));
        }
        delivered
    }
}

/// `topic[partition]=offset,…` of the offsets a transaction committed, for diagnosing runs.
fn describe(offsets: &TopicPartitionList) -> String {
    offsets
        .elements()
        .iter()
        .map(|e| format!("{}[{}]={:?}", e.topic(), e.partition(), e.offset()))
        .collect::<Vec<_>>()
        .join(",")
}
