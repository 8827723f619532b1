//! The global ID-mapping store: each instance's full copy of the compacted mappings topic, read
//! like a Kafka Streams GlobalKTable (lookups come from every partition), kept in RocksDB so
//! memory stays bounded whatever the number of mappings, with the position reached in each
//! partition written in the same batch as the mappings it covers: a restart reads only the tail.

use super::codec::{self, CodecError};
use super::env::StoreEnv;
use super::error::StoreError;
use super::lock::TaskLock;
use super::offset;
use super::write::write_store_batch;
use rocksdb::{Direction, IteratorMode, WriteBatch, DB};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Prefix of `<system>/<external id>` → internal id records.
pub const EXTERNAL_PREFIX: &str = "ext/";
/// Prefix of `<internal id>/<system>` → external id records.
pub const INTERNAL_PREFIX: &str = "int/";
/// Prefix of `<system>/<internal id>` → pending-create marker records.
pub const PENDING_PREFIX: &str = "pending/";

/// Key spaces of the database: mappings, read positions, and the topic they came from.
const ENTRY: u8 = b'e';
const POSITION: u8 = b'p';
const TOPIC: &[u8] = b"t";

/// The mappings known to this instance.
pub struct GlobalMappings {
    db: DB,
    dir: PathBuf,
    counts: Mutex<MappingCounts>,
    ready: AtomicBool,
    /// Declared last: the database closes before the directory is unlocked.
    _lock: Option<TaskLock>,
}

/// Sizes for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MappingCounts {
    /// Internal id → external id links.
    pub mappings: usize,
    /// Pending-create markers whose mapping has not arrived.
    pub pending: usize,
}

/// One record of the mappings topic, with where it was read.
#[derive(Debug, Clone, Copy)]
pub struct MappingRecord<'a> {
    /// Partition of the mappings topic.
    pub partition: i32,
    /// Offset of the record.
    pub offset: i64,
    /// The record's key.
    pub key: &'a str,
    /// Its value; `None` deletes the key.
    pub value: Option<&'a str>,
}

impl GlobalMappings {
    /// Name of the store's directory under `<state.dir>/<application_id>`.
    pub const DIR: &'static str = "global-mappings";

    /// Opens (creating when absent) the store at `dir`; a database RocksDB reports corrupt is
    /// moved aside and an empty one opened, which the reader fills from the topic again.
    pub fn open(dir: &Path, env: &StoreEnv) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let lock = TaskLock::try_acquire(dir)?;
        let db = match DB::open(&env.db_options(), dir) {
            Err(source) if source.kind() == rocksdb::ErrorKind::Corruption => {
                let aside = super::task_store::move_aside(dir, &source)?;
                tracing::error!(moved_to = %aside.display(), "the ID-mapping store is corrupt; reading the mappings topic again");
                DB::open(&env.db_options(), dir)
            }
            other => other,
        }
        .map_err(|source| StoreError::Rocks {
            path: dir.to_path_buf(),
            source,
        })?;
        Self::with_db(db, dir.to_path_buf(), Some(lock))
    }

    /// A store that lives in memory only (tests and tools, and the unused store of a topology
    /// without `id_mapping`).
    pub fn in_memory() -> Result<Self, StoreError> {
        // Named in error messages only.
        let label = PathBuf::from("(in-memory global-mappings)");
        let dir = Self::in_memory_path().map_err(|source| StoreError::Io {
            path: label.clone(),
            source,
        })?;
        let rocks = |source| StoreError::Rocks {
            path: label.clone(),
            source,
        };
        let mut opts = StoreEnv::default().db_options();
        opts.set_env(&rocksdb::Env::mem_env().map_err(rocks)?);
        let db = DB::open(&opts, &dir).map_err(rocks)?;
        Self::with_db(db, label, None)
    }

    /// Where [`GlobalMappings::in_memory`] opens its database: the working directory, which
    /// exists. rust-rocksdb creates the database path on the real filesystem before it opens,
    /// whatever the Env; a path of its own made `/in-memory/global-mappings` at the root of the
    /// host, and stopped tally where it may not write there (a non-root user, a read-only root
    /// filesystem in a container). The memory Env needs an absolute path and keeps the files;
    /// each store has an Env of its own, so stores sharing the path never meet.
    fn in_memory_path() -> std::io::Result<PathBuf> {
        std::env::current_dir()
    }

    fn with_db(db: DB, dir: PathBuf, lock: Option<TaskLock>) -> Result<Self, StoreError> {
        let store = Self {
            db,
            dir,
            counts: Mutex::new(MappingCounts::default()),
            ready: AtomicBool::new(false),
            _lock: lock,
        };
        let counts = store.recount()?;
        if let Ok(mut c) = store.counts.lock() {
            *c = counts;
        }
        Ok(store)
    }

    fn rocks(&self, source: rocksdb::Error) -> StoreError {
        StoreError::Rocks {
            path: self.dir.clone(),
            source,
        }
    }

    /// The value of a key.
    pub fn get(&self, key: &str) -> Result<Option<String>, StoreError> {
        let Some(raw) = self.db.get(entry_key(key)).map_err(|e| self.rocks(e))? else {
            return Ok(None);
        };
        codec::decode(&raw)
            .map(Some)
            .map_err(|source| self.corrupt(key, source))
    }

    fn contains(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.db.get_pinned(entry_key(key)).map_err(|e| self.rocks(e))?.is_some())
    }

    fn corrupt(&self, key: &str, source: CodecError) -> StoreError {
        StoreError::CorruptValue {
            path: self.dir.clone(),
            key: key.to_string(),
            source,
        }
    }

    /// The topic the store was filled from, if any.
    pub fn topic(&self) -> Result<Option<String>, StoreError> {
        let raw = self.db.get(TOPIC).map_err(|e| self.rocks(e))?;
        Ok(raw.map(|t| String::from_utf8_lossy(&t).into_owned()))
    }

    /// The offset after the last record applied from `partition`, if any was.
    pub fn position(&self, partition: i32) -> Result<Option<i64>, StoreError> {
        let Some(raw) = self.db.get(position_key(partition)).map_err(|e| self.rocks(e))? else {
            return Ok(None);
        };
        offset::decode(&raw)
            .map(Some)
            .ok_or_else(|| StoreError::CorruptOffset(self.dir.clone(), format!("mappings partition {partition}")))
    }

    /// Deletes every mapping and position and records `topic` as the source: before reading a
    /// topic from its start (a first start, another topic, or positions the topic no longer has).
    pub fn reset(&self, topic: &str) -> Result<(), StoreError> {
        write_store_batch(&self.db, &self.dir, || {
            let mut batch = WriteBatch::default();
            for item in self.db.iterator(IteratorMode::Start) {
                let (key, _) = item.map_err(|e| self.rocks(e))?;
                batch.delete(key);
            }
            batch.put(TOPIC, topic.as_bytes());
            Ok(batch)
        })?;
        if let Ok(mut c) = self.counts.lock() {
            *c = MappingCounts::default();
        }
        Ok(())
    }

    /// Applies records of the mappings topic, and the position after each, in one batch.
    pub fn apply(&self, records: &[MappingRecord<'_>]) -> Result<(), StoreError> {
        let mut counts = MappingCounts::default();
        write_store_batch(&self.db, &self.dir, || {
            let (batch, after) = self.apply_batch(records)?;
            counts = after;
            Ok(batch)
        })?;
        if let Ok(mut c) = self.counts.lock() {
            *c = counts;
        }
        Ok(())
    }

    /// The batch that applies `records`, and the counts once it is written.
    fn apply_batch(&self, records: &[MappingRecord<'_>]) -> Result<(WriteBatch, MappingCounts), StoreError> {
        let mut counts = self.counts.lock().map(|c| *c).unwrap_or_default();
        let mut batch = WriteBatch::default();
        // Later records of the batch see earlier ones: the counts follow each write in turn.
        let mut written: std::collections::HashMap<&str, bool> = std::collections::HashMap::new();
        for r in records {
            let exists = |key: &str| -> Result<bool, StoreError> {
                match written.get(key) {
                    Some(present) => Ok(*present),
                    None => self.contains(key),
                }
            };
            let had = exists(r.key)?;
            let has = r.value.is_some();
            if had != has {
                count_change(&mut counts, r.key, has, &exists)?;
            }
            match r.value {
                Some(v) => batch.put(
                    entry_key(r.key),
                    codec::encode(&v).map_err(|source| self.corrupt(r.key, source))?,
                ),
                None => batch.delete(entry_key(r.key)),
            }
            written.insert(r.key, has);
            batch.put(position_key(r.partition), offset::encode(r.offset + 1));
        }
        Ok((batch, counts))
    }

    /// Marks the initial catch-up done.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// True once the topic was read up to its end at startup.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Links and open pending-create markers, kept up to date by [`GlobalMappings::apply`].
    pub fn counts(&self) -> MappingCounts {
        self.counts.lock().map(|c| *c).unwrap_or_default()
    }

    /// Counts links and open pending-create markers by scanning the store (once, at open).
    fn recount(&self) -> Result<MappingCounts, StoreError> {
        let mut c = MappingCounts::default();
        for item in self.db.iterator(IteratorMode::From(&[ENTRY], Direction::Forward)) {
            let (key, _) = item.map_err(|e| self.rocks(e))?;
            let Some(key) = key.strip_prefix(&[ENTRY]) else {
                break;
            };
            let key = String::from_utf8_lossy(key);
            if key.starts_with(INTERNAL_PREFIX) {
                c.mappings += 1;
            } else if let Some(link) = link_of_pending(&key) {
                if !self.contains(&link)? {
                    c.pending += 1;
                }
            }
        }
        Ok(c)
    }
}

/// Adjusts the counts for `key` appearing (`now_present`) or disappearing; `exists` answers for
/// the other keys as of this write.
fn count_change(
    counts: &mut MappingCounts,
    key: &str,
    now_present: bool,
    exists: &dyn Fn(&str) -> Result<bool, StoreError>,
) -> Result<(), StoreError> {
    let step = |n: &mut usize| {
        if now_present {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
    };
    if let Some(rest) = key.strip_prefix(INTERNAL_PREFIX) {
        step(&mut counts.mappings);
        // A marker waiting for this link stops (or starts again) being pending.
        if let Some((internal, system)) = rest.rsplit_once('/') {
            if exists(&format!("{PENDING_PREFIX}{system}/{internal}"))? {
                if now_present {
                    counts.pending = counts.pending.saturating_sub(1);
                } else {
                    counts.pending += 1;
                }
            }
        }
    } else if let Some(link) = link_of_pending(key) {
        // A marker whose mapping already arrived is not pending.
        if !exists(&link)? {
            step(&mut counts.pending);
        }
    }
    Ok(())
}

/// The link key a pending-create marker waits for: `pending/<system>/<internal>` →
/// `int/<internal>/<system>`.
fn link_of_pending(key: &str) -> Option<String> {
    let (system, internal) = key.strip_prefix(PENDING_PREFIX)?.split_once('/')?;
    Some(format!("{INTERNAL_PREFIX}{internal}/{system}"))
}

fn entry_key(key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(ENTRY);
    k.extend_from_slice(key.as_bytes());
    k
}

fn position_key(partition: i32) -> [u8; 5] {
    let p = partition.to_be_bytes();
    [POSITION, p[0], p[1], p[2], p[3]]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put<'a>(offset: i64, key: &'a str, value: Option<&'a str>) -> MappingRecord<'a> {
        MappingRecord {
            partition: 0,
            offset,
            key,
            value,
        }
    }

    #[test]
    fn in_memory_stores_open_where_nothing_is_created_and_stay_apart() {
        // The path exists already, so rust-rocksdb's create_dir_all writes nothing to disk.
        assert!(GlobalMappings::in_memory_path().expect("a working directory").is_dir());
        let a = GlobalMappings::in_memory().expect("opens");
        let b = GlobalMappings::in_memory().expect("a second one opens beside it");
        a.apply(&[put(0, "int/u1/erp", Some("ERP-1"))]).expect("applies");
        assert_eq!(a.get("int/u1/erp").expect("reads").as_deref(), Some("ERP-1"));
        assert_eq!(b.get("int/u1/erp").expect("reads"), None);
    }

    #[test]
    fn pending_markers_stop_counting_once_the_mapping_exists() {
        let g = GlobalMappings::in_memory().expect("opens");
        g.apply(&[
            put(0, "pending/erp/u1", Some("{}")),
            put(1, "pending/erp/u2", Some("{}")),
        ])
        .expect("applies");
        assert_eq!(
            g.counts(),
            MappingCounts {
                mappings: 0,
                pending: 2
            }
        );
        g.apply(&[put(2, "int/u1/erp", Some("ERP-1"))]).expect("applies");
        assert_eq!(
            g.counts(),
            MappingCounts {
                mappings: 1,
                pending: 1
            }
        );
        g.apply(&[put(3, "pending/erp/u2", None)]).expect("applies");
        assert_eq!(
            g.counts(),
            MappingCounts {
                mappings: 1,
                pending: 0
            }
        );
        assert_eq!(g.get("int/u1/erp").expect("reads").as_deref(), Some("ERP-1"));
        g.apply(&[put(4, "int/u1/erp", None), put(5, "int/u1/erp", None)])
            .expect("applies");
        assert_eq!(
            g.counts(),
            MappingCounts {
                mappings: 0,
                pending: 1
            },
            "the marker of a deleted link is pending again; a second delete changes nothing"
        );
        assert_eq!(
            g.recount().expect("scans"),
            g.counts(),
            "the running counts match a scan"
        );
    }

    #[test]
    fn mappings_and_positions_survive_a_reopen_and_a_reset_forgets_both() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let env = StoreEnv::default();
        {
            let g = GlobalMappings::open(tmp.path(), &env).expect("opens");
            assert_eq!(g.position(0).expect("reads"), None);
            g.reset("mappings").expect("resets");
            g.apply(&[
                MappingRecord {
                    partition: 1,
                    offset: 41,
                    key: "ext/crm/C-1",
                    value: Some("u1"),
                },
                MappingRecord {
                    partition: 1,
                    offset: 42,
                    key: "int/u1/erp",
                    value: Some("E-1"),
                },
            ])
            .expect("applies");
            assert!(
                GlobalMappings::open(tmp.path(), &env).is_err(),
                "one instance per directory"
            );
        }
        let g = GlobalMappings::open(tmp.path(), &env).expect("reopens");
        assert_eq!(g.topic().expect("reads").as_deref(), Some("mappings"));
        assert_eq!(
            g.position(1).expect("reads"),
            Some(43),
            "the offset after the last record"
        );
        assert_eq!(g.position(0).expect("reads"), None);
        assert_eq!(g.get("ext/crm/C-1").expect("reads").as_deref(), Some("u1"));
        assert_eq!(
            g.counts(),
            MappingCounts {
                mappings: 1,
                pending: 0
            },
            "counted at open"
        );
        g.reset("other").expect("resets");
        assert_eq!(g.get("ext/crm/C-1").expect("reads"), None);
        assert_eq!(g.position(1).expect("reads"), None);
        assert_eq!(g.topic().expect("reads").as_deref(), Some("other"));
    }
}
