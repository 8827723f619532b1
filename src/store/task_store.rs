//! A task's stores: RocksDB column families behind an in-memory overlay that only reaches disk,
//! together with the changelog offsets, after the Kafka transaction has committed.

use super::env::StoreEnv;
use super::error::StoreError;
use super::lock::TaskLock;
use super::offset;
use super::published::Published;
use super::recent::{Recent, Write, Writes, ENTRY_OVERHEAD};
use super::write::write_store_batch;
use rocksdb::{ColumnFamily, ColumnFamilyDescriptor, Direction, IteratorMode, WriteBatch, DB};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a closing task waits for queries still reading its database.
const READERS_WAIT: Duration = Duration::from_secs(10);

const META_CF: &str = "meta";

/// A store write that must also go to the store's changelog topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change<'a> {
    /// Index of the store within the task.
    pub store: usize,
    /// Store key.
    pub key: &'a [u8],
    /// New value; `None` is a delete (a tombstone on the changelog).
    pub value: Option<&'a [u8]>,
}

/// A committed key and value.
pub type Entry = (Box<[u8]>, Box<[u8]>);

/// How big one store is, from RocksDB's own estimates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSize {
    /// Store name.
    pub name: String,
    /// Estimated number of keys (`rocksdb.estimate-num-keys`).
    pub keys: u64,
    /// Live SST files plus unflushed memtables, in bytes.
    pub bytes: u64,
}

/// Moves a database RocksDB reports corrupt to `<dir>.corrupt-<ms since the epoch>`, for an
/// operator to look at until the stale-directory cleaner removes it; returns where it went.
pub(super) fn move_aside(dir: &Path, error: &dyn std::fmt::Display) -> Result<PathBuf, StoreError> {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let aside = PathBuf::from(format!("{}.corrupt-{millis}", dir.display()));
    tracing::error!(dir = %dir.display(), moved_to = %aside.display(), %error, "store is corrupt: moving it aside");
    std::fs::rename(dir, &aside).map_err(|source| StoreError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    Ok(aside)
}

/// Moves a task directory whose state cannot be read aside (see [`move_aside`]), so the task's
/// next opening restores it from its changelog. Refused while a store holds the directory.
pub fn set_aside(dir: &Path, why: &dyn std::fmt::Display) -> Result<PathBuf, StoreError> {
    let _held = TaskLock::try_acquire(dir)?;
    move_aside(dir, why)
}

/// All stores of one task, with uncommitted writes kept in memory.
pub struct TaskStore {
    /// Shared only with queries reading it (through `published`), for the length of a read.
    db: Arc<DB>,
    dir: PathBuf,
    names: Vec<String>,
    overlays: Vec<Writes>,
    /// What the overlays are charged against the recent-values budget once committed.
    overlay_bytes: usize,
    /// The last commits' writes, read before the database.
    recent: Recent,
    /// The largest put (key and value bytes) since [`TaskStore::take_largest_put`].
    largest_put: usize,
    published: Arc<Published>,
    /// The (pipeline, partition) this store is published as, while it is.
    serving: Option<(String, i32)>,
    /// Declared last: the database closes before the directory is unlocked.
    _lock: TaskLock,
}

impl TaskStore {
    /// Opens (creating when absent) the task database at `dir` with one column family per store.
    pub fn open(dir: &Path, names: &[String], env: &StoreEnv) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let lock = TaskLock::try_acquire(dir)?;
        let opts = env.db_options();
        let families = names
            .iter()
            .map(|n| ColumnFamilyDescriptor::new(n, env.data_cf_options()))
            .chain([ColumnFamilyDescriptor::new(META_CF, env.db_options())])
            .collect::<Vec<_>>();
        let db = DB::open_cf_descriptors(&opts, dir, families).map_err(|source| StoreError::Rocks {
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(Self {
            db: Arc::new(db),
            dir: dir.to_path_buf(),
            names: names.to_vec(),
            overlays: vec![HashMap::new(); names.len()],
            overlay_bytes: 0,
            recent: Recent::new(env.recent_budget().clone()),
            largest_put: 0,
            published: env.published().clone(),
            serving: None,
            _lock: lock,
        })
    }

    /// Opens the committed data to queries as `pipeline`'s task for `partition` (once the task
    /// is restored and processing), until the store is dropped.
    pub fn publish(&mut self, pipeline: &str, partition: i32) {
        self.published.insert(pipeline, partition, &self.db);
        self.serving = Some((pipeline.to_string(), partition));
    }

    /// Opens the task database like [`TaskStore::open`]; a database RocksDB reports corrupt is moved
    /// aside (to `<dir>.corrupt-<ms since the epoch>`, for an operator to look at until the
    /// stale-directory cleaner removes it) and an empty
    /// one opened in its place, which the restore fills from the changelog, as Kafka Streams
    /// does with a corrupted task. Without this the task would fail to open on every attempt.
    /// Returns the store and whether it was moved aside.
    pub fn open_or_rebuild(dir: &Path, names: &[String], env: &StoreEnv) -> Result<(Self, bool), StoreError> {
        match Self::open(dir, names, env) {
            Err(StoreError::Rocks { source, .. }) if source.kind() == rocksdb::ErrorKind::Corruption => {
                let aside = move_aside(dir, &source)?;
                tracing::error!(moved_to = %aside.display(), "rebuilding the task store from its changelog");
                Ok((Self::open(dir, names, env)?, true))
            }
            other => Ok((other?, false)),
        }
    }

    /// The task directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Name of store `store`.
    pub fn name(&self, store: usize) -> &str {
        &self.names[store]
    }

    fn cf(&self, name: &str) -> Result<&ColumnFamily, StoreError> {
        self.db
            .cf_handle(name)
            .ok_or_else(|| StoreError::MissingFamily(self.dir.clone(), name.to_string()))
    }

    fn rocks(&self, source: rocksdb::Error) -> StoreError {
        StoreError::Rocks {
            path: self.dir.clone(),
            source,
        }
    }

    /// Reads a key, seeing this transaction's writes first, then the last commits'.
    pub fn get(&self, store: usize, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(pending) = self.overlays[store].get(key) {
            return Ok(pending.value.clone());
        }
        if let Some(committed) = self.recent.get(store, key) {
            return Ok(committed.map(<[u8]>::to_vec));
        }
        let cf = self.cf(&self.names[store])?;
        self.db.get_cf(cf, key).map_err(|e| self.rocks(e))
    }

    /// The open transaction's write of a key, if it has one: `Some(None)` is a pending delete.
    pub fn pending(&self, store: usize, key: &[u8]) -> Option<Option<&[u8]>> {
        self.overlays[store].get(key).map(|w| w.value.as_deref())
    }

    /// Writes a key in the open transaction; its changelog record is one of [`TaskStore::unlogged`].
    pub fn put(&mut self, store: usize, key: &[u8], value: Vec<u8>) {
        self.overlay_bytes += key.len() + value.len() + ENTRY_OVERHEAD;
        self.largest_put = self.largest_put.max(key.len() + value.len());
        self.write(store, key, Some(value));
    }

    /// Deletes a key in the open transaction; its tombstone is one of [`TaskStore::unlogged`].
    pub fn delete(&mut self, store: usize, key: &[u8]) {
        self.overlay_bytes += key.len() + ENTRY_OVERHEAD;
        self.write(store, key, None);
    }

    fn write(&mut self, store: usize, key: &[u8], value: Option<Vec<u8>>) {
        let write = Write { value, logged: false };
        // A key written again in the transaction replaces its write without a new allocation.
        match self.overlays[store].get_mut(key) {
            Some(pending) => *pending = write,
            None => {
                self.overlays[store].insert(key.to_vec(), write);
            }
        }
    }

    /// The largest put (key and value bytes) since the last call: its changelog record is sent
    /// only at the commit, so the caller checks it fits while it knows the record that made it.
    /// Deletes are not counted: a tombstone's key went to the changelog with the value it
    /// removes, and expiry's tombstones belong to no record.
    pub fn take_largest_put(&mut self) -> usize {
        std::mem::take(&mut self.largest_put)
    }

    /// The open transaction's writes whose changelog record was not sent yet, the last of each
    /// key only (as Kafka Streams' caching stores flush); each counts as sent once handed out.
    pub fn unlogged(&mut self) -> impl Iterator<Item = Change<'_>> {
        self.overlays.iter_mut().enumerate().flat_map(|(store, overlay)| {
            overlay.iter_mut().filter(|(_, w)| !w.logged).map(move |(key, w)| {
                w.logged = true;
                let w: &Write = w;
                Change {
                    store,
                    key,
                    value: w.value.as_deref(),
                }
            })
        })
    }

    /// After the Kafka commit: writes the overlay and each store's changelog offset in one batch.
    /// Refuses when writes of the transaction were never taken for the changelog.
    pub fn commit(&mut self, changelog_offsets: &[(usize, i64)]) -> Result<(), StoreError> {
        write_store_batch(&self.db, &self.dir, || self.commit_batch(changelog_offsets))?;
        // A commit of an idle task wrote nothing: it keeps the recent values it has.
        if self.overlays.iter().all(HashMap::is_empty) {
            return Ok(());
        }
        // The next transaction likely writes as many keys: its maps start at that size.
        let next = self.overlays.iter().map(|o| HashMap::with_capacity(o.len())).collect();
        let committed = std::mem::replace(&mut self.overlays, next);
        self.recent.push(committed, std::mem::take(&mut self.overlay_bytes));
        Ok(())
    }

    /// The overlay and the changelog offsets as one batch, unless writes were never logged.
    fn commit_batch(&self, changelog_offsets: &[(usize, i64)]) -> Result<WriteBatch, StoreError> {
        let mut batch = WriteBatch::default();
        let mut unlogged = 0;
        for (store, overlay) in self.overlays.iter().enumerate() {
            let cf = self.cf(&self.names[store])?;
            for (key, write) in overlay {
                unlogged += usize::from(!write.logged);
                match &write.value {
                    Some(v) => batch.put_cf(cf, key, v),
                    None => batch.delete_cf(cf, key),
                }
            }
        }
        if unlogged > 0 {
            return Err(StoreError::Unlogged(self.dir.clone(), unlogged));
        }
        let meta = self.cf(META_CF)?;
        for &(store, at) in changelog_offsets {
            batch.put_cf(meta, offset_key(&self.names[store]), offset::encode(at));
        }
        Ok(batch)
    }

    /// Drops every uncommitted write (the transaction was aborted).
    pub fn abort(&mut self) {
        self.overlays.iter_mut().for_each(HashMap::clear);
        self.overlay_bytes = 0;
        self.largest_put = 0;
    }

    /// The offset of the last changelog record this store reflects, if recorded.
    pub fn changelog_offset(&self, store: usize) -> Result<Option<i64>, StoreError> {
        let name = &self.names[store];
        let raw = self
            .db
            .get_cf(self.cf(META_CF)?, offset_key(name))
            .map_err(|e| self.rocks(e))?;
        match raw {
            None => Ok(None),
            Some(bytes) => offset::decode(&bytes)
                .map(Some)
                .ok_or_else(|| StoreError::CorruptOffset(self.dir.clone(), name.clone())),
        }
    }

    /// True when the store holds at least one committed key.
    pub fn has_data(&self, store: usize) -> Result<bool, StoreError> {
        let cf = self.cf(&self.names[store])?;
        match self.db.iterator_cf(cf, IteratorMode::Start).next() {
            None => Ok(false),
            Some(Ok(_)) => Ok(true),
            Some(Err(e)) => Err(self.rocks(e)),
        }
    }

    /// Deletes every key and the changelog offset of a store (before a full restore).
    pub fn wipe(&mut self, store: usize) -> Result<(), StoreError> {
        let cf = self.cf(&self.names[store])?;
        let meta = self.cf(META_CF)?;
        write_store_batch(&self.db, &self.dir, || {
            let mut batch = WriteBatch::default();
            for item in self.db.iterator_cf(cf, IteratorMode::From(&[], Direction::Forward)) {
                let (key, _) = item.map_err(|e| self.rocks(e))?;
                batch.delete_cf(cf, key);
            }
            batch.delete_cf(meta, offset_key(&self.names[store]));
            Ok(batch)
        })?;
        self.overlays[store].clear();
        self.recent.forget(store);
        Ok(())
    }

    /// Applies changelog records read during restore, with the offset of the last one.
    pub fn apply_restored(
        &mut self,
        store: usize,
        records: &[(Vec<u8>, Option<Vec<u8>>)],
        last_offset: i64,
    ) -> Result<(), StoreError> {
        let cf = self.cf(&self.names[store])?;
        let meta = self.cf(META_CF)?;
        write_store_batch(&self.db, &self.dir, || {
            let mut batch = WriteBatch::default();
            for (key, value) in records {
                match value {
                    Some(v) => batch.put_cf(cf, key, v),
                    None => batch.delete_cf(cf, key),
                }
            }
            batch.put_cf(meta, offset_key(&self.names[store]), offset::encode(last_offset));
            Ok(batch)
        })?;
        self.recent.forget(store);
        Ok(())
    }

    /// The estimated size of every store (committed data only; the overlay is not included).
    pub fn sizes(&self) -> Result<Vec<StoreSize>, StoreError> {
        self.names
            .iter()
            .map(|name| {
                let cf = self.cf(name)?;
                let int = |property: &str| {
                    self.db
                        .property_int_value_cf(cf, property)
                        .map(Option::unwrap_or_default)
                        .map_err(|e| self.rocks(e))
                };
                Ok(StoreSize {
                    name: name.clone(),
                    keys: int("rocksdb.estimate-num-keys")?,
                    bytes: int("rocksdb.live-sst-files-size")? + int("rocksdb.cur-size-all-mem-tables")?,
                })
            })
            .collect()
    }

    /// Committed entries of a store in key order (the overlay is not included).
    pub fn scan(&self, store: usize) -> Result<impl Iterator<Item = Result<Entry, StoreError>> + '_, StoreError> {
        self.scan_after(store, None)
    }

    /// Committed entries with keys after `after` (all when `None`), in key order: a long scan
    /// resumed in steps.
    pub fn scan_after<'a>(
        &'a self,
        store: usize,
        after: Option<&'a [u8]>,
    ) -> Result<impl Iterator<Item = Result<Entry, StoreError>> + 'a, StoreError> {
        let cf = self.cf(&self.names[store])?;
        let mode = match after {
            None => IteratorMode::Start,
            Some(key) => IteratorMode::From(key, Direction::Forward),
        };
        Ok(self
            .db
            .iterator_cf(cf, mode)
            .map(|item| item.map_err(|e| self.rocks(e)))
            .filter(move |item| !matches!((item, after), (Ok((k, _)), Some(a)) if &k[..] == a)))
    }
}

impl Drop for TaskStore {
    /// Withdraws the store from queries and waits for reads under way: the database must close
    /// before the directory lock goes (the fields drop after this, in order), or this task
    /// reopened in this process after a rebalance would find its database still open.
    fn drop(&mut self) {
        let Some((pipeline, partition)) = self.serving.take() else {
            return;
        };
        self.published.remove(&pipeline, partition);
        let deadline = Instant::now() + READERS_WAIT;
        while Arc::strong_count(&self.db) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if Arc::strong_count(&self.db) > 1 {
            tracing::warn!(dir = %self.dir.display(), "a query still reads the closing task's store; it closes when the read ends");
        }
    }
}

fn offset_key(store: &str) -> Vec<u8> {
    format!("changelog_offset/{store}").into_bytes()
}

/// A change [`TaskStore::unlogged`] handed out, owned (tests look at what a commit would send).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenChange {
    /// Index of the store within the task.
    pub store: usize,
    /// Store key.
    pub key: Vec<u8>,
    /// New value; `None` is a delete.
    pub value: Option<Vec<u8>>,
}

#[cfg(test)]
impl TaskStore {
    /// [`TaskStore::unlogged`], owned: what the changelog would receive now.
    pub fn take_changes(&mut self) -> Vec<TakenChange> {
        self.unlogged()
            .map(|c| TakenChange {
                store: c.store,
                key: c.key.to_vec(),
                value: c.value.map(<[u8]>::to_vec),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
