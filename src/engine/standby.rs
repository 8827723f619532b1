//! Standby replicas (`processing.num_standby_replicas`): warm copies of tasks that other
//! instances own, kept current by tailing their changelogs, so a failover restores only the tail.
//! The same thread removes task directories nobody has used for `state.cleanup_delay`.

use super::clients;
use super::faults::{self, Point};
use super::layout::TaskLayout;
use super::membership::GroupView;
use super::restore::{resume_point, Rebuild};
use super::Shutdown;
use crate::metrics::events::StandbyRecordsApplied;
use crate::metrics::Metrics;
use crate::store::write::CATCH_UP_BATCH_BYTES;
use crate::store::{LockError, StoreEnv, StoreError, TaskStore};
use crate::topology::Topology;
use anyhow::{Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often the group's assignment is read to place standbys.
const REFRESH: Duration = Duration::from_secs(2);
/// How often the state directory is searched for stale task directories.
const CLEAN_EVERY: Duration = Duration::from_secs(30);
/// Changelog records applied per WriteBatch.
const BATCH: usize = 10_000;
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// The standby stores this instance holds, by task directory; a stream thread takes one over
/// when its task is assigned here.
#[derive(Default)]
pub struct Standbys {
    held: Mutex<HashMap<PathBuf, Standby>>,
}

struct Standby {
    layout: TaskLayout,
    partition: i32,
    store: TaskStore,
}

impl Standbys {
    /// Hands the standby store of the task at `dir` to its new active owner, if held.
    pub fn take(&self, dir: &Path) -> Option<TaskStore> {
        let standby = self.lock().remove(dir)?;
        tracing::info!(task = %standby.layout.name, "standby promoted to active: only the changelog tail is restored");
        Some(standby.store)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Standby>> {
        // A panic while applying a batch leaves the map itself consistent.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What the standby thread needs.
pub struct StandbyConfig {
    /// The topology run by this instance.
    pub topology: Arc<Topology>,
    /// This instance's id.
    pub instance_id: String,
    /// Metrics of the instance.
    pub metrics: Arc<Metrics>,
    /// Shared RocksDB memory.
    pub store_env: Arc<StoreEnv>,
    /// The standby stores, shared with the stream threads.
    pub standbys: Arc<Standbys>,
    /// Set when the instance should stop.
    pub shutdown: Shutdown,
    /// How many changelog partitions the topology has: the most a standby consumer may follow.
    pub changelog_partitions: usize,
}

/// Keeps standbys and cleans stale directories until shutdown; errors restart the loop after a
/// backoff (a standby is an optimisation: it never stops the instance).
pub fn run(cfg: StandbyConfig) {
    let mut backoff = Duration::from_secs(1);
    loop {
        match keep(&cfg) {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), backoff_s = backoff.as_secs(), "standby replicas interrupted; retrying");
                cfg.standbys.lock().clear();
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
        if cfg.shutdown.wait(backoff) {
            break;
        }
    }
    cfg.standbys.lock().clear();
    cfg.metrics.standby_tasks.set(0);
}

fn keep(cfg: &StandbyConfig) -> Result<()> {
    let t = &cfg.topology;
    let consumer: BaseConsumer = clients::standby_consumer(t, cfg.changelog_partitions)
        .create()
        .context("creating the standby consumer")?;
    let mut routes = Routes::new();
    let mut last_refresh: Option<Instant> = None;
    let mut last_clean = Instant::now();
    while !cfg.shutdown.is_triggered() {
        if t.processing.num_standby_replicas > 0 && last_refresh.is_none_or(|r| r.elapsed() >= REFRESH) {
            last_refresh = Some(Instant::now());
            if let Some(new_routes) = refresh(cfg, &consumer, &routes)? {
                routes = new_routes;
            }
        }
        if last_clean.elapsed() >= CLEAN_EVERY {
            last_clean = Instant::now();
            crate::store::cleaner::remove_stale(&t.state_dir.join(&t.application_id), t.state_cleanup_delay);
        }
        if routes.is_empty() {
            cfg.shutdown.wait(Duration::from_millis(200));
            continue;
        }
        apply_batch(cfg, &consumer, &routes)?;
    }
    Ok(())
}

/// Changelog partition → (standby task directory, store index).
type Routes = HashMap<(String, i32), (PathBuf, usize)>;

/// Reads the group, opens the standbys this instance should hold and closes the others.
/// Returns the new routing when the set differs from the one `routes` serves (a promotion
/// to active also changes it) and reassigns the consumer.
fn refresh(cfg: &StandbyConfig, consumer: &BaseConsumer, routes: &Routes) -> Result<Option<Routes>> {
    let t = &cfg.topology;
    let list = consumer
        .fetch_group_list(Some(&t.application_id), KAFKA_TIMEOUT)
        .context("describing the consumer group")?;
    let Some(group) = list.groups().iter().find(|g| g.name() == t.application_id) else {
        return Ok(None);
    };
    // Mid-rebalance the coordinator's assignment is in flux; placing standbys then only churns.
    if group.state() != "Stable" {
        return Ok(None);
    }
    let view = GroupView::from_members(
        &t.application_id,
        group.members().iter().map(|m| (m.client_id(), m.assignment())),
    );
    let replicas = t.processing.num_standby_replicas;
    let wanted: BTreeMap<PathBuf, (TaskLayout, i32)> = view
        .owners
        .keys()
        .filter(|task| view.standbys_of(task, replicas).contains(&cfg.instance_id.as_str()))
        .filter_map(|(topic, p)| TaskLayout::of(t, topic, *p).map(|l| (l.dir.clone(), (l, *p))))
        .collect();
    // The lock is taken only for moments: a stream thread promoting a standby waits on it, and
    // must never wait on the broker (reading bounds takes up to KAFKA_TIMEOUT per changelog
    // while partitions have no leader).
    let missing: Vec<(PathBuf, (TaskLayout, i32))> = {
        let mut held = cfg.standbys.lock();
        held.retain(|dir, s| {
            let keep = wanted.contains_key(dir);
            if !keep {
                tracing::info!(task = %s.layout.name, "standby released");
            }
            keep
        });
        wanted.into_iter().filter(|(dir, _)| !held.contains_key(dir)).collect()
    };
    for (dir, (layout, partition)) in missing {
        match open(cfg, &layout, partition, consumer) {
            Ok(store) => {
                tracing::info!(task = %layout.name, "standby opened");
                cfg.standbys.lock().insert(
                    dir,
                    Standby {
                        layout,
                        partition,
                        store,
                    },
                );
            }
            // The task is active here (the view lags) or still closing elsewhere on this host.
            Err(e) if is_held(&e) => {}
            Err(e) => tracing::warn!(task = %layout.name, error = %format!("{e:#}"), "cannot open standby"),
        }
    }
    let held = cfg.standbys.lock();
    cfg.metrics.standby_tasks.set(held.len() as i64);
    let routed: BTreeSet<&PathBuf> = routes.values().map(|(dir, _)| dir).collect();
    if routed == held.keys().collect() {
        return Ok(None);
    }
    let mut tpl = TopicPartitionList::new();
    let mut new_routes = HashMap::new();
    for (dir, s) in held.iter() {
        for (i, changelog) in s.layout.changelogs.iter().enumerate() {
            let next = s.store.changelog_offset(i)?.map_or(0, |o| o + 1);
            tpl.add_partition_offset(changelog, s.partition, Offset::Offset(next))
                .context("invalid standby position")?;
            new_routes.insert((changelog.clone(), s.partition), (dir.clone(), i));
        }
    }
    consumer.assign(&tpl).context("assigning standby changelogs")?;
    Ok(Some(new_routes))
}

/// Opens a standby store and makes each of its stores resumable from its recorded offset. The
/// changelogs' bounds are read first, so the task directory is locked only once they are known.
fn open(cfg: &StandbyConfig, layout: &TaskLayout, partition: i32, consumer: &BaseConsumer) -> Result<TaskStore> {
    if faults::hit(Point::StandbyOpenStalls) {
        std::thread::sleep(faults::FREEZE);
    }
    let bounds = layout
        .changelogs
        .iter()
        .map(|changelog| {
            consumer
                .fetch_watermarks(changelog, partition, KAFKA_TIMEOUT)
                .with_context(|| format!("reading the start and end of `{changelog}`"))
        })
        .collect::<Result<Vec<_>>>()?;
    let (mut store, rebuilt) = TaskStore::open_or_rebuild(&layout.dir, &layout.stores, &cfg.store_env)?;
    for (i, (low, high)) in bounds.into_iter().enumerate() {
        if rebuilt {
            Rebuild::CorruptDatabase.count(&cfg.metrics, &layout.stores[i]);
        }
        if let (_, Some(r)) = resume_point(&mut store, i, partition, low, high)? {
            r.count(&cfg.metrics, &layout.stores[i]);
        }
    }
    Ok(store)
}

fn is_held(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<StoreError>(),
        Some(StoreError::Lock(LockError::Held(_)))
    )
}

/// Polls up to one batch of changelog records and applies them to their standby stores.
fn apply_batch(cfg: &StandbyConfig, consumer: &BaseConsumer, routes: &Routes) -> Result<()> {
    type Pending = (Vec<(Vec<u8>, Option<Vec<u8>>)>, i64);
    let mut pending: HashMap<(String, i32), Pending> = HashMap::new();
    let mut timeout = Duration::from_millis(100);
    let mut bytes = 0;
    for _ in 0..BATCH {
        if bytes >= CATCH_UP_BATCH_BYTES {
            break;
        }
        match consumer.poll(timeout) {
            None => break,
            Some(Err(e)) => return Err(e).context("reading standby changelogs"),
            Some(Ok(m)) => {
                let entry = pending
                    .entry((m.topic().to_string(), m.partition()))
                    .or_insert_with(|| (Vec::new(), m.offset()));
                if let Some(key) = m.key() {
                    bytes += key.len() + m.payload().map_or(0, <[u8]>::len);
                    entry.0.push((key.to_vec(), m.payload().map(<[u8]>::to_vec)));
                }
                entry.1 = m.offset();
            }
        }
        timeout = Duration::ZERO;
    }
    if pending.is_empty() {
        return Ok(());
    }
    let mut held = cfg.standbys.lock();
    for (place, (records, last)) in pending {
        let Some((dir, index)) = routes.get(&place) else {
            continue;
        };
        // Promoted to active since the poll: the stream thread restores these itself.
        let Some(s) = held.get_mut(dir) else {
            continue;
        };
        s.store.apply_restored(*index, &records, last)?;
        cfg.metrics.emit(StandbyRecordsApplied {
            store: s.store.name(*index),
            records: records.len() as u64,
        });
    }
    Ok(())
}
