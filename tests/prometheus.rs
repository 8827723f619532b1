//! A real Prometheus (Debian's `prometheus` package, installed by `scripts/setup`) scrapes a
//! running tally: the rules in `deploy/prometheus` pass `promtool`, every query of the Grafana
//! dashboard returns data, and the stuck-event alert fires for an event that a downstream system
//! received and never finished.

mod common;

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tally::demo::generator;

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A Prometheus server for one test, scraping tally every second; killed when dropped, so a
/// failing test leaves no server behind.
struct Prometheus {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus with the repository's alert rules, scraping `target` as job `tally`.
    fn start(dir: &Path, target: &str) -> Self {
        let config = dir.join("prometheus.yml");
        let rules = repo_file("deploy/prometheus/tally-rules.yml");
        let yaml = format!(
            r#"
global: {{ scrape_interval: 1s, evaluation_interval: 1s }}
rule_files: ["{rules}"]
scrape_configs:
  - job_name: tally
    static_configs: [{{ targets: ["{target}"] }}]
"#,
            rules = rules.display()
        );
        std::fs::write(&config, yaml).expect("write prometheus.yml");
        let addr = free_address();
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("prometheus log"))
            .spawn()
            .expect("cannot start `prometheus`; run scripts/setup to install Debian's prometheus package");
        let p = Self { child, addr, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_get(&p.addr, "/-/ready").map(|(c, _)| c) != Some(200) {
            assert!(
                Instant::now() < deadline,
                "Prometheus not ready after 30 s; {}",
                p.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "log {}:\n{}",
            self.log.display(),
            lines[lines.len().saturating_sub(20)..].join("\n")
        )
    }

    /// The `data` of a successful API answer.
    fn api(&self, path: &str) -> serde_json::Value {
        let (code, body) = http_get(&self.addr, path)
            .unwrap_or_else(|| panic!("Prometheus does not answer {path}; {}", self.log_tail()));
        let v: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{path} answered {code} with non-JSON ({e}): {body}"));
        assert_eq!(v["status"], "success", "{path} answered {code}: {body}");
        v["data"].clone()
    }

    /// The result vector of an instant query.
    fn query(&self, expr: &str) -> Vec<serde_json::Value> {
        let data = self.api(&format!("/api/v1/query?query={}", url_encode(expr)));
        data["result"].as_array().cloned().unwrap_or_default()
    }

    /// The value of a query that returns one sample, if it does.
    fn scalar(&self, expr: &str) -> Option<f64> {
        let result = self.query(expr);
        match result.as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every `expr` in the dashboard JSON, with the Grafana variables a panel would substitute.
fn dashboard_queries(app: &str) -> Vec<String> {
    fn collect(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                        _ => collect(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| collect(v, out)),
            _ => {}
        }
    }
    let path = repo_file("deploy/grafana/tally-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("read the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    collect(&dashboard, &mut exprs);
    exprs
        .into_iter()
        .map(|e| {
            let q = e.replace("$__rate_interval", "1m").replace("$application_id", app);
            assert!(
                !q.contains('$'),
                "dashboard query uses a variable the test does not know: {e}"
            );
            q
        })
        .collect()
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .expect("cannot run `promtool`; run scripts/setup to install Debian's prometheus package");
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The payments topology with trace records at every node and the live reconciler on short
/// intervals, so a stuck event is reported seconds after it was received.
fn topology(dir: &Path, names: &Names, state: &str) -> PathBuf {
    let yaml = format!(
        r#"
application_id: {app}
kafka:
  bootstrap_servers: {bootstrap}
  properties:
    session.timeout.ms: 6000
    heartbeat.interval.ms: 1000
processing: {{ commit_interval_ms: 100, max_record_bytes: 2048 }}
state: {{ dir: {state} }}
sources:
  payments: {{ topic: {input} }}
pipelines:
  - name: payments
    from: payments
    repartition: {{ key: "{{payment_id}}" }}
    key: "{{payment_id}}:{{status}}"
    routes:
      - when: {{ event_type: "payment.*" }}
        strategy: ignore
    to: {{ topic: {output}, key: "{{payment_id}}" }}
dead_letter: {{ topic: {dlq} }}
trace: {{ topic: {trace}, level: all }}
reconcile:
  alerts_topic: {alerts}
  scan_interval: 2s
  threshold: 5s
"#,
        app = names.app,
        bootstrap = bootstrap(),
        state = dir.join(state).display(),
        input = names.input,
        output = names.output,
        dlq = names.dlq,
        trace = names.trace,
        alerts = names.alerts,
    );
    let path = dir.join(format!("{state}.yaml"));
    std::fs::write(&path, yaml).expect("write topology");
    path
}

/// Writes `tally.trace/v1` records of one event (status at node) as another system would.
fn write_trace(topic: &str, event_id: &str, correlation_id: &str, records: &[(&str, &str)]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("producer");
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    for (node, status) in records {
        let value = serde_json::json!({
            "format": "tally.trace/v1",
            "event_id": event_id,
            "idempotency_key": null,
            "correlation_id": correlation_id,
            "node": node,
            "status": status,
            "outcome": null,
            "timestamp_ms": now_ms,
        })
        .to_string();
        let headers = OwnedHeaders::new().insert(Header {
            key: "correlation_id",
            value: Some(correlation_id),
        });
        producer
            .send(BaseRecord::to(topic).key(event_id).payload(&value).headers(headers))
            .expect("queue trace record");
    }
    producer.flush(Duration::from_secs(30)).expect("flush trace records");
}

/// Polls `check` until it returns `Some` or `timeout` passes.
fn eventually<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn prometheus_scrapes_tally_the_dashboard_has_data_and_a_stuck_event_fires_its_alert() {
    promtool(&[
        "check",
        "rules",
        &repo_file("deploy/prometheus/tally-rules.yml").display().to_string(),
    ]);
    promtool(&[
        "check",
        "config",
        &repo_file("deploy/prometheus/prometheus.yml").display().to_string(),
    ]);

    let names = Names::new("prom");
    create_topics(&[
        (&names.input, 2),
        (&names.output, 2),
        (&names.dlq, 1),
        (&names.trace, 2),
        (&names.alerts, 1),
    ]);
    let dir = tempfile::tempdir().expect("tempdir");

    // A first instance fills the store's changelog, so the second one restores it.
    let first = generator::payments(400, 50, 2048, 31);
    produce(&names.input, &first.records);
    let i1 = Tally::start_with_env(
        &topology(dir.path(), &names, "state-1"),
        "i1",
        dir.path().join("i1.log"),
        &[],
    );
    assert_eq!(
        wait_for_count(&names.output, first.expected_keys.len(), Duration::from_secs(90)),
        first.expected_keys.len()
    );
    i1.stop();

    let tally_addr = free_address();
    let prometheus = Prometheus::start(dir.path(), &tally_addr);
    let i2 = Tally::start_with_env(
        &topology(dir.path(), &names, "state-2"),
        "i2",
        dir.path().join("i2.log"),
        &[("TALLY_HTTP_ADDRESS", tally_addr.clone())],
    );
    let second = generator::payments(400, 50, 2048, 32);
    produce(&names.input, &second.records);
    let all_keys = first.expected_keys.len() + second.expected_keys.len();
    assert_eq!(
        wait_for_count(&names.output, all_keys, Duration::from_secs(90)),
        all_keys
    );

    // A downstream sink received one event and never finished it; another it finished.
    let stuck_id = format!("erp-sink/{}/stuck", names.app);
    write_trace(&names.trace, &stuck_id, "corr-stuck", &[("erp/sink", "RECEIVED")]);
    let done_id = format!("erp-sink/{}/done", names.app);
    write_trace(
        &names.trace,
        &done_id,
        "corr-done",
        &[("erp/sink", "RECEIVED"), ("erp/sink", "COMPLETED")],
    );

    let firing = eventually(Duration::from_secs(90), || {
        let data = prometheus.api("/api/v1/alerts");
        data["alerts"].as_array()?.iter().find_map(|a| {
            let ours = a["labels"]["alertname"] == "TallyStuckEvents" && a["labels"]["application_id"] == names.app;
            (ours && a["state"] == "firing").then(|| a.clone())
        })
    });
    let firing = firing.unwrap_or_else(|| {
        panic!(
            "TallyStuckEvents did not fire within 90 s; alerts: {}; tally log: {}",
            prometheus.api("/api/v1/alerts"),
            dir.path().join("i2.log").display()
        )
    });
    assert!(
        firing["annotations"]["summary"]
            .as_str()
            .is_some_and(|s| s.contains(&names.app)),
        "the summary names the application: {firing}"
    );
    let app = format!("application_id=\"{}\"", names.app);
    assert_eq!(
        prometheus.scalar(&format!("sum(tally_reconcile_stuck_events{{{app}}})")),
        Some(1.0),
        "only the unfinished event is stuck: the completed one and tally's own events are not"
    );

    // The second instance restored the first one's changelog: one record per key.
    let restored = format!("sum(tally_restored_records_total{{{app}, store=\"payments-dedup\"}})");
    let expected = first.expected_keys.len() as f64;
    assert_eq!(
        eventually(Duration::from_secs(30), || prometheus
            .scalar(&restored)
            .filter(|&n| n == expected)),
        Some(expected),
        "restored records: {:?}",
        prometheus.query(&format!("tally_restored_records_total{{{app}}}"))
    );
    // Store sizes are read at most every 5 s and lag every 5 s: wait for the settled values.
    let keys = eventually(Duration::from_secs(30), || {
        prometheus
            .scalar(&format!("sum(tally_store_keys{{{app}, store=\"payments-dedup\"}})"))
            .filter(|&k| k == all_keys as f64)
    });
    assert_eq!(keys, Some(all_keys as f64), "the store holds every key once");
    // Every consumed topic has a lag per task: the source, the repartition topic and the trace
    // topic the reconciler reads; all drain to 0 once the input is processed.
    let consumed: std::collections::BTreeSet<String> = [
        names.input.clone(),
        format!("{}-payments-repartition", names.app),
        names.trace.clone(),
    ]
    .into();
    let lag_query = format!("tally_consumer_lag_records{{{app}}}");
    let drained = eventually(Duration::from_secs(30), || {
        let series = prometheus.query(&lag_query);
        let topics: std::collections::BTreeSet<String> = series
            .iter()
            .filter_map(|s| s["metric"]["topic"].as_str().map(str::to_string))
            .collect();
        (topics == consumed && series.iter().all(|s| s["value"][1] == "0")).then_some(())
    });
    assert!(
        drained.is_some(),
        "lag of {consumed:?} drains to 0: {:?}",
        prometheus.query(&lag_query)
    );

    let queries = dashboard_queries(&names.app);
    assert!(queries.len() >= 15, "the dashboard has its panels: {queries:?}");
    let empty: Vec<&String> = queries
        .iter()
        .filter(|q| {
            eventually(Duration::from_secs(20), || {
                (!prometheus.query(q).is_empty()).then_some(())
            })
            .is_none()
        })
        .collect();
    assert!(empty.is_empty(), "dashboard queries without data: {empty:#?}");
    i2.stop();
}
