//! The cluster going away under a running instance. Alone in its test binary: it stops the
//! shared broker, which the tests of other binaries (run one binary at a time) never see.

mod common;

use common::*;
use std::time::{Duration, Instant};

/// How long deploy/k8s gives a pod between SIGTERM and SIGKILL.
const GRACE_PERIOD: Duration = Duration::from_secs(60);

#[test]
fn sigterm_with_the_cluster_away_ends_tally_within_the_grace_period_and_loses_nothing() {
    if !local_broker_is_the_test_broker() {
        eprintln!(
            "SKIPPED: the broker at {} is not deploy/local/kafka's, so the test may not stop it",
            bootstrap()
        );
        return;
    }
    let names = Names::new("outage");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology_with(dir.path(), &names, 4096, false);
    // Transactions stay open 20 s, so the cluster goes away with one open, as it does when
    // SIGTERM comes during an outage.
    let yaml = std::fs::read_to_string(&topology).expect("topology");
    std::fs::write(
        &topology,
        yaml.replace("commit_interval_ms: 100", "commit_interval_ms: 20000"),
    )
    .expect("topology");
    produce(&names.input, &payments(0..200));
    let mut first = Tally::start(&topology, "i1", dir.path().join("first.log"));
    assert_eq!(read_committed(&names.output, 200, Duration::from_secs(90)).len(), 200);

    produce(&names.input, &payments(200..400));
    // Read into the open transaction, not committed.
    std::thread::sleep(Duration::from_secs(3));
    local_broker("down");
    std::thread::sleep(Duration::from_secs(2));
    let asked = Instant::now();
    first.signal("TERM");
    let status = first.exit_within(GRACE_PERIOD);
    let took = asked.elapsed();
    // Bring the cluster back before asserting, for the tests that follow.
    local_broker("up");
    let tail: Vec<String> = first.lines().iter().rev().take(15).map(|l| l.to_string()).collect();
    let status = status
        .unwrap_or_else(|| panic!("tally still ran {GRACE_PERIOD:?} after SIGTERM with the cluster away: {tail:#?}"));
    eprintln!("tally stopped {took:?} after SIGTERM with the cluster away: {status}");

    // What it could not commit is processed once after the restart; the rest is not repeated.
    produce(&names.input, &payments(0..410));
    let second = Tally::start(&topology, "i1", dir.path().join("second.log"));
    read_committed(&names.output, 410, Duration::from_secs(120));
    second.stop();
    let out = read_committed(&names.output, 410, Duration::from_secs(20));
    let keys: std::collections::BTreeSet<String> = out.iter().map(business_key).collect();
    assert_eq!((out.len(), keys.len()), (410, 410), "nothing lost, nothing doubled");
}
