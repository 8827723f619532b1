//! Operator mistakes and broken topics on the real broker: tally says what is wrong and what to
//! do, instead of running into a state it cannot keep.

mod common;

use common::*;
use std::time::Duration;

#[test]
fn a_changelog_that_is_not_compacted_stops_tally_with_the_fix() {
    let names = Names::new("not-compacted");
    let changelog = names.changelog("payments");
    // Created by hand with the broker's default `cleanup.policy=delete`.
    create_topics(&[(&names.input, 1), (&names.output, 1), (&names.dlq, 1), (&changelog, 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology_with(dir.path(), &names, 4096, false);
    let mut tally = Tally::start(&topology, "i1", dir.path().join("tally.log"));
    let status = tally
        .exit_within(Duration::from_secs(60))
        .expect("tally stops on its own");
    assert!(!status.success(), "a refusal, not a clean stop");
    let log = std::fs::read_to_string(dir.path().join("tally.log")).expect("log");
    assert!(
        log.contains(&changelog) && log.contains("cleanup.policy=compact"),
        "names the topic and the setting to change: {log}"
    );
}
