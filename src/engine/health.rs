//! Liveness and readiness of an instance, as the HTTP endpoints report them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A thread that has not turned its loop for this long is stuck: librdkafka's default
/// `max.poll.interval.ms`, after which the group has already moved its partitions away.
pub const DEFAULT_STALL_LIMIT: Duration = Duration::from_secs(300);

/// What can bring a stopped instance back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remedy {
    /// A restart: a thread panicked or ended on its own, and a fresh start may well succeed.
    Restart,
    /// An operator's change: the cluster refused the principal or the disk is full, a restart
    /// meets the same wall; the reason names the change.
    Fix,
}

/// Readiness inputs shared by the stream threads, the global reader and the HTTP server.
#[derive(Debug, Default)]
pub struct Health {
    threads_expected: AtomicUsize,
    threads_joined: AtomicUsize,
    tasks_restoring: AtomicUsize,
    global_pending: AtomicBool,
    /// Why an engine thread ended before the instance was told to stop, and what helps.
    failed: Mutex<Option<(String, Remedy)>>,
    /// When each stream thread last showed progress, in ms after `epoch` (0: not started).
    beats: Vec<AtomicU64>,
    epoch: Option<Instant>,
    stall_limit: Duration,
}

impl Health {
    /// Health of an instance with `threads` stream threads and, when `global` is true, a global
    /// store that must load first.
    pub fn new(threads: usize, global: bool) -> Self {
        Self::with_stall_limit(threads, global, DEFAULT_STALL_LIMIT)
    }

    /// Like [`Health::new`]; a stream thread that shows no progress for `stall_limit` makes the
    /// instance not live.
    pub fn with_stall_limit(threads: usize, global: bool, stall_limit: Duration) -> Self {
        Self {
            threads_expected: AtomicUsize::new(threads),
            global_pending: AtomicBool::new(global),
            beats: (0..threads).map(|_| AtomicU64::new(0)).collect(),
            epoch: Some(Instant::now()),
            stall_limit,
            ..Self::default()
        }
    }

    /// Stream thread `thread` is making progress (a turn of its poll loop, a restored batch)
    /// at `now` (the caller's clock read, which its loop reads anyway).
    pub fn beat(&self, thread: usize, now: Instant) {
        if let (Some(b), Some(epoch)) = (self.beats.get(thread), self.epoch) {
            // Never 0, which means "not started".
            b.store(
                now.saturating_duration_since(epoch).as_millis() as u64 + 1,
                Ordering::Relaxed,
            );
        }
    }

    /// The first stream thread that has shown no progress for longer than the stall limit.
    fn stalled(&self) -> Option<String> {
        let now = self.epoch?.elapsed().as_millis() as u64 + 1;
        self.beats.iter().enumerate().find_map(|(i, b)| {
            let last = b.load(Ordering::Relaxed);
            let silent = Duration::from_millis(now.saturating_sub(last));
            (last > 0 && silent > self.stall_limit).then(|| {
                format!(
                    "stream thread {i} has made no progress for {} s (limit {} s: `max.poll.interval.ms`)",
                    silent.as_secs(),
                    self.stall_limit.as_secs()
                )
            })
        })
    }

    /// A stream thread got its first assignment (or left the group: `false`).
    pub fn thread_joined(&self, joined: bool) {
        if joined {
            self.threads_joined.fetch_add(1, Ordering::SeqCst);
        } else {
            self.threads_joined.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Sets how many tasks a thread is restoring (added to the others').
    pub fn restoring(&self, delta: isize) {
        if delta >= 0 {
            self.tasks_restoring.fetch_add(delta.unsigned_abs(), Ordering::SeqCst);
        } else {
            self.tasks_restoring.fetch_sub(delta.unsigned_abs(), Ordering::SeqCst);
        }
    }

    /// The global ID-mapping store has loaded.
    pub fn global_loaded(&self) {
        self.global_pending.store(false, Ordering::SeqCst);
    }

    /// An engine thread panicked or returned on its own: the instance is no longer live. The
    /// first reason is kept, with what brings the instance back.
    pub fn engine_failed(&self, why: String, remedy: Remedy) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert((why, remedy));
        }
    }

    /// Why the instance is not live, if it is not: an engine thread ended, or one is stuck.
    pub fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .map_or_else(
                |_| Some("health state poisoned".into()),
                |f| f.as_ref().map(|(why, _)| why.clone()),
            )
            .or_else(|| self.stalled())
    }

    /// What brings the instance back from its [`failure`](Self::failure): a fix only when an
    /// engine thread said so.
    pub fn remedy(&self) -> Remedy {
        self.failed
            .lock()
            .ok()
            .and_then(|f| f.as_ref().map(|(_, remedy)| *remedy))
            .unwrap_or(Remedy::Restart)
    }

    /// Ready: every stream thread is in the group, no task is restoring, the global store loaded.
    pub fn is_ready(&self) -> bool {
        self.failure().is_none()
            && !self.global_pending.load(Ordering::SeqCst)
            && self.threads_joined.load(Ordering::SeqCst) >= self.threads_expected.load(Ordering::SeqCst)
            && self.tasks_restoring.load(Ordering::SeqCst) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_after_join_restore_and_global_load() {
        let h = Health::new(2, true);
        assert!(!h.is_ready());
        h.thread_joined(true);
        h.thread_joined(true);
        assert!(!h.is_ready(), "global store still loading");
        h.global_loaded();
        assert!(h.is_ready());
        h.restoring(3);
        assert!(!h.is_ready(), "tasks restoring");
        h.restoring(-3);
        assert!(h.is_ready());
        h.thread_joined(false);
        assert!(!h.is_ready(), "a thread left the group");
    }

    #[test]
    fn a_failed_engine_thread_ends_liveness_and_readiness() {
        let h = Health::new(1, false);
        h.thread_joined(true);
        assert!(h.is_ready() && h.failure().is_none());
        assert_eq!(h.remedy(), Remedy::Restart);
        h.engine_failed("the cluster refused the principal".into(), Remedy::Fix);
        h.engine_failed("engine thread tally-global ended".into(), Remedy::Restart);
        assert_eq!(
            h.failure().as_deref(),
            Some("the cluster refused the principal"),
            "the first cause is kept"
        );
        assert_eq!(h.remedy(), Remedy::Fix, "with its remedy");
        assert!(!h.is_ready());
    }

    #[test]
    fn a_thread_without_progress_past_the_limit_ends_liveness_until_it_moves_again() {
        let h = Health::with_stall_limit(2, false, Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(h.failure(), None, "threads that have not started yet are not stuck");
        h.beat(0, Instant::now());
        h.beat(1, Instant::now());
        assert_eq!(h.failure(), None);
        std::thread::sleep(Duration::from_millis(40));
        h.beat(0, Instant::now());
        std::thread::sleep(Duration::from_millis(40));
        let stuck = h.failure().expect("thread 1 is stuck");
        assert!(stuck.starts_with("stream thread 1 has made no progress"), "{stuck}");
        h.beat(0, Instant::now());
        h.beat(1, Instant::now());
        assert_eq!(h.failure(), None, "liveness returns with progress");
    }
}
