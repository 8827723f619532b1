//! The HTTP endpoints of a running instance: liveness, readiness after restore, Prometheus text.

mod common;

use common::*;
use std::time::{Duration, Instant};
use tally::demo::generator;

fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn metrics_and_health_endpoints_report_the_running_instance() {
    let names = Names::new("http");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let gen = generator::payments(300, 50, 2048, 3);
    produce(&names.input, &gen.records);
    let addr = free_address();
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 2048);
    let env = [("TALLY_HTTP_ADDRESS", addr.clone())];
    let tally = Tally::start_with_env(&topology, "i1", dir.path().join("tally.log"), &env);

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ready = None;
    while Instant::now() < deadline {
        if let Some((code, _)) = http_get(&addr, "/health/ready") {
            ready = Some(code);
            if code == 200 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(ready, Some(200), "ready once joined and restored");
    assert_eq!(http_get(&addr, "/health/live").map(|(c, _)| c), Some(200));
    assert_eq!(
        wait_for_count(&names.output, gen.expected_keys.len(), Duration::from_secs(60)),
        gen.expected_keys.len()
    );

    // Counters publish when a transaction commits; give the last one a moment.
    let total = gen.records.len() as f64;
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (code, body) = http_get(&addr, "/metrics").expect("metrics answer");
        assert_eq!(code, 200);
        if metric(&body, "tally_records_in_total") >= total || Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(metric(&body, "tally_records_in_total"), total);
    assert_eq!(metric(&body, "tally_records_out_total"), gen.expected_keys.len() as f64);
    assert_eq!(
        metric(&body, "tally_dead_lettered_total"),
        gen.poison.values().sum::<u64>() as f64
    );
    assert!(metric(&body, "tally_transactions_committed_total") >= 1.0);
    assert!(
        body.contains(&format!("application_id=\"{}\"", names.app)),
        "labelled by application"
    );
    tally.stop();
    assert!(
        http_get(&addr, "/health/live").is_none(),
        "the server stops with the instance"
    );
}

#[test]
fn an_unreachable_cluster_at_start_is_waited_for_not_a_crash() {
    let names = Names::new("no-broker");
    let dir = tempfile::tempdir().expect("tempdir");
    // Nothing listens there: the address was free a moment ago.
    let nowhere = free_address();
    let yaml = format!(
        r#"
application_id: {app}
kafka: {{ bootstrap_servers: "{nowhere}" }}
state: {{ dir: {state} }}
sources: {{ payments: {{ topic: {input} }} }}
pipelines:
  - name: payments
    from: payments
    key: "{{payment_id}}:{{status}}"
    to: {{ topic: {output} }}
dead_letter: {{ topic: {dlq} }}
"#,
        app = names.app,
        state = dir.path().join("state").display(),
        input = names.input,
        output = names.output,
        dlq = names.dlq,
    );
    let topology = dir.path().join("topology.yaml");
    std::fs::write(&topology, yaml).expect("write topology");
    let addr = free_address();
    let env = [("TALLY_HTTP_ADDRESS", addr.clone())];
    let tally = Tally::start_with_env(&topology, "i1", dir.path().join("tally.log"), &env);
    // Longer than a metadata request's 15 s timeout, after which tally used to exit.
    std::thread::sleep(Duration::from_secs(20));
    assert_eq!(
        http_get(&addr, "/health/live").map(|(c, _)| c),
        Some(200),
        "alive and waiting"
    );
    assert_eq!(
        http_get(&addr, "/health/ready").map(|(c, _)| c),
        Some(503),
        "not ready without a cluster"
    );
    let lines = tally.stop();
    assert!(
        !events(&lines, "the Kafka cluster cannot be reached yet; waiting for it").is_empty(),
        "it says what it waits for"
    );
}

#[test]
fn an_http_address_in_use_stops_tally_at_start_with_the_fix() {
    let names = Names::new("http-in-use");
    create_topics(&[(&names.input, 1), (&names.output, 1), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 4096);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("address").to_string();
    let env = [("TALLY_HTTP_ADDRESS", addr.clone())];
    let mut tally = Tally::start_with_env(&topology, "i1", dir.path().join("tally.log"), &env);
    let status = tally.exit_within(Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| !s.success()),
        "exits non-zero at start, not when it stops: {status:?}"
    );
    let log = std::fs::read_to_string(dir.path().join("tally.log")).expect("log");
    assert!(
        log.contains(&format!("cannot listen on {addr}")) && log.contains("--http-address"),
        "names the address and the fix: {log}"
    );
}

/// Open file descriptors of a process (Linux).
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[test]
fn silent_and_surplus_http_clients_neither_hold_connections_nor_use_up_file_descriptors() {
    use std::io::Read;
    use tally::http::{HEADER_TIMEOUT, MAX_CONNECTIONS};
    let names = Names::new("http-hostile");
    create_topics(&[(&names.input, 1), (&names.output, 1), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 4096);
    let addr = free_address();
    let env = [("TALLY_HTTP_ADDRESS", addr.clone())];
    let tally = Tally::start_with_env(&topology, "i1", dir.path().join("tally.log"), &env);
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(&addr, "/health/ready").map(|(c, _)| c) != Some(200) {
        assert!(Instant::now() < deadline, "the instance gets ready");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Its stores and Kafka connections are open by now.
    std::thread::sleep(Duration::from_secs(2));
    let before = open_fds(tally.pid());

    // Three times the limit of clients that connect and never send a request.
    let mut silent: Vec<std::net::TcpStream> = (0..3 * MAX_CONNECTIONS)
        .map(|_| std::net::TcpStream::connect(&addr).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let during = open_fds(tally.pid());
    assert!(
        during <= before + MAX_CONNECTIONS + 2,
        "at most {MAX_CONNECTIONS} connections are taken in: {before} descriptors before, {during} with {} silent clients",
        silent.len()
    );

    // Each is disconnected once the header timeout passes, and the endpoints answer again.
    let first = &mut silent[0];
    first
        .set_read_timeout(Some(HEADER_TIMEOUT + Duration::from_secs(10)))
        .expect("timeout");
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let read = first.read(&mut buf);
    let closed = match &read {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(closed, "the server closed the silent connection: {read:?}");
    assert!(
        started.elapsed() < HEADER_TIMEOUT + Duration::from_secs(5),
        "closed by the header timeout ({:?})",
        started.elapsed()
    );
    drop(silent);
    let deadline = Instant::now() + HEADER_TIMEOUT + Duration::from_secs(15);
    while http_get(&addr, "/health/live").map(|(c, _)| c) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "the endpoints answer once the silent clients are gone"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    tally.stop();
}
