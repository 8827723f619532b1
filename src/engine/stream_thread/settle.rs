//! Closes a transaction of this thread's own producer id that a broker left open on one of a
//! task's changelog partitions by losing its markers (cause 6 of docs/chaos-runs.md).
//!
//! Kafka resolves such a transaction only at the producer id's next transaction that touches
//! the partition: its outcome applies to the old records too. The transaction's offsets on
//! `__consumer_offsets` are resolved that way at the producer's next commit, so they count as
//! committed; the changelog has to follow, or the store restores without records whose input
//! will not be read again. A restarted instance gets its producer id back (same transactional
//! id) and, with static membership, its tasks: it would wait for itself, as the restore will
//! not read around an open transaction. So before restoring, a task whose changelog partition
//! still has a transaction open after a few seconds gets a tombstone of a key no store uses,
//! committed with the task's committed offset (which fences a zombie). If the open transaction
//! is this producer id's, that commit closes it; if it is another's, nothing changes and the
//! restore waits for that one.

use super::commit::FENCE_LOOKUP;
use super::{StreamContext, ThreadState};
use crate::engine::errors::{EngineError, TxnStep};
use crate::engine::layout::TaskLayout;
use crate::engine::producer::Outgoing;
use crate::engine::stable_end;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedHeaders;
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// How long an open transaction may take to finish on its own (markers in flight) first.
const SETTLE_AFTER: Duration = Duration::from_secs(5);
/// The key of the tombstone: not UTF-8 (no UTF-8 text holds the byte 0xFF), and every store
/// key is text rendered from a record, so no store has it.
const SETTLE_KEY: &[u8] = b"\xfftally.settle";

impl ThreadState {
    /// See the module: commits a no-op to each of the task's changelog partitions that still
    /// has a transaction open after [`SETTLE_AFTER`]. Failures are logged, not fatal: the
    /// restore that follows waits for the transaction either way.
    pub(super) fn settle_changelogs(&mut self, consumer: &BaseConsumer<StreamContext>, topic: &str, partition: i32) {
        let Some(layout) = TaskLayout::of(&self.cfg.topology, topic, partition) else {
            return;
        };
        for changelog in &layout.changelogs {
            let config = &self.restore.config;
            let started = Instant::now();
            let open = loop {
                match stable_end::transaction_open(config, changelog, partition) {
                    Ok(true) if started.elapsed() < SETTLE_AFTER => {
                        self.cfg.health.beat(self.cfg.index);
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Ok(open) => break open,
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), changelog, partition, "cannot tell whether a transaction is open");
                        break false;
                    }
                }
            };
            if open {
                match self.commit_settle_record(consumer, topic, partition, changelog) {
                    Ok(()) => tracing::warn!(
                        changelog,
                        partition,
                        "a transaction stayed open on the changelog; committed a no-op to it, which closes it if it is this producer's"
                    ),
                    Err(e) => tracing::warn!(error = %e, changelog, partition, "could not commit a no-op to a changelog with a transaction open"),
                }
            }
        }
    }

    fn commit_settle_record(
        &mut self,
        consumer: &BaseConsumer<StreamContext>,
        topic: &str,
        partition: i32,
        changelog: &str,
    ) -> Result<(), EngineError> {
        let mut owned = TopicPartitionList::new();
        owned.add_partition(topic, partition);
        let committed = consumer
            .committed_offsets(owned, FENCE_LOOKUP)
            .map_err(|e| EngineError::from_kafka(e, "reading the task's committed offset"))?;
        let Some(next) = committed.elements().iter().find_map(|e| match e.offset() {
            Offset::Offset(next) if next >= 0 => Some(next),
            _ => None,
        }) else {
            // Nothing committed yet: nothing to fence with, and no committed work to lose.
            return Ok(());
        };
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset(topic, partition, Offset::Offset(next))
            .map_err(|e| EngineError::from_kafka(e, "building the fencing offset"))?;
        let group = consumer
            .group_metadata()
            .ok_or_else(|| EngineError::TaskMigrated("no consumer group metadata (not a group member)".into()))?;
        let record = Outgoing {
            topic: changelog,
            partition: Some(partition),
            key: Some(SETTLE_KEY),
            payload: None,
            headers: OwnedHeaders::new(),
        };
        let sent = self.producer.send(record);
        let committed = sent
            .map_err(|e| (e, TxnStep::Produce))
            .and_then(|()| self.producer.commit(&offsets, &group));
        if let Err((e, _)) = committed {
            let _ = self.producer.abort();
            return Err(EngineError::from_kafka(e, "committing a no-op to the changelog"));
        }
        Ok(())
    }
}
