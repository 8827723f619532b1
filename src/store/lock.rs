//! The lock that gives one task directory to one store at a time, across threads and processes.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Name of the lock file inside a task directory; its modification time is the last use.
const LOCK_FILE: &str = ".task.lock";

/// An exclusive advisory lock (`flock`) on a task directory, released when dropped.
#[derive(Debug)]
pub struct TaskLock {
    file: File,
}

/// Why a task directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another store (this process or another on the host) holds the directory.
    #[error("task directory {0} is in use by another instance or thread on this host")]
    Held(PathBuf),
    /// The lock file cannot be created or locked.
    #[error("task directory {path}: cannot create its lock file: {source}; check `state.dir` is writable")]
    Io {
        /// Task directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl TaskLock {
    /// Takes the lock of `dir` without waiting (the directory must exist).
    pub fn try_acquire(dir: &Path) -> Result<Self, LockError> {
        let io = |source| LockError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK_FILE))
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {
                // Opening counts as use, so a directory just taken is never stale.
                file.set_modified(SystemTime::now()).map_err(io)?;
                Ok(Self { file })
            }
            Err(TryLockError::WouldBlock) => Err(LockError::Held(dir.to_path_buf())),
            Err(TryLockError::Error(e)) => Err(io(e)),
        }
    }

    /// How long ago the directory locked at `dir` was last used, if it has a lock file.
    pub fn idle_for(dir: &Path) -> Option<Duration> {
        let modified = std::fs::metadata(dir.join(LOCK_FILE)).ok()?.modified().ok()?;
        Some(SystemTime::now().duration_since(modified).unwrap_or_default())
    }
}

impl Drop for TaskLock {
    fn drop(&mut self) {
        // The last use is when the store closes; the stale-directory cleaner counts from here.
        if let Err(e) = self.file.set_modified(SystemTime::now()) {
            tracing::debug!(error = %e, "cannot touch the task lock file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused_until_the_first_drops() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let first = TaskLock::try_acquire(tmp.path()).expect("locks");
        assert!(matches!(TaskLock::try_acquire(tmp.path()), Err(LockError::Held(_))));
        drop(first);
        TaskLock::try_acquire(tmp.path()).expect("free again");
        assert!(TaskLock::idle_for(tmp.path()).is_some_and(|d| d < Duration::from_secs(60)));
    }
}
