//! A seeded generator of duplicate-laden payment events, with a share of poison records.
//!
//! Used by `tally demo`, the integration tests and the throughput bench, which all compare
//! tally's output with the `expected_keys` it returns.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

/// One record to produce to the input topic.
#[derive(Debug, Clone)]
pub struct GeneratedRecord {
    /// Message key (repeats sometimes carry a different one).
    pub key: Vec<u8>,
    /// Message value.
    pub payload: Vec<u8>,
    /// Message headers.
    pub headers: Vec<(String, String)>,
}

/// A generated input stream and what a correct pipeline must make of it.
#[derive(Debug, Clone, Default)]
pub struct Generated {
    /// Records in production order.
    pub records: Vec<GeneratedRecord>,
    /// Business keys (`{payment_id}:{status}`) of the valid events: each must come out once.
    pub expected_keys: Vec<String>,
    /// Poison records by the dead-letter reason they must get.
    pub poison: BTreeMap<&'static str, u64>,
}

impl Generated {
    /// Valid records that must be dropped as duplicates.
    pub fn expected_duplicates(&self) -> u64 {
        self.records.len() as u64 - self.expected_keys.len() as u64 - self.poison.values().sum::<u64>()
    }
}

const STATUSES: [(&str, &str); 3] = [
    ("payment.authorized", "AUTHORIZED"),
    ("payment.completed", "PAID"),
    ("payment.refunded", "REFUNDED"),
];

/// Generates `events` distinct business events, each delivered 1–5 times, in shuffled-nearby
/// order, plus about `poison_per_mille`‰ poison records. `oversize_bytes` sizes oversize poison.
pub fn payments(events: usize, poison_per_mille: u32, oversize_bytes: usize, seed: u64) -> Generated {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Generated::default();
    for i in 0..events {
        let payment_id = format!("PAY-{seed}-{:06}", i / 2);
        let (event_type, status) = STATUSES[(i + i / 2) % STATUSES.len()];
        let key = format!("{payment_id}:{status}");
        let body = format!(
            r#"{{"event_type":"{event_type}","payment_id":"{payment_id}","status":"{status}","amount":{}.{:02},"correlation_id":"corr-{i}"}}"#,
            rng.random_range(1..5000),
            rng.random_range(0..100)
        );
        let copies = rng.random_range(1..=5);
        for copy in 0..copies {
            // A re-push by the upstream gets a new message id/key and new headers, but the same
            // business key.
            let repushed = copy > 0 && rng.random_bool(0.4);
            let msg_key = if repushed {
                format!("retry-{}-{copy}", rng.random::<u32>())
            } else {
                payment_id.clone()
            };
            let mut headers = vec![(
                "message_id".to_string(),
                format!("m-{i}-{copy}-{}", rng.random::<u32>()),
            )];
            if repushed {
                headers.push(("delivery_attempt".to_string(), copy.to_string()));
            }
            out.records.push(GeneratedRecord {
                key: msg_key.into_bytes(),
                payload: body.clone().into_bytes(),
                headers,
            });
        }
        out.expected_keys.push(key);
        if rng.random_range(0..1000) < poison_per_mille {
            let (reason, payload) = poison(&mut rng, i, oversize_bytes);
            *out.poison.entry(reason).or_default() += 1;
            out.records.push(GeneratedRecord {
                key: format!("poison-{i}").into_bytes(),
                payload,
                headers: vec![("message_id".to_string(), format!("poison-{i}"))],
            });
        }
    }
    // Duplicates arrive out of order in real life: swap nearby records.
    let n = out.records.len();
    for i in 0..n {
        let j = (i + rng.random_range(0..8)).min(n - 1);
        out.records.swap(i, j);
    }
    out
}

fn poison(rng: &mut StdRng, i: usize, oversize_bytes: usize) -> (&'static str, Vec<u8>) {
    match rng.random_range(0..4) {
        0 => (
            "invalid_json",
            format!(r#"{{"event_type":"payment.completed","payment_id":"BAD-{i}""#).into_bytes(),
        ),
        1 => (
            "missing_key_field",
            format!(r#"{{"event_type":"payment.completed","payment_id":"BAD-{i}"}}"#).into_bytes(),
        ),
        2 => (
            "non_scalar_key_field",
            format!(r#"{{"event_type":"payment.completed","payment_id":{{"id":"BAD-{i}"}},"status":"PAID"}}"#)
                .into_bytes(),
        ),
        _ => (
            "oversize",
            format!(
                r#"{{"event_type":"payment.completed","payment_id":"BIG-{i}","status":"PAID","pad":"{}"}}"#,
                "x".repeat(oversize_bytes)
            )
            .into_bytes(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn same_seed_same_stream_and_counts_add_up() {
        let a = payments(500, 50, 64, 7);
        let b = payments(500, 50, 64, 7);
        assert_eq!(a.records.len(), b.records.len());
        assert_eq!(a.records[10].payload, b.records[10].payload);
        let unique: BTreeSet<_> = a.expected_keys.iter().collect();
        assert_eq!(unique.len(), 500, "every business key is distinct");
        assert!(a.expected_duplicates() > 0);
        assert!(a.poison.values().sum::<u64>() > 0);
    }
}
