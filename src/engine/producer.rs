//! The transactional producer of a stream thread, and the changelog offsets it delivered.

use super::errors::{classify, ErrorClass, TxnStep};
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext, Message, TopicPartitionList};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often `await_deliveries` looks at the in-flight count.
const DELIVERY_CHECK: Duration = Duration::from_micros(500);
/// The timeout of one `commit_transaction` call; a timed-out call is repeated within the
/// producer's timeout.
const END_TXN_CALL: Duration = Duration::from_secs(5);

/// Highest delivered offset per (topic, partition) since the last take.
type Delivered = HashMap<(String, i32), i64>;

/// Records the offsets of delivered records, so stores can note which changelog offset they
/// reflect.
#[derive(Default)]
pub struct DeliveryTracker {
    delivered: Mutex<Delivered>,
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        // Failed deliveries need no bookkeeping: they make the transaction abortable.
        if let Ok(m) = result {
            if let Ok(mut d) = self.delivered.lock() {
                let e = d.entry((m.topic().to_string(), m.partition())).or_insert(m.offset());
                *e = (*e).max(m.offset());
            }
        }
    }
}

/// One outgoing record.
pub struct Outgoing<'a> {
    /// Destination topic.
    pub topic: &'a str,
    /// Fixed partition (changelogs), or `None` to partition by key.
    pub partition: Option<i32>,
    /// Message key.
    pub key: Option<&'a [u8]>,
    /// Message value; `None` is a tombstone.
    pub payload: Option<&'a [u8]>,
    /// Message headers.
    pub headers: OwnedHeaders,
}

/// A transactional producer with the transaction begun lazily on the first send.
///
/// Threaded: a background thread serves delivery reports, which `abort_transaction` waits for;
/// on a producer nobody polls during the call, an abort blocks until its timeout.
pub struct TxnProducer {
    producer: ThreadedProducer<DeliveryTracker>,
    in_transaction: bool,
    timeout: Duration,
}

impl TxnProducer {
    /// Creates the producer and initialises transactions, fencing older producers of the same
    /// transactional id (and aborting what they left open).
    pub fn new(config: &ClientConfig, timeout: Duration) -> KafkaResult<Self> {
        let producer: ThreadedProducer<DeliveryTracker> = config.create_with_context(DeliveryTracker::default())?;
        retry(timeout, || producer.init_transactions(timeout))?;
        Ok(Self {
            producer,
            in_transaction: false,
            timeout,
        })
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
    pub fn send(&mut self, out: Outgoing<'_>) -> KafkaResult<()> {
        self.begin()?;
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(out.topic).headers(out.headers);
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
    /// delivered offset per partition, or the error with the step it came from (the step
    /// decides whether an abort is safe: see [`super::errors::recovery`]).
    pub fn commit(
        &mut self,
        offsets: &TopicPartitionList,
        group: &ConsumerGroupMetadata,
    ) -> Result<Delivered, (KafkaError, TxnStep)> {
        self.begin().map_err(|e| (e, TxnStep::Produce))?;
        let started = Instant::now();
        self.await_deliveries();
        let delivered_at = Instant::now();
        if offsets.count() > 0 {
            retry(self.timeout, || {
                self.producer.send_offsets_to_transaction(offsets, group, self.timeout)
            })
            .map_err(|e| (e, TxnStep::SendOffsets))?;
        }
        let offsets_at = Instant::now();
        // A commit that timed out is resumed by calling it again (librdkafka keeps its state),
        // in shorter calls so a broker back within the budget completes it.
        retry(self.timeout, || self.producer.commit_transaction(END_TXN_CALL)).map_err(|e| (e, TxnStep::EndTxn))?;
        self.in_transaction = false;
        tracing::debug!(
            deliveries_us = delivered_at.duration_since(started).as_micros() as u64,
            offsets_us = offsets_at.duration_since(delivered_at).as_micros() as u64,
            commit_us = offsets_at.elapsed().as_micros() as u64,
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
        let deadline = Instant::now() + self.timeout;
        while self.producer.in_flight_count() > 0 && Instant::now() < deadline {
            std::thread::sleep(DELIVERY_CHECK);
        }
    }

    /// Aborts the open transaction, if any, and forgets its delivered offsets.
    pub fn abort(&mut self) -> KafkaResult<()> {
        if self.in_transaction {
            retry(self.timeout, || self.producer.abort_transaction(self.timeout))?;
            self.in_transaction = false;
        }
        self.take_delivered();
        Ok(())
    }

    fn take_delivered(&self) -> Delivered {
        self.producer
            .context()
            .delivered
            .lock()
            .map(|mut d| std::mem::take(&mut *d))
            .unwrap_or_default()
    }
}

/// Repeats a call while it fails with a retriable error, up to `budget`.
fn retry(budget: Duration, mut call: impl FnMut() -> KafkaResult<()>) -> KafkaResult<()> {
    let deadline = Instant::now() + budget;
    loop {
        match call() {
            Err(e) if classify(&e) == ErrorClass::Retriable && Instant::now() < deadline => {
                tracing::debug!(error = %e, "retriable Kafka error, retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}
