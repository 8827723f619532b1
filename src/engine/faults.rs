//! Named fault points, for tests that drive the engine's failure paths deterministically
//! against a real broker instead of waiting for chaos timing to find them.
//!
//! `TALLY_FAULTS=commit_abortable@2,record_fails_midway@40` makes the 2nd commit fail as if the
//! offsets were refused, and the 40th processed record fail after its changelog records were
//! sent. Unset (always, outside tests), every point is one load of an empty list.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// A place in the engine where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// `send_offsets_to_transaction` fails with an abortable error (nothing committed).
    CommitAbortable,
    /// `commit_transaction` succeeds but the call reports a timeout: the outcome looks unknown.
    CommitOutcomeUnknown,
    /// A record fails with an internal error after its store writes, before its output: the
    /// transaction holds half a record.
    RecordFailsMidway,
    /// The stream thread freezes for [`FREEZE`] (as a SIGSTOPped process would, but librdkafka's
    /// threads go on and the group moves its partitions), then ticks its tasks and commits
    /// before it polls: a zombie whose timers run before it learns its partitions were lost.
    /// Counted over housekeeping passes of a thread that has tasks.
    ZombieTick,
    /// A standby store's open stalls for [`FREEZE`] before it asks the broker for its
    /// changelogs' bounds, as it does while their partitions have no leader. Counted over
    /// standby opens.
    StandbyOpenStalls,
    /// A task restore reads each changelog record [`CRAWL`] slower, as a restore of a very
    /// large changelog takes long. Counted over task restores (one per store and partition).
    RestoreCrawls,
}

/// How long [`Point::ZombieTick`] freezes the stream thread (and [`Point::StandbyOpenStalls`]
/// a standby open): past any `max.poll.interval.ms` a test sets, so the group has moved on when
/// it wakes.
pub const FREEZE: std::time::Duration = std::time::Duration::from_secs(30);

/// How much longer each changelog record takes to restore under [`Point::RestoreCrawls`].
pub const CRAWL: std::time::Duration = std::time::Duration::from_millis(10);

impl Point {
    const ALL: [Point; 6] = [
        Point::CommitAbortable,
        Point::CommitOutcomeUnknown,
        Point::RecordFailsMidway,
        Point::ZombieTick,
        Point::StandbyOpenStalls,
        Point::RestoreCrawls,
    ];

    fn name(self) -> &'static str {
        match self {
            Point::CommitAbortable => "commit_abortable",
            Point::CommitOutcomeUnknown => "commit_outcome_unknown",
            Point::RecordFailsMidway => "record_fails_midway",
            Point::ZombieTick => "zombie_tick",
            Point::StandbyOpenStalls => "standby_open_stalls",
            Point::RestoreCrawls => "restore_crawls",
        }
    }
}

struct Armed {
    point: Point,
    nth: u64,
}

struct Faults {
    armed: Vec<Armed>,
    counts: [AtomicU64; Point::ALL.len()],
}

fn faults() -> &'static Faults {
    static FAULTS: OnceLock<Faults> = OnceLock::new();
    FAULTS.get_or_init(|| Faults {
        armed: std::env::var("TALLY_FAULTS").map(|s| parse(&s)).unwrap_or_default(),
        counts: Default::default(),
    })
}

fn parse(spec: &str) -> Vec<Armed> {
    spec.split(',')
        .filter_map(|item| {
            let armed = item.trim().split_once('@').and_then(|(name, nth)| {
                Some(Armed {
                    point: Point::ALL.into_iter().find(|p| p.name() == name)?,
                    nth: nth.parse().ok()?,
                })
            });
            if armed.is_none() {
                tracing::error!(item, "TALLY_FAULTS: not `<point>@<pass>` with a known point; ignored");
            }
            armed
        })
        .collect()
}

/// Counts a pass through `point`; true when this pass is one the environment armed.
pub fn hit(point: Point) -> bool {
    let f = faults();
    if f.armed.is_empty() {
        return false;
    }
    let n = f.counts[point as usize].fetch_add(1, Ordering::Relaxed) + 1;
    let fire = f.armed.iter().any(|a| a.point == point && a.nth == n);
    if fire {
        tracing::warn!(fault = point.name(), pass = n, "injecting a fault (TALLY_FAULTS)");
    }
    fire
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_names_points_and_passes_and_ignores_what_it_does_not_know() {
        let armed = parse("commit_abortable@2, record_fails_midway@40,bogus@1,commit_outcome_unknown@x");
        let got: Vec<(Point, u64)> = armed.iter().map(|a| (a.point, a.nth)).collect();
        assert_eq!(got, vec![(Point::CommitAbortable, 2), (Point::RecordFailsMidway, 40)]);
    }
}
