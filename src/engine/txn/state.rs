//! The open transaction of a stream thread as an explicit state: idle, open (when due, how
//! many records, where each consumed partition must rewind to), or poisoned (an error left its
//! outcome unknown, so nothing may commit it before the generation ends).
//!
//! It also keeps each partition's position: the offset after the last record taken. librdkafka
//! can hand a record out again without being asked (after a cooperative rebalance it re-read a
//! retained partition's committed offset while the open transaction already held the records
//! after it); such a record is refused, as it was processed in this transaction or an earlier
//! committed one.
//!
//! The rewind positions are what makes an abort exact: a partition rewinds to the first offset
//! this transaction consumed from it, which is by construction the offset the last committed
//! transaction handed on. Asking the group coordinator instead (an OffsetFetch) fails or answers
//! per partition while the broker restarts or a transaction's markers are in flight, and an
//! unanswered partition was sent to its beginning: a replay of committed work.

use rustc_hash::FxHashMap;
use std::time::{Duration, Instant};

/// A consumed partition: (topic, partition).
pub type Partition = (String, i32);

/// Where the transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Nothing written since the last commit or abort.
    Idle,
    /// Records consumed or written, to commit at `due`.
    Open {
        /// When the transaction should commit (see [`Txn::due_point`]).
        due: Instant,
        /// Records consumed in it.
        records: usize,
    },
    /// An error interrupted the thread with the transaction in an unknown state: it must never
    /// commit (the rebalance callbacks of the closing consumer included); the next generation's
    /// producer resolves it on the broker and its tasks restore what was committed.
    Poisoned,
}

/// The open transaction's phase and rewind positions.
#[derive(Debug)]
pub struct Txn {
    phase: Phase,
    /// The commit interval.
    interval: Duration,
    /// When the last committed transaction was due: the next one keeps its cadence.
    cadence: Option<Instant>,
    rewind: FxHashMap<Partition, i64>,
    next: FxHashMap<Partition, i64>,
    /// Per partition, the offset this thread's last successful commit handed on.
    handed_on: FxHashMap<Partition, i64>,
}

impl Txn {
    /// No transaction yet; transactions commit every `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            phase: Phase::Idle,
            interval,
            cadence: None,
            rewind: FxHashMap::default(),
            next: FxHashMap::default(),
            handed_on: FxHashMap::default(),
        }
    }

    /// When a transaction opened at `now` should commit: on the cadence of the last committed
    /// one (its due point plus an interval) while input keeps coming, else an interval after
    /// its first record. On the cadence, commits are an interval apart rather than an interval
    /// plus the commit's own time, so a record crossing two hops waits about two intervals plus
    /// one commit instead of two of each; no record waits more than an interval.
    fn due_point(&self, now: Instant) -> Instant {
        match self.cadence {
            // The last one committed early (its record cap): this one takes its due point.
            Some(last) if now < last => last,
            Some(last) if now < last + self.interval => last + self.interval,
            _ => now + self.interval,
        }
    }

    fn open(&mut self, records: usize) {
        self.phase = Phase::Open {
            due: self.due_point(Instant::now()),
            records,
        };
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Takes a record about to be processed, before anything of it is written: its partition
    /// rewinds to it if this is the transaction's first record from there. Returns false, and
    /// takes nothing, for a record before the partition's position (handed out again).
    pub fn consumed(&mut self, partition: &Partition, offset: i64) -> bool {
        match self.next.get_mut(partition) {
            Some(next) if offset < *next => return false,
            Some(next) => *next = offset + 1,
            None => {
                self.next.insert(partition.clone(), offset + 1);
            }
        }
        if !self.rewind.contains_key(partition) {
            self.rewind.insert(partition.clone(), offset);
        }
        match &mut self.phase {
            Phase::Open { records, .. } => *records += 1,
            Phase::Idle => self.open(1),
            Phase::Poisoned => {}
        }
        true
    }

    /// Notes records written without a consumed record (periodic work: expiry, alerts).
    pub fn wrote(&mut self) {
        if self.phase == Phase::Idle {
            self.open(0);
        }
    }

    /// True when the transaction should commit now: its due point passed, or it holds
    /// `max_records`.
    pub fn due(&self, now: Instant, max_records: usize) -> bool {
        match self.phase {
            Phase::Open { due, records } => now >= due || records >= max_records,
            Phase::Idle | Phase::Poisoned => false,
        }
    }

    /// How long a poll may wait, at most `max`, without holding an open transaction past its
    /// due point.
    pub fn poll_wait(&self, now: Instant, max: Duration) -> Duration {
        match self.phase {
            Phase::Open { due, .. } => due.saturating_duration_since(now).min(max),
            Phase::Idle | Phase::Poisoned => max,
        }
    }

    /// True when a commit may be attempted (it may still fail).
    pub fn may_commit(&self) -> bool {
        self.phase != Phase::Poisoned
    }

    /// The commit succeeded: a new transaction starts from here.
    pub fn committed(&mut self) {
        debug_assert!(self.may_commit(), "a poisoned transaction committed");
        if let Phase::Open { due, .. } = self.phase {
            self.cadence = Some(due);
        }
        self.phase = Phase::Idle;
        for partition in std::mem::take(&mut self.rewind).into_keys() {
            if let Some(&next) = self.next.get(&partition) {
                self.handed_on.insert(partition, next);
            }
        }
    }

    /// The offset this thread's last successful commit handed on for `partition`, if any.
    pub fn handed_on(&self, partition: &Partition) -> Option<i64> {
        self.handed_on.get(partition).copied()
    }

    /// Every partition this thread's commits handed an offset on for, with that offset.
    pub fn all_handed_on(&self) -> impl Iterator<Item = (&Partition, i64)> {
        self.handed_on.iter().map(|(p, o)| (p, *o))
    }

    /// The abort succeeded: returns where each partition the transaction consumed from must
    /// be rewound to, and starts over.
    pub fn aborted(&mut self) -> FxHashMap<Partition, i64> {
        if self.phase != Phase::Poisoned {
            self.phase = Phase::Idle;
        }
        // The records read again start a transaction of their own, a full interval long.
        self.cadence = None;
        let rewind = std::mem::take(&mut self.rewind);
        for (partition, offset) in &rewind {
            self.next.insert(partition.clone(), *offset);
        }
        rewind
    }

    /// The partition's position (the offset after its last record taken), if it has one.
    pub fn position(&self, partition: &Partition) -> Option<i64> {
        self.next.get(partition).copied()
    }

    /// Forgets a partition that left this thread (revoked after the commit or abort).
    pub fn forget(&mut self, partition: &Partition) {
        self.rewind.remove(partition);
        self.next.remove(partition);
        self.handed_on.remove(partition);
    }

    /// The transaction's outcome is unknown: it must not commit any more.
    pub fn poison(&mut self) {
        self.phase = Phase::Poisoned;
        self.rewind.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: i32) -> Partition {
        ("in".to_string(), n)
    }

    #[test]
    fn abort_rewinds_each_partition_to_its_first_record_of_the_transaction() {
        let mut t = Txn::new(Duration::from_secs(60));
        t.consumed(&p(0), 10);
        t.consumed(&p(0), 11);
        t.consumed(&p(1), 5);
        t.consumed(&p(0), 12);
        let rewind = t.aborted();
        assert_eq!(rewind.get(&p(0)), Some(&10));
        assert_eq!(rewind.get(&p(1)), Some(&5));
        assert_eq!(t.phase(), Phase::Idle);
        assert!(
            t.aborted().is_empty(),
            "the next abort rewinds nothing unless records are taken"
        );
    }

    #[test]
    fn a_commit_moves_the_rewind_point_to_the_next_transaction() {
        let mut t = Txn::new(Duration::from_secs(60));
        t.consumed(&p(0), 10);
        t.committed();
        t.consumed(&p(0), 11);
        assert_eq!(t.aborted().get(&p(0)), Some(&11));
    }

    #[test]
    fn due_after_the_interval_or_at_the_record_cap_and_never_when_idle() {
        let mut t = Txn::new(Duration::from_secs(60));
        let now = Instant::now();
        assert!(!t.due(now, 1), "idle never commits");
        t.wrote();
        assert!(!t.due(Instant::now(), 100));
        assert!(t.due(Instant::now() + Duration::from_secs(60), 100));
        t.consumed(&p(0), 1);
        t.consumed(&p(0), 2);
        assert!(t.due(Instant::now(), 2), "record cap");
    }

    /// How long the transaction opened now waits for its due point.
    fn next_due(t: &mut Txn, interval: Duration) -> Duration {
        t.consumed(&p(0), t.position(&p(0)).unwrap_or(0));
        let Phase::Open { due, .. } = t.phase() else {
            panic!("open");
        };
        let wait = due.saturating_duration_since(Instant::now());
        assert!(wait <= interval, "no record waits more than an interval: {wait:?}");
        wait
    }

    #[test]
    fn transactions_keep_the_cadence_of_the_last_commit_while_input_keeps_coming() {
        let interval = Duration::from_millis(400);
        let mut t = Txn::new(interval);
        let first = next_due(&mut t, interval);
        assert!(
            first > interval - Duration::from_millis(50),
            "a full interval at first: {first:?}"
        );
        // Committed 150 ms after its due point (the commit's own time): the next one is due an
        // interval after that point, not after its first record.
        std::thread::sleep(first + Duration::from_millis(150));
        t.committed();
        let second = next_due(&mut t, interval);
        assert!(
            second < interval - Duration::from_millis(100),
            "the commit's time is not added to the cadence: {second:?}"
        );
        // After an idle spell longer than an interval, a full interval again.
        std::thread::sleep(second + interval + Duration::from_millis(50));
        t.committed();
        assert!(next_due(&mut t, interval) > interval - Duration::from_millis(50));
        // After an abort too.
        t.aborted();
        assert!(next_due(&mut t, interval) > interval - Duration::from_millis(50));
    }

    #[test]
    fn a_poisoned_transaction_never_commits_or_becomes_idle() {
        let mut t = Txn::new(Duration::from_secs(60));
        t.consumed(&p(0), 3);
        t.poison();
        assert!(!t.may_commit());
        assert!(!t.due(Instant::now() + Duration::from_secs(3600), 0));
        t.consumed(&p(0), 4);
        assert!(
            t.aborted().contains_key(&p(0)),
            "positions are still noted for the abort"
        );
        assert_eq!(t.phase(), Phase::Poisoned, "an abort does not clear the poison");
    }

    #[test]
    fn a_record_handed_out_again_is_refused_until_an_abort_rewinds_to_it() {
        let mut t = Txn::new(Duration::from_secs(60));
        assert!(t.consumed(&p(0), 10));
        assert!(t.consumed(&p(0), 11));
        t.committed();
        assert!(t.consumed(&p(0), 12));
        assert!(!t.consumed(&p(0), 11), "committed in an earlier transaction");
        assert!(!t.consumed(&p(0), 12), "already in this transaction");
        assert!(t.consumed(&p(0), 14), "gaps (aborted records, markers) are fine");
        assert_eq!(t.aborted().get(&p(0)), Some(&12));
        assert!(
            t.consumed(&p(0), 12),
            "after the abort the partition reads from its rewind point"
        );
        t.forget(&p(0));
        assert!(
            t.consumed(&p(0), 3),
            "a partition assigned anew starts where the consumer puts it"
        );
    }

    #[test]
    fn a_revoked_partition_is_not_rewound() {
        let mut t = Txn::new(Duration::from_secs(60));
        t.consumed(&p(0), 3);
        t.consumed(&p(1), 7);
        t.forget(&p(0));
        let rewind = t.aborted();
        assert_eq!((rewind.get(&p(0)), rewind.get(&p(1))), (None, Some(&7)));
    }

    #[test]
    fn a_commit_records_what_it_handed_on_and_an_abort_keeps_it() {
        let mut t = Txn::new(Duration::from_secs(60));
        t.consumed(&p(0), 10);
        t.consumed(&p(0), 11);
        assert_eq!(t.handed_on(&p(0)), None, "nothing committed yet");
        t.committed();
        assert_eq!(t.handed_on(&p(0)), Some(12));
        t.consumed(&p(0), 12);
        t.consumed(&p(1), 3);
        let rewind = t.aborted();
        assert_eq!(rewind.get(&p(0)), Some(&12));
        assert_eq!(t.handed_on(&p(0)), Some(12), "an abort hands nothing on");
        assert_eq!(t.handed_on(&p(1)), None);
        assert_eq!(t.all_handed_on().collect::<Vec<_>>(), vec![(&p(0), 12)]);
        t.forget(&p(0));
        assert_eq!(t.handed_on(&p(0)), None);
    }
}
