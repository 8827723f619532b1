//! Batch writes that cannot wait forever inside RocksDB.
//!
//! RocksDB holds a writer caught in a write stall (too many memtables waiting for a flush) until
//! the stall clears. When that flush fails because the disk is full, RocksDB stops writes and
//! waits for free space to recover on its own; the writer already waiting is never woken and
//! never told, so the stream thread hung silently on a full state volume. Tally writes with
//! `no_slowdown` instead and waits between attempts itself: the next attempt meets the stopped
//! database and returns the flush's error, and a stall that outlasts [`STALL_LIMIT`] is one.
//! Where RocksDB would only slow writes down (too many files waiting for compaction), tally
//! waits the same way until they may go at full speed again, which leaves the compaction the
//! disk instead of pacing writes beside it.

use super::error::StoreError;
use rocksdb::{ErrorKind, WriteBatch, WriteOptions, DB};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long writes may stall before tally gives up on the database: far beyond any flush a
/// healthy disk takes, well within the consumer's poll interval.
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

/// The most bytes of records that restores and catch-ups gather before they write them: a count
/// alone would let records of a megabyte each (merged states, or anything written to a
/// changelog) gather gigabytes.
pub const CATCH_UP_BATCH_BYTES: usize = 64 << 20;

/// The longest pause between two attempts of a stalled write.
const MAX_PAUSE: Duration = Duration::from_millis(50);

/// Why a batch was not written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// RocksDB refused the batch.
    #[error(transparent)]
    Rocks(rocksdb::Error),
    /// Writes stalled for longer than [`STALL_LIMIT`].
    #[error(
        "RocksDB has refused writes for {} s ({background_errors} background errors since it opened: a flush or \
         compaction failed, as the LOG file in its directory says; a full or failing disk is the usual cause)",
        waited.as_secs()
    )]
    Stalled {
        /// How long the write was refused.
        waited: Duration,
        /// RocksDB's count of failed background jobs (`rocksdb.background-errors`).
        background_errors: u64,
    },
}

/// Writes the batch `build` makes (again for each attempt: RocksDB takes it) to `db`, with its
/// write-ahead log unless `wal` is false, waiting out write stalls up to [`STALL_LIMIT`].
/// `build`'s own errors come back as they are; a refused write as `refused` maps it.
pub fn write_batch<E>(
    db: &DB,
    wal: bool,
    mut build: impl FnMut() -> Result<WriteBatch, E>,
    refused: impl FnOnce(WriteError) -> E,
) -> Result<(), E> {
    let mut opts = WriteOptions::default();
    opts.set_no_slowdown(true);
    opts.disable_wal(!wal);
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        let error = match db.write_opt(build()?, &opts) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() != ErrorKind::Incomplete => WriteError::Rocks(e),
            Err(_) if start.elapsed() < STALL_LIMIT => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_PAUSE);
                continue;
            }
            Err(_) => WriteError::Stalled {
                waited: start.elapsed(),
                background_errors: db
                    .property_int_value("rocksdb.background-errors")
                    .ok()
                    .flatten()
                    .unwrap_or(0),
            },
        };
        return Err(refused(error));
    }
}

/// [`write_batch`] of a store's database at `dir`, with its write-ahead log.
pub(super) fn write_store_batch(
    db: &DB,
    dir: &Path,
    build: impl FnMut() -> Result<WriteBatch, StoreError>,
) -> Result<(), StoreError> {
    write_batch(db, true, build, |e| StoreError::refused(dir, e))
}
