//! Trace records on the real broker: every input event gets exactly one terminal record, in
//! the same transactions as the outputs, with outcomes that match what happened.

mod common;

use common::*;
use rdkafka::Message;
use std::collections::HashMap;
use std::time::Duration;
use tally::demo::generator;

#[test]
fn every_event_is_traced_received_processing_and_once_terminal() {
    let names = Names::new("trace");
    create_topics(&[
        (&names.input, 3),
        (&names.output, 3),
        (&names.dlq, 1),
        (&names.trace, 3),
    ]);
    let gen = generator::payments(500, 80, 2048, 17);
    produce(&names.input, &gen.records);
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = r#"
application_id: ${TALLY_APP_ID}
kafka: { bootstrap_servers: "${KAFKA_BOOTSTRAP}" }
processing: { max_record_bytes: 2048 }
state: { dir: "${TALLY_STATE_DIR}" }
sources: { payments: { topic: "${TALLY_INPUT_TOPIC}" } }
pipelines:
  - name: payments
    from: payments
    repartition: { key: "{payment_id}" }
    key: "{payment_id}:{status}"
    to: { topic: "${TALLY_OUTPUT_TOPIC}" }
dead_letter: { topic: "${TALLY_DLQ_TOPIC}" }
trace: { topic: "${TALLY_TRACE_TOPIC}", level: all }
"#;
    let tally = Tally::start_yaml(yaml, &names, dir.path(), "i1");
    assert_eq!(
        wait_for_count(&names.output, gen.expected_keys.len(), Duration::from_secs(120)),
        gen.expected_keys.len()
    );
    let poison: u64 = gen.poison.values().sum();
    assert_eq!(
        wait_for_count(&names.dlq, poison as usize, Duration::from_secs(60)),
        poison as usize
    );
    tally.stop();

    let traces = read_committed(&names.trace, 0, Duration::from_secs(20));
    let mut by_event: HashMap<String, Vec<serde_json::Value>> = HashMap::new();
    for m in &traces {
        let v: serde_json::Value = serde_json::from_slice(m.payload().expect("payload")).expect("json");
        assert_eq!(v["format"], "tally.trace/v1");
        assert_eq!(m.key(), v["event_id"].as_str().map(str::as_bytes), "keyed by event id");
        assert!(v["correlation_id"].as_str().is_some_and(|c| !c.is_empty()));
        by_event
            .entry(v["event_id"].as_str().expect("event id").to_string())
            .or_default()
            .push(v);
    }
    assert_eq!(by_event.len(), gen.records.len(), "one event id per input record");
    let mut outcomes: HashMap<String, u64> = HashMap::new();
    for (id, records) in &by_event {
        assert!(id.starts_with(&names.input), "event ids name the source topic: {id}");
        let terminal: Vec<_> = records
            .iter()
            .filter(|r| r["status"] == "COMPLETED" || r["status"] == "FAILED")
            .collect();
        assert_eq!(terminal.len(), 1, "{id}: exactly one terminal record: {records:?}");
        assert!(
            records.iter().any(|r| r["status"] == "RECEIVED"),
            "{id}: RECEIVED at level all"
        );
        let t = terminal[0];
        let outcome = format!(
            "{}/{}",
            t["status"].as_str().unwrap_or(""),
            t["outcome"].as_str().unwrap_or("-")
        );
        *outcomes.entry(outcome).or_default() += 1;
        if t["status"] == "COMPLETED" {
            assert!(
                records.iter().any(|r| r["status"] == "PROCESSING"),
                "{id}: PROCESSING before completion"
            );
            assert!(t["idempotency_key"].as_str().is_some());
            assert_eq!(t["node"], format!("{}/payments", names.app));
        }
    }
    assert_eq!(
        outcomes.get("COMPLETED/-").copied(),
        Some(gen.expected_keys.len() as u64)
    );
    assert_eq!(
        outcomes.get("COMPLETED/DUPLICATE").copied(),
        Some(gen.expected_duplicates())
    );
    assert_eq!(outcomes.get("FAILED/DEAD_LETTER").copied(), Some(poison));
}
