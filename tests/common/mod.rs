//! Harness for integration tests against the real broker started by `deploy/local/kafka up`.
#![allow(dead_code)] // each test binary uses a different part of the harness

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tally::demo::generator::GeneratedRecord;

/// The cluster a test binary chose instead of the test command's broker (a secured one it
/// started itself): its bootstrap address and the client properties to reach it.
static CLUSTER: std::sync::OnceLock<(String, Vec<(String, String)>)> = std::sync::OnceLock::new();

/// Points every helper of this test binary at `bootstrap`, with `properties` (TLS, SASL) on
/// every client; once per process.
pub fn use_cluster(bootstrap: &str, properties: &[(String, String)]) {
    let chosen = (bootstrap.to_string(), properties.to_vec());
    assert!(
        CLUSTER.set(chosen).is_ok(),
        "use_cluster is called once per test binary"
    );
}

/// The broker the test command started, or the one [`use_cluster`] chose.
pub fn bootstrap() -> String {
    if let Some((chosen, _)) = CLUSTER.get() {
        return chosen.clone();
    }
    std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_string())
}

/// A client configuration for the test's cluster, before the client's own settings.
pub fn client() -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in CLUSTER.get().map(|(_, p)| p.as_slice()).unwrap_or_default() {
        c.set(k, v);
    }
    c.set("bootstrap.servers", bootstrap());
    c
}

/// A plain HTTP/1.0 GET of `path` (with its query string) from `addr`: status code and body.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// A local address that was free a moment ago, for a server the test starts (and may restart),
/// never the same as another call's in this process. Binding port 0 twice in a row can give the
/// same port (a chaos run gave two of its instances one port, and whichever started second
/// could not listen), and a port from the kernel's ephemeral range can be taken by an outgoing
/// connection while its server is down; so the ports come from below that range, in a sequence.
pub fn free_address() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static TRIES: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (low, span) = (10_000, ephemeral_low.saturating_sub(10_000).max(1));
    // Spread over the range by process, so concurrent test binaries rarely try the same ports.
    let start = std::process::id().wrapping_mul(7919);
    loop {
        let n = TRIES.fetch_add(1, Ordering::Relaxed);
        assert!(n < 100_000, "no free port below the ephemeral range");
        let port = low + start.wrapping_add(n.wrapping_mul(104_729)) % span;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port as u16)) {
            return l.local_addr().expect("local address").to_string();
        }
    }
}

/// Topic and application names unique to one test run.
pub struct Names {
    pub app: String,
    pub input: String,
    pub output: String,
    pub dlq: String,
    pub writeback: String,
    pub mappings: String,
    pub trace: String,
    pub alerts: String,
}

impl Names {
    pub fn new(test: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let id = format!("{test}-{}-{}", std::process::id(), nanos % 1_000_000_000);
        Self {
            app: format!("app-{id}"),
            input: format!("in-{id}"),
            output: format!("out-{id}"),
            dlq: format!("dlq-{id}"),
            writeback: format!("wb-{id}"),
            mappings: format!("map-{id}"),
            trace: format!("trace-{id}"),
            alerts: format!("alerts-{id}"),
        }
    }

    pub fn changelog(&self, pipeline: &str) -> String {
        format!("{}-{pipeline}-dedup-changelog", self.app)
    }
}

/// Creates topics (name, partitions), failing the test if the broker refuses.
pub fn create_topics(topics: &[(&str, i32)]) {
    create_topics_with(topics, &[]);
}

/// Creates `topics` as [`create_topics`] does, each with the topic configuration `config`
/// (`max.message.bytes`, say).
pub fn create_topics_with(topics: &[(&str, i32)], config: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = client().create().expect("admin client");
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|(n, p)| {
            config
                .iter()
                .fold(NewTopic::new(n, *p, TopicReplication::Fixed(1)), |t, (k, v)| {
                    t.set(k, v)
                })
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let results = rt
        .block_on(admin.create_topics(&new, &AdminOptions::new()))
        .expect("create topics");
    for r in results {
        r.expect("topic created");
    }
}

/// A producer that may send records of up to 2 MB, past the broker's default limit, for
/// tests of records tally must refuse or carry whole.
pub fn large_record_producer() -> BaseProducer {
    client().set("message.max.bytes", "2000000").create().expect("producer")
}

/// Writes records to `topic` and waits until all are acknowledged.
pub fn produce(topic: &str, records: &[GeneratedRecord]) {
    produce_paced(topic, records, records.len().max(1), Duration::ZERO);
}

/// Writes records in chunks of `chunk`, pausing `pause` after each, so a run sees input arrive
/// while it processes.
pub fn produce_paced(topic: &str, records: &[GeneratedRecord], chunk: usize, pause: Duration) {
    produce_with(topic, records, chunk, pause, "consistent_random");
}

/// Writes records as a producer with librdkafka's `partitioner` (e.g. `murmur2_random`, the
/// Java client's choice) does, and waits until all are acknowledged.
pub fn produce_partitioned(topic: &str, records: &[GeneratedRecord], partitioner: &str) {
    produce_with(topic, records, records.len().max(1), Duration::ZERO, partitioner);
}

/// Writes `records` to partition `partition` of `topic`, whatever their keys.
pub fn produce_to(topic: &str, partition: i32, records: &[GeneratedRecord]) {
    let producer: BaseProducer = client().set("linger.ms", "20").create().expect("producer");
    for r in records {
        producer
            .send(
                BaseRecord::to(topic)
                    .key(&r.key)
                    .payload(&r.payload)
                    .partition(partition),
            )
            .expect("send");
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
}

fn produce_with(topic: &str, records: &[GeneratedRecord], chunk: usize, pause: Duration, partitioner: &str) {
    let producer: BaseProducer = client()
        .set("linger.ms", "20")
        .set("message.max.bytes", "10000000")
        .set("partitioner", partitioner)
        .create()
        .expect("producer");
    for (i, r) in records.iter().enumerate() {
        if i > 0 && i % chunk == 0 {
            producer.flush(Duration::from_secs(60)).expect("flush chunk");
            std::thread::sleep(pause);
        }
        let headers = r.headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
            h.insert(Header { key: k, value: Some(v) })
        });
        let mut rec = BaseRecord::to(topic).key(&r.key).payload(&r.payload).headers(headers);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), back)) => {
                    rec = back;
                    producer.poll(Duration::from_millis(20));
                }
                Err((e, _)) => panic!("produce failed: {e}"),
            }
        }
    }
    producer.flush(Duration::from_secs(60)).expect("flush input");
}

/// A read_committed consumer assigned to every partition of `topic` from the beginning, and the
/// partition count; `eof` turns on end-of-partition events.
pub fn committed_reader(topic: &str, eof: bool) -> (BaseConsumer, usize) {
    let consumer: BaseConsumer = client()
        .set("group.id", "tally-test-reader")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", if eof { "true" } else { "false" })
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let partitions = md.topics().first().map(|t| t.partitions().len()).unwrap_or(0);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        tpl.add_partition_offset(topic, p, Offset::Beginning).expect("tpl");
    }
    consumer.assign(&tpl).expect("assign");
    (consumer, partitions)
}

/// Reads every committed record of `topic` (read_committed) until at least `min` arrived and
/// the end of every partition is reached, or `timeout` passes.
pub fn read_committed(topic: &str, min: usize, timeout: Duration) -> Vec<OwnedMessage> {
    let (consumer, partitions) = committed_reader(topic, true);
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut at_end: HashMap<i32, bool> = HashMap::new();
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                at_end.insert(m.partition(), false);
                out.push(m.detach());
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p, true);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
        let all_at_end = at_end.len() == partitions && at_end.values().all(|e| *e);
        if all_at_end && out.len() >= min {
            break;
        }
    }
    out
}

/// Asserts no transaction is left open on `topic`: a marker written to every partition without
/// a transaction must become readable with read_committed (an open transaction would hold the
/// last stable offset back).
pub fn assert_no_open_transactions(topic: &str) {
    let producer: BaseProducer = client().create().expect("producer");
    let consumer: BaseConsumer = client()
        .set("group.id", "tally-test-marker")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let partitions = md.topics().first().map(|t| t.partitions().len()).unwrap_or(0) as i32;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .expect("watermarks");
        tpl.add_partition_offset(topic, p, Offset::Offset(high)).expect("tpl");
        producer
            .send(
                BaseRecord::<[u8], [u8]>::to(topic)
                    .partition(p)
                    .payload(b"marker".as_slice()),
            )
            .expect("marker");
    }
    producer.flush(Duration::from_secs(10)).expect("flush markers");
    consumer.assign(&tpl).expect("assign");
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < partitions as usize {
        assert!(
            Instant::now() < deadline,
            "markers not readable on {:?}: a transaction is left open",
            (0..partitions).filter(|p| !seen.contains(p)).collect::<Vec<_>>()
        );
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            if m.payload() == Some(b"marker".as_slice()) {
                seen.insert(m.partition());
            }
        }
    }
}

/// A header's value as text.
pub fn header(m: &OwnedMessage, key: &str) -> Option<String> {
    // Read as bytes: rdkafka's accessor panics on a header name that is not UTF-8.
    tally::engine::headers::list(m.headers()?.as_borrowed())
        .find(|h| h.name == key.as_bytes())
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The `{payment_id}:{status}` of an output record, computed by the test from the payload.
pub fn business_key(m: &OwnedMessage) -> String {
    let v: serde_json::Value = serde_json::from_slice(m.payload().expect("payload")).expect("json output");
    format!(
        "{}:{}",
        v["payment_id"].as_str().expect("payment_id"),
        v["status"].as_str().expect("status")
    )
}

/// Writes the payments topology for `names` into `dir`, with a repartition step by payment id.
pub fn write_topology(dir: &Path, names: &Names, max_record_bytes: usize) -> PathBuf {
    write_topology_with(dir, names, max_record_bytes, true)
}

/// Writes the payments topology, with or without its repartition step.
pub fn write_topology_with(dir: &Path, names: &Names, max_record_bytes: usize, repartition: bool) -> PathBuf {
    let repartition = if repartition {
        r#"repartition: { key: "{payment_id}" }"#
    } else {
        ""
    };
    let yaml = format!(
        r#"
application_id: {app}
kafka:
  bootstrap_servers: {bootstrap}
  properties:
    session.timeout.ms: 6000
    heartbeat.interval.ms: 1000
processing: {{ commit_interval_ms: 100, max_record_bytes: {max_record_bytes} }}
state: {{ dir: {state} }}
sources:
  payments: {{ topic: {input} }}
pipelines:
  - name: payments
    from: payments
    {repartition}
    key: "{{payment_id}}:{{status}}"
    routes:
      - when: {{ event_type: "payment.*" }}
        strategy: ignore
    to: {{ topic: {output}, key: "{{payment_id}}" }}
dead_letter: {{ topic: {dlq} }}
"#,
        app = names.app,
        bootstrap = bootstrap(),
        state = dir.join("state").display(),
        input = names.input,
        output = names.output,
        dlq = names.dlq,
    );
    let path = dir.join("topology.yaml");
    std::fs::write(&path, yaml).expect("write topology");
    path
}

/// Switches a topology written by [`write_topology_with`] to the consumer group protocol
/// (KIP-848), which takes session and heartbeat times from the broker.
pub fn use_consumer_group_protocol(topology: &Path) {
    let yaml = std::fs::read_to_string(topology).expect("read topology");
    let switched = yaml
        .replace(
            "  properties:\n    session.timeout.ms: 6000\n    heartbeat.interval.ms: 1000\n",
            "  properties: {}\n",
        )
        .replace("processing: { ", "processing: { group_protocol: consumer, ");
    assert!(
        switched.contains("group_protocol: consumer") && !switched.contains("session.timeout.ms"),
        "the topology has the shape write_topology_with gives it"
    );
    std::fs::write(topology, switched).expect("write topology");
}

/// `payment.paid` events `P-<i>` keyed by payment id, for the payments topology of
/// [`write_topology_with`].
pub fn payments(range: std::ops::Range<usize>) -> Vec<GeneratedRecord> {
    range
        .map(|i| GeneratedRecord {
            key: format!("P-{i:04}").into_bytes(),
            payload:
                serde_json::json!({"event_type": "payment.paid", "payment_id": format!("P-{i:04}"), "status": "PAID"})
                    .to_string()
                    .into_bytes(),
            headers: Vec::new(),
        })
        .collect()
}

/// A running `tally run` process with its JSON log in a file.
pub struct Tally {
    child: Child,
    log: PathBuf,
}

impl Tally {
    pub fn start(topology: &Path, instance_id: &str, log: PathBuf) -> Self {
        Self::start_with_env(topology, instance_id, log, &[])
    }

    /// Runs one of the example files in `topologies/` with the test's topics and state dir.
    pub fn start_example(example: &str, names: &Names, state: &Path, instance_id: &str) -> Self {
        Self::start_example_with(example, names, state, instance_id, &[])
    }

    /// Runs example `example` with `extra` environment besides the test's topics.
    pub fn start_example_with(
        example: &str,
        names: &Names,
        state: &Path,
        instance_id: &str,
        extra: &[(&str, String)],
    ) -> Self {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies").join(example);
        Self::start_file_with(&path, names, state, instance_id, extra)
    }

    /// Writes `yaml` (which names the test's topics as `${TALLY_INPUT_TOPIC}` etc., like the
    /// examples) into `state` and runs it.
    pub fn start_yaml(yaml: &str, names: &Names, state: &Path, instance_id: &str) -> Self {
        Self::start_yaml_with(yaml, names, state, instance_id, &[])
    }

    /// [`Tally::start_yaml`] with more environment (`TALLY_FAULTS`, say).
    pub fn start_yaml_with(
        yaml: &str,
        names: &Names,
        state: &Path,
        instance_id: &str,
        extra: &[(&str, String)],
    ) -> Self {
        let path = state.join(format!("{instance_id}.yaml"));
        std::fs::write(&path, yaml).expect("write topology");
        Self::start_file_with(&path, names, state, instance_id, extra)
    }

    fn start_file(path: &Path, names: &Names, state: &Path, instance_id: &str) -> Self {
        Self::start_file_with(path, names, state, instance_id, &[])
    }

    /// Runs `yaml` with `tally reconcile live` (the separately deployed reconciler) as
    /// `instance_id`, with the test's topics and a state dir of its own under `state`.
    pub fn start_reconciler_yaml(
        yaml: &str,
        names: &Names,
        state: &Path,
        instance_id: &str,
        extra: &[(&str, String)],
    ) -> Self {
        let path = state.join(format!("{instance_id}.yaml"));
        std::fs::write(&path, yaml).expect("write topology");
        let env = Self::env_of(names, state, instance_id, extra);
        let log = state.join(format!("{instance_id}.log"));
        Self::spawn(&["reconcile", "live"], &path, instance_id, log, &env, &[])
    }

    fn start_file_with(path: &Path, names: &Names, state: &Path, instance_id: &str, extra: &[(&str, String)]) -> Self {
        let env = Self::env_of(names, state, instance_id, extra);
        Self::start_with_env(path, instance_id, state.join(format!("{instance_id}.log")), &env)
    }

    /// The environment naming the test's topics and `instance_id`'s state directory.
    pub fn env_of<'a>(
        names: &Names,
        state: &Path,
        instance_id: &str,
        extra: &[(&'a str, String)],
    ) -> Vec<(&'a str, String)> {
        // Each instance has a state directory of its own, as on separate hosts.
        let state_dir = state.join(format!("state-{instance_id}")).display().to_string();
        let env = [
            ("KAFKA_BOOTSTRAP", bootstrap()),
            ("TALLY_APP_ID", names.app.clone()),
            ("TALLY_STATE_DIR", state_dir),
            ("TALLY_INPUT_TOPIC", names.input.clone()),
            ("TALLY_OUTPUT_TOPIC", names.output.clone()),
            ("TALLY_DLQ_TOPIC", names.dlq.clone()),
            ("TALLY_WRITEBACK_TOPIC", names.writeback.clone()),
            ("TALLY_MAPPING_TOPIC", names.mappings.clone()),
            ("TALLY_TRACE_TOPIC", names.trace.clone()),
            ("TALLY_ALERTS_TOPIC", names.alerts.clone()),
        ];
        env.into_iter().chain(extra.iter().cloned()).collect()
    }

    pub fn start_with_env(topology: &Path, instance_id: &str, log: PathBuf, env: &[(&str, String)]) -> Self {
        Self::spawn(&["run"], topology, instance_id, log, env, &[])
    }

    /// `tally run` with `flags` after the topology (`--accept-routing-change`, say).
    pub fn start_with_flags(topology: &Path, instance_id: &str, log: PathBuf, flags: &[&str]) -> Self {
        Self::spawn(&["run"], topology, instance_id, log, &[], flags)
    }

    fn spawn(
        command: &[&str],
        topology: &Path,
        instance_id: &str,
        log: PathBuf,
        env: &[(&str, String)],
        flags: &[&str],
    ) -> Self {
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_tally"))
            .arg("--log-json")
            .args(command)
            .arg(topology)
            .args(["--instance-id", instance_id])
            .args(flags)
            .env("RUST_LOG", "info,librdkafka=warn")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start tally");
        Self { child, log }
    }

    /// SIGKILL: no commit, no goodbye.
    pub fn kill(mut self) {
        self.child.kill().expect("sigkill");
        self.child.wait().expect("reap");
    }

    /// SIGTERM and wait for a clean exit; returns the log lines.
    pub fn stop(mut self) -> Vec<serde_json::Value> {
        if let Err(problem) = self.terminate(Duration::from_secs(60)) {
            panic!("{problem}");
        }
        self.lines()
    }

    /// SIGTERM and wait up to `timeout` for the exit; a process still running then is
    /// SIGKILLed. Err says what went wrong (unclean exit, or hung with its last log lines).
    pub fn terminate(&mut self, timeout: Duration) -> Result<(), String> {
        // A process killed before it installs its signal handler just dies; wait until it runs.
        let deadline = Instant::now() + Duration::from_secs(10);
        while events(&self.lines(), "tally starting").is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = self.child.id().to_string();
        let ok = Command::new("kill").args(["-TERM", &pid]).status().expect("kill -TERM");
        assert!(ok.success());
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                if status.success() {
                    return Ok(());
                }
                return Err(format!(
                    "tally exited with {status} (log {}); last log lines:\n{}",
                    self.log.display(),
                    self.tail(40)
                ));
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(format!(
                    "tally did not stop within {timeout:?} after SIGTERM (log {}); last log lines:\n{}",
                    self.log.display(),
                    self.tail(40)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last `n` lines of the log, for failure messages (the log's temp dir goes with the test).
    fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The exit status, if the process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The log file.
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Sends `signal` (`STOP`, `CONT`, …) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {}", self.child.id());
    }

    /// The JSON log lines written so far.
    pub fn lines(&self) -> Vec<serde_json::Value> {
        log_lines(&self.log)
    }

    /// Waits up to `timeout` for the process to exit on its own; its status, or None.
    pub fn exit_within(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn local_broker_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/local/kafka")
}

/// Runs `deploy/local/kafka <command>` (`up`, `down`, `kill`) with this process's environment
/// (TALLY_KAFKA_HOME, TALLY_KAFKA_PORT, … select the broker).
pub fn local_broker(command: &str) {
    let started = Instant::now();
    let status = Command::new(local_broker_script())
        .arg(command)
        .stdout(Stdio::null())
        .status()
        .expect("run deploy/local/kafka");
    assert!(status.success(), "deploy/local/kafka {command} failed: {status}");
    eprintln!("  broker {command}: {:.1}s", started.elapsed().as_secs_f64());
}

/// True when `deploy/local/kafka` runs the broker at the test's bootstrap address, so a test
/// may stop and start it.
pub fn local_broker_is_the_test_broker() -> bool {
    let out = Command::new(local_broker_script())
        .arg("bootstrap")
        .output()
        .expect("run deploy/local/kafka bootstrap");
    let managed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let running = Command::new(local_broker_script())
        .arg("status")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    managed == bootstrap() && running
}

/// Parses a JSON log file (non-JSON lines are skipped).
pub fn log_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Log lines whose message is `msg`.
pub fn events<'a>(lines: &'a [serde_json::Value], msg: &str) -> Vec<&'a serde_json::Value> {
    lines.iter().filter(|l| l["message"] == msg).collect()
}

/// Counts committed records of a topic as they arrive, with one long-lived consumer.
pub struct Watcher {
    consumer: BaseConsumer,
    seen: usize,
}

impl Watcher {
    /// Starts reading `topic` (read_committed) from the beginning of every partition.
    pub fn new(topic: &str) -> Self {
        let (consumer, _) = committed_reader(topic, false);
        Self { consumer, seen: 0 }
    }

    /// Reads until at least `n` records were seen or `timeout` passes; returns the count.
    pub fn wait_for(&mut self, n: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        while self.seen < n && Instant::now() < deadline {
            if let Some(m) = self.consumer.poll(Duration::from_millis(100)) {
                m.expect("read");
                self.seen += 1;
            }
        }
        self.seen
    }
}

/// Waits until `topic` holds at least `n` committed records or `timeout` passes.
pub fn wait_for_count(topic: &str, n: usize, timeout: Duration) -> usize {
    Watcher::new(topic).wait_for(n, timeout)
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A `tally.trace/v1` record as a downstream system (`erp-sink`) would write it.
pub fn trace_record(event_id: &str, correlation_id: &str, status: &str, at_ms: i64) -> GeneratedRecord {
    let value = serde_json::json!({
        "format": "tally.trace/v1",
        "event_id": event_id,
        "idempotency_key": format!("{event_id}:key"),
        "correlation_id": correlation_id,
        "node": "erp-sink",
        "status": status,
        "outcome": null,
        "timestamp_ms": at_ms,
    });
    GeneratedRecord {
        key: event_id.as_bytes().to_vec(),
        payload: value.to_string().into_bytes(),
        headers: vec![("correlation_id".into(), correlation_id.into())],
    }
}

/// An order of `topologies/crm-to-erp.yaml` for CRM customer `customer`.
pub fn crm_order(order_id: &str, customer: &str) -> GeneratedRecord {
    let payload = serde_json::json!({
        "event_type": "order.placed", "order_id": order_id, "status": "PLACED", "customer_id": customer
    });
    GeneratedRecord {
        key: order_id.as_bytes().to_vec(),
        payload: payload.to_string().into_bytes(),
        headers: vec![],
    }
}

/// The ERP's write-back that CRM customer `crm` is ERP customer `erp`.
pub fn erp_write_back(crm: &str, erp: &str) -> GeneratedRecord {
    let payload = serde_json::json!({
        "event_type": "customer.created", "system": "erp", "external_id": erp, "source_system": "crm", "source_id": crm
    });
    GeneratedRecord {
        key: format!("wb-{erp}").into_bytes(),
        payload: payload.to_string().into_bytes(),
        headers: vec![],
    }
}

/// The value of the first sample of `metric` whose labels include `labels`.
pub fn sample(metrics: &str, metric: &str, labels: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(metric) && l.contains(labels))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}
