//! Throughput of the payments topology with exactly-once on the real broker.
//!
//! Run with `scripts/bench` (starts and stops the broker). Preloads the input, then times one
//! `tally run` from process start until the last output record is readable with read_committed.

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use std::time::{Duration, Instant};
use tally::demo::generator;

fn main() {
    let business_events: usize = std::env::var("TALLY_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let partitions: i32 = std::env::var("TALLY_BENCH_PARTITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let names = Names::new("bench");
    create_topics(&[(&names.input, partitions), (&names.output, partitions), (&names.dlq, 1)]);
    let gen = generator::payments(business_events, 0, 0, 99);
    let records = gen.records.len();
    let t = Instant::now();
    produce(&names.input, &gen.records);
    eprintln!(
        "preloaded {records} records ({business_events} business events) in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let (consumer, _) = committed_reader(&names.output, false);

    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 65536);
    let started = Instant::now();
    let tally = Tally::start(&topology, "bench", dir.path().join("tally.log"));
    let mut seen = 0usize;
    let mut first_output = None;
    while seen < gen.expected_keys.len() {
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "bench timed out at {seen} outputs"
        );
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            m.expect("read output");
            first_output.get_or_insert_with(Instant::now);
            seen += 1;
        }
    }
    let total = started.elapsed().as_secs_f64();
    let steady = first_output.map_or(total, |f| f.elapsed().as_secs_f64());
    let lines = tally.stop();
    let stopped = events(&lines, "tally stopped");
    let s = stopped.first().expect("summary line");
    assert_eq!(s["records_in"].as_u64(), Some(records as u64));
    println!(
        "throughput: {records} input records ({} unique, {} duplicates), {partitions} partitions, exactly-once, commit 100 ms",
        gen.expected_keys.len(),
        gen.expected_duplicates()
    );
    println!(
        "  wall time from process start: {total:.2}s  -> {:.0} input records/s",
        records as f64 / total
    );
    println!(
        "  from first output to last:   {steady:.2}s  -> {:.0} input records/s",
        records as f64 / steady
    );
}
