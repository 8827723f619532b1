//! Partitions with a backlog are read side by side on the real broker: no partition waits for
//! the others to catch up (librdkafka's shared fetch queue served them one or two at a time).

mod common;

use common::*;
use std::collections::BTreeMap;
use std::time::Duration;
use tally::demo::generator::GeneratedRecord;

/// Records per source partition: about 6 MiB each at ~1 KiB, three times the stream consumer's
/// 2 MiB queue, so every partition has a backlog for many fetches.
const PER_PARTITION: usize = 6_000;

#[test]
fn source_partitions_with_a_backlog_are_processed_side_by_side() {
    let names = Names::new("fairness");
    create_topics(&[(&names.input, 3), (&names.output, 3), (&names.dlq, 1)]);
    for partition in 0..3 {
        let first = partition as usize * PER_PARTITION;
        produce_to(&names.input, partition, &padded_payments(first..first + PER_PARTITION));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 65536);
    let debug_commits = [(
        "RUST_LOG",
        "info,librdkafka=warn,tally::engine::producer=debug".to_string(),
    )];
    let tally = Tally::start_with_env(&topology, "a", dir.path().join("a.log"), &debug_commits);
    let total = 3 * PER_PARTITION;
    assert_eq!(
        wait_for_count(&names.output, total, Duration::from_secs(180)),
        total,
        "every payment comes out"
    );
    let lines = tally.stop();

    // Each commit's offsets of the source partitions, as they stand after it.
    let mut position: BTreeMap<String, i64> = BTreeMap::new();
    let mut judged = None;
    for commit in events(&lines, "transaction committed") {
        let offsets = commit["offsets"].as_str().expect("a commit logs its offsets");
        for (partition, offset) in parse_offsets(offsets) {
            if partition.starts_with(&format!("{}[", names.input)) {
                position.insert(partition, offset);
            }
        }
        let done: i64 = position.values().sum();
        if done >= total as i64 / 3 {
            judged = Some(position.clone());
            break;
        }
    }
    let judged = judged.expect("commits logged up to a third of the input");
    let least = (0..3)
        .map(|p| judged.get(&format!("{}[{p}]", names.input)).copied().unwrap_or(0))
        .min()
        .unwrap_or(0);
    let most = judged.values().copied().max().unwrap_or(0);
    // Read side by side, each partition is near a third of the way at that commit; read one or
    // two at a time, the last one has not started.
    assert!(
        least * 4 >= most,
        "when a third of the input was processed, the partitions stood at {judged:?}: one waited for the others"
    );
}

/// `payment.paid` events of about 1 KiB each.
fn padded_payments(range: std::ops::Range<usize>) -> Vec<GeneratedRecord> {
    let pad = "x".repeat(900);
    payments(range)
        .into_iter()
        .map(|mut r| {
            let mut value: serde_json::Value = serde_json::from_slice(&r.payload).expect("payment json");
            value["note"] = serde_json::Value::String(pad.clone());
            r.payload = value.to_string().into_bytes();
            r
        })
        .collect()
}

/// `topic[partition]=Offset(n)` pairs of a commit's log line.
fn parse_offsets(offsets: &str) -> Vec<(String, i64)> {
    offsets
        .split(',')
        .filter_map(|entry| {
            let (partition, offset) = entry.split_once("=Offset(")?;
            Some((partition.to_string(), offset.trim_end_matches(')').parse().ok()?))
        })
        .collect()
}
