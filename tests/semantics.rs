//! The seed's semantics on the real broker, each through its example topology file:
//! overwrite by version, merge with inner dedup, inventory dedup.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rdkafka::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tally::demo::generator::GeneratedRecord;

fn record(key: String, payload: serde_json::Value) -> GeneratedRecord {
    GeneratedRecord {
        key: key.into_bytes(),
        payload: payload.to_string().into_bytes(),
        headers: vec![],
    }
}

fn json(m: &rdkafka::message::OwnedMessage) -> serde_json::Value {
    serde_json::from_slice(m.payload().expect("payload")).expect("json output")
}

/// Interleaves per-entity sequences randomly, keeping each sequence's own order.
fn interleave(rng: &mut StdRng, mut seqs: Vec<Vec<GeneratedRecord>>) -> Vec<GeneratedRecord> {
    let mut out = Vec::new();
    seqs.iter_mut().for_each(|s| s.reverse());
    while !seqs.is_empty() {
        let i = rng.random_range(0..seqs.len());
        match seqs[i].pop() {
            Some(r) => out.push(r),
            None => {
                seqs.swap_remove(i);
            }
        }
    }
    out
}

fn entity_update(entity_id: &str, version: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "event_type": "entity.updated", "entity_type": "customer", "entity_id": entity_id,
        "version": version, "email": format!("{entity_id}@example.com")
    })
}

#[test]
fn entity_sync_is_version_ordered_per_entity_across_a_restart_and_stale_matches_the_model() {
    let names = Names::new("overwrite");
    create_topics(&[(&names.input, 3), (&names.output, 3), (&names.dlq, 1)]);
    let mut rng = StdRng::seed_from_u64(31);

    // Phase 1: each entity's versions shuffled and repeated, on the entity's partition.
    let mut max_version: BTreeMap<String, i64> = BTreeMap::new();
    let (mut model_out, mut model_stale) = (0u64, 0u64);
    let mut seqs = Vec::new();
    for e in 0..150 {
        let id = format!("C-{e:04}");
        let mut versions: Vec<i64> = (1..=rng.random_range(3..=8)).collect();
        versions.shuffle(&mut rng);
        let mut seq = Vec::new();
        let mut running = 0;
        for v in versions {
            for _ in 0..rng.random_range(1..=3) {
                // Versions arrive as numbers or as numeric strings.
                let value = if rng.random_bool(0.3) {
                    serde_json::json!(v.to_string())
                } else {
                    serde_json::json!(v)
                };
                seq.push(record(id.clone(), entity_update(&id, value)));
                if v > running {
                    running = v;
                    model_out += 1;
                } else {
                    model_stale += 1;
                }
            }
        }
        max_version.insert(id, running);
        seqs.push(seq);
    }
    let mut phase1 = interleave(&mut rng, seqs);
    phase1.push(record(
        "bad".into(),
        entity_update("C-0000", serde_json::json!("seventeen")),
    ));
    phase1.push(record("bad".into(), entity_update("C-0001", serde_json::json!(2.5))));
    produce(&names.input, &phase1);

    let dir = tempfile::tempdir().expect("tempdir");
    let first = Tally::start_example("entity-sync.yaml", &names, dir.path(), "i1");
    assert_eq!(
        wait_for_count(&names.output, model_out as usize, Duration::from_secs(120)),
        model_out as usize
    );
    let lines1 = first.stop();

    // Phase 2, after the restart: stale replays under random keys (any partition) and one newer
    // version for every third entity.
    let mut phase2 = Vec::new();
    for (i, (id, max)) in max_version.iter_mut().enumerate() {
        for _ in 0..rng.random_range(1..=2) {
            let old = rng.random_range(1..=*max);
            phase2.push(record(
                format!("replay-{}", rng.random::<u32>()),
                entity_update(id, serde_json::json!(old)),
            ));
            model_stale += 1;
        }
        if i % 3 == 0 {
            *max += 1;
            phase2.push(record(id.clone(), entity_update(id, serde_json::json!(*max))));
            model_out += 1;
        }
    }
    phase2.shuffle(&mut rng);
    produce(&names.input, &phase2);
    let second = Tally::start_example("entity-sync.yaml", &names, dir.path(), "i1");
    assert_eq!(
        wait_for_count(&names.output, model_out as usize, Duration::from_secs(120)),
        model_out as usize
    );
    let lines2 = second.stop();

    let output = read_committed(&names.output, model_out as usize, Duration::from_secs(20));
    assert_eq!(output.len() as u64, model_out);
    let mut per_entity: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for m in &output {
        let v = json(m);
        let version = match &v["version"] {
            serde_json::Value::String(s) => s.parse().expect("numeric string"),
            other => other.as_i64().expect("integer version"),
        };
        let key = String::from_utf8_lossy(m.key().expect("key")).into_owned();
        assert_eq!(
            key,
            format!("customer:{}", v["entity_id"].as_str().expect("id")),
            "keyed by entity"
        );
        per_entity
            .entry(v["entity_id"].as_str().expect("id").to_string())
            .or_default()
            .push(version);
    }
    for (id, versions) in &per_entity {
        assert!(
            versions.windows(2).all(|w| w[0] < w[1]),
            "{id}: versions not strictly increasing: {versions:?}"
        );
        assert_eq!(versions.last(), max_version.get(id), "{id} ends at its highest version");
    }
    assert_eq!(per_entity.len(), max_version.len());
    let summary =
        |lines: &[serde_json::Value], field: &str| events(lines, "tally stopped")[0][field].as_u64().expect(field);
    assert_eq!(
        summary(&lines1, "stale") + summary(&lines2, "stale"),
        model_stale,
        "stale = model"
    );
    assert_eq!(
        summary(&lines1, "dead_lettered"),
        2,
        "non-integer versions are dead-lettered"
    );
    let dlq = read_committed(&names.dlq, 2, Duration::from_secs(20));
    assert!(dlq
        .iter()
        .all(|m| header(m, "tally.error.reason").as_deref() == Some("invalid_version")));
}

#[test]
fn merge_applies_each_increment_once_whatever_the_redeliveries() {
    let names = Names::new("merge");
    create_topics(&[(&names.input, 3), (&names.output, 3), (&names.dlq, 1)]);
    let mut rng = StdRng::seed_from_u64(47);
    let mut lines_of: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut input = Vec::new();
    for c in 0..80 {
        let cart = format!("CART-{c:03}");
        for l in 0..rng.random_range(2..=6) {
            let line = format!("{cart}-L{l}");
            lines_of.entry(cart.clone()).or_default().insert(line.clone());
            let payload = serde_json::json!({
                "event_type": "cart.line_added", "cart_id": cart, "line_id": line,
                "sku": format!("SKU-{}", rng.random_range(1..500)), "qty": rng.random_range(1..4)
            });
            // Each increment delivered 1-3 times, under any message key.
            for _ in 0..rng.random_range(1..=3) {
                input.push(record(format!("k-{}", rng.random::<u32>()), payload.clone()));
            }
        }
    }
    input.shuffle(&mut rng);
    let distinct: usize = lines_of.values().map(BTreeSet::len).sum();
    produce(&names.input, &input);

    let dir = tempfile::tempdir().expect("tempdir");
    let tally = Tally::start_example("cart-merge.yaml", &names, dir.path(), "i1");
    assert_eq!(
        wait_for_count(&names.output, distinct, Duration::from_secs(120)),
        distinct
    );
    let lines = tally.stop();

    let output = read_committed(&names.output, distinct, Duration::from_secs(20));
    assert_eq!(output.len(), distinct, "one merged state per accepted increment");
    let mut last_state: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for m in &output {
        let state = json(m);
        let cart = state["entity"].as_str().expect("entity").to_string();
        let previous = last_state
            .get(&cart)
            .and_then(|s| s["increments"].as_u64())
            .unwrap_or(0);
        assert_eq!(
            state["increments"].as_u64(),
            Some(previous + 1),
            "{cart}: states grow by one line"
        );
        last_state.insert(cart, state);
    }
    for (cart, expected) in &lines_of {
        let state = &last_state[cart];
        let got: BTreeSet<String> = state["lines"]
            .as_array()
            .expect("lines")
            .iter()
            .map(|l| l["line_id"].as_str().expect("line_id").to_string())
            .collect();
        assert_eq!(&got, expected, "{cart}: merged state = each increment applied once");
    }
    let s = events(&lines, "tally stopped")[0];
    assert_eq!(s["duplicates"].as_u64(), Some((input.len() - distinct) as u64));
}

#[test]
fn inventory_adjustments_come_out_once_per_sku_warehouse_batch() {
    let names = Names::new("inventory");
    create_topics(&[(&names.input, 3), (&names.output, 3), (&names.dlq, 1)]);
    let mut rng = StdRng::seed_from_u64(5);
    let mut expected = BTreeSet::new();
    let mut input = Vec::new();
    for i in 0..400 {
        let (sku, wh, batch) = (
            format!("SKU-{}", i % 97),
            format!("WH-{}", i % 3),
            format!("B-{}", i / 97),
        );
        expected.insert(format!("{sku}:{wh}:{batch}"));
        let payload = serde_json::json!({
            "event_type": "inventory.adjusted", "sku": sku, "warehouse": wh, "batch": batch, "delta": -5
        });
        for _ in 0..rng.random_range(1..=3) {
            input.push(record(format!("m-{}", rng.random::<u32>()), payload.clone()));
        }
    }
    input.shuffle(&mut rng);
    produce(&names.input, &input);
    let dir = tempfile::tempdir().expect("tempdir");
    let tally = Tally::start_example("inventory.yaml", &names, dir.path(), "i1");
    assert_eq!(
        wait_for_count(&names.output, expected.len(), Duration::from_secs(120)),
        expected.len()
    );
    tally.stop();
    let output = read_committed(&names.output, expected.len(), Duration::from_secs(20));
    let got: Vec<String> = output
        .iter()
        .map(|m| {
            let v = json(m);
            format!(
                "{}:{}:{}",
                v["sku"].as_str().unwrap_or(""),
                v["warehouse"].as_str().unwrap_or(""),
                v["batch"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(got.len(), expected.len(), "no duplicates");
    assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), expected);
}
