//! Brings a task's store up to its changelog's committed end before the task processes.

use super::clients;
use super::faults::{self, Point};
use super::stable_end::{StableEnd, Waiting};
use crate::metrics::events::{RecordsRestored, RestoreOf, StoreRebuilt};
use crate::metrics::Metrics;
use crate::store::write::CATCH_UP_BATCH_BYTES;
use crate::store::{StoreError, TaskStore};
use crate::topology::Topology;
use anyhow::{bail, Context, Result};
use prometheus::IntGauge;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// Records applied per RocksDB WriteBatch while restoring.
const BATCH: usize = 10_000;
/// A restore that reads nothing for this long has stalled.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a long restore logs its progress.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);

/// What a restore did, logged and returned for tests and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreReport {
    /// First changelog offset read (0 for a full restore).
    pub from_offset: i64,
    /// Changelog records applied.
    pub restored: u64,
    /// True when the store had data but no offset and was wiped first.
    pub wiped: bool,
}

/// How restores read changelogs.
#[derive(Clone)]
pub struct RestoreSettings {
    /// The restore consumer's configuration (read_committed).
    pub config: ClientConfig,
    /// How long a restore waits for a transaction open on its changelog before it calls the
    /// transaction hanging and fails.
    pub open_transaction_limit: Duration,
}

impl RestoreSettings {
    /// The settings of `t`'s restores.
    pub fn of(t: &Topology) -> Self {
        Self {
            config: clients::restore_consumer(t),
            open_transaction_limit: clients::open_transaction_limit(t),
        }
    }
}

/// Restores store `index` of `store` from `topic`/`partition`, to the changelog's end once no
/// transaction is open below it. `progress` is called as it goes and returns false when the
/// instance is stopping, which ends the restore with an error.
pub fn restore(
    settings: &RestoreSettings,
    store: &mut TaskStore,
    index: usize,
    topic: &str,
    partition: i32,
    metrics: &Metrics,
    progress: &dyn Fn() -> bool,
) -> Result<RestoreReport> {
    let mut restore = Restore::start(settings, store, index, topic, partition)?;
    loop {
        if !progress() {
            bail!("stopping while restoring `{topic}` partition {partition}");
        }
        if let Some(report) = restore.run_until(store, metrics, Instant::now() + SLICE)? {
            return Ok(report);
        }
    }
}

/// How long [`restore`] works between two calls of its `progress`.
const SLICE: Duration = Duration::from_millis(100);

/// A restore of one store from one changelog partition, done in slices: a stream thread runs a
/// slice between two polls of its group consumer, so a long restore neither outlasts
/// `max.poll.interval.ms` nor holds up the thread's other tasks.
pub struct Restore {
    topic: String,
    partition: i32,
    index: usize,
    name: String,
    consumer: BaseConsumer,
    started: Instant,
    /// Each record read costs this much more (the [`Point::RestoreCrawls`] fault).
    crawl: Duration,
    step: Step,
}

enum Step {
    /// Waiting until no transaction is open below the changelog's end.
    FindEnd(Waiting),
    /// Reading the changelog up to `high`.
    Read(Reading),
}

struct Reading {
    from_offset: i64,
    high: i64,
    wiped: bool,
    restored: u64,
    batch: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// The bytes of keys and values in `batch`.
    batch_bytes: usize,
    /// The offset of the last record read.
    last: i64,
    idle_since: Instant,
    last_progress: Instant,
    remaining: IntGauge,
}

impl Restore {
    /// Starts restoring store `index` of `store` from `topic`/`partition`.
    pub fn start(
        settings: &RestoreSettings,
        store: &TaskStore,
        index: usize,
        topic: &str,
        partition: i32,
    ) -> Result<Self> {
        let config = &settings.config;
        let consumer: BaseConsumer = config.create().context("cannot create the restore consumer")?;
        let waiting = Waiting::start(config, topic, partition, settings.open_transaction_limit)
            .with_context(|| format!("cannot find the end of changelog `{topic}` partition {partition}"))?;
        let crawl = if faults::hit(Point::RestoreCrawls) {
            faults::CRAWL
        } else {
            Duration::ZERO
        };
        Ok(Self {
            topic: topic.to_string(),
            partition,
            index,
            name: store.name(index).to_string(),
            consumer,
            started: Instant::now(),
            crawl,
            step: Step::FindEnd(waiting),
        })
    }

    /// Restores until `until`; the report once the store has reached the changelog's end.
    pub fn run_until(
        &mut self,
        store: &mut TaskStore,
        metrics: &Metrics,
        until: Instant,
    ) -> Result<Option<RestoreReport>> {
        if let Step::FindEnd(waiting) = &mut self.step {
            let Some(end) = waiting.check(&self.consumer).with_context(|| {
                format!(
                    "cannot find the end of changelog `{}` partition {}",
                    self.topic, self.partition
                )
            })?
            else {
                return Ok(None);
            };
            self.step = Step::Read(self.begin_reading(store, metrics, end)?);
        }
        let Step::Read(r) = &mut self.step else {
            return Ok(None);
        };
        let (topic, partition) = (self.topic.as_str(), self.partition);
        // The end is the high watermark, past the last commit marker; read_committed skips the
        // markers and aborted records, so when a poll comes back empty the position tells
        // whether it is reached (asking for the position per record costs more than the restore).
        let mut done = r.high <= r.from_offset;
        while !done {
            let now = Instant::now();
            if now >= until {
                return Ok(None);
            }
            match self.consumer.poll((until - now).min(Duration::from_millis(100))) {
                Some(Ok(m)) => {
                    done = m.offset() + 1 >= r.high;
                    if let Some(key) = m.key() {
                        r.batch_bytes += key.len() + m.payload().map_or(0, <[u8]>::len);
                        r.batch.push((key.to_vec(), m.payload().map(<[u8]>::to_vec)));
                    }
                    r.last = m.offset();
                    r.idle_since = Instant::now();
                    if !self.crawl.is_zero() {
                        std::thread::sleep(self.crawl);
                    }
                    if r.batch.len() >= BATCH || r.batch_bytes >= CATCH_UP_BATCH_BYTES {
                        r.restored += flush(store, self.index, &mut r.batch, r.last, metrics, &self.name)?;
                        r.batch_bytes = 0;
                        r.remaining.set(r.high.saturating_sub(r.last + 1));
                        r.log_progress(&self.name, partition, self.started);
                    }
                }
                Some(Err(e)) => bail!("reading changelog `{topic}` partition {partition}: {e}"),
                None if r.idle_since.elapsed() > STALL_TIMEOUT => bail!(
                    "restore of `{topic}` partition {partition} stalled at offset {} (end {}) for {}s; \
                     is a transaction left open on it?",
                    r.last,
                    r.high,
                    STALL_TIMEOUT.as_secs()
                ),
                None => done = position(&self.consumer, topic, partition) >= r.high,
            }
        }
        r.restored += flush(store, self.index, &mut r.batch, r.last, metrics, &self.name)?;
        r.remaining.set(0);
        let report = RestoreReport {
            from_offset: r.from_offset,
            restored: r.restored,
            wiped: r.wiped,
        };
        let elapsed = self.started.elapsed();
        tracing::info!(
            store = %self.name,
            changelog = topic,
            partition,
            from_offset = report.from_offset,
            restored = report.restored,
            wiped = report.wiped,
            elapsed_ms = elapsed.as_millis() as u64,
            records_per_second = (report.restored as f64 / elapsed.as_secs_f64().max(1e-3)) as u64,
            "restore finished"
        );
        Ok(Some(report))
    }

    /// Checks the store against the changelog's bounds (wiping it where it cannot be trusted)
    /// and places the consumer where reading resumes.
    fn begin_reading(&self, store: &mut TaskStore, metrics: &Metrics, end: StableEnd) -> Result<Reading> {
        let StableEnd { low, high } = end;
        let (topic, partition, index, name) = (self.topic.as_str(), self.partition, self.index, &self.name);
        // The check assigns the partition; the read below then seeks rather than assigning again:
        // one assignment per consumer, as before the check (the first sweep with two assignments
        // saw librdkafka 2.12 abort on an assertion, `rktp->rktp_started`, in an instance's close).
        let applied = match store.changelog_offset(index) {
            Ok(Some(last)) if (low..high).contains(&last) => {
                Some((last, is_committed(&self.consumer, topic, partition, last)?))
            }
            _ => None,
        };
        let uncommitted = matches!(applied, Some((_, false)));
        if let Some((last, false)) = applied {
            tracing::warn!(
                store = %name,
                partition,
                last_applied = last,
                "the store's last changelog record is not committed (its transaction was resolved as \
                 aborted after the store applied it: docs/chaos-runs.md, cause 8); wiping it and \
                 restoring from what the changelog holds"
            );
            store.wipe(index)?;
            Rebuild::Uncommitted.count(metrics, name);
        }
        let (from_offset, rebuilt) = resume_point(store, index, partition, low, high)?;
        if let Some(r) = rebuilt {
            r.count(metrics, name);
        }
        // Per partition: tasks of one store restoring at once (several threads) each have their own.
        let remaining = RestoreOf { store: name, partition }.remaining(metrics);
        remaining.set(high.saturating_sub(from_offset));
        if high > from_offset {
            if applied.is_some() {
                self.consumer
                    .seek(topic, partition, Offset::Offset(from_offset), STALL_TIMEOUT)
                    .context("cannot seek to the restore position")?;
            } else {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(topic, partition, Offset::Offset(from_offset))
                    .context("invalid restore position")?;
                self.consumer
                    .assign(&tpl)
                    .context("cannot assign the changelog partition")?;
            }
        }
        let now = Instant::now();
        Ok(Reading {
            from_offset,
            high,
            wiped: uncommitted || rebuilt.is_some(),
            restored: 0,
            batch: Vec::with_capacity(BATCH),
            batch_bytes: 0,
            last: from_offset - 1,
            idle_since: now,
            last_progress: now,
            remaining,
        })
    }
}

impl Reading {
    /// Logs how far a long restore has come, every [`PROGRESS_INTERVAL`].
    fn log_progress(&mut self, store: &str, partition: i32, started: Instant) {
        if self.last_progress.elapsed() < PROGRESS_INTERVAL {
            return;
        }
        self.last_progress = Instant::now();
        let rate = self.restored as f64 / started.elapsed().as_secs_f64().max(1e-3);
        tracing::info!(
            store,
            partition,
            restored = self.restored,
            remaining = self.high.saturating_sub(self.last + 1),
            records_per_second = rate as u64,
            "restoring"
        );
    }
}

/// Why a store was wiped and rebuilt from its changelog (the `reason` of
/// `tally_store_rebuilds_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebuild {
    /// RocksDB reported the task database corrupt; it was moved aside.
    CorruptDatabase,
    /// The store held data but no changelog offset.
    OffsetMissing,
    /// The recorded changelog offset could not be read.
    OffsetCorrupt,
    /// The store had read past the changelog's end (the topic was created again).
    PastChangelogEnd,
    /// Changelog records the store still needed were deleted.
    RecordsDeleted,
    /// The last changelog record the store applied is not committed: its transaction, which
    /// the store applied when the commit was reported, was resolved as aborted later.
    Uncommitted,
}

impl Rebuild {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Rebuild::CorruptDatabase => "corrupt_database",
            Rebuild::OffsetMissing => "offset_missing",
            Rebuild::OffsetCorrupt => "offset_corrupt",
            Rebuild::PastChangelogEnd => "past_changelog_end",
            Rebuild::RecordsDeleted => "records_deleted",
            Rebuild::Uncommitted => "uncommitted",
        }
    }

    /// Counts the rebuild of `store`.
    pub fn count(self, metrics: &Metrics, store: &str) {
        metrics.emit(StoreRebuilt {
            store,
            reason: self.as_str(),
        });
    }
}

/// Where to resume reading store `index`'s changelog, which holds offsets `low` to `high`, and
/// whether the store was wiped first: a store with data but no offset is corrupt, one that needs
/// records retention deleted cannot be patched, and one that has read past the changelog's end
/// read a changelog since deleted and created again; all are rebuilt from what it holds.
pub fn resume_point(
    store: &mut TaskStore,
    index: usize,
    partition: i32,
    low: i64,
    high: i64,
) -> Result<(i64, Option<Rebuild>)> {
    let name = store.name(index).to_string();
    let (from_offset, wiped) = match store.changelog_offset(index) {
        Ok(Some(o)) => (o + 1, None),
        Ok(None) if store.has_data(index)? => {
            tracing::warn!(store = %name, partition, "store has data but no changelog offset: wiping it for a full restore");
            store.wipe(index)?;
            (0, Some(Rebuild::OffsetMissing))
        }
        Ok(None) => (0, None),
        Err(StoreError::CorruptOffset(..)) => {
            tracing::warn!(store = %name, partition, "store's changelog offset is corrupt: wiping it for a full restore");
            store.wipe(index)?;
            (0, Some(Rebuild::OffsetCorrupt))
        }
        Err(e) => return Err(e.into()),
    };
    if from_offset > high {
        tracing::warn!(
            store = %name,
            partition,
            read_up_to = from_offset,
            changelog_end = high,
            "the store has read past the changelog's end (the topic was deleted and created again?); \
             wiping it and restoring from what the changelog holds"
        );
        store.wipe(index)?;
        return Ok((low, Some(Rebuild::PastChangelogEnd)));
    }
    if from_offset > 0 && low > from_offset {
        tracing::warn!(
            store = %name,
            partition,
            needed_from = from_offset,
            first_available = low,
            "changelog records the store needs were deleted; wiping it and restoring fully"
        );
        store.wipe(index)?;
        return Ok((low, Some(Rebuild::RecordsDeleted)));
    }
    Ok((from_offset.max(low), wiped))
}

/// True when the record at `offset` of `topic`/`partition` is committed: a read_committed
/// consumer placed there hands it out, where it skips a record of an aborted transaction (or
/// one compaction removed, which only costs a needless full restore). Call once no transaction
/// is open below the partition's end, so the record's fate is settled.
///
/// A store applies a transaction's changes when librdkafka reports its commit. When the broker
/// lost that transaction's markers, Kafka settles its records with the producer id's next marker
/// on each partition, and an abort there turns them into aborted records after the fact; the
/// store must then not be trusted (docs/chaos-runs.md, cause 8).
fn is_committed(consumer: &BaseConsumer, topic: &str, partition: i32, offset: i64) -> Result<bool> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
        .context("invalid changelog offset")?;
    consumer.assign(&tpl).context("cannot assign the changelog partition")?;
    let deadline = Instant::now() + STALL_TIMEOUT;
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => return Ok(m.offset() == offset),
            Some(Err(e)) => bail!("reading changelog `{topic}` partition {partition} at offset {offset}: {e}"),
            None if position(consumer, topic, partition) > offset => return Ok(false),
            None if Instant::now() > deadline => bail!(
                "could not read changelog `{topic}` partition {partition} at offset {offset} within {}s",
                STALL_TIMEOUT.as_secs()
            ),
            None => {}
        }
    }
}

/// The consumer's fetch position in the partition (0 before the first fetch).
fn position(consumer: &BaseConsumer, topic: &str, partition: i32) -> i64 {
    let read = || {
        consumer
            .position()
            .ok()?
            .find_partition(topic, partition)?
            .offset()
            .to_raw()
    };
    read().unwrap_or(0)
}

fn flush(
    store: &mut TaskStore,
    index: usize,
    batch: &mut Vec<(Vec<u8>, Option<Vec<u8>>)>,
    last: i64,
    metrics: &Metrics,
    name: &str,
) -> Result<u64> {
    if batch.is_empty() {
        return Ok(0);
    }
    store.apply_restored(index, batch, last)?;
    let n = batch.len() as u64;
    metrics.emit(RecordsRestored {
        store: name,
        records: n,
    });
    batch.clear();
    Ok(n)
}
