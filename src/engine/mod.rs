//! The engine: prepares topics, runs stream threads, stops cleanly.

pub mod admin;
pub mod clients;
pub mod emit;
pub mod errors;
pub mod global;
pub mod group_watch;
pub mod health;
pub mod layout;
pub mod membership;
pub mod producer;
pub mod purge;
pub mod restore;
pub mod standby;
pub mod stream_thread;
pub mod task;
pub mod txn;

use crate::metrics::Metrics;
use crate::store::{GlobalMappings, StoreEnv};
use crate::topology::Topology;
use anyhow::{anyhow, Context, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A stop request shared by the signal handler and every stream thread.
#[derive(Clone, Default)]
pub struct Shutdown(Arc<AtomicBool>);

impl Shutdown {
    /// Asks every thread to commit and stop.
    pub fn trigger(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// True once a stop was requested.
    pub fn is_triggered(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Sleeps up to `d`, returning early (with `true`) when a stop is requested.
    pub fn wait(&self, d: Duration) -> bool {
        let end = Instant::now() + d;
        while Instant::now() < end {
            if self.is_triggered() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50).min(end - Instant::now()));
        }
        self.is_triggered()
    }
}

/// Runs `topology` as instance `instance_id` until `shutdown` is triggered.
pub async fn run(
    topology: Arc<Topology>,
    instance_id: &str,
    metrics: Arc<Metrics>,
    health: Arc<health::Health>,
    shutdown: Shutdown,
) -> Result<()> {
    let t = topology.clone();
    let rt = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || admin::prepare_topics(&t, &rt))
        .await
        .context("topic preparation panicked")??;
    let state = topology.state_dir.join(&topology.application_id);
    std::fs::create_dir_all(&state).with_context(|| {
        format!(
            "state directory {} cannot be created; set `state.dir` to a writable path",
            state.display()
        )
    })?;
    let store_env = Arc::new(StoreEnv::default());
    let global = Arc::new(GlobalMappings::default());
    let global_reader = match &topology.id_mapping {
        None => None,
        Some(m) => {
            let (t, topic, g, mx, sd) = (
                topology.clone(),
                m.topic.clone(),
                global.clone(),
                metrics.clone(),
                shutdown.clone(),
            );
            let reader = tokio::task::spawn_blocking(move || global::start(&t, &topic, g, mx, sd))
                .await
                .context("ID-mapping reader panicked")??;
            health.global_loaded();
            Some(reader)
        }
    };
    let standbys = Arc::new(standby::Standbys::default());
    let keeper = standby::StandbyConfig {
        topology: topology.clone(),
        instance_id: instance_id.to_string(),
        metrics: metrics.clone(),
        store_env: store_env.clone(),
        standbys: standbys.clone(),
        shutdown: shutdown.clone(),
    };
    let mut handles = vec![std::thread::Builder::new()
        .name("tally-standby".into())
        .spawn(move || standby::run(keeper))
        .context("cannot start the standby thread")?];
    let rejoin = Arc::new(group_watch::RejoinRequests::new(topology.processing.threads));
    let (t, id, r, m, sd) = (
        topology.clone(),
        instance_id.to_string(),
        rejoin.clone(),
        metrics.clone(),
        shutdown.clone(),
    );
    handles.push(
        std::thread::Builder::new()
            .name("tally-group-watch".into())
            .spawn(move || group_watch::run(t, id, r, m, sd))
            .context("cannot start the group watch thread")?,
    );
    for index in 0..topology.processing.threads {
        let cfg = stream_thread::ThreadConfig {
            topology: topology.clone(),
            index,
            instance_id: instance_id.to_string(),
            metrics: metrics.clone(),
            store_env: store_env.clone(),
            shutdown: shutdown.clone(),
            rt: tokio::runtime::Handle::current(),
            global: global.clone(),
            health: health.clone(),
            standbys: standbys.clone(),
            rejoin: rejoin.clone(),
        };
        // librdkafka's transaction calls block: they get OS threads, not tokio workers.
        let handle = std::thread::Builder::new()
            .name(format!("tally-stream-{index}"))
            .spawn(move || stream_thread::run(cfg))
            .context("cannot start a stream thread")?;
        handles.push(handle);
    }
    handles.extend(global_reader);
    tokio::task::spawn_blocking(move || {
        handles
            .into_iter()
            .try_for_each(|h| h.join().map_err(|_| anyhow!("an engine thread panicked")))
    })
    .await
    .context("joining stream threads")?
}
