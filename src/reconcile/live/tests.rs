//! The live reconciler on its own: open/close bookkeeping, transactions, stepped scans.

use super::*;
use crate::store::StoreEnv;
use std::time::Duration;

fn task(dir: &std::path::Path) -> ReconcileTask {
    let store = TaskStore::open(dir, &["reconcile-open".into()], &StoreEnv::default()).expect("opens");
    let settings = ReconcileSettings {
        alerts_topic: "alerts".into(),
        scan_interval: Duration::from_secs(1),
        threshold: Duration::from_secs(10),
        run: crate::topology::ReconcileRun::InProcess,
        watch: None,
    };
    let metrics = Arc::new(Metrics::new("test").expect("metrics"));
    ReconcileTask::new(
        "reconcile-0".into(),
        0,
        settings,
        store,
        vec!["cl".into()],
        "dlq".into(),
        metrics,
    )
}

fn record(event: &str, status: &str, at: i64) -> Vec<u8> {
    serde_json::json!({
        "format": FORMAT, "event_id": event, "idempotency_key": null, "correlation_id": "c",
        "node": "n", "status": status, "outcome": null, "timestamp_ms": at,
    })
    .to_string()
    .into_bytes()
}

fn open(t: &ReconcileTask, event: &str) -> Option<OpenEvent> {
    t.read(event.as_bytes()).ok().and_then(|(open, _)| open)
}

#[test]
fn events_open_on_received_stay_open_through_processing_and_close_on_a_terminal_status() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut t = task(tmp.path());
    let apply = |t: &mut ReconcileTask, bytes: &[u8]| t.apply(Some(bytes)).ok().map(|r| r.is_ok());
    assert_eq!(apply(&mut t, &record("e1", "RECEIVED", 100)), Some(true));
    assert_eq!(apply(&mut t, &record("e1", "PROCESSING", 200)), Some(true));
    let e1 = open(&t, "e1").expect("open");
    assert_eq!(
        (e1.first_seen_ms, e1.status),
        (100, Status::Processing),
        "opened at the first record"
    );
    assert_eq!(apply(&mut t, &record("e1", "COMPLETED", 300)), Some(true));
    assert_eq!(open(&t, "e1"), None);
    assert_eq!(apply(&mut t, &record("e2", "COMPLETED", 300)), Some(true));
    assert_eq!(open(&t, "e2"), None, "a completion alone opens nothing");
    assert_eq!(
        apply(&mut t, b"{\"format\":\"other/v2\"}"),
        Some(true),
        "other formats are skipped"
    );
    assert_eq!(apply(&mut t, b"not json"), Some(false), "garbage is rejected");
    assert_eq!(
        apply(
            &mut t,
            format!("{{\"format\":\"{FORMAT}\",\"status\":\"RECEIVED\"}}").as_bytes()
        ),
        Some(false),
        "a v1 record without its fields is rejected"
    );
    t.write_pending().expect("writes");
    let changes = t.store.take_changes();
    assert!(
        changes.is_empty(),
        "opened and closed in one transaction: nothing for the store or its changelog: {changes:?}"
    );

    assert_eq!(apply(&mut t, &record("e3", "RECEIVED", 400)), Some(true));
    assert_eq!(apply(&mut t, &record("e3", "PROCESSING", 450)), Some(true));
    t.write_pending().expect("writes");
    let changes = t.store.take_changes();
    assert_eq!(
        changes.len(),
        1,
        "one put for the event's state at the end: {changes:?}"
    );
    t.store.take_changes();
    t.store.commit(&[]).expect("commits");
    assert_eq!(open(&t, "e3").map(|o| o.status), Some(Status::Processing));
    assert_eq!(apply(&mut t, &record("e3", "COMPLETED", 500)), Some(true));
    assert_eq!(
        open(&t, "e3"),
        None,
        "closed in the transaction, before the store knows"
    );
    t.write_pending().expect("writes");
    let changes = t.store.take_changes();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].value, None, "a committed event is closed with a tombstone");
}

#[test]
fn scans_go_through_a_large_store_in_steps_and_alert_each_stuck_event_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut t = task(tmp.path());
    for (i, at) in [1_000, 2_000, 3_000, 4_000, 95_000].into_iter().enumerate() {
        let r = record(&format!("e{i}"), "RECEIVED", at);
        t.apply(Some(&r)).expect("applies").expect("valid");
    }
    t.write_pending().expect("writes");
    t.store.take_changes();
    t.store.take_changes();
    t.store.commit(&[]).expect("commits");
    // Threshold 10 s at clock 100 s: four of the five are stuck.
    let mut stuck = 0;
    let mut steps = 0;
    let report = loop {
        let step = t.scan_step(100_000, 2).expect("steps");
        steps += 1;
        stuck += step.stuck.len();
        assert!(step.stuck.iter().all(|(_, o, _)| o.alerted));
        if let Some(r) = step.report {
            break r;
        }
    };
    assert_eq!(steps, 3, "two entries per step over five entries");
    assert_eq!((report.open, report.stuck, report.alerted, stuck), (5, 4, 4, 4));
    assert_eq!(report.oldest_age_ms, 99_000);
    t.write_pending().expect("writes");
    t.store.take_changes();
    t.store.take_changes();
    t.store.commit(&[]).expect("commits");
    let again = t.scan_step(100_000, 100).expect("steps");
    assert!(again.stuck.is_empty(), "alerted once only");
    assert_eq!(again.report.map(|r| (r.open, r.stuck, r.alerted)), Some((5, 4, 0)));
}

fn commit(t: &mut ReconcileTask) {
    t.write_pending().expect("writes");
    t.store.take_changes();
    t.store.commit(&[]).expect("commits");
}

#[test]
fn entries_this_version_cannot_read_are_counted_not_passed_over() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut t = task(tmp.path());
    t.apply(Some(&record("readable", "RECEIVED", 1_000)))
        .expect("applies")
        .expect("valid");
    commit(&mut t);
    // A format byte no version has written yet, and a value cut short.
    t.store.put(0, b"newer", vec![0xEE, 1, 2, 3]);
    t.store.put(0, b"cut", Vec::new());
    t.store.take_changes();
    t.store.commit(&[]).expect("commits");
    let report = t.scan_step(2_000, 100).expect("steps").report.expect("one step");
    assert_eq!((report.open, report.failed, report.unreadable), (1, 0, 2));
}

#[test]
fn a_failed_event_stays_open_and_alerts_at_once_until_redriven_or_acknowledged() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut t = task(tmp.path());
    let apply = |t: &mut ReconcileTask, bytes: &[u8]| t.apply(Some(bytes)).expect("applies").expect("valid");
    apply(&mut t, &record("dead", "FAILED", 99_000));
    apply(&mut t, &record("stuck-then-dead", "RECEIVED", 1_000));
    apply(&mut t, &record("acked", "FAILED", 99_000));
    commit(&mut t);
    // Threshold 10 s at clock 100 s: the failed events alert although only 1 s old.
    let step = t.scan_step(100_000, 100).expect("steps");
    let kinds: Vec<(String, Status)> = step
        .stuck
        .iter()
        .map(|(k, o, _)| (String::from_utf8_lossy(k).into_owned(), o.status))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("acked".to_string(), Status::Failed),
            ("dead".to_string(), Status::Failed),
            ("stuck-then-dead".to_string(), Status::Received)
        ]
    );
    let report = step.report.expect("one step");
    assert_eq!((report.open, report.stuck, report.failed), (1, 1, 2));
    commit(&mut t);
    // The stuck event fails: it alerts again, as a failure; a late RECEIVED reopens nothing.
    apply(&mut t, &record("stuck-then-dead", "FAILED", 100_500));
    apply(&mut t, &record("dead", "RECEIVED", 100_600));
    commit(&mut t);
    let step = t.scan_step(101_000, 100).expect("steps");
    assert_eq!(step.stuck.len(), 1, "only the new failure alerts");
    assert_eq!(step.stuck[0].1.status, Status::Failed);
    assert_eq!(step.report.map(|r| (r.open, r.failed)), Some((0, 3)));
    assert_eq!(open(&t, "dead").map(|o| o.status), Some(Status::Failed));
    commit(&mut t);
    // Redriven and acknowledged: COMPLETED with those outcomes closes them.
    let closing = |event: &str, outcome: &str| {
        serde_json::json!({
            "format": FORMAT, "event_id": event, "correlation_id": "c", "node": "app/redrive",
            "status": "COMPLETED", "outcome": outcome, "timestamp_ms": 102_000, "reason": "known bad input",
        })
        .to_string()
        .into_bytes()
    };
    apply(&mut t, &closing("dead", "REDRIVEN"));
    apply(&mut t, &closing("acked", "ACKNOWLEDGED"));
    commit(&mut t);
    let step = t.scan_step(103_000, 100).expect("steps");
    assert_eq!(step.report.map(|r| (r.open, r.failed)), Some((0, 1)));
    assert_eq!(open(&t, "dead"), None);
    assert_eq!(open(&t, "acked"), None);
}

#[test]
fn an_aborted_transaction_forgets_its_open_events() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut t = task(tmp.path());
    t.apply(Some(&record("e1", "RECEIVED", 100)))
        .expect("applies")
        .expect("valid");
    assert!(open(&t, "e1").is_some());
    Task::aborted(&mut t);
    assert_eq!(open(&t, "e1"), None);
    t.write_pending().expect("writes");
    assert!(t.store.take_changes().is_empty());
}
