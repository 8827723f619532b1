//! Scaling on the real broker: 1 → 3 → 1 instances and a rolling restart while input arrives;
//! the output stays exactly the reference model's and no transaction is left open.

mod common;

use common::*;
use std::collections::HashMap;
use std::time::Duration;
use tally::demo::generator;

#[test]
fn scale_out_scale_in_and_rolling_restart_keep_exactly_once() {
    scale_out_scale_in_and_rolling_restart("scale", false);
}

/// The same under KIP-848's consumer group protocol (docs/group-protocol.md).
#[test]
fn the_consumer_group_protocol_keeps_exactly_once_through_scaling_and_restarts() {
    scale_out_scale_in_and_rolling_restart("scale-kip848", true);
}

fn scale_out_scale_in_and_rolling_restart(test: &str, consumer_protocol: bool) {
    let names = Names::new(test);
    create_topics(&[(&names.input, 6), (&names.output, 6), (&names.dlq, 1)]);
    let gen = generator::payments(24_000, 0, 0, 77);
    let expected = gen.expected_keys.len();
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = write_topology(dir.path(), &names, 65536);
    if consumer_protocol {
        use_consumer_group_protocol(&topology);
    }
    let start = |id: &str| Tally::start(&topology, id, dir.path().join(format!("{id}-{}.log", rand_suffix())));

    let (input, records) = (names.input.clone(), gen.records.clone());
    let writer = std::thread::spawn(move || produce_paced(&input, &records, 1_500, Duration::from_millis(400)));
    let mut watcher = Watcher::new(&names.output);
    let pause = |watcher: &mut Watcher, secs: u64| {
        let seen = watcher.wait_for(usize::MAX, Duration::from_secs(secs));
        eprintln!("outputs so far: {seen}");
    };

    let i1 = start("i1");
    pause(&mut watcher, 4);
    let (i2, i3) = (start("i2"), start("i3"));
    pause(&mut watcher, 8);
    // The new instances really took tasks over from the first one.
    for lines in [i2.stop(), i3.stop()] {
        assert!(
            !events(&lines, "task ready").is_empty(),
            "a scaled-out instance ran tasks"
        );
        let kip848 = events(&lines, "group protocol `consumer`: the group watch is off");
        assert_eq!(
            !kip848.is_empty(),
            consumer_protocol,
            "ran the group protocol asked for"
        );
    }
    pause(&mut watcher, 5);
    // Rolling restart of all running instances, one at a time, with a second one present.
    let i2 = start("i2");
    pause(&mut watcher, 4);
    i1.stop();
    let i1 = start("i1");
    pause(&mut watcher, 4);
    i2.stop();
    let i2 = start("i2");
    writer.join().expect("writer");
    assert_eq!(
        watcher.wait_for(expected, Duration::from_secs(180)),
        expected,
        "every key came out"
    );
    i1.stop();
    i2.stop();

    assert_no_open_transactions(&names.output);
    let output = read_committed(&names.output, expected, Duration::from_secs(30));
    let outputs: Vec<_> = output
        .iter()
        .filter(|m| rdkafka::Message::payload(*m) != Some(b"marker".as_slice()))
        .collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for m in &outputs {
        *seen.entry(business_key(m)).or_default() += 1;
    }
    let dups: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(dups.is_empty(), "duplicates after rebalances, e.g. {dups:?}");
    assert_eq!(seen.len(), expected, "no key lost");
    assert!(gen.expected_keys.iter().all(|k| seen.contains_key(k)));
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
