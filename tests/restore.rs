//! A restore reads its changelog to the end only once no transaction is open below that end.
//!
//! Cause 6 of docs/chaos-runs.md: a broker restarted after a crash skipped the commit markers of
//! a transaction on partitions that had no leader yet. The changelog kept an open transaction
//! whose input offsets were committed; restores stopped at its first offset (the last stable
//! offset a read_committed consumer is told is the end), the stores missed its records, and
//! their keys were processed again: 908 duplicated outputs.

mod common;

use common::*;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message};
use std::time::{Duration, Instant};
use tally::engine::producer::TxnProducer;
use tally::engine::restore::{restore, RestoreReport, RestoreSettings};
use tally::engine::settle::commit_no_op;
use tally::engine::stable_end::{Hooks, SETTLE_AFTER};
use tally::metrics::Metrics;
use tally::store::NO_OP_KEY;
use tally::store::{StoreEnv, TaskStore};

/// A transactional producer that has committed `k0`..`k2` and holds `k3`, `k4` in an open
/// transaction.
fn changelog_with_an_open_transaction(topic: &str) -> BaseProducer {
    create_topics(&[(topic, 1)]);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", format!("{topic}-writer"))
        .create()
        .expect("producer");
    let timeout = Duration::from_secs(30);
    producer.init_transactions(timeout).expect("init");
    for keys in [0..3, 3..5] {
        producer.begin_transaction().expect("begin");
        for i in keys.clone() {
            let key = format!("k{i}");
            producer
                .send(BaseRecord::to(topic).key(&key).payload("v").partition(0))
                .expect("send");
        }
        producer.flush(timeout).expect("flush");
        if keys.start == 0 {
            producer.commit_transaction(timeout).expect("commit");
        }
    }
    producer
}

fn restore_config(app: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap())
        .set("group.id", format!("{app}-restore"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest");
    c
}

/// A changelog with committed and open records (the producer that holds the open ones comes
/// alongside), an empty store, and the restore consumer's configuration.
struct Fixture {
    topic: String,
    store: TaskStore,
    config: ClientConfig,
    _dir: tempfile::TempDir,
}

fn fixture(test: &str) -> (Fixture, BaseProducer) {
    let names = Names::new(test);
    let topic = names.changelog("p");
    let producer = changelog_with_an_open_transaction(&topic);
    let dir = tempfile::tempdir().expect("tempdir");
    let store = TaskStore::open(dir.path(), &["dedup".to_string()], &StoreEnv::default()).expect("store");
    let f = Fixture {
        topic,
        store,
        config: restore_config(&names.app),
        _dir: dir,
    };
    (f, producer)
}

/// Restores the fixture's store, waiting up to `limit`; `keep_going` answers whether to go on.
fn run(f: &mut Fixture, limit: Duration, keep_going: &dyn Fn() -> bool) -> anyhow::Result<RestoreReport> {
    let metrics = Metrics::new("restore-test").expect("metrics");
    let settings = RestoreSettings {
        config: f.config.clone(),
        open_transaction_limit: limit,
    };
    restore(
        &settings,
        &mut f.store,
        0,
        &f.topic,
        0,
        &metrics,
        Hooks::progress(keep_going),
    )
}

fn has(store: &TaskStore, key: &str) -> bool {
    store.get(0, key.as_bytes()).expect("reads").is_some()
}

#[test]
fn a_restore_waits_for_a_transaction_open_on_its_changelog_and_reads_what_it_committed() {
    let (mut f, producer) = fixture("restore-open-txn");
    let committer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        producer.commit_transaction(Duration::from_secs(30)).expect("commit");
    });
    let started = Instant::now();
    let report = run(&mut f, Duration::from_secs(60), &|| true).expect("restores");
    committer.join().expect("committer");
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "the restore waited for the open transaction ({:?})",
        started.elapsed()
    );
    assert_eq!(
        report.restored, 5,
        "the records of the transaction that committed while it waited"
    );
    assert!((0..5).all(|i| has(&f.store, &format!("k{i}"))));
}

#[test]
fn a_restore_does_not_read_around_a_transaction_that_never_finishes() {
    let (mut f, producer) = fixture("restore-hanging-txn");
    let limit = Duration::from_secs(3);
    let started = Instant::now();
    let err = run(&mut f, limit, &|| true).expect_err("a hanging transaction stops the restore");
    assert!(started.elapsed() >= limit, "it waited the limit first");
    let text = format!("{err:#}");
    assert!(
        text.contains("hanging transaction") && text.contains("find-hanging") && text.contains(&f.topic),
        "the error names the partition and what to do: {text}"
    );
    assert!(!has(&f.store, "k0"), "nothing restored: the store is not half-restored");

    producer.abort_transaction(Duration::from_secs(30)).expect("abort");
    let report = run(&mut f, limit, &|| true).expect("restores once it finished");
    assert_eq!(report.restored, 3, "an aborted transaction's records are not restored");
    assert!(has(&f.store, "k2") && !has(&f.store, "k3"));
}

#[test]
fn a_stop_request_ends_a_restore_that_waits_for_an_open_transaction() {
    let (mut f, _producer) = fixture("restore-stop");
    let started = Instant::now();
    let err = run(&mut f, Duration::from_secs(60), &|| false).expect_err("stopped");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "a stopping instance does not wait out the limit ({:?})",
        started.elapsed()
    );
    assert!(format!("{err:#}").contains("stopping"), "{err:#}");
}

/// A restore that has waited [`SETTLE_AFTER`] commits a no-op to the partition with its thread's
/// producer (closing the transaction if it is that producer id's own); another producer's
/// transaction stays open, and the restore goes on waiting for it without applying the no-op.
#[test]
fn a_restore_commits_a_no_op_once_and_goes_on_waiting_for_another_producers_transaction() {
    let (mut f, foreign) = fixture("restore-no-op");
    let timeout = Duration::from_secs(30);
    let commit_after = SETTLE_AFTER + Duration::from_secs(3);
    let committer = std::thread::spawn(move || {
        std::thread::sleep(commit_after);
        foreign.commit_transaction(timeout).expect("commit");
    });
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", format!("{}-thread", f.topic));
    let mut producer = TxnProducer::new(&config, timeout, 1 << 20).expect("producer");
    let settled = std::cell::Cell::new(0);
    let mut settle = || {
        settled.set(settled.get() + 1);
        commit_no_op(&mut producer, &f.topic, 0)
    };
    let metrics = Metrics::new("restore-test").expect("metrics");
    let settings = RestoreSettings {
        config: f.config.clone(),
        open_transaction_limit: Duration::from_secs(60),
    };
    let hooks = Hooks {
        progress: &|| true,
        settle: Some(&mut settle),
    };
    let started = Instant::now();
    let report = restore(&settings, &mut f.store, 0, &f.topic, 0, &metrics, hooks).expect("restores");
    committer.join().expect("committer");
    assert_eq!(settled.get(), 1, "one no-op per wait");
    assert!(
        started.elapsed() >= commit_after - Duration::from_millis(500),
        "the no-op did not end the wait for another producer's transaction ({:?})",
        started.elapsed()
    );
    assert_eq!(report.restored, 5, "what the other transaction committed is restored");
    assert!((0..5).all(|i| has(&f.store, &format!("k{i}"))));
    assert!(
        store_keys(&f.store).iter().all(|k| k.as_slice() != NO_OP_KEY),
        "no store applies the no-op"
    );
    let committed = read_committed(&f.topic, 6, Duration::from_secs(10));
    assert!(
        committed.iter().any(|m| m.key() == Some(NO_OP_KEY)),
        "the no-op committed on the changelog"
    );
}

fn store_keys(store: &TaskStore) -> Vec<Vec<u8>> {
    store
        .scan(0)
        .expect("scan")
        .map(|e| e.expect("entry").0.to_vec())
        .collect()
}

/// A stream thread writes a no-op to every changelog partition at its first commit, whether it
/// owns the partition's task or not: a transaction its producer id left open there is closed
/// by that commit, wherever the task went (src/engine/settle.rs).
#[test]
fn a_stream_thread_commits_a_no_op_to_every_changelog_partition() {
    let names = Names::new("restore-no-op-sweep");
    create_topics(&[(&names.input, 3), (&names.output, 1), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 4096);
    let tally = Tally::start(&topology, "i1", dir.path().join("tally.log"));
    let changelog = names.changelog("payments");
    let deadline = Instant::now() + Duration::from_secs(60);
    let with_no_op = loop {
        let found: std::collections::BTreeSet<i32> = read_committed(&changelog, 0, Duration::from_secs(2))
            .iter()
            .filter(|m| m.key() == Some(NO_OP_KEY) && m.payload().is_none())
            .map(|m| m.partition())
            .collect();
        if found.len() == 3 || Instant::now() > deadline {
            break found;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    tally.stop();
    assert_eq!(
        with_no_op.into_iter().collect::<Vec<_>>(),
        vec![0, 1, 2],
        "a committed no-op tombstone on each partition of the changelog"
    );
}
