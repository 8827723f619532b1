//! Decisions of the pipeline processor on the example topologies' records.

use super::*;
use crate::config;
use crate::store::StoreEnv;
use crate::topology::KeyTemplate;

/// The key a `{a}:{b}` template gives fields `a` and `b`.
fn key(a: &str, b: &str) -> RenderedKey {
    let t: KeyTemplate = "{a}:{b}".parse().expect("template");
    let doc = serde_json::json!({"a": a, "b": b});
    t.render_key(doc.as_object().expect("object")).expect("renders")
}

const YAML: &str = r#"
application_id: t
kafka: { bootstrap_servers: "localhost:9092" }
processing: { max_record_bytes: 200 }
sources: { in: { topic: in } }
pipelines:
  - name: payments
    from: in
    key: "{payment_id}:{status}"
    routes:
      - when: { event_type: "payment.*" }
        strategy: ignore
    to: { topic: out, key: "{payment_id}" }
dead_letter: { topic: dlq }
"#;

const ROUTES: &str = r#"
application_id: t
kafka: { bootstrap_servers: "localhost:9092" }
sources: { in: { topic: in } }
pipelines:
  - name: sync
    from: in
    key: "{id}:{v}"
    routes:
      - when: { event_type: "entity.*" }
        strategy: overwrite
        entity: "{type}:{id}"
        version: "{v}"
      - when: { event_type: "cart.*" }
        strategy: merge
        entity: "{id}"
        increment_id: "{line}"
        into: lines
        max_state_bytes: 300
    to: { topic: out }
dead_letter: { topic: dlq }
"#;

fn setup() -> (PipelineProcessor, TaskStore, tempfile::TempDir) {
    setup_with(YAML)
}

fn setup_with(yaml: &str) -> (PipelineProcessor, TaskStore, tempfile::TempDir) {
    let t = config::load_str("t.yaml", yaml, |_| None).expect("valid topology");
    let p = Arc::new(t.pipelines[0].clone());
    let tmp = tempfile::tempdir().expect("tempdir");
    let s = TaskStore::open(tmp.path(), &p.store_names(), &StoreEnv::default()).expect("opens");
    let global = Arc::new(GlobalMappings::in_memory().expect("opens"));
    (PipelineProcessor::new(p, t.processing.max_record_bytes, global), s, tmp)
}

fn run(p: &PipelineProcessor, s: &mut TaskStore, payload: &[u8]) -> Processed {
    let input = Input {
        payload: Some(payload),
        correlation_header: None,
        coordinates: ("in", 0, 7),
        now_ms: 1_000,
    };
    p.process(&input, s).expect("no store error")
}

fn reason(p: &Processed) -> Option<Reason> {
    match &p.decision {
        Decision::Reject(r) => Some(r.reason),
        _ => None,
    }
}

#[test]
fn business_key_decides_not_the_message() {
    let (p, mut s, _tmp) = setup();
    let first = run(
        &p,
        &mut s,
        br#"{"event_type":"payment.completed","payment_id":"P1","status":"PAID"}"#,
    );
    assert_eq!(
        first.decision,
        Decision::Emit {
            idempotency_key: key("P1", "PAID"),
            output_key: "P1".into(),
            payload: None,
            pending: vec![]
        }
    );
    let again = run(
        &p,
        &mut s,
        br#"{"status":"PAID","payment_id":"P1","event_type":"payment.retried","extra":1}"#,
    );
    assert_eq!(
        again.decision,
        Decision::Duplicate {
            idempotency_key: key("P1", "PAID")
        }
    );
    assert_eq!(
        first.correlation_id, again.correlation_id,
        "derived from the business key"
    );
}

#[test]
fn every_kind_of_bad_record_is_rejected_with_its_reason() {
    let (p, mut s, _tmp) = setup();
    let big = format!(
        r#"{{"event_type":"payment.x","payment_id":"P","status":"S","pad":"{}"}}"#,
        "x".repeat(300)
    );
    assert_eq!(reason(&run(&p, &mut s, big.as_bytes())), Some(Reason::Oversize));
    assert_eq!(reason(&run(&p, &mut s, b"{not json")), Some(Reason::InvalidJson));
    assert_eq!(reason(&run(&p, &mut s, b"[1,2]")), Some(Reason::NotAnObject));
    assert_eq!(
        reason(&run(&p, &mut s, br#"{"event_type":"payment.x","payment_id":"P"}"#)),
        Some(Reason::MissingKeyField)
    );
    assert_eq!(
        reason(&run(
            &p,
            &mut s,
            br#"{"event_type":"payment.x","payment_id":{"a":1},"status":"S"}"#
        )),
        Some(Reason::NonScalarKeyField)
    );
    assert_eq!(
        reason(&run(
            &p,
            &mut s,
            br#"{"event_type":"order.x","payment_id":"P","status":"S"}"#
        )),
        Some(Reason::NoRoute)
    );
    assert!(s.take_changes().is_empty(), "rejected records leave no dedup state");
}

/// The payments pipeline with a repartition hop by payment id, and `extra` pipeline lines.
fn setup_hop(extra: &str) -> (PipelineProcessor, TaskStore, tempfile::TempDir) {
    setup_with(&YAML.replace(
        "    key: \"{payment_id}:{status}\"",
        &format!("    repartition: {{ key: \"{{payment_id}}\" }}\n    key: \"{{payment_id}}:{{status}}\"{extra}"),
    ))
}

/// A record as the hop's source stage sees it.
fn hop_input(payload: &[u8]) -> Input<'_> {
    Input {
        payload: Some(payload),
        correlation_header: None,
        coordinates: ("in", 1, 2),
        now_ms: 0,
    }
}

#[test]
fn rekey_renders_the_repartition_key_or_rejects() {
    let (p, _s, _tmp) = setup_hop("");
    assert_eq!(
        p.rekey(&hop_input(br#"{"payment_id":"P9","status":"PAID","amount":1}"#), false)
            .map(|r| (r.key, r.correlation_id)),
        Ok(("P9".to_string(), None))
    );
    let traced = p.rekey(&hop_input(br#"{"payment_id":"P9","status":"PAID"}"#), true);
    assert_eq!(
        traced.map(|r| r.correlation_id),
        Ok(Some(correlation::derive("P9:PAID"))),
        "the correlation id is derived from the business key"
    );
    let rejected = p
        .rekey(&hop_input(br#"{"status":"PAID"}"#), false)
        .expect_err("no payment_id");
    assert!(matches!(
        rejected.decision,
        Decision::Reject(Rejection {
            reason: Reason::MissingKeyField,
            ..
        })
    ));
}

#[test]
fn the_hop_decodes_only_its_key_yet_checks_the_whole_value_and_keeps_the_correlation_of_a_rejection() {
    let (p, _s, _tmp) = setup_hop("\n    correlation_id: { field: correlation_id }");
    let bad_elsewhere = p
        .rekey(&hop_input(br#"{"payment_id":"P9","skipped":[1,}"#), false)
        .expect_err("invalid JSON in a field the hop skips");
    assert_eq!(reason(&bad_elsewhere), Some(Reason::InvalidJson));
    let no_key = p
        .rekey(&hop_input(br#"{"status":"PAID","correlation_id":"C-7"}"#), false)
        .expect_err("no payment_id");
    assert_eq!(reason(&no_key), Some(Reason::MissingKeyField));
    assert_eq!(
        no_key.correlation_id, "C-7",
        "the dead letter keeps the record's correlation id"
    );
}

#[test]
fn overwrite_passes_higher_versions_keyed_by_entity_and_drops_the_rest() {
    let (p, mut s, _tmp) = setup_with(ROUTES);
    let rec = |v: &str| format!(r#"{{"event_type":"entity.updated","type":"customer","id":"C1","v":{v}}}"#);
    let first = run(&p, &mut s, rec("3").as_bytes());
    assert_eq!(
        first.decision,
        Decision::Emit {
            idempotency_key: key("C1", "3"),
            output_key: "customer:C1".into(),
            payload: None,
            pending: vec![]
        }
    );
    assert!(matches!(
        run(&p, &mut s, rec("\"2\"").as_bytes()).decision,
        Decision::Stale {
            version: 2,
            current: 3,
            ..
        }
    ));
    assert!(matches!(
        run(&p, &mut s, rec("3").as_bytes()).decision,
        Decision::Stale { version: 3, .. }
    ));
    assert!(matches!(
        run(&p, &mut s, rec("\"4\"").as_bytes()).decision,
        Decision::Emit { .. }
    ));
    assert_eq!(
        reason(&run(&p, &mut s, rec("4.5").as_bytes())),
        Some(Reason::InvalidVersion)
    );
    assert_eq!(
        reason(&run(&p, &mut s, rec("\"v5\"").as_bytes())),
        Some(Reason::InvalidVersion)
    );
}

#[test]
fn merge_without_into_keeps_every_increment_and_reserved_names_are_refused() {
    let yaml = ROUTES.replace("        into: lines\n", "");
    let (p, mut s, _tmp) = setup_with(&yaml);
    let rec = |line: &str| format!(r#"{{"event_type":"cart.add","id":"K1","v":1,"line":"{line}"}}"#);
    run(&p, &mut s, rec("L1").as_bytes());
    let Decision::Emit {
        payload: Some(state), ..
    } = run(&p, &mut s, rec("L2").as_bytes()).decision
    else {
        panic!("the second increment emits the merged state");
    };
    let v: Value = serde_json::from_slice(&state).expect("json");
    assert_eq!(v["increments"], 2);
    assert_eq!(v["items"][0]["line"], "L1");
    assert_eq!(v["items"][1]["line"], "L2");
    for reserved in ["increments", "entity"] {
        let yaml = ROUTES.replace("into: lines", &format!("into: {reserved}"));
        let e = config::load_str("t.yaml", &yaml, |_| None).expect_err("a reserved `into` is refused");
        assert!(e.to_string().contains(&format!("`into: {reserved}`")), "{e}");
    }
}

#[test]
fn merge_emits_the_state_applies_each_increment_once_and_bounds_it() {
    let (p, mut s, _tmp) = setup_with(ROUTES);
    let rec = |line: &str, pad: usize| {
        format!(
            r#"{{"event_type":"cart.add","id":"K1","v":1,"line":"{line}","pad":"{}"}}"#,
            "x".repeat(pad)
        )
    };
    let Decision::Emit {
        payload: Some(state),
        output_key,
        ..
    } = run(&p, &mut s, rec("L1", 1).as_bytes()).decision
    else {
        panic!("first increment emits the merged state");
    };
    assert_eq!(output_key, "K1");
    let v: Value = serde_json::from_slice(&state).expect("json");
    assert_eq!(v["lines"][0]["line"], "L1");
    assert!(matches!(
        run(&p, &mut s, rec("L1", 1).as_bytes()).decision,
        Decision::Duplicate { .. }
    ));
    assert_eq!(
        reason(&run(&p, &mut s, rec("L2", 400).as_bytes())),
        Some(Reason::StateTooLarge)
    );
    assert!(matches!(
        run(&p, &mut s, rec("L3", 1).as_bytes()).decision,
        Decision::Emit { .. }
    ));
}

#[test]
fn separators_inside_key_fields_keep_events_apart_in_every_store() {
    let (p, mut s, _tmp) = setup();
    let a = run(
        &p,
        &mut s,
        br#"{"event_type":"payment.paid","payment_id":"X:Y","status":"PAID"}"#,
    );
    let b = run(
        &p,
        &mut s,
        br#"{"event_type":"payment.paid","payment_id":"X","status":"Y:PAID"}"#,
    );
    assert!(matches!(a.decision, Decision::Emit { .. }), "{a:?}");
    assert!(
        matches!(&b.decision, Decision::Emit { idempotency_key, .. } if idempotency_key.text == "X:Y:PAID"),
        "the same readable key, another event: {b:?}"
    );
    let fields = |d: &Decision| d.idempotency_key().and_then(RenderedKey::distinct_fields);
    assert_eq!(fields(&a.decision), Some(vec!["X:Y".to_string(), "PAID".to_string()]));
    assert_eq!(
        fields(&b.decision),
        Some(vec!["X".to_string(), "Y:PAID".to_string()]),
        "outputs and trace records can tell them apart too"
    );
    let again = run(
        &p,
        &mut s,
        br#"{"event_type":"payment.paid","payment_id":"X","status":"Y:PAID"}"#,
    );
    assert!(matches!(again.decision, Decision::Duplicate { .. }), "{again:?}");

    let (p, mut s, _tmp) = setup_with(ROUTES);
    let first = run(
        &p,
        &mut s,
        br#"{"event_type":"entity.updated","type":"a:b","id":"c","v":2}"#,
    );
    let other = run(
        &p,
        &mut s,
        br#"{"event_type":"entity.updated","type":"a","id":"b:c","v":1}"#,
    );
    assert!(matches!(first.decision, Decision::Emit { .. }), "{first:?}");
    assert!(
        matches!(other.decision, Decision::Emit { .. }),
        "entity `a`+`b:c` is not entity `a:b`+`c`, whose version is higher: {other:?}"
    );
}

#[test]
fn text_keys_written_by_an_earlier_version_still_count_and_move_to_their_stored_form() {
    let (p, mut s, _tmp) = setup();
    // As an earlier version left it: the readable key as the stored key, committed.
    let index = 0;
    state::write(&mut s, index, "P1:PAID", &dedup::DedupEntry { first_seen_ms: 900 }).expect("writes");
    s.take_changes();
    s.commit(&[]).expect("commits");
    let again = run(
        &p,
        &mut s,
        br#"{"event_type":"payment.paid","payment_id":"P1","status":"PAID"}"#,
    );
    assert_eq!(
        again.decision,
        Decision::Duplicate {
            idempotency_key: key("P1", "PAID")
        }
    );
    let moved: Vec<(Vec<u8>, bool)> = s
        .take_changes()
        .into_iter()
        .map(|c| (c.key, c.value.is_some()))
        .collect();
    assert_eq!(
        moved.len(),
        2,
        "a tombstone for the text key and the value under the stored key: {moved:?}"
    );
    assert!(moved.contains(&(b"P1:PAID".to_vec(), false)));
    assert!(moved.iter().any(|(k, put)| *put && k.first() == Some(&0)));
}

#[test]
fn a_version_is_a_64_bit_integer_however_it_is_written() {
    // Each record is a new entity, so every accepted version passes and is compared to nothing.
    let cases: [(&str, Option<i64>); 14] = [
        ("0", Some(0)),
        ("-3", Some(-3)),
        ("9223372036854775807", Some(i64::MAX)),
        ("5.0", Some(5)),
        (r#""42""#, Some(42)),
        (r#""+5""#, Some(5)),
        (r#""007""#, Some(7)),
        (r#"" 8 ""#, Some(8)),
        ("1.5", None),
        ("9223372036854775808", None),
        (r#""1.5""#, None),
        (r#""v3""#, None),
        (r#""""#, None),
        ("true", None),
    ];
    let (p, mut s, _tmp) = setup_with(ROUTES);
    for (i, (raw, expected)) in cases.iter().enumerate() {
        let payload = format!(r#"{{"event_type":"entity.updated","type":"t","id":"e{i}","v":{raw}}}"#);
        let decision = run(&p, &mut s, payload.as_bytes()).decision;
        match expected {
            Some(_) => assert!(matches!(decision, Decision::Emit { .. }), "{raw}: {decision:?}"),
            None => assert!(
                matches!(&decision, Decision::Reject(r) if matches!(r.reason, Reason::InvalidVersion | Reason::MissingKeyField)),
                "{raw}: {decision:?}"
            ),
        }
    }
    // The parsed value is what the gate compares: "007" is 7, so 6 is stale and 8 is newer.
    let entity = |v: &str| format!(r#"{{"event_type":"entity.updated","type":"t","id":"same","v":{v}}}"#);
    assert!(matches!(
        run(&p, &mut s, entity(r#""007""#).as_bytes()).decision,
        Decision::Emit { .. }
    ));
    assert!(matches!(
        run(&p, &mut s, entity("6").as_bytes()).decision,
        Decision::Stale {
            version: 6,
            current: 7,
            ..
        }
    ));
    assert!(matches!(
        run(&p, &mut s, entity("8").as_bytes()).decision,
        Decision::Emit { .. }
    ));
}
