//! Seeded generators of duplicate-laden input streams (payments, entity sync, cart merges), with
//! a share of poison records.
//!
//! Used by `tally demo`, the integration tests, the chaos driver and the throughput bench.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
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
    /// Idempotency keys that must each come out exactly once: every payment event
    /// (`{payment_id}:{status}`), every entity's highest version
    /// (`{entity_type}:{entity_id}:v{version}`), every cart line (`{cart_id}:{line_id}`).
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

/// Generates entity-sync events (`entity.updated`, overwrite by `version`) for `entities`
/// customers with 2–6 versions each: versions shuffled, each sent 1–3 times (some re-pushed
/// under a new message key), stale versions replayed late, versions as numbers or numeric
/// strings, plus about `poison_per_mille`‰ poison records.
pub fn entities(entities: usize, poison_per_mille: u32, oversize_bytes: usize, seed: u64) -> Generated {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Generated::default();
    let mut sequences = Vec::with_capacity(entities);
    for e in 0..entities {
        let id = format!("C-{seed}-{e:06}");
        let max = rng.random_range(2..=6u32);
        let mut versions: Vec<u32> = (1..=max).collect();
        versions.shuffle(&mut rng);
        // Stale replays: old versions arriving again after newer ones.
        for _ in 0..rng.random_range(0..=2) {
            let old = rng.random_range(1..max);
            versions.push(old);
        }
        let mut seq = Vec::new();
        for v in versions {
            for copy in 0..rng.random_range(1..=3) {
                let version = if rng.random_bool(0.3) {
                    format!(r#""{v}""#)
                } else {
                    v.to_string()
                };
                let body = format!(
                    r#"{{"event_type":"entity.updated","entity_type":"customer","entity_id":"{id}","version":{version},"email":"{id}.v{v}@example.com"}}"#
                );
                let repushed = copy > 0 && rng.random_bool(0.4);
                let key = if repushed {
                    format!("retry-{}", rng.random::<u32>())
                } else {
                    id.clone()
                };
                seq.push(record(key, body, format!("e-{e}-{v}-{copy}")));
            }
        }
        out.expected_keys.push(format!("customer:{id}:v{max}"));
        sequences.push(seq);
        if rng.random_range(0..1000) < poison_per_mille {
            let (reason, payload) = entity_poison(&mut rng, e, oversize_bytes);
            *out.poison.entry(reason).or_default() += 1;
            sequences.push(vec![record(format!("poison-e-{e}"), payload, format!("poison-e-{e}"))]);
        }
    }
    out.records = interleave(&mut rng, sequences);
    out
}

/// Generates cart-merge events (`cart.line_added`, merged by `line_id` into the cart) for
/// `carts` carts with 1–6 lines each, every line delivered 1–4 times under any message key, plus
/// about `poison_per_mille`‰ poison records.
pub fn carts(carts: usize, poison_per_mille: u32, oversize_bytes: usize, seed: u64) -> Generated {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Generated::default();
    let mut sequences = Vec::with_capacity(carts);
    for c in 0..carts {
        let cart = format!("CART-{seed}-{c:06}");
        let mut seq = Vec::new();
        for l in 0..rng.random_range(1..=6) {
            let line = format!("{cart}-L{l}");
            let body = format!(
                r#"{{"event_type":"cart.line_added","cart_id":"{cart}","line_id":"{line}","sku":"SKU-{}","qty":{}}}"#,
                rng.random_range(1..500),
                rng.random_range(1..4)
            );
            for copy in 0..rng.random_range(1..=4) {
                let key = if rng.random_bool(0.5) {
                    cart.clone()
                } else {
                    format!("k-{}", rng.random::<u32>())
                };
                seq.push(record(key, body.clone(), format!("l-{c}-{l}-{copy}")));
            }
            out.expected_keys.push(format!("{cart}:{line}"));
        }
        sequences.push(seq);
        if rng.random_range(0..1000) < poison_per_mille {
            let (reason, payload) = cart_poison(&mut rng, c, oversize_bytes);
            *out.poison.entry(reason).or_default() += 1;
            sequences.push(vec![record(format!("poison-c-{c}"), payload, format!("poison-c-{c}"))]);
        }
    }
    // Lines of one cart arrive in any order.
    for seq in &mut sequences {
        seq.shuffle(&mut rng);
    }
    out.records = interleave(&mut rng, sequences);
    out
}

fn record(key: String, payload: impl Into<Vec<u8>>, message_id: String) -> GeneratedRecord {
    GeneratedRecord {
        key: key.into_bytes(),
        payload: payload.into(),
        headers: vec![("message_id".to_string(), message_id)],
    }
}

/// Interleaves sequences, each kept in its own order, drawing from a window of 64 at a time so
/// one sequence's records spread over a stretch of the stream, not over all of it.
fn interleave(rng: &mut StdRng, sequences: Vec<Vec<GeneratedRecord>>) -> Vec<GeneratedRecord> {
    let mut pending = sequences.into_iter().map(|mut s| {
        s.reverse();
        s
    });
    let mut window: Vec<Vec<GeneratedRecord>> = Vec::new();
    let mut out = Vec::new();
    loop {
        while window.len() < 64 {
            match pending.next() {
                Some(s) => window.push(s),
                None => break,
            }
        }
        if window.is_empty() {
            return out;
        }
        let i = rng.random_range(0..window.len());
        match window[i].pop() {
            Some(r) => out.push(r),
            None => {
                window.swap_remove(i);
            }
        }
    }
}

fn entity_poison(rng: &mut StdRng, e: usize, oversize_bytes: usize) -> (&'static str, Vec<u8>) {
    match rng.random_range(0..4) {
        0 => (
            "invalid_json",
            format!(r#"{{"event_type":"entity.updated","entity_id":"BAD-{e}""#).into_bytes(),
        ),
        1 => (
            "missing_key_field",
            format!(r#"{{"event_type":"entity.updated","entity_type":"customer","version":1,"n":{e}}}"#).into_bytes(),
        ),
        2 => (
            "invalid_version",
            format!(r#"{{"event_type":"entity.updated","entity_type":"customer","entity_id":"BAD-{e}","version":"seventeen"}}"#)
                .into_bytes(),
        ),
        _ => (
            "oversize",
            format!(
                r#"{{"event_type":"entity.updated","entity_type":"customer","entity_id":"BIG-{e}","version":1,"pad":"{}"}}"#,
                "x".repeat(oversize_bytes)
            )
            .into_bytes(),
        ),
    }
}

fn cart_poison(rng: &mut StdRng, c: usize, oversize_bytes: usize) -> (&'static str, Vec<u8>) {
    match rng.random_range(0..4) {
        0 => (
            "invalid_json",
            format!(r#"{{"event_type":"cart.line_added","cart_id":"BAD-{c}","#).into_bytes(),
        ),
        1 => (
            "missing_key_field",
            format!(r#"{{"event_type":"cart.line_added","cart_id":"BAD-{c}","sku":"SKU-1"}}"#).into_bytes(),
        ),
        2 => (
            "non_scalar_key_field",
            format!(r#"{{"event_type":"cart.line_added","cart_id":["BAD-{c}"],"line_id":"L0"}}"#).into_bytes(),
        ),
        _ => (
            "oversize",
            format!(
                r#"{{"event_type":"cart.line_added","cart_id":"BIG-{c}","line_id":"L0","pad":"{}"}}"#,
                "x".repeat(oversize_bytes)
            )
            .into_bytes(),
        ),
    }
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

    #[test]
    fn entity_and_cart_streams_are_reproducible_and_carry_repeats_and_poison() {
        for (a, b, distinct) in [
            (entities(300, 50, 64, 3), entities(300, 50, 64, 3), 300),
            (carts(300, 50, 64, 3), carts(300, 50, 64, 3), 0),
        ] {
            let payloads = |g: &Generated| g.records.iter().map(|r| r.payload.clone()).collect::<Vec<_>>();
            assert_eq!(payloads(&a), payloads(&b), "same seed, same stream");
            let unique: BTreeSet<_> = a.expected_keys.iter().collect();
            assert_eq!(unique.len(), a.expected_keys.len(), "expected keys are distinct");
            if distinct > 0 {
                assert_eq!(unique.len(), distinct, "one final version per entity");
            }
            assert!(a.records.len() as u64 > a.expected_keys.len() as u64 + a.poison.values().sum::<u64>());
            assert!(a.poison.values().sum::<u64>() > 0);
        }
    }
}
