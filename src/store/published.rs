//! The task databases HTTP queries may read: those of active tasks that are restored and
//! processing. Only committed data is ever in RocksDB (the open transaction's writes stay in the
//! task's overlay), so a read here is read-committed, and it never touches the stream thread.

use rocksdb::DB;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Registered task databases by (pipeline, partition).
#[derive(Default)]
pub struct Published {
    tasks: Mutex<HashMap<(String, i32), Weak<DB>>>,
}

/// One value found by [`Published::read`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The stored key it was found under.
    pub key: Vec<u8>,
    /// The committed value.
    pub value: Vec<u8>,
}

impl Published {
    fn lock(&self) -> MutexGuard<'_, HashMap<(String, i32), Weak<DB>>> {
        // A panic while holding the lock left the map itself intact.
        self.tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes the database of `pipeline`'s task for `partition` readable.
    pub(super) fn insert(&self, pipeline: &str, partition: i32, db: &Arc<DB>) {
        self.lock()
            .insert((pipeline.to_string(), partition), Arc::downgrade(db));
    }

    /// Stops serving a task's database; reads already under way finish on their own handle.
    pub(super) fn remove(&self, pipeline: &str, partition: i32) {
        self.lock().remove(&(pipeline.to_string(), partition));
    }

    /// The partitions of `pipeline` served here now.
    pub fn partitions(&self, pipeline: &str) -> BTreeSet<i32> {
        self.lock()
            .keys()
            .filter(|(p, _)| p == pipeline)
            .map(|(_, partition)| *partition)
            .collect()
    }

    /// The first of `keys` present in column family `store` of the task for `partition`:
    /// `None` when that task is not served here, `Some(Ok(None))` when no key is present.
    /// Blocks on RocksDB: call it off the async workers.
    pub fn read(
        &self,
        pipeline: &str,
        partition: i32,
        store: &str,
        keys: &[Vec<u8>],
    ) -> Option<Result<Option<Found>, String>> {
        // The handle is taken under the lock and used after it: a task closing meanwhile waits
        // for this read (see TaskStore's drop) instead of closing its database under it.
        let db = self.lock().get(&(pipeline.to_string(), partition))?.upgrade()?;
        let Some(cf) = db.cf_handle(store) else {
            return Some(Err(format!("the task database has no store `{store}`")));
        };
        for key in keys {
            match db.get_cf(cf, key) {
                Ok(Some(value)) => {
                    return Some(Ok(Some(Found {
                        key: key.clone(),
                        value,
                    })))
                }
                Ok(None) => {}
                Err(e) => return Some(Err(format!("reading store `{store}`: {e}"))),
            }
        }
        Some(Ok(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{StoreEnv, TaskStore};

    #[test]
    fn a_published_store_serves_committed_data_until_it_is_dropped() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let env = StoreEnv::default();
        let published = env.published().clone();
        let names = ["dedup".to_string()];
        let mut s = TaskStore::open(tmp.path(), &names, &env).expect("opens");
        s.put(0, b"a", vec![1]);
        s.take_changes();
        s.commit(&[(0, 1)]).expect("commits");
        s.put(0, b"b", vec![2]);
        let keys = [b"b".to_vec(), b"a".to_vec()];
        assert!(
            published.read("p", 0, "dedup", &keys).is_none(),
            "not served before publish"
        );
        s.publish("p", 0);
        assert_eq!(published.partitions("p").into_iter().collect::<Vec<_>>(), vec![0]);
        let found = published.read("p", 0, "dedup", &keys).expect("served").expect("reads");
        let a = Found {
            key: b"a".to_vec(),
            value: vec![1],
        };
        assert_eq!(found, Some(a), "the open transaction's write is not seen");
        assert!(matches!(published.read("p", 0, "other", &keys), Some(Err(_))));
        drop(s);
        assert!(
            published.read("p", 0, "dedup", &keys).is_none(),
            "withdrawn with the store"
        );
        assert!(published.partitions("p").is_empty());
    }

    #[test]
    fn a_store_read_while_it_closes_can_be_reopened_at_once() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let env = StoreEnv::default();
        let published = env.published().clone();
        let names = ["dedup".to_string()];
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (published, stop) = (published.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    reads += u64::from(published.read("p", 0, "dedup", &[b"k".to_vec()]).is_some());
                }
                reads
            })
        };
        for _ in 0..30 {
            // Without the wait for readers, a query would keep the database open past the
            // directory unlock and this open would fail ("lock hold by current process").
            let mut s = TaskStore::open(tmp.path(), &names, &env).expect("reopens while being read");
            s.publish("p", 0);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().expect("reader") > 0, "the reader did read the stores");
    }
}
