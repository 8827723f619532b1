//! The benchmark's ceiling: a raw librdkafka consume → produce passthrough with no state, at
//! least once, and tally's client settings (read_committed group consumer, cooperative-sticky,
//! 2 MiB prefetch re-checked after 10 ms, idempotent producer lingering 5 ms, one thread,
//! offsets committed every 100 ms after the produced records are acknowledged).
//!
//! Usage: `passthrough [--passes N --input-records R] <bootstrap> <group> <input topic> <output
//! topic> [<middle topic>]`; runs until killed. With a middle topic it does two hops in one
//! thread, like tally's repartitioning pipelines: one consumer reads the input and the middle
//! topic, records of the input go to the middle topic and records of the middle topic to the
//! output. With `--passes N` it reads the input (of R records) N times, going back to its
//! beginning after every R input records: a run long enough to measure when one pass over the
//! input takes a fraction of a second.

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::Offset;
use std::time::{Duration, Instant};

const COMMIT_INTERVAL: Duration = Duration::from_millis(100);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const USAGE: &str =
        "usage: passthrough [--passes N --input-records R] <bootstrap> <group> <input topic> <output topic> [<middle topic>]";
    let process_start = Instant::now();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut passes = Passes {
        left: 1,
        records: 0,
        seen: 0,
    };
    if args.first().map(String::as_str) == Some("--passes") {
        match args.get(1..4) {
            Some([n, flag, r]) if flag == "--input-records" => {
                passes.left = n.parse().map_err(|_| USAGE)?;
                passes.records = r.parse().map_err(|_| USAGE)?;
            }
            _ => return Err(USAGE.into()),
        }
        args.drain(..4);
    }
    let (bootstrap, group, input, output, middle) = match args.as_slice() {
        [b, g, i, o] => (b, g, i, o, None),
        [b, g, i, o, m] => (b, g, i, o, Some(m)),
        _ => return Err(USAGE.into()),
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
        // At the input's end a fetch waits up to fetch.wait.max.ms (500 ms) for data, and a seek
        // back to the beginning waits for that fetch: with passes, 500 ms lost per pass.
        .set("fetch.wait.max.ms", if passes.left > 1 { "10" } else { "500" })
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
            let from_input = m.topic() == input.as_str();
            let to = match middle {
                Some(mid) if from_input => mid,
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
            if from_input && passes.pass_done() {
                let seek_started = Instant::now();
                for el in consumer.assignment()?.elements_for_topic(input) {
                    consumer.seek(input, el.partition(), Offset::Beginning, Duration::from_secs(10))?;
                }
                eprintln!(
                    "passthrough: input pass done {:?} after start; back to its beginning ({} passes left, seek took {:?})",
                    process_start.elapsed(),
                    passes.left,
                    seek_started.elapsed()
                );
            }
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

/// How often the input is read.
struct Passes {
    /// Passes still to start, the current one included.
    left: usize,
    /// Input records per pass.
    records: u64,
    /// Input records seen in the current pass.
    seen: u64,
}

impl Passes {
    /// Counts one input record; true when it ended a pass and another one follows.
    fn pass_done(&mut self) -> bool {
        self.seen += 1;
        if self.left > 1 && self.seen == self.records {
            self.left -= 1;
            self.seen = 0;
            return true;
        }
        false
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
