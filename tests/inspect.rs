//! `tally inspect` on the real broker: one event's trace records at both nodes, its output, or
//! its dead letter, found by idempotency key or correlation id.

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;
use tally::demo::generator::GeneratedRecord;

fn payment(id: &str, correlation: &str, pad: usize) -> GeneratedRecord {
    GeneratedRecord {
        key: id.as_bytes().to_vec(),
        payload: serde_json::json!({"event_type": "payment.paid", "payment_id": id, "status": "PAID", "pad": "x".repeat(pad)})
            .to_string()
            .into_bytes(),
        headers: vec![("correlation_id".to_string(), correlation.to_string())],
    }
}

fn inspect(topology: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("inspect")
        .arg(topology)
        .args(args)
        .output()
        .expect("tally inspect runs");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn an_event_is_located_by_its_key_or_its_correlation_id() {
    let names = Names::new("inspect");
    create_topics(&[
        (&names.input, 2),
        (&names.output, 2),
        (&names.dlq, 1),
        (&names.trace, 2),
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        r#"
application_id: {app}
kafka: {{ bootstrap_servers: "{bootstrap}" }}
processing: {{ commit_interval_ms: 100, max_record_bytes: 300 }}
state: {{ dir: "{state}" }}
sources: {{ payments: {{ topic: {input} }} }}
pipelines:
  - name: payments
    from: payments
    repartition: {{ key: "{{payment_id}}" }}
    key: "{{payment_id}}:{{status}}"
    to: {{ topic: {output} }}
dead_letter: {{ topic: {dlq} }}
trace: {{ topic: {trace}, level: all }}
"#,
        app = names.app,
        bootstrap = bootstrap(),
        state = dir.path().join("state").display(),
        input = names.input,
        output = names.output,
        dlq = names.dlq,
        trace = names.trace,
    );
    let topology = dir.path().join("topology.yaml");
    std::fs::write(&topology, yaml).expect("topology");
    produce(
        &names.input,
        &[
            payment("P-1", "corr-1", 0),
            payment("P-1", "corr-1b", 0),
            payment("P-2", "corr-2", 0),
            payment("P-3", "corr-3", 400),
        ],
    );
    let tally = Tally::start(&topology, "i1", dir.path().join("tally.log"));
    assert_eq!(wait_for_count(&names.output, 2, Duration::from_secs(90)), 2);
    assert_eq!(wait_for_count(&names.dlq, 1, Duration::from_secs(60)), 1);
    tally.stop();

    let (code, text) = inspect(&topology, &["--key", "P-1:PAID"]);
    assert_eq!(code, Some(0), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.iter().filter(|l| l.contains(" output ")).count(),
        1,
        "one output: {text}"
    );
    assert!(
        text.contains(&format!("{}/payments COMPLETED (DUPLICATE)", names.app)),
        "the second delivery dropped, by the processing node: {text}"
    );
    assert!(
        text.contains("/repartition"),
        "the repartition node's records too: {text}"
    );
    assert!(!text.contains("P-2"), "nothing of other events: {text}");
    let state: Vec<&&str> = lines.iter().filter(|l| l.contains(" state ")).collect();
    assert_eq!(state.len(), 1, "the dedup store's entry: {text}");
    assert!(
        state[0].contains("store payments-dedup, key P-1:PAID: first seen 20"),
        "{text}"
    );
    let (code, text) = inspect(&topology, &["--correlation-id", "corr-1"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("store payments-dedup, key P-1:PAID: first seen"),
        "found through the key its trace records carry: {text}"
    );

    let (code, text) = inspect(&topology, &["--correlation-id", "corr-3", "--json"]);
    assert_eq!(code, Some(0), "{text}");
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let dead: Vec<&serde_json::Value> = records.iter().filter(|r| r["kind"] == "dead_letter").collect();
    assert_eq!(dead.len(), 1, "{text}");
    assert!(
        dead[0]["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("reason oversize")),
        "{text}"
    );
    assert!(
        records
            .iter()
            .any(|r| r["kind"] == "trace" && r["detail"].as_str().is_some_and(|d| d.contains("FAILED"))),
        "{text}"
    );

    let (code, text) = inspect(&topology, &["--key", "P-404:PAID"]);
    assert_eq!(code, Some(2), "nothing found is exit 2: {text}");
}

#[test]
fn an_entity_is_inspected_by_its_key_even_with_a_colon_inside_a_field() {
    let names = Names::new("inspect-entity");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        r#"
application_id: {app}
kafka: {{ bootstrap_servers: "{bootstrap}" }}
processing: {{ commit_interval_ms: 100 }}
state: {{ dir: "{state}" }}
sources: {{ entities: {{ topic: {input} }} }}
pipelines:
  - name: entities
    from: entities
    repartition: {{ key: "{{type}}:{{id}}" }}
    key: "{{type}}:{{id}}:v{{version}}"
    routes:
      - strategy: overwrite
        entity: "{{type}}:{{id}}"
        version: "{{version}}"
    to: {{ topic: {output} }}
dead_letter: {{ topic: {dlq} }}
"#,
        app = names.app,
        bootstrap = bootstrap(),
        state = dir.path().join("state").display(),
        input = names.input,
        output = names.output,
        dlq = names.dlq,
    );
    let topology = dir.path().join("topology.yaml");
    std::fs::write(&topology, yaml).expect("topology");
    let entity = |id: &str, version: u32| tally::demo::generator::GeneratedRecord {
        key: id.as_bytes().to_vec(),
        payload: serde_json::json!({"type": "crm", "id": id, "version": version})
            .to_string()
            .into_bytes(),
        headers: vec![],
    };
    // `crm` + `A:B` reads `crm:A:B`, and so would `crm:A` + `B`, which never came.
    produce(
        &names.input,
        &[entity("A:B", 1), entity("A:B", 3), entity("A:B", 2), entity("C", 7)],
    );
    let tally = Tally::start(&topology, "i1", dir.path().join("tally.log"));
    assert_eq!(wait_for_count(&names.output, 3, Duration::from_secs(90)), 3);
    tally.stop();

    let (code, text) = inspect(&topology, &["--entity", "crm:A:B"]);
    assert_eq!(code, Some(0), "{text}");
    let state: Vec<&str> = text.lines().filter(|l| l.contains(" state ")).collect();
    assert_eq!(state.len(), 1, "{text}");
    assert!(
        state[0].contains("store entities-versions, key crm:A:B: version 3"),
        "{text}"
    );
    let (code, text) = inspect(&topology, &["--entity", "crm:nobody"]);
    assert_eq!(code, Some(2), "{text}");
}
