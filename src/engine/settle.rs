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
//! there. The no-op is a tombstone keyed [`NO_OP_KEY`], which no store applies.
//!
//! It is committed in a transaction of its own, with no consumed offsets (a zombie writing it
//! does no harm), by:
//! - a restore that has waited for an open transaction a while ([`commit_no_op`]);
//! - every stream thread, on every changelog partition of the topology, once it has joined the
//!   group and every [`SWEEP_INTERVAL`] after ([`Sweep`]): the task of a partition left open
//!   by this producer id may have moved to another thread or instance, whose restore waits for
//!   this producer's next marker there.
//!
//! Another producer's open transaction is left alone; a restore goes on waiting for it, up to
//! its limit. A producer id that never writes again (an instance removed for good) leaves its
//! transactions for an operator (the restore's error says how).

use super::producer::{Outgoing, TxnProducer};
use crate::store::NO_OP_KEY;
use crate::topology::Topology;
use anyhow::{anyhow, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::message::OwnedHeaders;
use std::time::{Duration, Instant};

/// How often a stream thread writes a no-op to every changelog partition.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(30);
/// How long looking up the changelogs' partition counts may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

fn no_op(topic: &str, partition: i32) -> Outgoing<'_> {
    Outgoing {
        topic,
        partition: Some(partition),
        key: Some(NO_OP_KEY),
        payload: None,
        headers: OwnedHeaders::new(),
    }
}

/// A stream thread's periodic no-ops on every changelog partition.
#[derive(Default)]
pub struct Sweep {
    /// Every changelog partition, once looked up.
    partitions: Option<Vec<(String, i32)>>,
    /// When the last no-ops were committed or tried (none yet: due at once).
    last: Option<Instant>,
}

impl Sweep {
    /// True when the no-ops are due.
    pub fn due(&self, now: Instant) -> bool {
        self.last.is_none_or(|last| now.duration_since(last) >= SWEEP_INTERVAL)
    }

    /// Commits a no-op to every changelog partition of `t`, as [`commit_no_ops`] does. A failed
    /// partition lookup is logged and tried again at the next interval.
    pub fn commit<X: ConsumerContext>(
        &mut self,
        now: Instant,
        consumer: &BaseConsumer<X>,
        t: &Topology,
        producer: &mut TxnProducer,
    ) -> Result<()> {
        self.last = Some(now);
        if self.partitions.is_none() {
            match changelog_partitions(consumer, t) {
                Ok(found) => self.partitions = Some(found),
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "cannot list the changelog partitions; no no-ops this time");
                    return Ok(());
                }
            }
        }
        commit_no_ops(producer, self.partitions.as_deref().unwrap_or_default())
    }
}

/// Every partition of every changelog topic of `t`.
fn changelog_partitions<X: ConsumerContext>(consumer: &BaseConsumer<X>, t: &Topology) -> Result<Vec<(String, i32)>> {
    let mut all = Vec::new();
    for topic in t.changelog_topics() {
        let md = consumer
            .fetch_metadata(Some(&topic), METADATA_TIMEOUT)
            .with_context(|| format!("reading the metadata of changelog `{topic}`"))?;
        let partitions = md.topics().first().map_or(0, |m| m.partitions().len()) as i32;
        all.extend((0..partitions).map(|p| (topic.clone(), p)));
    }
    Ok(all)
}

/// Commits a no-op to `topic`/`partition` in a transaction of its own, as [`commit_no_ops`].
pub fn commit_no_op(producer: &mut TxnProducer, topic: &str, partition: i32) -> Result<()> {
    commit_no_ops(producer, &[(topic.to_string(), partition)])?;
    tracing::info!(
        topic,
        partition,
        "committed a no-op to the partition, which closes a transaction of this thread's producer id left open there"
    );
    Ok(())
}

/// Commits a no-op to each of `partitions` in a transaction of its own, without consumed
/// offsets. A commit that fails is aborted and logged: what it would have closed stays open
/// until the next try. Fails only when the abort fails too, which leaves the producer unusable.
pub fn commit_no_ops(producer: &mut TxnProducer, partitions: &[(String, i32)]) -> Result<()> {
    if partitions.is_empty() {
        return Ok(());
    }
    if producer.in_transaction() {
        // Committing now would also commit the open transaction's records without their
        // consumed offsets; callers commit first, so this is not expected.
        tracing::warn!("a transaction is open on this thread; no no-ops committed");
        return Ok(());
    }
    let committed = partitions
        .iter()
        .try_for_each(|(topic, partition)| producer.send(no_op(topic, *partition)))
        .map_err(|e| (e, super::errors::TxnStep::Produce))
        .and_then(|()| producer.commit_writes());
    match committed {
        Ok(_) => {
            tracing::debug!(
                partitions = partitions.len(),
                "committed no-ops to changelog partitions"
            );
            Ok(())
        }
        Err((e, step)) => {
            tracing::warn!(error = %e, ?step, partitions = partitions.len(), "could not commit no-ops to changelog partitions; aborting");
            producer
                .abort()
                .map_err(|abort| anyhow!("aborting a failed commit of no-ops: {abort}"))
        }
    }
}
