//! Exactly-once under fire: a seeded driver, a fault schedule (SIGKILLs, clean bounces, scale
//! 3 → 1 → 3) and a verifier that recomputes the right answer from the input topic alone.
//!
//! Short run in the test command; the long run is `scripts/chaos` (same test, bigger numbers):
//! TALLY_CHAOS_EVENTS (default 100000), TALLY_CHAOS_KILLS (default 6), TALLY_CHAOS_SEED.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::message::OwnedMessage;
use rdkafka::Message;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tally::demo::generator;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What the verifier derives from one input record, by its own reading of the rules.
enum Expect {
    Key(String),
    Poison,
}

fn expectation(m: &OwnedMessage, max_bytes: usize) -> Expect {
    let Some(bytes) = m.payload() else {
        return Expect::Poison;
    };
    if bytes.len() > max_bytes {
        return Expect::Poison;
    }
    let Ok(serde_json::Value::Object(doc)) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return Expect::Poison;
    };
    match (doc.get("payment_id"), doc.get("status")) {
        (Some(serde_json::Value::String(p)), Some(serde_json::Value::String(s))) => Expect::Key(format!("{p}:{s}")),
        _ => Expect::Poison,
    }
}

#[test]
fn exactly_once_survives_sigkills_bounces_and_scaling() {
    let events = env_or("TALLY_CHAOS_EVENTS", 100_000) as usize;
    let kills = env_or("TALLY_CHAOS_KILLS", 6);
    let seed = env_or("TALLY_CHAOS_SEED", 2026);
    let max_bytes = 4096;
    let started = Instant::now();
    let names = Names::new("chaos");
    create_topics(&[(&names.input, 6), (&names.output, 6), (&names.dlq, 2)]);
    let gen = generator::payments(events, 10, max_bytes, seed);
    let dir = tempfile::tempdir().expect("tempdir");
    // Static membership: a killed instance restarted within the session timeout gets its own
    // tasks back and resumes from its own stores, the case that exposes a store running ahead
    // of its committed changelog.
    let topology = dir.path().join("topology.yaml");
    let yaml = format!(
        r#"
application_id: {app}
kafka:
  bootstrap_servers: "{bootstrap}"
  properties: {{ session.timeout.ms: 6000, heartbeat.interval.ms: 1000 }}
processing: {{ commit_interval_ms: 100, max_record_bytes: {max_bytes}, static_membership: true }}
state: {{ dir: "${{TALLY_STATE_DIR}}" }}
sources: {{ payments: {{ topic: {input} }} }}
pipelines:
  - name: payments
    from: payments
    repartition: {{ key: "{{payment_id}}" }}
    key: "{{payment_id}}:{{status}}"
    to: {{ topic: {output}, key: "{{payment_id}}" }}
dead_letter: {{ topic: {dlq} }}
"#,
        app = names.app,
        bootstrap = bootstrap(),
        input = names.input,
        output = names.output,
        dlq = names.dlq,
    );
    std::fs::write(&topology, yaml).expect("write topology");
    let mut launches = 0;
    let mut start = |id: &str| {
        launches += 1;
        // Each instance keeps its state directory across restarts, as on its own host.
        let state = [(
            "TALLY_STATE_DIR",
            dir.path().join(format!("state-{id}")).display().to_string(),
        )];
        Tally::start_with_env(&topology, id, dir.path().join(format!("{id}-{launches}.log")), &state)
    };

    // Driver: the whole stream, faster than the instances process it, so faults land while
    // transactions with outputs and store writes are open.
    let (input, records) = (names.input.clone(), gen.records.clone());
    let chunk = (records.len() / 60).max(1000);
    let writer = std::thread::spawn(move || produce_paced(&input, &records, chunk, Duration::from_millis(20)));

    // Fault schedule.
    let mut rng = StdRng::seed_from_u64(seed);
    let ids = ["c1", "c2", "c3"];
    let mut running: Vec<Option<Tally>> = ids.iter().map(|id| Some(start(id))).collect();
    let mut watcher = Watcher::new(&names.output);
    let nap = |w: &mut Watcher, ms: u64| w.wait_for(usize::MAX, Duration::from_millis(ms));
    for k in 0..kills {
        nap(&mut watcher, rng.random_range(1_500..4_000));
        let i = rng.random_range(0..3);
        if let Some(t) = running[i].take() {
            t.kill();
        }
        eprintln!(
            "[{:>5.1}s] SIGKILL {} ({}/{kills})",
            started.elapsed().as_secs_f64(),
            ids[i],
            k + 1
        );
        nap(&mut watcher, 300);
        running[i] = Some(start(ids[i]));
        if k == kills / 2 {
            // Scale 3 → 1 (clean stops) → 3, and a clean bounce of the survivor.
            for t in running.iter_mut().skip(1).filter_map(Option::take) {
                t.stop();
            }
            eprintln!("[{:>5.1}s] scaled to 1", started.elapsed().as_secs_f64());
            nap(&mut watcher, 3_000);
            if let Some(t) = running[0].take() {
                t.stop();
            }
            running[0] = Some(start(ids[0]));
            for (slot, id) in running.iter_mut().zip(ids).skip(1) {
                *slot = Some(start(id));
            }
            eprintln!("[{:>5.1}s] scaled back to 3", started.elapsed().as_secs_f64());
        }
    }
    writer.join().expect("driver");
    let expected_out = gen.expected_keys.len();
    let poison: u64 = gen.poison.values().sum();
    // Quiescence: all outputs arrived, or none for 30 s (the verifier then says what is missing).
    let mut seen = 0;
    loop {
        let now = watcher.wait_for(expected_out, Duration::from_secs(30));
        if now >= expected_out || now == seen {
            break;
        }
        seen = now;
    }
    wait_for_count(&names.dlq, poison as usize, Duration::from_secs(30));
    for t in running.into_iter().flatten() {
        t.stop();
    }

    // Verifier: no transaction left open, then every topic read with read_committed.
    assert_no_open_transactions(&names.output);
    assert_no_open_transactions(&names.dlq);
    let input = read_committed(&names.input, gen.records.len(), Duration::from_secs(60));
    assert_eq!(input.len(), gen.records.len(), "input fully written");
    let is_marker = |m: &OwnedMessage| m.payload() == Some(b"marker".as_slice());
    let output: Vec<_> = read_committed(&names.output, expected_out, Duration::from_secs(60))
        .into_iter()
        .filter(|m| !is_marker(m))
        .collect();
    let dlq: Vec<_> = read_committed(&names.dlq, poison as usize, Duration::from_secs(60))
        .into_iter()
        .filter(|m| !is_marker(m))
        .collect();

    let (mut valid, mut poison_places) = (HashMap::<String, u64>::new(), HashSet::new());
    for m in &input {
        match expectation(m, max_bytes) {
            Expect::Key(k) => *valid.entry(k).or_default() += 1,
            Expect::Poison => {
                poison_places.insert(format!("{}/{}", m.partition(), m.offset()));
            }
        }
    }
    let mut out_count: HashMap<String, u64> = HashMap::new();
    for m in &output {
        *out_count.entry(business_key(m)).or_default() += 1;
    }
    // Full lists for the counts; the assertions show the first few.
    let duplicated: Vec<_> = out_count.iter().filter(|(_, n)| **n > 1).collect();
    let missing: Vec<_> = valid.keys().filter(|k| !out_count.contains_key(*k)).collect();
    let ghosts: Vec<_> = out_count.keys().filter(|k| !valid.contains_key(*k)).collect();
    let mut dlq_places: HashMap<String, u64> = HashMap::new();
    for m in &dlq {
        let place = format!(
            "{}/{}",
            header(m, "tally.source.partition").unwrap_or_default(),
            header(m, "tally.source.offset").unwrap_or_default()
        );
        *dlq_places.entry(place).or_default() += 1;
    }
    let dlq_dups = dlq_places.values().filter(|n| **n > 1).count();
    let dlq_missing = poison_places.iter().filter(|p| !dlq_places.contains_key(*p)).count();
    let duplicates_dropped: u64 = valid.values().map(|n| n - 1).sum();
    let balanced = input.len() as u64 == output.len() as u64 + duplicates_dropped + dlq.len() as u64;
    println!(
        "chaos verdict: {} — input {} (valid {} keys, {} poison), output {}, duplicates dropped {}, dead-lettered {}, \
         duplicated outputs {}, missing {}, ghosts {}, DLQ duplicated {}, DLQ missing {}, kills {kills}, seed {seed}, {:.0}s",
        if duplicated.is_empty() && missing.is_empty() && ghosts.is_empty() && dlq_dups == 0 && dlq_missing == 0 && balanced { "PASS" } else { "FAIL" },
        input.len(),
        valid.len(),
        poison_places.len(),
        output.len(),
        duplicates_dropped,
        dlq.len(),
        duplicated.len(),
        missing.len(),
        ghosts.len(),
        dlq_dups,
        dlq_missing,
        started.elapsed().as_secs_f64()
    );
    assert!(
        duplicated.is_empty(),
        "duplicated outputs, e.g. {:?}",
        &duplicated[..duplicated.len().min(5)]
    );
    assert!(
        missing.is_empty(),
        "lost keys, e.g. {:?}",
        &missing[..missing.len().min(5)]
    );
    assert!(
        ghosts.is_empty(),
        "outputs with no input, e.g. {:?}",
        &ghosts[..ghosts.len().min(5)]
    );
    assert_eq!(
        (dlq_dups, dlq_missing),
        (0, 0),
        "every poison record dead-lettered exactly once"
    );
    assert!(balanced, "input = out + duplicates + dead-lettered");
}
