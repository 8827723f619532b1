//! A stream thread: one group consumer and one transactional producer serving many tasks,
//! committing outputs, changelogs and offsets in one transaction every commit interval.

mod commit;
mod lifecycle;
mod opening;
mod rebalance;
mod repeated_errors;

use super::clients;
use super::emit::ProcessError;
use super::errors::{classify, EngineError, ErrorClass};
use super::faults::{self, Point};
use super::group_watch::RejoinRequests;
use super::health::Remedy;
use super::producer::TxnProducer;
use super::purge::Purger;
use super::restore::RestoreSettings;
use super::task::Task;
use super::txn::{Phase, Txn};
use super::Shutdown;
use crate::metrics::consumer_lag::ConsumerLag;
use crate::metrics::held_back::HeldBack;
use crate::metrics::Metrics;
use crate::processors::{Reason, Rejection};
use crate::store::StoreEnv;
use crate::topology::Topology;
use anyhow::anyhow;
use lifecycle::Membership;
use opening::Opening;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use rebalance::StreamContext;
use repeated_errors::RepeatedErrors;
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(50);
const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);
/// Once a stop is requested, how long each wait for the cluster (the step under way, then each
/// step of the last commit: offsets, deliveries, commit, or the abort after a failure) has left,
/// instead of 30 s: with the cluster away, SIGTERM ends the instance in well under a minute.
const SHUTDOWN_COMMIT: Duration = Duration::from_secs(10);
/// Commit early when a transaction has this many records, to bound the overlay's memory.
const MAX_RECORDS_PER_TRANSACTION: usize = 20_000;
/// How long a thread with tasks to process restores at a time before it polls again; it then
/// processes as long before the next slice.
const RESTORE_SLICE: Duration = Duration::from_millis(100);
/// Restores a thread runs at once: each has a consumer prefetching up to its queue's size, and
/// one long restore still leaves room for the short ones behind it.
const RESTORES_AT_ONCE: usize = 2;
/// How long a thread with nothing else to do restores between two polls.
const IDLE_RESTORE_SLICE: Duration = Duration::from_millis(500);
/// The shortest poll between restore slices (a restore waiting for a lock or for a transaction
/// to finish returns at once, and the loop must not spin).
const OPENING_POLL: Duration = Duration::from_millis(10);
/// How often tasks are asked for periodic work (expiry, scans, store gauges): not per record.
const HOUSEKEEPING: Duration = Duration::from_millis(100);
/// Time between leaving the group (once every task is revoked) and joining it again, so the
/// LeaveGroup request is answered before the JoinGroup goes out.
const REJOIN_PAUSE: Duration = Duration::from_secs(1);

/// Everything a stream thread needs, shared with the other threads of the instance.
#[derive(Clone)]
pub struct ThreadConfig {
    /// The topology to run.
    pub topology: Arc<Topology>,
    /// Index of this thread within the instance.
    pub index: usize,
    /// Stable instance id (part of the transactional id).
    pub instance_id: String,
    /// Metrics of the instance.
    pub metrics: Arc<Metrics>,
    /// Shared RocksDB memory.
    pub store_env: Arc<StoreEnv>,
    /// Set when the instance should stop.
    pub shutdown: Shutdown,
    /// Runtime for background admin requests.
    pub rt: tokio::runtime::Handle,
    /// The instance's ID-mapping store.
    pub global: Arc<crate::store::GlobalMappings>,
    /// The instance's readiness.
    pub health: Arc<super::health::Health>,
    /// Standby stores this instance holds, promoted when their task is assigned here.
    pub standbys: Arc<super::standby::Standbys>,
    /// Set by the group watch when this thread should leave and rejoin the group.
    pub rejoin: Arc<RejoinRequests>,
    /// The largest record this thread may produce (see `admin::write_limit`).
    pub write_limit: usize,
    /// The partition count at start of each topic the thread consumes (co-partitioned sources
    /// are checked against it; the consumer's fetches are sized by the sum).
    pub partitions: Arc<BTreeMap<String, i32>>,
    /// Opens the tasks of other modules the thread runs (the live reconciler's).
    pub hosted: Arc<dyn super::hosted::HostedTasks>,
}

/// Runs generations (consumer + producer + tasks) until shutdown; a failed generation is
/// followed by a fresh one after a backoff, so errors never become a crash loop.
pub fn run(cfg: ThreadConfig) {
    let mut backoff = Duration::from_millis(500);
    let mut rebuilt = HashSet::new();
    loop {
        match generation(&cfg, &rebuilt) {
            Ok(()) => return,
            Err(EngineError::TaskMigrated(why)) => {
                tracing::warn!(thread = cfg.index, why = %format!("{why:#}"), "tasks migrated; closing them and rejoining the group");
                backoff = Duration::from_millis(500);
            }
            Err(EngineError::Config(e)) => return stop(&cfg, &e),
            Err(EngineError::Corrupt { dir, source }) => {
                // A value the changelog holds is dead-lettered after the first rebuild (see
                // `task::unreadable`): damage found again is the disk's.
                if !rebuilt.insert(dir.clone()) {
                    let e = source.context(format!(
                        "the state in {} was found damaged again after it was rebuilt from its changelog: check \
                         the disk under `state.dir` (its kernel log, SMART), then start tally again",
                        dir.display()
                    ));
                    return stop(&cfg, &e);
                }
                let why = format!("{source:#}");
                tracing::error!(thread = cfg.index, dir = %dir.display(), error = %why, "a task's state cannot be read; rebuilding it from its changelog");
                if let Err(e) = crate::store::set_aside(&dir, &why) {
                    tracing::warn!(error = %e, "could not move the task directory aside; trying again with it");
                }
                continue;
            }
            Err(EngineError::Transient(e)) => {
                tracing::error!(thread = cfg.index, error = %format!("{e:#}"), backoff_ms = backoff.as_millis() as u64, "stream thread failed; restarting its clients");
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
            Err(e @ EngineError::Internal(_)) => {
                tracing::error!(thread = cfg.index, error = %e, backoff_ms = backoff.as_millis() as u64, "restarting the stream thread from what Kafka committed");
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
        if cfg.shutdown.wait(backoff) {
            return;
        }
    }
}

/// Stops the instance on an error only an operator can fix: ending the thread ends the instance
/// non-zero (the supervisor's exit guard), and this reason is the one `/health/live` and the
/// exit report give.
fn stop(cfg: &ThreadConfig, e: &anyhow::Error) {
    let why = format!("{e:#}");
    tracing::error!(thread = cfg.index, error = %why, "stopping the instance");
    cfg.health.engine_failed(why, Remedy::Fix);
}

/// One generation; `rebuilt` names the task directories rebuilt for unreadable state so far.
fn generation(cfg: &ThreadConfig, rebuilt: &HashSet<PathBuf>) -> Result<(), EngineError> {
    let t = &cfg.topology;
    let txn_id = format!("{}-{}-{}", t.application_id, cfg.instance_id, cfg.index);
    // Batches are capped at the write limit too: a batch of small records larger than a topic's
    // `max.message.bytes` would fail the whole transaction.
    let mut producer_config = clients::transactional_producer(t, &txn_id);
    producer_config.set("message.max.bytes", cfg.write_limit.to_string());
    let producer = TxnProducer::new(
        &producer_config,
        KAFKA_TIMEOUT,
        cfg.write_limit,
        cfg.shutdown.clone(),
        SHUTDOWN_COMMIT,
    )
    .map_err(|e| EngineError::from_kafka(e, "initialising the transactional producer"))?;
    let purger = Purger::new(&clients::base(t), cfg.rt.clone())
        .map_err(|e| EngineError::from_any(e, "creating the admin client for purging"))?;
    let state = ThreadState {
        cfg: cfg.clone(),
        producer,
        purger,
        tasks: FxHashMap::default(),
        txn: Txn::new(t.processing.commit_interval),
        unproducible: HashSet::new(),
        restore: RestoreSettings::of(t),
        member: String::new(),
        membership: Membership::Joining,
        opening: Vec::new(),
        restore_turn: Instant::now(),
        joined: false,
        last_housekeeping: Instant::now(),
        lookup: (String::new(), 0),
        rebuilt: rebuilt.clone(),
    };
    let assignable = cfg.partitions.values().map(|&n| n.max(1) as usize).sum();
    let consumer: BaseConsumer<StreamContext> = clients::stream_consumer(t, &txn_id, assignable)
        .create_with_context(StreamContext {
            state: Mutex::new(state),
            lag: ConsumerLag::new(&cfg.metrics, t.clone()),
            held_back: HeldBack::new(&cfg.metrics, t.clone(), clients::open_transaction_limit(t)),
        })
        .map_err(|e| EngineError::from_kafka(e, "creating the consumer"))?;
    let topics = t.consumed_topics();
    consumer
        .subscribe(&topics)
        .map_err(|e| EngineError::from_kafka(e, "subscribing"))?;
    tracing::info!(thread = cfg.index, transactional_id = %txn_id, "stream thread started");
    let ended = run_loop(cfg, &consumer, &topics);
    if let Err(e) = &ended {
        // The consumer closes when it drops, and its revoke callback must not commit what the
        // error left behind (a record half written, a commit of unknown outcome).
        if let Ok(mut st) = consumer.context().state.lock() {
            st.poison(&consumer, e);
        }
    }
    ended
}

/// The poll loop of one generation; returns when the instance stops or the generation fails.
fn run_loop(cfg: &ThreadConfig, consumer: &BaseConsumer<StreamContext>, topics: &[&str]) -> Result<(), EngineError> {
    let ctx = consumer.context();
    let mut wait = POLL;
    let mut consumer_errors = RepeatedErrors::default();
    while !cfg.shutdown.is_triggered() {
        let polled = consumer.poll(wait);
        let mut st = lock(ctx)?;
        if let Some(e) = st.membership.take_end() {
            return Err(e);
        }
        st.open_assigned(consumer)?;
        match polled {
            Some(Ok(msg)) => st.process(consumer, &msg)?,
            Some(Err(e)) => match classify(&e) {
                ErrorClass::Fenced | ErrorClass::Refused => return Err(EngineError::from_kafka(e, "consuming")),
                _ => {
                    consumer_errors.seen(&e);
                }
            },
            None => {}
        }
        // One clock read per turn serves every check of the turn.
        let now = Instant::now();
        cfg.health.beat(cfg.index, now);
        if now.duration_since(st.last_housekeeping) >= HOUSEKEEPING {
            st.last_housekeeping = now;
            if !st.tasks.is_empty() && faults::hit(Point::ZombieTick) {
                st.zombie_tick(consumer)?;
            } else {
                st.tick(consumer)?;
            }
            st.report_stores();
        }
        if st.commit_due(now) {
            st.commit(consumer)?;
        }
        wait = st.poll_wait(now);
        if cfg.rejoin.take(cfg.index) && st.membership.leave(Instant::now() + REJOIN_PAUSE) {
            // Unsubscribing revokes every task (committed in the callback) and then sends a
            // LeaveGroup, static member or not; subscribing again joins as a new member.
            consumer.unsubscribe();
        }
        let idle = st.tasks.is_empty() && st.opening.is_empty();
        if st.membership.rejoin_due(now, idle) {
            consumer
                .subscribe(topics)
                .map_err(|e| EngineError::from_kafka(e, "subscribing again after leaving the group"))?;
            tracing::info!(thread = cfg.index, "left the group and joined it again");
        }
    }
    let mut st = lock(ctx)?;
    st.commit(consumer)?;
    drop(st);
    tracing::info!(
        thread = cfg.index,
        "stream thread stopping: last transaction committed, leaving the group"
    );
    Ok(())
}

/// Pauses or resumes the fetching of `key`'s partition.
///
/// Only ever for a partition that has handed out a record since it was assigned. librdkafka
/// discards a partition operation older than the last one it served (a version barrier per
/// partition), and the operation that starts an assigned partition's fetching takes its version
/// before it is queued: a pause or resume from this thread that lands in between is served first,
/// and the start is then dropped as outdated, so the partition never fetches (librdkafka issues
/// #2190 and #5591). A partition that handed out a record has started, so nothing is left to
/// drop.
fn set_paused(
    consumer: &BaseConsumer<StreamContext>,
    key: &(String, i32),
    paused: bool,
) -> rdkafka::error::KafkaResult<()> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&key.0, key.1);
    if paused {
        consumer.pause(&tpl)
    } else {
        consumer.resume(&tpl)
    }
}

/// Reads `key`'s partition again from `skipped_from` once its task is ready, where records of it
/// were handed out (and skipped, the partition paused) while the task was opening. A partition
/// that handed out nothing meanwhile was never paused: its fetch goes on as it is.
fn resume(
    consumer: &BaseConsumer<StreamContext>,
    key: &(String, i32),
    skipped_from: Option<i64>,
) -> Result<(), EngineError> {
    let Some(offset) = skipped_from else {
        return Ok(());
    };
    set_paused(consumer, key, false)
        .map_err(|e| EngineError::from_kafka(e, "resuming the partition of a task that is ready"))?;
    consumer
        .seek(&key.0, key.1, Offset::Offset(offset), KAFKA_TIMEOUT)
        .map_err(|e| EngineError::from_kafka(e, "reading again what was fetched while the task restored"))?;
    Ok(())
}

fn lock(ctx: &StreamContext) -> Result<MutexGuard<'_, ThreadState>, EngineError> {
    ctx.state
        .lock()
        .map_err(|_| EngineError::Internal(anyhow!("stream thread state poisoned by an earlier panic")))
}

/// The mutable state of a stream thread, reachable from the loop and the rebalance callback.
struct ThreadState {
    cfg: ThreadConfig,
    producer: TxnProducer,
    purger: Purger,
    tasks: FxHashMap<(String, i32), Box<dyn Task>>,
    /// The open transaction.
    txn: Txn,
    /// Records (topic, partition, offset) whose output could not be written: dead-lettered
    /// when they come again after the abort. Cleared at every commit.
    unproducible: HashSet<(String, i32, i64)>,
    restore: RestoreSettings,
    /// The group member id the tasks were assigned under (empty before the first assignment).
    member: String,
    /// Where the thread stands in the group.
    membership: Membership,
    /// Tasks of assigned partitions still opening and restoring.
    opening: Vec<Opening>,
    /// When the opening tasks may next be restored.
    restore_turn: Instant,
    /// True once this generation got an assignment (counted in the instance's health).
    joined: bool,
    /// When the tasks' periodic work was last looked at.
    last_housekeeping: Instant,
    /// The (topic, partition) of the record being processed, reused across records.
    lookup: (String, i32),
    /// Task directories rebuilt from their changelogs for unreadable state.
    rebuilt: HashSet<PathBuf>,
}

impl Drop for ThreadState {
    fn drop(&mut self) {
        let health = &self.cfg.health;
        health.restoring(-(self.opening.len() as isize));
        if self.joined {
            health.thread_joined(false);
        }
    }
}

impl ThreadState {
    /// Opens and restores the tasks of newly assigned partitions for a slice of time: most of
    /// the time while the thread has no task to process, else [`RESTORE_SLICE`] in two. A ready
    /// task's partition is resumed, from the first record handed out before it was ready.
    fn open_assigned(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<(), EngineError> {
        let now = Instant::now();
        if self.opening.is_empty() || now < self.restore_turn {
            return Ok(());
        }
        let until = now
            + if self.tasks.is_empty() {
                IDLE_RESTORE_SLICE
            } else {
                RESTORE_SLICE
            };
        let mut i = 0;
        while i < self.opening.len() && Instant::now() < until {
            let may_start = self.opening.iter().filter(|o| o.restoring()).count() < RESTORES_AT_ONCE;
            if !self.opening[i].advance(&self.cfg, &self.restore, until, may_start)? {
                i += 1;
                continue;
            }
            let opened = self.opening.swap_remove(i);
            self.cfg.health.restoring(-1);
            let (key, skipped_from) = (opened.key.clone(), opened.skipped_from);
            let task = opened.into_task(&self.cfg, &self.rebuilt)?;
            self.tasks.insert(key.clone(), task);
            resume(consumer, &key, skipped_from)?;
        }
        // The next slice starts with the tasks this one did not reach: a long restore does not
        // hold up the short ones behind it.
        let reached = i.min(self.opening.len());
        self.opening.rotate_left(reached);
        let now = Instant::now();
        self.restore_turn = if self.tasks.is_empty() {
            now
        } else {
            now + RESTORE_SLICE
        };
        Ok(())
    }

    fn process(
        &mut self,
        consumer: &BaseConsumer<StreamContext>,
        msg: &BorrowedMessage<'_>,
    ) -> Result<(), EngineError> {
        // The lookup key is a reused buffer: no allocation per record.
        self.lookup.0.clear();
        self.lookup.0.push_str(msg.topic());
        self.lookup.1 = msg.partition();
        let Some(task) = self.tasks.get_mut(&self.lookup) else {
            if let Some(opening) = self.opening.iter_mut().find(|o| o.key == self.lookup) {
                // Its task is still opening: pause the partition at its first record (the fetch
                // has started, so the pause cannot drop the start: `set_paused`) and read again
                // from there once the task is ready. Records fetched before the pause took hold
                // are skipped the same way.
                if opening.skipped_from.is_none() {
                    opening.skipped_from = Some(msg.offset());
                    if let Err(e) = set_paused(consumer, &self.lookup, true) {
                        tracing::warn!(
                            topic = msg.topic(),
                            partition = msg.partition(),
                            error = %e,
                            "could not pause a partition whose task is opening; its records are skipped until it is ready"
                        );
                    }
                }
                return Ok(());
            }
            // Every assigned partition's task is opened before a record is processed, so this
            // partition is not (or no longer) this member's: its owner processes the record.
            // Processing it here would write it a second time, in another transaction.
            tracing::warn!(
                topic = msg.topic(),
                partition = msg.partition(),
                offset = msg.offset(),
                "record of a partition this thread does not own; skipped"
            );
            return Ok(());
        };
        let key = &self.lookup;
        if self.txn.position(key).is_none() {
            // Where each owner starts reading is what a replay or a gap is judged by.
            tracing::info!(
                topic = msg.topic(),
                partition = msg.partition(),
                offset = msg.offset(),
                "first record of the partition since it was assigned"
            );
        }
        // Before anything of the record is written: an abort rewinds to it.
        if !self.txn.consumed(key, msg.offset()) {
            tracing::warn!(
                topic = msg.topic(),
                partition = msg.partition(),
                offset = msg.offset(),
                "record handed out again after it was processed; skipped"
            );
            self.cfg.metrics.redelivered_skipped.inc();
            return Ok(());
        }
        let refused =
            !self.unproducible.is_empty() && self.unproducible.contains(&(key.0.clone(), key.1, msg.offset()));
        let done = if refused {
            let why = "what the record becomes on the way out is larger than the largest record \
                       tally can write (see the `write_limit` logged at start)";
            task.reject(msg, &mut self.producer, Rejection::new(Reason::OutputTooLarge, why))
        } else {
            task.process(msg, &mut self.producer)
        };
        match done {
            Ok(()) => Ok(()),
            // The record can never be produced, not this transaction's fault: abort what it
            // half wrote, and when it comes again, dead-letter it instead of running it.
            Err(ProcessError::Kafka(KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)))
                if !refused =>
            {
                tracing::warn!(
                    topic = msg.topic(),
                    partition = msg.partition(),
                    offset = msg.offset(),
                    "a record's output is too large to write; aborting and dead-lettering the record"
                );
                let place = (msg.topic().to_string(), msg.partition(), msg.offset());
                self.abort_and_rewind(consumer)?;
                self.unproducible.insert(place);
                Ok(())
            }
            Err(e) => self.process_failed(consumer, e),
        }
    }

    /// How long the next poll may wait: until the open transaction is due or the opening
    /// tasks' next restore slice.
    fn poll_wait(&self, now: Instant) -> Duration {
        let wait = self.txn_wait(now);
        if self.opening.is_empty() {
            return wait;
        }
        wait.min(self.restore_turn.saturating_duration_since(now).max(OPENING_POLL))
    }

    /// Runs every task's periodic work (expiry, reconciliation scans) when it is due.
    fn tick(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<(), EngineError> {
        let now = super::emit::now_ms();
        for task in self.tasks.values_mut() {
            match task.tick(now, &mut self.producer) {
                Ok(false) => {}
                Ok(true) => self.txn.wrote(),
                Err(e) => return self.process_failed(consumer, e),
            }
        }
        Ok(())
    }

    /// The [`Point::ZombieTick`] fault: freezes, then ticks and commits without polling first.
    fn zombie_tick(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<(), EngineError> {
        std::thread::sleep(faults::FREEZE);
        self.tick(consumer)?;
        if matches!(self.txn.phase(), Phase::Open { .. }) {
            self.commit(consumer)?;
        }
        Ok(())
    }

    /// Refreshes the store size gauges of the tasks (each task reads them every few seconds).
    fn report_stores(&mut self) {
        for task in self.tasks.values_mut() {
            task.report_stores(&self.cfg.metrics);
        }
    }
}
