//! The global ID-mapping store with many mappings: how long an instance takes to load the
//! compacted mappings topic into its RocksDB store on a first start and on a restart (which
//! reads only what the store has not seen), and its peak resident memory each time.
//!
//! Run with `cargo bench --locked --bench mappings` against a running broker (`KAFKA_BOOTSTRAP`,
//! default 127.0.0.1:9092). `TALLY_BENCH_MAPPINGS` links (default 1,000,000; each is two
//! records, `ext/erp/<id>` and `int/<id>/erp`) are written to a 3-partition compacted topic, then
//! `topologies/crm-to-erp.yaml` starts three times: on an empty state directory, again on the
//! same one, and once more after 10% more links were written. Prints a Markdown table.

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 3;

fn main() {
    let links: usize = std::env::var("TALLY_BENCH_MAPPINGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let names = Names::new("mapbench");
    create_topics(&[
        (&names.input, 1),
        (&names.output, 1),
        (&names.dlq, 1),
        (&names.writeback, 1),
    ]);
    create_compacted(&names.mappings);
    let dir = tempfile::tempdir().expect("tempdir");

    let written = Instant::now();
    write_links(&names.mappings, 0..links);
    eprintln!(
        "bench: {links} links ({} records) written in {:.1} s",
        2 * links,
        written.elapsed().as_secs_f64()
    );
    let mut rows = vec![load(
        "first start, empty state directory",
        &names,
        dir.path(),
        2 * links,
    )];
    rows.push(load("restart on the same state directory", &names, dir.path(), 0));
    let more = links / 10;
    write_links(&names.mappings, links..links + more);
    rows.push(load(
        &format!("restart after {more} more links"),
        &names,
        dir.path(),
        2 * more,
    ));

    println!("| run | records applied | load time | records/s | peak RSS |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {:.1} s | {:.0} | {} MiB |",
            r.run,
            r.applied,
            r.elapsed_ms as f64 / 1000.0,
            r.applied as f64 / (r.elapsed_ms.max(1) as f64 / 1000.0),
            r.peak_rss_kib / 1024
        );
    }
}

fn create_compacted(topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let topic = NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(1)).set("cleanup.policy", "compact");
    for r in rt
        .block_on(admin.create_topics(&[topic], &AdminOptions::new()))
        .expect("create the mappings topic")
    {
        r.expect("mappings topic created");
    }
}

/// Writes both records of each link `i`: ERP id `E<i>` of internal id `I<i>`, keyed so each
/// record lands where tally's own write-back would put it.
fn write_links(topic: &str, links: std::ops::Range<usize>) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("linger.ms", "50")
        .set("compression.type", "lz4")
        .create()
        .expect("producer");
    for i in links {
        let (internal, external) = (format!("I{i:09}"), format!("E{i:09}"));
        let records = [
            (format!("ext/erp/{external}"), internal.clone()),
            (format!("int/{internal}/erp"), external),
        ];
        for (key, value) in &records {
            let mut record = BaseRecord::to(topic).key(key).payload(value);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        record = back;
                        producer.poll(Duration::from_millis(10));
                    }
                }
            }
        }
    }
    producer.flush(Duration::from_secs(300)).expect("flush");
}

struct Row {
    run: String,
    applied: u64,
    elapsed_ms: u64,
    peak_rss_kib: u64,
}

/// Starts tally on `state`, waits for its `ID mappings loaded` line, reads its peak RSS, stops.
fn load(run: &str, names: &Names, state: &std::path::Path, expected: usize) -> Row {
    let tally = Tally::start_example("crm-to-erp.yaml", names, state, "i1");
    let deadline = Instant::now() + Duration::from_secs(900);
    let line = loop {
        if let Some(line) = events(&tally.lines(), "ID mappings loaded").first() {
            break (*line).clone();
        }
        assert!(Instant::now() < deadline, "no `ID mappings loaded` within 900 s");
        std::thread::sleep(Duration::from_millis(200));
    };
    // Loaded, and the stream thread joined and opened its tasks: the steady state after start.
    std::thread::sleep(Duration::from_secs(5));
    let peak_rss_kib = vm_hwm_kib(tally.pid());
    tally.stop();
    let applied = line["applied"].as_u64().expect("applied");
    assert_eq!(applied, expected as u64, "{run}: records applied");
    let row = Row {
        run: run.to_string(),
        applied,
        elapsed_ms: line["elapsed_ms"].as_u64().expect("elapsed_ms"),
        peak_rss_kib,
    };
    eprintln!(
        "bench: {run}: {} records in {} ms, peak RSS {} KiB",
        row.applied, row.elapsed_ms, row.peak_rss_kib
    );
    row
}

/// The process's peak resident set (VmHWM), in KiB.
fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}
