//! Operator mistakes and broken topics on the real broker: tally says what is wrong and what to
//! do, instead of running into a state it cannot keep.

mod common;

use common::*;
use std::time::Duration;
use tally::demo::generator::GeneratedRecord;

#[test]
fn a_changelog_that_is_not_compacted_stops_tally_with_the_fix() {
    let names = Names::new("not-compacted");
    let changelog = names.changelog("payments");
    // Created by hand with the broker's default `cleanup.policy=delete`.
    create_topics(&[(&names.input, 1), (&names.output, 1), (&names.dlq, 1), (&changelog, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology_with(dir.path(), &names, 4096, false);
    let log = refusal(Tally::start(&topology, "i1", dir.path().join("tally.log")));
    assert!(
        log.contains(&changelog) && log.contains("cleanup.policy=compact"),
        "names the topic and the setting to change: {log}"
    );
}

#[test]
fn a_corrupt_task_store_is_moved_aside_rebuilt_from_its_changelog_and_counted() {
    let names = Names::new("corrupt-store");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology_with(dir.path(), &names, 4096, false);
    produce(&names.input, &payments(0..40));
    let first = Tally::start(&topology, "i1", dir.path().join("first.log"));
    assert_eq!(read_committed(&names.output, 40, Duration::from_secs(90)).len(), 40);
    first.stop();

    // Damage every task database the way a bad disk or a half-copied volume does.
    let app_dir = dir.path().join("state").join(&names.app);
    let mut damaged = 0;
    for entry in std::fs::read_dir(&app_dir).expect("state dir").flatten() {
        let current = entry.path().join("CURRENT");
        if current.exists() {
            std::fs::write(&current, b"garbage without a newline").expect("damages");
            damaged += 1;
        }
    }
    assert_eq!(damaged, 2, "one database per task");

    // The same 40 payments again (the rebuilt stores must know them) and 10 new ones.
    produce(&names.input, &payments(0..50));
    let addr = free_address();
    let second = Tally::start_with_env(
        &topology,
        "i1",
        dir.path().join("second.log"),
        &[("TALLY_HTTP_ADDRESS", addr.clone())],
    );
    read_committed(&names.output, 50, Duration::from_secs(90));
    let metrics = http_get(&addr, "/metrics").map(|(_, body)| body).unwrap_or_default();
    second.stop();
    let out = read_committed(&names.output, 50, Duration::from_secs(20));
    let keys: std::collections::BTreeSet<String> = out.iter().map(business_key).collect();
    assert_eq!((out.len(), keys.len()), (50, 50), "nothing lost, nothing doubled");
    let rebuilds: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("tally_store_rebuilds_total{") && l.contains(r#"reason="corrupt_database""#))
        .collect();
    assert_eq!(rebuilds.len(), 1, "counted per store: {metrics}");
    assert!(rebuilds[0].ends_with(" 2"), "both tasks' stores: {}", rebuilds[0]);
    let aside = std::fs::read_dir(&app_dir)
        .expect("state dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
        .count();
    assert_eq!(aside, 2, "the damaged databases are kept for a look, not deleted");
}

#[test]
fn an_unreadable_stored_value_is_rebuilt_from_its_changelog_and_one_the_changelog_holds_costs_its_records_a_dead_letter(
) {
    let names = Names::new("unreadable-value");
    create_topics(&[(&names.input, 1), (&names.output, 1), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology_with(dir.path(), &names, 4096, false);
    produce(&names.input, &payments(0..20));
    let first = Tally::start(&topology, "i1", dir.path().join("first.log"));
    assert_eq!(read_committed(&names.output, 20, Duration::from_secs(90)).len(), 20);
    first.stop();

    // Every stored value on disk gets a format byte no tally writes (a damaged disk).
    let app_dir = dir.path().join("state").join(&names.app);
    let task_dir = std::fs::read_dir(&app_dir)
        .expect("state dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("CURRENT").exists())
        .expect("the task's database");
    assert_eq!(overwrite_stored_values(&task_dir, &[0xEE]), 20);

    // The same 20 payments again and 5 new ones: the rebuilt store must still know the 20.
    produce(&names.input, &payments(0..25));
    let second = Tally::start(&topology, "i1", dir.path().join("second.log"));
    read_committed(&names.output, 25, Duration::from_secs(90));
    std::thread::sleep(Duration::from_secs(3));
    let lines = second.stop();
    assert!(
        !events(
            &lines,
            "a task's state cannot be read; rebuilding it from its changelog"
        )
        .is_empty(),
        "the damage is found and said"
    );
    let out = read_committed(&names.output, 25, Duration::from_secs(20));
    let keys: std::collections::BTreeSet<String> = out.iter().map(business_key).collect();
    assert_eq!((out.len(), keys.len()), (25, 25), "nothing lost, nothing doubled");
    let aside = std::fs::read_dir(&app_dir)
        .expect("state dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
        .count();
    assert_eq!(aside, 1, "the damaged directory is kept for a look");

    // The same damage written into the changelog comes back after the rebuild: the record that
    // meets it is dead-lettered with its bytes and the fix, and the partition goes on.
    let changelog = names.changelog("payments");
    let last = read_committed(&changelog, 1, Duration::from_secs(20))
        .into_iter()
        .last()
        .expect("a changelog record");
    let damaged = GeneratedRecord {
        key: rdkafka::Message::key(&last).expect("changelog key").to_vec(),
        payload: vec![0xEE],
        headers: Vec::new(),
    };
    produce_to(&changelog, 0, &[damaged]);
    let again = payments(0..25);
    produce(&names.input, &again);
    produce(&names.input, &payments(25..30));
    let mut third = Tally::start(&topology, "i1", dir.path().join("third.log"));
    let out = read_committed(&names.output, 30, Duration::from_secs(120));
    let dlq = read_committed(&names.dlq, 1, Duration::from_secs(20));
    assert!(third.exited().is_none(), "one unreadable value stops nothing");
    let lines = third.stop();
    assert_eq!(out.len(), 30, "the 5 new payments pass, the 25 repeats stay duplicates");
    assert_eq!(dlq.len(), 1, "exactly the record meeting the unreadable value");
    assert_eq!(
        header(&dlq[0], "tally.error.reason").as_deref(),
        Some("unreadable_state")
    );
    let detail = header(&dlq[0], "tally.error.detail").unwrap_or_default();
    assert!(detail.contains("tally reset"), "the detail names the fix: {detail}");
    let payload = rdkafka::Message::payload(&dlq[0]).expect("the record's bytes");
    assert!(again.iter().any(|r| r.payload == payload), "the input's own bytes");
    assert_eq!(
        events(
            &lines,
            "a task's state cannot be read; rebuilding it from its changelog"
        )
        .len(),
        1,
        "rebuilt once, not in a loop"
    );
}

/// Replaces every value of every store in the task database at `dir` (not its changelog
/// offsets) with `value`; returns how many it replaced.
fn overwrite_stored_values(dir: &std::path::Path, value: &[u8]) -> usize {
    let families = rocksdb::DB::list_cf(&rocksdb::Options::default(), dir).expect("column families");
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir, &families).expect("opens");
    let mut replaced = 0;
    for family in families.iter().filter(|f| !["default", "meta"].contains(&f.as_str())) {
        let cf = db.cf_handle(family).expect("family");
        let keys: Vec<Box<[u8]>> = db
            .iterator_cf(cf, rocksdb::IteratorMode::Start)
            .map(|entry| entry.expect("entry").0)
            .collect();
        for key in keys {
            db.put_cf(cf, &key, value).expect("put");
            replaced += 1;
        }
    }
    replaced
}

/// A tmpfs of `megabytes` mounted at `dir` (root only), unmounted when dropped.
struct SmallFilesystem {
    dir: std::path::PathBuf,
}

impl SmallFilesystem {
    fn mount(dir: &std::path::Path, megabytes: u32) -> Option<Self> {
        std::fs::create_dir_all(dir).expect("mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m,mode=0700"), "tmpfs"])
            .arg(dir)
            .stderr(std::process::Stdio::null())
            .status();
        status
            .is_ok_and(|s| s.success())
            .then(|| Self { dir: dir.to_path_buf() })
    }

    /// Appends zeros to a file until the filesystem refuses more; returns its path.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let path = self.dir.join("filler");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("filler");
        let block = vec![0u8; 64 * 1024];
        while file.write_all(&block).and_then(|()| file.flush()).is_ok() {}
        let small = [0u8; 512];
        while file.write_all(&small).and_then(|()| file.flush()).is_ok() {}
        path
    }
}

impl Drop for SmallFilesystem {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

#[test]
fn a_full_state_filesystem_stops_tally_with_the_cause_and_a_restart_loses_nothing() {
    let names = Names::new("full-disk");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(fs) = SmallFilesystem::mount(&dir.path().join("state"), 64) else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (needs root): the full-filesystem case is not exercised");
        return;
    };
    let topology = write_topology_with(dir.path(), &names, 4096, false);
    // RocksDB writes its log into blocks it reserved beforehand (up to the memtable budget), so
    // records written after the filler may fit in space taken before it. With the smallest
    // budget, a memtable fills (and is flushed into a new file) within some thousands of records:
    // records keep coming until tally needs new space, however much was reserved.
    let yaml = std::fs::read_to_string(&topology).expect("topology");
    let state = format!("state: {{ dir: {} }}", dir.path().join("state").display());
    assert!(yaml.contains(&state), "the state section: {yaml}");
    let small = state.replace(" }", ", write_buffer_bytes: 1048576, block_cache_bytes: 1048576 }");
    std::fs::write(&topology, yaml.replace(&state, &small)).expect("topology");
    produce(&names.input, &payments(0..100));
    let mut first = Tally::start(&topology, "i1", dir.path().join("first.log"));
    assert_eq!(read_committed(&names.output, 100, Duration::from_secs(90)).len(), 100);

    let filler = fs.fill();
    let mut sent = 100;
    let mut status = None;
    while status.is_none() && sent < 40_000 {
        // RocksDB deletes files of its own (a flushed WAL preallocated at about the memtable
        // budget, compacted tables), and its compressed tables for these records fit in what it
        // frees: the filesystem is filled again before each batch, or tally rightly runs on.
        fs.fill();
        produce(&names.input, &payments(sent..sent + 2_000));
        sent += 2_000;
        status = first.exit_within(Duration::from_secs(10));
    }
    let status = status.or_else(|| first.exit_within(Duration::from_secs(60)));
    let log = std::fs::read_to_string(dir.path().join("first.log")).expect("log");
    let tail: Vec<&str> = log.lines().rev().take(20).collect();
    let status = status.unwrap_or_else(|| panic!("tally kept running with a full state filesystem: {tail:#?}"));
    assert!(!status.success(), "a failure, not a clean stop: {status}");
    let stop = log
        .lines()
        .find(|l| l.contains("stopping the instance"))
        .unwrap_or_else(|| panic!("no stop reason logged: {tail:#?}"));
    assert!(
        stop.contains("No space left on device") && stop.contains("the state directory") && stop.contains("is full"),
        "the reason says the state directory is full and what to do: {stop}"
    );
    eprintln!("tally stopped ({status}): {stop}");

    // The operator frees space; the same records again (the stores must know the first ones).
    std::fs::remove_file(filler).expect("frees the space");
    produce(&names.input, &payments(0..sent));
    let second = Tally::start(&topology, "i1", dir.path().join("second.log"));
    read_committed(&names.output, sent, Duration::from_secs(120));
    second.stop();
    let out = read_committed(&names.output, sent, Duration::from_secs(20));
    let keys: std::collections::BTreeSet<String> = out.iter().map(business_key).collect();
    assert_eq!((out.len(), keys.len()), (sent, sent), "nothing lost, nothing doubled");
    eprintln!(
        "tally stopped within the {} records sent after the filesystem filled",
        sent - 100
    );
}

/// Commits `keys` new keys (of the size a payment's dedup entry has) to `store`.
fn commit_keys(
    store: &mut tally::store::TaskStore,
    keys: std::ops::Range<usize>,
) -> Result<(), tally::store::StoreError> {
    for i in keys {
        store.put(0, format!("pay-{i:08}:AUTHORIZED").as_bytes(), vec![1; 40]);
    }
    store.unlogged().for_each(drop);
    store.commit(&[])
}

#[test]
fn a_store_commit_on_a_full_filesystem_returns_the_cause_instead_of_waiting_for_space() {
    // A commit caught in a write stall when the flush it waits for fails for want of space was
    // held by RocksDB forever (it waits for space to recover by itself): 3 of 40 runs of this
    // scenario with the CPUs busy hung before tally wrote with `no_slowdown`. Busy threads make
    // the stall likely; each run is a few milliseconds once the filesystem is full.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let mut causes = std::collections::BTreeSet::new();
    for run in 0..40 {
        let dir = tempfile::tempdir().expect("tempdir");
        let Some(fs) = SmallFilesystem::mount(&dir.path().join("state"), 16) else {
            eprintln!("SKIPPED: cannot mount a tmpfs here (needs root): the full-filesystem case is not exercised");
            return;
        };
        let (tx, rx) = std::sync::mpsc::channel::<Result<(), tally::store::StoreError>>();
        let (filled, wait_filled) = std::sync::mpsc::channel::<()>();
        let state = dir.path().join("state");
        // Two tasks share the smallest memtable budget: nearly every commit switches memtables.
        std::thread::spawn(move || {
            let env = tally::store::StoreEnv::new(1 << 20, 1 << 20, 0);
            let open = |task: &str| tally::store::TaskStore::open(&state.join(task), &["dedup".to_string()], &env);
            let outcome = (|| {
                let mut tasks = [open("payments-0")?, open("payments-1")?];
                for task in &mut tasks {
                    commit_keys(task, 0..50)?;
                }
                let _ = tx.send(Ok(()));
                let _ = wait_filled.recv();
                for from in (1_000..40_000).step_by(50) {
                    for task in &mut tasks {
                        commit_keys(task, from..from + 50)?;
                    }
                }
                Ok(())
            })();
            let _ = tx.send(outcome);
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the stores open")
            .expect("opens");
        fs.fill();
        filled.send(()).expect("the writer waits");
        match rx.recv_timeout(Duration::from_secs(30)) {
            Err(_) => panic!("run {run}: a store commit still waits 30 s after the state filesystem filled"),
            Ok(Ok(_)) => panic!("run {run}: 80,000 keys committed to a full filesystem"),
            Ok(Err(e)) => {
                let e = e.to_string();
                assert!(
                    e.contains("No space left on device"),
                    "run {run}: the cause is given: {e}"
                );
                causes.insert(if e.contains(".sst") {
                    "a failed flush"
                } else {
                    "the write-ahead log"
                });
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.into_iter().for_each(|t| t.join().expect("busy thread"));
    eprintln!("every commit after the filesystem filled failed with its cause, from {causes:?}");
}

#[test]
fn a_restore_longer_than_the_poll_interval_runs_between_polls_while_other_partitions_flow() {
    let names = Names::new("long-restore");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology_with(dir.path(), &names, 4096, false);
    let yaml = std::fs::read_to_string(&topology).expect("topology");
    let yaml = yaml.replace(
        "heartbeat.interval.ms: 1000",
        "heartbeat.interval.ms: 1000\n    max.poll.interval.ms: 7000",
    );
    std::fs::write(&topology, yaml).expect("topology");
    produce_to(&names.input, 0, &payments(0..1500));
    let first = Tally::start(&topology, "i1", dir.path().join("first.log"));
    assert_eq!(read_committed(&names.output, 1500, Duration::from_secs(90)).len(), 1500);
    first.stop();
    std::fs::remove_dir_all(dir.path().join("state")).expect("loses the state directory");

    // Restoring partition 0's 1,500 changelog records at 10 ms each takes 15 s, twice the poll
    // interval: done in one go, the group would drop the member before it ends.
    let addr = free_address();
    let second = Tally::start_with_env(
        &topology,
        "i1",
        dir.path().join("second.log"),
        &[
            ("TALLY_HTTP_ADDRESS", addr.clone()),
            (
                "TALLY_FAULTS",
                (1..=8)
                    .map(|n| format!("restore_crawls@{n}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ],
    );
    produce_to(&names.input, 1, &payments(2000..2100));
    assert_eq!(
        wait_for_count(&names.output, 1600, Duration::from_secs(60)),
        1600,
        "partition 1 is processed"
    );
    let metrics = http_get(&addr, "/metrics").map(|(_, body)| body).unwrap_or_default();
    let remaining = sample(&metrics, "tally_restore_remaining_records{", r#"partition="0""#);
    assert!(
        remaining.is_some_and(|r| r > 0.0),
        "partition 1 flowed while partition 0 was still restoring: {remaining:?}; {:#?}",
        events(&second.lines(), "restore finished")
    );

    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let restored = loop {
        let metrics = http_get(&addr, "/metrics").map(|(_, body)| body).unwrap_or_default();
        let remaining = sample(&metrics, "tally_restore_remaining_records{", r#"partition="0""#);
        if remaining == Some(0.0) || std::time::Instant::now() > deadline {
            break remaining;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(restored, Some(0.0), "the restore of partition 0 finishes");
    // The restored store knows the first 1,500; 10 are new.
    produce_to(&names.input, 0, &payments(0..1510));
    read_committed(&names.output, 1610, Duration::from_secs(90));
    let metrics = http_get(&addr, "/metrics").map(|(_, body)| body).unwrap_or_default();
    let lines = second.stop();
    let out = read_committed(&names.output, 1610, Duration::from_secs(20));
    let keys: std::collections::BTreeSet<String> = out.iter().map(business_key).collect();
    assert_eq!((out.len(), keys.len()), (1610, 1610), "nothing lost, nothing doubled");
    assert_eq!(
        events(&lines, "partitions assigned").len(),
        1,
        "the member stayed in the group through the restore"
    );
    assert_eq!(sample(&metrics, "tally_transactions_aborted_total", ""), Some(0.0));
}

#[test]
fn a_switch_to_co_partitioned_waits_until_the_former_repartition_topic_is_drained() {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    let names = Names::new("former-hop");
    let hop = format!("{}-payments-repartition", names.app);
    create_topics(&[(&names.input, 3), (&names.output, 3), (&names.dlq, 1), (&hop, 3)]);
    // What a run with the hop forwarded and stopped before its stateful stage processed it.
    let left = payments(0..2);
    produce(&hop, &left);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = refusal(Tally::start_example("payments-keyed.yaml", &names, dir.path(), "i1"));
    assert!(
        log.contains(&hop) && log.contains("lag") && log.contains("delete the topic"),
        "names the topic, the drain and the way to give its records up: {log}"
    );

    // Drained (the group's offsets at the end): the switch goes ahead.
    let consumer: BaseConsumer = client().set("group.id", &names.app).create().expect("consumer");
    let mut end = rdkafka::TopicPartitionList::new();
    for p in 0..3 {
        let (_, high) = consumer
            .fetch_watermarks(&hop, p, Duration::from_secs(10))
            .expect("watermarks");
        end.add_partition_offset(&hop, p, rdkafka::Offset::Offset(high))
            .expect("offset");
    }
    consumer.commit(&end, CommitMode::Sync).expect("commit");
    drop(consumer);
    let mut gen = tally::demo::generator::payments(30, 0, 0, 5);
    for r in &mut gen.records {
        let v: serde_json::Value = serde_json::from_slice(&r.payload).expect("json");
        r.key = v["payment_id"].as_str().expect("payment id").as_bytes().to_vec();
    }
    produce_partitioned(&names.input, &gen.records, "murmur2_random");
    let tally = Tally::start_example("payments-keyed.yaml", &names, dir.path(), "i1");
    let expected = gen.expected_keys.len();
    assert_eq!(
        wait_for_count(&names.output, expected, Duration::from_secs(90)),
        expected
    );
    tally.stop();
}

#[test]
fn a_restart_that_routes_keys_to_other_tasks_is_refused_until_the_change_is_accepted() {
    use tally::topology::partitioner::Partitioner;
    let names = Names::new("routing");
    create_topics(&[(&names.input, 3), (&names.output, 3), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 1 << 20);
    let first = payments(0..200);
    produce(&names.input, &first);
    let tally = Tally::start(&topology, "i1", dir.path().join("i1.log"));
    assert_eq!(wait_for_count(&names.output, 200, Duration::from_secs(90)), 200);
    tally.stop();

    // The repartition hop now hashes payment ids with murmur2 instead of librdkafka's crc32.
    let yaml = std::fs::read_to_string(&topology).expect("topology");
    let murmur = yaml.replace(
        "    heartbeat.interval.ms: 1000\n",
        "    heartbeat.interval.ms: 1000\n    partitioner: murmur2_random\n",
    );
    assert_ne!(murmur, yaml, "the topology has the shape write_topology gives it");
    std::fs::write(&topology, murmur).expect("topology");
    let log = refusal(Tally::start(&topology, "i1", dir.path().join("refused.log")));
    assert!(
        log.contains("`payments`: its state was built from")
            && log.contains("hashed with crc32 over 3 partitions")
            && log.contains("hashed with murmur2 over 3 partitions")
            && log.contains("--accept-routing-change"),
        "names the pipeline, both routings and the way on: {log}"
    );

    // Accepted: the payments whose id now hashes to another partition meet a task that has not
    // seen them, so their copies pass once more; that is what the refusal guards against.
    let moved = (0..200)
        .map(|i| format!("P-{i:04}"))
        .filter(|id| Partitioner::Crc32.partition(id.as_bytes(), 3) != Partitioner::Murmur2.partition(id.as_bytes(), 3))
        .count();
    assert!(moved > 0 && moved < 200, "{moved} of 200 move");
    let accepted = Tally::start_with_flags(
        &topology,
        "i1",
        dir.path().join("accepted.log"),
        &["--accept-routing-change"],
    );
    produce(&names.input, &first);
    assert_eq!(
        wait_for_count(&names.output, 200 + moved, Duration::from_secs(90)),
        200 + moved
    );
    accepted.stop();

    // The accepted routing is the recorded one: the next start needs no flag, and every copy
    // now meets its key's state.
    let again = Tally::start(&topology, "i1", dir.path().join("again.log"));
    produce(&names.input, &first);
    produce(&names.input, &payments(200..230));
    let total = 200 + moved + 30;
    assert_eq!(wait_for_count(&names.output, total, Duration::from_secs(90)), total);
    std::thread::sleep(Duration::from_secs(3));
    again.stop();
    let out = read_committed(&names.output, total, Duration::from_secs(30));
    assert_eq!(out.len(), total, "no copy passed after the accepted change");

    // A record this tally cannot read (a newer format's, or bytes written by hand) is not the
    // routing in force: refused alike, and replaced when accepted.
    let unreadable = GeneratedRecord {
        key: b"payments".to_vec(),
        payload: vec![0xff, 0x00],
        headers: Vec::new(),
    };
    produce(&format!("{}-routing", names.app), &[unreadable]);
    let log = refusal(Tally::start(&topology, "i1", dir.path().join("unreadable.log")));
    assert!(
        log.contains("a routing this tally cannot read") && log.contains("--accept-routing-change"),
        "{log}"
    );
    let replaced = Tally::start_with_flags(
        &topology,
        "i1",
        dir.path().join("replaced.log"),
        &["--accept-routing-change"],
    );
    produce(&names.input, &payments(230..240));
    assert_eq!(
        wait_for_count(&names.output, total + 10, Duration::from_secs(90)),
        total + 10
    );
    replaced.stop();
}

/// The log of a start that must be refused: tally exits, non-zero, within a minute.
fn refusal(mut refused: Tally) -> String {
    let status = refused
        .exit_within(Duration::from_secs(60))
        .expect("tally refuses to start");
    assert!(!status.success(), "a refusal, not a clean stop");
    std::fs::read_to_string(refused.log()).expect("log")
}
