//! Removes task directories no store has used for a while (tasks that moved to other
//! instances), like Kafka Streams' `state.cleanup.delay.ms`.

use super::lock::TaskLock;
use std::path::Path;
use std::time::Duration;

/// Deletes the task directories under `root` unused for longer than `delay` and not locked.
/// Returns how many were removed; failures are logged, never fatal.
pub fn remove_stale(root: &Path, delay: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut removed = 0;
    for dir in entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
        // Idle time is read before locking: taking the lock counts as a use.
        let Some(idle) = TaskLock::idle_for(&dir) else {
            continue;
        };
        if idle < delay {
            continue;
        }
        let Ok(lock) = TaskLock::try_acquire(&dir) else {
            continue;
        };
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                removed += 1;
                tracing::info!(dir = %dir.display(), idle_s = idle.as_secs(), "stale task directory removed");
            }
            Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot remove stale task directory"),
        }
        drop(lock);
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn age(dir: &Path, by: Duration) {
        let f = std::fs::File::options()
            .write(true)
            .open(dir.join(".task.lock"))
            .expect("lock file");
        f.set_modified(SystemTime::now() - by).expect("set mtime");
    }

    #[test]
    fn only_unlocked_directories_idle_past_the_delay_are_removed() {
        let root = tempfile::tempdir().expect("tempdir");
        let [old, fresh, busy] = ["p-0", "p-1", "p-2"].map(|n| root.path().join(n));
        for d in [&old, &fresh, &busy] {
            std::fs::create_dir(d).expect("mkdir");
            drop(TaskLock::try_acquire(d).expect("lock"));
        }
        age(&old, Duration::from_secs(3600));
        age(&busy, Duration::from_secs(3600));
        let held = TaskLock::try_acquire(&busy).expect("lock");
        age(&busy, Duration::from_secs(3600));
        assert_eq!(remove_stale(root.path(), Duration::from_secs(600)), 1);
        assert!(!old.exists() && fresh.exists() && busy.exists());
        drop(held);
    }
}
