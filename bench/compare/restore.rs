//! Restore speed: tally rebuilding an empty dedup store from a changelog of N entries, versus a
//! raw read_committed consume of the same changelog: 10 ms fetch waits like tally's restore
//! consumer, librdkafka's fetch sizes (1 MiB per partition, 64 MiB queue), which read faster
//! here than tally's 16 MiB fetches do without a store to write (263-295k records/s against
//! 368-725k).

use crate::contender::{self, Contender, Passes, Programs, RunNames};
use crate::kafka;
use crate::workload::Topology;
use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::Producer;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::path::Path;
use std::time::{Duration, Instant};
use tally::processors::dedup::DedupEntry;
use tally::store::codec;

/// One restore run of each side.
#[derive(Debug, Clone, Copy)]
pub struct RestoreSample {
    /// Records tally restored per second (from its `restore finished` log line).
    pub tally: f64,
    /// Records per second of the raw consume.
    pub raw: f64,
}

/// Writes a `records`-entry changelog once, then times `runs` interleaved raw reads and tally
/// restores into a fresh state directory.
pub fn run(records: usize, runs: usize, id: &str, programs: &Programs, log_dir: &Path) -> Result<Vec<RestoreSample>> {
    let input = format!("bench-{id}-in");
    let names = RunNames::new(id, &input);
    // payments.yaml's dedup store of pipeline `payments`, one partition like its input.
    let changelog = format!("{}-payments-dedup-changelog", names.app);
    kafka::create_topics(&[(&input, 1), (&names.output, 1), (&names.dlq, 1)], &[])?;
    kafka::create_topics(&[(&changelog, 1)], &[("cleanup.policy", "compact")])?;
    let value = codec::encode(&DedupEntry {
        first_seen_ms: 1_764_000_000_000,
    })?;
    let producer = kafka::producer(50)?;
    for i in 0..records {
        kafka::send(&producer, &changelog, format!("PAY-{i:09}:PAID").as_bytes(), &value)?;
    }
    producer.flush(Duration::from_secs(120))?;
    let mut samples = Vec::new();
    for r in 0..runs {
        let raw = raw_consume(&changelog, records)?;
        let tally = tally_restore(&names, records, programs, log_dir, r)?;
        eprintln!(
            "bench: restore run {}: tally {tally:.0} records/s, raw consume {raw:.0} records/s",
            r + 1
        );
        samples.push(RestoreSample { tally, raw });
    }
    kafka::delete_prefixed(&names.app)?;
    Ok(samples)
}

fn raw_consume(topic: &str, records: usize) -> Result<f64> {
    let started = Instant::now();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka::bootstrap())
        .set("group.id", "tally-bench-raw-restore")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .set("fetch.max.bytes", "52428800")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut n = 0usize;
    while n < records {
        if started.elapsed() > Duration::from_secs(600) {
            bail!("raw consume read {n} of {records} records in 600 s");
        }
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            m.context("reading the changelog")?;
            n += 1;
        }
    }
    Ok(records as f64 / started.elapsed().as_secs_f64())
}

fn tally_restore(names: &RunNames, records: usize, programs: &Programs, log_dir: &Path, run: usize) -> Result<f64> {
    // Same application id every run, fresh state directory: each run restores the whole changelog.
    let mut proc = contender::start(
        Contender::Tally,
        Topology::Payments,
        names,
        1,
        Passes::ONE,
        programs,
        log_dir,
    )?;
    let log = proc.log.clone();
    let deadline = Instant::now() + Duration::from_secs(600);
    let line = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["message"] == "restore finished");
        if let Some(line) = found {
            break line;
        }
        proc.check_alive()?;
        if Instant::now() > deadline {
            bail!(
                "no `restore finished` after 600 s (run {run}); log tail:\n{}",
                proc.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    proc.stop()?;
    let restored = line["restored"].as_u64().context("restore line without `restored`")?;
    let elapsed_ms = line["elapsed_ms"]
        .as_u64()
        .context("restore line without `elapsed_ms`")?;
    if restored != records as u64 {
        bail!("tally restored {restored} of {records} records");
    }
    Ok(restored as f64 / (elapsed_ms.max(1) as f64 / 1000.0))
}
