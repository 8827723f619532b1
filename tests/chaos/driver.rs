//! The chaos driver: three seeded input streams (payments, entity sync, cart merges) written to
//! their topics, interleaved, faster than tally processes them, and through broker restarts.

use crate::common::bootstrap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;
use std::time::{Duration, Instant};
use tally::demo::generator::{self, Generated, GeneratedRecord};
use tally::engine::headers;

/// One input record as the driver sends it: headers are bytes, names included.
pub struct Input {
    key: Vec<u8>,
    payload: Vec<u8>,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
}

impl From<GeneratedRecord> for Input {
    fn from(r: GeneratedRecord) -> Self {
        Self {
            key: r.key,
            payload: r.payload,
            headers: r
                .headers
                .into_iter()
                .map(|(k, v)| (k.into_bytes(), v.into_bytes()))
                .collect(),
        }
    }
}

/// The three streams for at least about `events` business events: half payment events, a
/// quarter entity versions, a quarter cart lines (a little over, for the averages' sake);
/// about 1% poison in each, and among the payments about 1% hostile but legal records.
pub fn generate(events: usize, max_bytes: usize, seed: u64) -> [Vec<Input>; 3] {
    let streams: [Generated; 3] = [
        generator::payments(events / 2, 10, max_bytes, seed),
        // 2–6 versions per entity (4 on average).
        generator::entities(events / 15, 10, max_bytes, seed + 1),
        // 1–6 lines per cart (3.5 on average).
        generator::carts(events / 13, 10, max_bytes, seed + 2),
    ];
    let [payments, entities, carts] = streams.map(|g| g.records.into_iter().map(Input::from).collect::<Vec<_>>());
    [
        mix(payments, hostile_payments(events / 200, max_bytes, seed + 3), seed),
        entities,
        carts,
    ]
}

/// Legal payments of the kinds that once broke tally (issue #17), each delivered 1–2 times:
/// ids that hold the key's separator (`H:X`+`PAID` and `H`+`X:PAID` are two events), integer
/// ids beyond 64 bits that f64 would merge with their neighbours, payloads of exactly the size
/// limit, and header names and values that are not UTF-8.
fn hostile_payments(count: usize, max_bytes: usize, seed: u64) -> Vec<Input> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for i in 0..count {
        let id = format!("HOST-{seed}-{i}");
        let payloads: Vec<String> = match i % 4 {
            0 => vec![
                payment(&format!("\"{id}:X\""), "PAID", ""),
                payment(&format!("\"{id}\""), "X:PAID", ""),
            ],
            // 2^64 + 2i and its neighbour: exact only if numbers keep their text.
            1 => {
                let big = u128::from(u64::MAX) + 1 + 2 * i as u128;
                vec![
                    payment(&big.to_string(), "PAID", ""),
                    payment(&(big + 1).to_string(), "PAID", ""),
                ]
            }
            2 => {
                let empty = payment(&format!("\"{id}\""), "PAID", "");
                let pad = "p".repeat(max_bytes.saturating_sub(empty.len()));
                vec![payment(&format!("\"{id}\""), "PAID", &pad)]
            }
            _ => vec![payment(&format!("\"{id}\""), "AUTHORIZED", "")],
        };
        for body in payloads {
            debug_assert!(body.len() <= max_bytes, "hostile payments are valid: {}", body.len());
            for copy in 0..rng.random_range(1..=2) {
                let mut hs = vec![(b"message_id".to_vec(), format!("hostile-{i}-{copy}").into_bytes())];
                if i % 4 == 3 || rng.random_bool(0.2) {
                    hs.push((vec![0xff, 0xfe, b'h'], vec![0x00, 0xc3, 0x28, rng.random()]));
                }
                out.push(Input {
                    key: id.clone().into_bytes(),
                    payload: body.clone().into_bytes(),
                    headers: hs,
                });
            }
        }
    }
    out
}

/// A payment event body; `payment_id` is raw JSON (a quoted string or a number).
fn payment(payment_id: &str, status: &str, pad: &str) -> String {
    format!(
        r#"{{"event_type":"payment.completed","payment_id":{payment_id},"status":"{status}","amount":1,"pad":"{pad}"}}"#
    )
}

/// Spreads `extra` through `stream` at seeded positions.
fn mix(mut stream: Vec<Input>, extra: Vec<Input>, seed: u64) -> Vec<Input> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    for record in extra {
        let at = rng.random_range(0..=stream.len());
        stream.insert(at, record);
    }
    stream
}

/// Writes each stream to its topic, a slice of each in turn, in 60 slices with 20 ms pauses;
/// the idempotent producer keeps retrying while the broker restarts.
pub fn write(topics: [String; 3], streams: [Vec<Input>; 3]) {
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
            let n = stream.len();
            let (from, to) = (n * slice / slices, n * (slice + 1) / slices);
            for r in &stream[from..to] {
                let headers = r
                    .headers
                    .iter()
                    .fold(OwnedHeaders::new(), |h, (k, v)| headers::add(h, k, Some(v)));
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
