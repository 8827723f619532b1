//! Partitions with a backlog are read side by side on the real broker: no partition waits for
//! the others to catch up (librdkafka's shared fetch queue served them one or two at a time).

mod common;

use common::*;
use std::time::Duration;
use tally::demo::generator::GeneratedRecord;

/// Records per source partition: about 20 MiB each at ~1 KiB, so every partition has a backlog
/// for many fetches and several commits.
const PER_PARTITION: usize = 20_000;

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

    // After each commit, how far the most advanced source partition is ahead of the least.
    let mut position = [0i64; 3];
    let mut worst = (0, position);
    for commit in events(&lines, "transaction committed") {
        let offsets = commit["offsets"].as_str().expect("a commit logs its offsets");
        for (partition, offset) in parse_offsets(offsets) {
            for (p, at) in position.iter_mut().enumerate() {
                if partition == format!("{}[{p}]", names.input) {
                    *at = offset;
                }
            }
        }
        let ahead = position.iter().max().unwrap_or(&0) - position.iter().min().unwrap_or(&0);
        if ahead > worst.0 {
            worst = (ahead, position);
        }
    }
    assert_eq!(
        position, [PER_PARTITION as i64; 3],
        "the commits logged cover the whole input"
    );
    // Read side by side, the partitions stay within a fetch or two of each other (about 1,000
    // records each); read one or two at a time, the last waits for thousands.
    assert!(
        worst.0 <= PER_PARTITION as i64 / 4,
        "the source partitions stood at {:?} after one commit: one waited for the others",
        worst.1
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
