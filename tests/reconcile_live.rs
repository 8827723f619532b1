//! The live reconciler: an event received but never completed is reported within one scan
//! after the threshold (alert record, log line with its correlation id), once; completed events
//! are not; open events survive a restart on a fresh state directory (changelog restore).

mod common;

use common::*;
use rdkafka::Message;
use std::time::Duration;
use tally::demo::generator::{self, GeneratedRecord};

const SCAN_MS: i64 = 1_000;
const THRESHOLD_MS: i64 = 4_000;
/// Commit interval plus clock and poll slack on top of "one scan after the threshold".
const SLACK_MS: i64 = 1_500;

const YAML: &str = r#"
application_id: ${TALLY_APP_ID}
kafka:
  bootstrap_servers: ${KAFKA_BOOTSTRAP}
  properties: { session.timeout.ms: 6000, heartbeat.interval.ms: 1000 }
processing: { commit_interval_ms: 100 }
state: { dir: "${TALLY_STATE_DIR}" }
sources:
  payments: { topic: "${TALLY_INPUT_TOPIC}" }
pipelines:
  - name: payments
    from: payments
    key: "{payment_id}:{status}"
    routes:
      - when: { event_type: "payment.*" }
        strategy: ignore
    to: { topic: "${TALLY_OUTPUT_TOPIC}", key: "{payment_id}" }
dead_letter: { topic: "${TALLY_DLQ_TOPIC}" }
trace: { topic: "${TALLY_TRACE_TOPIC}", level: all }
reconcile: { alerts_topic: "${TALLY_ALERTS_TOPIC}", scan_interval: 1s, threshold: 4s }
"#;

fn alerts(names: &Names, min: usize, timeout: Duration) -> Vec<serde_json::Value> {
    read_committed(&names.alerts, min, timeout)
        .iter()
        .map(|m| serde_json::from_slice(m.payload().unwrap_or_default()).expect("alert is JSON"))
        .collect()
}

#[test]
fn an_unfinished_event_is_reported_within_one_scan_after_the_threshold_and_only_once() {
    let names = Names::new("reconcile");
    create_topics(&[
        (&names.input, 2),
        (&names.output, 2),
        (&names.dlq, 1),
        (&names.trace, 2),
        (&names.alerts, 1),
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    let first = Tally::start_yaml(YAML, &names, dir.path(), "a");

    // tally's own events: RECEIVED, PROCESSING and COMPLETED commit together, never open.
    let gen = generator::payments(300, 0, 0, 3);
    produce(&names.input, &gen.records);
    let start = now_ms();
    produce(
        &names.trace,
        &[
            trace_record("erp/0/1", "corr-stuck", "RECEIVED", start),
            trace_record("erp/0/2", "corr-done", "RECEIVED", start),
            trace_record("erp/0/2", "corr-done", "COMPLETED", start + 10),
            GeneratedRecord {
                key: b"garbage".to_vec(),
                payload: b"{not json".to_vec(),
                headers: vec![],
            },
            GeneratedRecord {
                key: b"other".to_vec(),
                payload: br#"{"format":"someone.else/v9","event_id":"x"}"#.to_vec(),
                headers: vec![],
            },
        ],
    );
    assert_eq!(
        wait_for_count(&names.output, gen.expected_keys.len(), Duration::from_secs(60)),
        gen.expected_keys.len()
    );

    let found = alerts(&names, 1, Duration::from_secs(30));
    assert_eq!(found.len(), 1, "exactly the unfinished event is reported: {found:?}");
    let alert = &found[0];
    assert_eq!(alert["format"], "tally.alert/v1");
    assert_eq!(alert["kind"], "stuck_event");
    assert_eq!(alert["event_id"], "erp/0/1");
    assert_eq!(alert["correlation_id"], "corr-stuck");
    assert_eq!(alert["node"], "erp-sink");
    let age =
        alert["detected_ms"].as_i64().expect("detected_ms") - alert["first_seen_ms"].as_i64().expect("first_seen_ms");
    assert!(
        (THRESHOLD_MS..=THRESHOLD_MS + SCAN_MS + SLACK_MS).contains(&age),
        "reported {age} ms after it opened: within one scan after the {THRESHOLD_MS} ms threshold"
    );

    // More scans pass: no second alert for it, none for the completed or tally's own events.
    std::thread::sleep(Duration::from_millis((3 * SCAN_MS) as u64));
    assert_eq!(alerts(&names, 0, Duration::from_secs(5)).len(), 1, "alerted once");
    let lines = first.stop();
    let logged = events(&lines, "event received but not completed after the threshold");
    assert_eq!(logged.len(), 1);
    assert!(
        logged[0].to_string().contains("corr-stuck"),
        "log line carries the correlation id: {}",
        logged[0]
    );
    let dlq = read_committed(&names.dlq, 1, Duration::from_secs(10));
    assert_eq!(dlq.len(), 1, "the unreadable trace record is dead-lettered");
    assert_eq!(header(&dlq[0], "tally.error.reason").as_deref(), Some("invalid_json"));

    // A fresh state directory: open events come back from the changelog, alerted flag included.
    let second = Tally::start_yaml(YAML, &names, dir.path(), "b");
    let later = now_ms();
    produce(
        &names.trace,
        &[
            trace_record("erp/0/1", "corr-stuck", "COMPLETED", later),
            trace_record("erp/1/7", "corr-new", "PROCESSING", later),
        ],
    );
    let found = alerts(&names, 2, Duration::from_secs(60));
    let lines = second.stop();
    assert_eq!(found.len(), 2, "one new alert: {found:?}");
    assert_eq!(found[1]["event_id"], "erp/1/7");
    assert_eq!(found[1]["status"], "PROCESSING");
    assert!(
        !events(&lines, "restore finished").is_empty(),
        "the second instance restored the reconciler store"
    );
    assert_eq!(
        events(&lines, "event received but not completed after the threshold").len(),
        1,
        "erp/0/1 was alerted before the restart and completed now: not reported again"
    );
}

/// Anyone may write to the trace topic. Texts as long as a record allows (a correlation id of
/// 600 kB, an event id of a megabyte) once made alerts and store entries too large to write,
/// retried forever on the stream thread the pipeline shares; their events are now reported
/// under the ids derived from those texts, and the pipeline goes on.
#[test]
fn texts_as_long_as_a_trace_record_allows_are_reported_and_stall_nothing() {
    let names = Names::new("reconcile-long");
    create_topics(&[
        (&names.input, 1),
        (&names.output, 1),
        (&names.dlq, 1),
        (&names.trace, 1),
        (&names.alerts, 1),
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    let tally = Tally::start_yaml(YAML, &names, dir.path(), "a");
    let long_correlation = "c".repeat(600_000);
    let long_event = "E".repeat(1_010_000);
    let producer = large_record_producer();
    let start = now_ms();
    // Each just under the broker's default record limit: the long text once, no header.
    let record = |event_id: &str, correlation_id: &str, status: &str| {
        serde_json::json!({
            "format": "tally.trace/v1", "event_id": event_id, "idempotency_key": null,
            "correlation_id": correlation_id, "node": "erp-sink", "status": status,
            "outcome": null, "timestamp_ms": start,
        })
        .to_string()
    };
    for value in [
        record("erp/9/1", &long_correlation, "FAILED"),
        record(&long_event, "corr-long-event", "RECEIVED"),
    ] {
        let out = rdkafka::producer::BaseRecord::to(&names.trace)
            .key("long")
            .payload(&value);
        producer.send(out).expect("enqueue");
    }
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(30)).expect("flush");

    let found = alerts(&names, 2, Duration::from_secs(60));
    let gen = generator::payments(50, 0, 0, 5);
    produce(&names.input, &gen.records);
    let outputs = wait_for_count(&names.output, gen.expected_keys.len(), Duration::from_secs(60));
    tally.stop();
    assert_eq!(
        outputs,
        gen.expected_keys.len(),
        "the pipeline on the same thread goes on"
    );
    let derived = tally::processors::correlation::derive;
    let kinds: Vec<(&str, &str, &str)> = found
        .iter()
        .map(|a| {
            let text = |f: &str| a[f].as_str().unwrap_or_default();
            (text("kind"), text("event_id"), text("correlation_id"))
        })
        .collect();
    let failed_id = derived(&long_correlation);
    let stuck_id = derived(&long_event);
    assert!(
        kinds.contains(&("failed_event", "erp/9/1", failed_id.as_str())),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("stuck_event", stuck_id.as_str(), "corr-long-event")),
        "{kinds:?}"
    );
    assert_eq!(found.len(), 2, "each once: {kinds:?}");
}
