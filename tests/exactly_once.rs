//! Exactly-once against the real broker: duplicates, bad records, SIGKILL and restore.

mod common;

use common::*;
use rdkafka::consumer::Consumer;
use rdkafka::Message;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};
use tally::demo::generator;

/// Asserts the output holds every expected business key exactly once and nothing else.
fn assert_exactly_once(output: &[rdkafka::message::OwnedMessage], expected: &[String]) {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for m in output {
        *seen.entry(business_key(m)).or_default() += 1;
    }
    let dups: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(dups.is_empty(), "duplicates on the output, e.g. {dups:?}");
    let expected: BTreeSet<&String> = expected.iter().collect();
    let missing: Vec<_> = expected
        .iter()
        .filter(|k| !seen.contains_key(k.as_str()))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "keys never emitted, e.g. {missing:?}");
    let ghosts: Vec<_> = seen.keys().filter(|k| !expected.contains(k)).take(5).collect();
    assert!(ghosts.is_empty(), "outputs with no input, e.g. {ghosts:?}");
    assert_eq!(output.len(), expected.len());
}

#[test]
fn repeated_and_repushed_events_come_out_once_each() {
    let names = Names::new("dedup");
    create_topics(&[(&names.input, 3), (&names.output, 3), (&names.dlq, 1)]);
    let gen = generator::payments(1500, 0, 0, 11);
    let repushed = gen
        .records
        .iter()
        .filter(|r| r.headers.iter().any(|(k, _)| k == "delivery_attempt"))
        .count();
    assert!(
        repushed > 100,
        "the input must contain re-pushes with new keys and headers"
    );
    produce(&names.input, &gen.records);

    // The example topology file itself, pointed at this test's topics.
    let dir = tempfile::tempdir().expect("tempdir");
    let tally = Tally::start_example("payments.yaml", &names, dir.path(), "i1");
    let got = wait_for_count(&names.output, gen.expected_keys.len(), Duration::from_secs(120));
    assert_eq!(got, gen.expected_keys.len(), "output count before stop");
    let lines = tally.stop();

    let output = read_committed(&names.output, gen.expected_keys.len(), Duration::from_secs(20));
    assert_exactly_once(&output, &gen.expected_keys);
    // The correlation id travels from the payload field to an output header.
    for m in &output {
        let v: serde_json::Value = serde_json::from_slice(m.payload().expect("payload")).expect("json");
        assert_eq!(header(m, "correlation_id").as_deref(), v["correlation_id"].as_str());
        assert_eq!(header(m, "tally.idempotency_key"), Some(business_key(m)));
    }
    let stopped = events(&lines, "tally stopped");
    assert_eq!(stopped.len(), 1);
    assert_eq!(stopped[0]["records_in"], gen.records.len() as u64);
    assert_eq!(stopped[0]["duplicates"], gen.expected_duplicates());
}

#[test]
fn without_repartition_repushed_duplicates_on_other_partitions_leak() {
    // The control for the test above: the same kind of input, no repartition step. Re-pushes with
    // new message keys land on other partitions, whose tasks have never seen their key.
    let names = Names::new("norepart");
    create_topics(&[(&names.input, 3), (&names.output, 3), (&names.dlq, 1)]);
    let gen = generator::payments(600, 0, 0, 13);
    produce(&names.input, &gen.records);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology_with(dir.path(), &names, 65536, false);
    let tally = Tally::start(&topology, "i1", dir.path().join("tally.log"));
    let lines_before_stop = wait_for_count(&names.output, gen.expected_keys.len(), Duration::from_secs(120));
    assert!(lines_before_stop >= gen.expected_keys.len());
    let lines = tally.stop();
    let s = events(&lines, "tally stopped")[0];
    assert_eq!(s["records_in"], gen.records.len() as u64);
    let output = read_committed(&names.output, gen.expected_keys.len(), Duration::from_secs(20));
    let unique: BTreeSet<String> = output.iter().map(business_key).collect();
    assert_eq!(unique.len(), gen.expected_keys.len(), "every key still arrives");
    assert!(
        output.len() > gen.expected_keys.len(),
        "without repartition some duplicates must leak ({} outputs for {} keys)",
        output.len(),
        gen.expected_keys.len()
    );
}

#[test]
fn a_co_partitioned_source_is_deduplicated_without_a_hop_and_a_misplaced_record_is_counted() {
    let names = Names::new("copart");
    create_topics(&[(&names.input, 3), (&names.output, 3), (&names.dlq, 1)]);
    let mut gen = generator::payments(1500, 0, 0, 17);
    // The gateway keys every event, re-pushes included, by its payment id, as a Java producer.
    for r in &mut gen.records {
        let v: serde_json::Value = serde_json::from_slice(&r.payload).expect("json");
        r.key = v["payment_id"].as_str().expect("payment id").as_bytes().to_vec();
    }
    produce_partitioned(&names.input, &gen.records, "murmur2_random");
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = free_address();
    let http = [("TALLY_HTTP_ADDRESS", addr.clone())];
    let tally = Tally::start_example_with("payments-keyed.yaml", &names, dir.path(), "i1", &http);
    let expected = gen.expected_keys.len();
    assert_eq!(
        wait_for_count(&names.output, expected, Duration::from_secs(120)),
        expected
    );

    // A copy of a passed event on another partition than its key's: that partition's task has
    // never seen it, so it passes again; the check counts it and says so.
    let copy = gen.records[0].clone();
    let belongs = tally::topology::partitioner::Partitioner::Murmur2
        .partition(&copy.key, 3)
        .expect("partition");
    produce_to(&names.input, (belongs + 1) % 3, &[copy]);
    assert_eq!(
        wait_for_count(&names.output, expected + 1, Duration::from_secs(60)),
        expected + 1
    );
    let misplaced = || {
        let body = http_get(&addr, "/metrics").map(|(_, b)| b).unwrap_or_default();
        sample(&body, "tally_records_misplaced_total", r#"pipeline="payments""#)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while misplaced() != Some(1.0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(misplaced(), Some(1.0));
    let lines = tally.stop();
    let said = events(
        &lines,
        "a record of a co-partitioned source is on another partition than its key's",
    );
    assert_eq!(said.len(), 1, "said once");
    assert_eq!(said[0]["belongs_to"], belongs);
    assert_eq!(
        events(&lines, "tally stopped")[0]["records_in"],
        gen.records.len() as u64 + 1
    );

    let output = read_committed(&names.output, expected + 1, Duration::from_secs(20));
    let keys: BTreeSet<String> = output.iter().map(business_key).collect();
    assert_eq!(
        (output.len(), keys.len()),
        (expected + 1, expected),
        "only the misplaced copy twice"
    );
    let topics = client()
        .create::<rdkafka::consumer::BaseConsumer>()
        .expect("client")
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata");
    let hop = format!("{}-payments-repartition", names.app);
    assert!(topics.topics().iter().all(|t| t.name() != hop), "no repartition topic");
}

#[test]
fn bad_records_go_to_the_dead_letter_topic_and_counts_add_up() {
    let names = Names::new("dlq");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let max_bytes = 2048;
    let gen = generator::payments(800, 150, max_bytes, 23);
    let poison_total: u64 = gen.poison.values().sum();
    assert!(
        gen.poison.len() == 4,
        "every poison kind is generated: {:?}",
        gen.poison
    );
    produce(&names.input, &gen.records);

    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, max_bytes);
    let tally = Tally::start(&topology, "i1", dir.path().join("tally.log"));
    let got = wait_for_count(&names.dlq, poison_total as usize, Duration::from_secs(120));
    assert_eq!(got as u64, poison_total);
    wait_for_count(&names.output, gen.expected_keys.len(), Duration::from_secs(60));
    let lines = tally.stop();

    let dlq = read_committed(&names.dlq, poison_total as usize, Duration::from_secs(20));
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    let poison_payloads: BTreeSet<&[u8]> = gen
        .records
        .iter()
        .filter(|r| r.key.starts_with(b"poison-"))
        .map(|r| r.payload.as_slice())
        .collect();
    for m in &dlq {
        *reasons
            .entry(header(m, "tally.error.reason").expect("reason header"))
            .or_default() += 1;
        assert!(
            poison_payloads.contains(m.payload().expect("original bytes")),
            "DLQ keeps the original bytes"
        );
        assert_eq!(header(m, "tally.source.topic").as_deref(), Some(names.input.as_str()));
        assert!(header(m, "tally.source.offset").is_some_and(|o| o.parse::<i64>().is_ok()));
        assert!(
            header(m, "message_id").is_some_and(|id| id.starts_with("poison-")),
            "original headers kept"
        );
        assert!(header(m, "tally.error.detail").is_some());
        assert!(header(m, "correlation_id").is_some());
    }
    let expected: BTreeMap<String, u64> = gen.poison.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    assert_eq!(reasons, expected);

    let output = read_committed(&names.output, gen.expected_keys.len(), Duration::from_secs(20));
    assert_exactly_once(&output, &gen.expected_keys);
    let s = events(&lines, "tally stopped")[0];
    let (input, out, dup, dead) = (
        s["records_in"].as_u64().expect("in"),
        s["records_out"].as_u64().expect("out"),
        s["duplicates"].as_u64().expect("dup"),
        s["dead_lettered"].as_u64().expect("dlq"),
    );
    assert_eq!(input, gen.records.len() as u64);
    assert_eq!(out, gen.expected_keys.len() as u64);
    assert_eq!(dead, poison_total);
    assert_eq!(input, out + dup + dead, "input = out + duplicates + dead-lettered");
}

#[test]
fn sigkill_mid_run_then_restart_loses_nothing_and_restores_only_the_tail() {
    let names = Names::new("kill");
    create_topics(&[(&names.input, 3), (&names.output, 3), (&names.dlq, 1)]);
    let gen = generator::payments(100_000, 0, 0, 5);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 65536);

    // The input is all there, so the first instance is busy when the kill lands: a transaction
    // with outputs and store writes is open.
    produce(&names.input, &gen.records);
    let first = Tally::start(&topology, "i1", dir.path().join("first.log"));
    // Killed early, once every stateful task has committed outputs, for the restore assertions
    // below (a task with nothing committed restores from the start, rightly): outputs are keyed
    // like the repartition topic, so output partition p comes from task p.
    let target = gen.expected_keys.len() / 10;
    let (reader, _) = committed_reader(&names.output, false);
    // Outputs become readable when the broker commits, a moment before the store applies that
    // transaction: a kill in between leaves a task that committed once with an empty store (a
    // full restore, rightly). So each output partition must also show a second transaction (an
    // offset skipped between two records is the first one's commit marker), which its task
    // began only after its store had applied the first.
    let mut last: HashMap<i32, i64> = HashMap::new();
    let (mut got, mut second_transaction) = (0, HashSet::new());
    let deadline = Instant::now() + Duration::from_secs(120);
    while (got < target || second_transaction.len() < 3) && Instant::now() < deadline {
        if let Some(m) = reader.poll(Duration::from_millis(50)) {
            let m = m.expect("read");
            if last
                .insert(m.partition(), m.offset())
                .is_some_and(|prev| m.offset() > prev + 1)
            {
                second_transaction.insert(m.partition());
            }
            got += 1;
        }
    }
    assert!(
        got >= target && second_transaction.len() == 3,
        "first run committed twice on every task ({got} outputs, partitions {second_transaction:?})"
    );
    first.kill();
    let partial = read_committed(&names.output, 0, Duration::from_secs(10)).len();
    assert!(partial < gen.expected_keys.len(), "killed before the end ({partial})");
    // What the first instance committed to the changelog; its open transaction stays invisible.
    let changelog = read_committed(&names.changelog("payments"), 0, Duration::from_secs(20));

    let second = Tally::start(&topology, "i1", dir.path().join("second.log"));
    let got = wait_for_count(&names.output, gen.expected_keys.len(), Duration::from_secs(180));
    assert_eq!(got, gen.expected_keys.len());
    let lines = second.stop();
    let output = read_committed(&names.output, gen.expected_keys.len(), Duration::from_secs(20));
    assert_exactly_once(&output, &gen.expected_keys);

    // Restore: each partition resumed from its recorded changelog offset (no wipe, no full
    // restore) and applied exactly the committed changelog records after it.
    let restores = events(&lines, "restore finished");
    assert_eq!(restores.len(), 3, "one restore per task");
    for r in restores {
        let partition = r["partition"].as_i64().expect("partition") as i32;
        let from = r["from_offset"].as_i64().expect("from_offset");
        assert!(from > 0, "partition {partition} had a recorded offset: no full restore");
        assert_eq!(r["wiped"], false);
        let tail = changelog
            .iter()
            .filter(|m| m.partition() == partition && m.offset() >= from)
            .count() as u64;
        let written_before = changelog
            .iter()
            .filter(|m| m.partition() == partition && m.offset() < from)
            .count();
        assert!(written_before > 0, "the store kept what it had before the kill");
        eprintln!("partition {partition}: store kept {written_before} changelog records, resumed at offset {from}, restored {tail}");
        assert_eq!(
            r["restored"].as_u64(),
            Some(tail),
            "partition {partition}: restored = committed tail"
        );
    }
}
