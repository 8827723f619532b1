//! What the engine and the reconciler report, as typed events: one struct per event, its labels
//! as named fields, and `emit` as the one place that turns it into Prometheus series (Vector's
//! `internal_events` idea). A call site names every label, so two can never be swapped.

use super::Metrics;
use crate::processors::Reason;
use prometheus::IntGauge;
use std::collections::BTreeMap;

/// A metric update.
pub trait Event {
    /// Applies the event to `metrics`.
    fn emit(self, metrics: &Metrics);
}

impl Metrics {
    /// Records `event`.
    pub fn emit(&self, event: impl Event) {
        event.emit(self);
    }
}

/// A pipeline task's transaction committed with these counts.
pub struct PipelineCommitted<'a> {
    /// The pipeline.
    pub pipeline: &'a str,
    /// Records consumed from its source.
    pub records_in: u64,
    /// Records forwarded to its repartition topic.
    pub repartitioned: u64,
    /// Records written to its output.
    pub records_out: u64,
    /// Duplicates dropped.
    pub duplicates: u64,
    /// Stale versions dropped.
    pub stale: u64,
    /// Outputs emitted pending-create.
    pub pending_created: u64,
    /// Dedup keys deleted by expiry.
    pub expired_keys: u64,
    /// Records of a co-partitioned source on a partition their key does not belong to.
    pub misplaced: u64,
    /// Records dead-lettered, by reason.
    pub dead_lettered: &'a BTreeMap<Reason, u64>,
}

impl Event for PipelineCommitted<'_> {
    fn emit(self, m: &Metrics) {
        let p = [self.pipeline];
        m.records_in.with_label_values(&p).inc_by(self.records_in);
        m.records_repartitioned.with_label_values(&p).inc_by(self.repartitioned);
        m.records_out.with_label_values(&p).inc_by(self.records_out);
        m.duplicates.with_label_values(&p).inc_by(self.duplicates);
        m.stale.with_label_values(&p).inc_by(self.stale);
        m.pending_created.with_label_values(&p).inc_by(self.pending_created);
        m.expired_keys.with_label_values(&p).inc_by(self.expired_keys);
        m.misplaced.with_label_values(&p).inc_by(self.misplaced);
        for (reason, n) in self.dead_lettered {
            m.dead_lettered
                .with_label_values(&[self.pipeline, reason.as_str()])
                .inc_by(*n);
        }
    }
}

/// A store was wiped or moved aside, to be rebuilt from its changelog.
pub struct StoreRebuilt<'a> {
    /// The store.
    pub store: &'a str,
    /// Why (`corrupt_database`, `offset_missing`, …).
    pub reason: &'static str,
}

impl Event for StoreRebuilt<'_> {
    fn emit(self, m: &Metrics) {
        m.store_rebuilds.with_label_values(&[self.store, self.reason]).inc();
    }
}

/// Changelog records applied to a restoring store.
pub struct RecordsRestored<'a> {
    /// The store.
    pub store: &'a str,
    /// How many.
    pub records: u64,
}

impl Event for RecordsRestored<'_> {
    fn emit(self, m: &Metrics) {
        m.restored_records.with_label_values(&[self.store]).inc_by(self.records);
    }
}

/// Changelog records applied to a standby store.
pub struct StandbyRecordsApplied<'a> {
    /// The store.
    pub store: &'a str,
    /// How many.
    pub records: u64,
}

impl Event for StandbyRecordsApplied<'_> {
    fn emit(self, m: &Metrics) {
        m.standby_records.with_label_values(&[self.store]).inc_by(self.records);
    }
}

/// The restore of one store partition, whose remaining records are set as it goes.
pub struct RestoreOf<'a> {
    /// The store.
    pub store: &'a str,
    /// The changelog partition.
    pub partition: i32,
}

impl RestoreOf<'_> {
    /// The gauge of the records this restore still has to apply.
    pub fn remaining(self, m: &Metrics) -> IntGauge {
        m.restore_remaining
            .with_label_values(&[self.store, self.partition.to_string().as_str()])
    }
}

/// The live reconciler wrote an alert record.
pub struct AlertWritten<'a> {
    /// `stuck_event`, `failed_event` or `unprocessed_event`.
    pub kind: &'a str,
}

impl Event for AlertWritten<'_> {
    fn emit(self, m: &Metrics) {
        m.reconcile_alerts.with_label_values(&[self.kind]).inc();
    }
}

/// An HTTP query of the stores was answered.
pub struct QueryAnswered<'a> {
    /// `found`, `not_found`, `redirected`, `unavailable`, …
    pub outcome: &'a str,
}

impl Event for QueryAnswered<'_> {
    fn emit(self, m: &Metrics) {
        m.queries.with_label_values(&[self.outcome]).inc();
    }
}

/// A reconciler task's scan of its open events.
pub struct OpenEventsScanned<'a> {
    /// The reconciler task.
    pub task: &'a str,
    /// Open events.
    pub open: u64,
    /// Open events older than the threshold.
    pub stuck: u64,
    /// Age of the oldest open event, ms.
    pub oldest_age_ms: i64,
    /// Failed events neither redriven nor acknowledged.
    pub failed: u64,
    /// Open events whose stored entry this version cannot read.
    pub unreadable: u64,
}

impl Event for OpenEventsScanned<'_> {
    fn emit(self, m: &Metrics) {
        let t = [self.task];
        m.reconcile_open_events.with_label_values(&t).set(gauge(self.open));
        m.reconcile_stuck_events.with_label_values(&t).set(gauge(self.stuck));
        m.reconcile_oldest_open_age_seconds
            .with_label_values(&t)
            .set(self.oldest_age_ms as f64 / 1000.0);
        m.reconcile_failed_events.with_label_values(&t).set(gauge(self.failed));
        m.reconcile_unreadable_events
            .with_label_values(&t)
            .set(gauge(self.unreadable));
    }
}

/// A reconciler task's scan of tally's inputs against its group's offsets.
pub struct InputsWatched<'a> {
    /// The reconciler task.
    pub task: &'a str,
    /// Records appended that tally's group has not consumed.
    pub unconsumed: u64,
    /// The longest a partition's head record has waited, ms.
    pub longest_wait_ms: i64,
}

impl Event for InputsWatched<'_> {
    fn emit(self, m: &Metrics) {
        let t = [self.task];
        m.reconcile_unconsumed_records
            .with_label_values(&t)
            .set(gauge(self.unconsumed));
        m.reconcile_longest_wait_seconds
            .with_label_values(&t)
            .set(self.longest_wait_ms as f64 / 1000.0);
    }
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `metric`'s series whose labels are exactly `labels` (name, value).
    fn value(m: &Metrics, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let family = m
            .registry()
            .gather()
            .into_iter()
            .find(|f| f.name() == format!("tally_{metric}"))?;
        let counter = family.get_field_type() == prometheus::proto::MetricType::COUNTER;
        family
            .get_metric()
            .iter()
            .find(|s| {
                let got: Vec<(&str, &str)> = s
                    .get_label()
                    .iter()
                    .map(|l| (l.name(), l.value()))
                    .filter(|(name, _)| *name != "application_id")
                    .collect();
                got.len() == labels.len() && labels.iter().all(|want| got.contains(want))
            })
            .map(|s| {
                if counter {
                    s.get_counter().get_value()
                } else {
                    s.get_gauge().get_value()
                }
            })
    }

    #[test]
    fn a_commit_counts_each_figure_under_its_pipeline_and_reason() {
        let m = Metrics::new("app").expect("metrics");
        let dead = BTreeMap::from([(Reason::InvalidJson, 2), (Reason::MissingKeyField, 1)]);
        m.emit(PipelineCommitted {
            pipeline: "payments",
            records_in: 10,
            repartitioned: 9,
            records_out: 6,
            duplicates: 3,
            stale: 1,
            pending_created: 4,
            expired_keys: 5,
            misplaced: 7,
            dead_lettered: &dead,
        });
        let p = [("pipeline", "payments")];
        assert_eq!(value(&m, "records_in_total", &p), Some(10.0));
        assert_eq!(value(&m, "records_repartitioned_total", &p), Some(9.0));
        assert_eq!(value(&m, "records_out_total", &p), Some(6.0));
        assert_eq!(value(&m, "duplicates_total", &p), Some(3.0));
        assert_eq!(value(&m, "stale_total", &p), Some(1.0));
        assert_eq!(value(&m, "pending_create_total", &p), Some(4.0));
        assert_eq!(value(&m, "expired_keys_total", &p), Some(5.0));
        assert_eq!(value(&m, "records_misplaced_total", &p), Some(7.0));
        let reason = |r: Reason| [("pipeline", "payments"), ("reason", r.as_str())];
        assert_eq!(
            value(&m, "dead_lettered_total", &reason(Reason::InvalidJson)),
            Some(2.0)
        );
        assert_eq!(
            value(&m, "dead_lettered_total", &reason(Reason::MissingKeyField)),
            Some(1.0)
        );
    }

    #[test]
    fn two_label_events_keep_each_value_under_its_own_label() {
        let m = Metrics::new("app").expect("metrics");
        m.emit(StoreRebuilt {
            store: "payments-dedup",
            reason: "uncommitted",
        });
        assert_eq!(
            value(
                &m,
                "store_rebuilds_total",
                &[("store", "payments-dedup"), ("reason", "uncommitted")]
            ),
            Some(1.0),
            "a swapped pair would be store=\"uncommitted\""
        );
        RestoreOf {
            store: "payments-dedup",
            partition: 3,
        }
        .remaining(&m)
        .set(42);
        assert_eq!(
            value(
                &m,
                "restore_remaining_records",
                &[("store", "payments-dedup"), ("partition", "3")]
            ),
            Some(42.0)
        );
    }

    #[test]
    fn reconciler_scans_set_their_gauges_in_seconds_and_records() {
        let m = Metrics::new("app").expect("metrics");
        m.emit(OpenEventsScanned {
            task: "trace-0",
            open: 7,
            stuck: 2,
            oldest_age_ms: 1500,
            failed: 1,
            unreadable: 3,
        });
        m.emit(InputsWatched {
            task: "trace-0",
            unconsumed: 11,
            longest_wait_ms: 2500,
        });
        m.emit(AlertWritten { kind: "failed_event" });
        m.emit(QueryAnswered { outcome: "redirected" });
        m.emit(RecordsRestored { store: "s", records: 5 });
        m.emit(StandbyRecordsApplied { store: "s", records: 6 });
        let t = [("task", "trace-0")];
        assert_eq!(value(&m, "reconcile_open_events", &t), Some(7.0));
        assert_eq!(value(&m, "reconcile_stuck_events", &t), Some(2.0));
        assert_eq!(value(&m, "reconcile_oldest_open_age_seconds", &t), Some(1.5));
        assert_eq!(value(&m, "reconcile_failed_events", &t), Some(1.0));
        assert_eq!(value(&m, "reconcile_unreadable_events", &t), Some(3.0));
        assert_eq!(value(&m, "reconcile_unconsumed_records", &t), Some(11.0));
        assert_eq!(value(&m, "reconcile_longest_wait_seconds", &t), Some(2.5));
        assert_eq!(
            value(&m, "reconcile_alerts_total", &[("kind", "failed_event")]),
            Some(1.0)
        );
        assert_eq!(value(&m, "queries_total", &[("outcome", "redirected")]), Some(1.0));
        assert_eq!(value(&m, "restored_records_total", &[("store", "s")]), Some(5.0));
        assert_eq!(value(&m, "standby_records_total", &[("store", "s")]), Some(6.0));
    }
}
