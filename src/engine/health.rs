//! Liveness and readiness of an instance, as the HTTP endpoints report them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Readiness inputs shared by the stream threads, the global reader and the HTTP server.
#[derive(Debug, Default)]
pub struct Health {
    threads_expected: AtomicUsize,
    threads_joined: AtomicUsize,
    tasks_restoring: AtomicUsize,
    global_pending: AtomicBool,
    /// Why an engine thread ended before the instance was told to stop.
    failed: Mutex<Option<String>>,
}

impl Health {
    /// Health of an instance with `threads` stream threads and, when `global` is true, a global
    /// store that must load first.
    pub fn new(threads: usize, global: bool) -> Self {
        Self {
            threads_expected: AtomicUsize::new(threads),
            global_pending: AtomicBool::new(global),
            ..Self::default()
        }
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

    /// An engine thread panicked or returned on its own: the instance is no longer live.
    pub fn engine_failed(&self, why: String) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert(why);
        }
    }

    /// Why the instance is not live, if it is not.
    pub fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .map_or_else(|_| Some("health state poisoned".into()), |f| f.clone())
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
        h.engine_failed("tally-stream-0 panicked".into());
        h.engine_failed("a later failure".into());
        assert_eq!(
            h.failure().as_deref(),
            Some("tally-stream-0 panicked"),
            "the first cause is kept"
        );
        assert!(!h.is_ready());
    }
}
