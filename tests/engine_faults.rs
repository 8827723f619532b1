//! The engine's failure paths, driven deterministically at named fault points
//! (`TALLY_FAULTS`, src/engine/faults.rs) against the real broker: each test names the cause of
//! an exactly-once failure the chaos runs found (docs/chaos-runs.md) and fails if it returns.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use tally::demo::generator;

/// Every expected business key exactly once on the output, and nothing else.
fn assert_exactly_once(output: &str, expected: &[String]) {
    let out = read_committed(output, expected.len(), Duration::from_secs(90));
    // Anything late (a duplicate) would arrive within a few commit intervals.
    std::thread::sleep(Duration::from_secs(2));
    let out = if out.len() == expected.len() {
        read_committed(output, expected.len() + 1, Duration::from_secs(3))
    } else {
        out
    };
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for m in &out {
        *seen.entry(business_key(m)).or_default() += 1;
    }
    let missing: Vec<&String> = expected.iter().filter(|k| !seen.contains_key(*k)).collect();
    let doubled: Vec<(&String, &usize)> = seen.iter().filter(|(_, n)| **n > 1).collect();
    let ghosts: Vec<&String> = seen.keys().filter(|k| !expected.contains(k)).collect();
    assert!(
        missing.is_empty() && doubled.is_empty() && ghosts.is_empty(),
        "missing {missing:?}, doubled {doubled:?}, ghosts {ghosts:?}"
    );
}

fn injected(log: &Path, fault: &str) -> bool {
    log_lines(log)
        .iter()
        .any(|l| l["message"] == "injecting a fault (TALLY_FAULTS)" && l["fault"] == fault)
}

/// Cause: the generation ended on an error with half a record in the open transaction, and the
/// consumer's close ran the revoke callback, which committed it: the record's dedup key reached
/// the store and its changelog without its output, so the record, read again, was a
/// "duplicate" and its event was lost (the seed-31337 signature: 680 keys missing, 680
/// duplicates too many).
#[test]
fn a_record_that_fails_half_written_is_never_committed_half() {
    let names = Names::new("fault-midway");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let gen = generator::payments(400, 0, 4096, 11);
    produce(&names.input, &gen.records);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 4096);
    let log = dir.path().join("tally.log");
    let env = [("TALLY_FAULTS", "record_fails_midway@150".to_string())];
    let tally = Tally::start_with_env(&topology, "i1", log.clone(), &env);
    assert_exactly_once(&names.output, &gen.expected_keys);
    tally.stop();
    assert!(injected(&log, "record_fails_midway"), "the fault fired");
}

/// An abort after commits first checks that the group still has what they handed on (cause 8:
/// a commit the broker later settled as aborted must not be skipped by a local rewind); when it
/// does, as here, the thread rewinds in place and goes on, without reviving its tasks.
#[test]
fn an_abort_after_commits_finds_them_standing_and_rewinds_in_place() {
    let names = Names::new("fault-abort-late");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 4096);
    let log = dir.path().join("tally.log");
    // The second commit fails: the first has handed offsets on by then.
    let env = [("TALLY_FAULTS", "commit_abortable@2".to_string())];
    let tally = Tally::start_with_env(&topology, "i1", log.clone(), &env);
    let first = generator::payments(100, 0, 4096, 23);
    produce(&names.input, &first.records);
    assert_eq!(
        wait_for_count(&names.output, first.expected_keys.len(), Duration::from_secs(60)),
        first.expected_keys.len()
    );
    let second = generator::payments(300, 0, 4096, 24);
    produce(&names.input, &second.records);
    let expected: Vec<String> = first
        .expected_keys
        .iter()
        .chain(&second.expected_keys)
        .cloned()
        .collect();
    assert_exactly_once(&names.output, &expected);
    let lines = tally.stop();
    assert!(injected(&log, "commit_abortable"), "the fault fired");
    assert!(
        !events(&lines, "aborting the transaction and rewinding").is_empty(),
        "the abort rewound in place"
    );
    assert!(
        !lines.iter().any(|l| l.to_string().contains("reviving the tasks")),
        "the earlier commits stood: no revival"
    );
}

/// Cause: an abort rewound each partition to the group's committed offset, read back from the
/// coordinator; a partition it did not answer (no commit yet, an unstable offset while a
/// transaction's markers were in flight, a coordinator loading after a broker restart) was sent
/// to its beginning, replaying committed work (the seed-8675309 signature: 9,192 events closed
/// twice). With `auto.offset.reset: latest` and an abort before the first commit, the old
/// rewind replayed records from before the instance started.
#[test]
fn an_abort_rewinds_to_the_transactions_first_records_not_to_the_partitions_beginning() {
    let names = Names::new("fault-abort");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let before = generator::payments(200, 0, 4096, 21);
    produce(&names.input, &before.records);
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = std::fs::read_to_string(write_topology(dir.path(), &names, 4096))
        .expect("topology")
        .replace(
            "heartbeat.interval.ms: 1000",
            "heartbeat.interval.ms: 1000\n    auto.offset.reset: latest",
        );
    let topology = dir.path().join("latest.yaml");
    std::fs::write(&topology, yaml).expect("write topology");
    let addr = free_address();
    let log = dir.path().join("tally.log");
    let env = [
        ("TALLY_FAULTS", "commit_abortable@1".to_string()),
        ("TALLY_HTTP_ADDRESS", addr.clone()),
    ];
    let tally = Tally::start_with_env(&topology, "i1", log.clone(), &env);
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(&addr, "/health/ready").map(|(c, _)| c) != Some(200) {
        assert!(Instant::now() < deadline, "tally never became ready");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Assigned at the end of each partition; only what comes now is processed.
    std::thread::sleep(Duration::from_secs(2));
    let after = generator::payments(300, 0, 4096, 22);
    produce(&names.input, &after.records);
    assert_exactly_once(&names.output, &after.expected_keys);
    tally.stop();
    assert!(injected(&log, "commit_abortable"), "the fault fired");
}

/// Cause: a `commit_transaction` that failed although the coordinator had written
/// PrepareCommit (the broker killed mid-commit) was treated as aborted: abort, rewind, process
/// again, and the records of a committed transaction became visible twice. Now an EndTxn
/// failure of unknown outcome restarts the stream thread's clients: the next producer with the
/// transactional id completes or aborts the transaction, and the tasks restore what committed.
#[test]
fn a_commit_of_unknown_outcome_is_resolved_by_the_broker_not_guessed() {
    let names = Names::new("fault-unknown");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let gen = generator::payments(400, 0, 4096, 31);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 4096);
    let log = dir.path().join("tally.log");
    let env = [("TALLY_FAULTS", "commit_outcome_unknown@2".to_string())];
    let tally = Tally::start_with_env(&topology, "i1", log.clone(), &env);
    produce_paced(&names.input, &gen.records, 100, Duration::from_millis(150));
    assert_exactly_once(&names.output, &gen.expected_keys);
    tally.stop();
    assert!(injected(&log, "commit_outcome_unknown"), "the fault fired");
}

/// Cause 5: a zombie's transaction of writes alone (a reconciler scan's alerts, expiry
/// deletes) carried no offsets, so no group generation, and nothing fenced it. Instance `a`
/// freezes past `max.poll.interval.ms` while it owns the reconciler task; `b` takes the task
/// over and alerts the stuck events; `a` wakes, scans, alerts them again and commits before it
/// polls. The commit now carries a fencing offset and is refused: each event is alerted once.
#[test]
fn a_zombie_that_ticks_and_commits_before_it_learns_it_was_replaced_is_fenced() {
    const YAML: &str = r#"
application_id: ${TALLY_APP_ID}
kafka:
  bootstrap_servers: ${KAFKA_BOOTSTRAP}
  properties: { session.timeout.ms: 6000, heartbeat.interval.ms: 1000, max.poll.interval.ms: 6000 }
processing: { commit_interval_ms: 100 }
state: { dir: "${TALLY_STATE_DIR}" }
sources:
  payments: { topic: "${TALLY_INPUT_TOPIC}" }
pipelines:
  - name: payments
    from: payments
    key: "{payment_id}:{status}"
    routes:
      - when: { event_type: "payment.*" }
        strategy: ignore
    to: { topic: "${TALLY_OUTPUT_TOPIC}", key: "{payment_id}" }
dead_letter: { topic: "${TALLY_DLQ_TOPIC}" }
trace: { topic: "${TALLY_TRACE_TOPIC}", level: all }
reconcile: { alerts_topic: "${TALLY_ALERTS_TOPIC}", scan_interval: 1s, threshold: 8s }
"#;
    let names = Names::new("fault-zombie");
    create_topics(&[
        (&names.input, 1),
        (&names.output, 1),
        (&names.dlq, 1),
        (&names.trace, 1),
        (&names.alerts, 1),
    ]);
    let stuck = ["erp/0/1", "erp/0/2", "erp/0/3"];
    let at = now_ms();
    let received: Vec<generator::GeneratedRecord> = stuck
        .iter()
        .map(|id| trace_record(id, &format!("corr-{id}"), "RECEIVED", at))
        .collect();
    produce(&names.trace, &received);

    let dir = tempfile::tempdir().expect("tempdir");
    // About 3 s after its tasks open, well before the 8 s threshold.
    let faults = [("TALLY_FAULTS", "zombie_tick@30".to_string())];
    let a = Tally::start_yaml_with(YAML, &names, dir.path(), "a", &faults);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !a
        .lines()
        .iter()
        .any(|l| l["message"] == "task ready" && l["task"] == "reconcile-0")
    {
        assert!(Instant::now() < deadline, "a opened the reconciler task");
        std::thread::sleep(Duration::from_millis(100));
    }
    let b = Tally::start_yaml(YAML, &names, dir.path(), "b");
    // a freezes for 30 s; b owns the task from about 6 s in and alerts at the threshold.
    std::thread::sleep(tally::engine::faults::FREEZE + Duration::from_secs(10));
    let a_lines = a.stop();
    b.stop();
    assert!(
        a_lines
            .iter()
            .any(|l| l["message"] == "injecting a fault (TALLY_FAULTS)" && l["fault"] == "zombie_tick"),
        "the fault fired"
    );
    let mut alerted: BTreeMap<String, usize> = BTreeMap::new();
    for m in read_committed(&names.alerts, stuck.len(), Duration::from_secs(10)) {
        use rdkafka::Message;
        let alert: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or_default()).expect("alert is JSON");
        *alerted
            .entry(alert["event_id"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = stuck.iter().map(|id| (id.to_string(), 1)).collect();
    assert_eq!(
        alerted, expected,
        "each stuck event alerted once, by the member that owned the task"
    );
}
