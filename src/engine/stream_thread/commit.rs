//! The stream thread's side of its transaction: the real clients and tasks the protocol
//! (`engine/txn/protocol.rs`) acts on, when a commit is due, and the metrics of each outcome.

use super::{StreamContext, ThreadState, KAFKA_TIMEOUT, MAX_RECORDS_PER_TRANSACTION, POLL};
use crate::engine::emit::{Counts, ProcessError};
use crate::engine::errors::{EngineError, TxnStep};
use crate::engine::member_id;
use crate::engine::producer::TxnProducer;
use crate::engine::purge::Purger;
use crate::engine::task::Task;
use crate::engine::txn::protocol::Transaction;
use crate::engine::txn::{Clients, CommitFailure, Delivered, Outcome, Partition, Tasks};
use crate::metrics::events::PipelineCommitted;
use crate::metrics::Metrics;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a look-up of the group's committed offsets may wait.
const OFFSET_LOOKUP: Duration = Duration::from_secs(10);

/// The thread's transactional producer and group consumer.
struct Kafka<'a> {
    producer: &'a mut TxnProducer,
    consumer: &'a BaseConsumer<StreamContext>,
}

impl Clients for Kafka<'_> {
    type Producer = TxnProducer;

    fn producer(&mut self) -> &mut TxnProducer {
        self.producer
    }

    fn member_id(&self) -> String {
        member_id::of(self.consumer)
    }

    fn in_transaction(&self) -> bool {
        self.producer.in_transaction()
    }

    fn commit(&mut self, offsets: &[(Partition, i64)]) -> Result<Delivered, CommitFailure> {
        let mut list = TopicPartitionList::new();
        for ((topic, partition), next) in offsets {
            list.add_partition_offset(topic, *partition, Offset::Offset(*next))
                .map_err(|e| CommitFailure::Kafka(e, TxnStep::SendOffsets))?;
        }
        let group = self.consumer.group_metadata().ok_or(CommitFailure::NotInGroup)?;
        self.producer
            .commit(&list, &group)
            .map_err(|(e, step)| CommitFailure::Kafka(e, step))
    }

    fn abort(&mut self) -> KafkaResult<()> {
        self.producer.abort()
    }

    fn committed_offsets(&self, partitions: &[Partition]) -> KafkaResult<HashMap<Partition, i64>> {
        let mut asked = TopicPartitionList::new();
        for (topic, partition) in partitions {
            asked.add_partition(topic, *partition);
        }
        let found = self.consumer.committed_offsets(asked, OFFSET_LOOKUP)?;
        Ok(found
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                _ => None,
            })
            .collect())
    }

    fn seek(&self, (topic, partition): &Partition, offset: i64) -> KafkaResult<()> {
        self.consumer
            .seek(topic, *partition, Offset::Offset(offset), KAFKA_TIMEOUT)
    }
}

/// The thread's tasks, with what a commit updates besides them.
struct ThreadTasks<'a> {
    tasks: &'a mut FxHashMap<(String, i32), Box<dyn Task>>,
    metrics: &'a Metrics,
    purger: &'a mut Purger,
}

impl Tasks<TxnProducer> for ThreadTasks<'_> {
    fn flush(&mut self, producer: &mut TxnProducer) -> Result<(), ProcessError> {
        self.tasks.values_mut().try_for_each(|t| t.flush(producer))
    }

    fn offsets(&self) -> Vec<(Partition, i64)> {
        self.tasks
            .iter()
            .filter_map(|(p, task)| task.next_offset().map(|next| (p.clone(), next)))
            .collect()
    }

    fn owned(&self) -> Vec<Partition> {
        self.tasks.keys().cloned().collect()
    }

    fn committed(&mut self, delivered: &Delivered) -> Result<(), EngineError> {
        for ((topic, partition), task) in self.tasks.iter_mut() {
            if let (true, Some(next)) = (task.reads_repartition_topic(), task.next_offset()) {
                self.purger.committed(topic, *partition, next);
            }
            let counts = task.committed(delivered)?;
            publish(self.metrics, task.as_ref(), &counts);
        }
        Ok(())
    }

    fn aborted(&mut self) {
        self.tasks.values_mut().for_each(|t| t.aborted());
    }
}

impl ThreadState {
    /// Runs `step` on the open transaction with the thread's clients and tasks.
    fn transaction<R>(
        &mut self,
        consumer: &BaseConsumer<StreamContext>,
        step: impl FnOnce(&mut Transaction<'_, Kafka<'_>, ThreadTasks<'_>>) -> R,
    ) -> R {
        let mut clients = Kafka {
            producer: &mut self.producer,
            consumer,
        };
        let mut tasks = ThreadTasks {
            tasks: &mut self.tasks,
            metrics: &self.cfg.metrics,
            purger: &mut self.purger,
        };
        step(&mut Transaction {
            txn: &mut self.txn,
            member: &self.member,
            clients: &mut clients,
            tasks: &mut tasks,
        })
    }

    /// Counts what a step of the transaction left behind.
    fn count(&mut self, done: Result<Outcome, EngineError>) -> Result<(), EngineError> {
        let m = &self.cfg.metrics;
        match done? {
            Outcome::Nothing => {}
            Outcome::Committed(took) => {
                self.unproducible.clear();
                m.commit_latency.observe(took.as_secs_f64());
                m.transactions_committed.inc();
                self.purger.maybe_purge();
            }
            Outcome::Aborted => m.transactions_aborted.inc(),
        }
        Ok(())
    }

    /// Commits the open transaction (see the protocol's `commit`).
    pub(super) fn commit(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<(), EngineError> {
        let done = self.transaction(consumer, |t| t.commit());
        self.count(done)
    }

    /// A task could not write: abort and rewind, or end the generation.
    pub(super) fn process_failed(
        &mut self,
        consumer: &BaseConsumer<StreamContext>,
        e: ProcessError,
    ) -> Result<(), EngineError> {
        let done = self.transaction(consumer, |t| t.failed(e));
        self.count(done)
    }

    /// Aborts the transaction and rewinds its partitions.
    pub(super) fn abort_and_rewind(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<(), EngineError> {
        let done = self.transaction(consumer, |t| t.abort_and_rewind());
        self.count(done)
    }

    /// Partitions are being revoked: commit first, or give the transaction up when `lost`.
    pub(super) fn revoke(&mut self, consumer: &BaseConsumer<StreamContext>, lost: bool) -> Result<(), EngineError> {
        let done = self.transaction(consumer, |t| t.revoke(lost));
        self.count(done)
    }

    /// The generation ends on `cause`: the transaction is poisoned (see the protocol's `poison`).
    pub(super) fn poison(&mut self, consumer: &BaseConsumer<StreamContext>, cause: &EngineError) {
        self.transaction(consumer, |t| t.poison(cause));
    }

    /// True when the open transaction should commit: its due point passed (every commit
    /// interval while input keeps coming, see `Txn`), or it is large.
    ///
    /// Not sooner, as Kafka Streams does not: committing whenever the consumer's queue ran dry
    /// made transactions back to back, and each then waited for the coordinator to finish the
    /// one before (AddPartitionsToTxn answered CONCURRENT_TRANSACTIONS and retried after 20 ms;
    /// librdkafka has no KIP-890): 25-50 ms per commit instead of ~10, twice the transactions,
    /// and no better latency (bench A/B at 17,000 records/s in the #7 notes).
    pub(super) fn commit_due(&self, now: Instant) -> bool {
        self.txn.due(now, MAX_RECORDS_PER_TRANSACTION)
    }

    /// How long the next poll may wait for the transaction's sake: until the open transaction
    /// is due, so a quiet input does not hold a record past its commit interval.
    pub(super) fn txn_wait(&self, now: Instant) -> Duration {
        self.txn.poll_wait(now, POLL)
    }
}

fn publish(m: &Metrics, task: &dyn Task, c: &Counts) {
    m.emit(PipelineCommitted {
        pipeline: task.label(),
        records_in: c.records_in,
        repartitioned: c.repartitioned,
        records_out: c.records_out,
        duplicates: c.duplicates,
        stale: c.stale,
        pending_created: c.pending_created,
        expired_keys: c.expired,
        misplaced: c.misplaced,
        dead_lettered: &c.dead_lettered,
    });
}
