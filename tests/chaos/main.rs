//! Exactly-once under fire: a seeded driver (payments, entity sync, cart merges, poison), a
//! fault schedule (SIGKILLs, clean bounces, scale 3 → 1 → 3, broker restarts, a lost state
//! directory) and a verifier that recomputes the right answer from the input topics alone.
//!
//! Short run in the test command; the long run is the same test with bigger numbers
//! (`scripts/chaos`): TALLY_CHAOS_EVENTS (business events, default 100000), TALLY_CHAOS_KILLS
//! (6), TALLY_CHAOS_SCALES (3 → 1 → 3 cycles, 1), TALLY_CHAOS_BROKER_RESTARTS (1; the first is
//! a SIGKILL, then SIGTERM and SIGKILL alternate), TALLY_CHAOS_STATE_LOSSES (1),
//! TALLY_CHAOS_SEED (a fresh random seed per run, printed first and in the verdict), TALLY_CHAOS_RECONCILE_THRESHOLD and TALLY_CHAOS_RECONCILE_SCAN
//! (the live reconciler's alert threshold and scan interval, 30s and 1s). An odd seed runs every
//! instance with two stream threads and a standby replica of each stateful task, an even one
//! with one thread and none (TALLY_CHAOS_THREADS and TALLY_CHAOS_STANDBYS override). For diagnosis,
//! TALLY_CHAOS_KAFKA_DEBUG sets librdkafka's `debug` (e.g. `cgrp`) and TALLY_CHAOS_RUST_LOG the
//! instances' log filter (e.g. `info,librdkafka=debug`). Broker restarts go through
//! `deploy/local/kafka` with this process's environment, so the broker at KAFKA_BOOTSTRAP must be
//! the one it manages.

#[path = "../common/mod.rs"]
mod common;
mod driver;
mod faults;
mod verifier;

use common::*;
use faults::{Cluster, Fault, Plan};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;
use std::time::{Duration, Instant};
use verifier::{Topics, PIPELINES};

/// Partitions of the trace topic, so reconciler tasks.
const TRACE_PARTITIONS: i32 = 6;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn exactly_once_survives_sigkills_scaling_broker_restarts_and_lost_state() {
    let events = env_or("TALLY_CHAOS_EVENTS", 100_000) as usize;
    // A fresh seed per run, so every run of the test command explores another schedule; the
    // verdict prints it and TALLY_CHAOS_SEED replays it.
    let seed = env_or("TALLY_CHAOS_SEED", rand::random::<u32>() as u64);
    let plan = Plan {
        kills: env_or("TALLY_CHAOS_KILLS", 6),
        scales: env_or("TALLY_CHAOS_SCALES", 1),
        broker_restarts: env_or("TALLY_CHAOS_BROKER_RESTARTS", 1),
        state_losses: env_or("TALLY_CHAOS_STATE_LOSSES", 1),
        freezes: env_or("TALLY_CHAOS_FREEZES", 1),
    };
    let shape = Shape::for_run(seed);
    if plan.broker_restarts > 0 {
        faults::assert_broker_is_ours();
    }
    let max_bytes = 4096;
    let started = Instant::now();
    let names = Names::new("chaos");
    let topics = Topics {
        inputs: PIPELINES.map(|p| format!("{}-{p}", names.input)),
        outputs: PIPELINES.map(|p| format!("{}-{p}", names.output)),
        dlq: names.dlq.clone(),
        trace: names.trace.clone(),
    };
    let partitions = [6, 4, 4];
    let mut create: Vec<(&str, i32)> = vec![(&topics.dlq, 2), (&topics.trace, TRACE_PARTITIONS), (&names.alerts, 1)];
    for ((input, output), n) in topics.inputs.iter().zip(&topics.outputs).zip(partitions) {
        create.push((input, n));
        create.push((output, n));
    }
    create_topics(&create);

    let streams = driver::generate(events, max_bytes, seed);
    let records: usize = streams.iter().map(Vec::len).sum();
    // Kept when the run fails, for inspection.
    let dir = tempfile::tempdir().expect("tempdir").keep();
    let topology = dir.as_path().join("topology.yaml");
    let yaml = topology_yaml(&names.app, &topics, &names.alerts, max_bytes, shape);
    std::fs::write(&topology, yaml).expect("write topology");
    eprintln!(
        "chaos: {records} records, seed {seed} (TALLY_CHAOS_SEED={seed} replays it), {}, state and logs in {}",
        shape.describe(),
        dir.as_path().display()
    );

    let mut cluster = Cluster::start(&topology, dir.as_path());
    let writer = {
        let topics = topics.inputs.clone();
        std::thread::spawn(move || driver::write(topics, streams))
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let schedule = plan.schedule(&mut rng);
    for (n, fault) in schedule.iter().enumerate() {
        std::thread::sleep(Duration::from_millis(rng.random_range(1_500..4_000)));
        let what = cluster.apply(*fault, &mut rng);
        eprintln!(
            "[{:>6.1}s] {what} ({}/{})",
            started.elapsed().as_secs_f64(),
            n + 1,
            schedule.len()
        );
    }
    writer.join().expect("driver");
    eprintln!("[{:>6.1}s] driver done", started.elapsed().as_secs_f64());
    let closed = wait_until_traced(&topics.trace, records, &mut cluster);
    eprintln!(
        "[{:>6.1}s] quiescent: {closed} of {records} events closed on the trace topic",
        started.elapsed().as_secs_f64()
    );
    cluster.check_alive();
    // The live reconciler's view of the same thing: its open-event gauge drains to zero.
    let position = group_position(&names.app, &topics.trace);
    let (open, reporting) =
        cluster.reconciler_open_events(TRACE_PARTITIONS as usize, Duration::from_secs(60), position);
    eprintln!(
        "[{:>6.1}s] reconciler: {open} open events over {reporting} tasks",
        started.elapsed().as_secs_f64()
    );
    cluster.stop_all();
    let exits = std::mem::take(&mut cluster.exits);

    // Verifier: no transaction left open, then every topic read with read_committed.
    for topic in topics.outputs.iter().chain([&topics.dlq, &topics.trace, &names.alerts]) {
        assert_no_open_transactions(topic);
    }
    // Alerts for events open past the threshold are expected while the broker is away; counted only.
    let alerts = read_committed(&names.alerts, 0, Duration::from_secs(30))
        .iter()
        .filter(|m| m.payload() != Some(b"marker".as_slice()))
        .count();
    let mut report = verifier::verify(&topics, max_bytes);
    report.add("instances exited or hung", exits.len() as u64, exits.join("; "));
    let stalled = stalled_partitions(&names.app, &topics.inputs, &partitions);
    report.add("stalled partitions", stalled.len() as u64, stalled.join(", "));
    report.add(
        "reconciler open events",
        open.unsigned_abs() + (reporting < TRACE_PARTITIONS as usize) as u64,
        format!("tally_reconcile_open_events sums to {open} over {reporting} of {TRACE_PARTITIONS} reconciler tasks"),
    );
    let count = |f: Fault| schedule.iter().filter(|g| **g == f).count();
    let verdict = format!(
        "chaos verdict: {} — {} business events in {records} records | {} | faults: kills {}, scale cycles {}, \
         broker restarts {} (SIGTERM {}, SIGKILL {}), state dirs lost {}, zombies {}, seed {seed}, {} | reconciler: {open} open over \
         {reporting} tasks, {alerts} alerts | {:.0}s",
        if report.passed() { "PASS" } else { "FAIL" },
        report.business_events(),
        report.summary(),
        count(Fault::Kill),
        count(Fault::Scale),
        plan.broker_restarts,
        count(Fault::BrokerRestart { sigkill: false }),
        count(Fault::BrokerRestart { sigkill: true }),
        count(Fault::LoseState),
        count(Fault::Freeze),
        shape.describe(),
        started.elapsed().as_secs_f64()
    );
    println!("{verdict}");
    assert!(
        report.passed(),
        "{verdict}\nexamples:\n  {}\nlogs and state kept in {}",
        report.examples().join("\n  "),
        dir.display()
    );
    std::fs::remove_dir_all(&dir).expect("remove the run's directory");
}

/// How the instances run their tasks: one stream thread and no standby, or two threads each and
/// a standby replica of every stateful task (tasks move between threads of one instance, and a
/// standby is promoted when its active dies).
#[derive(Debug, Clone, Copy)]
struct Shape {
    threads: u64,
    standbys: u64,
    /// TALLY_CHAOS_GROUP_PROTOCOL=consumer runs KIP-848 groups (without standbys, which need
    /// the classic protocol), else `classic`.
    consumer_protocol: bool,
}

impl Shape {
    /// TALLY_CHAOS_THREADS / TALLY_CHAOS_STANDBYS when set, else by the seed's parity, so a sweep
    /// covers both shapes and a seed replays its own.
    fn for_run(seed: u64) -> Self {
        let threaded = seed % 2 == 1;
        let consumer_protocol = std::env::var("TALLY_CHAOS_GROUP_PROTOCOL").is_ok_and(|p| p == "consumer");
        Self {
            threads: env_or("TALLY_CHAOS_THREADS", if threaded { 2 } else { 1 }),
            standbys: if consumer_protocol {
                0
            } else {
                env_or("TALLY_CHAOS_STANDBYS", threaded as u64)
            },
            consumer_protocol,
        }
    }

    fn describe(self) -> String {
        let protocol = if self.consumer_protocol { "consumer" } else { "classic" };
        format!(
            "threads {}, standbys {}, group protocol {protocol}",
            self.threads, self.standbys
        )
    }

    /// `kafka.properties` and the extra `processing` settings of the group protocol: the
    /// consumer protocol takes session and heartbeat times from the broker
    /// (deploy/local/broker.properties.in sets the same 6 s and 1 s).
    fn group_settings(self) -> (Vec<String>, &'static str) {
        if self.consumer_protocol {
            (Vec::new(), ", group_protocol: consumer")
        } else {
            (
                vec!["session.timeout.ms: 6000".into(), "heartbeat.interval.ms: 1000".into()],
                "",
            )
        }
    }
}

fn topology_yaml(app: &str, t: &Topics, alerts: &str, max_bytes: usize, shape: Shape) -> String {
    let (mut properties, protocol) = shape.group_settings();
    properties.extend(std::env::var("TALLY_CHAOS_KAFKA_DEBUG").map(|d| format!("debug: {d}")));
    format!(
        r#"
application_id: {app}
kafka:
  bootstrap_servers: "{bootstrap}"
  properties: {{ {properties} }}
# Static membership: a killed instance restarted within the session timeout gets its own tasks
# back and resumes from its own stores, the case that exposes a store running ahead of its
# committed changelog.
processing: {{ commit_interval_ms: 100, max_record_bytes: {max_bytes}, static_membership: true, threads: {threads}, num_standby_replicas: {standbys}{protocol} }}
state: {{ dir: "${{TALLY_STATE_DIR}}" }}
sources:
  payments: {{ topic: {in0} }}
  entities: {{ topic: {in1} }}
  carts: {{ topic: {in2} }}
pipelines:
  - name: payments
    from: payments
    repartition: {{ key: "{{payment_id}}" }}
    key: "{{payment_id}}:{{status}}"
    routes:
      - when: {{ event_type: "payment.*" }}
        strategy: ignore
    to: {{ topic: {out0}, key: "{{payment_id}}" }}
  - name: entities
    from: entities
    repartition: {{ key: "{{entity_type}}:{{entity_id}}" }}
    key: "{{entity_type}}:{{entity_id}}:v{{version}}"
    routes:
      - when: {{ event_type: "entity.updated" }}
        strategy: overwrite
        entity: "{{entity_type}}:{{entity_id}}"
        version: "{{version}}"
    to: {{ topic: {out1} }}
  - name: carts
    from: carts
    repartition: {{ key: "{{cart_id}}" }}
    key: "{{cart_id}}:{{line_id}}"
    routes:
      - when: {{ event_type: "cart.line_added" }}
        strategy: merge
        entity: "{{cart_id}}"
        increment_id: "{{line_id}}"
        into: lines
        emit: state
        max_state_bytes: 65536
    to: {{ topic: {out2} }}
dead_letter: {{ topic: {dlq} }}
trace: {{ topic: {trace}, level: all }}
reconcile: {{ alerts_topic: {alerts}, scan_interval: {scan}, threshold: {threshold} }}
"#,
        bootstrap = bootstrap(),
        threads = shape.threads,
        standbys = shape.standbys,
        properties = properties.join(", "),
        in0 = t.inputs[0],
        in1 = t.inputs[1],
        in2 = t.inputs[2],
        out0 = t.outputs[0],
        out1 = t.outputs[1],
        out2 = t.outputs[2],
        dlq = t.dlq,
        trace = t.trace,
        threshold = std::env::var("TALLY_CHAOS_RECONCILE_THRESHOLD").unwrap_or_else(|_| "30s".into()),
        scan = std::env::var("TALLY_CHAOS_RECONCILE_SCAN").unwrap_or_else(|_| "1s".into()),
    )
}

/// A client that reads `group`'s committed offsets (an OffsetFetch) without joining the group.
fn offsets_client(group: &str) -> BaseConsumer {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("offsets client")
}

/// Input partitions whose committed position (the group's offset, read without joining it) is
/// short of the partition's end: a record tally never got past, whatever the outputs say.
fn stalled_partitions(group: &str, inputs: &[String; 3], partitions: &[i32; 3]) -> Vec<String> {
    let client = offsets_client(group);
    let mut tpl = rdkafka::TopicPartitionList::new();
    for (topic, n) in inputs.iter().zip(partitions) {
        for p in 0..*n {
            tpl.add_partition(topic, p);
        }
    }
    let committed = client
        .committed_offsets(tpl, Duration::from_secs(30))
        .expect("the group's committed offsets");
    committed
        .elements()
        .iter()
        .filter_map(|e| {
            let (_, end) = client
                .fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(30))
                .expect("watermarks");
            let at = e.offset().to_raw().unwrap_or(-1);
            (at < end).then(|| format!("{}[{}] at {at} of {end}", e.topic(), e.partition()))
        })
        .collect()
}

/// The group's committed offsets on `topic` summed over its partitions, read with a client
/// that never joins the group (an OffsetFetch): how far the reconciler has read.
fn group_position(group: &str, topic: &str) -> impl FnMut() -> i64 {
    let client = offsets_client(group);
    let mut partitions = rdkafka::TopicPartitionList::new();
    for p in 0..TRACE_PARTITIONS {
        partitions.add_partition(topic, p);
    }
    move || {
        client
            .committed_offsets(partitions.clone(), Duration::from_secs(10))
            .map(|c| {
                c.elements()
                    .iter()
                    .filter_map(|e| e.offset().to_raw())
                    .filter(|o| *o > 0)
                    .sum()
            })
            .unwrap_or(0)
    }
}

/// Waits until the trace topic holds a terminal record for every input record, or none arrived
/// for 60 s (the verifier then says what is open); returns the count. It only ends the wait:
/// the verifier does not rely on it.
fn wait_until_traced(trace: &str, records: usize, cluster: &mut Cluster) -> usize {
    let (consumer, _): (BaseConsumer, usize) = committed_reader(trace, false);
    let is_terminal =
        |p: &[u8]| p.windows(11).any(|w| w == b"\"COMPLETED\"") || p.windows(8).any(|w| w == b"\"FAILED\"");
    let (mut closed, mut progress) = (0, Instant::now());
    while closed < records && progress.elapsed() < Duration::from_secs(60) {
        // Errors while the broker is away are the client's to ride out.
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            if m.payload().is_some_and(is_terminal) {
                closed += 1;
                progress = Instant::now();
            }
        }
        if progress.elapsed() > Duration::from_secs(10) {
            cluster.check_alive();
        }
    }
    closed
}
