//! Legal but unusual input on the real broker: no record, header or size may stall a partition,
//! kill a thread or merge two events.

mod common;

use common::*;
use rdkafka::message::{OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message};
use std::time::Duration;
use tally::demo::generator::GeneratedRecord;
use tally::engine::headers;

fn payment(i: usize) -> String {
    serde_json::json!({"event_type": "payment.paid", "payment_id": format!("P-{i:04}"), "status": "PAID"}).to_string()
}

#[test]
fn a_header_name_that_is_not_utf8_neither_panics_nor_stalls_and_reaches_the_output_intact() {
    let names = Names::new("binary-header");
    create_topics(&[(&names.input, 1), (&names.output, 2), (&names.dlq, 1)]);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("producer");
    // 50 records, the odd one, 99 more: one partition, so a stall would hold all that follow.
    for i in 0..150 {
        let body = payment(i);
        let mut hs = headers::add(OwnedHeaders::new(), b"message_id", Some(format!("m-{i}").as_bytes()));
        if i == 50 {
            hs = headers::add(hs, b"\xff\xfe", Some(b"\x00\xc3\x28"));
            hs = headers::add(hs, b"correlation_id", Some(b"\xc3\x28 not utf-8"));
        }
        let key = format!("P-{i:04}");
        producer
            .send(BaseRecord::to(&names.input).key(&key).payload(&body).headers(hs))
            .expect("enqueue");
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let addr = free_address();
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 4096);
    let env = [("TALLY_HTTP_ADDRESS", addr.clone())];
    let tally = Tally::start_with_env(&topology, "i1", dir.path().join("tally.log"), &env);

    let out = read_committed(&names.output, 150, Duration::from_secs(90));
    assert_eq!(
        out.len(),
        150,
        "every record, the one with the binary header name included, comes out"
    );
    let odd = out
        .iter()
        .find(|m| m.key() == Some(b"P-0050".as_slice()))
        .expect("the record with the binary header");
    let raw: Vec<(Vec<u8>, Option<Vec<u8>>)> = headers::list(odd.headers().expect("headers").as_borrowed())
        .map(|h| (h.name.to_vec(), h.value.map(<[u8]>::to_vec)))
        .collect();
    assert!(
        raw.contains(&(b"\xff\xfe".to_vec(), Some(b"\x00\xc3\x28".to_vec()))),
        "the binary header is copied byte for byte: {raw:?}"
    );
    assert_eq!(http_get(&addr, "/health/live").map(|(c, _)| c), Some(200));
    assert!(read_committed(&names.dlq, 0, Duration::from_secs(3)).is_empty());
    tally.stop();
}

#[test]
fn a_record_whose_output_outgrows_the_producer_limit_costs_one_dead_letter_not_the_partition() {
    let names = Names::new("outgrown");
    create_topics(&[(&names.input, 1), (&names.output, 2), (&names.dlq, 1)]);
    // 800 KB with a 200 KB payment_id: under max_record_bytes (1 MiB) on the way in, but the
    // repartition record (key = payment_id) and the output (key and idempotency-key header =
    // payment_id) are past librdkafka's 1,000,000-byte default on the way out.
    let big_id = format!("P-{}", "9".repeat(200_000));
    let padding = "x".repeat(600_000);
    let mut records = vec![];
    for i in 0..50 {
        records.push((format!("k-{i}"), payment(i)));
    }
    records.push((
        "k-big".to_string(),
        serde_json::json!({"event_type": "payment.paid", "payment_id": big_id, "status": "PAID", "note": padding})
            .to_string(),
    ));
    for i in 50..150 {
        records.push((format!("k-{i}"), payment(i)));
    }
    let producer = large_record_producer();
    for (key, body) in &records {
        producer
            .send(BaseRecord::to(&names.input).key(key).payload(body))
            .expect("enqueue");
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 1_048_576);
    let tally = Tally::start(&topology, "i1", dir.path().join("tally.log"));
    let out = read_committed(&names.output, 150, Duration::from_secs(90));
    assert_eq!(out.len(), 150, "every record after the oversized one comes out");
    let dlq = read_committed(&names.dlq, 1, Duration::from_secs(30));
    assert_one_too_large(&dlq, "50", b"k-big");
    assert!(
        dlq[0].payload().is_some_and(|p| p.len() > 800_000),
        "the original payload fits a dead letter"
    );
    tally.stop();
}

/// A correlation id of nearly a megabyte: the record's dead letter and trace records carry it
/// twice or escaped six times over, past the limit. Before they shrank it, the refused record's
/// own dead letter did not fit either, and the partition retried it forever.
#[test]
fn a_correlation_id_near_the_limit_costs_at_most_its_record_not_the_partition() {
    let names = Names::new("long-correlation");
    create_topics(&[
        (&names.input, 1),
        (&names.output, 2),
        (&names.dlq, 1),
        (&names.trace, 1),
    ]);
    let producer = large_record_producer();
    // `huge` makes every output of its record too large; `control` fits an output but not a
    // trace record, where each of its bytes is escaped as `\u0001`.
    let huge = "h".repeat(999_800);
    let control = "\u{1}".repeat(200_000);
    for i in 0..100 {
        let hs = headers::add(
            OwnedHeaders::new(),
            b"correlation_id",
            Some(format!("c-{i}").as_bytes()),
        );
        let body = payment(i);
        producer
            .send(BaseRecord::to(&names.input).key("k").payload(&body).headers(hs))
            .expect("enqueue");
        if i == 49 {
            for (n, id) in [(1000, &huge), (1001, &control)] {
                let hs = headers::add(OwnedHeaders::new(), b"correlation_id", Some(id.as_bytes()));
                let body = payment(n);
                producer
                    .send(BaseRecord::to(&names.input).key("k").payload(&body).headers(hs))
                    .expect("enqueue");
            }
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let yaml = r#"
application_id: ${TALLY_APP_ID}
kafka: { bootstrap_servers: "${KAFKA_BOOTSTRAP}" }
processing: { commit_interval_ms: 100, max_record_bytes: 1048576 }
state: { dir: "${TALLY_STATE_DIR}" }
sources:
  payments: { topic: "${TALLY_INPUT_TOPIC}" }
pipelines:
  - name: payments
    from: payments
    repartition: { key: "{payment_id}" }
    key: "{payment_id}:{status}"
    routes:
      - when: { event_type: "payment.*" }
        strategy: ignore
    to: { topic: "${TALLY_OUTPUT_TOPIC}", key: "{payment_id}" }
dead_letter: { topic: "${TALLY_DLQ_TOPIC}" }
trace: { topic: "${TALLY_TRACE_TOPIC}", level: all }
"#;
    let dir = tempfile::tempdir().expect("tempdir");
    let tally = Tally::start_yaml(yaml, &names, dir.path(), "i1");
    let out = read_committed(&names.output, 101, Duration::from_secs(90));
    let dlq = read_committed(&names.dlq, 1, Duration::from_secs(30));
    let traces = read_committed(&names.trace, 1000, Duration::from_secs(10));
    tally.stop();

    let out_ids: Vec<&[u8]> = out.iter().filter_map(|m| m.key()).collect();
    assert_eq!(
        out.len(),
        101,
        "every record but the huge one comes out: {} did",
        out.len()
    );
    assert!(out_ids.contains(&b"P-1001".as_slice()) && !out_ids.contains(&b"P-1000".as_slice()));
    let control_out = out
        .iter()
        .find(|m| m.key() == Some(b"P-1001".as_slice()))
        .expect("P-1001");
    assert_eq!(
        header(control_out, "correlation_id").as_deref(),
        Some(control.as_str()),
        "an output that fits keeps the whole id"
    );

    assert_eq!(dlq.len(), 1, "one dead letter");
    assert_eq!(
        header(&dlq[0], "tally.error.reason").as_deref(),
        Some("output_too_large")
    );
    assert_eq!(header(&dlq[0], "tally.source.offset").as_deref(), Some("50"));
    let derived = |id: &str| tally::processors::correlation::derive(id);
    assert_eq!(
        header(&dlq[0], "correlation_id"),
        Some(derived(&huge)),
        "the dead letter carries the id derived from the long one"
    );
    assert!(dlq[0].payload().is_none(), "the payload is left out, not the reason");
    assert_eq!(
        header(&dlq[0], "tally.error.payload_omitted").as_deref(),
        Some(payment(1000).len().to_string().as_str())
    );

    let trace_ids: Vec<String> = traces
        .iter()
        .filter_map(|m| serde_json::from_slice::<serde_json::Value>(m.payload()?).ok())
        .filter_map(|v| Some(v["correlation_id"].as_str()?.to_string()))
        .collect();
    for id in [derived(&huge), derived(&control), "c-99".to_string()] {
        assert!(trace_ids.contains(&id), "a trace record carries {id}");
    }
    assert!(
        trace_ids.iter().all(|id| id.len() <= 1024),
        "no trace record carries a long id"
    );
}

/// The same limit on the changelog: a merged state that would outgrow what tally can write is
/// refused with the increment that grew it, though that record's own output (the increment)
/// fits. Changelog records leave at the commit, so without the check the commit itself would
/// fail, again with every retry.
#[test]
fn a_state_that_outgrows_the_producer_limit_costs_one_dead_letter_not_the_partition() {
    let names = Names::new("state-outgrown");
    create_topics(&[(&names.input, 1), (&names.output, 2), (&names.dlq, 1)]);
    let line = |cart: &str, id: &str, bytes: usize| {
        let note = "x".repeat(bytes);
        serde_json::json!({"event_type": "cart.line_added", "cart_id": cart, "line_id": id, "note": note}).to_string()
    };
    // 400 KB lines: cart A's state holds two (800 KB) and would hold 1.2 MB with a third, past
    // librdkafka's 1,000,000-byte default; every record is under max_record_bytes on the way in.
    let records = [
        line("A", "A-1", 400_000),
        line("A", "A-2", 400_000),
        line("A", "A-3", 400_000),
        line("B", "B-1", 400_000),
        line("A", "A-4", 10),
    ];
    let producer = large_record_producer();
    for (i, body) in records.iter().enumerate() {
        producer
            .send(BaseRecord::to(&names.input).key(&format!("k-{i}")).payload(body))
            .expect("enqueue");
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let yaml = r#"
application_id: ${TALLY_APP_ID}
kafka: { bootstrap_servers: "${KAFKA_BOOTSTRAP}" }
processing: { commit_interval_ms: 100, max_record_bytes: 1048576 }
state: { dir: "${TALLY_STATE_DIR}" }
sources:
  carts: { topic: "${TALLY_INPUT_TOPIC}" }
pipelines:
  - name: carts
    from: carts
    repartition: { key: "{cart_id}" }
    key: "{cart_id}:{line_id}"
    routes:
      - when: { event_type: "cart.line_added" }
        strategy: merge
        entity: "{cart_id}"
        increment_id: "{line_id}"
        into: lines
        emit: increment
        max_state_bytes: 4000000
    to: { topic: "${TALLY_OUTPUT_TOPIC}" }
dead_letter: { topic: "${TALLY_DLQ_TOPIC}" }
"#;
    let dir = tempfile::tempdir().expect("tempdir");
    let tally = Tally::start_yaml(yaml, &names, dir.path(), "i1");
    let out = read_committed(&names.output, 4, Duration::from_secs(90));
    let dlq = read_committed(&names.dlq, 1, Duration::from_secs(30));
    tally.stop();
    let mut lines: Vec<String> = out
        .iter()
        .filter_map(|m| serde_json::from_slice::<serde_json::Value>(m.payload()?).ok())
        .filter_map(|v| Some(v["line_id"].as_str()?.to_string()))
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        ["A-1", "A-2", "A-4", "B-1"],
        "every increment but the one that outgrew the limit"
    );
    assert_one_too_large(&dlq, "2", b"k-2");
}

/// A producer that sends records past librdkafka's 1,000,000-byte default, as another client
/// may: they are what tally must refuse on the way out.
/// `dlq` holds one dead letter: the source record at `offset`, with its own `key`, refused as
/// `output_too_large`.
fn assert_one_too_large(dlq: &[OwnedMessage], offset: &str, key: &[u8]) {
    assert_eq!(dlq.len(), 1, "one dead letter");
    assert_eq!(
        header(&dlq[0], "tally.error.reason").as_deref(),
        Some("output_too_large")
    );
    assert_eq!(header(&dlq[0], "tally.source.offset").as_deref(), Some(offset));
    assert_eq!(dlq[0].key(), Some(key), "the original key");
}

#[test]
fn key_fields_that_hold_the_separator_stay_distinct_events() {
    let names = Names::new("separator");
    create_topics(&[(&names.input, 1), (&names.output, 1), (&names.dlq, 1)]);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("producer");
    // `{payment_id}:{status}` reads `X:Y:PAID` for both events; each comes twice, and a last
    // event marks the end (one partition, so everything before it is decided when it is out).
    let events = [
        ("X:Y", "PAID"),
        ("X", "Y:PAID"),
        ("X:Y", "PAID"),
        ("X", "Y:PAID"),
        ("END", "PAID"),
    ];
    for (i, (id, status)) in events.iter().enumerate() {
        let body = serde_json::json!({"event_type": "payment.paid", "payment_id": id, "status": status}).to_string();
        let key = format!("k-{i}");
        producer
            .send(BaseRecord::to(&names.input).key(&key).payload(&body))
            .expect("enqueue");
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology_with(dir.path(), &names, 4096, false);
    let tally = Tally::start(&topology, "i1", dir.path().join("tally.log"));
    let out = read_committed(&names.output, 3, Duration::from_secs(90));
    let mut ids: Vec<String> = out
        .iter()
        .filter_map(|m| m.payload())
        .filter_map(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
        .filter_map(|v| v["payment_id"].as_str().map(str::to_string))
        .collect();
    ids.sort();
    assert_eq!(ids, ["END", "X", "X:Y"], "two events with one readable key, each once");
    tally.stop();
}

#[test]
fn a_dead_letter_of_the_second_stage_keeps_the_source_record_s_own_key() {
    let names = Names::new("dlq-key");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("producer");
    // The repartition key (`payment_id`) renders, the business key (`{payment_id}:{status}`)
    // does not: the record is dead-lettered after the repartition hop, where its message key is
    // the repartition key.
    let no_status = serde_json::json!({"event_type": "payment.paid", "payment_id": "P-7"}).to_string();
    producer
        .send(BaseRecord::to(&names.input).key("orig-7").payload(&no_status))
        .expect("enqueue");
    producer
        .send(BaseRecord::<(), _>::to(&names.input).payload(&no_status))
        .expect("enqueue");
    producer.flush(Duration::from_secs(30)).expect("flush");

    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 4096);
    let tally = Tally::start(&topology, "i1", dir.path().join("tally.log"));
    let dlq = read_committed(&names.dlq, 2, Duration::from_secs(90));
    tally.stop();
    let mut keys: Vec<Option<Vec<u8>>> = dlq.iter().map(|m| m.key().map(<[u8]>::to_vec)).collect();
    keys.sort();
    assert_eq!(
        keys,
        [None, Some(b"orig-7".to_vec())],
        "the source records' own keys, not the repartition key `P-7`"
    );
    assert!(dlq
        .iter()
        .all(|m| header(m, "tally.error.reason").as_deref() == Some("missing_key_field")));
}

#[test]
fn the_repartition_topic_carries_the_source_in_one_header_and_records_in_the_older_form_are_still_read() {
    let names = Names::new("source-header");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 4096);
    produce(&names.input, &payments(0..10));
    let tally = Tally::start(&topology, "i1", dir.path().join("tally.log"));
    assert_eq!(read_committed(&names.output, 10, Duration::from_secs(90)).len(), 10);

    let hop = format!("{}-payments-repartition", names.app);
    let forwarded = read_committed(&hop, 10, Duration::from_secs(20));
    assert_eq!(forwarded.len(), 10);
    for m in &forwarded {
        let source = header(m, "tally.source").expect("one header names the source");
        let (place, offset) = source.rsplit_once('/').expect("<topic>/<partition>/<offset>");
        let (topic, partition) = place.rsplit_once('/').expect("<topic>/<partition>/<offset>");
        assert_eq!(topic, names.input);
        assert!(
            partition.parse::<i32>().is_ok() && offset.parse::<i64>().is_ok(),
            "{source}"
        );
        assert_eq!(header(m, "tally.source.topic"), None, "not the older three headers");
    }

    // Invalid JSON reaches the repartition topic only from outside (the first stage refuses
    // it), and the second stage dead-letters it with the place the headers carry: written by
    // this tally, by one before `tally.source`, or unreadable (the record's own place then).
    let record = |headers: &[(&str, String)]| GeneratedRecord {
        key: b"P-9999".to_vec(),
        payload: b"not json".to_vec(),
        headers: headers.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
    };
    produce(
        &hop,
        &[
            record(&[("tally.source", format!("{}/1/888", names.input))]),
            record(&[
                ("tally.source.topic", names.input.clone()),
                ("tally.source.partition", "0".into()),
                ("tally.source.offset", "777".into()),
            ]),
            record(&[("tally.source", "no-slashes".into())]),
            record(&[("tally.source", format!("{}/-1/5", names.input))]),
        ],
    );
    // A place no topic could have, as long as the topic takes: its dead letter and trace
    // records would repeat it and never fit, so the record's own place stands in.
    let giant = format!("{}/0/0", "A".repeat(999_000));
    let producer = large_record_producer();
    let hs = headers::add(OwnedHeaders::new(), b"tally.source", Some(giant.as_bytes()));
    producer
        .send(BaseRecord::to(&hop).key("P-9999").payload("not json").headers(hs))
        .expect("enqueue");
    producer.flush(Duration::from_secs(30)).expect("flush");
    produce(&names.input, &payments(10..20));
    let dlq = read_committed(&names.dlq, 5, Duration::from_secs(60));
    let out = read_committed(&names.output, 20, Duration::from_secs(60));
    tally.stop();
    assert_eq!(out.len(), 20, "the records after them come out");
    let mut places: Vec<(String, String, String)> = dlq
        .iter()
        .map(|m| {
            let h = |name: &str| header(m, name).unwrap_or_default();
            (
                h("tally.source.topic"),
                h("tally.source.partition"),
                h("tally.source.offset"),
            )
        })
        .collect();
    places.sort();
    let (own, carried): (Vec<_>, Vec<_>) = places.into_iter().partition(|p| p.0 == hop);
    assert_eq!(
        carried,
        [
            (names.input.clone(), "0".to_string(), "777".to_string()),
            (names.input.clone(), "1".to_string(), "888".to_string()),
        ]
    );
    assert_eq!(own.len(), 3, "no slashes, a negative partition, a giant topic: {own:?}");
}

#[test]
fn copies_of_an_event_whose_repartition_key_renders_empty_meet_in_one_task() {
    let names = Names::new("empty-hop-key");
    create_topics(&[(&names.input, 3), (&names.output, 1), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 4096);
    let by_tenant = std::fs::read_to_string(&topology).expect("topology").replace(
        r#"repartition: { key: "{payment_id}" }"#,
        r#"repartition: { key: "{tenant?}" }"#,
    );
    assert!(by_tenant.contains("{tenant?}"), "{by_tenant}");
    std::fs::write(&topology, by_tenant).expect("topology");
    // Every record renders the empty repartition key; each event comes 8 times, spread over the
    // input's partitions by its message keys. A producer that placed empty keys at random would
    // part an event's copies over the three tasks, and each task would pass one.
    let mut records = Vec::new();
    for copy in 0..8 {
        for id in ["P-1", "P-2", "P-3"] {
            let body =
                serde_json::json!({"event_type": "payment.paid", "payment_id": id, "status": "PAID", "tenant": ""});
            records.push(GeneratedRecord {
                key: format!("{id}-{copy}").into_bytes(),
                payload: body.to_string().into_bytes(),
                headers: vec![],
            });
        }
    }
    produce(&names.input, &records);
    let tally = Tally::start(&topology, "i1", dir.path().join("tally.log"));
    assert!(
        wait_for_count(&names.output, 3, Duration::from_secs(90)) >= 3,
        "the events come out"
    );
    // Time for any copy that reached another task to come out too.
    std::thread::sleep(Duration::from_secs(5));
    let out = read_committed(&names.output, usize::MAX, Duration::from_secs(5));
    tally.stop();
    let mut keys: Vec<String> = out.iter().map(business_key).collect();
    keys.sort();
    assert_eq!(keys, ["P-1:PAID", "P-2:PAID", "P-3:PAID"], "each event once");
}
