//! The chaos driver: three seeded input streams (payments, entity sync, cart merges) written to
//! their topics, interleaved, faster than tally processes them, and through broker restarts.

use crate::common::bootstrap;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;
use std::time::{Duration, Instant};
use tally::demo::generator::{self, Generated};

/// The three streams for at least about `events` business events: half payment events, a
/// quarter entity versions, a quarter cart lines (a little over, for the averages' sake);
/// about 1% poison in each.
pub fn generate(events: usize, max_bytes: usize, seed: u64) -> [Generated; 3] {
    [
        generator::payments(events / 2, 10, max_bytes, seed),
        // 2–6 versions per entity (4 on average).
        generator::entities(events / 15, 10, max_bytes, seed + 1),
        // 1–6 lines per cart (3.5 on average).
        generator::carts(events / 13, 10, max_bytes, seed + 2),
    ]
}

/// Writes each stream to its topic, a slice of each in turn, in 60 slices with 20 ms pauses;
/// the idempotent producer keeps retrying while the broker restarts.
pub fn write(topics: [String; 3], streams: [Generated; 3]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "20")
        .set("message.max.bytes", "10000000")
        .set("message.timeout.ms", "600000")
        .create()
        .expect("driver producer");
    let slices = 60;
    for slice in 0..slices {
        for (topic, stream) in topics.iter().zip(&streams) {
            let n = stream.records.len();
            let (from, to) = (n * slice / slices, n * (slice + 1) / slices);
            for r in &stream.records[from..to] {
                let headers = r.headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
                    h.insert(Header { key: k, value: Some(v) })
                });
                let mut rec = BaseRecord::to(topic).key(&r.key).payload(&r.payload).headers(headers);
                loop {
                    match producer.send(rec) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                            rec = back;
                            producer.poll(Duration::from_millis(20));
                        }
                        Err((e, _)) => panic!("driver: producing to {topic} failed: {e}"),
                    }
                }
            }
        }
        flush(&producer);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Flushes, waiting out a broker restart (the idempotent producer retries without duplicating).
fn flush(producer: &BaseProducer) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while let Err(e) = producer.flush(Duration::from_secs(30)) {
        assert!(
            Instant::now() < deadline,
            "driver: input not acknowledged within 10 minutes: {e}"
        );
        eprintln!("driver: flush waiting ({e})");
    }
}
