//! Partitions stranded by a static member that dies between the two rounds of a cooperative
//! rebalance get an owner again (`src/engine/group_watch.rs`), on the real broker.
//!
//! The stranding is made, not waited for: a fake member (this test binary run again as a child
//! process) owns every partition, dies the moment tally's arrival asks it to give half of them
//! up, and comes back with the same `group.instance.id` within the session timeout. The
//! coordinator hands it its reduced assignment without a rebalance, tally's member owns nothing,
//! and the given-up partitions have no owner. Kafka alone never repairs that.

mod common;

use common::*;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, ClientContext};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 6;
const EVENTS_PER_PARTITION: usize = 10;
/// Environment of the fake member's process: `<group>,<topic>,<abort on revoke: 0|1>`.
const FAKE_ENV: &str = "TALLY_TEST_FAKE_MEMBER";

fn yaml() -> String {
    r#"
application_id: ${TALLY_APP_ID}
kafka:
  bootstrap_servers: ${KAFKA_BOOTSTRAP}
  properties: { session.timeout.ms: 6000, heartbeat.interval.ms: 1000 }
processing: { commit_interval_ms: 100, static_membership: true }
state: { dir: "${TALLY_STATE_DIR}" }
sources:
  payments: { topic: "${TALLY_INPUT_TOPIC}" }
pipelines:
  - name: payments
    from: payments
    key: "{payment_id}:{status}"
    routes:
      - when: { event_type: "payment.*" }
        strategy: ignore
    to: { topic: "${TALLY_OUTPUT_TOPIC}", key: "{payment_id}" }
dead_letter: { topic: "${TALLY_DLQ_TOPIC}" }
"#
    .to_string()
}

#[test]
fn partitions_stranded_by_a_static_member_get_an_owner_again() {
    let names = Names::new("groupwatch");
    create_topics(&[(&names.input, PARTITIONS), (&names.output, PARTITIONS), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");

    let mut fake = Fake::spawn(&names, true);
    assert_eq!(
        fake.owned(Duration::from_secs(60)),
        Some(PARTITIONS as usize),
        "the fake owns everything first"
    );
    let tally = Tally::start_yaml(&yaml(), &names, dir.path(), "a");
    let died = fake.exit(Duration::from_secs(60));
    assert!(
        died.is_some_and(|s| !s.success()),
        "the fake dies when asked to give partitions up ({died:?})"
    );
    let mut fake = Fake::spawn(&names, false);
    let kept = fake
        .owned(Duration::from_secs(30))
        .expect("the fake is back with an assignment");
    assert!(
        kept < PARTITIONS as usize,
        "back within the session timeout, the fake keeps its reduced assignment ({kept})"
    );

    produce_to_every_partition(&names.input);
    // Tally's member owns nothing until the watch forces a rebalance; then it gets half.
    let expected = EVENTS_PER_PARTITION * (PARTITIONS as usize / 2);
    let out = wait_for_count(&names.output, expected, Duration::from_secs(120));
    let lines = tally.stop();
    fake.kill();
    let forced = events(&lines, "left the group and joined it again").len();
    assert!(
        out >= expected,
        "stranded partitions got no owner: {out} of {expected} outputs; forced rejoins {forced}"
    );
    assert!(forced >= 1, "the output came through a forced rejoin");
}

fn produce_to_every_partition(topic: &str) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("producer");
    for p in 0..PARTITIONS {
        for i in 0..EVENTS_PER_PARTITION {
            let id = format!("PAY-{p}-{i}");
            let payload = format!(r#"{{"event_type":"payment.captured","payment_id":"{id}","status":"CAPTURED"}}"#);
            producer
                .send(BaseRecord::to(topic).partition(p).key(&id).payload(&payload))
                .map_err(|(e, _)| e)
                .expect("queue record");
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}

/// The fake member's process and the lines it prints (`owned <n>` after each assignment change).
struct Fake {
    child: Child,
    lines: Receiver<String>,
}

impl Fake {
    fn spawn(names: &Names, abort_on_revoke: bool) -> Self {
        let exe = std::env::current_exe().expect("test binary");
        let mut child = Command::new(exe)
            .args(["fake_group_member", "--exact", "--ignored", "--nocapture"])
            .env(
                FAKE_ENV,
                format!("{},{},{}", names.app, names.input, u8::from(abort_on_revoke)),
            )
            .env("KAFKA_BOOTSTRAP", bootstrap())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the fake member");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Partitions the fake owns after its next assignment change, if one comes within `timeout`.
    fn owned(&mut self, timeout: Duration) -> Option<usize> {
        let end = Instant::now() + timeout;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            let line = self.lines.recv_timeout(left).ok()?;
            if let Some(n) = line.strip_prefix("owned ") {
                return n.parse().ok();
            }
        }
        None
    }

    fn exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Not a test: the fake group member above, run as a child process of
/// `partitions_stranded_by_a_static_member_get_an_owner_again` (which sets its environment).
#[test]
#[ignore = "child process of partitions_stranded_by_a_static_member_get_an_owner_again"]
fn fake_group_member() {
    let Ok(spec) = std::env::var(FAKE_ENV) else {
        return;
    };
    let mut parts = spec.split(',');
    let (group, topic, abort) = (
        parts.next().expect("group"),
        parts.next().expect("topic"),
        parts.next() == Some("1"),
    );
    let consumer: BaseConsumer<FakeContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .set("group.instance.id", "fake")
        .set("client.id", "fake-member")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000")
        .set("enable.auto.commit", "false")
        .create_with_context(FakeContext { abort })
        .expect("fake consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    loop {
        // Records are read and dropped: the fake never commits an offset.
        let _ = consumer.poll(Duration::from_millis(100));
    }
}

struct FakeContext {
    abort: bool,
}

impl ClientContext for FakeContext {}

impl ConsumerContext for FakeContext {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let (true, Rebalance::Revoke(tpl)) = (self.abort, rebalance) {
            if tpl.count() > 0 {
                // Dies between the rounds: no unassign, no second JoinGroup, no LeaveGroup.
                std::process::abort();
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, _: &Rebalance<'_>) {
        let owned = consumer.assignment().map(|a| a.count()).unwrap_or(0);
        println!("owned {owned}");
    }
}
