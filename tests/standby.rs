//! Standby replicas: after a failover, the instance that held a standby copy of the lost
//! instance's task restores only the changelog tail; without standbys it restores everything.

mod common;

use common::*;
use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};
use tally::demo::generator;

const EVENTS: usize = 12_000;

/// Topology with two instances' worth of settings; `${TALLY_STATE_DIR}` differs per instance.
fn yaml(standbys: usize) -> String {
    format!(
        r#"
application_id: ${{TALLY_APP_ID}}
kafka:
  bootstrap_servers: ${{KAFKA_BOOTSTRAP}}
  properties: {{ session.timeout.ms: 6000, heartbeat.interval.ms: 1000 }}
processing: {{ commit_interval_ms: 100, num_standby_replicas: {standbys} }}
state: {{ dir: "${{TALLY_STATE_DIR}}" }}
sources:
  payments: {{ topic: "${{TALLY_INPUT_TOPIC}}" }}
pipelines:
  - name: payments
    from: payments
    repartition: {{ key: "{{payment_id}}" }}
    key: "{{payment_id}}:{{status}}"
    routes:
      - when: {{ event_type: "payment.*" }}
        strategy: ignore
    to: {{ topic: "${{TALLY_OUTPUT_TOPIC}}", key: "{{payment_id}}" }}
dead_letter: {{ topic: "${{TALLY_DLQ_TOPIC}}" }}
"#
    )
}

/// Waits until `tally`'s log has an event `msg` matching `pred`, returning it.
fn wait_for_event(
    tally: &Tally,
    msg: &str,
    timeout: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Option<serde_json::Value> {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        let lines = tally.lines();
        if let Some(e) = events(&lines, msg).into_iter().find(|e| pred(e)) {
            return Some(e.clone());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    None
}

fn task_partition(e: &serde_json::Value) -> Option<i32> {
    e["task"].as_str()?.rsplit_once('-')?.1.parse().ok()
}

struct Failover {
    /// Records the survivor restored for the tasks it took over.
    restored: u64,
    /// Committed changelog records of those tasks.
    changelog: u64,
    /// True when every taken-over store resumed from a recorded changelog offset: a warm copy,
    /// handed over by the standby thread or reopened from the directory it kept current.
    warm: bool,
    /// Stores the standby thread handed over directly.
    promoted: usize,
}

/// The stateful tasks (partitions of `topic`) an instance owns now, replaying its log in order:
/// a task is its own from "task ready" until "task closed (revoked)".
fn owned(t: &Tally, topic: &str) -> BTreeSet<i32> {
    let mut owned = BTreeSet::new();
    for e in t.lines().iter().filter(|e| e["topic"] == topic) {
        match e["message"].as_str() {
            Some("task ready") => owned.extend(task_partition(e)),
            Some("task closed (revoked)") => {
                e["partition"].as_i64().map(|p| owned.remove(&(p as i32)));
            }
            _ => {}
        }
    }
    owned
}

/// Of two instances, the one owning stateful tasks (the victim, with the tasks it owns) and the
/// other. Stateful tasks read the repartition topic; the sticky assignor balances task counts,
/// so one instance may hold both stateful tasks and the other both repartition tasks.
fn victim_and_survivor(names: &Names, a: Tally, b: Tally) -> (Tally, Tally, BTreeSet<i32>) {
    let stateful = format!("{}-payments-repartition", names.app);
    let (victim, survivor) = if owned(&a, &stateful).is_empty() {
        (b, a)
    } else {
        (a, b)
    };
    let lost = owned(&victim, &stateful);
    (victim, survivor, lost)
}

/// "restore finished" events of the given changelog partitions.
fn restores(t: &Tally, partitions: &BTreeSet<i32>) -> Vec<serde_json::Value> {
    let lines = t.lines();
    events(&lines, "restore finished")
        .into_iter()
        .filter(|e| {
            e["partition"]
                .as_i64()
                .is_some_and(|p| partitions.contains(&(p as i32)))
        })
        .cloned()
        .collect()
}

/// Two instances share a 2-partition input; the one owning stateful tasks is SIGKILLed and
/// the other takes them over.
fn failover(standbys: usize) -> Failover {
    let names = Names::new(&format!("standby{standbys}"));
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Tally::start_yaml(&yaml(standbys), &names, dir.path(), "a");
    let b = Tally::start_yaml(&yaml(standbys), &names, dir.path(), "b");
    let ready = |t: &Tally| wait_for_event(t, "task ready", Duration::from_secs(90), |_| true);
    assert!(ready(&a).is_some() && ready(&b).is_some(), "both instances run a task");

    let gen = generator::payments(EVENTS, 0, 0, 11 + standbys as u64);
    produce(&names.input, &gen.records);
    let got = wait_for_count(&names.output, gen.expected_keys.len(), Duration::from_secs(120));
    assert_eq!(got, gen.expected_keys.len(), "all events processed before the failover");
    let (victim, survivor, lost) = victim_and_survivor(&names, a, b);
    assert!(!lost.is_empty(), "one of the instances owns stateful tasks");
    if standbys > 0 {
        for p in &lost {
            let opened = wait_for_event(&survivor, "standby opened", Duration::from_secs(60), |e| {
                task_partition(e) == Some(*p)
            });
            assert!(opened.is_some(), "the survivor keeps a standby of task {p}");
        }
        // Let the standbys apply the changelog they have not read yet (they poll every 100 ms).
        std::thread::sleep(Duration::from_secs(5));
    }
    let before = restores(&survivor, &lost).len();
    victim.kill();

    let end = Instant::now() + Duration::from_secs(90);
    let taken_over = loop {
        let all = restores(&survivor, &lost);
        if all.len() >= before + lost.len() {
            break all[before..].to_vec();
        }
        assert!(Instant::now() < end, "the survivor restored the lost tasks {lost:?}");
        std::thread::sleep(Duration::from_millis(250));
    };
    // Every event again: the taken-over state must drop them all as duplicates.
    produce(&names.input, &gen.records);
    std::thread::sleep(Duration::from_secs(5));
    let lines = survivor.stop();
    let output = read_committed(&names.output, gen.expected_keys.len(), Duration::from_secs(20));
    let keys: HashSet<String> = output.iter().map(business_key).collect();
    assert_eq!(
        output.len(),
        gen.expected_keys.len(),
        "no event emitted twice after the failover"
    );
    assert_eq!(keys.len(), gen.expected_keys.len());
    let changelog = read_committed(&names.changelog("payments"), 0, Duration::from_secs(20))
        .iter()
        .filter(|m| lost.contains(&rdkafka::Message::partition(*m)))
        .count() as u64;
    let promoted = events(
        &lines,
        "standby promoted to active: only the changelog tail is restored",
    )
    .into_iter()
    .filter_map(task_partition)
    .filter(|p| lost.contains(p))
    .count();
    Failover {
        restored: taken_over.iter().filter_map(|r| r["restored"].as_u64()).sum(),
        changelog,
        warm: taken_over
            .iter()
            .all(|r| r["from_offset"].as_i64().is_some_and(|o| o > 0) && r["wiped"] == false),
        promoted,
    }
}

#[test]
fn failover_with_a_standby_restores_fewer_records_than_without() {
    let without = failover(0);
    eprintln!(
        "without standby: restored {} of {} changelog records",
        without.restored, without.changelog
    );
    let with = failover(1);
    eprintln!(
        "with standby: restored {} of {} changelog records (warm: {}, handed over: {})",
        with.restored, with.changelog, with.warm, with.promoted
    );
    assert!(without.changelog > 1_000, "the lost task had state");
    // Without a standby the survivor restores what it has no copy of: the whole changelog, or,
    // when the group let it hold the task for a while during startup, the rest after its copy.
    assert!(
        without.restored > 0 && without.restored <= without.changelog,
        "no standby: the survivor restores the changelog itself ({} of {})",
        without.restored,
        without.changelog
    );
    assert!(!without.warm && without.promoted == 0);
    assert!(with.warm, "the survivor resumed from its standby copies");
    assert!(with.changelog > 1_000);
    assert!(
        with.restored * 10 < with.changelog,
        "a standby leaves only the tail: restored {} of {}",
        with.restored,
        with.changelog
    );
    assert!(with.restored < without.restored);
}

/// A standby that waits on the broker (its changelogs' partitions without a leader) must not
/// hold up the instance's stream threads: they take over a failed instance's tasks meanwhile.
#[test]
fn a_standby_open_waiting_on_the_broker_does_not_hold_up_a_takeover() {
    let names = Names::new("standby-stall");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    // Each instance's first standby open stalls for 30 s.
    let stall = [("TALLY_FAULTS", "standby_open_stalls@1".to_string())];
    let a = Tally::start_yaml_with(&yaml(1), &names, dir.path(), "a", &stall);
    let b = Tally::start_yaml_with(&yaml(1), &names, dir.path(), "b", &stall);
    let ready = |t: &Tally| wait_for_event(t, "task ready", Duration::from_secs(90), |_| true);
    assert!(ready(&a).is_some() && ready(&b).is_some(), "both instances run a task");
    let (victim, survivor, lost) = victim_and_survivor(&names, a, b);
    let stalled = wait_for_event(
        &survivor,
        "injecting a fault (TALLY_FAULTS)",
        Duration::from_secs(90),
        |_| true,
    );
    assert!(
        stalled.is_some(),
        "the survivor's standby thread stalls opening its standby"
    );
    let before = restores(&survivor, &lost).len();
    let killed = Instant::now();
    victim.kill();

    // The stall lasts 30 s; the group hands the lost tasks over once the victim's session (6 s)
    // expires.
    let end = killed + Duration::from_secs(25);
    loop {
        if restores(&survivor, &lost).len() >= before + lost.len() {
            break;
        }
        assert!(
            Instant::now() < end,
            "the survivor took over {lost:?} only after its standby thread's stall, not within 25 s"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!(
        "tasks {lost:?} taken over {:.1}s after the kill",
        killed.elapsed().as_secs_f64()
    );
    survivor.stop();
}
