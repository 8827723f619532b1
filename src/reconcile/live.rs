//! The live reconciler: a task per trace-topic partition keeps the events that are open (a
//! `RECEIVED`/`PROCESSING` record and no `COMPLETED` yet, or a `FAILED` one: a dead letter
//! stays open until it is redriven or acknowledged) in a changelogged store, and every scan
//! interval reports those open longer than the threshold, and failed ones at once: a gauge,
//! an alert record on the alerts topic (once per event) and a log line with the correlation
//! id. Run separately (`tally reconcile live`), each task also watches its share of tally's
//! inputs (`reconcile::watch`).

use crate::engine::emit::{Counts, Emitter, ProcessError};
use crate::engine::errors::EngineError;
use crate::engine::hosted::{HostedTasks, ReconcilerParts};
use crate::engine::producer::TxnProducer;
use crate::engine::task::Task;
use crate::metrics::events::OpenEventsScanned;
use crate::metrics::store_gauges::StoreGauges;
use crate::metrics::Metrics;
use crate::processors::{correlation, Decision, Processed, Reason, Rejection};
use crate::reconcile::watch::Watcher;
use crate::store::{codec, TaskStore};
use crate::topology::ReconcileSettings;
use crate::trace::{Status, FORMAT};
use alerts::AlertWriter;
use rdkafka::message::BorrowedMessage;
use rdkafka::Message;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Most alert records one scan writes, so a flood (a downstream system down for hours) never
/// makes one huge transaction; the rest follow at the next scans.
const ALERTS_PER_SCAN: u64 = 10_000;
/// Store entries one housekeeping tick looks at: a pass over a large store takes several ticks
/// instead of stalling the stream thread (its records wait while a task does periodic work).
const SCAN_BATCH: usize = 20_000;

/// An event seen open on the trace topic, as stored (keyed by event id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenEvent {
    /// `timestamp_ms` of the first open record.
    pub first_seen_ms: i64,
    /// The node that opened it.
    pub node: String,
    /// Its last non-terminal status (`RECEIVED` or `PROCESSING`), or `FAILED`: a failed event
    /// (dead-lettered) stays open until it is redriven or acknowledged.
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

impl TraceIn<'_> {
    /// The record with each text over `correlation::MAX_CARRIED_BYTES` replaced by the id
    /// derived from it. Anyone may write to the trace topic, and the store entry and alert of an
    /// event repeat these texts, so they must fit however long a record's were. Every record
    /// of an event derives the same id from the same long event id, so they still match.
    fn bounded(mut self) -> Self {
        let texts = [Some(&mut self.event_id), Some(&mut self.node)]
            .into_iter()
            .chain([self.idempotency_key.as_mut(), self.correlation_id.as_mut()]);
        for text in texts.flatten() {
            correlation::shorten(text);
        }
        self
    }
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
    /// Failed (dead-lettered) events neither redriven nor acknowledged.
    pub failed: u64,
    /// Entries this version cannot read (written by a newer tally, or damaged): their events
    /// are not judged until a trace record of theirs rewrites them.
    pub unreadable: u64,
}

impl ScanReport {
    /// Takes back the count of an event found closed after the pass counted it.
    fn forget(&mut self, counted_as: &Option<Status>) {
        match counted_as {
            Some(Status::Failed) => self.failed = self.failed.saturating_sub(1),
            _ => {
                self.open = self.open.saturating_sub(1);
                self.stuck = self.stuck.saturating_sub(1);
            }
        }
    }
}

/// The status the committed store holds for an event, if any.
fn committed_status(store: &TaskStore, key: &[u8]) -> Option<Status> {
    let bytes = store.get(0, key).ok()??;
    codec::decode::<OpenEvent>(&bytes).ok().map(|o| o.status)
}

/// A scan pass under way: where it stopped and what it has counted so far.
#[derive(Default)]
struct Pass {
    /// The last key looked at.
    cursor: Option<Vec<u8>>,
    report: ScanReport,
}

/// What one step of a scan pass found.
struct Step {
    /// The pass's report, when the step reached the end of the store.
    report: Option<ScanReport>,
    /// Events that became stuck: key, state (already marked alerted), age.
    stuck: Vec<(Vec<u8>, OpenEvent, i64)>,
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
    /// When the last scan pass ended.
    last_scan: Option<Instant>,
    /// The scan pass under way.
    pass: Option<Pass>,
    /// The newest `timestamp_ms` read from the partition, and when it was read: the clock
    /// events age by (see `clock_ms`).
    stream_time: Option<(i64, Instant)>,
    next_offset: Option<i64>,
    /// This transaction's changes to open events by event id, written to the store at flush:
    /// an event opened and closed within one transaction (the usual case) never reaches the
    /// store or its changelog.
    txn: HashMap<Vec<u8>, Pending>,
    /// The watch of tally's inputs, in the separately run reconciler.
    watcher: Option<Watcher>,
    /// When the watch last failed to reach the cluster (logged once per scan interval).
    watch_failed: Option<Instant>,
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
            trusts_source_headers: false,
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
            pass: None,
            stream_time: None,
            next_offset: None,
            txn: HashMap::new(),
            watcher: None,
            watch_failed: None,
        }
    }

    /// This task, watching tally's inputs too (the separately run reconciler).
    pub fn watching(mut self, watcher: Watcher) -> Self {
        self.watcher = Some(watcher);
        self
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
        if t.status == Status::Completed {
            if stored {
                self.txn.insert(key.to_vec(), Pending { open: None, stored });
            }
            return Ok(Ok(()));
        }
        let open = match current {
            // A failure is reported on its own, whether or not the event was reported stuck.
            Some(mut o) if t.status == Status::Failed && o.status != Status::Failed => {
                o.status = t.status;
                o.node = t.node;
                o.alerted = false;
                o
            }
            Some(mut o) => {
                // A late RECEIVED or PROCESSING does not reopen a failed event.
                if o.status != Status::Failed {
                    o.status = t.status;
                    o.node = t.node;
                }
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
        let Some(bytes) = self.store.get(0, key).map_err(store_failed)? else {
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
                Some(open) => self.store.put(0, &key, codec::encode(&open).map_err(store_failed)?),
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

    /// Works through the next `batch` committed entries of the scan pass under way (starting
    /// one when none is), so a large store never stalls the stream thread: the pass's report
    /// once it has reached the end, and the events that became stuck (open longer than the
    /// threshold at `clock_ms`, see `clock_ms`), marked alerted in this transaction.
    fn scan_step(&mut self, clock_ms: i64, batch: usize) -> Result<Step, ProcessError> {
        let threshold_ms = i64::try_from(self.settings.threshold.as_millis()).unwrap_or(i64::MAX);
        let mut pass = self.pass.take().unwrap_or_default();
        let mut candidates = Vec::new();
        let mut last = None;
        let mut seen = 0;
        for entry in self.store.scan_after(0, pass.cursor.as_deref()).map_err(store_failed)? {
            if seen == batch {
                break;
            }
            let (key, value) = entry.map_err(store_failed)?;
            seen += 1;
            let Ok(open) = codec::decode::<OpenEvent>(&value) else {
                pass.report.unreadable += 1;
                last = Some(key);
                continue;
            };
            let age = clock_ms.saturating_sub(open.first_seen_ms);
            if open.status == Status::Failed {
                pass.report.failed += 1;
                if !open.alerted && pass.report.alerted + (candidates.len() as u64) < ALERTS_PER_SCAN {
                    candidates.push((key.to_vec(), age));
                }
                last = Some(key);
                continue;
            }
            pass.report.open += 1;
            pass.report.oldest_age_ms = pass.report.oldest_age_ms.max(age);
            if age >= threshold_ms {
                pass.report.stuck += 1;
                if !open.alerted && pass.report.alerted + (candidates.len() as u64) < ALERTS_PER_SCAN {
                    candidates.push((key.to_vec(), age));
                }
            }
            last = Some(key);
        }
        let mut stuck = Vec::new();
        for (key, age) in candidates {
            // The scan reads committed entries only: this transaction may have closed the event
            // since, and writing it back would reopen it for good.
            let (Some(mut open), stored) = self.read(&key)? else {
                pass.report.forget(&committed_status(&self.store, &key));
                continue;
            };
            if open.alerted {
                continue;
            }
            open.alerted = true;
            stuck.push((key.clone(), open.clone(), age));
            self.txn.insert(
                key,
                Pending {
                    open: Some(open),
                    stored,
                },
            );
            pass.report.alerted += 1;
        }
        let report = if seen < batch {
            Some(pass.report)
        } else {
            pass.cursor = last.map(|k| k.to_vec());
            self.pass = Some(pass);
            None
        };
        Ok(Step { report, stuck })
    }

    fn alerts(&self) -> AlertWriter<'_> {
        AlertWriter {
            topic: &self.settings.alerts_topic,
            threshold_ms: self.settings.threshold.as_millis() as u64,
            metrics: &self.metrics,
        }
    }

    fn publish(&self, r: &ScanReport) {
        if r.unreadable > 0 {
            tracing::warn!(
                task = %self.label,
                unreadable = r.unreadable,
                "open events in the reconciler store that this version cannot read (a newer tally wrote \
                 them, or they are damaged) are not judged until a trace record of theirs rewrites them; \
                 run the version that wrote them"
            );
        }
        self.metrics.emit(OpenEventsScanned {
            task: &self.label,
            open: r.open,
            stuck: r.stuck,
            oldest_age_ms: r.oldest_age_ms,
            failed: r.failed,
            unreadable: r.unreadable,
        });
    }
}

/// Parses a trace record: `Ok(None)` for formats this version does not know (other writers'
/// business: skipped, not errors), `Err` for records that are not trace records at all.
fn parse(payload: Option<&[u8]>) -> Result<Option<TraceIn<'_>>, Rejection> {
    let bytes = payload.ok_or_else(|| Rejection::new(Reason::InvalidJson, "trace record without a value"))?;
    // One pass for the usual record; only one that does not fit is looked at again, to tell
    // another format (skipped) from a broken record of ours (dead-lettered).
    let typed_error = match serde_json::from_slice::<TraceIn>(bytes) {
        Ok(t) => return Ok((t.format == FORMAT).then(|| t.bounded())),
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

/// A failure of the reconciler's store or of encoding its records: the generation ends (a full
/// filesystem stops the instance).
pub(super) fn store_failed(e: impl Into<anyhow::Error>) -> ProcessError {
    ProcessError::Engine(EngineError::from_any(e.into(), "live reconciler store"))
}

impl Task for ReconcileTask {
    fn process(&mut self, msg: &BorrowedMessage<'_>, producer: &mut TxnProducer) -> Result<(), ProcessError> {
        if let Err(rejection) = self.apply(msg.payload())? {
            return self.reject(msg, producer, rejection);
        }
        self.next_offset = Some(msg.offset() + 1);
        Ok(())
    }

    fn reject(
        &mut self,
        msg: &BorrowedMessage<'_>,
        producer: &mut TxnProducer,
        rejection: Rejection,
    ) -> Result<(), ProcessError> {
        let processed = Processed {
            decision: Decision::Reject(rejection),
            correlation_id: crate::engine::headers::text(msg, "correlation_id")
                .unwrap_or_default()
                .to_string(),
        };
        let place = crate::engine::emit::SourcePlace::of(msg, false);
        self.emit.dead_letter(producer, msg, &place, &processed)?;
        self.next_offset = Some(msg.offset() + 1);
        Ok(())
    }

    fn flush(&mut self, producer: &mut TxnProducer) -> Result<(), ProcessError> {
        self.write_pending()?;
        self.emit.changes(producer, &self.changelogs, self.store.unlogged())
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
        self.store
            .commit(&offsets)
            .map_err(|e| crate::engine::task::store_failure(e, "store write after a committed transaction"))?;
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
        // A pass under way goes on at every tick; the next starts a scan interval after the last ended.
        if self.pass.is_none()
            && self
                .last_scan
                .is_some_and(|s| s.elapsed() < self.settings.scan_interval)
        {
            return Ok(false);
        }
        let mut wrote = false;
        if self.pass.is_none() {
            wrote = self.watch(now_ms, producer)?;
        }
        let step = self.scan_step(self.clock_ms(now_ms), SCAN_BATCH)?;
        let writer = self.alerts();
        for (key, open, age) in &step.stuck {
            writer.stuck(key, open, *age, now_ms, producer)?;
        }
        if let Some(report) = step.report {
            self.publish(&report);
            self.last_scan = Some(Instant::now());
        }
        Ok(wrote || !step.stuck.is_empty())
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
        let _ = m.reconcile_unconsumed_records.remove_label_values(&l);
        let _ = m.reconcile_failed_events.remove_label_values(&l);
        let _ = m.reconcile_unreadable_events.remove_label_values(&l);
        let _ = m.reconcile_longest_wait_seconds.remove_label_values(&l);
    }
}

/// Opens reconciler tasks for the engine (see `engine::hosted`).
pub struct LiveReconciler;

impl HostedTasks for LiveReconciler {
    fn reconciler(&self, parts: ReconcilerParts) -> Result<Box<dyn Task>, EngineError> {
        let t = &parts.topology;
        let settings = t.reconcile.clone().ok_or_else(|| {
            EngineError::Internal(anyhow::anyhow!(
                "no reconciler settings for trace topic `{}`",
                parts.topic
            ))
        })?;
        let watcher = settings
            .watch
            .clone()
            .map(|w| Watcher::new(t, w, settings.threshold, parts.partition, parts.topic.clone()));
        let task = ReconcileTask::new(
            parts.name,
            parts.partition,
            settings,
            parts.store,
            parts.changelogs,
            t.dead_letter_topic.clone(),
            parts.metrics,
        );
        Ok(Box::new(match watcher {
            Some(w) => task.watching(w),
            None => task,
        }))
    }
}

mod alerts;
#[cfg(test)]
mod tests;
mod watching;
