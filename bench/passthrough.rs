//! The benchmark's ceiling: a raw librdkafka consume → produce passthrough with no state, at
//! least once, and tally's client settings (read_committed group consumer, cooperative-sticky,
//! idempotent producer lingering 5 ms, one thread, offsets committed every 100 ms after the
//! produced records are acknowledged).
//!
//! Usage: `passthrough <bootstrap> <group> <input topic> <output topic>`; runs until killed.

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::time::{Duration, Instant};

const COMMIT_INTERVAL: Duration = Duration::from_millis(100);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [bootstrap, group, input, output] = args.as_slice() else {
        return Err("usage: passthrough <bootstrap> <group> <input topic> <output topic>".into());
    };
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .create()?;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?;
    consumer.subscribe(&[input.as_str()])?;
    let mut pending = false;
    let mut last_commit = Instant::now();
    loop {
        if let Some(polled) = consumer.poll(Duration::from_millis(50)) {
            let m = polled?;
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(output);
            if let Some(k) = m.key() {
                record = record.key(k);
            }
            if let Some(v) = m.payload() {
                record = record.payload(v);
            }
            if let Some(h) = m.headers() {
                record = record.headers(h.detach());
            }
            send(&producer, record)?;
            pending = true;
        }
        // At least once: positions are committed only after everything before them is acked.
        if pending && last_commit.elapsed() >= COMMIT_INTERVAL {
            producer.flush(Duration::from_secs(30))?;
            consumer.commit_consumer_state(CommitMode::Async)?;
            pending = false;
            last_commit = Instant::now();
        }
    }
}

fn send(
    producer: &ThreadedProducer<DefaultProducerContext>,
    mut record: BaseRecord<'_, [u8], [u8]>,
) -> Result<(), KafkaError> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(e),
        }
    }
}
