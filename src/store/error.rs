//! How the local store fails, by what fixes it: a damaged database is rebuilt from its
//! changelog, a full or failing disk needs an operator, a lock held means another store is open.

use super::lock::LockError;
use super::write::WriteError;
use std::path::{Path, PathBuf};

/// A failure of the local store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// RocksDB refused an operation.
    #[error("state store at {path}: {source}; check the state directory is writable and not used by another instance")]
    Rocks {
        /// Task directory.
        path: PathBuf,
        /// RocksDB's error.
        source: rocksdb::Error,
    },
    /// The task directory cannot be created.
    #[error("state directory {path} cannot be created: {source}; set `state.dir` to a writable path")]
    Io {
        /// Task directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A column family that should exist is missing (the directory was tampered with).
    #[error("state store at {0}: column family `{1}` is missing; delete the task directory to rebuild it from the changelog")]
    MissingFamily(PathBuf, String),
    /// The task directory is locked by another store.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The stored changelog offset is not 8 bytes.
    #[error("state store at {0}: corrupt changelog offset for `{1}`; delete the task directory to rebuild it")]
    CorruptOffset(PathBuf, String),
    /// A stored value cannot be decoded (written by a newer tally, or damaged).
    #[error("state store at {path}: value of `{key}`: {source}; delete the directory to rebuild it")]
    CorruptValue {
        /// Store directory.
        path: PathBuf,
        /// The key whose value is unreadable.
        key: String,
        /// What is wrong with it.
        source: super::codec::CodecError,
    },
    /// A commit found store writes that were never taken for the changelog: written to
    /// RocksDB they would be in the store but not in its changelog (a bug in tally).
    #[error("state store at {0}: {1} store writes were never sent to the changelog; refusing to commit them")]
    Unlogged(PathBuf, usize),
    /// RocksDB stalled writes for longer than tally waits (see [`super::write`]).
    #[error(
        "state store at {0}: {1}: free space under `state.dir` or move it to a healthy volume, then start tally again"
    )]
    Stalled(PathBuf, WriteError),
}

impl StoreError {
    /// A write of the database at `path` that RocksDB refused.
    pub fn refused(path: &Path, error: WriteError) -> Self {
        match error {
            WriteError::Rocks(source) => StoreError::Rocks {
                path: path.to_path_buf(),
                source,
            },
            stalled => StoreError::Stalled(path.to_path_buf(), stalled),
        }
    }

    /// The directory of a database found damaged (RocksDB's checksums failed, or a stored
    /// changelog offset is not one), when that is this failure: rebuilding it from its
    /// changelog repairs it.
    pub fn damaged_database(&self) -> Option<&Path> {
        match self {
            StoreError::Rocks { path, source } if source.kind() == rocksdb::ErrorKind::Corruption => Some(path),
            StoreError::CorruptOffset(path, _) => Some(path),
            _ => None,
        }
    }
}
