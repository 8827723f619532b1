//! The engine: prepares topics, runs stream threads, stops cleanly.

pub mod admin;
pub mod clients;
pub mod credentials;
pub mod emit;
pub mod errors;
pub mod faults;
pub mod former_hop;
pub mod global;
pub mod group_watch;
pub mod headers;
pub mod health;
pub mod hosted;
pub mod layout;
pub mod member_id;
pub mod membership;
pub mod producer;
pub mod purge;
pub mod restore;
pub mod routing;
pub mod stable_end;
pub mod standby;
pub mod stream_thread;
pub mod task;
pub mod txn;

use crate::metrics::Metrics;
use crate::store::{GlobalMappings, StoreEnv};
use crate::topology::{GroupProtocol, Topology};
use anyhow::{anyhow, Context, Result};
use std::collections::BTreeMap;
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

/// The kind of cluster the engine runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cluster {
    /// Apache Kafka (or a service speaking its whole protocol): the configurations of the topics
    /// tally writes are checked at start.
    Kafka,
    /// librdkafka's in-process mock cluster (`tally demo`): it answers no DescribeConfigs, so the
    /// topics' limits and cleanup policies go unchecked and the producer's limit applies.
    Mock,
}

/// Runs `topology` as instance `instance_id` on `cluster` until `shutdown` is triggered,
/// publishing its task stores and group view to `queries`.
#[allow(clippy::too_many_arguments)] // each is a different shared service; a struct would only rename them
pub async fn run(
    topology: Arc<Topology>,
    instance_id: &str,
    cluster: Cluster,
    on_routing_change: routing::OnChange,
    hosted: Arc<dyn hosted::HostedTasks>,
    metrics: Arc<Metrics>,
    health: Arc<health::Health>,
    queries: Arc<crate::queries::Shared>,
    shutdown: Shutdown,
) -> Result<()> {
    // A cluster that is down or still starting is waited for (readiness stays 503), as Kafka
    // Streams does, instead of exiting into a restart loop; a refusal stops tally at once.
    let mut wait = Duration::from_secs(1);
    let (write_limit, limited_by, partitions) = loop {
        let t = topology.clone();
        let rt = tokio::runtime::Handle::current();
        let prepared = tokio::task::spawn_blocking(move || {
            // Rejected credentials look like an unreachable cluster to the admin client: tell
            // them apart first, so a wrong password stops tally instead of being waited out.
            credentials::probe(&clients::base(&t), "`kafka.properties`", admin::METADATA_TIMEOUT)?;
            let partitions = admin::prepare_topics(&t, &rt)?;
            former_hop::check(&t)?;
            routing::check(&t, &partitions, on_routing_change)?;
            let (limit, by) = match cluster {
                Cluster::Kafka => admin::write_limit(&t, &rt),
                Cluster::Mock => admin::producer_limit(&t),
            }?;
            admin::check_write_limit(limit, &by)?;
            anyhow::Ok((limit, by, partitions))
        })
        .await
        .context("topic preparation panicked")?;
        match prepared {
            Ok(prepared) => break prepared,
            Err(e) if errors::worth_waiting(&e) => {
                tracing::warn!(
                    error = %format!("{e:#}"),
                    retry_in_s = wait.as_secs(),
                    "the Kafka cluster cannot be reached yet; waiting for it"
                );
                let until = Instant::now() + wait;
                while Instant::now() < until && !shutdown.is_triggered() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                if shutdown.is_triggered() {
                    return Ok(());
                }
                wait = (wait * 2).min(Duration::from_secs(15));
            }
            Err(e) => return Err(e),
        }
    };
    let partitions = Arc::new(partitions);
    let max_in = topology.processing.max_record_bytes;
    if max_in > write_limit {
        tracing::warn!(
            max_record_bytes = max_in,
            write_limit,
            "`processing.max_record_bytes` ({max_in}) is larger than the largest record tally can write \
             ({write_limit} bytes, set by {limited_by}): a record whose output would not fit is dead-lettered \
             as `output_too_large`; lower `max_record_bytes` to about {write_limit} or raise {limited_by}"
        );
    }
    let state = topology.state_dir.join(&topology.application_id);
    std::fs::create_dir_all(&state).with_context(|| {
        format!(
            "state directory {} cannot be created; set `state.dir` to a writable path",
            state.display()
        )
    })?;
    // The stores hold business keys, often personal data: owner only, whatever the umask.
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot restrict the state directory {} to its owner", state.display()))?;
    }
    let store_env = Arc::new(StoreEnv::with(&topology.state_memory).publishing_to(queries.stores.clone()));
    // Per instance: instances sharing a state directory each keep their own copy.
    let global = Arc::new(match &topology.id_mapping {
        Some(_) => GlobalMappings::open(
            &state.join(format!("{}-{instance_id}", GlobalMappings::DIR)),
            &store_env,
        )
        .context("opening the ID-mapping store")?,
        None => GlobalMappings::in_memory().context("creating the (unused) ID-mapping store")?,
    });
    let global_tail = match &topology.id_mapping {
        None => None,
        Some(m) => {
            let (t, topic, g, mx, sd) = (
                topology.clone(),
                m.topic.clone(),
                global.clone(),
                metrics.clone(),
                shutdown.clone(),
            );
            let tail = tokio::task::spawn_blocking(move || global::start(&t, &topic, g, mx, sd))
                .await
                .context("ID-mapping reader panicked")??;
            health.global_loaded();
            Some(tail)
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
        changelog_partitions: changelog_partitions(&topology, &partitions),
    };
    let supervisor = Supervisor {
        health: health.clone(),
        shutdown: shutdown.clone(),
    };
    let mut handles = vec![supervisor.spawn("tally-standby".into(), move || standby::run(keeper))?];
    if let Some(tail) = global_tail {
        let h = health.clone();
        handles.push(supervisor.spawn("tally-global".into(), move || tail.run(&h))?);
    }
    let rejoin = Arc::new(group_watch::RejoinRequests::new(topology.processing.threads));
    let watch = group_watch::Watch {
        topology: topology.clone(),
        instance_id: instance_id.to_string(),
        requests: rejoin.clone(),
        metrics: metrics.clone(),
        queries,
        shutdown: shutdown.clone(),
    };
    if topology.processing.group_protocol == GroupProtocol::Classic {
        handles.push(supervisor.spawn("tally-group-watch".into(), move || group_watch::run(watch))?);
    } else {
        // The coordinator reconciles assignments on every heartbeat: the classic protocol's
        // stranded partitions cannot happen, and its group view is not described.
        tracing::info!("group protocol `consumer`: the group watch is off");
    }
    for index in 0..topology.processing.threads {
        let cfg = stream_thread::ThreadConfig {
            hosted: hosted.clone(),
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
            write_limit,
            partitions: partitions.clone(),
        };
        // librdkafka's transaction calls block: they get OS threads, not tokio workers.
        handles.push(supervisor.spawn(format!("tally-stream-{index}"), move || stream_thread::run(cfg))?);
    }
    tokio::task::spawn_blocking(move || {
        handles.into_iter().for_each(|h| {
            // A panic was reported by the thread's guard; the join only waits for the end.
            let _ = h.join();
        });
    })
    .await
    .context("joining stream threads")?;
    match (health.failure(), health.remedy()) {
        (None, _) => Ok(()),
        (Some(why), health::Remedy::Restart) => {
            Err(anyhow!("{why}; the instance stopped (a supervisor should restart it)"))
        }
        // A restart meets the same refusal or the same full disk: the reason names the change.
        (Some(why), health::Remedy::Fix) => Err(anyhow!(
            "{why}; the instance stopped, and restarting it changes nothing until that is done"
        )),
    }
}

/// How many changelog partitions `t` has: one per store of each stateful task, and a task per
/// partition of each topic the stream threads consume (`partitions`, with their counts).
fn changelog_partitions(t: &Topology, partitions: &BTreeMap<String, i32>) -> usize {
    partitions
        .iter()
        .map(|(topic, &n)| {
            let stores = layout::TaskLayout::of(t, topic, 0).map_or(0, |l| l.stores.len());
            stores * n.max(1) as usize
        })
        .sum()
}

/// Starts the engine's threads so that one ending on its own, by a panic or an early return,
/// is never silent: the instance turns not-live (`/health/live` answers 503), every other
/// thread is told to stop (committing its work), and the process exits non-zero.
struct Supervisor {
    health: Arc<health::Health>,
    shutdown: Shutdown,
}

impl Supervisor {
    fn spawn(&self, name: String, body: impl FnOnce() + Send + 'static) -> Result<std::thread::JoinHandle<()>> {
        let guard = ExitGuard {
            name: name.clone(),
            health: self.health.clone(),
            shutdown: self.shutdown.clone(),
        };
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let _guard = guard;
                body();
            })
            .with_context(|| format!("cannot start thread {name}"))
    }
}

/// Reports its thread's end, when that end was not asked for, as the thread unwinds or returns.
struct ExitGuard {
    name: String,
    health: Arc<health::Health>,
    shutdown: Shutdown,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let why = if std::thread::panicking() {
            format!("engine thread {} panicked", self.name)
        } else if !self.shutdown.is_triggered() {
            format!("engine thread {} ended before the instance was stopped", self.name)
        } else {
            return;
        };
        tracing::error!(thread = %self.name, "{why}; stopping the instance");
        self.health.engine_failed(why, health::Remedy::Restart);
        self.shutdown.trigger();
    }
}
