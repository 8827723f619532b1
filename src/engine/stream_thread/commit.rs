//! The stream thread's transaction: when it commits, the commit in its steps, the abort that
//! rewinds, and the poison that ends a generation.

use super::{StreamContext, ThreadState, KAFKA_TIMEOUT, MAX_RECORDS_PER_TRANSACTION, POLL};
use crate::engine::emit::{Counts, ProcessError};
use crate::engine::errors::{recovery, EngineError, Recovery, TxnStep};
use crate::engine::member_id;
use crate::engine::task::Task;
use crate::engine::txn::Phase;
use crate::metrics::Metrics;
use anyhow::anyhow;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// How long a commit of writes alone may wait for the group's committed offsets.
const FENCE_LOOKUP: Duration = Duration::from_secs(10);

impl ThreadState {
    /// A task could not write: a failed produce aborts the transaction and rewinds when Kafka
    /// says that is enough; anything else ends the generation.
    pub(super) fn process_failed(
        &mut self,
        consumer: &BaseConsumer<StreamContext>,
        e: ProcessError,
    ) -> Result<(), EngineError> {
        match e {
            ProcessError::Engine(e) => Err(e),
            ProcessError::Kafka(e) => self.recover(consumer, e, TxnStep::Produce),
        }
    }

    /// Acts on a failed transactional step as [`recovery`] decides.
    pub(super) fn recover(
        &mut self,
        consumer: &BaseConsumer<StreamContext>,
        e: KafkaError,
        step: TxnStep,
    ) -> Result<(), EngineError> {
        let shown = e.to_string();
        match recovery(e, step) {
            Recovery::AbortAndRewind => {
                tracing::warn!(error = %shown, ?step, "aborting the transaction and rewinding");
                self.abort_and_rewind(consumer)
            }
            Recovery::Restart(e) => Err(e),
        }
    }

    /// True when the open transaction should commit: its first record has waited the commit
    /// interval, or it is large.
    ///
    /// Not sooner, as Kafka Streams does not: committing whenever the consumer's queue ran dry
    /// made transactions back to back, and each then waited for the coordinator to finish the
    /// one before (AddPartitionsToTxn answered CONCURRENT_TRANSACTIONS and retried after 20 ms;
    /// librdkafka has no KIP-890): 25-50 ms per commit instead of ~10, twice the transactions,
    /// and no better latency (bench A/B at 17,000 records/s in the #7 notes).
    pub(super) fn commit_due(&self, now: Instant) -> bool {
        self.txn.due(
            now,
            self.cfg.topology.processing.commit_interval,
            MAX_RECORDS_PER_TRANSACTION,
        )
    }

    /// How long the next poll may wait for the transaction's sake: until the open transaction
    /// is due, so a quiet input does not hold a record past its commit interval.
    pub(super) fn txn_wait(&self, now: Instant) -> Duration {
        self.txn
            .poll_wait(now, self.cfg.topology.processing.commit_interval, POLL)
    }

    /// Commits the open transaction with every task's consumed offsets, then applies the
    /// stores' overlays. An abortable failure aborts and rewinds instead.
    pub(super) fn commit(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<(), EngineError> {
        match self.txn.phase() {
            Phase::Poisoned => {
                return Err(EngineError::Fatal(anyhow!(
                    "refusing to commit a transaction an earlier error left in an unknown state"
                )))
            }
            Phase::Idle if !self.producer.in_transaction() => return Ok(()),
            Phase::Idle | Phase::Open { .. } => {}
        }
        // A rejoin under a new member id that librdkafka has not reported yet (its assign
        // callback comes with a later poll) would commit positions the group may have moved on
        // from, under a generation that is valid (see member_id.rs).
        let member = member_id::of(consumer);
        if member != self.member {
            return Err(EngineError::TaskMigrated(format!(
                "the group member id changed from `{}` to `{member}` under the open transaction",
                self.member
            )));
        }
        let flushed = self.tasks.values_mut().try_for_each(|t| t.flush(&mut self.producer));
        if let Err(e) = flushed {
            return self.process_failed(consumer, e);
        }
        let mut offsets = TopicPartitionList::new();
        for ((topic, partition), task) in &self.tasks {
            if let Some(next) = task.next_offset() {
                offsets
                    .add_partition_offset(topic, *partition, Offset::Offset(next))
                    .map_err(|e| EngineError::Fatal(anyhow!(e)))?;
            }
        }
        if offsets.count() == 0 {
            // Writes without a consumed record (a reconciler scan's alerts and open-event
            // updates, dedup expiry) carry no offsets, so no group generation either: a zombie,
            // frozen past its session timeout while its tasks moved on, would commit them over
            // the new owner's state (a chaos run caught 85 closed events reopened this way).
            // Committing again where one owned partition stands puts the generation check
            // (KIP-447) into this transaction too; with nothing to fence with, the writes are
            // dropped and the next tick makes them again.
            match self.fencing_offset(consumer) {
                Some((topic, partition, next)) => offsets
                    .add_partition_offset(&topic, partition, Offset::Offset(next))
                    .map_err(|e| EngineError::Fatal(anyhow!(e)))?,
                None => {
                    tracing::debug!("no owned partition's position known: dropping writes that could not be fenced");
                    return self.abort_and_rewind(consumer);
                }
            }
        }
        let group = consumer
            .group_metadata()
            .ok_or_else(|| EngineError::TaskMigrated("no consumer group metadata (not a group member)".into()))?;
        let started = Instant::now();
        let delivered = match self.producer.commit(&offsets, &group) {
            Ok(d) => d,
            Err((e, step)) => return self.recover(consumer, e, step),
        };
        self.txn.committed();
        self.unproducible.clear();
        let m = &self.cfg.metrics;
        m.commit_latency.observe(started.elapsed().as_secs_f64());
        m.transactions_committed.inc();
        for ((topic, partition), task) in self.tasks.iter_mut() {
            if let (true, Some(next)) = (task.reads_repartition_topic(), task.next_offset()) {
                self.purger.committed(topic, *partition, next);
            }
            let counts = task.committed(&delivered)?;
            publish(m, task.as_ref(), &counts);
        }
        self.purger.maybe_purge();
        Ok(())
    }

    /// An owned partition and the offset the group has for it, to commit again: a position this
    /// thread reached (what its last commit handed on), else the group's committed offset.
    fn fencing_offset(&self, consumer: &BaseConsumer<StreamContext>) -> Option<(String, i32, i64)> {
        if let Some(((topic, partition), next)) = self
            .tasks
            .keys()
            .find_map(|k| self.txn.position(k).map(|next| (k.clone(), next)))
        {
            return Some((topic, partition, next));
        }
        let mut owned = TopicPartitionList::new();
        for (topic, partition) in self.tasks.keys() {
            owned.add_partition(topic, *partition);
        }
        let committed = consumer.committed_offsets(owned, FENCE_LOOKUP).ok()?;
        committed.elements().iter().find_map(|e| match e.offset() {
            Offset::Offset(next) if next >= 0 => Some((e.topic().to_string(), e.partition(), next)),
            _ => None,
        })
    }

    /// Aborts the transaction, drops uncommitted store writes and rewinds every partition the
    /// transaction consumed from to its first record in it, so the aborted records are
    /// processed again.
    pub(super) fn abort_and_rewind(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<(), EngineError> {
        self.producer
            .abort()
            .map_err(|e| EngineError::from_kafka(e, "aborting the transaction"))?;
        self.cfg.metrics.transactions_aborted.inc();
        self.tasks.values_mut().for_each(|t| t.aborted());
        let rewind = self.txn.aborted();
        self.earlier_commits_stand(consumer)?;
        for ((topic, partition), offset) in rewind {
            consumer
                .seek(&topic, partition, Offset::Offset(offset), KAFKA_TIMEOUT)
                .map_err(|e| EngineError::from_kafka(e, "rewinding after an abort"))?;
        }
        Ok(())
    }

    /// After an abort, checks that the group still has what this thread's last commits handed
    /// on, for every partition it owns; if not, the generation ends and the tasks come back
    /// from what Kafka holds (positions from the group, stores checked against their changelogs).
    ///
    /// An earlier commit can be undone after librdkafka reported it: when the broker lost its
    /// markers, Kafka settles its records with the producer id's next marker on each partition,
    /// and this abort is that marker (docs/chaos-runs.md, cause 8); on `__consumer_offsets` it
    /// undoes the offsets of every partition that commit carried, not only the ones this
    /// transaction read. Rewinding in place would then skip the undone commit's input for good.
    fn earlier_commits_stand(&self, consumer: &BaseConsumer<StreamContext>) -> Result<(), EngineError> {
        let mut asked = TopicPartitionList::new();
        let mut expected = Vec::new();
        for (partition, handed_on) in self.txn.all_handed_on() {
            asked.add_partition(&partition.0, partition.1);
            expected.push((partition, handed_on));
        }
        if expected.is_empty() {
            return Ok(());
        }
        let undone = |why: String| {
            Err(EngineError::TaskMigrated(format!(
                "after an abort, {why}; reviving the tasks from what Kafka committed (docs/chaos-runs.md, cause 8)"
            )))
        };
        let found = match consumer.committed_offsets(asked, FENCE_LOOKUP) {
            Ok(found) => found,
            Err(e) => return undone(format!("the group's committed offsets could not be read ({e})")),
        };
        for ((topic, partition), handed_on) in expected {
            let group = found.find_partition(topic, *partition).and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            });
            if group.is_none_or(|g| g < handed_on) {
                return undone(format!(
                    "the group has `{topic}[{partition}]` at {group:?} where this thread's last commit handed on {handed_on}: that commit was undone"
                ));
            }
        }
        Ok(())
    }

    /// The generation ends on `cause` with the transaction in an unknown state: abort it as
    /// far as Kafka lets us, drop every uncommitted store write, and never commit again.
    pub(super) fn poison(&mut self, cause: &EngineError) {
        if self.txn.may_commit() {
            tracing::warn!(error = %cause, "aborting the open transaction: the stream thread restarts its clients and tasks");
        }
        self.txn.poison();
        if let Err(e) = self.producer.abort() {
            tracing::warn!(error = %e, "abort failed; the next producer with this transactional id aborts the transaction");
        }
        self.tasks.values_mut().for_each(|t| t.aborted());
    }
}

fn publish(m: &Metrics, task: &dyn Task, c: &Counts) {
    let p = task.label();
    m.records_in.with_label_values(&[p]).inc_by(c.records_in);
    m.records_repartitioned.with_label_values(&[p]).inc_by(c.repartitioned);
    m.records_out.with_label_values(&[p]).inc_by(c.records_out);
    m.duplicates.with_label_values(&[p]).inc_by(c.duplicates);
    m.stale.with_label_values(&[p]).inc_by(c.stale);
    m.pending_created.with_label_values(&[p]).inc_by(c.pending_created);
    m.expired_keys.with_label_values(&[p]).inc_by(c.expired);
    for (reason, n) in &c.dead_lettered {
        m.dead_lettered.with_label_values(&[p, reason.as_str()]).inc_by(*n);
    }
}
