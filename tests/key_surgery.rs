//! Key surgery (`tally reset --pipeline … --key|--entity …`) on the real broker: refused while
//! an instance runs, a dry run writes nothing, and after `--execute` a restarted instance has
//! forgotten the dedup key (its event passes again, once) or holds the entity version set, and a
//! corrected first write-back is the ERP id later events carry.

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;
use tally::demo::generator::GeneratedRecord;

const YAML: &str = r#"
application_id: ${TALLY_APP_ID}
kafka:
  bootstrap_servers: ${KAFKA_BOOTSTRAP}
  properties: { session.timeout.ms: 6000, heartbeat.interval.ms: 1000 }
processing: { commit_interval_ms: 100 }
state: { dir: "${TALLY_STATE_DIR}" }
sources:
  events: { topic: "${TALLY_INPUT_TOPIC}" }
pipelines:
  - name: events
    from: events
    repartition: { key: "{id}" }
    key: "{id}:{status}"
    routes:
      - when: { event_type: "payment.*" }
        strategy: ignore
      - when: { event_type: "entity.*" }
        strategy: overwrite
        entity: "{kind}:{id}"
        version: "{version}"
    to: { topic: "${TALLY_OUTPUT_TOPIC}", key: "{id}" }
dead_letter: { topic: "${TALLY_DLQ_TOPIC}" }
"#;

fn payment(id: &str) -> GeneratedRecord {
    GeneratedRecord {
        key: id.as_bytes().to_vec(),
        payload: serde_json::json!({"event_type": "payment.paid", "id": id, "status": "PAID"})
            .to_string()
            .into_bytes(),
        headers: vec![],
    }
}

fn entity(id: &str, version: i64) -> GeneratedRecord {
    GeneratedRecord {
        key: id.as_bytes().to_vec(),
        payload: serde_json::json!({"event_type": "entity.updated", "kind": "crm", "id": id, "status": "U", "version": version})
            .to_string()
            .into_bytes(),
        headers: vec![],
    }
}

/// `tally reset <topology> <args>` with the test's environment: exit code and output.
fn reset(topology: &std::path::Path, env: &[(&str, String)], args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("reset")
        .arg(topology)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("tally reset runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[test]
fn a_forgotten_key_passes_again_and_a_reset_version_lets_the_next_one_through() {
    let names = Names::new("surgery");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let tally = Tally::start_yaml(YAML, &names, dir.path(), "a");
    produce(
        &names.input,
        &[payment("P-1"), payment("P-2"), entity("A:B", 1), entity("A:B", 5)],
    );
    assert_eq!(wait_for_count(&names.output, 4, Duration::from_secs(60)), 4);
    let topology = dir.path().join("a.yaml");
    let env = Tally::env_of(&names, dir.path(), "a", &[]);

    let (code, text) = reset(&topology, &env, &["--pipeline", "events", "--key", "P-1:PAID"]);
    assert_eq!(code, Some(1), "refused while an instance runs: {text}");
    assert!(text.contains("live member"), "{text}");
    tally.stop();

    // Dry runs say what they would write, and write nothing.
    let (code, text) = reset(&topology, &env, &["--pipeline", "events", "--key", "P-1:PAID"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("key P-1:PAID: first seen"), "{text}");
    assert!(text.contains("-> deleted"), "{text}");
    assert!(text.contains("nothing written"), "{text}");
    let (code, text) = reset(&topology, &env, &["--pipeline", "events", "--key", "P-9:PAID"]);
    assert_eq!(code, Some(1), "a key that is not there: {text}");
    assert!(text.contains("no such key"), "{text}");

    let (code, text) = reset(
        &topology,
        &env,
        &["--pipeline", "events", "--key", "P-1:PAID", "--execute"],
    );
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = reset(
        &topology,
        &env,
        &[
            "--pipeline",
            "events",
            "--entity",
            "crm:A:B",
            "--version",
            "2",
            "--execute",
        ],
    );
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("key crm:A:B: version 5 -> version 2"), "{text}");

    // A restarted instance takes both from the changelog.
    let tally = Tally::start_yaml(YAML, &names, dir.path(), "a");
    produce(
        &names.input,
        &[payment("P-1"), payment("P-2"), entity("A:B", 2), entity("A:B", 3)],
    );
    // P-1 again (forgotten) and version 3 (above 2) pass; P-2 and version 2 do not.
    let out = read_committed(&names.output, 6, Duration::from_secs(60));
    tally.stop();
    let mut all: Vec<String> = out
        .iter()
        .map(|m| {
            let v: serde_json::Value =
                serde_json::from_slice(rdkafka::Message::payload(m).unwrap_or_default()).expect("output is JSON");
            format!("{}@{}", v["id"].as_str().unwrap_or("?"), v["version"])
        })
        .collect();
    all.sort();
    assert_eq!(
        all,
        vec!["A:B@1", "A:B@3", "A:B@5", "P-1@null", "P-1@null", "P-2@null"],
        "P-1 again (forgotten) and version 3 (above the 2 set) passed; P-2 and version 2 did not"
    );
}

#[test]
fn a_wrong_first_write_back_is_corrected_for_every_later_event() {
    let names = Names::new("surgery-map");
    create_topics(&[
        (&names.input, 2),
        (&names.output, 2),
        (&names.dlq, 1),
        (&names.writeback, 2),
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    let erp_id = |out: &[rdkafka::message::OwnedMessage], order: &str| {
        out.iter()
            .filter_map(|m| serde_json::from_slice::<serde_json::Value>(rdkafka::Message::payload(m)?).ok())
            .find(|v| v["order_id"] == order)
            .and_then(|v| v["erp_customer_id"].as_str().map(str::to_string))
    };
    let tally = Tally::start_example("crm-to-erp.yaml", &names, dir.path(), "i1");
    produce(&names.writeback, &[erp_write_back("CRM-1", "ERP-WRONG")]);
    // The mapping is recorded before the order reads it.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let recorded = || {
        read_committed(&names.mappings, 0, Duration::from_secs(2))
            .iter()
            .any(|m| rdkafka::Message::key(m) == Some(b"ext/erp/ERP-WRONG".as_slice()))
    };
    while !recorded() {
        assert!(
            std::time::Instant::now() < deadline,
            "the write-back was never recorded"
        );
    }
    produce(&names.input, &[crm_order("O-1", "CRM-1")]);
    let out = read_committed(&names.output, 1, Duration::from_secs(60));
    assert_eq!(erp_id(&out, "O-1").as_deref(), Some("ERP-WRONG"));
    tally.stop();

    let topology = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies/crm-to-erp.yaml");
    let env = Tally::env_of(&names, dir.path(), "i1", &[]);
    let args = ["--pipeline", "erp-created", "--mapping", "erp:ERP-WRONG=ERP-RIGHT"];
    let (code, text) = reset(&topology, &env, &args);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("ERP-WRONG -> ERP-RIGHT"), "{text}");
    let (code, text) = reset(&topology, &env, &[&args[..], &["--execute"]].concat());
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = reset(&topology, &env, &args);
    assert_eq!(code, Some(1), "nothing left to correct: {text}");

    let tally = Tally::start_example("crm-to-erp.yaml", &names, dir.path(), "i1");
    produce(&names.input, &[crm_order("O-2", "CRM-1")]);
    let out = read_committed(&names.output, 2, Duration::from_secs(60));
    tally.stop();
    assert_eq!(erp_id(&out, "O-2").as_deref(), Some("ERP-RIGHT"), "the corrected id");
}
