//! The benchmark's ceiling: a raw librdkafka consume → produce passthrough with no state, at
//! least once, and tally's client settings (read_committed group consumer, cooperative-sticky,
//! 2 MiB prefetch re-checked after 10 ms, idempotent producer lingering 5 ms, one thread,
//! offsets committed every 100 ms after the produced records are acknowledged).
//!
//! Usage: `passthrough <bootstrap> <group> <input topic> <output topic> [<middle topic>]`; runs
//! until killed. With a middle topic it does two hops in one thread, like tally's repartitioning
//! pipelines: one consumer reads the input and the middle topic, records of the input go to the
//! middle topic and records of the middle topic to the output.

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::time::{Duration, Instant};

const COMMIT_INTERVAL: Duration = Duration::from_millis(100);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (bootstrap, group, input, output, middle) = match args.as_slice() {
        [b, g, i, o] => (b, g, i, o, None),
        [b, g, i, o, m] => (b, g, i, o, Some(m)),
        _ => return Err("usage: passthrough <bootstrap> <group> <input topic> <output topic> [<middle topic>]".into()),
    };
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("queued.max.messages.kbytes", "2048")
        .set("fetch.queue.backoff.ms", "10")
        .create()?;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?;
    let mut topics = vec![input.as_str()];
    topics.extend(middle.map(String::as_str));
    consumer.subscribe(&topics)?;
    let mut pending = false;
    let mut last_commit = Instant::now();
    loop {
        if let Some(polled) = consumer.poll(Duration::from_millis(50)) {
            let m = polled?;
            let to = match middle {
                Some(mid) if m.topic() == input.as_str() => mid,
                _ => output,
            };
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(to);
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
            await_deliveries(&producer)?;
            consumer.commit_consumer_state(CommitMode::Async)?;
            pending = false;
            last_commit = Instant::now();
        }
    }
}

/// Waits until every produced record is acknowledged. Not `flush`: rust-rdkafka's flush polls
/// in a full 100 ms slice whenever anything is in flight, which held this loop for 100 ms at
/// every commit (tally's producer had the same wait; see `TxnProducer::await_deliveries`).
fn await_deliveries(producer: &ThreadedProducer<DefaultProducerContext>) -> Result<(), KafkaError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while producer.in_flight_count() > 0 {
        if Instant::now() > deadline {
            return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    Ok(())
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
