//! The task store's overlay, commit, restore and rebuild.

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
    let (s, rebuilt) = TaskStore::open_or_rebuild(&dir, &["dedup".to_string()], &StoreEnv::default()).expect("rebuilt");
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
    for bad in [(-1i64).to_be_bytes(), i64::MAX.to_be_bytes(), i64::MIN.to_be_bytes()] {
        s.db.put_cf(meta, offset_key("dedup"), bad).expect("writes");
        assert!(
            matches!(s.changelog_offset(0), Err(StoreError::CorruptOffset(..))),
            "{bad:?}"
        );
    }
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

#[test]
fn recently_committed_values_give_way_to_a_restore_or_a_wipe() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut s = open(tmp.path());
    s.put(0, b"k", vec![1]);
    s.delete(0, b"gone");
    s.take_changes();
    s.commit(&[(0, 1)]).expect("commits");
    assert!(
        s.recent.get(0, b"k").is_some(),
        "the commit's writes are kept in memory"
    );
    assert_eq!(s.get(0, b"k").expect("reads"), Some(vec![1]));
    assert_eq!(s.get(0, b"gone").expect("reads"), None);
    s.put(0, b"k", vec![2]);
    s.abort();
    assert_eq!(
        s.get(0, b"k").expect("reads"),
        Some(vec![1]),
        "an abort keeps what committed"
    );
    s.apply_restored(0, &[(b"k".to_vec(), Some(vec![3]))], 5)
        .expect("applies");
    assert_eq!(s.get(0, b"k").expect("reads"), Some(vec![3]), "a restore replaces it");
    s.put(0, b"k", vec![4]);
    s.take_changes();
    s.commit(&[(0, 6)]).expect("commits");
    s.wipe(0).expect("wipes");
    assert_eq!(s.get(0, b"k").expect("reads"), None, "a wipe leaves nothing to read");
}

#[test]
fn many_commits_read_the_same_as_a_reopened_store() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut s = open(tmp.path());
    for round in 0..10u8 {
        for k in 0..20u8 {
            match (k + round) % 3 {
                0 => s.delete(0, &[k]),
                _ => s.put(0, &[k], vec![round]),
            }
        }
        s.take_changes();
        s.commit(&[(0, i64::from(round))]).expect("commits");
    }
    let live: Vec<_> = (0..20u8).map(|k| s.get(0, &[k]).expect("reads")).collect();
    drop(s);
    let reopened = open(tmp.path());
    let disk: Vec<_> = (0..20u8).map(|k| reopened.get(0, &[k]).expect("reads")).collect();
    assert_eq!(live, disk);
}

#[test]
fn commits_that_write_nothing_keep_the_recent_values() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut s = open(tmp.path());
    s.put(0, b"k", vec![1]);
    s.take_changes();
    s.commit(&[(0, 1)]).expect("commits");
    for offset in 2..10 {
        s.commit(&[(0, offset)]).expect("commits");
    }
    assert!(
        s.recent.get(0, b"k").is_some(),
        "idle commits do not push the value out"
    );
}

#[test]
fn the_changelog_gets_each_key_s_last_write_once_and_a_later_write_again() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut s = TaskStore::open(tmp.path(), &["a".to_string(), "b".to_string()], &StoreEnv::default()).expect("opens");
    s.put(0, b"k", vec![1]);
    s.put(0, b"k", vec![2]);
    s.delete(0, b"gone");
    s.put(0, b"gone", vec![3]);
    s.put(1, b"k", vec![4]);
    s.delete(1, b"k");
    let mut sent = s.take_changes();
    sent.sort_by(|x, y| (x.store, &x.key).cmp(&(y.store, &y.key)));
    let change = |store, key: &[u8], value: Option<Vec<u8>>| TakenChange {
        store,
        key: key.to_vec(),
        value,
    };
    assert_eq!(
        sent,
        vec![
            change(0, b"gone", Some(vec![3])),
            change(0, b"k", Some(vec![2])),
            change(1, b"k", None),
        ],
        "one record per key and store, its last write"
    );
    assert!(s.take_changes().is_empty(), "nothing is sent twice");
    s.put(0, b"k", vec![5]);
    let again = s.take_changes();
    assert_eq!(
        again.len(),
        1,
        "a write after the changelog was sent goes again: {again:?}"
    );
    assert_eq!(again[0].value, Some(vec![5]));
    s.put(0, b"late", vec![6]);
    assert!(
        matches!(s.commit(&[(0, 1)]), Err(StoreError::Unlogged(_, 1))),
        "a write made after the last send is refused at the commit"
    );
}

#[test]
fn the_largest_put_is_told_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut s = open(tmp.path());
    assert_eq!(s.take_largest_put(), 0);
    s.put(0, b"key", vec![0; 100]);
    s.put(0, b"k", vec![0; 10]);
    s.delete(0, &[7; 50]);
    assert_eq!(s.take_largest_put(), 103, "key and value bytes of the largest put");
    assert_eq!(s.take_largest_put(), 0, "told once");
    s.delete(0, &[7; 500]);
    assert_eq!(s.take_largest_put(), 0, "tombstones are not counted");
}
