//! A task's stores: RocksDB column families behind an in-memory overlay that only reaches disk,
//! together with the changelog offsets, after the Kafka transaction has committed.

use super::env::StoreEnv;
use super::lock::{LockError, TaskLock};
use super::published::Published;
use rocksdb::{ColumnFamily, ColumnFamilyDescriptor, Direction, IteratorMode, WriteBatch, DB};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a closing task waits for queries still reading its database.
const READERS_WAIT: Duration = Duration::from_secs(10);

const META_CF: &str = "meta";

/// A store operation that must also go to the store's changelog topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Index of the store within the task.
    pub store: usize,
    /// Store key.
    pub key: Vec<u8>,
    /// New value; `None` is a delete (a tombstone on the changelog).
    pub value: Option<Vec<u8>>,
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
}

/// Moves a database RocksDB reports corrupt to `<dir>.corrupt-<ms since the epoch>`, for an
/// operator to look at until the stale-directory cleaner removes it; returns where it went.
pub(super) fn move_aside(dir: &Path, error: &rocksdb::Error) -> Result<PathBuf, StoreError> {
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

/// All stores of one task, with uncommitted writes kept in memory.
pub struct TaskStore {
    /// Shared only with queries reading it (through `published`), for the length of a read.
    db: Arc<DB>,
    dir: PathBuf,
    names: Vec<String>,
    overlays: Vec<HashMap<Vec<u8>, Option<Vec<u8>>>>,
    changes: Vec<Change>,
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
            .map(String::as_str)
            .chain([META_CF])
            .map(|n| ColumnFamilyDescriptor::new(n, env.db_options()))
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
            changes: Vec::new(),
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

    /// Reads a key, seeing this transaction's writes first.
    pub fn get(&self, store: usize, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(pending) = self.overlays[store].get(key) {
            return Ok(pending.clone());
        }
        let cf = self.cf(&self.names[store])?;
        self.db.get_cf(cf, key).map_err(|e| self.rocks(e))
    }

    /// The open transaction's write of a key, if it has one: `Some(None)` is a pending delete.
    pub fn pending(&self, store: usize, key: &[u8]) -> Option<Option<&[u8]>> {
        self.overlays[store].get(key).map(Option::as_deref)
    }

    /// Writes a key in the open transaction and queues it for the changelog.
    pub fn put(&mut self, store: usize, key: &[u8], value: Vec<u8>) {
        self.overlays[store].insert(key.to_vec(), Some(value.clone()));
        self.changes.push(Change {
            store,
            key: key.to_vec(),
            value: Some(value),
        });
    }

    /// Deletes a key in the open transaction and queues a tombstone for the changelog.
    pub fn delete(&mut self, store: usize, key: &[u8]) {
        self.overlays[store].insert(key.to_vec(), None);
        self.changes.push(Change {
            store,
            key: key.to_vec(),
            value: None,
        });
    }

    /// Takes the changes queued since the last call, for the engine to produce.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes)
    }

    /// After the Kafka commit: writes the overlay and each store's changelog offset in one batch.
    /// Refuses when writes of the transaction were never taken for the changelog.
    pub fn commit(&mut self, changelog_offsets: &[(usize, i64)]) -> Result<(), StoreError> {
        if !self.changes.is_empty() {
            return Err(StoreError::Unlogged(self.dir.clone(), self.changes.len()));
        }
        let mut batch = WriteBatch::default();
        for (store, overlay) in self.overlays.iter().enumerate() {
            let cf = self.cf(&self.names[store])?;
            for (key, value) in overlay {
                match value {
                    Some(v) => batch.put_cf(cf, key, v),
                    None => batch.delete_cf(cf, key),
                }
            }
        }
        let meta = self.cf(META_CF)?;
        for &(store, offset) in changelog_offsets {
            batch.put_cf(meta, offset_key(&self.names[store]), offset.to_be_bytes());
        }
        self.db.write(batch).map_err(|e| self.rocks(e))?;
        self.overlays.iter_mut().for_each(HashMap::clear);
        Ok(())
    }

    /// Drops every uncommitted write (the transaction was aborted).
    pub fn abort(&mut self) {
        self.overlays.iter_mut().for_each(HashMap::clear);
        self.changes.clear();
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
            Some(bytes) => {
                let arr: [u8; 8] = bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| StoreError::CorruptOffset(self.dir.clone(), name.clone()))?;
                Ok(Some(i64::from_be_bytes(arr)))
            }
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
        let mut batch = WriteBatch::default();
        for item in self.db.iterator_cf(cf, IteratorMode::From(&[], Direction::Forward)) {
            let (key, _) = item.map_err(|e| self.rocks(e))?;
            batch.delete_cf(cf, key);
        }
        batch.delete_cf(self.cf(META_CF)?, offset_key(&self.names[store]));
        self.db.write(batch).map_err(|e| self.rocks(e))?;
        self.overlays[store].clear();
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
        let mut batch = WriteBatch::default();
        for (key, value) in records {
            match value {
                Some(v) => batch.put_cf(cf, key, v),
                None => batch.delete_cf(cf, key),
            }
        }
        batch.put_cf(
            self.cf(META_CF)?,
            offset_key(&self.names[store]),
            last_offset.to_be_bytes(),
        );
        self.db.write(batch).map_err(|e| self.rocks(e))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path) -> TaskStore {
        TaskStore::open(dir, &["dedup".to_string()], &StoreEnv::default()).expect("opens")
    }

    #[test]
    fn uncommitted_writes_are_visible_but_not_durable() {
        let tmp = tempfile::tempdir().expect("tempdir");
        {
            let mut s = open(tmp.path());
            s.put(0, b"k1", vec![1]);
            assert_eq!(s.get(0, b"k1").expect("reads"), Some(vec![1]));
            assert_eq!(s.take_changes().len(), 1);
        }
        let s = open(tmp.path());
        assert_eq!(s.get(0, b"k1").expect("reads"), None, "overlay never reached disk");
        assert_eq!(s.changelog_offset(0).expect("reads"), None);
    }

    #[test]
    fn commit_writes_data_and_offset_together_and_abort_drops() {
        let tmp = tempfile::tempdir().expect("tempdir");
        {
            let mut s = open(tmp.path());
            s.put(0, b"a", vec![1]);
            assert!(
                matches!(s.commit(&[(0, 41)]), Err(StoreError::Unlogged(_, 1))),
                "a write never taken for the changelog is refused"
            );
            assert_eq!(s.take_changes().len(), 1);
            s.commit(&[(0, 41)]).expect("commits");
            s.put(0, b"b", vec![2]);
            s.delete(0, b"a");
            assert_eq!(s.get(0, b"a").expect("reads"), None, "delete visible in overlay");
            s.abort();
            assert_eq!(s.get(0, b"a").expect("reads"), Some(vec![1]));
            assert!(s.take_changes().is_empty(), "abort drops queued changelog records");
        }
        let s = open(tmp.path());
        assert_eq!(s.get(0, b"a").expect("reads"), Some(vec![1]));
        assert_eq!(s.get(0, b"b").expect("reads"), None);
        assert_eq!(s.changelog_offset(0).expect("reads"), Some(41));
    }

    #[test]
    fn restore_applies_records_and_wipe_clears_everything() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = open(tmp.path());
        let records = vec![
            (b"x".to_vec(), Some(vec![7])),
            (b"y".to_vec(), Some(vec![8])),
            (b"x".to_vec(), None),
        ];
        s.apply_restored(0, &records, 99).expect("applies");
        assert_eq!(s.scan(0).expect("scan").count(), 1);
        s.apply_restored(0, &[(b"z".to_vec(), Some(vec![9]))], 100)
            .expect("applies");
        let after_y: Vec<Vec<u8>> = s
            .scan_after(0, Some(b"y"))
            .expect("scan")
            .map(|e| e.expect("entry").0.to_vec())
            .collect();
        assert_eq!(after_y, vec![b"z".to_vec()], "strictly after the key");
        assert_eq!(s.changelog_offset(0).expect("reads"), Some(100));
        assert!(s.has_data(0).expect("reads"));
        s.wipe(0).expect("wipes");
        assert!(!s.has_data(0).expect("reads"));
        assert_eq!(s.changelog_offset(0).expect("reads"), None);
    }

    #[test]
    fn sizes_count_committed_keys_and_bytes_but_not_the_overlay() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = open(tmp.path());
        let empty = s.sizes().expect("sizes");
        assert_eq!((empty[0].name.as_str(), empty[0].keys), ("dedup", 0));
        s.put(0, b"a", vec![1; 100]);
        s.put(0, b"b", vec![2; 100]);
        s.take_changes();
        s.commit(&[(0, 1)]).expect("commits");
        s.put(0, b"c", vec![3; 100]);
        let sizes = s.sizes().expect("sizes");
        assert_eq!(sizes[0].keys, 2, "the uncommitted key is not counted");
        assert!(sizes[0].bytes >= 200, "the memtable holds both values: {sizes:?}");
    }

    #[test]
    fn a_corrupt_database_is_moved_aside_and_opened_empty() {
        let parent = tempfile::tempdir().expect("tempdir");
        let dir = parent.path().join("task");
        {
            let mut s = TaskStore::open(&dir, &["dedup".to_string()], &StoreEnv::default()).expect("opens");
            s.put(0, b"k", b"v".to_vec());
            s.take_changes();
            s.commit(&[(0, 5)]).expect("commits");
        }
        std::fs::write(dir.join("CURRENT"), b"garbage without a newline").expect("corrupts");
        assert!(matches!(
            TaskStore::open(&dir, &["dedup".to_string()], &StoreEnv::default()),
            Err(StoreError::Rocks { .. })
        ));
        let (s, rebuilt) =
            TaskStore::open_or_rebuild(&dir, &["dedup".to_string()], &StoreEnv::default()).expect("rebuilt");
        assert!(rebuilt);
        assert!(!s.has_data(0).expect("reads"), "empty, for a full restore");
        assert_eq!(s.changelog_offset(0).expect("reads"), None);
        let aside: Vec<_> = std::fs::read_dir(parent.path())
            .expect("lists")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("task.corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1, "the corrupt copy is kept for inspection");
    }

    #[test]
    fn a_corrupt_changelog_offset_means_a_full_restore() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = open(tmp.path());
        s.put(0, b"k", b"v".to_vec());
        s.take_changes();
        s.commit(&[(0, 5)]).expect("commits");
        let meta = s.cf(META_CF).expect("meta family");
        s.db.put_cf(meta, offset_key("dedup"), b"bad").expect("writes");
        assert!(matches!(s.changelog_offset(0), Err(StoreError::CorruptOffset(..))));
        let resumed = crate::engine::restore::resume_point(&mut s, 0, 0, 0, 100).expect("resumes");
        assert_eq!(
            resumed,
            (0, Some(crate::engine::restore::Rebuild::OffsetCorrupt)),
            "wiped and read from the changelog's start"
        );
        assert!(!s.has_data(0).expect("reads"));
    }

    #[test]
    fn a_store_ahead_of_its_changelog_is_rebuilt_from_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = open(tmp.path());
        s.put(0, b"k", b"v".to_vec());
        s.take_changes();
        s.commit(&[(0, 500)]).expect("commits");
        let resumed = crate::engine::restore::resume_point(&mut s, 0, 0, 0, 501).expect("resumes");
        assert_eq!(resumed, (501, None), "caught up: nothing to read");
        let resumed = crate::engine::restore::resume_point(&mut s, 0, 0, 0, 40).expect("resumes");
        assert_eq!(
            resumed,
            (0, Some(crate::engine::restore::Rebuild::PastChangelogEnd)),
            "a changelog created again: wiped, read from its start"
        );
        assert!(!s.has_data(0).expect("reads"));
    }
}
