//! Dedup keys expire after their retention, through the changelog (tombstones), and are
//! accepted again afterwards.

mod common;

use common::*;
use rdkafka::Message;
use std::time::{Duration, Instant};
use tally::demo::generator::GeneratedRecord;

fn payment(id: &str) -> GeneratedRecord {
    let payload = format!(r#"{{"event_type":"payment.completed","payment_id":"{id}","status":"PAID"}}"#);
    GeneratedRecord {
        key: id.as_bytes().to_vec(),
        payload: payload.into_bytes(),
        headers: vec![],
    }
}

#[test]
fn an_expired_key_is_tombstoned_in_the_changelog_and_accepted_again() {
    let names = Names::new("expiry");
    create_topics(&[(&names.input, 1), (&names.output, 1), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = r#"
application_id: ${TALLY_APP_ID}
kafka: { bootstrap_servers: "${KAFKA_BOOTSTRAP}" }
processing: { commit_interval_ms: 100, expiry_scan_interval_ms: 500 }
state: { dir: "${TALLY_STATE_DIR}" }
sources: { payments: { topic: "${TALLY_INPUT_TOPIC}" } }
pipelines:
  - name: payments
    from: payments
    key: "{payment_id}:{status}"
    routes:
      - strategy: ignore
        retention: 3s
    to: { topic: "${TALLY_OUTPUT_TOPIC}" }
dead_letter: { topic: "${TALLY_DLQ_TOPIC}" }
"#;
    let tally = Tally::start_yaml(yaml, &names, dir.path(), "i1");

    // Within retention: the repeat is a duplicate.
    produce(&names.input, &[payment("P-1"), payment("P-1")]);
    let mut out = Watcher::new(&names.output);
    assert_eq!(out.wait_for(1, Duration::from_secs(60)), 1);

    // After retention the expiry pass deletes the key through the changelog.
    let changelog = names.changelog("payments");
    let template: tally::topology::KeyTemplate = "{payment_id}:{status}".parse().expect("valid");
    let stored = template
        .render_key(
            &serde_json::json!({"payment_id": "P-1", "status": "PAID"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        )
        .expect("renders")
        .stored;
    let deadline = Instant::now() + Duration::from_secs(30);
    let tombstoned = loop {
        let records = read_committed(&changelog, 0, Duration::from_secs(5));
        let tomb = records
            .iter()
            .any(|m| m.key() == Some(stored.as_bytes()) && m.payload().is_none());
        if tomb || Instant::now() > deadline {
            break tomb;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(tombstoned, "the changelog holds a tombstone for the expired key");

    // The same business key is accepted again, once.
    produce(&names.input, &[payment("P-1"), payment("P-1")]);
    assert_eq!(out.wait_for(2, Duration::from_secs(60)), 2);
    let lines = tally.stop();
    let output = read_committed(&names.output, 2, Duration::from_secs(10));
    assert_eq!(output.len(), 2, "one output per retention window");
    let s = events(&lines, "tally stopped")[0];
    assert_eq!(s["duplicates"], 2);
}
