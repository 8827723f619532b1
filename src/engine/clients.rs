//! Kafka client configurations: the user's properties, then the settings exactly-once needs.

use crate::topology::partitioner::Partitioner;
use crate::topology::{GroupProtocol, Topology};
use rdkafka::ClientConfig;
use std::time::Duration;

/// tally's `transaction.timeout.ms` unless the topology sets one.
const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 60_000;

/// How often librdkafka emits statistics. Only the stream consumers read them (consumer lag,
/// held-back partitions); any other client would hand each document to rust-rdkafka's default
/// handler, which parses it and logs it whole at info level (kilobytes per client and interval).
const STATISTICS_INTERVAL: &str = "statistics.interval.ms";

/// The stream consumers' statistics interval unless `kafka.properties` sets one.
const DEFAULT_STATISTICS_INTERVAL_MS: &str = "5000";

/// Bootstrap servers and the topology's pass-through properties, except the statistics
/// interval, which only the stream consumers get.
pub fn base(t: &Topology) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in &t.kafka.properties {
        if k != STATISTICS_INTERVAL {
            c.set(k, v);
        }
    }
    c.set("bootstrap.servers", &t.kafka.bootstrap_servers);
    c
}

/// The smallest per-partition fetch [`fetch_fairly`] gives: the batches librdkafka and the Java
/// producer write by default (`batch.size` 1,000,000 bytes) fit in it. A broker returns a batch
/// larger than a partition's limit only to the first partition of a response (KIP-74), so a
/// smaller limit can stall partitions instead of sharing among them: with 341 KiB each, the
/// latency benchmark's repartition partitions were again read largely one at a time.
const BATCH_FETCH: usize = 1024 * 1024;

/// The largest queue [`fetch_fairly`] grows to, librdkafka's own default: past it, a member
/// that holds more partitions than that many batches is fair only between fetches.
const FAIR_QUEUE_CEILING: usize = 64 * 1024 * 1024;

/// The group consumer of a stream thread, which may be assigned `partitions` partitions:
/// read_committed, manual offsets in transactions.
pub fn stream_consumer(t: &Topology, client_id: &str, partitions: usize) -> ClientConfig {
    let mut c = base(t);
    if t.processing.static_membership {
        c.set("group.instance.id", client_id);
    }
    c.set("group.id", &t.application_id)
        .set("client.id", client_id)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set_if_absent("auto.offset.reset", "earliest")
        // Statistics carry the consumer lag (`tally_consumer_lag_records`).
        .set(
            STATISTICS_INTERVAL,
            t.kafka
                .properties
                .get(STATISTICS_INTERVAL)
                .map_or(DEFAULT_STATISTICS_INTERVAL_MS, String::as_str),
        )
        // librdkafka prefetches up to 64 MiB by default (fetch.max.bytes follows this cap), and
        // the fetch buffers behind a full queue cost about three times the queue's size in
        // resident memory. 2 MiB is about what Kafka Streams buffers (1,000 records per
        // partition); scripts/bench drained as fast with it as with 16 MiB, at 65-73 MiB peak
        // RSS instead of 107-121. A full queue pauses a partition's fetching for
        // fetch.queue.backoff.ms (1 s by default), which starves the thread behind a small
        // queue: look again after 10 ms. User settings win. `fetch_fairly` grows the queue
        // to a batch per partition the thread may hold.
        .set_if_absent("queued.max.messages.kbytes", "2048")
        .set_if_absent("fetch.queue.backoff.ms", "10");
    fetch_fairly(&mut c, t, partitions, BATCH_FETCH);
    match t.processing.group_protocol {
        GroupProtocol::Classic => c.set("partition.assignment.strategy", "cooperative-sticky"),
        // The coordinator assigns (incrementally, like cooperative-sticky); librdkafka refuses
        // a client-side strategy under this protocol.
        GroupProtocol::Consumer => c.set("group.protocol", "consumer"),
    };
    c
}

/// The transactional producer of a stream thread.
pub fn transactional_producer(t: &Topology, transactional_id: &str) -> ClientConfig {
    let mut c = base(t);
    c.set("transactional.id", transactional_id)
        .set("client.id", transactional_id)
        .set("enable.idempotence", "true")
        // librdkafka's producer asks the broker to create a topic it does not know; a changelog
        // deleted while tally runs would come back without `cleanup.policy=compact`. Topics are
        // created (compacted) at start, by the admin client only.
        .set("allow.auto.create.topics", "false")
        .set_if_absent("transaction.timeout.ms", &DEFAULT_TRANSACTION_TIMEOUT_MS.to_string())
        .set_if_absent("linger.ms", "5");
    // Every record of one key on one partition, an empty key too (validation refuses a
    // partitioner that is not a function of the key).
    if let Some(keyed) = Partitioner::of(&t.kafka.properties).keyed_property() {
        c.set("partitioner", keyed);
    }
    c
}

/// How long a transaction of tally's producers can stay open before the broker aborts it: the
/// transaction timeout, plus the broker's sweep for expired transactions (every 10 s by default)
/// and the writing of its markers. A transaction open longer is hanging.
pub fn open_transaction_limit(t: &Topology) -> Duration {
    let timeout_ms = t
        .kafka
        .properties
        .get("transaction.timeout.ms")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(DEFAULT_TRANSACTION_TIMEOUT_MS);
    Duration::from_millis(timeout_ms) + Duration::from_secs(30)
}

/// A consumer that reads a changelog partition to its end (assigned, never joins the group;
/// short fetch waits, so reaching the end of a small tail is quick).
pub fn restore_consumer(t: &Topology) -> ClientConfig {
    let mut c = base(t);
    c.set("group.id", format!("{}-restore", t.application_id))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        // A position compaction or retention has passed reads from the changelog's start
        // (librdkafka's default would skip to its end, and restore nothing).
        .set("auto.offset.reset", "earliest")
        .set_if_absent("fetch.wait.max.ms", "10")
        .set_if_absent("fetch.max.bytes", "52428800")
        // A restore reads one partition, and fetch round trips bound it: 16 MiB per fetch
        // instead of librdkafka's 1 MiB restored 300-320k records/s instead of 180-225k
        // (scripts/bench's restore runs). Two fetches' worth of queue, not the default 64 MiB.
        .set_if_absent("max.partition.fetch.bytes", &RESTORE_PARTITION_FETCH.to_string())
        .set_if_absent("queued.max.messages.kbytes", "32768");
    c
}

/// A restore's fetch of its one partition.
const RESTORE_PARTITION_FETCH: usize = 16 * 1024 * 1024;

/// The standby consumer, which may follow `partitions` changelog partitions at once: a restore
/// consumer whose fetches serve every partition it follows.
pub fn standby_consumer(t: &Topology, partitions: usize) -> ClientConfig {
    let mut c = restore_consumer(t);
    fetch_fairly(&mut c, t, partitions, RESTORE_PARTITION_FETCH);
    c
}

/// The global ID-mapping reader: a restore consumer with small fetches. The fetch and queue
/// limits count the bytes on the wire, and librdkafka turns a whole fetch into one op of a few
/// hundred bytes per record at once: a 16 MiB fetch of small compressed mapping records became
/// millions of ops (1.2 GiB peak loading 6M records, benches/mappings.rs).
pub fn global_reader(t: &Topology) -> ClientConfig {
    let mut c = restore_consumer(t);
    let small = [
        ("max.partition.fetch.bytes", "1048576"),
        ("fetch.max.bytes", "4194304"),
        ("queued.max.messages.kbytes", "4096"),
    ];
    for (key, value) in small {
        if !t.kafka.properties.contains_key(key) {
            c.set(key, value);
        }
    }
    c
}

/// The live reconciler's reader of tally's inputs: assigned partitions only, never joining or
/// committing, with tally's `group` so it can read that group's committed offsets.
pub fn watch_reader(t: &Topology, group: &str) -> ClientConfig {
    let mut c = base(t);
    c.set("group.id", group)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .set_if_absent("fetch.wait.max.ms", "10")
        .set_if_absent("max.partition.fetch.bytes", "1048576")
        .set_if_absent("queued.max.messages.kbytes", "4096");
    c
}

/// Sizes a consumer that follows up to `partitions` partitions so that one fetch brings some of
/// every backlog: a share of the queue per partition between [`BATCH_FETCH`] and `largest`, the
/// queue grown (up to [`FAIR_QUEUE_CEILING`]) to hold one share of each. Settings the user made
/// win.
///
/// The partitions of a librdkafka consumer share one queue. When a fetch fills it, every
/// partition stops fetching, and they start again in the same order; the broker fills a
/// response in request order. With 1 MiB per partition, tally's 2 MiB queue was fed by the first
/// two partitions with a backlog while the others waited until those caught up (librdkafka
/// issue #1854): a repartition partition of the latency benchmark read nothing for 10 s.
fn fetch_fairly(c: &mut ClientConfig, t: &Topology, partitions: usize, largest: usize) {
    const FETCH: &str = "max.partition.fetch.bytes";
    const QUEUE: &str = "queued.max.messages.kbytes";
    const FETCH_MAX: &str = "fetch.max.bytes";
    let user = |key: &str| t.kafka.properties.contains_key(key);
    let partitions = partitions.max(1);
    let queue = c
        .get(QUEUE)
        .and_then(|k| k.parse::<usize>().ok())
        .map_or(BATCH_FETCH, |k| k.saturating_mul(1024));
    let share = (queue / partitions).clamp(BATCH_FETCH, largest.max(BATCH_FETCH));
    if !user(FETCH) {
        c.set(FETCH, share.to_string());
    }
    let needed = share.saturating_mul(partitions).min(FAIR_QUEUE_CEILING);
    if needed > queue && !user(QUEUE) {
        c.set(QUEUE, needed.div_ceil(1024).to_string());
    }
    // A response limit tally set below one fair fetch would cut it short again; unset, librdkafka
    // takes the queue's size.
    let limit = c.get(FETCH_MAX).and_then(|b| b.parse::<usize>().ok());
    if limit.is_some_and(|b| b < needed) && !user(FETCH_MAX) {
        c.set(FETCH_MAX, needed.to_string());
    }
}

trait SetIfAbsent {
    fn set_if_absent(&mut self, key: &str, value: &str) -> &mut Self;
}

impl SetIfAbsent for ClientConfig {
    fn set_if_absent(&mut self, key: &str, value: &str) -> &mut Self {
        if self.get(key).is_none() {
            self.set(key, value);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology(properties: &str) -> Topology {
        let yaml = format!(
            r#"
application_id: app
kafka: {{ bootstrap_servers: "k:9092", properties: {properties} }}
sources: {{ payments: {{ topic: pay }} }}
pipelines:
  - {{ name: payments, from: payments, key: "{{id}}", to: {{ topic: out }} }}
dead_letter: {{ topic: dlq }}
"#
        );
        crate::config::load_str("t.yaml", &yaml, |_| None).expect("valid topology")
    }

    #[test]
    fn only_the_stream_consumers_emit_statistics_at_the_interval_the_user_sets() {
        let t = topology(r#"{ statistics.interval.ms: "200", linger.ms: "7" }"#);
        assert_eq!(stream_consumer(&t, "c", 1).get(STATISTICS_INTERVAL), Some("200"));
        for (client, config) in [
            ("producer", transactional_producer(&t, "p")),
            ("restore consumer", restore_consumer(&t)),
            ("global reader", global_reader(&t)),
            ("watch reader", watch_reader(&t, "g")),
            ("base", base(&t)),
        ] {
            assert_eq!(config.get(STATISTICS_INTERVAL), None, "{client}");
        }
        assert_eq!(
            transactional_producer(&t, "p").get("linger.ms"),
            Some("7"),
            "other properties pass"
        );
    }

    #[test]
    fn the_producers_hash_every_key_with_the_partitioner_chosen() {
        for (set, used) in [
            ("{}", "consistent"),
            (r#"{ partitioner: consistent_random }"#, "consistent"),
            (r#"{ partitioner: murmur2_random }"#, "murmur2"),
            (r#"{ partitioner: fnv1a }"#, "fnv1a"),
        ] {
            let p = transactional_producer(&topology(set), "p");
            assert_eq!(p.get("partitioner"), Some(used), "{set}");
        }
    }

    #[test]
    fn the_stream_consumers_emit_statistics_every_five_seconds_by_default() {
        let t = topology("{}");
        assert_eq!(stream_consumer(&t, "c", 1).get(STATISTICS_INTERVAL), Some("5000"));
        assert_eq!(transactional_producer(&t, "p").get(STATISTICS_INTERVAL), None);
    }

    fn fetch_and_queue(c: &ClientConfig) -> (usize, usize) {
        let number = |key: &str| c.get(key).and_then(|v| v.parse().ok()).expect(key);
        (
            number("max.partition.fetch.bytes"),
            number("queued.max.messages.kbytes"),
        )
    }

    #[test]
    fn one_stream_fetch_serves_every_partition_the_thread_may_hold() {
        let t = topology("{}");
        // One batch-sized fetch for each of six partitions (three sources, three repartition
        // partitions): the 2 MiB queue grows to 6 MiB.
        assert_eq!(fetch_and_queue(&stream_consumer(&t, "c", 6)), (1_048_576, 6144));
        assert_eq!(fetch_and_queue(&stream_consumer(&t, "c", 1)), (1_048_576, 2048));
        // Past 64 partitions the queue stops growing.
        assert_eq!(fetch_and_queue(&stream_consumer(&t, "c", 500)), (1_048_576, 65_536));
    }

    #[test]
    fn the_users_fetch_and_queue_sizes_win() {
        let t = topology(r#"{ max.partition.fetch.bytes: "100000" }"#);
        assert_eq!(fetch_and_queue(&stream_consumer(&t, "c", 6)), (100_000, 6144));
        let t = topology(r#"{ queued.max.messages.kbytes: "1024" }"#);
        assert_eq!(fetch_and_queue(&stream_consumer(&t, "c", 6)), (1_048_576, 1024));
    }

    #[test]
    fn the_standby_consumer_shares_its_queue_and_grows_it_for_many_changelogs() {
        let t = topology("{}");
        // One changelog keeps a restore's 16 MiB fetch; eight share the 32 MiB queue.
        assert_eq!(fetch_and_queue(&standby_consumer(&t, 1)), (16_777_216, 32_768));
        assert_eq!(fetch_and_queue(&standby_consumer(&t, 8)), (4_194_304, 32_768));
        // Fifty: a batch each, and the queue (with the response limit tally set) grows to
        // hold them.
        let many = standby_consumer(&t, 50);
        assert_eq!(fetch_and_queue(&many), (1_048_576, 51_200));
        assert_eq!(many.get("fetch.max.bytes"), Some("52428800"));
    }
}
