//! Feeds the global ID-mapping store: reads the whole compacted mappings topic at startup, then
//! tails it, on a thread of its own (like a Kafka Streams global stream thread).

use super::{clients, Shutdown};
use crate::metrics::Metrics;
use crate::store::GlobalMappings;
use crate::topology::Topology;
use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);
const GAUGE_INTERVAL: Duration = Duration::from_secs(5);

/// Starts the reader and returns once the store holds the whole topic as of startup.
pub fn start(
    t: &Topology,
    topic: &str,
    global: Arc<GlobalMappings>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) -> Result<std::thread::JoinHandle<()>> {
    let consumer: BaseConsumer = clients::restore_consumer(t)
        .create()
        .context("creating the ID-mapping reader")?;
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(15))
        .with_context(|| format!("reading metadata of the mappings topic `{topic}`"))?;
    let partitions = md.topics().first().map_or(0, |t| t.partitions().len()) as i32;
    let mut ends = HashMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(15))
            .with_context(|| format!("reading the end of `{topic}` partition {p}"))?;
        ends.insert(p, (low, high));
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl).context("assigning the mappings topic")?;
    // Catch up to the ends seen at startup before any stream thread looks ids up.
    let started = Instant::now();
    // The topic is written in transactions, so it ends with a commit marker the consumer never
    // hands out: a partition is read to its end when the consumer's position reaches the end
    // seen at startup, not when the last record's offset + 1 does.
    let mut caught_up: HashMap<i32, bool> = ends.iter().map(|(p, (low, high))| (*p, low >= high)).collect();
    let mut applied = 0u64;
    while !caught_up.values().all(|d| *d) {
        if started.elapsed() > CATCH_UP_TIMEOUT {
            bail!(
                "the mappings topic `{topic}` was not read to its end within {}s",
                CATCH_UP_TIMEOUT.as_secs()
            );
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                apply(&global, &m);
                applied += 1;
                if m.offset() + 1 >= ends.get(&m.partition()).map_or(0, |(_, high)| *high) {
                    caught_up.insert(m.partition(), true);
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                caught_up.insert(p, true);
            }
            Some(Err(e)) => tracing::warn!(error = %e, "reading the mappings topic"),
            None => {
                if let Ok(positions) = consumer.position() {
                    for el in positions.elements() {
                        let reached = el.offset().to_raw().unwrap_or(-1);
                        if ends.get(&el.partition()).is_some_and(|(_, high)| reached >= *high) {
                            caught_up.insert(el.partition(), true);
                        }
                    }
                }
            }
        }
    }
    global.set_ready();
    publish(&global, &metrics);
    tracing::info!(
        topic,
        applied,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "ID mappings loaded"
    );
    let handle = std::thread::Builder::new()
        .name("tally-global".into())
        .spawn(move || {
            let mut last_gauge = Instant::now();
            while !shutdown.is_triggered() {
                match consumer.poll(Duration::from_millis(200)) {
                    Some(Ok(m)) => apply(&global, &m),
                    Some(Err(KafkaError::PartitionEOF(_))) | None => {}
                    Some(Err(e)) => tracing::warn!(error = %e, "reading the mappings topic"),
                }
                if last_gauge.elapsed() >= GAUGE_INTERVAL {
                    publish(&global, &metrics);
                    last_gauge = Instant::now();
                }
            }
            publish(&global, &metrics);
        })
        .context("starting the ID-mapping reader thread")?;
    Ok(handle)
}

fn apply(global: &GlobalMappings, m: &rdkafka::message::BorrowedMessage<'_>) {
    let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
        return;
    };
    global.apply(key, m.payload().and_then(|v| std::str::from_utf8(v).ok()));
}

fn publish(global: &GlobalMappings, metrics: &Metrics) {
    let c = global.counts();
    metrics.idmap_mappings.set(c.mappings as i64);
    metrics.idmap_pending.set(c.pending as i64);
}
