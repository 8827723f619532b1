//! What a stream thread does with its open transaction: commit it in three phases, abort it and
//! rewind, poison it, or give it up on a revoke. This is the one file that answers "what happens
//! when a commit fails"; `protocol/tests.rs` proves each answer with fakes.
//!
//! A commit, as Kafka Streams names its phases:
//! 1. **prepare**: the group member must be the one the tasks were assigned under; tasks write
//!    what they held back; each consumed partition's next offset is gathered (or, for writes
//!    without a consumed record, one owned partition's offset again, to fence a zombie);
//! 2. **commit**: the offsets join the transaction and it ends (`TxnProducer::commit`);
//! 3. **post-commit**: the stores apply their overlays with the changelog offsets delivered,
//!    and the rewind points move to the next transaction.
//!
//! A failed step is handed to [`recovery`]: either abort and rewind (nothing of the transaction
//! can have committed), or end the generation with the transaction poisoned, so that nothing,
//! the closing consumer's revoke callback included, commits it afterwards.

use super::state::{Partition, Phase, Txn};
use crate::engine::emit::ProcessError;
use crate::engine::errors::{recovery, EngineError, Recovery, TxnStep};
use rdkafka::error::{KafkaError, KafkaResult};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Highest delivered offset per changelog partition written in the transaction.
pub type Delivered = HashMap<Partition, i64>;

/// Why the commit step failed.
#[derive(Debug)]
pub enum CommitFailure {
    /// A Kafka call failed, at this step of the transaction.
    Kafka(KafkaError, TxnStep),
    /// The consumer has no group metadata: it is not a member of the group any more.
    NotInGroup,
}

/// The Kafka side of a transaction: the thread's transactional producer and group consumer.
pub trait Clients {
    /// What tasks write their records through.
    type Producer;
    /// The producer, for the tasks' writes.
    fn producer(&mut self) -> &mut Self::Producer;
    /// The consumer's group member id now.
    fn member_id(&self) -> String;
    /// True while the producer has a transaction open.
    fn in_transaction(&self) -> bool;
    /// Adds `offsets` to the open transaction (opening one if none is) with the consumer's group
    /// metadata, and commits it; returns what was delivered.
    fn commit(&mut self, offsets: &[(Partition, i64)]) -> Result<Delivered, CommitFailure>;
    /// Aborts the open transaction, if any.
    fn abort(&mut self) -> KafkaResult<()>;
    /// The group's committed offsets of `partitions`, where it has one.
    fn committed_offsets(&self, partitions: &[Partition]) -> KafkaResult<HashMap<Partition, i64>>;
    /// Makes the consumer read `partition` from `offset`.
    fn seek(&self, partition: &Partition, offset: i64) -> KafkaResult<()>;
}

/// The thread's tasks, as a transaction sees them.
pub trait Tasks<P> {
    /// Prepare: writes what the tasks held back during the transaction.
    fn flush(&mut self, producer: &mut P) -> Result<(), ProcessError>;
    /// Each partition the transaction consumed from, with the offset to commit for it.
    fn offsets(&self) -> Vec<(Partition, i64)>;
    /// The partitions whose tasks this thread runs.
    fn owned(&self) -> Vec<Partition>;
    /// Post-commit: makes the stores durable with the changelog offsets `delivered`.
    fn committed(&mut self, delivered: &Delivered) -> Result<(), EngineError>;
    /// After an abort: forgets the transaction's writes, positions and counts.
    fn aborted(&mut self);
}

/// What a call left behind, for the thread's metrics and bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing was open, or nothing was done.
    Nothing,
    /// The transaction committed; the commit step took this long.
    Committed(Duration),
    /// The transaction was aborted and its partitions rewound.
    Aborted,
}

/// The transaction a stream thread has open, with the clients and tasks it acts on.
pub struct Transaction<'a, C: Clients, T: Tasks<C::Producer>> {
    /// The transaction's state.
    pub txn: &'a mut Txn,
    /// The member id the tasks were assigned under.
    pub member: &'a str,
    /// The Kafka clients.
    pub clients: &'a mut C,
    /// The tasks.
    pub tasks: &'a mut T,
}

impl<C: Clients, T: Tasks<C::Producer>> Transaction<'_, C, T> {
    /// Commits the open transaction in its three phases. A step that fails is recovered as
    /// [`recovery`] decides; an error returned has poisoned the transaction.
    pub fn commit(&mut self) -> Result<Outcome, EngineError> {
        let done = self.try_commit();
        self.poison_on_error(done)
    }

    fn try_commit(&mut self) -> Result<Outcome, EngineError> {
        match self.txn.phase() {
            Phase::Poisoned => {
                return Err(EngineError::Internal(anyhow::anyhow!(
                    "refusing to commit a transaction an earlier error left in an unknown state"
                )))
            }
            Phase::Idle if !self.clients.in_transaction() => return Ok(Outcome::Nothing),
            Phase::Idle | Phase::Open { .. } => {}
        }
        // Prepare. A rejoin under a new member id that librdkafka has not reported yet (its
        // assign callback comes with a later poll) would commit positions the group may have
        // moved on from, under a generation that is valid (see member_id.rs).
        let member = self.clients.member_id();
        if member != self.member {
            return Err(EngineError::migrated(format!(
                "the group member id changed from `{}` to `{member}` under the open transaction",
                self.member
            )));
        }
        if let Err(e) = self.tasks.flush(self.clients.producer()) {
            return self.failed(e);
        }
        let mut offsets = self.tasks.offsets();
        if offsets.is_empty() {
            // Writes without a consumed record (a reconciler scan's alerts and open-event
            // updates, dedup expiry) carry no offsets, so no group generation either: a zombie,
            // frozen past its session timeout while its tasks moved on, would commit them over
            // the new owner's state (a chaos run caught 85 closed events reopened this way).
            // Committing again where one owned partition stands puts the generation check
            // (KIP-447) into this transaction too; with nothing to fence with, the writes are
            // dropped and the next tick makes them again.
            match self.fencing_offset() {
                Some(fence) => offsets.push(fence),
                None => {
                    tracing::debug!("no owned partition's position known: dropping writes that could not be fenced");
                    return self.abort_and_rewind();
                }
            }
        }
        // Commit.
        let started = Instant::now();
        let delivered = match self.clients.commit(&offsets) {
            Ok(delivered) => delivered,
            Err(CommitFailure::Kafka(e, step)) => return self.recover(e, step),
            Err(CommitFailure::NotInGroup) => {
                return Err(EngineError::migrated("no consumer group metadata (not a group member)"))
            }
        };
        let took = started.elapsed();
        // Post-commit.
        self.txn.committed();
        self.tasks.committed(&delivered)?;
        Ok(Outcome::Committed(took))
    }

    /// A task could not write: a failed produce aborts and rewinds when Kafka says that is
    /// enough; anything else ends the generation (poisoned).
    pub fn failed(&mut self, e: ProcessError) -> Result<Outcome, EngineError> {
        let done = match e {
            ProcessError::Engine(e) => Err(e),
            ProcessError::Kafka(e) => self.recover(e, TxnStep::Produce),
        };
        self.poison_on_error(done)
    }

    /// Acts on a failed transactional step as [`recovery`] decides.
    fn recover(&mut self, e: KafkaError, step: TxnStep) -> Result<Outcome, EngineError> {
        let shown = e.to_string();
        match recovery(e, step) {
            Recovery::AbortAndRewind => {
                tracing::warn!(error = %shown, ?step, "aborting the transaction and rewinding");
                self.abort_and_rewind()
            }
            Recovery::Restart(e) => Err(e),
        }
    }

    /// Aborts the transaction, drops uncommitted store writes and rewinds every partition the
    /// transaction consumed from to its first record in it, so the aborted records are
    /// processed again. An error returned has poisoned the transaction.
    pub fn abort_and_rewind(&mut self) -> Result<Outcome, EngineError> {
        let done = self.try_abort_and_rewind();
        self.poison_on_error(done)
    }

    fn try_abort_and_rewind(&mut self) -> Result<Outcome, EngineError> {
        self.clients
            .abort()
            .map_err(|e| EngineError::from_kafka(e, "aborting the transaction"))?;
        self.tasks.aborted();
        let rewind = self.txn.aborted();
        self.earlier_commits_stand()?;
        for (partition, offset) in rewind {
            self.clients
                .seek(&partition, offset)
                .map_err(|e| EngineError::from_kafka(e, "rewinding after an abort"))?;
        }
        Ok(Outcome::Aborted)
    }

    /// Partitions are revoked: their work is committed before they go, unless they were lost
    /// (the member was dropped from the group), when their new owner may already process them
    /// and nothing may commit for them, as Kafka Streams closes such tasks dirty. An error
    /// returned has poisoned the transaction.
    pub fn revoke(&mut self, lost: bool) -> Result<Outcome, EngineError> {
        if lost {
            tracing::warn!("partitions lost (the group moved on without this member); aborting the open transaction");
            return self.poison_on_error(Err(EngineError::migrated("partitions lost")));
        }
        if !self.txn.may_commit() {
            return Ok(Outcome::Nothing);
        }
        self.commit()
    }

    /// The generation ends on `cause` with the transaction in an unknown state: abort it as
    /// far as Kafka lets us, drop every uncommitted store write, and never commit again.
    pub fn poison(&mut self, cause: &EngineError) {
        if self.txn.may_commit() {
            tracing::warn!(error = %cause, "aborting the open transaction: the stream thread restarts its clients and tasks");
        }
        self.txn.poison();
        if let Err(e) = self.clients.abort() {
            tracing::warn!(error = %e, "abort failed; the next producer with this transactional id aborts the transaction");
        }
        self.tasks.aborted();
    }

    fn poison_on_error(&mut self, done: Result<Outcome, EngineError>) -> Result<Outcome, EngineError> {
        if let Err(e) = &done {
            self.poison(e);
        }
        done
    }

    /// An owned partition and the offset the group has for it, to commit again: a position this
    /// thread reached, else the group's committed offset.
    fn fencing_offset(&self) -> Option<(Partition, i64)> {
        let owned = self.tasks.owned();
        if let Some(fence) = owned
            .iter()
            .find_map(|p| self.txn.position(p).map(|next| (p.clone(), next)))
        {
            return Some(fence);
        }
        let committed = self.clients.committed_offsets(&owned).ok()?;
        owned.into_iter().find_map(|p| {
            committed
                .get(&p)
                .copied()
                .filter(|next| *next >= 0)
                .map(|next| (p, next))
        })
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
    fn earlier_commits_stand(&self) -> Result<(), EngineError> {
        let expected: Vec<(Partition, i64)> = self.txn.all_handed_on().map(|(p, o)| (p.clone(), o)).collect();
        if expected.is_empty() {
            return Ok(());
        }
        let undone = |why: String| {
            Err(EngineError::migrated(format!(
                "after an abort, {why}; reviving the tasks from what Kafka committed (docs/chaos-runs.md, cause 8)"
            )))
        };
        let asked: Vec<Partition> = expected.iter().map(|(p, _)| p.clone()).collect();
        let found = match self.clients.committed_offsets(&asked) {
            Ok(found) => found,
            Err(e) => return undone(format!("the group's committed offsets could not be read ({e})")),
        };
        for ((topic, partition), handed_on) in expected {
            let group = found.get(&(topic.clone(), partition)).copied();
            if group.is_none_or(|g| g < handed_on) {
                return undone(format!(
                    "the group has `{topic}[{partition}]` at {group:?} where this thread's last commit handed on {handed_on}: that commit was undone"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
