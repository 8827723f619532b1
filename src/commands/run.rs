//! `tally run` and `tally reconcile live`: run a topology (tally's, or the reconciler's view of
//! it) until SIGTERM or Ctrl-C, then commit and leave the group.

use crate::config;
use crate::engine::health::Health;
use crate::engine::routing::OnChange;
use crate::engine::{self, Shutdown};
use crate::metrics::{Metrics, Totals};
use crate::reconcile::live::LiveReconciler;
use crate::topology::{ReconcileRun, Topology};
use anyhow::{anyhow, Context, Result};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Loads and runs a topology file as `instance_id`, serving `/metrics` and health on
/// `http_address` when given.
/// `on_routing_change` says what to do when a pipeline's routing differs from its state's.
pub fn run(
    path: &Path,
    instance_id: &str,
    http_address: Option<SocketAddr>,
    on_routing_change: OnChange,
) -> Result<()> {
    let topology = config::load_file(path)?;
    if topology
        .reconcile
        .as_ref()
        .is_some_and(|r| r.run == ReconcileRun::Separately)
    {
        tracing::info!(
            "`reconcile.run: separately`: this instance runs no reconciler; deploy `tally reconcile live` with the same topology"
        );
    }
    run_topology(Arc::new(topology), instance_id, http_address, on_routing_change)
}

/// Runs the live reconciler of a topology file as its own application (`reconcile.run:
/// separately`): group, transactional ids and stores `<application_id>-reconcile`.
pub fn reconcile_live(
    path: &Path,
    instance_id: &str,
    http_address: Option<SocketAddr>,
    on_routing_change: OnChange,
) -> Result<()> {
    let topology = config::load_file(path)?;
    let view = topology.reconciler_view().map_err(|why| anyhow!("{why}"))?;
    run_topology(Arc::new(view), instance_id, http_address, on_routing_change)
}

fn run_topology(
    topology: Arc<Topology>,
    instance_id: &str,
    http_address: Option<SocketAddr>,
    on_routing_change: OnChange,
) -> Result<()> {
    let metrics = Arc::new(Metrics::new(&topology.application_id).context("registering metrics")?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let shutdown = Shutdown::default();
    // Handlers are in place before "tally starting" is logged: a SIGTERM from then on is graceful.
    install_signal_handlers(&rt, shutdown.clone())?;
    tracing::info!(application_id = %topology.application_id, instance_id, bootstrap = %topology.kafka.bootstrap_servers, "tally starting");
    // A stream thread silent for longer than the group allows between polls is stuck.
    let stall_limit = topology
        .kafka
        .properties
        .get("max.poll.interval.ms")
        .and_then(|ms| ms.parse().ok())
        .map_or(crate::engine::health::DEFAULT_STALL_LIMIT, Duration::from_millis);
    let health = Arc::new(Health::with_stall_limit(
        topology.processing.threads,
        topology.id_mapping.is_some(),
        stall_limit,
    ));
    let queries = Arc::new(crate::queries::Shared::default());
    if topology.queries.is_some() && http_address.is_none() {
        tracing::warn!("`queries` is enabled but there is no --http-address to serve them on");
    }
    rt.block_on(async {
        let server = match http_address {
            Some(addr) => {
                let listener = crate::http::bind(addr).await?;
                let api = crate::http::queries::QueryApi::new(
                    topology.clone(),
                    instance_id,
                    queries.clone(),
                    metrics.clone(),
                );
                let server = crate::http::serve(
                    listener,
                    metrics.clone(),
                    health.clone(),
                    Arc::new(api),
                    shutdown.clone(),
                );
                Some(tokio::spawn(server))
            }
            None => None,
        };
        let result = engine::run(
            topology.clone(),
            instance_id,
            engine::Cluster::Kafka,
            on_routing_change,
            Arc::new(LiveReconciler),
            metrics.clone(),
            health.clone(),
            queries,
            shutdown.clone(),
        )
        .await;
        // The engine may stop on an error before a signal: stop the server too.
        shutdown.trigger();
        if let Some(server) = server {
            server.await.context("HTTP server panicked")??;
        }
        result
    })?;
    log_totals(&topology, &metrics);
    Ok(())
}

fn log_totals(t: &Topology, metrics: &Metrics) {
    let totals: Totals = metrics.totals(&t.pipeline_names());
    let reasons: Vec<String> = totals
        .dead_lettered
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| format!("{r}={n}"))
        .collect();
    tracing::info!(
        application_id = %t.application_id,
        records_in = totals.records_in,
        records_out = totals.records_out,
        duplicates = totals.duplicates,
        stale = totals.stale,
        dead_lettered = totals.dead_lettered_total(),
        dead_letter_reasons = %reasons.join(","),
        idmap_mappings = metrics.idmap_mappings.get(),
        idmap_pending = metrics.idmap_pending.get(),
        transactions = metrics.transactions_committed.get(),
        commit_seconds = format!("{:.3}", metrics.commit_latency.get_sample_sum()),
        "tally stopped"
    );
}

/// SIGTERM and Ctrl-C trigger `shutdown`: commit, leave the group, exit 0.
fn install_signal_handlers(rt: &tokio::runtime::Runtime, shutdown: Shutdown) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let _runtime = rt.enter();
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    rt.spawn(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = interrupt.recv() => {},
        }
        tracing::info!("stop requested: committing the open transaction and leaving the group");
        shutdown.trigger();
    });
    Ok(())
}

/// The host name, as the default instance id (stable across restarts on one host).
pub fn default_instance_id() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "tally-0".to_string())
}
