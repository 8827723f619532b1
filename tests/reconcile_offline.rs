//! `tally reconcile offline` against real runs on the broker: the test withholds one event that
//! the sent list names and injects one phantom the sent list does not name; the reconciliation
//! must report exactly those, in both report formats, and exit accordingly.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;
use tally::demo::generator::{self, Generated, GeneratedRecord};

fn reconcile(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(["reconcile", "offline"])
        .args(args)
        .env("KAFKA_BOOTSTRAP", bootstrap())
        .output()
        .expect("run tally reconcile")
}

fn text(out: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The `{payment_id}:{status}` of a generated input record, when it is a valid payment event.
fn record_key(r: &GeneratedRecord) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&r.payload).ok()?;
    Some(format!("{}:{}", v["payment_id"].as_str()?, v["status"].as_str()?))
}

/// Every record of `gen` except the copies of the event with key `removed`.
fn without(gen: &Generated, removed: &str) -> Vec<GeneratedRecord> {
    let kept: Vec<GeneratedRecord> = gen
        .records
        .iter()
        .filter(|r| record_key(r).as_deref() != Some(removed))
        .cloned()
        .collect();
    assert!(kept.len() < gen.records.len(), "the removed event was in the input");
    kept
}

/// A record carrying an idempotency key in tally's header.
fn keyed(key: &str, payload: &[u8]) -> GeneratedRecord {
    GeneratedRecord {
        key: key.as_bytes().to_vec(),
        payload: payload.to_vec(),
        headers: vec![("tally.idempotency_key".to_string(), key.to_string())],
    }
}

/// The anomalies of a JSON Lines report as `kind key count`, then ` [fields]` on a key told
/// apart by its fields, and its summary line.
fn json_report(path: &Path) -> (BTreeSet<String>, serde_json::Value) {
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(path)
        .expect("json report")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let (summary, anomalies) = lines.split_last().expect("a summary line");
    assert_eq!(summary["kind"], "summary");
    assert_eq!(summary["format"], "tally.reconcile/v1");
    let anomalies = anomalies
        .iter()
        .map(|l| {
            let fields = match &l["idempotency_key_fields"] {
                serde_json::Value::Null => String::new(),
                fields => format!(" {fields}"),
            };
            format!(
                "{} {} {}{fields}",
                l["kind"].as_str().expect("kind"),
                l["idempotency_key"].as_str().expect("key"),
                l["count"]
            )
        })
        .collect();
    (anomalies, summary.clone())
}

/// The rows of a CSV report as `kind key count`.
fn csv_report(path: &Path) -> BTreeSet<String> {
    let mut reader = csv::Reader::from_path(path).expect("csv report");
    assert_eq!(
        reader.headers().expect("header row"),
        vec!["kind", "idempotency_key", "count", "detail"]
    );
    reader
        .records()
        .map(|r| {
            let r = r.expect("row");
            assert_eq!(&r[3], "", "no detail on key anomalies");
            format!("{} {} {}", &r[0], &r[1], &r[2])
        })
        .collect()
}

fn set(items: &[String]) -> BTreeSet<String> {
    items.iter().cloned().collect()
}

#[test]
fn a_withheld_event_is_missing_and_an_injected_output_is_a_ghost_in_both_formats() {
    let names = Names::new("reconoff");
    create_topics(&[(&names.input, 3), (&names.output, 3), (&names.dlq, 1)]);
    let gen = generator::payments(400, 0, 0, 31);
    let removed = gen.expected_keys[123].clone();
    let phantom = "PAY-PHANTOM-1:PAID".to_string();
    produce(&names.input, &without(&gen, &removed));

    let dir = tempfile::tempdir().expect("tempdir");
    let tally = Tally::start_example("payments.yaml", &names, dir.path(), "i1");
    let expected_outputs = gen.expected_keys.len() - 1;
    assert_eq!(
        wait_for_count(&names.output, expected_outputs, Duration::from_secs(120)),
        expected_outputs
    );
    tally.stop();
    // The phantom: an output record tally never produced, for a key upstream never sent.
    produce(
        &names.output,
        &[keyed(&phantom, br#"{"payment_id":"PAY-PHANTOM-1","status":"PAID"}"#)],
    );

    // What upstream says it sent: every generated event, the withheld one included.
    let jsonl = dir.path().join("sent.jsonl");
    let lines: Vec<String> = gen
        .expected_keys
        .iter()
        .map(|k| serde_json::json!({ "idempotency_key": k, "source": "gateway" }).to_string())
        .collect();
    std::fs::write(&jsonl, lines.join("\n") + "\n").expect("write jsonl");
    let csv_sent = dir.path().join("sent.csv");
    let rows: Vec<String> = gen.expected_keys.iter().map(|k| format!("gateway,{k}")).collect();
    std::fs::write(&csv_sent, format!("source,idempotency_key\n{}\n", rows.join("\n"))).expect("write csv");

    let expected = set(&[format!("missing {removed} 0"), format!("ghost {phantom} 1")]);

    let json_path = dir.path().join("report.json");
    let out = reconcile(&[
        "--sent",
        jsonl.to_str().expect("utf8"),
        "--processed",
        &names.output,
        "--report",
        json_path.to_str().expect("utf8"),
        "--report-format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(1), "missing fails the run: {}", text(&out));
    let (anomalies, summary) = json_report(&json_path);
    assert_eq!(anomalies, expected);
    let n = gen.expected_keys.len() as u64;
    for (field, value) in [
        ("sent_records", n),
        ("sent_keys", n),
        ("processed_records", n),
        ("processed_keys", n),
        ("missing", 1),
        ("ghost", 1),
        ("duplicate", 0),
        ("unreadable_sent", 0),
        ("unreadable_processed", 0),
    ] {
        assert_eq!(summary[field], value, "{field} in {summary}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&removed) && stdout.contains(&phantom), "{}", text(&out));
    assert!(stdout.contains("FAILED: 1 missing"), "{}", text(&out));

    let csv_path = dir.path().join("report.csv");
    let out = reconcile(&[
        "--sent",
        csv_sent.to_str().expect("utf8"),
        "--processed",
        &names.output,
        "--report",
        csv_path.to_str().expect("utf8"),
        "--report-format",
        "csv",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(csv_report(&csv_path), expected);

    // An export of upstream's own rows, a JSON array with no key column: the pipeline's key
    // template builds the keys tally built.
    let export = dir.path().join("export.json");
    let rows: Vec<serde_json::Value> = gen
        .expected_keys
        .iter()
        .map(|k| {
            let (payment_id, status) = k.rsplit_once(':').expect("id:status");
            serde_json::json!({ "status": status, "payment_id": payment_id, "amount": 12.5 })
        })
        .collect();
    std::fs::write(&export, serde_json::to_string_pretty(&rows).expect("json")).expect("write export");
    let export_report = dir.path().join("export-report.csv");
    let out = reconcile(&[
        "--sent",
        export.to_str().expect("utf8"),
        "--sent-key",
        "{payment_id}:{status}",
        "--processed",
        &names.output,
        "--report",
        export_report.to_str().expect("utf8"),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(csv_report(&export_report), expected, "{}", text(&out));

    // One day of a longer export: the withheld event was sent the day before, so within
    // --from/--to nothing is missing; the phantom, output now, is still a ghost.
    let now = now_ms();
    let day = 86_400_000;
    let dated = dir.path().join("dated.jsonl");
    let lines: Vec<String> = gen
        .expected_keys
        .iter()
        .map(|k| {
            let at = if *k == removed { now - day } else { now - 60_000 };
            serde_json::json!({ "idempotency_key": k, "sent_at": at }).to_string()
        })
        .collect();
    std::fs::write(&dated, lines.join("\n")).expect("write dated");
    let window_report = dir.path().join("window-report.csv");
    let (from, to) = ((now - day / 2).to_string(), (now + 60_000).to_string());
    let out = reconcile(&[
        "--sent",
        dated.to_str().expect("utf8"),
        "--sent-time-field",
        "sent_at",
        "--from",
        &from,
        "--to",
        &to,
        "--processed",
        &names.output,
        "--report",
        window_report.to_str().expect("utf8"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "nothing missing in the window: {}",
        text(&out)
    );
    assert_eq!(csv_report(&window_report), set(&[format!("ghost {phantom} 1")]));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("(1 records outside the window)"),
        "{}",
        text(&out)
    );
    let out = reconcile(&[
        "--sent",
        dated.to_str().expect("utf8"),
        "--from",
        &from,
        "--to",
        &to,
        "--processed",
        &names.output,
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a dated file needs its time field: {}",
        text(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--sent-time-field"),
        "{}",
        text(&out)
    );

    // Upstream's list without the withheld event: nothing is missing, so the run passes and
    // still reports the ghost; --strict fails on the ghost.
    let partial = dir.path().join("partial.jsonl");
    let kept: Vec<String> = gen
        .expected_keys
        .iter()
        .filter(|k| **k != removed)
        .map(|k| format!("\"{k}\""))
        .collect();
    std::fs::write(&partial, kept.join("\n")).expect("write partial");
    let out = reconcile(&["--sent", partial.to_str().expect("utf8"), "--processed", &names.output]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&phantom) && !stdout.contains(&removed),
        "{}",
        text(&out)
    );
    let out = reconcile(&[
        "--sent",
        partial.to_str().expect("utf8"),
        "--processed",
        &names.output,
        "--strict",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}

#[test]
fn trace_topic_reconciliation_counts_only_emitting_completions() {
    let names = Names::new("recontrace");
    let sent_topic = format!("sent-{}", names.app);
    create_topics(&[
        (&names.input, 3),
        (&names.output, 3),
        (&names.dlq, 1),
        (&names.trace, 3),
        (&sent_topic, 2),
    ]);
    let gen = generator::payments(300, 60, 2048, 37);
    let removed = gen.expected_keys[42].clone();
    produce(&names.input, &without(&gen, &removed));
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
    let expected_outputs = gen.expected_keys.len() - 1;
    assert_eq!(
        wait_for_count(&names.output, expected_outputs, Duration::from_secs(120)),
        expected_outputs
    );
    let poison: usize = gen.poison.values().sum::<u64>() as usize;
    assert!(poison > 0, "dead letters give FAILED trace records");
    assert_eq!(wait_for_count(&names.dlq, poison, Duration::from_secs(60)), poison);
    tally.stop();

    // Injected trace records: a phantom completion, a second completion of a sent key (a
    // duplicate output), and a DUPLICATE completion, which is no output and must not count.
    let node = format!("{}/payments", names.app);
    let doubled = gen.expected_keys[7].clone();
    let traced = |key: &str, status: &str, outcome: Option<&str>| GeneratedRecord {
        key: b"injected/0/0".to_vec(),
        payload: serde_json::json!({
            "format": "tally.trace/v1", "event_id": "injected/0/0", "idempotency_key": key,
            "correlation_id": "test", "node": node, "status": status, "outcome": outcome,
            "timestamp_ms": 1,
        })
        .to_string()
        .into_bytes(),
        headers: vec![],
    };
    let trace = |key: &str, outcome: Option<&str>| traced(key, "COMPLETED", outcome);
    let phantom = "PAY-PHANTOM-2:PAID".to_string();
    // Sent, and only ever dropped as stale or dead-lettered: settled without an output, which
    // a diff must not call missing.
    let (stale, dead) = ("PAY-STALE-1:PAID".to_string(), "PAY-DLQ-1:PAID".to_string());
    produce(
        &names.trace,
        &[
            trace(&phantom, None),
            trace(&doubled, Some("PENDING_CREATE")),
            trace(&gen.expected_keys[8], Some("DUPLICATE")),
            trace(&stale, Some("STALE")),
            traced(&dead, "FAILED", Some("DEAD_LETTER")),
        ],
    );

    // The sent list as a topic: keys in the header for half, in the JSON value for the rest.
    let sent: Vec<GeneratedRecord> = gen
        .expected_keys
        .iter()
        .chain([&stale, &dead])
        .enumerate()
        .map(|(i, k)| {
            if i % 2 == 0 {
                keyed(k, b"opaque")
            } else {
                GeneratedRecord {
                    key: k.as_bytes().to_vec(),
                    payload: serde_json::json!({ "idempotency_key": k }).to_string().into_bytes(),
                    headers: vec![],
                }
            }
        })
        .collect();
    produce(&sent_topic, &sent);

    let report = dir.path().join("report.json");
    let out = reconcile(&[
        "--sent",
        &format!("topic:{sent_topic}"),
        "--processed",
        &names.trace,
        "--processed-kind",
        "trace",
        "--trace-node",
        &node,
        "--report",
        report.to_str().expect("utf8"),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let (anomalies, summary) = json_report(&report);
    assert_eq!(
        anomalies,
        set(&[
            format!("missing {removed} 0"),
            format!("ghost {phantom} 1"),
            format!("duplicate {doubled} 2"),
            format!("dead_lettered {dead} 0"),
        ])
    );
    assert_eq!(summary["dropped"], 1, "the stale one is accounted for, not missing");
    assert_eq!(summary["missing"], 1);
    let n = gen.expected_keys.len() as u64;
    assert_eq!(summary["sent_records"], n + 2);
    assert_eq!(
        summary["processed_records"],
        n + 1,
        "n-1 outputs, a phantom and a second completion"
    );
    assert_eq!(summary["unreadable_sent"], 0);
    assert_eq!(summary["unreadable_processed"], 0);
    assert!(
        summary["skipped"].as_u64().is_some_and(|s| s > n),
        "RECEIVED, PROCESSING, DUPLICATE and DEAD_LETTER records are not outputs: {summary}"
    );
}

/// Three events whose keys all read `A:B:C:D`, upstream sent all three, tally saw two: the
/// reconciliation names the third, by its fields, against outputs and trace records alike.
#[test]
fn a_lost_event_is_found_though_its_key_reads_like_another_events() {
    let names = Names::new("reconalike");
    create_topics(&[
        (&names.input, 2),
        (&names.output, 2),
        (&names.dlq, 1),
        (&names.trace, 2),
    ]);
    let event = |payment_id: &str, status: &str| serde_json::json!({ "event_type": "payment.paid", "payment_id": payment_id, "status": status });
    let processed = [event("A", "B:C:D"), event("A:B", "C:D"), event("P-1", "PAID")];
    let lost = event("A:B:C", "D");
    let record = |v: &serde_json::Value| GeneratedRecord {
        key: v["payment_id"].as_str().expect("id").as_bytes().to_vec(),
        payload: v.to_string().into_bytes(),
        headers: vec![],
    };
    // The second event twice: its copy is a duplicate, dropped, and no anomaly.
    let input: Vec<GeneratedRecord> = processed.iter().chain([&processed[1]]).map(record).collect();
    produce(&names.input, &input);
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = r#"
application_id: ${TALLY_APP_ID}
kafka: { bootstrap_servers: "${KAFKA_BOOTSTRAP}" }
state: { dir: "${TALLY_STATE_DIR}" }
sources: { payments: { topic: "${TALLY_INPUT_TOPIC}" } }
pipelines:
  - name: payments
    from: payments
    repartition: { key: "{payment_id}" }
    key: "{payment_id}:{status}"
    to: { topic: "${TALLY_OUTPUT_TOPIC}" }
dead_letter: { topic: "${TALLY_DLQ_TOPIC}" }
trace: { topic: "${TALLY_TRACE_TOPIC}" }
"#;
    let tally = Tally::start_yaml(yaml, &names, dir.path(), "i1");
    assert_eq!(wait_for_count(&names.output, 3, Duration::from_secs(120)), 3);
    tally.stop();
    let outputs = read_committed(&names.output, 3, Duration::from_secs(30));
    let fields: BTreeSet<Option<String>> = outputs
        .iter()
        .map(|m| header(m, "tally.idempotency_key.fields"))
        .collect();
    assert_eq!(
        fields,
        BTreeSet::from([
            None,
            Some(r#"["A","B:C:D"]"#.to_string()),
            Some(r#"["A:B","C:D"]"#.to_string())
        ]),
        "only keys that may read alike carry their fields"
    );

    // Upstream's export: the three events and the plain one, keyed by the pipeline's template.
    let export = dir.path().join("export.jsonl");
    let rows: Vec<String> = processed.iter().chain([&lost]).map(|v| v.to_string()).collect();
    std::fs::write(&export, rows.join("\n") + "\n").expect("write export");
    let expected = set(&[r#"missing A:B:C:D 0 ["A:B:C","D"]"#.to_string()]);
    for (processed_topic, kind) in [(&names.output, "output"), (&names.trace, "trace")] {
        let report = dir.path().join(format!("report-{kind}.json"));
        let out = reconcile(&[
            "--sent",
            export.to_str().expect("utf8"),
            "--sent-key",
            "{payment_id}:{status}",
            "--processed",
            processed_topic,
            "--processed-kind",
            kind,
            "--report",
            report.to_str().expect("utf8"),
        ]);
        assert_eq!(out.status.code(), Some(1), "{kind}: {}", text(&out));
        let (anomalies, summary) = json_report(&report);
        assert_eq!(anomalies, expected, "{kind}");
        assert_eq!(summary["sent_keys"], 4, "{kind}: {summary}");
        assert_eq!(summary["missing"], 1, "{kind}: {summary}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(r#"A:B:C:D ["A:B:C","D"]"#), "{}", text(&out));
    }
}

#[test]
fn bad_sent_lines_are_reported_with_their_line_and_fail_the_run() {
    let names = Names::new("reconbad");
    create_topics(&[(&names.output, 1)]);
    produce(&names.output, &[keyed("A", b"{}"), keyed("B", b"{}")]);
    let dir = tempfile::tempdir().expect("tempdir");
    let sent = dir.path().join("sent.jsonl");
    std::fs::write(&sent, "\"A\"\n{\"idempotency_key\": \n\"B\"\n").expect("write");
    let report = dir.path().join("report.csv");
    let out = reconcile(&[
        "--sent",
        sent.to_str().expect("utf8"),
        "--processed",
        &names.output,
        "--report",
        report.to_str().expect("utf8"),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("sent.jsonl:2"), "{}", text(&out));
    assert!(stdout.contains("FAILED: 1 unreadable sent"), "{}", text(&out));
    let rows: Vec<csv::StringRecord> = csv::Reader::from_path(&report)
        .expect("csv")
        .records()
        .map(|r| r.expect("row"))
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(&rows[0][0], "unreadable");
    assert!(rows[0][3].starts_with("sent ") && rows[0][3].contains("sent.jsonl:2: not valid JSON"));

    // Usage errors exit 2 and leave no report.
    let missing_topic = reconcile(&[
        "--sent",
        sent.to_str().expect("utf8"),
        "--processed",
        "no-such-topic-xyz",
    ]);
    assert_eq!(missing_topic.status.code(), Some(2), "{}", text(&missing_topic));
    let unknown_format = reconcile(&["--sent", "sent.txt", "--processed", &names.output]);
    assert_eq!(unknown_format.status.code(), Some(2), "{}", text(&unknown_format));
    assert!(String::from_utf8_lossy(&unknown_format.stderr).contains("--sent-format"));
}
