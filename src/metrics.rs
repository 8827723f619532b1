//! Prometheus metrics of one instance (`tally_` prefix, base units, no per-event labels).

pub mod client_statistics;
pub mod consumer_lag;
pub mod events;
pub mod held_back;
pub mod store_gauges;

use crate::processors::Reason;
use prometheus::{
    GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use std::collections::BTreeMap;

/// Every metric tally exports, registered in its own registry.
pub struct Metrics {
    registry: Registry,
    /// Records consumed and committed, per pipeline.
    pub records_in: IntCounterVec,
    /// Records forwarded through a repartition topic, per pipeline.
    pub records_repartitioned: IntCounterVec,
    /// Records written to the output, per pipeline.
    pub records_out: IntCounterVec,
    /// Records dropped as duplicates, per pipeline.
    pub duplicates: IntCounterVec,
    /// Records dropped as stale versions, per pipeline.
    pub stale: IntCounterVec,
    /// Records sent to the dead-letter topic, per pipeline and reason.
    pub dead_lettered: IntCounterVec,
    /// Committed transactions.
    pub transactions_committed: IntCounter,
    /// Aborted transactions.
    pub transactions_aborted: IntCounter,
    /// Records the consumer handed out again after they were processed, skipped.
    pub redelivered_skipped: IntCounter,
    /// Time from commit request to commit done.
    pub commit_latency: Histogram,
    /// Changelog records applied during restore, per store.
    pub restored_records: IntCounterVec,
    /// Stores wiped and rebuilt from their changelog, per store and reason.
    pub store_rebuilds: IntCounterVec,
    /// Changelog records still to restore, per store (0 when not restoring).
    pub restore_remaining: IntGaugeVec,
    /// Records between a task's consumer position and its partition's end, per topic and task.
    pub consumer_lag: IntGaugeVec,
    /// Seconds an assigned partition's last stable offset has stood still below its high
    /// watermark (an open transaction holds the partition back), per topic and task.
    pub input_held_back: IntGaugeVec,
    /// Estimated keys per store and task.
    pub store_keys: IntGaugeVec,
    /// Bytes per store and task: live SST files plus unflushed memtables.
    pub store_size: IntGaugeVec,
    /// Rebalance events seen by stream threads.
    pub rebalances: IntCounter,
    /// Partitions of the consumed topics that no member of the stable group owns.
    pub unowned_partitions: IntGauge,
    /// Times a stream thread of this instance left and rejoined the group to get unowned
    /// partitions assigned.
    pub forced_rejoins: IntCounter,
    /// Dedup keys deleted by expiry, per pipeline.
    pub expired_keys: IntCounterVec,
    /// HTTP queries of the stores, per outcome (`found`, `not_found`, `redirected`, …).
    pub queries: IntCounterVec,
    /// Events emitted pending-create, per pipeline.
    pub pending_created: IntCounterVec,
    /// Records of a co-partitioned source on a partition their key does not belong to.
    pub misplaced: IntCounterVec,
    /// Id links in the global ID-mapping store.
    pub idmap_mappings: IntGauge,
    /// Pending-create markers whose mapping has not arrived.
    pub idmap_pending: IntGauge,
    /// Standby task stores held by this instance.
    pub standby_tasks: IntGauge,
    /// Changelog records applied to standby stores, per store.
    pub standby_records: IntCounterVec,
    /// Open events on the trace topic at the last scan, per reconciler task.
    pub reconcile_open_events: IntGaugeVec,
    /// Open events older than the threshold at the last scan, per reconciler task.
    pub reconcile_stuck_events: IntGaugeVec,
    /// Age of the oldest open event at the last scan, per reconciler task.
    pub reconcile_oldest_open_age_seconds: GaugeVec,
    /// Alert records written, per kind (`stuck_event`, `failed_event`, `unprocessed_event`).
    pub reconcile_alerts: IntCounterVec,
    /// Failed (dead-lettered) events neither redriven nor acknowledged, per reconciler task.
    pub reconcile_failed_events: IntGaugeVec,
    /// Open events whose stored entry this version cannot read, per reconciler task.
    pub reconcile_unreadable_events: IntGaugeVec,
    /// Records appended to tally's inputs beyond its group's committed offsets, per reconciler
    /// task (the separately run reconciler's watch).
    pub reconcile_unconsumed_records: IntGaugeVec,
    /// The longest a watched partition has waited at one unconsumed record, per reconciler task.
    pub reconcile_longest_wait_seconds: GaugeVec,
}

/// Totals for a run summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    /// Records consumed.
    pub records_in: u64,
    /// Records emitted.
    pub records_out: u64,
    /// Duplicates dropped.
    pub duplicates: u64,
    /// Stale versions dropped.
    pub stale: u64,
    /// Dead-lettered records by reason.
    pub dead_lettered: BTreeMap<&'static str, u64>,
}

impl Totals {
    /// All dead-lettered records.
    pub fn dead_lettered_total(&self) -> u64 {
        self.dead_lettered.values().sum()
    }
}

impl Metrics {
    /// Registers every metric with the `application_id` label.
    pub fn new(application_id: &str) -> prometheus::Result<Self> {
        let labels = [("application_id".to_string(), application_id.to_string())].into();
        let registry = Registry::new_custom(Some("tally".into()), Some(labels))?;
        let counter_vec = |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<IntCounterVec> {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let records_in = counter_vec("records_in_total", "Records consumed and committed", &["pipeline"])?;
        let records_repartitioned = counter_vec(
            "records_repartitioned_total",
            "Records forwarded through a repartition topic",
            &["pipeline"],
        )?;
        let records_out = counter_vec(
            "records_out_total",
            "Records written to the output topic",
            &["pipeline"],
        )?;
        let duplicates = counter_vec("duplicates_total", "Records dropped as duplicates", &["pipeline"])?;
        let stale = counter_vec("stale_total", "Records dropped as stale versions", &["pipeline"])?;
        let dead_lettered = counter_vec(
            "dead_lettered_total",
            "Records sent to the dead-letter topic",
            &["pipeline", "reason"],
        )?;
        let restored_records = counter_vec(
            "restored_records_total",
            "Changelog records applied while restoring",
            &["store"],
        )?;
        let store_rebuilds = counter_vec(
            "store_rebuilds_total",
            "Task stores wiped and rebuilt from their changelog (corrupt database or offset, changelog deleted or recreated)",
            &["store", "reason"],
        )?;
        let standby_records = counter_vec(
            "standby_records_total",
            "Changelog records applied to standby stores",
            &["store"],
        )?;
        let expired_keys = counter_vec(
            "expired_keys_total",
            "Dedup keys deleted after their retention",
            &["pipeline"],
        )?;
        let queries = counter_vec("queries_total", "HTTP queries of the stores, by outcome", &["outcome"])?;
        let misplaced = counter_vec(
            "records_misplaced_total",
            "Records of a co-partitioned source on a partition their key does not belong to (their duplicates may pass)",
            &["pipeline"],
        )?;
        let pending_created = counter_vec(
            "pending_create_total",
            "Events emitted without the target system's id",
            &["pipeline"],
        )?;
        let counter = |name: &str, help: &str| -> prometheus::Result<IntCounter> {
            let c = IntCounter::new(name, help)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let transactions_committed = counter("transactions_committed_total", "Committed Kafka transactions")?;
        let transactions_aborted = counter("transactions_aborted_total", "Aborted Kafka transactions")?;
        let redelivered_skipped = counter(
            "redelivered_skipped_total",
            "Records the consumer handed out again after they were processed; skipped",
        )?;
        let rebalances = counter("rebalances_total", "Partition assignment changes seen")?;
        let forced_rejoins = counter(
            "forced_rejoins_total",
            "Group rejoins this instance made to get unowned partitions assigned",
        )?;
        let unowned_partitions = IntGauge::new(
            "group_unowned_partitions",
            "Partitions of the consumed topics no member of the stable group owns",
        )?;
        registry.register(Box::new(unowned_partitions.clone()))?;
        let commit_latency = Histogram::with_opts(
            HistogramOpts::new(
                "commit_latency_seconds",
                "Duration of send_offsets + commit_transaction",
            )
            .buckets(prometheus::exponential_buckets(0.001, 2.0, 14)?),
        )?;
        registry.register(Box::new(commit_latency.clone()))?;
        let restore_remaining = IntGaugeVec::new(
            Opts::new("restore_remaining_records", "Changelog records still to restore"),
            &["store", "partition"],
        )?;
        registry.register(Box::new(restore_remaining.clone()))?;
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<IntGaugeVec> {
            let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let consumer_lag = gauge_vec(
            "consumer_lag_records",
            "Records between the consumer position and the partition's last stable offset",
            &["topic", "task"],
        )?;
        let input_held_back = gauge_vec(
            "input_held_back_seconds",
            "Seconds an open transaction has held an input partition back: its last stable offset stood still below the high watermark",
            &["topic", "task"],
        )?;
        let store_keys = gauge_vec(
            "store_keys",
            "Estimated keys in a task's store (RocksDB estimate-num-keys)",
            &["store", "task"],
        )?;
        let store_size = gauge_vec(
            "store_size_bytes",
            "Live SST files plus unflushed memtables of a task's store",
            &["store", "task"],
        )?;
        let idmap_mappings = IntGauge::new("idmap_mappings", "Id links in the global ID-mapping store")?;
        registry.register(Box::new(idmap_mappings.clone()))?;
        let idmap_pending = IntGauge::new(
            "idmap_pending",
            "Pending-create markers still waiting for their mapping",
        )?;
        registry.register(Box::new(idmap_pending.clone()))?;
        let reconcile_open_events = gauge_vec(
            "reconcile_open_events",
            "Open events at the last reconciler scan",
            &["task"],
        )?;
        let reconcile_stuck_events = gauge_vec(
            "reconcile_stuck_events",
            "Open events older than the threshold at the last reconciler scan",
            &["task"],
        )?;
        let reconcile_oldest_open_age_seconds = GaugeVec::new(
            Opts::new(
                "reconcile_oldest_open_age_seconds",
                "Age of the oldest open event at the last reconciler scan",
            ),
            &["task"],
        )?;
        registry.register(Box::new(reconcile_oldest_open_age_seconds.clone()))?;
        let reconcile_alerts = counter_vec(
            "reconcile_alerts_total",
            "Alert records written by the live reconciler, per kind",
            &["kind"],
        )?;
        let reconcile_failed_events = gauge_vec(
            "reconcile_failed_events",
            "Failed (dead-lettered) events neither redriven nor acknowledged at the last reconciler scan",
            &["task"],
        )?;
        let reconcile_unreadable_events = gauge_vec(
            "reconcile_unreadable_events",
            "Open events in the reconciler store this version cannot read at the last reconciler scan",
            &["task"],
        )?;
        let reconcile_unconsumed_records = gauge_vec(
            "reconcile_unconsumed_records",
            "Records appended to tally's inputs beyond its group's committed offsets at the last watch",
            &["task"],
        )?;
        let reconcile_longest_wait_seconds = GaugeVec::new(
            Opts::new(
                "reconcile_longest_wait_seconds",
                "Longest time a watched input partition has waited at one unconsumed record",
            ),
            &["task"],
        )?;
        registry.register(Box::new(reconcile_longest_wait_seconds.clone()))?;
        let standby_tasks = IntGauge::new("standby_tasks", "Standby task stores held by this instance")?;
        registry.register(Box::new(standby_tasks.clone()))?;
        Ok(Self {
            registry,
            records_in,
            records_repartitioned,
            records_out,
            duplicates,
            stale,
            dead_lettered,
            transactions_committed,
            transactions_aborted,
            redelivered_skipped,
            commit_latency,
            restored_records,
            store_rebuilds,
            restore_remaining,
            consumer_lag,
            input_held_back,
            store_keys,
            store_size,
            rebalances,
            unowned_partitions,
            forced_rejoins,
            expired_keys,
            queries,
            pending_created,
            misplaced,
            idmap_mappings,
            idmap_pending,
            standby_tasks,
            standby_records,
            reconcile_open_events,
            reconcile_stuck_events,
            reconcile_unconsumed_records,
            reconcile_longest_wait_seconds,
            reconcile_failed_events,
            reconcile_unreadable_events,
            reconcile_oldest_open_age_seconds,
            reconcile_alerts,
        })
    }

    /// The registry, for an exporter.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Sums the record counters over every pipeline.
    pub fn totals(&self, pipelines: &[String]) -> Totals {
        let mut t = Totals::default();
        for p in pipelines {
            t.records_in += self.records_in.with_label_values(&[p]).get();
            t.records_out += self.records_out.with_label_values(&[p]).get();
            t.duplicates += self.duplicates.with_label_values(&[p]).get();
            t.stale += self.stale.with_label_values(&[p]).get();
            for r in Reason::ALL {
                let n = self.dead_lettered.with_label_values(&[p.as_str(), r.as_str()]).get();
                *t.dead_lettered.entry(r.as_str()).or_default() += n;
            }
        }
        t
    }
}
