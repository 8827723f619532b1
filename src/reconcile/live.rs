//! The live reconciler: a task per trace-topic partition keeps the events that are open (a
//! `RECEIVED`/`PROCESSING` record and no `COMPLETED`/`FAILED` yet) in a changelogged store, and
//! every scan interval reports those open longer than the threshold: a gauge, an alert record
//! on the alerts topic (once per event) and a log line with the correlation id.

use crate::engine::emit::{header, Counts, Emitter, ProcessError};
use crate::engine::errors::EngineError;
use crate::engine::producer::{Outgoing, TxnProducer};
use crate::engine::task::Task;
use crate::metrics::store_gauges::StoreGauges;
use crate::metrics::Metrics;
use crate::processors::{Decision, Processed, Reason, Rejection};
use crate::store::{codec, TaskStore};
use crate::topology::ReconcileSettings;
use crate::trace::{Status, FORMAT};
use rdkafka::message::{BorrowedMessage, OwnedHeaders};
use rdkafka::Message;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Format tag of alert records.
pub const ALERT_FORMAT: &str = "tally.alert/v1";

/// An event seen open on the trace topic, as stored (keyed by event id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenEvent {
    /// `timestamp_ms` of the first open record.
    pub first_seen_ms: i64,
    /// The node that opened it.
    pub node: String,
    /// Its last non-terminal status (`RECEIVED` or `PROCESSING`).
    pub status: Status,
    /// The business idempotency key, when the writer knew it.
    pub idempotency_key: Option<String>,
    /// The correlation id.
    pub correlation_id: String,
    /// True once an alert record was written for it.
    pub alerted: bool,
}

/// The fields of a trace record the reconciler reads.
#[derive(Debug, Deserialize)]
struct TraceIn<'a> {
    #[serde(borrow)]
    format: Cow<'a, str>,
    event_id: String,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    correlation_id: Option<String>,
    node: String,
    status: Status,
    timestamp_ms: i64,
}

/// The alert record written for a stuck event.
#[derive(Debug, Serialize)]
struct Alert<'a> {
    format: &'static str,
    kind: &'static str,
    event_id: &'a str,
    idempotency_key: Option<&'a str>,
    correlation_id: &'a str,
    node: &'a str,
    status: Status,
    first_seen_ms: i64,
    age_ms: i64,
    threshold_ms: u64,
    detected_ms: i64,
}

/// What one scan found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScanReport {
    /// Events open.
    pub open: u64,
    /// Events open longer than the threshold.
    pub stuck: u64,
    /// Age of the oldest open event, ms.
    pub oldest_age_ms: i64,
    /// Alert records written by this scan.
    pub alerted: u64,
}

/// One trace-topic partition's open events.
pub struct ReconcileTask {
    /// `reconcile-<partition>`, the `task` label of the gauges.
    label: String,
    store_gauges: StoreGauges,
    settings: ReconcileSettings,
    store: TaskStore,
    changelogs: Vec<String>,
    emit: Emitter,
    metrics: Arc<Metrics>,
    last_scan: Option<Instant>,
    /// The newest `timestamp_ms` read from the partition, and when it was read: the clock
    /// events age by (see `clock_ms`).
    stream_time: Option<(i64, Instant)>,
    next_offset: Option<i64>,
    /// This transaction's changes to open events by event id, written to the store at flush:
    /// an event opened and closed within one transaction (the usual case) never reaches the
    /// store or its changelog.
    txn: HashMap<Vec<u8>, Pending>,
}

/// An open event's state at the end of the transaction so far.
struct Pending {
    /// `None`: closed.
    open: Option<OpenEvent>,
    /// The store holds a committed entry for the event (closing it needs a tombstone).
    stored: bool,
}

impl ReconcileTask {
    /// The reconciler task of trace partition `partition`, with its restored store.
    pub fn new(
        name: String,
        partition: i32,
        settings: ReconcileSettings,
        store: TaskStore,
        changelogs: Vec<String>,
        dead_letter_topic: String,
        metrics: Arc<Metrics>,
    ) -> Self {
        let emit = Emitter {
            partition,
            output_topic: settings.alerts_topic.clone(),
            dead_letter_topic,
            mappings_topic: None,
            trace: None,
            correlation_header: "correlation_id".into(),
            counts: Counts::default(),
        };
        Self {
            store_gauges: StoreGauges::new(&metrics, name.clone()),
            label: name,
            settings,
            store,
            changelogs,
            emit,
            metrics,
            last_scan: None,
            stream_time: None,
            next_offset: None,
            txn: HashMap::new(),
        }
    }

    /// Applies one trace record to the open events; `Ok(Err)` holds why it is unreadable.
    fn apply(&mut self, payload: Option<&[u8]>) -> Result<Result<(), Rejection>, ProcessError> {
        let t = match parse(payload) {
            Ok(Some(t)) => t,
            Ok(None) => return Ok(Ok(())),
            Err(r) => return Ok(Err(r)),
        };
        let newest = self
            .stream_time
            .map_or(t.timestamp_ms, |(st, _)| st.max(t.timestamp_ms));
        self.stream_time = Some((newest, Instant::now()));
        let key = t.event_id.as_bytes();
        let (current, stored) = match self.txn.remove(key) {
            Some(p) => (p.open, p.stored),
            None => self.stored_entry(key)?,
        };
        if t.status.is_terminal() {
            if stored {
                self.txn.insert(key.to_vec(), Pending { open: None, stored });
            }
            return Ok(Ok(()));
        }
        let open = match current {
            Some(mut o) => {
                o.status = t.status;
                o.node = t.node;
                o
            }
            None => OpenEvent {
                first_seen_ms: t.timestamp_ms,
                node: t.node,
                status: t.status,
                idempotency_key: t.idempotency_key,
                correlation_id: t.correlation_id.unwrap_or_default(),
                alerted: false,
            },
        };
        self.txn.insert(
            t.event_id.into_bytes(),
            Pending {
                open: Some(open),
                stored,
            },
        );
        Ok(Ok(()))
    }

    /// The committed entry of an event, and whether there is one (readable or not).
    fn stored_entry(&self, key: &[u8]) -> Result<(Option<OpenEvent>, bool), ProcessError> {
        let Some(bytes) = self.store.get(0, key).map_err(fatal)? else {
            return Ok((None, false));
        };
        match codec::decode(&bytes) {
            Ok(open) => Ok((Some(open), true)),
            Err(e) => {
                // Written by a newer format: the next record for the event rewrites it.
                tracing::warn!(error = %e, "unreadable open event in the reconciler store; treating it as absent");
                Ok((None, true))
            }
        }
    }

    /// An event as this transaction sees it.
    fn read(&self, key: &[u8]) -> Result<(Option<OpenEvent>, bool), ProcessError> {
        match self.txn.get(key) {
            Some(p) => Ok((p.open.clone(), p.stored)),
            None => self.stored_entry(key),
        }
    }

    /// Writes this transaction's changes to the store and queues them for the changelog.
    fn write_pending(&mut self) -> Result<(), ProcessError> {
        for (key, p) in std::mem::take(&mut self.txn) {
            match p.open {
                Some(open) => self.store.put(0, &key, codec::encode(&open).map_err(fatal)?),
                None if p.stored => self.store.delete(0, &key),
                None => {}
            }
        }
        Ok(())
    }

    /// The time open events age by: the partition's stream time plus the wall time since it
    /// was last read. A reconciler catching up on a backlog reads completions that were
    /// written long ago; judging their opening records by the wall clock would report events
    /// that finished in time. When the partition is idle this runs with the wall clock.
    fn clock_ms(&self, now_ms: i64) -> i64 {
        match self.stream_time {
            Some((st, read_at)) => st.saturating_add(read_at.elapsed().as_millis() as i64).min(now_ms),
            None => now_ms,
        }
    }

    /// Reports the events open longer than the threshold at `clock_ms` (see `clock_ms`),
    /// alerting once per event; `now_ms` stamps the alerts.
    pub fn scan(&mut self, clock_ms: i64, now_ms: i64, producer: &mut TxnProducer) -> Result<ScanReport, ProcessError> {
        let threshold_ms = self.settings.threshold.as_millis() as i64;
        let mut report = ScanReport::default();
        let mut to_alert = Vec::new();
        for entry in self.store.scan(0).map_err(fatal)? {
            let (key, value) = entry.map_err(fatal)?;
            let Ok(open) = codec::decode::<OpenEvent>(&value) else {
                continue;
            };
            let age = clock_ms.saturating_sub(open.first_seen_ms);
            report.open += 1;
            report.oldest_age_ms = report.oldest_age_ms.max(age);
            if age >= threshold_ms {
                report.stuck += 1;
                if !open.alerted {
                    to_alert.push((key, age));
                }
            }
        }
        for (key, age) in to_alert {
            // The scan reads committed entries only: this transaction may have closed the event
            // since, and writing it back would reopen it for good.
            let (Some(mut open), stored) = self.read(&key)? else {
                report.open -= 1;
                report.stuck -= 1;
                continue;
            };
            if open.alerted {
                continue;
            }
            let event_id = String::from_utf8_lossy(&key);
            let alert = Alert {
                format: ALERT_FORMAT,
                kind: "stuck_event",
                event_id: &event_id,
                idempotency_key: open.idempotency_key.as_deref(),
                correlation_id: &open.correlation_id,
                node: &open.node,
                status: open.status,
                first_seen_ms: open.first_seen_ms,
                age_ms: age,
                threshold_ms: threshold_ms as u64,
                detected_ms: now_ms,
            };
            let payload = serde_json::to_vec(&alert).map_err(|e| fatal(anyhow::Error::new(e)))?;
            let out = Outgoing {
                topic: &self.settings.alerts_topic,
                partition: None,
                key: Some(&key),
                payload: Some(&payload),
                headers: OwnedHeaders::new().insert(header("correlation_id", &open.correlation_id)),
            };
            producer.send(out).map_err(ProcessError::Kafka)?;
            tracing::info_span!("event", correlation_id = %open.correlation_id, idempotency_key = open.idempotency_key.as_deref())
                .in_scope(|| {
                    tracing::warn!(
                        event_id = %event_id,
                        node = %open.node,
                        age_s = age / 1000,
                        "event received but not completed after the threshold"
                    )
                });
            open.alerted = true;
            self.txn.insert(
                key.to_vec(),
                Pending {
                    open: Some(open),
                    stored,
                },
            );
            report.alerted += 1;
        }
        Ok(report)
    }

    fn publish(&self, r: &ScanReport) {
        let m = &self.metrics;
        let l = [self.label.as_str()];
        m.reconcile_open_events.with_label_values(&l).set(r.open as i64);
        m.reconcile_stuck_events.with_label_values(&l).set(r.stuck as i64);
        m.reconcile_oldest_open_age_seconds
            .with_label_values(&l)
            .set(r.oldest_age_ms as f64 / 1000.0);
        m.reconcile_alerts.inc_by(r.alerted);
    }
}

/// Parses a trace record: `Ok(None)` for formats this version does not know (other writers'
/// business: skipped, not errors), `Err` for records that are not trace records at all.
fn parse(payload: Option<&[u8]>) -> Result<Option<TraceIn<'_>>, Rejection> {
    let bytes = payload.ok_or_else(|| Rejection::new(Reason::InvalidJson, "trace record without a value"))?;
    // One pass for the usual record; only one that does not fit is looked at again, to tell
    // another format (skipped) from a broken record of ours (dead-lettered).
    let typed_error = match serde_json::from_slice::<TraceIn>(bytes) {
        Ok(t) => return Ok((t.format == FORMAT).then_some(t)),
        Err(e) => e,
    };
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| Rejection::new(Reason::InvalidJson, format!("trace record is not JSON: {e}")))?;
    if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
        return Ok(None);
    }
    Err(Rejection::new(
        Reason::MissingKeyField,
        format!("not a {FORMAT} record: {typed_error}"),
    ))
}

fn fatal(e: impl Into<anyhow::Error>) -> ProcessError {
    ProcessError::Engine(EngineError::Fatal(e.into().context("live reconciler store")))
}

impl Task for ReconcileTask {
    fn process(&mut self, msg: &BorrowedMessage<'_>, producer: &mut TxnProducer) -> Result<(), ProcessError> {
        if let Err(rejection) = self.apply(msg.payload())? {
            let processed = Processed {
                decision: Decision::Reject(rejection),
                correlation_id: crate::engine::emit::header_text(msg, "correlation_id")
                    .unwrap_or_default()
                    .to_string(),
            };
            let place = crate::engine::emit::SourcePlace::of(msg);
            self.emit.dead_letter(producer, msg, &place, &processed)?;
        }
        self.next_offset = Some(msg.offset() + 1);
        Ok(())
    }

    fn flush(&mut self, producer: &mut TxnProducer) -> Result<(), ProcessError> {
        self.write_pending()?;
        self.emit.changes(producer, &self.changelogs, self.store.take_changes())
    }

    fn next_offset(&self) -> Option<i64> {
        self.next_offset
    }

    fn committed(&mut self, delivered: &HashMap<(String, i32), i64>) -> Result<Counts, EngineError> {
        let offsets: Vec<(usize, i64)> = self
            .changelogs
            .iter()
            .enumerate()
            .filter_map(|(i, t)| delivered.get(&(t.clone(), self.emit.partition)).map(|&o| (i, o)))
            .collect();
        self.store.commit(&offsets).map_err(|e| {
            EngineError::Fatal(anyhow::Error::new(e).context("store write after a committed transaction"))
        })?;
        self.next_offset = None;
        // Dead letters count under the reconciler's label; trace records are not business input.
        Ok(std::mem::take(&mut self.emit.counts))
    }

    fn aborted(&mut self) {
        self.txn.clear();
        self.store.abort();
        self.next_offset = None;
        self.emit.counts = Counts::default();
    }

    fn tick(&mut self, now_ms: i64, producer: &mut TxnProducer) -> Result<bool, ProcessError> {
        if self
            .last_scan
            .is_some_and(|s| s.elapsed() < self.settings.scan_interval)
        {
            return Ok(false);
        }
        self.last_scan = Some(Instant::now());
        let report = self.scan(self.clock_ms(now_ms), now_ms, producer)?;
        self.publish(&report);
        Ok(report.alerted > 0)
    }

    fn report_stores(&mut self, _metrics: &Metrics) {
        if !self.store_gauges.due() {
            return;
        }
        match self.store.sizes() {
            Ok(sizes) => self.store_gauges.set(&sizes),
            Err(e) => tracing::warn!(task = %self.label, error = %e, "cannot read store sizes for metrics"),
        }
    }

    fn label(&self) -> &str {
        "reconcile"
    }
}

impl Drop for ReconcileTask {
    fn drop(&mut self) {
        // The task moved away: its numbers are another instance's to report now.
        let l = [self.label.as_str()];
        let m = &self.metrics;
        let _ = m.reconcile_open_events.remove_label_values(&l);
        let _ = m.reconcile_stuck_events.remove_label_values(&l);
        let _ = m.reconcile_oldest_open_age_seconds.remove_label_values(&l);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreEnv;
    use std::time::Duration;

    fn task(dir: &std::path::Path) -> ReconcileTask {
        let store = TaskStore::open(dir, &["reconcile-open".into()], &StoreEnv::default()).expect("opens");
        let settings = ReconcileSettings {
            alerts_topic: "alerts".into(),
            scan_interval: Duration::from_secs(1),
            threshold: Duration::from_secs(10),
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
        assert_eq!(apply(&mut t, &record("e2", "FAILED", 300)), Some(true));
        assert_eq!(open(&t, "e2"), None, "a terminal record alone opens nothing");
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
}
