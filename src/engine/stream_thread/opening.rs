//! Tasks of newly assigned partitions on their way to processing: the store opened (or a
//! standby promoted) and restored from its changelogs in slices between polls, so a long
//! restore neither outlasts `max.poll.interval.ms` nor holds up the thread's other tasks and
//! their transaction (as Kafka Streams restores between polls of its main consumer).

use super::ThreadConfig;
use crate::engine::errors::EngineError;
use crate::engine::hosted::ReconcilerParts;
use crate::engine::layout::TaskLayout;
use crate::engine::restore::{Rebuild, Restore, RestoreSettings};
use crate::engine::task::{PipelineTask, Sinks, Task, Work};
use crate::processors::PipelineProcessor;
use crate::store::{LockError, StoreError, TaskStore};
use crate::topology::Stage;
use anyhow::anyhow;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long opening a task waits for its directory lock (held by a standby being opened or a
/// store still closing on this host) before the generation fails and retries.
const LOCK_WAIT: Duration = Duration::from_secs(30);
/// Pause between two tries for a held directory lock.
const LOCK_RETRY: Duration = Duration::from_millis(100);

/// What the task of an assigned partition does, and so what it must restore.
enum Kind {
    /// The live reconciler's task: one store.
    Reconcile(TaskLayout),
    /// A pipeline's processing stage with its stores; `repartitioned` when it reads the
    /// pipeline's repartition topic.
    Process { layout: TaskLayout, repartitioned: bool },
    /// A pipeline's stateless repartition stage, forwarding to this topic.
    Repartition(String),
}

/// A task being opened and restored.
pub(super) struct Opening {
    /// The assigned (topic, partition).
    pub(super) key: (String, i32),
    kind: Kind,
    store: Option<TaskStore>,
    /// The restore of changelog `restored` in progress.
    restore: Option<Restore>,
    /// How many of the layout's changelogs are restored.
    restored: usize,
    /// Until when a held directory lock is waited for, and when to try it again.
    lock_wait: Option<(Instant, Instant)>,
    /// The first offset the consumer handed out before the task was ready: the partition is
    /// paused from then on, and read again from there once the task is ready.
    pub(super) skipped_from: Option<i64>,
}

impl Opening {
    /// Starts opening the task of `topic`/`partition`.
    pub(super) fn new(cfg: &ThreadConfig, topic: &str, partition: i32) -> Result<Self, EngineError> {
        let t = &cfg.topology;
        let layout = || {
            TaskLayout::of(t, topic, partition)
                .ok_or_else(|| EngineError::Internal(anyhow!("no task layout for `{topic}` partition {partition}")))
        };
        let kind = if t.reconcile.is_some() && t.reconciled_topic() == Some(topic) {
            Kind::Reconcile(layout()?)
        } else {
            let (pipeline, stage) = t
                .stage_for_topic(topic)
                .ok_or_else(|| EngineError::Internal(anyhow!("no pipeline reads topic `{topic}`")))?;
            match (stage, &pipeline.repartition) {
                (Stage::Repartition, Some(r)) => Kind::Repartition(r.topic.clone()),
                (_, repartition) => Kind::Process {
                    layout: layout()?,
                    repartitioned: repartition.is_some(),
                },
            }
        };
        Ok(Self {
            key: (topic.to_string(), partition),
            kind,
            store: None,
            restore: None,
            restored: 0,
            lock_wait: None,
            skipped_from: None,
        })
    }

    /// True while a changelog restore of this task is under way (its consumer prefetching).
    pub(super) fn restoring(&self) -> bool {
        self.restore.is_some()
    }

    /// Opens and restores until `until`; true once the task is ready to process. A restore not
    /// yet under way starts only if `may_start`.
    pub(super) fn advance(
        &mut self,
        cfg: &ThreadConfig,
        settings: &RestoreSettings,
        until: Instant,
        may_start: bool,
    ) -> Result<bool, EngineError> {
        let layout = match &self.kind {
            Kind::Reconcile(layout) | Kind::Process { layout, .. } => layout,
            Kind::Repartition(_) => return Ok(true),
        };
        let store = match &mut self.store {
            Some(store) => store,
            None => match open_store(cfg, layout, &mut self.lock_wait)? {
                Some(store) => self.store.insert(store),
                None => return Ok(false),
            },
        };
        let partition = self.key.1;
        let failed = |e: anyhow::Error| EngineError::from_any(e, &format!("restoring task {}", layout.name));
        while let Some(changelog) = layout.changelogs.get(self.restored) {
            if Instant::now() >= until {
                return Ok(false);
            }
            let restore = match &mut self.restore {
                Some(restore) => restore,
                None if !may_start => return Ok(false),
                None => self
                    .restore
                    .insert(Restore::start(settings, store, self.restored, changelog, partition).map_err(failed)?),
            };
            if restore.run_until(store, &cfg.metrics, until).map_err(failed)?.is_none() {
                return Ok(false);
            }
            self.restore = None;
            self.restored += 1;
        }
        Ok(true)
    }

    /// The ready task (call once [`Opening::advance`] said so).
    /// `rebuilt` holds the task directories rebuilt from their changelogs for an unreadable value.
    pub(super) fn into_task(
        self,
        cfg: &ThreadConfig,
        rebuilt: &HashSet<PathBuf>,
    ) -> Result<Box<dyn Task>, EngineError> {
        let t = &cfg.topology;
        let (topic, partition) = self.key;
        let not_ready = || EngineError::Internal(anyhow!("task of `{topic}` partition {partition} has no store open"));
        let rebuilt_store = self.store.as_ref().is_some_and(|s| rebuilt.contains(s.dir()));
        let work = match self.kind {
            Kind::Reconcile(layout) => {
                tracing::info!(task = %layout.name, topic, "task ready");
                let store = self.store.ok_or_else(not_ready)?;
                return cfg.hosted.reconciler(ReconcilerParts {
                    name: layout.name,
                    topic,
                    partition,
                    store,
                    changelogs: layout.changelogs,
                    topology: cfg.topology.clone(),
                    metrics: cfg.metrics.clone(),
                });
            }
            Kind::Process { layout, repartitioned } => Work::Process {
                store: Box::new(self.store.ok_or_else(not_ready)?),
                changelogs: layout.changelogs,
                repartitioned,
            },
            Kind::Repartition(topic) => Work::Repartition { topic },
        };
        let (pipeline, stage) = t
            .stage_for_topic(&topic)
            .ok_or_else(|| EngineError::Internal(anyhow!("no pipeline reads topic `{topic}`")))?;
        let mut processor = PipelineProcessor::new(
            Arc::new(pipeline.clone()),
            t.processing.max_record_bytes,
            cfg.global.clone(),
        );
        if pipeline.co_partitioned.is_some() {
            if let Some(&count) = cfg.partitions.get(&topic) {
                processor = processor.with_source_partitions(count);
            }
        }
        tracing::info!(task = %pipeline.task_name(partition), topic, stage = ?stage, "task ready");
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
            rebuilt_store,
        )))
    }
}

/// The task's store: the standby copy when this instance holds one, else opened from disk;
/// `None` while another store on this host still holds the directory's lock (for up to
/// [`LOCK_WAIT`], tracked in `lock_wait`).
fn open_store(
    cfg: &ThreadConfig,
    layout: &TaskLayout,
    lock_wait: &mut Option<(Instant, Instant)>,
) -> Result<Option<TaskStore>, EngineError> {
    let now = Instant::now();
    if lock_wait.is_some_and(|(_, retry_at)| now < retry_at) {
        return Ok(None);
    }
    if let Some(store) = cfg.standbys.take(&layout.dir) {
        return Ok(Some(store));
    }
    match TaskStore::open_or_rebuild(&layout.dir, &layout.stores, &cfg.store_env) {
        Ok((store, rebuilt)) => {
            if rebuilt {
                for name in &layout.stores {
                    Rebuild::CorruptDatabase.count(&cfg.metrics, name);
                }
            }
            Ok(Some(store))
        }
        Err(StoreError::Lock(LockError::Held(_))) if lock_wait.is_none_or(|(deadline, _)| now < deadline) => {
            let deadline = lock_wait.map_or(now + LOCK_WAIT, |(deadline, _)| deadline);
            *lock_wait = Some((deadline, now + LOCK_RETRY));
            Ok(None)
        }
        Err(e) => Err(EngineError::from_any(
            anyhow!(e),
            &format!("opening the state of task {}", layout.name),
        )),
    }
}
