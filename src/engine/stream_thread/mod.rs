//! A stream thread: one group consumer and one transactional producer serving many tasks,
//! committing outputs, changelogs and offsets in one transaction every commit interval.

mod commit;
mod rebalance;

use super::clients;
use super::emit::ProcessError;
use super::errors::{classify, EngineError, ErrorClass, TxnStep};
use super::faults::{self, Point};
use super::group_watch::RejoinRequests;
use super::layout::TaskLayout;
use super::producer::TxnProducer;
use super::purge::Purger;
use super::restore::{self, Rebuild, RestoreSettings};
use super::task::{PipelineTask, Sinks, Task, Work};
use super::txn::{Phase, Txn};
use super::Shutdown;
use crate::metrics::consumer_lag::ConsumerLag;
use crate::metrics::held_back::HeldBack;
use crate::metrics::Metrics;
use crate::processors::PipelineProcessor;
use crate::processors::{Reason, Rejection};
use crate::reconcile::live::ReconcileTask;
use crate::store::{LockError, StoreEnv, StoreError, TaskStore};
use crate::topology::{Stage, Topology};
use anyhow::{anyhow, Context as _};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::Message;
use rebalance::StreamContext;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(50);
const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);
/// How long each step of a stopping instance's last commit (deliveries, offsets, commit, or the
/// abort after a failure) may wait for the cluster, instead of 30 s each: with the cluster away,
/// SIGTERM ends the instance in well under a minute.
const SHUTDOWN_COMMIT: Duration = Duration::from_secs(10);
/// Commit early when a transaction has this many records, to bound the overlay's memory.
const MAX_RECORDS_PER_TRANSACTION: usize = 20_000;
/// How long opening a task waits for its directory lock (held by a standby being opened or a
/// store still closing on this host) before the generation fails and retries.
const LOCK_WAIT: Duration = Duration::from_secs(30);
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
}

/// Runs generations (consumer + producer + tasks) until shutdown; a failed generation is
/// followed by a fresh one after a backoff, so errors never become a crash loop.
pub fn run(cfg: ThreadConfig) {
    let mut backoff = Duration::from_millis(500);
    loop {
        match generation(&cfg) {
            Ok(()) => return,
            Err(EngineError::TaskMigrated(why)) => {
                tracing::warn!(thread = cfg.index, %why, "tasks migrated; closing them and rejoining the group");
                backoff = Duration::from_millis(500);
            }
            Err(EngineError::Refused(e)) => {
                // Ending the thread ends the instance non-zero (the supervisor's exit guard);
                // this reason is the one `/health/live` and the exit report.
                let why = format!("{e:#}");
                tracing::error!(thread = cfg.index, error = %why, "stopping the instance");
                cfg.health.engine_failed(why);
                return;
            }
            Err(EngineError::Fatal(e)) if super::errors::storage_full(&e) => {
                // Retrying would only fail again, and a crash-looping pod on a full volume
                // hides the cause: stop, and say what to do (as for a refused principal).
                let why = format!(
                    "{:#}",
                    e.context(format!(
                        "the state directory {} is full: free space or give it a larger volume, then start \
                         tally again (committed work is safe: the stores catch up from their changelogs)",
                        cfg.topology.state_dir.display()
                    ))
                );
                tracing::error!(thread = cfg.index, error = %why, "stopping the instance");
                cfg.health.engine_failed(why);
                return;
            }
            Err(EngineError::Fatal(e)) => {
                tracing::error!(thread = cfg.index, error = %format!("{e:#}"), backoff_ms = backoff.as_millis() as u64, "stream thread failed; restarting its clients");
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
        if cfg.shutdown.wait(backoff) {
            return;
        }
    }
}

fn generation(cfg: &ThreadConfig) -> Result<(), EngineError> {
    let t = &cfg.topology;
    let txn_id = format!("{}-{}-{}", t.application_id, cfg.instance_id, cfg.index);
    // Batches are capped at the write limit too: a batch of small records larger than a topic's
    // `max.message.bytes` would fail the whole transaction.
    let mut producer_config = clients::transactional_producer(t, &txn_id);
    producer_config.set("message.max.bytes", cfg.write_limit.to_string());
    let producer = TxnProducer::new(&producer_config, KAFKA_TIMEOUT, cfg.write_limit)
        .map_err(|e| EngineError::from_kafka(e, "initialising the transactional producer"))?;
    let purger = Purger::new(&clients::base(t), cfg.rt.clone())
        .map_err(|e| EngineError::Fatal(e.context("creating the admin client for purging")))?;
    let state = ThreadState {
        cfg: cfg.clone(),
        producer,
        purger,
        tasks: HashMap::new(),
        txn: Txn::default(),
        unproducible: HashSet::new(),
        restore: RestoreSettings::of(t),
        member: String::new(),
        failure: None,
        to_open: Vec::new(),
        joined: false,
        last_housekeeping: Instant::now(),
        lookup: (String::new(), 0),
    };
    let consumer: BaseConsumer<StreamContext> = clients::stream_consumer(t, &txn_id)
        .create_with_context(StreamContext {
            state: Mutex::new(state),
            lag: ConsumerLag::new(&cfg.metrics, t.clone()),
            held_back: HeldBack::new(&cfg.metrics, t.clone(), clients::open_transaction_limit(t)),
        })
        .map_err(|e| EngineError::Fatal(anyhow!(e).context("creating the consumer")))?;
    let topics = t.consumed_topics();
    consumer
        .subscribe(&topics)
        .map_err(|e| EngineError::Fatal(anyhow!(e).context("subscribing")))?;
    tracing::info!(thread = cfg.index, transactional_id = %txn_id, "stream thread started");
    let ended = run_loop(cfg, &consumer, &topics);
    if let Err(e) = &ended {
        // The consumer closes when it drops, and its revoke callback must not commit what the
        // error left behind (a record half written, a commit of unknown outcome).
        if let Ok(mut st) = consumer.context().state.lock() {
            st.poison(e);
        }
    }
    ended
}

/// The poll loop of one generation; returns when the instance stops or the generation fails.
fn run_loop(cfg: &ThreadConfig, consumer: &BaseConsumer<StreamContext>, topics: &[&str]) -> Result<(), EngineError> {
    let ctx = consumer.context();
    let mut rejoin_at: Option<Instant> = None;
    let mut wait = POLL;
    while !cfg.shutdown.is_triggered() {
        cfg.health.beat(cfg.index);
        let polled = consumer.poll(wait);
        let mut st = lock(ctx)?;
        if let Some(e) = st.failure.take() {
            return Err(e);
        }
        st.open_assigned(consumer)?;
        match polled {
            Some(Ok(msg)) => st.process(consumer, &msg)?,
            Some(Err(e)) => match classify(&e) {
                ErrorClass::Fenced => return Err(EngineError::TaskMigrated(e.to_string())),
                ErrorClass::Refused => return Err(EngineError::from_kafka(e, "consuming")),
                _ => tracing::warn!(error = %e, "consumer error"),
            },
            None => {}
        }
        // One clock read per polled record serves both checks.
        let now = Instant::now();
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
        if cfg.rejoin.take(cfg.index) && rejoin_at.is_none() {
            // Unsubscribing revokes every task (committed in the callback) and then sends a
            // LeaveGroup, static member or not; subscribing again joins as a new member.
            consumer.unsubscribe();
            rejoin_at = Some(Instant::now() + REJOIN_PAUSE);
        }
        if rejoin_at.is_some_and(|at| Instant::now() >= at && st.tasks.is_empty() && st.to_open.is_empty()) {
            rejoin_at = None;
            consumer
                .subscribe(topics)
                .map_err(|e| EngineError::Fatal(anyhow!(e).context("subscribing again after leaving the group")))?;
            tracing::info!(thread = cfg.index, "left the group and joined it again");
        }
    }
    let mut st = lock(ctx)?;
    st.producer.limit_waits(SHUTDOWN_COMMIT);
    st.commit(consumer)?;
    drop(st);
    tracing::info!(
        thread = cfg.index,
        "stream thread stopping: last transaction committed, leaving the group"
    );
    Ok(())
}

fn lock(ctx: &StreamContext) -> Result<MutexGuard<'_, ThreadState>, EngineError> {
    ctx.state
        .lock()
        .map_err(|_| EngineError::Fatal(anyhow!("stream thread state poisoned by an earlier panic")))
}

/// The mutable state of a stream thread, reachable from the loop and the rebalance callback.
struct ThreadState {
    cfg: ThreadConfig,
    producer: TxnProducer,
    purger: Purger,
    tasks: HashMap<(String, i32), Box<dyn Task>>,
    /// The open transaction.
    txn: Txn,
    /// Records (topic, partition, offset) whose output could not be written: dead-lettered
    /// when they come again after the abort. Cleared at every commit.
    unproducible: HashSet<(String, i32, i64)>,
    restore: RestoreSettings,
    /// The group member id the tasks were assigned under (empty before the first assignment).
    member: String,
    failure: Option<EngineError>,
    /// Assigned partitions whose tasks are still to open and restore.
    to_open: Vec<(String, i32)>,
    /// True once this generation got an assignment (counted in the instance's health).
    joined: bool,
    /// When the tasks' periodic work was last looked at.
    last_housekeeping: Instant,
    /// The (topic, partition) of the record being processed, reused across records.
    lookup: (String, i32),
}

impl Drop for ThreadState {
    fn drop(&mut self) {
        let health = &self.cfg.health;
        health.restoring(-(self.to_open.len() as isize));
        if self.joined {
            health.thread_joined(false);
        }
    }
}

impl ThreadState {
    /// Opens and restores the tasks of newly assigned partitions. The open transaction commits
    /// first: a restore can take longer than `transaction.timeout.ms`, and a transaction held
    /// open across it would be aborted by the broker.
    fn open_assigned(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<(), EngineError> {
        if self.to_open.is_empty() {
            return Ok(());
        }
        if matches!(self.txn.phase(), Phase::Open { .. }) {
            self.commit(consumer)?;
        }
        while let Some((topic, partition)) = self.to_open.pop() {
            if !self.tasks.contains_key(&(topic.clone(), partition)) {
                let task = self.open_task(&topic, partition);
                self.cfg.health.restoring(-1);
                self.tasks.insert((topic, partition), task?);
            } else {
                self.cfg.health.restoring(-1);
            }
        }
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

    fn open_task(&self, topic: &str, partition: i32) -> Result<Box<dyn Task>, EngineError> {
        let t = &self.cfg.topology;
        let fatal = |e: anyhow::Error| EngineError::Fatal(e);
        let restored = |layout: &TaskLayout| -> Result<TaskStore, EngineError> {
            let mut store = self.open_store(layout)?;
            for (i, changelog) in layout.changelogs.iter().enumerate() {
                restore::restore(
                    &self.restore,
                    &mut store,
                    i,
                    changelog,
                    partition,
                    &self.cfg.metrics,
                    &|| {
                        self.cfg.health.beat(self.cfg.index);
                        !self.cfg.shutdown.is_triggered()
                    },
                )
                .with_context(|| format!("restoring task {}", layout.name))
                .map_err(fatal)?;
            }
            Ok(store)
        };
        if let (Some(settings), true) = (&t.reconcile, t.reconciled_topic() == Some(topic)) {
            let layout = TaskLayout::of(t, topic, partition)
                .ok_or_else(|| EngineError::Fatal(anyhow!("no reconciler layout for `{topic}`")))?;
            let store = restored(&layout)?;
            tracing::info!(task = %layout.name, topic, "task ready");
            return Ok(Box::new(ReconcileTask::new(
                layout.name,
                partition,
                settings.clone(),
                store,
                layout.changelogs,
                t.dead_letter_topic.clone(),
                self.cfg.metrics.clone(),
            )));
        }
        let (pipeline, stage) = t
            .stage_for_topic(topic)
            .ok_or_else(|| EngineError::Fatal(anyhow!("no pipeline reads topic `{topic}`")))?;
        let name = pipeline.task_name(partition);
        let work = match (stage, &pipeline.repartition) {
            (Stage::Repartition, Some(r)) => Work::Repartition { topic: r.topic.clone() },
            _ => {
                let layout = TaskLayout::of(t, topic, partition)
                    .ok_or_else(|| EngineError::Fatal(anyhow!("task {name} keeps no state")))?;
                Work::Process {
                    store: restored(&layout)?,
                    changelogs: layout.changelogs,
                    repartitioned: pipeline.repartition.is_some(),
                }
            }
        };
        let processor = PipelineProcessor::new(
            Arc::new(pipeline.clone()),
            t.processing.max_record_bytes,
            self.cfg.global.clone(),
        );
        tracing::info!(task = %name, topic, stage = ?stage, "task ready");
        let sinks = Sinks {
            dead_letter: t.dead_letter_topic.clone(),
            mappings: t.id_mapping.as_ref().map(|m| m.topic.clone()),
            trace: t.trace.as_ref().map(|tr| (tr.topic.clone(), tr.level)),
        };
        Ok(Box::new(PipelineTask::new(
            &t.application_id,
            partition,
            processor,
            work,
            sinks,
            t.processing.expiry_scan_interval,
        )))
    }

    /// The task's store: the standby copy when this instance holds one, else opened from disk,
    /// waiting a while for a lock another store on this host still holds.
    fn open_store(&self, layout: &TaskLayout) -> Result<TaskStore, EngineError> {
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            if let Some(store) = self.cfg.standbys.take(&layout.dir) {
                return Ok(store);
            }
            match TaskStore::open_or_rebuild(&layout.dir, &layout.stores, &self.cfg.store_env) {
                Ok((store, rebuilt)) => {
                    if rebuilt {
                        for name in &layout.stores {
                            Rebuild::CorruptDatabase.count(&self.cfg.metrics, name);
                        }
                    }
                    return Ok(store);
                }
                Err(StoreError::Lock(LockError::Held(_))) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => {
                    return Err(EngineError::Fatal(
                        anyhow!(e).context(format!("opening the state of task {}", layout.name)),
                    ))
                }
            }
        }
    }

    /// Runs every task's periodic work (expiry, reconciliation scans) when it is due.
    fn tick(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<(), EngineError> {
        let now = super::emit::now_ms();
        for task in self.tasks.values_mut() {
            match task.tick(now, &mut self.producer) {
                Ok(false) => {}
                Ok(true) => self.txn.wrote(),
                Err(ProcessError::Engine(e)) => return Err(e),
                Err(ProcessError::Kafka(e)) => return self.recover(consumer, e, TxnStep::Produce),
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
