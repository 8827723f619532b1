//! `tally reset`: refused while an instance runs; prints its plan without `--execute`; with it,
//! the group's offsets, the internal topics and the state directory are gone, and the next
//! start processes the sources again from their beginning with empty state.

mod common;

use common::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use tally::demo::generator;

fn reset(topology: &Path, execute: bool) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tally"));
    c.arg("reset").arg(topology);
    if execute {
        c.arg("--execute");
    }
    c.output().expect("tally reset runs")
}

fn topics() -> Vec<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("client");
    let md = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata");
    md.topics().iter().map(|t| t.name().to_string()).collect()
}

#[test]
fn a_reset_application_processes_its_sources_again_from_empty_state() {
    let names = Names::new("reset");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let gen = generator::payments(60, 0, 4096, 41);
    produce(&names.input, &gen.records);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 4096);
    let n = gen.expected_keys.len();

    let tally = Tally::start(&topology, "i1", dir.path().join("first.log"));
    assert_eq!(wait_for_count(&names.output, n, Duration::from_secs(60)), n);
    let refused = reset(&topology, true);
    let text = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(!refused.status.success() && text.contains("live member"), "{text}");
    tally.stop();

    let changelog = names.changelog("payments");
    let dry = reset(&topology, false);
    let plan = String::from_utf8_lossy(&dry.stdout).to_string();
    assert!(dry.status.success(), "{plan}");
    assert!(plan.contains(&changelog) && plan.contains("nothing deleted"), "{plan}");
    assert!(topics().contains(&changelog), "a dry run deletes nothing");

    let done = reset(&topology, true);
    let report = String::from_utf8_lossy(&done.stdout).to_string();
    assert!(
        done.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(
        report.contains("-payments-repartition") && report.contains("state directory"),
        "{report}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while topics().iter().any(|t| t.starts_with(&format!("{}-", names.app))) {
        assert!(Instant::now() < deadline, "the internal topics are deleted");
        std::thread::sleep(Duration::from_millis(500));
    }

    // Empty state and no offsets: every payment comes out once more.
    let tally = Tally::start(&topology, "i1", dir.path().join("second.log"));
    assert_eq!(wait_for_count(&names.output, 2 * n, Duration::from_secs(90)), 2 * n);
    let lines = tally.stop();
    let stopped = events(&lines, "tally stopped");
    assert_eq!(
        stopped[0]["duplicates"].as_u64(),
        Some((gen.records.len() - n) as u64),
        "the dedup state started empty"
    );
}
