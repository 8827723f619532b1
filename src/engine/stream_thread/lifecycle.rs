//! A stream thread's place in its consumer group during one generation, as an explicit state
//! with its transitions (Kafka Streams names them in `StreamThread.State`): joining, joined,
//! rejoining after it left on request, or ended by an error a rebalance callback met (the
//! callbacks run inside `poll` and cannot return it, so the loop picks it up after the poll).

use crate::engine::errors::EngineError;
use std::time::Instant;

/// Where the thread stands in the group.
#[derive(Debug)]
pub enum Membership {
    /// Subscribed, no assignment yet.
    Joining,
    /// Partitions assigned: tasks open, restore and process.
    Joined,
    /// Left the group on a rejoin request; subscribes again at `at`, once every task is closed.
    Rejoining {
        /// The earliest time to subscribe again (the LeaveGroup answered first).
        at: Instant,
    },
    /// An error ended the generation; the loop returns it after the poll.
    Ended(EngineError),
}

impl Membership {
    /// Partitions were assigned. Returns true on the generation's first assignment.
    pub fn assigned(&mut self) -> bool {
        match self {
            Membership::Joining => {
                *self = Membership::Joined;
                true
            }
            Membership::Rejoining { .. } => {
                *self = Membership::Joined;
                false
            }
            Membership::Joined | Membership::Ended(_) => false,
        }
    }

    /// Leaves the group on request, to join again from `at`; true when the thread must
    /// unsubscribe now (not when it is already leaving or has ended).
    pub fn leave(&mut self, at: Instant) -> bool {
        match self {
            Membership::Joining | Membership::Joined => {
                *self = Membership::Rejoining { at };
                true
            }
            Membership::Rejoining { .. } | Membership::Ended(_) => false,
        }
    }

    /// True, and joining again, when a leaving thread may subscribe again: its pause is over at
    /// `now` and it has no task left (`idle`).
    pub fn rejoin_due(&mut self, now: Instant, idle: bool) -> bool {
        match self {
            Membership::Rejoining { at } if now >= *at && idle => {
                *self = Membership::Joining;
                true
            }
            _ => false,
        }
    }

    /// The generation ends on `error`; the first error is the one kept.
    pub fn end(&mut self, error: EngineError) {
        if !matches!(self, Membership::Ended(_)) {
            *self = Membership::Ended(error);
        }
    }

    /// The error that ended the generation, if one did.
    pub fn take_end(&mut self) -> Option<EngineError> {
        match std::mem::replace(self, Membership::Joining) {
            Membership::Ended(e) => Some(e),
            other => {
                *self = other;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_first_assignment_joins_and_later_ones_do_not_count_again() {
        let mut m = Membership::Joining;
        assert!(m.assigned(), "first assignment of the generation");
        assert!(!m.assigned(), "a rebalance keeps the thread joined");
        assert!(m.leave(Instant::now()));
        assert!(!m.assigned(), "an assignment after a rejoin is not a first one");
        assert!(matches!(m, Membership::Joined));
    }

    #[test]
    fn a_rejoin_waits_for_its_pause_and_for_every_task_to_close() {
        let now = Instant::now();
        let mut m = Membership::Joined;
        assert!(m.leave(now + Duration::from_secs(1)));
        assert!(!m.leave(now), "a second request while leaving does nothing");
        assert!(!m.rejoin_due(now, true), "the LeaveGroup is answered first");
        assert!(!m.rejoin_due(now + Duration::from_secs(2), false), "tasks still close");
        assert!(m.rejoin_due(now + Duration::from_secs(2), true));
        assert!(matches!(m, Membership::Joining));
        assert!(!m.rejoin_due(now + Duration::from_secs(3), true), "only once");
    }

    #[test]
    fn the_first_error_ends_the_generation_and_is_taken_once() {
        let mut m = Membership::Joined;
        assert!(m.take_end().is_none());
        assert!(matches!(m, Membership::Joined), "looking does not change the state");
        m.end(EngineError::migrated("partitions lost"));
        m.end(EngineError::Internal(anyhow::anyhow!("later")));
        assert!(
            !m.leave(Instant::now()),
            "an ended generation does not leave on request"
        );
        assert!(!m.assigned());
        assert!(matches!(m.take_end(), Some(EngineError::TaskMigrated(_))));
        assert!(m.take_end().is_none());
    }
}
