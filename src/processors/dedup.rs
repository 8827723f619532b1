//! The `ignore` strategy: the first record of a business key passes, later ones are duplicates
//! until the key's retention has passed.

use super::state::{self, StateError, StoreKey};
use crate::store::{codec, TaskStore};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What the dedup store remembers per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupEntry {
    /// When the key was first accepted (ms since the Unix epoch).
    pub first_seen_ms: i64,
}

/// The outcome of offering a key to the dedup store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// First time (or first time since it expired): the record passes.
    First,
    /// Seen within retention: the record is dropped.
    Duplicate,
}

/// Offers `key`: remembers it and returns `First`, or returns `Duplicate` when already seen.
pub fn admit(
    store: &mut TaskStore,
    index: usize,
    key: StoreKey<'_>,
    now_ms: i64,
    retention: Duration,
) -> Result<Admission, StateError> {
    if let Some(entry) = state::read_key::<DedupEntry>(store, index, key)? {
        let age_ms = now_ms.saturating_sub(entry.first_seen_ms);
        // Expired keys count as absent even before a cleanup pass removes them.
        if u128::try_from(age_ms).unwrap_or(0) < retention.as_millis() {
            return Ok(Admission::Duplicate);
        }
    }
    state::write(store, index, key.stored, &DedupEntry { first_seen_ms: now_ms })?;
    Ok(Admission::First)
}

/// One step of an expiry pass: what it deleted and where the next step resumes.
#[derive(Debug, PartialEq, Eq)]
pub struct ExpiryStep {
    /// Keys deleted by this step.
    pub deleted: usize,
    /// The last key looked at when the step stopped before the store's end; `None` when the
    /// pass is complete.
    pub resume_after: Option<Vec<u8>>,
    /// Entries whose value cannot be decoded, so their age is unknown: kept (a record meeting
    /// one is dead-lettered or its task rebuilt, see `engine::task`).
    pub unreadable: usize,
    /// Expired entries kept because their key is too long for the tombstone to be written (a
    /// changelog record tally did not write: every key it writes fits).
    pub unwritable: usize,
    /// Entries first seen more than [`MAX_CLOCK_AHEAD_MS`] after `now_ms` (written under a clock
    /// that ran ahead), rewritten as first seen now: their retention runs from now, not from a
    /// time this clock may not reach for years.
    pub clamped: usize,
}

/// How far ahead of this instance's clock an entry's first sighting may be before expiry takes
/// it for another clock's error: instances' clocks differ by far less.
pub const MAX_CLOCK_AHEAD_MS: i64 = 60_000;

/// Looks at up to `batch` committed keys after `after` (from the start when `None`) and deletes
/// those first seen `retention` or longer ago, through the store's write path so their
/// changelog gets tombstones. A pass over a large store takes several steps, so no step stalls
/// the stream thread however many live keys there are.
pub fn expire(
    store: &mut TaskStore,
    index: usize,
    now_ms: i64,
    retention: Duration,
    after: Option<&[u8]>,
    batch: usize,
    max_key_bytes: usize,
) -> Result<ExpiryStep, StateError> {
    let cutoff = now_ms.saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
    let mut expired = Vec::new();
    let mut last = None;
    let mut seen = 0;
    let mut unreadable = 0;
    let mut unwritable = 0;
    let mut ahead = Vec::new();
    let ahead_after = now_ms.saturating_add(MAX_CLOCK_AHEAD_MS);
    for item in store.scan_after(index, after)? {
        if seen == batch {
            break;
        }
        let (key, committed) = item?;
        seen += 1;
        // The scan sees committed values only; a key re-admitted or already deleted in the open
        // transaction is judged by that write, or a fresh entry would be deleted at commit.
        let value = match store.pending(index, &key) {
            None => Some(&committed[..]),
            Some(None) => None,
            Some(Some(pending)) => Some(pending),
        };
        match value.map(|v| state::decode::<DedupEntry>(store, index, &key, v)) {
            Some(Ok(entry)) if entry.first_seen_ms <= cutoff && key.len() > max_key_bytes => unwritable += 1,
            Some(Ok(entry)) if entry.first_seen_ms <= cutoff => expired.push(key.to_vec()),
            Some(Ok(entry)) if entry.first_seen_ms > ahead_after && key.len() <= max_key_bytes => {
                ahead.push(key.to_vec());
            }
            Some(Err(StateError::Codec { .. })) => unreadable += 1,
            Some(Err(e)) => return Err(e),
            _ => {}
        }
        last = Some(key);
    }
    for key in &expired {
        store.delete(index, key);
    }
    let now = DedupEntry { first_seen_ms: now_ms };
    for key in &ahead {
        let bytes = codec::encode(&now).map_err(|source| StateError::Codec {
            store: store.name(index).to_string(),
            key: String::from_utf8_lossy(key).into_owned(),
            source,
        })?;
        store.put(index, key, bytes);
    }
    Ok(ExpiryStep {
        deleted: expired.len(),
        resume_after: if seen == batch { last.map(|k| k.to_vec()) } else { None },
        unreadable,
        unwritable,
        clamped: ahead.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreEnv;

    fn k(stored: &str) -> StoreKey<'_> {
        StoreKey { stored, legacy: None }
    }

    #[test]
    fn first_passes_repeats_are_duplicates_until_retention_passes() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["d".to_string()], &StoreEnv::default()).expect("opens");
        let day = Duration::from_secs(86_400);
        assert_eq!(
            admit(&mut s, 0, k("PAY-1:PAID"), 1_000, day).expect("ok"),
            Admission::First
        );
        assert_eq!(
            admit(&mut s, 0, k("PAY-1:PAID"), 2_000, day).expect("ok"),
            Admission::Duplicate
        );
        assert_eq!(
            admit(&mut s, 0, k("PAY-1:SHIPPED"), 2_000, day).expect("ok"),
            Admission::First
        );
        let later = 1_000 + 86_400_000;
        assert_eq!(
            admit(&mut s, 0, k("PAY-1:PAID"), later, day).expect("ok"),
            Admission::First
        );
        let mut logged: Vec<(Vec<u8>, Option<DedupEntry>)> = s
            .take_changes()
            .into_iter()
            .map(|c| {
                (
                    c.key,
                    c.value.map(|v| crate::store::codec::decode(&v).expect("decodes")),
                )
            })
            .collect();
        logged.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            logged,
            vec![
                (b"PAY-1:PAID".to_vec(), Some(DedupEntry { first_seen_ms: later })),
                (b"PAY-1:SHIPPED".to_vec(), Some(DedupEntry { first_seen_ms: 2_000 })),
            ],
            "every accepted key is changelogged once, with its last admission"
        );
    }

    #[test]
    fn expiry_deletes_old_committed_keys_with_tombstones() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["d".to_string()], &StoreEnv::default()).expect("opens");
        let retention = Duration::from_secs(10);
        admit(&mut s, 0, k("old"), 1_000, retention).expect("ok");
        admit(&mut s, 0, k("new"), 9_000, retention).expect("ok");
        s.take_changes();
        s.commit(&[]).expect("commit");
        assert_eq!(
            expire(&mut s, 0, 12_000, retention, None, 100, usize::MAX)
                .expect("ok")
                .deleted,
            1
        );
        let changes = s.take_changes();
        assert_eq!(changes.len(), 1);
        assert_eq!(
            (changes[0].key.as_slice(), changes[0].value.as_ref()),
            (b"old".as_slice(), None)
        );
        assert_eq!(
            admit(&mut s, 0, k("old"), 12_000, retention).expect("ok"),
            Admission::First
        );
        assert_eq!(
            admit(&mut s, 0, k("new"), 12_000, retention).expect("ok"),
            Admission::Duplicate
        );
    }

    #[test]
    fn expiry_keeps_a_key_readmitted_in_the_open_transaction() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["d".to_string()], &StoreEnv::default()).expect("opens");
        let retention = Duration::from_secs(10);
        admit(&mut s, 0, k("k"), 1_000, retention).expect("ok");
        s.take_changes();
        s.commit(&[]).expect("commit");
        // Expired but not yet cleaned up: the key passes again and is re-recorded, then an
        // expiry pass runs in the same transaction.
        assert_eq!(
            admit(&mut s, 0, k("k"), 20_000, retention).expect("ok"),
            Admission::First
        );
        assert_eq!(
            expire(&mut s, 0, 20_000, retention, None, 100, usize::MAX)
                .expect("ok")
                .deleted,
            0
        );
        s.take_changes();
        s.commit(&[]).expect("commit");
        assert_eq!(
            admit(&mut s, 0, k("k"), 21_000, retention).expect("ok"),
            Admission::Duplicate,
            "the fresh entry survived the expiry pass"
        );
    }

    #[test]
    fn expiry_counts_an_unreadable_entry_keeps_it_and_goes_on() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["d".to_string()], &StoreEnv::default()).expect("opens");
        let retention = Duration::from_secs(10);
        admit(&mut s, 0, k("a"), 1_000, retention).expect("ok");
        s.put(0, b"b", vec![0xEE]);
        admit(&mut s, 0, k("c"), 1_000, retention).expect("ok");
        s.take_changes();
        s.commit(&[]).expect("commit");
        let step =
            expire(&mut s, 0, 20_000, retention, None, 100, usize::MAX).expect("an unreadable entry is no error");
        assert_eq!((step.deleted, step.unreadable), (2, 1));
        let mut deleted: Vec<Vec<u8>> = s.take_changes().into_iter().map(|c| c.key).collect();
        deleted.sort();
        assert_eq!(deleted, [b"a".to_vec(), b"c".to_vec()], "the unreadable entry is kept");
    }

    #[test]
    fn an_expired_key_too_long_for_its_tombstone_is_kept_and_counted() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["d".to_string()], &StoreEnv::default()).expect("opens");
        let retention = Duration::from_secs(10);
        let long = "L".repeat(40);
        admit(&mut s, 0, k("short"), 1_000, retention).expect("ok");
        admit(&mut s, 0, k(&long), 1_000, retention).expect("ok");
        s.take_changes();
        s.commit(&[]).expect("commit");
        let step = expire(&mut s, 0, 20_000, retention, None, 100, 39).expect("ok");
        assert_eq!((step.deleted, step.unwritable), (1, 1));
        let deleted: Vec<Vec<u8>> = s.take_changes().into_iter().map(|c| c.key).collect();
        assert_eq!(deleted, [b"short".to_vec()], "no tombstone that could not be written");
        let step = expire(&mut s, 0, 20_000, retention, None, 100, 40).expect("ok");
        assert_eq!((step.deleted, step.unwritable), (1, 0), "one that fits goes");
    }

    #[test]
    fn an_entry_first_seen_under_a_clock_far_ahead_expires_a_retention_after_now() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["d".to_string()], &StoreEnv::default()).expect("opens");
        let retention = Duration::from_secs(10);
        let year_ms = 365 * 86_400_000;
        admit(&mut s, 0, k("ahead"), year_ms, retention).expect("ok");
        admit(&mut s, 0, k("skewed"), 1_000 + MAX_CLOCK_AHEAD_MS, retention).expect("ok");
        s.take_changes();
        s.commit(&[]).expect("commit");
        let step = expire(&mut s, 0, 1_000, retention, None, 100, usize::MAX).expect("ok");
        assert_eq!((step.deleted, step.clamped), (0, 1), "only the entry far ahead");
        let changes = s.take_changes();
        assert_eq!(changes.len(), 1, "{changes:?}");
        let value = changes[0].value.as_deref().expect("rewritten, not deleted");
        let entry: DedupEntry = codec::decode(value).expect("decodes");
        assert_eq!(
            (changes[0].key.as_slice(), entry.first_seen_ms),
            (b"ahead".as_slice(), 1_000)
        );
        s.commit(&[]).expect("commit");
        assert_eq!(
            admit(&mut s, 0, k("ahead"), 5_000, retention).expect("ok"),
            Admission::Duplicate,
            "still a duplicate within the retention"
        );
        let step = expire(&mut s, 0, 11_000, retention, None, 100, usize::MAX).expect("ok");
        assert_eq!(
            (step.deleted, step.clamped),
            (1, 0),
            "gone a retention after it was clamped"
        );
    }

    #[test]
    fn a_key_expired_in_the_open_transaction_is_not_counted_again() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["d".to_string()], &StoreEnv::default()).expect("opens");
        let retention = Duration::from_secs(10);
        admit(&mut s, 0, k("k"), 1_000, retention).expect("ok");
        s.take_changes();
        s.commit(&[]).expect("commit");
        assert_eq!(
            expire(&mut s, 0, 20_000, retention, None, 100, usize::MAX)
                .expect("ok")
                .deleted,
            1
        );
        assert_eq!(
            expire(&mut s, 0, 30_000, retention, None, 100, usize::MAX)
                .expect("ok")
                .deleted,
            0
        );
        assert_eq!(s.take_changes().len(), 1, "one tombstone");
    }

    #[test]
    fn a_pass_goes_through_the_store_in_steps_and_ends() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["d".to_string()], &StoreEnv::default()).expect("opens");
        let retention = Duration::from_secs(10);
        for key in ["a", "b", "c", "d", "e"] {
            admit(&mut s, 0, k(key), 1_000, retention).expect("ok");
        }
        admit(&mut s, 0, k("bb"), 9_000, retention).expect("ok");
        s.take_changes();
        s.commit(&[]).expect("commit");
        let mut steps = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let step = expire(&mut s, 0, 12_000, retention, after.as_deref(), 2, usize::MAX).expect("ok");
            steps.push(step.deleted);
            after = step.resume_after;
            if after.is_none() {
                break;
            }
        }
        // a,b | bb,c | d,e | (end): the live key `bb` is looked at but kept.
        assert_eq!(steps, vec![2, 1, 2, 0]);
        let mut deleted: Vec<Vec<u8>> = s.take_changes().into_iter().map(|c| c.key).collect();
        deleted.sort();
        assert_eq!(deleted, [b"a", b"b", b"c", b"d", b"e"].map(|k| k.to_vec()));
    }

    #[test]
    fn a_corrupt_entry_is_an_error_not_a_guess() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["d".to_string()], &StoreEnv::default()).expect("opens");
        s.put(0, b"k", vec![42, 0]);
        assert!(matches!(
            admit(&mut s, 0, k("k"), 0, Duration::from_secs(1)),
            Err(StateError::Codec { .. })
        ));
    }
}
