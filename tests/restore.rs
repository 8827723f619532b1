//! A restore reads its changelog to the end only once no transaction is open below that end.
//!
//! Cause 6 of docs/chaos-runs.md: a broker restarted after a crash skipped the commit markers of
//! a transaction on partitions that had no leader yet. The changelog kept an open transaction
//! whose input offsets were committed; restores stopped at its first offset (the last stable
//! offset a read_committed consumer is told is the end), the stores missed its records, and
//! their keys were processed again: 908 duplicated outputs.
//!
//! Cause 8: such a transaction, whose commit the client saw succeed and its store applied, was
//! settled as aborted by the producer's next (aborted) transaction; the store, trusted after a
//! restart, kept state whose outputs were gone. A restore checks its store's last record.

mod common;

use common::*;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use std::time::{Duration, Instant};
use tally::engine::restore::{restore, RestoreReport, RestoreSettings};
use tally::metrics::Metrics;
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
    restore(&settings, &mut f.store, 0, &f.topic, 0, &metrics, keep_going)
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

/// A store that applied a transaction the changelog holds as aborted (the commit was reported,
/// then Kafka settled the transaction as aborted: docs/chaos-runs.md, cause 8) is not trusted:
/// the restore wipes it and rebuilds it from the committed records only.
#[test]
fn a_store_whose_last_applied_record_was_aborted_is_rebuilt_from_the_committed_records() {
    let (mut f, producer) = fixture("restore-aborted-applied");
    producer.abort_transaction(Duration::from_secs(30)).expect("abort");
    // k0..k2 committed at offsets 0-2 (marker 3), k3 and k4 aborted at 4 and 5: the store
    // applied all five, as when it trusted a commit later settled as aborted.
    let records: Vec<(Vec<u8>, Option<Vec<u8>>)> = (0..5)
        .map(|i| (format!("k{i}").into_bytes(), Some(b"v".to_vec())))
        .collect();
    f.store.apply_restored(0, &records, 5).expect("applies");
    let report = run(&mut f, Duration::from_secs(30), &|| true).expect("restores");
    assert!(report.wiped, "the store was not trusted");
    assert_eq!(
        (report.from_offset, report.restored),
        (0, 3),
        "rebuilt from the committed records"
    );
    assert!((0..3).all(|i| has(&f.store, &format!("k{i}"))));
    assert!(
        !has(&f.store, "k3") && !has(&f.store, "k4"),
        "the aborted records are gone"
    );

    // A store whose last record is committed is trusted: nothing to read past it.
    let report = run(&mut f, Duration::from_secs(30), &|| true).expect("restores");
    assert!(!report.wiped);
    assert_eq!(report.restored, 0);
}
