//! A task: one partition of a consumed topic and the work done on it inside the stream
//! thread's transaction; here the pipeline task (a pipeline stage and its stores).

use super::emit::{header, now_ms, Counts, Emitter, ProcessError, SourcePlace};
use super::errors::EngineError;
use super::faults::{self, Point};
use super::headers;
use super::producer::{Outgoing, TxnProducer};
use crate::metrics::store_gauges::StoreGauges;
use crate::metrics::Metrics;
use crate::processors::dedup;
use crate::processors::state::StateError;
use crate::processors::{Input, PipelineProcessor, Reason, Rejection};
use crate::store::{StoreError, TaskStore};
use crate::topology::StoreKind;
use crate::trace::{Level, Outcome, Status, TraceSink};
use crate::wire::{SOURCE_HEADER, SOURCE_KEY_HEADER};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::Message;
use std::cell::OnceCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Dedup entries one housekeeping tick looks at for expiry: a pass over a large store takes
/// several ticks, and its deletes spread over as many transactions.
const EXPIRY_BATCH: usize = 10_000;

/// What a stream thread drives for one partition, all inside its open transaction.
pub trait Task: Send {
    /// Runs one consumed record.
    fn process(&mut self, msg: &BorrowedMessage<'_>, producer: &mut TxnProducer) -> Result<(), ProcessError>;
    /// Dead-letters a consumed record without running it (a record whose output cannot be
    /// written), counting it and moving the task's position past it.
    fn reject(
        &mut self,
        msg: &BorrowedMessage<'_>,
        producer: &mut TxnProducer,
        rejection: Rejection,
    ) -> Result<(), ProcessError>;
    /// Before the commit: writes what the task held back during the transaction.
    fn flush(&mut self, _producer: &mut TxnProducer) -> Result<(), ProcessError> {
        Ok(())
    }
    /// The offset to commit for this partition, when records were consumed in this transaction.
    fn next_offset(&self) -> Option<i64>;
    /// True for tasks reading a repartition topic (whose consumed records may be purged).
    fn reads_repartition_topic(&self) -> bool {
        false
    }
    /// After the Kafka commit: makes the stores durable and hands back the transaction's counts.
    fn committed(&mut self, delivered: &HashMap<(String, i32), i64>) -> Result<Counts, EngineError>;
    /// After an abort: forgets the transaction's writes, position and counts.
    fn aborted(&mut self);
    /// Periodic work when due (expiry, reconciliation scans); true when it wrote records.
    fn tick(&mut self, now_ms: i64, producer: &mut TxnProducer) -> Result<bool, ProcessError>;
    /// The `pipeline` label of the task's counts.
    fn label(&self) -> &str;
    /// Publishes the sizes of the task's stores unless they were read seconds ago; tasks
    /// without stores publish nothing.
    fn report_stores(&mut self, _metrics: &Metrics) {}
}

/// What a task does with its records.
pub enum Work {
    /// Re-key (by the pipeline's repartition template) and forward to the repartition topic
    /// (stateless).
    Repartition {
        /// The repartition topic.
        topic: String,
    },
    /// Run the strategies against the task's stores.
    Process {
        /// The task's stores (boxed: far larger than the other variant).
        store: Box<TaskStore>,
        /// `changelogs[i]` is the changelog topic of store `i`.
        changelogs: Vec<String>,
        /// True when the records come from a repartition topic (already counted as input).
        repartitioned: bool,
    },
}

/// Where a task writes besides its output.
pub struct Sinks {
    /// The dead-letter topic.
    pub dead_letter: String,
    /// The ID-mapping topic (pending-create markers), when configured.
    pub mappings: Option<String>,
    /// The trace topic and level, when tracing.
    pub trace: Option<(String, Level)>,
}

/// One partition of a consumed topic with its pipeline stage.
pub struct PipelineTask {
    processor: PipelineProcessor,
    work: Work,
    emit: Emitter,
    next_offset: Option<i64>,
    expiry_every: Duration,
    /// When the last expiry pass ended.
    last_expiry: Instant,
    /// Where the expiry pass under way resumes; `None` when no pass is under way.
    expiry_cursor: Option<Vec<u8>>,
    /// Size gauges of the stores, created on the first report and removed with the task.
    store_gauges: Option<StoreGauges>,
    /// True when the store was rebuilt from its changelog because a value could not be read:
    /// a value still unreadable came from the changelog, and costs its records a dead letter.
    changelog_may_hold_unreadable: bool,
}

impl PipelineTask {
    /// A task for `partition` of `application_id`'s pipeline, doing `work`, deleting expired
    /// keys every `expiry_every`; `rebuilt` when its store was rebuilt from the changelog for
    /// an unreadable value.
    pub fn new(
        application_id: &str,
        partition: i32,
        processor: PipelineProcessor,
        mut work: Work,
        sinks: Sinks,
        expiry_every: Duration,
        rebuilt: bool,
    ) -> Self {
        let pipeline = processor.pipeline();
        // Restored and about to process: its committed data may answer queries from now until
        // the task (and so its store) is dropped.
        if let Work::Process { store, .. } = &mut work {
            store.publish(&pipeline.name, partition);
        }
        let node = match work {
            Work::Repartition { .. } => format!("{application_id}/{}/repartition", pipeline.name),
            Work::Process { .. } => format!("{application_id}/{}", pipeline.name),
        };
        let emit = Emitter {
            partition,
            output_topic: pipeline.output.topic.clone(),
            dead_letter_topic: sinks.dead_letter,
            mappings_topic: sinks.mappings,
            trace: sinks.trace.map(|(topic, level)| TraceSink { topic, level, node }),
            correlation_header: pipeline.correlation_header().to_string(),
            trusts_source_headers: matches!(
                work,
                Work::Process {
                    repartitioned: true,
                    ..
                }
            ),
            counts: Counts::default(),
        };
        Self {
            processor,
            work,
            emit,
            next_offset: None,
            expiry_every,
            last_expiry: Instant::now(),
            expiry_cursor: None,
            store_gauges: None,
            changelog_may_hold_unreadable: rebuilt,
        }
    }

    /// Runs the next step of the expiry pass under way (or starts one) in the open transaction:
    /// looks at up to `batch` dedup entries and deletes the expired ones whose key is at most
    /// `max_key_bytes` long (the tombstone must be written); returns how many.
    pub fn expire(&mut self, now_ms: i64, batch: usize, max_key_bytes: usize) -> Result<usize, ProcessError> {
        let Work::Process { store, .. } = &mut self.work else {
            return Ok(0);
        };
        let pipeline = self.processor.pipeline();
        let dedup_index = pipeline.store_kinds().iter().position(|k| *k == StoreKind::Dedup);
        let (Some(retention), Some(index)) = (pipeline.max_retention(), dedup_index) else {
            return Ok(0);
        };
        let cursor = self.expiry_cursor.as_deref();
        let step = dedup::expire(store, index, now_ms, retention, cursor, batch, max_key_bytes)
            .map_err(|e| ProcessError::Engine(state_failure(store.dir(), e)))?;
        self.emit.counts.expired += step.deleted as u64;
        if step.unreadable > 0 {
            tracing::warn!(
                task = %pipeline.task_name(self.emit.partition),
                entries = step.unreadable,
                "dedup entries whose value cannot be read are kept by expiry; a record meeting one is dead-lettered"
            );
        }
        if step.unwritable > 0 {
            tracing::warn!(
                task = %pipeline.task_name(self.emit.partition),
                entries = step.unwritable,
                "expired dedup entries are kept: their keys are too long for a changelog tombstone \
                 (tally writes no such key; were they written to the changelog by another producer?)"
            );
        }
        if step.clamped > 0 {
            tracing::warn!(
                task = %pipeline.task_name(self.emit.partition),
                entries = step.clamped,
                "dedup entries first seen more than a minute ahead of this instance's clock are taken as \
                 first seen now (an instance's clock ran ahead); check the clocks of the instances"
            );
        }
        self.expiry_cursor = step.resume_after;
        if self.expiry_cursor.is_none() {
            self.last_expiry = Instant::now();
        }
        Ok(step.deleted)
    }
}

impl Task for PipelineTask {
    fn label(&self) -> &str {
        &self.processor.pipeline().name
    }

    fn report_stores(&mut self, metrics: &Metrics) {
        let Work::Process { store, .. } = &self.work else {
            return;
        };
        let task = self.processor.pipeline().task_name(self.emit.partition);
        let gauges = self
            .store_gauges
            .get_or_insert_with(|| StoreGauges::new(metrics, task.clone()));
        if !gauges.due() {
            return;
        }
        match store.sizes() {
            Ok(sizes) => gauges.set(&sizes),
            Err(e) => tracing::warn!(task = %task, error = %e, "cannot read store sizes for metrics"),
        }
    }

    /// Sends any store change not yet on its way to the changelog, so the commit that follows
    /// never meets an unlogged write, whichever path made it.
    fn flush(&mut self, producer: &mut TxnProducer) -> Result<(), ProcessError> {
        if let Work::Process { store, changelogs, .. } = &mut self.work {
            self.emit.changes(producer, changelogs, store.unlogged())?;
        }
        Ok(())
    }

    fn next_offset(&self) -> Option<i64> {
        self.next_offset
    }

    fn reads_repartition_topic(&self) -> bool {
        matches!(
            self.work,
            Work::Process {
                repartitioned: true,
                ..
            }
        )
    }

    /// Runs one record, producing its output, forward or dead letter, changelog and trace
    /// records into the open transaction.
    fn process(&mut self, msg: &BorrowedMessage<'_>, producer: &mut TxnProducer) -> Result<(), ProcessError> {
        let input = input_of(msg, &self.emit.correlation_header);
        let emit = &mut self.emit;
        match &mut self.work {
            Work::Repartition { topic } => {
                emit.counts.records_in += 1;
                // Correlation ids are only worked out when a trace record needs them.
                let traced = emit.trace.is_some();
                let rekeyed = self.processor.rekey(&input, traced);
                let corr = match &rekeyed {
                    Ok(r) => r.correlation_id.as_deref().unwrap_or_default(),
                    Err(rejected) => &rejected.correlation_id,
                };
                // Also the `tally.source` header of the record sent on.
                let event_id = SourcePlace::own_event_id(msg);
                emit.trace(producer, &event_id, None, corr, Status::Received, None)?;
                match &rekeyed {
                    Ok(r) => {
                        // The stateful stage reports dead letters and traces with the source's place.
                        let out = Outgoing {
                            topic,
                            partition: None,
                            key: Some(r.key.as_bytes()),
                            payload: msg.payload(),
                            headers: Some(headers::add(
                                headers::copy_except(msg, "").insert(header(SOURCE_HEADER, &event_id)),
                                SOURCE_KEY_HEADER.as_bytes(),
                                msg.key(),
                            )),
                        };
                        producer.send(out).map_err(ProcessError::Kafka)?;
                        emit.counts.repartitioned += 1;
                    }
                    Err(rejected) => {
                        emit.dead_letter(producer, msg, &SourcePlace::of(msg, false), rejected)?;
                        emit.trace(
                            producer,
                            &event_id,
                            None,
                            corr,
                            Status::Failed,
                            Some(Outcome::DeadLetter),
                        )?;
                    }
                }
            }
            Work::Process {
                store, repartitioned, ..
            } => {
                if !*repartitioned {
                    emit.counts.records_in += 1;
                }
                let processed = match self.processor.process(&input, store) {
                    Ok(processed) => processed,
                    Err(e) => match unreadable(&e, self.changelog_may_hold_unreadable) {
                        // Strategies read before they write: the record left no state behind.
                        Some(rejection) => self.processor.refuse(&input, rejection),
                        None => return Err(ProcessError::Engine(state_failure(store.dir(), e))),
                    },
                };
                emit.counts.misplaced += self.processor.take_misplaced();
                // The source's place (headers after a repartition) is read once, and only when a
                // trace record or a dead letter needs it.
                let place = OnceCell::new();
                if emit.trace.as_ref().is_some_and(|t| t.level == Level::All) {
                    let event_id = place.get_or_init(|| SourcePlace::of(msg, *repartitioned)).event_id();
                    let key = processed.decision.idempotency_key();
                    let corr = &processed.correlation_id;
                    if !*repartitioned {
                        emit.trace(producer, &event_id, key, corr, Status::Received, None)?;
                    }
                    emit.trace(producer, &event_id, key, corr, Status::Processing, None)?;
                }
                // The changelog gets each key's last write at the commit; a write that could
                // never be sent there is refused now, with the record that made it.
                if !producer.fits_bytes(store.take_largest_put()) {
                    return Err(ProcessError::Kafka(KafkaError::MessageProduction(
                        RDKafkaErrorCode::MessageSizeTooLarge,
                    )));
                }
                if faults::hit(Point::RecordFailsMidway) {
                    return Err(ProcessError::Engine(EngineError::Transient(anyhow::anyhow!(
                        "injected fault: record fails after its store writes"
                    ))));
                }
                emit.decision(producer, msg, &place, &processed, input.now_ms)?;
            }
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
        let input = input_of(msg, &self.emit.correlation_header);
        let repartitioned = self.reads_repartition_topic();
        if !repartitioned {
            self.emit.counts.records_in += 1;
        }
        let processed = self.processor.refuse(&input, rejection);
        let place = SourcePlace::of(msg, repartitioned);
        self.emit.dead_letter(producer, msg, &place, &processed)?;
        if self.emit.trace.is_some() {
            let corr = &processed.correlation_id;
            let event_id = place.event_id();
            if !repartitioned {
                self.emit
                    .trace(producer, &event_id, None, corr, Status::Received, None)?;
            }
            self.emit.trace(
                producer,
                &event_id,
                None,
                corr,
                Status::Failed,
                Some(Outcome::DeadLetter),
            )?;
        }
        self.next_offset = Some(msg.offset() + 1);
        Ok(())
    }

    /// After the Kafka commit: applies the overlay with the delivered changelog offsets and
    /// hands back the transaction's counts.
    fn committed(&mut self, delivered: &HashMap<(String, i32), i64>) -> Result<Counts, EngineError> {
        if let Work::Process { store, changelogs, .. } = &mut self.work {
            let partition = self.emit.partition;
            let offsets: Vec<(usize, i64)> = changelogs
                .iter()
                .enumerate()
                .filter_map(|(i, topic)| delivered.get(&(topic.clone(), partition)).map(|&o| (i, o)))
                .collect();
            store
                .commit(&offsets)
                .map_err(|e| store_failure(e, "store write after a committed transaction"))?;
        }
        self.next_offset = None;
        Ok(std::mem::take(&mut self.emit.counts))
    }

    /// Deletes expired dedup keys inside the transaction: a pass under way goes on at every
    /// tick; the next starts an expiry interval after the last ended.
    fn tick(&mut self, now_ms: i64, producer: &mut TxnProducer) -> Result<bool, ProcessError> {
        if self.expiry_cursor.is_none() && self.last_expiry.elapsed() < self.expiry_every {
            return Ok(false);
        }
        let n = self.expire(now_ms, EXPIRY_BATCH, producer.largest_bytes())?;
        if n > 0 {
            tracing::debug!(expired = n, pipeline = self.label(), "expired dedup keys deleted");
        }
        Ok(n > 0)
    }

    /// After an abort: forgets the transaction's writes, position and counts.
    fn aborted(&mut self) {
        if let Work::Process { store, .. } = &mut self.work {
            store.abort();
        }
        self.next_offset = None;
        self.emit.counts = Counts::default();
    }
}

/// What the processor is told about a consumed record.
fn input_of<'a>(msg: &'a BorrowedMessage<'_>, correlation_header: &str) -> Input<'a> {
    Input {
        payload: msg.payload(),
        correlation_header: headers::text(msg, correlation_header),
        coordinates: (msg.topic(), msg.partition(), msg.offset()),
        now_ms: now_ms(),
    }
}

/// The dead-letter reason for a record whose state cannot be decoded, when that is what `e`
/// says and a rebuild would not help: the value is in the task's changelog (the store was
/// already rebuilt from it, `changelog_may_hold_it`), or in the ID-mapping store, which is
/// rebuilt from its topic only at a start. `None` leaves `e` to [`state_failure`].
fn unreadable(e: &StateError, changelog_may_hold_it: bool) -> Option<Rejection> {
    let detail = match e {
        StateError::Codec { store, key, source } if changelog_may_hold_it => format!(
            "the state of `{key}` in store `{store}` cannot be read ({source}) and came back from the changelog \
             when the store was rebuilt: remove it with `tally reset <topology> --pipeline <pipeline> --key <key> \
             --execute`, or run the tally version that wrote it, then replay this record"
        ),
        StateError::Store(StoreError::CorruptValue { path, key, source }) => format!(
            "the ID mapping of `{key}` cannot be read ({source}): stop tally, remove {} so that it is rebuilt \
             from the ID-mapping topic at the next start, then replay this record",
            path.display()
        ),
        _ => return None,
    };
    Some(Rejection::new(Reason::UnreadableState, detail))
}

/// The domain of a strategy's failure to read or write the state of the task in `dir`: an
/// unreadable value makes the task rebuild its store from the changelog (local damage is
/// repaired; a value the changelog holds is dead-lettered from then on, see [`unreadable`]).
fn state_failure(dir: &std::path::Path, e: StateError) -> EngineError {
    match e {
        StateError::Codec { .. } => EngineError::Corrupt {
            dir: dir.to_path_buf(),
            source: e.into(),
        },
        StateError::MissingStore(_) => EngineError::Internal(e.into()),
        StateError::Store(e) => store_failure(e, "reading the task's state"),
    }
}

/// The domain of a store failure: writes never logged are a bug, a database RocksDB finds
/// damaged is rebuilt from its changelog, the rest is RocksDB's or the filesystem's (a full
/// one stops the instance).
pub fn store_failure(e: StoreError, during: &str) -> EngineError {
    if let Some(dir) = e.damaged_database() {
        return EngineError::Corrupt {
            dir: dir.to_path_buf(),
            source: anyhow::Error::new(e).context(during.to_string()),
        };
    }
    match e {
        StoreError::Unlogged(..) => EngineError::Internal(anyhow::Error::new(e).context(during.to_string())),
        e => EngineError::from_any(anyhow::Error::new(e), during),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::codec::CodecError;
    use crate::store::StoreError;
    use std::path::{Path, PathBuf};

    #[test]
    fn an_unreadable_value_is_corrupt_state_of_its_task_and_the_rest_keeps_its_domain() {
        let dir = Path::new("/state/app/payments-0");
        let unreadable = StateError::Codec {
            store: "dedup".into(),
            key: "p-1:SETTLED".into(),
            source: CodecError::UnknownFormat(9),
        };
        match state_failure(dir, unreadable) {
            EngineError::Corrupt { dir: d, source } => {
                assert_eq!(d, dir);
                assert!(format!("{source:#}").contains("p-1:SETTLED"), "{source:#}");
            }
            other => panic!("expected corrupt state, got {other:?}"),
        }
        assert!(matches!(
            state_failure(dir, StateError::MissingStore("dedup")),
            EngineError::Internal(_)
        ));
        let unlogged = StateError::Store(StoreError::Unlogged(PathBuf::from(dir), 3));
        assert!(matches!(state_failure(dir, unlogged), EngineError::Internal(_)));
        let full = StateError::Store(StoreError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        });
        assert!(matches!(state_failure(dir, full), EngineError::Config(_)));
        let offset = StateError::Store(StoreError::CorruptOffset(dir.to_path_buf(), "dedup".into()));
        assert!(matches!(state_failure(dir, offset), EngineError::Corrupt { .. }));
    }

    #[test]
    fn an_unreadable_value_is_a_dead_letter_once_the_changelog_holds_it_and_always_in_the_mappings() {
        let codec = || StateError::Codec {
            store: "dedup".into(),
            key: "p-1:SETTLED".into(),
            source: CodecError::UnknownFormat(9),
        };
        assert_eq!(unreadable(&codec(), false), None, "first the store is rebuilt");
        let rejection = unreadable(&codec(), true).expect("then a dead letter");
        assert_eq!(rejection.reason, Reason::UnreadableState);
        assert!(
            rejection.detail.contains("p-1:SETTLED") && rejection.detail.contains("tally reset"),
            "{}",
            rejection.detail
        );
        let mapping = StateError::Store(StoreError::CorruptValue {
            path: PathBuf::from("/state/app/global-mappings"),
            key: "crm:C-1".into(),
            source: CodecError::UnknownFormat(9),
        });
        let rejection = unreadable(&mapping, false).expect("the mappings are rebuilt only at a start");
        assert!(
            rejection.detail.contains("/state/app/global-mappings"),
            "{}",
            rejection.detail
        );
        let missing = StateError::MissingStore("dedup");
        assert_eq!(unreadable(&missing, true), None, "a bug is no record's fault");
    }
}
