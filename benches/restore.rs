//! Restore speed: a changelog of 1M dedup entries restored into an empty store.
//!
//! Run with `scripts/bench` (starts and stops the broker). Writes the changelog directly, starts
//! `tally run` with an empty state directory, sends one input record so the task opens, and
//! reads the figures from tally's `restore finished` log line.

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use std::time::{Duration, Instant};
use tally::demo::generator::GeneratedRecord;
use tally::processors::dedup::DedupEntry;
use tally::store::codec;

fn main() {
    let records: usize = std::env::var("TALLY_BENCH_RESTORE_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let names = Names::new("restore");
    create_topics(&[(&names.input, 1), (&names.output, 1), (&names.dlq, 1)]);
    let changelog = names.changelog("payments");
    create_topics(&[(&changelog, 1)]);

    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("linger.ms", "50")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer");
    let value = codec::encode(&DedupEntry {
        first_seen_ms: 1_764_000_000_000,
    })
    .expect("encode");
    let t = Instant::now();
    for i in 0..records {
        let key = format!("PAY-{i:09}:PAID");
        let mut rec = BaseRecord::<[u8], [u8]>::to(&changelog)
            .partition(0)
            .key(key.as_bytes())
            .payload(&value);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((_, back)) => {
                    rec = back;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(120)).expect("flush changelog");
    eprintln!("wrote {records} changelog records in {:.1}s", t.elapsed().as_secs_f64());

    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology_with(dir.path(), &names, 65536, false);
    let tally = Tally::start(&topology, "restore", dir.path().join("tally.log"));
    produce(
        &names.input,
        &[GeneratedRecord {
            key: b"k".to_vec(),
            payload: br#"{"event_type":"payment.completed","payment_id":"X","status":"PAID"}"#.to_vec(),
            headers: vec![],
        }],
    );
    assert_eq!(wait_for_count(&names.output, 1, Duration::from_secs(600)), 1);
    let lines = tally.stop();
    let done = events(&lines, "restore finished");
    let r = done.first().expect("restore line");
    assert_eq!(
        r["restored"].as_u64(),
        Some(records as u64),
        "every changelog record restored"
    );
    println!(
        "restore: {} records in {} ms -> {} records/s (store {}, from offset {})",
        r["restored"], r["elapsed_ms"], r["records_per_second"], r["store"], r["from_offset"]
    );
}
