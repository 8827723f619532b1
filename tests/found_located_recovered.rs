//! The seed's promise, end to end on the real broker: events tally does not process are
//! *found* by the separately deployed reconciler (`tally reconcile live`) within the threshold
//! plus one scan, *located* by `tally inspect` from their correlation id, and *recovered* when
//! tally runs again, each exactly once. Two ways of not processing: every instance stopped, and
//! one instance frozen with SIGSTOP while it holds partitions. A dead-lettered event alerts on
//! its own and stays open until it is redriven or acknowledged. The times are printed (and
//! recorded in docs/reconciliation.md).

mod common;

use common::*;
use rdkafka::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tally::demo::generator::GeneratedRecord;

const SCAN_MS: i64 = 1_000;
const THRESHOLD_MS: i64 = 4_000;
/// Clock, poll and transaction slack on top of "threshold plus one scan".
const SLACK_MS: i64 = 2_500;

/// tally's and the reconciler's topology: the reconciler runs separately. `SESSION` is the
/// group session timeout.
const YAML: &str = r#"
application_id: ${TALLY_APP_ID}
kafka:
  bootstrap_servers: ${KAFKA_BOOTSTRAP}
  properties: { session.timeout.ms: SESSION, heartbeat.interval.ms: 1000 }
processing: { commit_interval_ms: 100 }
state: { dir: "${TALLY_STATE_DIR}" }
sources:
  payments: { topic: "${TALLY_INPUT_TOPIC}" }
pipelines:
  - name: payments
    from: payments
    repartition: { key: "{payment_id}" }
    key: "{payment_id}:{status}"
    correlation_id: { header: correlation_id }
    routes:
      - when: { event_type: "payment.*" }
        strategy: ignore
    to: { topic: "${TALLY_OUTPUT_TOPIC}", key: "{payment_id}" }
dead_letter: { topic: "${TALLY_DLQ_TOPIC}" }
trace: { topic: "${TALLY_TRACE_TOPIC}" }
reconcile: { alerts_topic: "${TALLY_ALERTS_TOPIC}", scan_interval: 1s, threshold: 4s, run: separately }
"#;

fn yaml(session_ms: u32) -> String {
    YAML.replace("SESSION", &session_ms.to_string())
}

/// Payment `i`, with correlation id `corr-<i>`.
fn payment(i: usize) -> GeneratedRecord {
    GeneratedRecord {
        key: format!("P-{i:04}").into_bytes(),
        payload: serde_json::json!({"event_type": "payment.paid", "payment_id": format!("P-{i:04}"), "status": "PAID"})
            .to_string()
            .into_bytes(),
        headers: vec![("correlation_id".to_string(), format!("corr-{i}"))],
    }
}

fn topics(names: &Names) {
    create_topics(&[
        (&names.input, 2),
        (&names.output, 2),
        (&names.dlq, 1),
        (&names.trace, 2),
        (&names.alerts, 1),
    ]);
}

/// The alert records so far, by correlation id, each with when it was read.
struct Alerts {
    reader: rdkafka::consumer::BaseConsumer,
    seen: BTreeMap<String, (serde_json::Value, i64)>,
    records: usize,
}

impl Alerts {
    fn new(names: &Names) -> Self {
        let (reader, _) = committed_reader(&names.alerts, false);
        Self {
            reader,
            seen: BTreeMap::new(),
            records: 0,
        }
    }

    /// Reads until `n` distinct events alerted or `timeout` passes.
    fn wait_for(&mut self, n: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        while self.seen.len() < n && Instant::now() < deadline {
            self.read_for(Duration::from_millis(100));
        }
        self.seen.len()
    }

    fn read_for(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        while Instant::now() < deadline {
            let Some(m) = self.reader.poll(Duration::from_millis(50)) else {
                continue;
            };
            let m = m.expect("read alerts");
            let alert: serde_json::Value =
                serde_json::from_slice(m.payload().unwrap_or_default()).expect("alert is JSON");
            self.records += 1;
            let correlation = alert["correlation_id"].as_str().unwrap_or_default().to_string();
            self.seen.entry(correlation).or_insert((alert, now_ms()));
        }
    }
}

/// `tally inspect --correlation-id <c> --json`, run as an operator would, and its lines.
fn inspect(topology: &Path, env: &[(&str, String)], correlation: &str) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("inspect")
        .arg(topology)
        .args(["--correlation-id", correlation, "--json"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("tally inspect runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("inspect --json prints JSON lines"))
        .collect()
}

/// Every output once: the business keys of the output topic, each counted.
fn outputs_once(names: &Names, expected: usize) {
    let out = read_committed(&names.output, expected, Duration::from_secs(60));
    let mut keys = BTreeMap::new();
    for m in &out {
        *keys.entry(business_key(m)).or_insert(0) += 1;
    }
    assert_eq!(keys.len(), expected, "every payment out");
    let twice: Vec<_> = keys.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "out more than once: {twice:?}");
    assert_eq!(out.len(), expected);
}

#[test]
fn events_sent_while_every_instance_is_stopped_are_found_located_and_recovered() {
    let names = Names::new("flr-stopped");
    topics(&names);
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = yaml(6_000);
    let reconciler = Tally::start_reconciler_yaml(&yaml, &names, dir.path(), "reconciler-1", &[]);
    let tally = Tally::start_yaml(&yaml, &names, dir.path(), "a");
    produce(&names.input, &(0..100).map(payment).collect::<Vec<_>>());
    assert_eq!(wait_for_count(&names.output, 100, Duration::from_secs(60)), 100);
    tally.stop();

    // Found: every event sent while no instance runs alerts, once, within threshold + one scan.
    let mut alerts = Alerts::new(&names);
    let sent_at = now_ms();
    produce(&names.input, &(100..120).map(payment).collect::<Vec<_>>());
    assert_eq!(
        alerts.wait_for(20, Duration::from_secs(30)),
        20,
        "alerts: {:?}",
        alerts.seen.keys()
    );
    let expected: BTreeSet<String> = (100..120).map(|i| format!("corr-{i}")).collect();
    assert_eq!(
        alerts.seen.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "only the unprocessed events"
    );
    let latest = alerts.seen.values().map(|(_, at)| at - sent_at).max().unwrap_or(0);
    let earliest = alerts.seen.values().map(|(_, at)| at - sent_at).min().unwrap_or(0);
    assert!(
        latest <= THRESHOLD_MS + SCAN_MS + SLACK_MS,
        "found {latest} ms after sending, over threshold + one scan + slack"
    );
    assert!(
        earliest >= THRESHOLD_MS - 500,
        "alerted before the threshold: {earliest} ms"
    );
    for (corr, (alert, _)) in &alerts.seen {
        let i: usize = corr.trim_start_matches("corr-").parse().expect("index");
        assert_eq!(alert["kind"], "unprocessed_event");
        assert_eq!(alert["idempotency_key"], format!("P-{i:04}:PAID"), "{alert}");
        assert_eq!(alert["topic"], names.input.as_str(), "{alert}");
        let event = format!("{}/{}/{}", names.input, alert["partition"], alert["offset"]);
        assert_eq!(alert["event_id"], event.as_str());
    }

    // Located: inspect by correlation id says where each waits, and that tally has not consumed it.
    let topology = dir.path().join("a.yaml");
    let env = Tally::env_of(&names, dir.path(), "a", &[]);
    let located = Instant::now();
    for (corr, (alert, _)) in &alerts.seen {
        let lines = inspect(&topology, &env, corr);
        let found: Vec<&serde_json::Value> = lines.iter().filter(|l| l["kind"] == "alert").collect();
        assert_eq!(found.len(), 1, "{corr}: {lines:?}");
        let detail = found[0]["detail"].as_str().unwrap_or_default();
        let place = format!("{}/{}/{}", names.input, alert["partition"], alert["offset"]);
        assert!(detail.contains(&format!("not consumed from {place}")), "{detail}");
        assert!(detail.contains("tally's group still waits"), "{detail}");
    }
    let located_ms = located.elapsed().as_millis() / 20;

    // Recovered: tally runs again and every event comes out exactly once; no alert follows.
    let restarted = Instant::now();
    let tally = Tally::start_yaml(&yaml, &names, dir.path(), "a");
    assert_eq!(wait_for_count(&names.output, 120, Duration::from_secs(60)), 120);
    let recovered_ms = restarted.elapsed().as_millis();
    outputs_once(&names, 120);
    alerts.read_for(Duration::from_millis((3 * SCAN_MS) as u64));
    assert_eq!(alerts.records, 20, "one alert per event, none after recovery");
    tally.stop();
    reconciler.stop();
    eprintln!(
        "found_located_recovered (all stopped): found {earliest}-{latest} ms after sending (threshold {THRESHOLD_MS} ms, \
         scan {SCAN_MS} ms), located {located_ms} ms per event (tally inspect), recovered {recovered_ms} ms after the restart"
    );
}

#[test]
fn events_held_by_a_frozen_instance_are_found_and_recovered_when_the_group_moves_them() {
    let names = Names::new("flr-frozen");
    topics(&names);
    let dir = tempfile::tempdir().expect("tempdir");
    // A session longer than the threshold: the freeze is seen before the group moves anything.
    let yaml = yaml(20_000);
    let reconciler = Tally::start_reconciler_yaml(&yaml, &names, dir.path(), "reconciler-1", &[]);
    let a = Tally::start_yaml(&yaml, &names, dir.path(), "a");
    let b = Tally::start_yaml(&yaml, &names, dir.path(), "b");
    produce(&names.input, &(0..100).map(payment).collect::<Vec<_>>());
    assert_eq!(wait_for_count(&names.output, 100, Duration::from_secs(60)), 100);
    // Both members hold partitions once the first assignment settles.
    std::thread::sleep(Duration::from_secs(2));

    let mut alerts = Alerts::new(&names);
    b.signal("STOP");
    let sent_at = now_ms();
    produce(&names.input, &(100..140).map(payment).collect::<Vec<_>>());
    // Whatever b holds (a source or a repartition partition) stands still: found.
    alerts.wait_for(1, Duration::from_millis((THRESHOLD_MS + SCAN_MS + SLACK_MS) as u64));
    let found_ms = alerts.seen.values().map(|(_, at)| at - sent_at).min();
    assert!(
        found_ms.is_some(),
        "no alert within threshold + one scan while b was frozen"
    );
    alerts.read_for(Duration::from_secs(2));
    let alerted: Vec<String> = alerts.seen.keys().cloned().collect();
    // Recovered: the group moves b's partitions to a after the session timeout.
    assert_eq!(wait_for_count(&names.output, 140, Duration::from_secs(60)), 140);
    let recovered_ms = now_ms() - sent_at;
    b.signal("CONT");
    outputs_once(&names, 140);
    for corr in &alerted {
        let i: usize = corr.trim_start_matches("corr-").parse().expect("index");
        assert!(
            (100..140).contains(&i),
            "alerted an event processed before the freeze: {corr}"
        );
    }
    a.stop();
    b.stop();
    reconciler.stop();
    eprintln!(
        "found_located_recovered (frozen owner): {} events found {} ms after sending, all out once {recovered_ms} ms \
         after sending (session timeout 20 s)",
        alerted.len(),
        found_ms.unwrap_or(-1)
    );
}

/// The reconciler's `tally_reconcile_failed_events` summed over its tasks, once every trace
/// partition's task reports it.
fn failed_events(http: &str, tasks: usize) -> Option<i64> {
    let (_, body) = http_get(http, "/metrics")?;
    let values: Vec<i64> = body
        .lines()
        .filter(|l| l.starts_with("tally_reconcile_failed_events{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (values.len() == tasks).then(|| values.iter().sum())
}

fn wait_for_failed(http: &str, expected: i64) -> Option<i64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = None;
    while Instant::now() < deadline {
        last = failed_events(http, 2);
        if last == Some(expected) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    last
}

fn tally_command(args: &[&str], env: &[(&str, String)]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("tally runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[test]
fn a_dead_lettered_event_alerts_at_once_and_stays_open_until_redriven_or_acknowledged() {
    let names = Names::new("flr-failed");
    topics(&names);
    let dir = tempfile::tempdir().expect("tempdir");
    // A long threshold: what alerts here alerts because it failed, not because it is old.
    let yaml = yaml(6_000).replace("threshold: 4s", "threshold: 10m");
    let http = free_address();
    let reconciler = Tally::start_reconciler_yaml(
        &yaml,
        &names,
        dir.path(),
        "reconciler-1",
        &[("TALLY_HTTP_ADDRESS", http.clone())],
    );
    let tally = Tally::start_yaml(&yaml, &names, dir.path(), "a");
    let bad = |i: usize, route: &str| GeneratedRecord {
        key: format!("B-{i}").into_bytes(),
        payload: serde_json::json!({"event_type": route, "payment_id": format!("B-{i}"), "status": "PAID"})
            .to_string()
            .into_bytes(),
        headers: vec![("correlation_id".to_string(), format!("bad-{i}"))],
    };
    let mut alerts = Alerts::new(&names);
    let sent_at = now_ms();
    // No route for `refund.*`: both are dead-lettered.
    produce(
        &names.input,
        &[bad(1, "refund.issued"), bad(2, "refund.issued"), payment(1)],
    );
    assert_eq!(
        alerts.wait_for(2, Duration::from_secs(30)),
        2,
        "{:?}",
        alerts.seen.keys()
    );
    let found_ms = alerts.seen.values().map(|(_, at)| at - sent_at).max().unwrap_or(-1);
    for (alert, _) in alerts.seen.values() {
        assert_eq!(alert["kind"], "failed_event", "{alert}");
    }
    assert_eq!(wait_for_failed(&http, 2), Some(2), "both failures open");

    // Recovered: one acknowledged with a reason, then the other redriven (to a topic of its
    // own: the route is still missing); each closes, and inspect shows how.
    let env = Tally::env_of(&names, dir.path(), "a", &[]);
    let topology = dir.path().join("a.yaml").display().to_string();
    let parked = format!("{}-parked", names.input);
    create_topics(&[(&parked, 1)]);
    let event = |corr: &str| alerts.seen[corr].0["event_id"].as_str().unwrap_or_default().to_string();
    let (code, text) = tally_command(
        &[
            "reconcile",
            "ack",
            &topology,
            "--event-id",
            &event("bad-2"),
            "--reason",
            "refunds are out of scope (TICKET-1)",
            "--by",
            "oncall",
        ],
        &env,
    );
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(wait_for_failed(&http, 1), Some(1), "the acknowledged event closes");
    let (code, text) = tally_command(&["redrive", &topology, "--to", &parked, "--since", "10m"], &env);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(wait_for_count(&parked, 2, Duration::from_secs(10)), 2);
    assert_eq!(
        wait_for_failed(&http, 0),
        Some(0),
        "redriven and acknowledged events close"
    );
    let shows = |corr: &str, what: &str| {
        let lines = inspect(Path::new(&topology), &env, corr);
        assert!(
            lines
                .iter()
                .any(|l| l["detail"].as_str().unwrap_or_default().contains(what)),
            "{corr}: no `{what}` in {lines:?}"
        );
    };
    shows("bad-1", "(REDRIVEN)");
    shows(
        "bad-2",
        "(ACKNOWLEDGED), reason: oncall: refunds are out of scope (TICKET-1)",
    );
    tally.stop();
    reconciler.stop();
    eprintln!(
        "found_located_recovered (dead-lettered): 2 failures alerted {found_ms} ms after sending (threshold 10 min)"
    );
}
