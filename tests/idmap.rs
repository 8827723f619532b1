//! Cross-system ids on the real broker, through `topologies/crm-to-erp.yaml` with two instances:
//! pending-create, write-back recorded once, later events enriched on every instance.

mod common;

use common::*;
use rdkafka::Message;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The latest value per key of the mappings topic, and how many records each key received.
fn mappings(topic: &str) -> (BTreeMap<String, Option<String>>, BTreeMap<String, usize>) {
    let (mut last, mut writes) = (BTreeMap::new(), BTreeMap::new());
    for m in read_committed(topic, 0, Duration::from_secs(10)) {
        let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        *writes.entry(key.clone()).or_insert(0) += 1;
        last.insert(key, m.payload().map(|v| String::from_utf8_lossy(v).into_owned()));
    }
    (last, writes)
}

#[test]
fn unmapped_customers_go_out_pending_then_every_instance_uses_the_recorded_erp_id() {
    let names = Names::new("idmap");
    create_topics(&[
        (&names.input, 3),
        (&names.output, 3),
        (&names.dlq, 1),
        (&names.writeback, 3),
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Tally::start_example("crm-to-erp.yaml", &names, dir.path(), "i1");
    let b = Tally::start_example("crm-to-erp.yaml", &names, dir.path(), "i2");
    let customers = ["CRM-1", "CRM-2", "CRM-3"];

    // Phase 1: nobody knows these customers in the ERP yet.
    let phase1: Vec<_> = (0..30)
        .map(|i| crm_order(&format!("O-{i:03}"), customers[i % 3]))
        .collect();
    produce(&names.input, &phase1);
    assert_eq!(wait_for_count(&names.output, 30, Duration::from_secs(120)), 30);
    let (map, _) = mappings(&names.mappings);
    let pending: Vec<_> = map
        .iter()
        .filter(|(k, v)| k.starts_with("pending/erp/") && v.is_some())
        .collect();
    assert_eq!(pending.len(), 3, "one pending-create marker per customer: {map:?}");

    // The ERP reports what it created; every write-back is delivered twice.
    let mut wbs: Vec<_> = customers
        .iter()
        .enumerate()
        .map(|(i, c)| erp_write_back(c, &format!("ERP-{}", i + 1)))
        .collect();
    wbs.extend(wbs.clone());
    produce(&names.writeback, &wbs);
    let deadline = Instant::now() + Duration::from_secs(60);
    let map = loop {
        let (map, writes) = mappings(&names.mappings);
        let links = map.keys().filter(|k| k.starts_with("int/")).count();
        if links == 3 || Instant::now() > deadline {
            break (map, writes);
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let (map, writes) = map;
    for (i, crm) in customers.iter().enumerate() {
        let internal = map[&format!("ext/crm/{crm}")].clone().expect("internal id recorded");
        let link = format!("int/{internal}/erp");
        assert_eq!(
            map[&link].as_deref(),
            Some(format!("ERP-{}", i + 1).as_str()),
            "first write wins for {crm}"
        );
        assert_eq!(
            writes[&link], 1,
            "replays and the conflict wrote nothing more for {crm}"
        );
        assert_eq!(
            map[&format!("pending/erp/{internal}")],
            None,
            "pending marker cleared for {crm}"
        );
        assert_eq!(
            map[&format!("ext/erp/ERP-{}", i + 1)].as_deref(),
            Some(internal.as_str())
        );
    }

    // Once recorded, a later write-back claiming another ERP id for CRM-1 must change nothing.
    produce(&names.writeback, &[erp_write_back("CRM-1", "ERP-999")]);

    // Phase 2: give every instance's global reader a moment, then new orders.
    std::thread::sleep(Duration::from_secs(2));
    let phase2: Vec<_> = (30..60)
        .map(|i| crm_order(&format!("O-{i:03}"), customers[i % 3]))
        .collect();
    produce(&names.input, &phase2);
    assert_eq!(wait_for_count(&names.output, 60, Duration::from_secs(120)), 60);
    std::thread::sleep(Duration::from_secs(2));
    let la = a.stop();
    let lb = b.stop();
    let consumed: u64 = [&la, &lb]
        .iter()
        .map(|l| events(l, "tally stopped")[0]["records_in"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(consumed, 60 + 7, "every order and write-back was processed");
    let (map, writes) = mappings(&names.mappings);
    let internal = map["ext/crm/CRM-1"].clone().expect("internal id");
    assert_eq!(
        map[&format!("int/{internal}/erp")].as_deref(),
        Some("ERP-1"),
        "the later write-back lost"
    );
    assert_eq!(writes[&format!("int/{internal}/erp")], 1);
    assert!(!map.contains_key("ext/erp/ERP-999"));

    for m in read_committed(&names.output, 60, Duration::from_secs(20)) {
        let v: serde_json::Value = serde_json::from_slice(m.payload().expect("payload")).expect("json");
        let n: usize = v["order_id"].as_str().expect("order_id")[2..]
            .parse()
            .expect("order number");
        let expected_erp = format!("ERP-{}", n % 3 + 1);
        if n < 30 {
            assert_eq!(
                v["erp_customer_id"],
                serde_json::Value::Null,
                "order {n} went out before the mapping"
            );
            assert_eq!(header(&m, "tally.pending_create").as_deref(), Some("erp"));
        } else {
            assert_eq!(
                v["erp_customer_id"].as_str(),
                Some(expected_erp.as_str()),
                "order {n} carries the ERP id"
            );
            assert_eq!(header(&m, "tally.pending_create"), None);
        }
    }
    // Every instance holds the mappings and sees nothing pending.
    for lines in [&la, &lb] {
        let s = events(lines, "tally stopped")[0];
        assert_eq!(s["idmap_mappings"], 3, "{s}");
        assert_eq!(s["idmap_pending"], 0, "{s}");
    }

    // A restart with mappings present loads them (the topic ends with a commit marker, which
    // the reader once waited for forever) and enriches at once.
    let again = Tally::start_example("crm-to-erp.yaml", &names, dir.path(), "i1");
    produce(&names.input, &[crm_order("O-060", "CRM-2")]);
    let out = read_committed(&names.output, 61, Duration::from_secs(120));
    let restarted = again.stop();
    let loaded = events(&restarted, "ID mappings loaded");
    // The mappings are in the instance's RocksDB with the position it had read: a restart
    // reads only what was written since, here nothing.
    assert_eq!(
        loaded.first().map(|l| &l["applied"]),
        Some(&serde_json::json!(0)),
        "{loaded:?}"
    );
    assert_eq!(enriched(&out, "O-060"), Some("ERP-2".to_string()));

    // A SIGKILL loses nothing of the store: killed, restarted, it still enriches.
    let killed = Tally::start_example("crm-to-erp.yaml", &names, dir.path(), "i1");
    produce(&names.input, &[crm_order("O-061", "CRM-3")]);
    read_committed(&names.output, 62, Duration::from_secs(120));
    killed.kill();
    let after_kill = Tally::start_example("crm-to-erp.yaml", &names, dir.path(), "i1");
    produce(&names.input, &[crm_order("O-062", "CRM-1")]);
    let out = read_committed(&names.output, 63, Duration::from_secs(120));
    let lines = after_kill.stop();
    assert_eq!(enriched(&out, "O-061"), Some("ERP-3".to_string()));
    assert_eq!(enriched(&out, "O-062"), Some("ERP-1".to_string()));
    let stopped = events(&lines, "tally stopped");
    assert_eq!(
        stopped.first().map(|s| &s["idmap_mappings"]),
        Some(&serde_json::json!(3)),
        "{stopped:?}"
    );
}

/// The ERP id the output for `order_id` carries.
fn enriched(out: &[rdkafka::message::OwnedMessage], order_id: &str) -> Option<String> {
    out.iter()
        .filter_map(|m| serde_json::from_slice::<serde_json::Value>(m.payload()?).ok())
        .find(|v| v["order_id"] == order_id)
        .and_then(|v| v["erp_customer_id"].as_str().map(str::to_string))
}
