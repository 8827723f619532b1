//! The transaction protocol against fake clients and tasks: each test fails if its transition
//! goes wrong.

use super::*;
use rdkafka::error::RDKafkaErrorCode;
use std::cell::RefCell;
use std::collections::VecDeque;

fn p(n: i32) -> Partition {
    ("in".to_string(), n)
}

fn kafka(code: RDKafkaErrorCode) -> KafkaError {
    KafkaError::MessageProduction(code)
}

/// Clients that answer from scripts and record every call.
#[derive(Default)]
struct FakeClients {
    member: String,
    in_transaction: bool,
    /// Answers of the next commits; a commit with none left succeeds.
    commit_answers: VecDeque<CommitFailure>,
    abort_fails: bool,
    /// The group's committed offsets; `None` makes the lookup fail.
    group: Option<HashMap<Partition, i64>>,
    commits: Vec<Vec<(Partition, i64)>>,
    aborts: usize,
    seeks: RefCell<Vec<(Partition, i64)>>,
    producer: (),
}

impl Clients for FakeClients {
    type Producer = ();
    fn producer(&mut self) -> &mut () {
        &mut self.producer
    }
    fn member_id(&self) -> String {
        self.member.clone()
    }
    fn in_transaction(&self) -> bool {
        self.in_transaction
    }
    fn commit(&mut self, offsets: &[(Partition, i64)]) -> Result<Delivered, CommitFailure> {
        self.commits.push(offsets.to_vec());
        if let Some(failure) = self.commit_answers.pop_front() {
            return Err(failure);
        }
        self.in_transaction = false;
        if let Some(group) = &mut self.group {
            group.extend(offsets.iter().cloned());
        }
        Ok(HashMap::from([(("changelog".to_string(), 0), 7)]))
    }
    fn abort(&mut self) -> KafkaResult<()> {
        self.aborts += 1;
        self.in_transaction = false;
        if self.abort_fails {
            return Err(kafka(RDKafkaErrorCode::OperationTimedOut));
        }
        Ok(())
    }
    fn committed_offsets(&self, partitions: &[Partition]) -> KafkaResult<HashMap<Partition, i64>> {
        let group = self
            .group
            .as_ref()
            .ok_or(kafka(RDKafkaErrorCode::CoordinatorNotAvailable))?;
        Ok(partitions
            .iter()
            .filter_map(|p| group.get(p).map(|o| (p.clone(), *o)))
            .collect())
    }
    fn seek(&self, partition: &Partition, offset: i64) -> KafkaResult<()> {
        self.seeks.borrow_mut().push((partition.clone(), offset));
        Ok(())
    }
}

/// Tasks that remember what the protocol told them.
#[derive(Default)]
struct FakeTasks {
    owned: Vec<Partition>,
    /// Next offset per partition consumed from in the open transaction.
    consumed: HashMap<Partition, i64>,
    flush_fails: Option<RDKafkaErrorCode>,
    flushes: usize,
    applied: Vec<Delivered>,
    aborts: usize,
}

impl Tasks<()> for FakeTasks {
    fn flush(&mut self, _producer: &mut ()) -> Result<(), ProcessError> {
        self.flushes += 1;
        match self.flush_fails.take() {
            Some(code) => Err(ProcessError::Kafka(kafka(code))),
            None => Ok(()),
        }
    }
    fn offsets(&self) -> Vec<(Partition, i64)> {
        let mut offsets: Vec<_> = self.consumed.iter().map(|(p, o)| (p.clone(), *o)).collect();
        offsets.sort();
        offsets
    }
    fn owned(&self) -> Vec<Partition> {
        self.owned.clone()
    }
    fn committed(&mut self, delivered: &Delivered) -> Result<(), EngineError> {
        self.consumed.clear();
        self.applied.push(delivered.clone());
        Ok(())
    }
    fn aborted(&mut self) {
        self.consumed.clear();
        self.aborts += 1;
    }
}

/// A stream thread's transaction with fakes: member `m-1`, owning partitions 0 and 1.
struct Thread {
    txn: Txn,
    clients: FakeClients,
    tasks: FakeTasks,
}

impl Thread {
    fn new() -> Self {
        Self {
            txn: Txn::new(std::time::Duration::from_millis(100)),
            clients: FakeClients {
                member: "m-1".into(),
                group: Some(HashMap::new()),
                ..FakeClients::default()
            },
            tasks: FakeTasks {
                owned: vec![p(0), p(1)],
                ..FakeTasks::default()
            },
        }
    }

    /// Processes the record at `offset` of `partition` (writing into the transaction).
    fn consume(&mut self, partition: i32, offset: i64) {
        assert!(self.txn.consumed(&p(partition), offset));
        self.tasks.consumed.insert(p(partition), offset + 1);
        self.clients.in_transaction = true;
    }

    fn tx(&mut self) -> Transaction<'_, FakeClients, FakeTasks> {
        Transaction {
            txn: &mut self.txn,
            member: "m-1",
            clients: &mut self.clients,
            tasks: &mut self.tasks,
        }
    }

    fn seeks(&self) -> Vec<(Partition, i64)> {
        self.clients.seeks.borrow().clone()
    }
}

#[test]
fn a_commit_flushes_hands_the_offsets_on_and_then_applies_the_stores() {
    let mut t = Thread::new();
    t.consume(0, 10);
    t.consume(0, 11);
    t.consume(1, 4);
    assert!(matches!(t.tx().commit(), Ok(Outcome::Committed(_))));
    assert_eq!(t.tasks.flushes, 1, "prepare flushes the tasks");
    assert_eq!(t.clients.commits, vec![vec![(p(0), 12), (p(1), 5)]]);
    assert_eq!(t.tasks.applied.len(), 1, "post-commit applies the stores once");
    assert_eq!(t.txn.phase(), Phase::Idle);
    assert_eq!(t.txn.handed_on(&p(0)), Some(12));
    assert!(
        matches!(t.tx().commit(), Ok(Outcome::Nothing)),
        "an idle transaction commits nothing"
    );
    assert_eq!(t.clients.commits.len(), 1);
}

#[test]
fn an_abortable_failure_aborts_and_rewinds_each_partition_to_its_first_record() {
    let mut t = Thread::new();
    t.consume(0, 10);
    t.consume(0, 11);
    t.consume(1, 4);
    t.clients.commit_answers.push_back(CommitFailure::Kafka(
        kafka(RDKafkaErrorCode::RebalanceInProgress),
        TxnStep::SendOffsets,
    ));
    assert!(matches!(t.tx().commit(), Ok(Outcome::Aborted)));
    let mut seeks = t.seeks();
    seeks.sort();
    assert_eq!(seeks, vec![(p(0), 10), (p(1), 4)]);
    assert_eq!((t.clients.aborts, t.tasks.aborts), (1, 1));
    assert!(
        t.tasks.applied.is_empty(),
        "nothing of an aborted transaction is applied"
    );
    assert!(t.txn.may_commit(), "an abort is not a poison: the thread goes on");
    t.consume(0, 10);
    assert!(matches!(t.tx().commit(), Ok(Outcome::Committed(_))));
}

#[test]
fn a_commit_of_unknown_outcome_poisons_and_never_rewinds_or_commits_again() {
    let mut t = Thread::new();
    t.consume(0, 10);
    t.clients.commit_answers.push_back(CommitFailure::Kafka(
        kafka(RDKafkaErrorCode::OperationTimedOut),
        TxnStep::EndTxn,
    ));
    assert!(matches!(t.tx().commit(), Err(EngineError::Transient(_))));
    assert!(t.seeks().is_empty(), "the coordinator may still commit it: no replay");
    assert!(t.tasks.applied.is_empty(), "nor is it taken as committed");
    assert_eq!(t.tasks.aborts, 1, "uncommitted store writes are dropped");
    assert_eq!(t.txn.phase(), Phase::Poisoned);
    let commits = t.clients.commits.len();
    assert!(t.tx().commit().is_err(), "a poisoned transaction never commits");
    assert!(
        matches!(t.tx().revoke(false), Ok(Outcome::Nothing)),
        "nor does the closing consumer's revoke"
    );
    assert_eq!(t.clients.commits.len(), commits);
}

#[test]
fn a_fenced_producer_or_a_stale_member_migrates_the_tasks_without_a_rewind() {
    for (code, step) in [
        (RDKafkaErrorCode::ProducerFenced, TxnStep::EndTxn),
        (RDKafkaErrorCode::InvalidProducerEpoch, TxnStep::Produce),
        (RDKafkaErrorCode::UnknownMemberId, TxnStep::SendOffsets),
        (RDKafkaErrorCode::IllegalGeneration, TxnStep::SendOffsets),
    ] {
        let mut t = Thread::new();
        t.consume(1, 3);
        t.clients
            .commit_answers
            .push_back(CommitFailure::Kafka(kafka(code), step));
        assert!(
            matches!(t.tx().commit(), Err(EngineError::TaskMigrated(_))),
            "{code:?} at {step:?}"
        );
        assert!(
            t.seeks().is_empty(),
            "{code:?}: the tasks go; their positions are not kept"
        );
        assert_eq!(t.txn.phase(), Phase::Poisoned, "{code:?}");
    }
}

#[test]
fn a_member_id_changed_under_the_transaction_is_a_migration_before_anything_is_sent() {
    let mut t = Thread::new();
    t.consume(0, 1);
    t.clients.member = "m-2".into();
    assert!(matches!(t.tx().commit(), Err(EngineError::TaskMigrated(_))));
    assert!(t.clients.commits.is_empty());
    assert_eq!(t.tasks.flushes, 0);
}

#[test]
fn a_revoke_commits_first_and_a_lost_revoke_never_commits() {
    let mut t = Thread::new();
    t.consume(0, 5);
    assert!(matches!(t.tx().revoke(false), Ok(Outcome::Committed(_))));
    assert_eq!(t.clients.commits, vec![vec![(p(0), 6)]]);

    let mut t = Thread::new();
    t.consume(0, 5);
    assert!(matches!(t.tx().revoke(true), Err(EngineError::TaskMigrated(_))));
    assert!(
        t.clients.commits.is_empty(),
        "lost partitions may be processed by their new owner"
    );
    assert_eq!((t.clients.aborts, t.tasks.aborts), (1, 1));
    assert_eq!(t.txn.phase(), Phase::Poisoned);
}

#[test]
fn a_revoke_whose_commit_fails_ambiguously_poisons_the_transaction() {
    let mut t = Thread::new();
    t.consume(0, 5);
    t.clients.commit_answers.push_back(CommitFailure::Kafka(
        kafka(RDKafkaErrorCode::RequestTimedOut),
        TxnStep::EndTxn,
    ));
    assert!(t.tx().revoke(false).is_err());
    assert_eq!(t.txn.phase(), Phase::Poisoned);
    assert!(t.seeks().is_empty());
    assert!(matches!(t.tx().revoke(false), Ok(Outcome::Nothing)));
    assert_eq!(t.clients.commits.len(), 1, "the second revoke does not try again");
}

#[test]
fn an_abort_after_an_earlier_commit_was_undone_revives_the_tasks_instead_of_rewinding() {
    let mut t = Thread::new();
    t.consume(0, 10);
    assert!(matches!(t.tx().commit(), Ok(Outcome::Committed(_))));
    // The broker lost the markers: the group is back where it was before that commit.
    t.clients.group = Some(HashMap::from([(p(0), 10)]));
    t.consume(0, 11);
    t.tasks.flush_fails = Some(RDKafkaErrorCode::State);
    let ended = t.tx().commit();
    assert!(
        matches!(ended, Err(EngineError::TaskMigrated(ref why)) if format!("{why:#}").contains("undone")),
        "{ended:?}"
    );
    assert!(t.seeks().is_empty(), "rewinding to 11 would skip offset 10 for good");

    let mut t = Thread::new();
    t.consume(0, 10);
    assert!(matches!(t.tx().commit(), Ok(Outcome::Committed(_))));
    t.consume(0, 11);
    t.tasks.flush_fails = Some(RDKafkaErrorCode::State);
    assert!(matches!(t.tx().commit(), Ok(Outcome::Aborted)), "the commit stands");
    assert_eq!(t.seeks(), vec![(p(0), 11)]);
}

#[test]
fn writes_without_a_consumed_record_are_fenced_by_an_owned_offset_or_dropped() {
    let mut t = Thread::new();
    t.consume(1, 8);
    assert!(matches!(t.tx().commit(), Ok(Outcome::Committed(_))));
    t.txn.wrote();
    t.clients.in_transaction = true;
    assert!(matches!(t.tx().commit(), Ok(Outcome::Committed(_))));
    assert_eq!(
        t.clients.commits[1],
        vec![(p(1), 9)],
        "the position reached is committed again, carrying the generation check"
    );

    let mut t = Thread::new();
    t.clients.group = Some(HashMap::from([(p(1), 42)]));
    t.txn.wrote();
    t.clients.in_transaction = true;
    assert!(matches!(t.tx().commit(), Ok(Outcome::Committed(_))));
    assert_eq!(t.clients.commits, vec![vec![(p(1), 42)]], "else the group's offset");

    let mut t = Thread::new();
    t.txn.wrote();
    t.clients.in_transaction = true;
    assert!(matches!(t.tx().commit(), Ok(Outcome::Aborted)), "nothing to fence with");
    assert!(t.clients.commits.is_empty());
}

#[test]
fn an_abort_that_fails_ends_the_generation_poisoned() {
    let mut t = Thread::new();
    t.consume(0, 3);
    t.clients.abort_fails = true;
    t.clients.commit_answers.push_back(CommitFailure::Kafka(
        kafka(RDKafkaErrorCode::QueueFull),
        TxnStep::Produce,
    ));
    assert!(matches!(t.tx().commit(), Err(EngineError::Transient(_))));
    assert_eq!(t.txn.phase(), Phase::Poisoned);
    assert!(t.seeks().is_empty());
}
