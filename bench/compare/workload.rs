//! The benchmark matrix: seeded input streams and how many outputs a correct run makes of them.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Which of tally's example topologies a workload runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// `topologies/payments.yaml`: repartition by payment id, `ignore` on `{payment_id}:{status}`.
    Payments,
    /// `topologies/entity-sync.yaml`: repartition by entity, `overwrite` on its version.
    Entities,
    /// `topologies/payments-keyed.yaml`: input already keyed by payment id (Kafka's default
    /// murmur2 partitioner), declared co-partitioned: one hop, `ignore` on `{payment_id}:{status}`.
    PaymentsKeyed,
}

impl Topology {
    /// The input producer's librdkafka `partitioner`: the Java client's murmur2 for keyed input
    /// (what `co_partitioned: murmur2` declares), librdkafka's default otherwise.
    pub fn input_partitioner(self) -> &'static str {
        match self {
            Topology::PaymentsKeyed => "murmur2_random",
            Topology::Payments | Topology::Entities => "consistent_random",
        }
    }

    /// True when the contenders need no repartition hop (so the one-hop ceiling is the bound).
    pub fn one_hop(self) -> bool {
        self == Topology::PaymentsKeyed
    }
}

/// One cell of the matrix.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Short name, e.g. `payments-256B-dup10`.
    pub name: String,
    /// The topology the contenders run.
    pub topology: Topology,
    /// Bytes per record value.
    pub value_bytes: usize,
    /// Payments: share of records (percent) that repeat an earlier event with a new message key.
    pub dup_pct: u32,
    /// Entities: how many distinct entity keys.
    pub keys: usize,
}

/// Share of entity updates (percent) that arrive late, after a higher version of their entity.
pub const OUT_OF_ORDER_PCT: u32 = 5;

/// Every workload of the matrix: payments with 0/10/50% duplicates, entity sync with 10k and
/// 1M keys (5% out of order), and keyed payments with 10% duplicates (co-partitioned, one hop),
/// each with 256 B and 1 KiB values.
pub fn matrix() -> Vec<Workload> {
    let mut all = Vec::new();
    for value_bytes in [256, 1024] {
        let size = if value_bytes == 256 { "256B" } else { "1KB" };
        for dup_pct in [0, 10, 50] {
            all.push(Workload {
                name: format!("payments-{size}-dup{dup_pct}"),
                topology: Topology::Payments,
                value_bytes,
                dup_pct,
                keys: 0,
            });
        }
        for (keys, label) in [(10_000, "10k"), (1_000_000, "1M")] {
            all.push(Workload {
                name: format!("entities-{size}-{label}"),
                topology: Topology::Entities,
                value_bytes,
                dup_pct: 0,
                keys,
            });
        }
    }
    // After the original ten, so their order (and a run's interleaving) is unchanged.
    for (value_bytes, size) in [(256, "256B"), (1024, "1KB")] {
        all.push(Workload {
            name: format!("payments-{size}-keyed-dup10"),
            topology: Topology::PaymentsKeyed,
            value_bytes,
            dup_pct: 10,
            keys: 0,
        });
    }
    all
}

/// A generated input stream.
pub struct Input {
    /// (message key, value) in production order.
    pub records: Vec<(Vec<u8>, Vec<u8>)>,
    /// Records a correct dedup / version gate passes.
    pub expected_outputs: usize,
}

impl Workload {
    /// Generates `n` records. Entity updates are keyed by entity, so each entity's updates keep
    /// their order through the repartition and the expected output count is exact.
    pub fn generate(&self, n: usize, seed: u64) -> Input {
        match self.topology {
            Topology::Payments => payments(n, self.dup_pct, self.value_bytes, seed, Repush::NewKey),
            Topology::PaymentsKeyed => payments(n, self.dup_pct, self.value_bytes, seed, Repush::SameKey),
            Topology::Entities => entities(n, self.keys, self.value_bytes, seed),
        }
    }

    /// One line saying what the workload is.
    pub fn describe(&self) -> String {
        match self.topology {
            Topology::Payments => format!(
                "payments.yaml, {} B values, {}% of records re-push an earlier event with a new message key",
                self.value_bytes, self.dup_pct
            ),
            Topology::Entities => format!(
                "entity-sync.yaml, {} B values, {} entities, {OUT_OF_ORDER_PCT}% of updates arrive after a higher version",
                self.value_bytes, self.keys
            ),
            Topology::PaymentsKeyed => format!(
                "payments-keyed.yaml (co-partitioned, one hop), {} B values, every record keyed by its payment id \
                 with the Java client's murmur2 partitioner, {}% re-push an earlier event with the same key; \
                 Kafka Streams runs the one-hop topology (no repartition); the targets are against the one-hop ceiling \
                 and one-hop Kafka Streams, the two-hop ceiling is shown for reference",
                self.value_bytes, self.dup_pct
            ),
        }
    }
}

const STATUSES: [(&str, &str); 3] = [
    ("payment.authorized", "AUTHORIZED"),
    ("payment.completed", "PAID"),
    ("payment.refunded", "REFUNDED"),
];

/// The `event`-th distinct payment event as the `seq`-th record: (message key, value).
pub fn payment_record(seed: u64, event: usize, seq: usize, value_bytes: usize) -> (String, Vec<u8>) {
    let payment_id = format!("PAY-{seed}-{:08}", event / 3);
    let (event_type, status) = STATUSES[event % 3];
    let amount = (event * 7919) % 500_000;
    let head = format!(
        r#"{{"event_type":"{event_type}","payment_id":"{payment_id}","status":"{status}","amount":{}.{:02},"seq":{seq},"pad":""#,
        amount / 100,
        amount % 100
    );
    (payment_id, padded(head, value_bytes))
}

/// How a re-pushed payment event is keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repush {
    /// A new message key (another partition): only a repartition brings the copies together.
    NewKey,
    /// Its payment id, like every record of a keyed source: the copies share a partition.
    SameKey,
}

fn payments(n: usize, dup_pct: u32, value_bytes: usize, seed: u64, repush: Repush) -> Input {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut records = Vec::with_capacity(n);
    let mut events = 0usize;
    for seq in 0..n {
        if events > 0 && rng.random_range(0..100) < dup_pct {
            // A re-push of a recent event: same business key, keyed as `repush` says.
            let event = events - 1 - rng.random_range(0..events.min(1000));
            let (payment_id, value) = payment_record(seed, event, seq, value_bytes);
            let key = match repush {
                Repush::NewKey => format!("retry-{}", rng.random::<u32>()),
                Repush::SameKey => payment_id,
            };
            records.push((key.into_bytes(), value));
        } else {
            let (key, value) = payment_record(seed, events, seq, value_bytes);
            records.push((key.into_bytes(), value));
            events += 1;
        }
    }
    Input {
        records,
        expected_outputs: events,
    }
}

fn entities(n: usize, keys: usize, value_bytes: usize, seed: u64) -> Input {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut versions = vec![0i64; keys];
    let mut recent: Vec<usize> = Vec::with_capacity(1024);
    let mut records = Vec::with_capacity(n);
    let mut expected = 0usize;
    for seq in 0..n {
        let late = !recent.is_empty() && rng.random_range(0..100) < OUT_OF_ORDER_PCT;
        let (entity, version) = if late {
            // A late update of a recently updated entity: its version is at most the current one.
            let e = recent[rng.random_range(0..recent.len())];
            (e, versions[e] - rng.random_range(0..versions[e].min(3)))
        } else {
            let e = rng.random_range(0..keys);
            versions[e] += 1;
            expected += 1;
            if recent.len() < 1024 {
                recent.push(e);
            } else {
                recent[seq % 1024] = e;
            }
            (e, versions[e])
        };
        records.push(entity_record(entity, version, seq, value_bytes));
    }
    Input {
        records,
        expected_outputs: expected,
    }
}

/// One update of customer `entity` to `version` (message key and value).
fn entity_record(entity: usize, version: i64, seq: usize, value_bytes: usize) -> (Vec<u8>, Vec<u8>) {
    let id = format!("C-{entity:07}");
    let head = format!(
        r#"{{"event_type":"entity.updated","entity_type":"customer","entity_id":"{id}","version":{version},"seq":{seq},"pad":""#
    );
    (format!("customer:{id}").into_bytes(), padded(head, value_bytes))
}

/// Entities `range` of a state-size run, one record each (version 1): every record is an output
/// and a key the version store keeps.
pub fn distinct_entities(range: std::ops::Range<usize>, value_bytes: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    range.map(|e| entity_record(e, 1, e, value_bytes)).collect()
}

/// Closes a JSON value whose last field is an open `"pad":"` string, filled to `size` bytes.
fn padded(mut head: String, size: usize) -> Vec<u8> {
    let fill = size.saturating_sub(head.len() + 2);
    head.extend(std::iter::repeat_n('x', fill));
    head.push_str("\"}");
    head.into_bytes()
}

/// The `seq` field of a generated value (the join key of latency measurements).
pub fn seq_of(value: &[u8]) -> Option<usize> {
    const TAG: &[u8] = b"\"seq\":";
    let at = value.windows(TAG.len()).position(|w| w == TAG)? + TAG.len();
    let digits = value[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&value[at..at + digits]).ok()?.parse().ok()
}
