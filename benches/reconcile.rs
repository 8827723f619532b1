//! Offline reconciliation of millions of keys: wall time and peak memory of one
//! `tally reconcile offline` run under `/usr/bin/time -v`.
//!
//! Run with `cargo bench --locked --bench reconcile` against a running broker (or `scripts/bench`,
//! which starts one). Writes a sent JSON Lines file of `TALLY_BENCH_RECONCILE_KEYS` keys (default
//! 2,000,000) and an output topic (3 partitions) holding the same keys in the
//! `tally.idempotency_key` header, except 10 withheld keys, plus 10 ghosts and 10 keys written
//! twice, then checks the report names exactly those. The topic is deleted after the run (the
//! broker frees its files a minute later: about 1.5 GB for 10M keys).

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use std::io::{BufWriter, Write};
use std::process::Command;
use std::time::{Duration, Instant};

const ANOMALIES: usize = 10;

fn key(i: usize) -> String {
    format!("PAY-{i:09}:PAID")
}

fn main() {
    let keys: usize = std::env::var("TALLY_BENCH_RECONCILE_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    let names = Names::new("reconbench");
    create_topics(&[(&names.output, 3)]);
    let dir = tempfile::tempdir().expect("tempdir");

    let sent = dir.path().join("sent.jsonl");
    let mut file = BufWriter::new(std::fs::File::create(&sent).expect("sent file"));
    for i in 0..keys {
        writeln!(file, r#"{{"idempotency_key":"{}","source":"gateway"}}"#, key(i)).expect("write");
    }
    file.flush().expect("flush sent file");
    drop(file);

    // Every `keys / ANOMALIES`-th key is withheld; the next one is written twice.
    let stride = keys / ANOMALIES;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("linger.ms", "50")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer");
    let t = Instant::now();
    let send = |k: &str| {
        let payload =
            format!(r#"{{"event_type":"payment.completed","payment_id":"{k}","status":"PAID","amount":12.34}}"#);
        let headers = OwnedHeaders::new().insert(Header {
            key: "tally.idempotency_key",
            value: Some(k),
        });
        let mut rec = BaseRecord::<[u8], [u8]>::to(&names.output)
            .key(k.as_bytes())
            .payload(payload.as_bytes())
            .headers(headers);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((_, back)) => {
                    rec = back;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
    };
    let mut written = 0usize;
    for i in 0..keys {
        if i % stride == 0 {
            continue;
        }
        send(&key(i));
        written += 1;
        if i % stride == 1 {
            send(&key(i));
            written += 1;
        }
    }
    for g in 0..ANOMALIES {
        send(&format!("GHOST-{g}"));
        written += 1;
    }
    producer.flush(Duration::from_secs(300)).expect("flush output");
    eprintln!(
        "wrote {keys} sent keys and {written} output records in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let report = dir.path().join("report.json");
    let out = Command::new("/usr/bin/time")
        .arg("-v")
        .arg(env!("CARGO_BIN_EXE_tally"))
        .args(["reconcile", "offline", "--no-progress", "--sent"])
        .arg(&sent)
        .args(["--processed", &names.output, "--report"])
        .arg(&report)
        .env("KAFKA_BOOTSTRAP", bootstrap())
        .output()
        .expect("run /usr/bin/time -v tally reconcile offline");
    delete_topic(&names.output);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "missing keys fail the run:\n{stderr}");
    let summary: serde_json::Value = std::fs::read_to_string(&report)
        .expect("report")
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .expect("summary line");
    assert_eq!(summary["sent_keys"], keys as u64);
    assert_eq!(summary["processed_records"], written as u64);
    for kind in ["missing", "ghost", "duplicate"] {
        assert_eq!(summary[kind], ANOMALIES as u64, "{kind}: {summary}");
    }
    let field = |name: &str| {
        stderr
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(str::trim)
            .unwrap_or("?")
            .to_string()
    };
    println!(
        "reconcile offline: {keys} sent keys vs {written} output records: wall {}, max RSS {} kB, user {} s, system {} s",
        field("Elapsed (wall clock) time (h:mm:ss or m:ss):"),
        field("Maximum resident set size (kbytes):"),
        field("User time (seconds):"),
        field("System time (seconds):"),
    );
}

/// Deletes the bench's topic; a failure only leaves it behind, so it is reported, not fatal.
fn delete_topic(topic: &str) {
    let admin: AdminClient<DefaultClientContext> = client().create().expect("admin client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let deleted = rt.block_on(admin.delete_topics(&[topic], &AdminOptions::new()));
    if let Err(e) = deleted.map_err(|e| e.to_string()).and_then(|mut r| match r.pop() {
        Some(Err((_, code))) => Err(code.to_string()),
        _ => Ok(()),
    }) {
        eprintln!("could not delete topic `{topic}`: {e}");
    }
}
