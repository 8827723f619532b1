//! Interactive queries over HTTP: two instances with queries enabled; for a key, the owner of
//! its partition answers with the committed value, the other redirects (307) to the owner, an
//! absent key is 404, and with queries off `/queries` is 404 saying how to turn them on.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tally::demo::generator;

/// The topology; `{instance}` in the URL is the instance id, which the test makes the port of
/// the instance's HTTP address.
fn yaml(enabled: bool) -> String {
    format!(
        r#"
application_id: ${{TALLY_APP_ID}}
kafka:
  bootstrap_servers: ${{KAFKA_BOOTSTRAP}}
  properties: {{ session.timeout.ms: 6000, heartbeat.interval.ms: 1000 }}
processing: {{ commit_interval_ms: 100 }}
state: {{ dir: "${{TALLY_STATE_DIR}}" }}
sources:
  payments: {{ topic: "${{TALLY_INPUT_TOPIC}}" }}
pipelines:
  - name: payments
    from: payments
    repartition: {{ key: "{{payment_id}}" }}
    key: "{{payment_id}}:{{status}}"
    routes:
      - when: {{ event_type: "payment.*" }}
        strategy: ignore
    to: {{ topic: "${{TALLY_OUTPUT_TOPIC}}", key: "{{payment_id}}" }}
dead_letter: {{ topic: "${{TALLY_DLQ_TOPIC}}" }}
queries: {{ enabled: {enabled}, advertised_url: "http://127.0.0.1:{{instance}}" }}
"#
    )
}

/// One HTTP/1.0 GET: status, the `Location` header if any, body.
fn get(addr: &str, path: &str) -> Option<(u16, Option<String>, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let location = head
        .lines()
        .find_map(|l| l.strip_prefix("location: ").or_else(|| l.strip_prefix("Location: ")))
        .map(str::to_string);
    Some((status, location, body.to_string()))
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// Percent-encodes everything but unreserved characters.
fn encode(key: &str) -> String {
    key.bytes().fold(String::new(), |mut out, b| {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            other => out.push_str(&format!("%{other:02X}")),
        }
        out
    })
}

/// Asks `addr` for `path` until it answers something other than 503 (a rebalance settling).
fn ask(addr: &str, path: &str) -> (u16, Option<String>, String) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = get(addr, path).expect("the instance answers");
        if answer.0 != 503 || Instant::now() > end {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Follows a redirect to `http://host:port/path?query`.
fn follow(location: &str) -> (u16, Option<String>, String) {
    let rest = location.strip_prefix("http://").expect("an http URL");
    let (host, path) = rest.split_at(rest.find('/').expect("a path"));
    ask(host, path)
}

#[test]
fn the_owner_answers_the_other_redirects_and_absent_keys_are_not_found() {
    let started = Instant::now();
    let names = Names::new("queries");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr_a, addr_b) = (free_address(), free_address());
    let port = |addr: &str| addr.rsplit(':').next().expect("port").to_string();
    let start = |addr: &str| {
        let extra = [("TALLY_HTTP_ADDRESS", addr.to_string())];
        Tally::start_yaml_with(&yaml(true), &names, dir.path(), &port(addr), &extra)
    };
    let (a, b) = (start(&addr_a), start(&addr_b));

    let gen = generator::payments(400, 0, 0, 19);
    produce(&names.input, &gen.records);
    let got = wait_for_count(&names.output, gen.expected_keys.len(), Duration::from_secs(90));
    assert_eq!(got, gen.expected_keys.len(), "every event processed");

    // Both instances see the whole stateful topic owned (the group watch looks every 5 s).
    let end = Instant::now() + Duration::from_secs(60);
    let index = loop {
        let (code, _, body) = get(&addr_a, "/queries").expect("index answers");
        assert_eq!(code, 200, "{body}");
        let index = json(&body);
        let partitions = index["pipelines"][0]["partitions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if partitions.len() == 2 && partitions.iter().all(|p| p["url"].is_string()) {
            break index;
        }
        assert!(
            Instant::now() < end,
            "the group view never showed both partitions owned: {index}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(index["pipelines"][0]["stores"][0], "payments-dedup");

    // The owner answers 200 with the value; the other instance redirects to it.
    let key = &gen.expected_keys[0];
    let path = format!("/queries/payments/payments-dedup/{}", encode(key));
    let (ra, rb) = (ask(&addr_a, &path), ask(&addr_b, &path));
    let (owner, other, answer, redirect) = match (ra.0, rb.0) {
        (200, 307) => (&addr_a, &addr_b, ra, rb),
        (307, 200) => (&addr_b, &addr_a, rb, ra),
        codes => panic!("one owner and one redirect expected, got {codes:?}: {ra:?} {rb:?}"),
    };
    let found = json(&answer.2);
    assert_eq!(found["key"], key.as_str());
    assert_eq!(found["store"], "payments-dedup");
    assert_eq!(found["instance"], port(owner));
    assert!(
        found["value"].as_str().is_some_and(|v| v.starts_with("first seen")),
        "{found}"
    );
    let location = redirect.1.expect("a Location header");
    assert!(
        location.starts_with(&format!("http://{owner}{path}?from={}", port(other))),
        "{location}"
    );
    let followed = follow(&location);
    assert_eq!(followed.0, 200, "{followed:?}");
    assert_eq!(
        json(&followed.2)["value"],
        found["value"],
        "the same value through the redirect"
    );
    // The readable key with its `:` left as is finds the same entry.
    let plain = ask(owner, &format!("/queries/payments/dedup/{key}"));
    assert_eq!(json(&plain.2)["value"], found["value"]);

    // An absent key: not found by the owner of its partition, wherever it is asked.
    let absent = "/queries/payments/dedup/NO-SUCH-PAYMENT%3APAID";
    let mut answer = ask(&addr_a, absent);
    if answer.0 == 307 {
        answer = follow(answer.1.as_deref().expect("a Location header"));
    }
    assert_eq!(answer.0, 404, "{answer:?}");
    assert_eq!(json(&answer.2)["found"], false);

    let unknown = get(&addr_a, "/queries/nope/dedup/x").expect("answers");
    assert_eq!(unknown.0, 404);
    assert_eq!(
        json(&unknown.2)["pipelines"][0],
        "payments",
        "the valid names are listed"
    );
    let (_, _, metrics) = get(owner, "/metrics").expect("metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tally_queries_total") && l.contains("outcome=\"found\"")),
        "queries are counted by outcome"
    );
    a.stop();
    b.stop();

    // Off (the default): 404 saying how to turn them on.
    let addr_c = free_address();
    let extra = [("TALLY_HTTP_ADDRESS", addr_c.clone())];
    let c = Tally::start_yaml_with(&yaml(false), &names, dir.path(), &port(&addr_c), &extra);
    let end = Instant::now() + Duration::from_secs(30);
    let off = loop {
        if let Some(answer) = get(&addr_c, "/queries") {
            break answer;
        }
        assert!(Instant::now() < end, "the instance never served HTTP");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(off.0, 404);
    assert!(
        json(&off.2)["error"]
            .as_str()
            .is_some_and(|e| e.contains("enabled: true")),
        "{off:?}"
    );
    c.stop();
    eprintln!("queries test: {:.1}s", started.elapsed().as_secs_f64());
}
