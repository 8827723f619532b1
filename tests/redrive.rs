//! `tally redrive` on the real broker: dead letters go back to their source once their cause is
//! fixed, exactly once across runs, with their own key and headers and without tally's.

mod common;

use common::*;
use rdkafka::Message;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use tally::demo::generator::GeneratedRecord;

fn payment(i: usize, pad: usize) -> GeneratedRecord {
    GeneratedRecord {
        key: format!("P-{i:03}").into_bytes(),
        payload: serde_json::json!({
            "event_type": "payment.paid", "payment_id": format!("P-{i:03}"), "status": "PAID", "pad": "x".repeat(pad)
        })
        .to_string()
        .into_bytes(),
        headers: vec![("message_id".to_string(), format!("m-{i}"))],
    }
}

fn redrive(topology: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("redrive")
        .arg(topology)
        .args(args)
        .output()
        .expect("tally redrive runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (
        out.status.success(),
        format!("{text}{}", String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn dead_letters_go_back_to_their_source_once_after_the_fix() {
    let names = Names::new("redrive");
    create_topics(&[(&names.input, 1), (&names.output, 1), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    // 10 payments fit, 3 are over the limit, 1 is not JSON.
    let mut input: Vec<GeneratedRecord> = (0..10).map(|i| payment(i, 0)).collect();
    input.extend((10..13).map(|i| payment(i, 400)));
    input.push(GeneratedRecord {
        key: b"broken".to_vec(),
        payload: b"{not json".to_vec(),
        headers: vec![],
    });
    produce(&names.input, &input);
    let topology = write_topology_with(dir.path(), &names, 300, false);
    let first = Tally::start(&topology, "i1", dir.path().join("first.log"));
    assert_eq!(wait_for_count(&names.output, 10, Duration::from_secs(90)), 10);
    assert_eq!(wait_for_count(&names.dlq, 4, Duration::from_secs(60)), 4);
    first.stop();

    // The fix: a higher limit. Then the oversize letters, and only those, go back.
    let topology = write_topology_with(dir.path(), &names, 4096, false);
    let (ok, text) = redrive(&topology, &["--reason", "oversize", "--dry-run"]);
    assert!(
        ok && text.contains("would send 3 dead letters") && text.contains("1 not selected"),
        "{text}"
    );
    assert_eq!(
        read_committed(&names.input, 14, Duration::from_secs(10)).len(),
        14,
        "a dry run sends nothing"
    );
    let (ok, text) = redrive(&topology, &["--reason", "oversize"]);
    assert!(ok && text.contains("sent 3 dead letters"), "{text}");
    let (ok, text) = redrive(&topology, &["--reason", "oversize"]);
    assert!(
        ok && text.contains("sent 0 dead letters") && text.contains("3 already redriven"),
        "{text}"
    );
    let resent = read_committed(&names.input, 17, Duration::from_secs(10));
    assert_eq!(resent.len(), 17, "each letter sent once across runs");
    for m in &resent[14..] {
        assert!(header(m, "tally.redriven_from").is_some_and(|c| c.starts_with(&names.dlq)));
        assert_eq!(header(m, "tally.error.reason"), None, "tally's diagnostics stay behind");
        assert!(
            header(m, "message_id").is_some(),
            "the record's own headers go back with it"
        );
        assert!(m.key().is_some_and(|k| k.starts_with(b"P-01")), "and its own key");
    }

    let second = Tally::start(&topology, "i1", dir.path().join("second.log"));
    let out = read_committed(&names.output, 13, Duration::from_secs(90));
    second.stop();
    let keys: std::collections::BTreeSet<String> = out.iter().map(business_key).collect();
    assert_eq!((out.len(), keys.len()), (13, 13), "the three recovered, nothing twice");
}

#[test]
fn a_letter_whose_texts_would_not_fit_its_closing_trace_record_is_redriven() {
    let names = Names::new("redrive-long");
    create_topics(&[
        (&names.input, 1),
        (&names.output, 1),
        (&names.dlq, 1),
        (&names.trace, 1),
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    // Not JSON, so dead-lettered with its correlation id: 200 kB of control characters in the
    // letter's header, 1.2 MB as JSON in a trace record, past the producer's limit.
    let control = "\u{1}".repeat(200_000);
    produce(
        &names.input,
        &[
            GeneratedRecord {
                key: b"broken".to_vec(),
                payload: b"{not json".to_vec(),
                headers: vec![("correlation_id".to_string(), control.clone())],
            },
            payment(1, 0),
        ],
    );
    let topology = write_topology_with(dir.path(), &names, 4096, false);
    let traced = std::fs::read_to_string(&topology).expect("topology")
        + &format!("trace: {{ topic: {}, level: all }}\n", names.trace);
    std::fs::write(&topology, traced).expect("topology with a trace topic");
    let tally = Tally::start(&topology, "i1", dir.path().join("tally.log"));
    assert_eq!(wait_for_count(&names.output, 1, Duration::from_secs(90)), 1);
    assert_eq!(wait_for_count(&names.dlq, 1, Duration::from_secs(60)), 1);
    tally.stop();

    let (ok, text) = redrive(&topology, &["--reason", "invalid_json"]);
    assert!(ok && text.contains("sent 1 dead letter"), "{text}");
    let traces = read_committed(&names.trace, usize::MAX, Duration::from_secs(10));
    let closing: Vec<serde_json::Value> = traces
        .iter()
        .filter_map(|m| serde_json::from_slice::<serde_json::Value>(m.payload()?).ok())
        .filter(|v| v["outcome"] == "REDRIVEN")
        .collect();
    assert_eq!(closing.len(), 1, "the event is closed once");
    let derived = tally::processors::correlation::derive(&control);
    assert_eq!(
        closing[0]["correlation_id"],
        derived.as_str(),
        "under the id derived from the long one"
    );
    let failed = traces
        .iter()
        .filter_map(|m| serde_json::from_slice::<serde_json::Value>(m.payload()?).ok())
        .find(|v| v["status"] == "FAILED")
        .expect("the stream's FAILED record");
    assert_eq!(
        failed["event_id"], closing[0]["event_id"],
        "closing the event the stream failed"
    );
    assert_eq!(failed["correlation_id"], derived.as_str());
}

#[test]
fn a_letter_its_destination_would_refuse_is_reported_and_the_others_are_sent() {
    let names = Names::new("redrive-limit");
    create_topics(&[(&names.input, 1), (&names.output, 1), (&names.dlq, 1)]);
    let small = format!("{}-small", names.input);
    create_topics_with(&[(&small, 1)], &[("max.message.bytes", "20000")]);
    let dir = tempfile::tempdir().expect("tempdir");
    // Two records that are not JSON, dead-lettered: one of 50 kB, which the topic they are
    // redriven to refuses, and one of a few bytes.
    let broken = |key: &str, size: usize| GeneratedRecord {
        key: key.as_bytes().to_vec(),
        payload: format!("{{{}", "x".repeat(size)).into_bytes(),
        headers: vec![],
    };
    produce(
        &names.input,
        &[broken("large", 50_000), broken("small", 10), payment(1, 0)],
    );
    let topology = write_topology_with(dir.path(), &names, 100_000, false);
    let tally = Tally::start(&topology, "i1", dir.path().join("tally.log"));
    assert_eq!(wait_for_count(&names.output, 1, Duration::from_secs(90)), 1);
    assert_eq!(wait_for_count(&names.dlq, 2, Duration::from_secs(60)), 2);
    tally.stop();

    let (ok, text) = redrive(&topology, &["--reason", "invalid_json", "--to", &small]);
    assert!(!ok, "a letter that cannot be sent fails the run: {text}");
    assert!(text.contains("sent 1 dead letter"), "{text}");
    assert!(
        text.contains("cannot send 1: the record is over the 20000 bytes") && text.contains(&small),
        "{text}"
    );
    let resent = read_committed(&small, 1, Duration::from_secs(10));
    assert_eq!(resent.len(), 1);
    assert_eq!(resent[0].key(), Some(b"small".as_slice()), "the letter that fits");
}
