//! Closes a transaction that the broker left open on a changelog partition when it is this
//! thread's own: a no-op record committed to the partition.
//!
//! Kafka's transaction coordinator, loading after an unclean restart before the partitions
//! have leaders again, completes a commit (or abort) without the markers of those partitions
//! (docs/chaos-runs.md, cause 6). Such a transaction stays open on the partition until the same
//! producer id's next transaction there writes a marker: that marker closes the old records
//! too, with its own outcome. A restarted instance gets its producer id back (same
//! transactional id) and, with static membership, its tasks, so the restore, which will not
//! read around an open transaction (`stable_end`), would wait for a transaction only this
//! thread's next commit on the partition can close.
//!
//! Committing is the outcome the rest of that transaction gets anyway: its partitions that
//! lost markers too (outputs, `__consumer_offsets`) are closed by this producer's next commits
//! there. The no-op is a tombstone keyed [`NO_OP_KEY`], which no store applies. It carries no
//! consumed offsets, so a zombie thread can write it too, harmlessly. Another producer's open
//! transaction is left alone; the restore goes on waiting for it.

use super::producer::{Outgoing, TxnProducer};
use crate::store::NO_OP_KEY;
use anyhow::{anyhow, Result};
use rdkafka::message::OwnedHeaders;

/// Commits a no-op to `topic`/`partition` in a transaction of its own. A commit that fails is
/// aborted and logged: the caller goes on waiting. Fails only when the abort fails too, which
/// leaves the producer unusable.
pub fn commit_no_op(producer: &mut TxnProducer, topic: &str, partition: i32) -> Result<()> {
    if producer.in_transaction() {
        // Committing now would also commit records of the open transaction without their
        // consumed offsets; the thread commits before it restores, so this is not expected.
        tracing::warn!(
            topic,
            partition,
            "a transaction is open on this thread; no no-op committed"
        );
        return Ok(());
    }
    let record = Outgoing {
        topic,
        partition: Some(partition),
        key: Some(NO_OP_KEY),
        payload: None,
        headers: OwnedHeaders::new(),
    };
    let committed = producer
        .send(record)
        .map_err(|e| (e, super::errors::TxnStep::Produce))
        .and_then(|()| producer.commit_writes());
    match committed {
        Ok(_) => {
            tracing::info!(
                topic,
                partition,
                "committed a no-op to the partition, which closes a transaction of this thread's producer id left open there"
            );
            Ok(())
        }
        Err((e, step)) => {
            tracing::warn!(error = %e, ?step, topic, partition, "could not commit a no-op to the partition; aborting it");
            producer
                .abort()
                .map_err(|abort| anyhow!("aborting a failed no-op commit on `{topic}` partition {partition}: {abort}"))
        }
    }
}
