//! Reads a topic from its beginning to the end it had when reading started (read_committed),
//! so a reconciliation of a topic that is still being written terminates.

use anyhow::{anyhow, bail, Context, Result};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A read that gets nothing for this long has stalled.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Metadata and watermark requests give up after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Settings the reader needs as they are; `--kafka-property` may not change them.
const RESERVED: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "isolation.level",
    "enable.partition.eof",
    "enable.auto.commit",
    "enable.auto.offset.store",
];

/// Defaults the user's properties may override. A full fetch queue pauses a partition's
/// fetching for `fetch.queue.backoff.ms`, 1 s by default, while the reader drains the queue in a
/// fraction of that: reading a topic of 10M records waited so for most of its 60 s (13-15 s
/// with 10 ms; docs/reconciliation.md). Each reader of a topic read in parallel has a queue of
/// its own: 4 MiB instead of librdkafka's 64 MiB read as fast, at 232 MB peak RSS instead of
/// 312 MB with 16 MiB (three readers).
const DEFAULTS: &[(&str, &str)] = &[("fetch.queue.backoff.ms", "10"), ("queued.max.messages.kbytes", "4096")];

/// The client configuration for `bootstrap` with the user's extra librdkafka `properties`
/// (TLS, SASL, …).
pub fn client_config(bootstrap: &str, properties: &[(String, String)]) -> Result<ClientConfig> {
    let mut c = ClientConfig::new();
    for (k, v) in DEFAULTS {
        c.set(*k, *v);
    }
    for (k, v) in properties {
        if RESERVED.contains(&k.as_str()) {
            bail!(
                "--kafka-property `{k}` is set by tally reconcile itself (use --bootstrap for the brokers); remove it"
            );
        }
        c.set(k, v);
    }
    c.set("bootstrap.servers", bootstrap)
        .set("group.id", "tally-reconcile")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    Ok(c)
}

/// Hands every committed record of `topic` below each partition's end at the start to `each`.
/// The consumer is assigned, never joins a group and commits nothing.
pub fn read_to_end(
    config: &ClientConfig,
    topic: &str,
    each: &mut dyn FnMut(&BorrowedMessage<'_>) -> Result<()>,
) -> Result<()> {
    let consumer = consumer(config)?;
    let ranges = ranges(&consumer, topic)?;
    read_ranges(&consumer, topic, &ranges, &AtomicBool::new(false), each)
}

/// Reads `topic` as [`read_to_end`] does, its partitions dealt out to at most `readers`
/// consumers, each reading on a thread of its own into its own state, made by `start` and fed
/// by `each`. Returns the states, or the first error, which stops the other readers.
pub fn read_to_end_in_parallel<S: Send>(
    config: &ClientConfig,
    topic: &str,
    readers: usize,
    start: &(dyn Fn() -> S + Sync),
    each: &(dyn Fn(&mut S, &BorrowedMessage<'_>) -> Result<()> + Sync),
) -> Result<Vec<S>> {
    let ranges = ranges(&consumer(config)?, topic)?;
    let count = readers.clamp(1, ranges.len().max(1));
    let mut shares: Vec<Vec<Range>> = vec![Vec::new(); count];
    for (i, range) in ranges.into_iter().enumerate() {
        shares[i % count].push(range);
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let handles: Vec<_> = shares
            .iter()
            .filter(|share| !share.is_empty())
            .map(|share| {
                let stop = &stop;
                scope.spawn(move || {
                    let mut state = start();
                    let read = consumer(config)
                        .and_then(|c| read_ranges(&c, topic, share, stop, &mut |m| each(&mut state, m)));
                    if read.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    read.map(|()| state)
                })
            })
            .collect();
        let mut states = Vec::with_capacity(handles.len());
        let mut failed = None;
        for handle in handles {
            match handle.join() {
                Ok(Ok(state)) => states.push(state),
                Ok(Err(e)) => failed = failed.or(Some(e)),
                Err(_) => failed = failed.or(Some(anyhow!("a reader of topic `{topic}` panicked"))),
            }
        }
        failed.map_or(Ok(states), Err)
    })
}

/// A partition to read: its number, the offset to start at and the end taken at the start.
#[derive(Debug, Clone, Copy)]
struct Range {
    partition: i32,
    start: i64,
    end: i64,
}

fn consumer(config: &ClientConfig) -> Result<BaseConsumer<Reader>> {
    config
        .create_with_context(Reader)
        .context("cannot create a Kafka consumer; check --kafka-property")
}

/// The partitions of `topic` that hold records, with their ends now.
fn ranges(consumer: &BaseConsumer<Reader>, topic: &str) -> Result<Vec<Range>> {
    let metadata = consumer.fetch_metadata(Some(topic), REQUEST_TIMEOUT).with_context(|| {
        format!("cannot read the metadata of topic `{topic}`; is the broker reachable (--bootstrap, KAFKA_BOOTSTRAP)?")
    })?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        bail!("topic `{topic}` does not exist or has no partitions");
    }
    let mut ranges = Vec::with_capacity(partitions.len());
    for partition in partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, REQUEST_TIMEOUT)
            .with_context(|| format!("cannot read the end offsets of topic `{topic}` partition {partition}"))?;
        if high > low {
            ranges.push(Range {
                partition,
                start: low,
                end: high,
            });
        }
    }
    Ok(ranges)
}

/// Reads `ranges` of `topic` with `consumer`, until each is done or `stop` is set.
fn read_ranges(
    consumer: &BaseConsumer<Reader>,
    topic: &str,
    ranges: &[Range],
    stop: &AtomicBool,
    each: &mut dyn FnMut(&BorrowedMessage<'_>) -> Result<()>,
) -> Result<()> {
    if ranges.is_empty() {
        return Ok(());
    }
    // A partition is done at the first of: a record at or past its end taken at the start, or an
    // end-of-partition event, which read_committed raises at the last stable offset, so a
    // transaction still open is never waited for.
    let mut ends: HashMap<i32, i64> = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for r in ranges {
        ends.insert(r.partition, r.end);
        assignment.add_partition_offset(topic, r.partition, Offset::Offset(r.start))?;
    }
    consumer
        .assign(&assignment)
        .with_context(|| format!("cannot assign the partitions of topic `{topic}`"))?;
    let mut idle_since = Instant::now();
    while !ends.is_empty() && !stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                idle_since = Instant::now();
                let Some(&end) = ends.get(&m.partition()) else {
                    continue;
                };
                if m.offset() < end {
                    each(&m)?;
                }
                if m.offset() >= end - 1 {
                    ends.remove(&m.partition());
                }
            }
            // The end of what is committed now, which is at least the end taken at the start.
            Some(Err(KafkaError::PartitionEOF(p))) => {
                idle_since = Instant::now();
                ends.remove(&p);
            }
            Some(Err(KafkaError::MessageConsumption(code))) if transient(code) => {
                tracing::warn!(topic, error = %code, "reading the topic: retrying");
            }
            Some(Err(e)) => bail!("reading topic `{topic}`: {e}"),
            None if idle_since.elapsed() > STALL_TIMEOUT => {
                let mut left: Vec<i32> = ends.keys().copied().collect();
                left.sort_unstable();
                bail!(
                    "reading topic `{topic}` stalled: nothing arrived for {} s from partition(s) {left:?}; \
                     is the broker reachable?",
                    STALL_TIMEOUT.as_secs()
                );
            }
            None => {}
        }
    }
    Ok(())
}

/// The reader's client context: librdkafka also hands end-of-partition events, which the
/// reader asks for and handles, to the error callback; they are not errors, so they are not
/// logged as such.
struct Reader;

impl ClientContext for Reader {
    fn error(&self, error: KafkaError, reason: &str) {
        if !matches!(error, KafkaError::Global(RDKafkaErrorCode::PartitionEOF)) {
            tracing::error!("librdkafka: {error}: {reason}");
        }
    }
}

impl ConsumerContext for Reader {}

/// Errors a consumer recovers from by itself (reconnecting); the stall timeout bounds them.
fn transient(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::OperationTimedOut
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reader_settings_cannot_be_overridden_but_others_pass_through() {
        let props = vec![
            ("security.protocol".to_string(), "SASL_SSL".to_string()),
            ("sasl.mechanism".to_string(), "PLAIN".to_string()),
        ];
        let c = client_config("b:9092", &props).expect("config");
        assert_eq!(c.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(c.get("isolation.level"), Some("read_committed"));
        assert_eq!(c.get("bootstrap.servers"), Some("b:9092"));
        let bad = vec![("isolation.level".to_string(), "read_uncommitted".to_string())];
        let err = client_config("b:9092", &bad).expect_err("reserved");
        assert!(err.to_string().contains("isolation.level"), "{err}");
    }

    #[test]
    fn the_fetch_defaults_give_way_to_the_users_settings() {
        let c = client_config("b:9092", &[]).expect("config");
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("10"));
        let mine = vec![("fetch.queue.backoff.ms".to_string(), "100".to_string())];
        let c = client_config("b:9092", &mine).expect("config");
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("100"));
    }
}
