//! The separately run reconciler's watch of tally's inputs, as a reconciler task runs it.

use super::{store_failed, ReconcileTask, ALERTS_PER_SCAN};
use crate::engine::emit::ProcessError;
use crate::engine::errors::{self, EngineError, ErrorClass};
use crate::engine::producer::TxnProducer;
use crate::metrics::events::InputsWatched;
use crate::reconcile::watch::WatchReport;
use rdkafka::error::KafkaError;
use std::time::Instant;

impl ReconcileTask {
    /// Scans the watched inputs (separately run reconciler only) and alerts on what is stuck
    /// there; true when it wrote alerts or watch positions. A cluster that does not answer
    /// skips this scan's watch, logged once per scan interval.
    pub(super) fn watch(&mut self, now_ms: i64, producer: &mut TxnProducer) -> Result<bool, ProcessError> {
        let Some(watcher) = &mut self.watcher else {
            return Ok(false);
        };
        let report = match watcher.scan(&mut self.store, now_ms, ALERTS_PER_SCAN as usize) {
            Ok(report) => report,
            Err(e) if refused(&e) => {
                return Err(ProcessError::Engine(EngineError::Config(e.context(
                    "the reconciler watching tally's inputs: the Kafka cluster refused this principal; grant it Read \
                     and Describe on tally's source and repartition topics and Describe on group `<application_id>` \
                     (README.md, \"Secured clusters\"), then start it again",
                ))))
            }
            Err(e) if !errors::worth_waiting(&e) && !is_kafka(&e) => return Err(store_failed(e)),
            Err(e) => {
                if self
                    .watch_failed
                    .is_none_or(|t| t.elapsed() >= self.settings.scan_interval)
                {
                    tracing::warn!(task = %self.label, error = %format!("{e:#}"), "cannot watch tally's inputs this scan; trying again at the next");
                    self.watch_failed = Some(Instant::now());
                }
                return Ok(false);
            }
        };
        let writer = self.alerts();
        for u in &report.stuck {
            writer.unprocessed(u, now_ms, producer)?;
        }
        self.publish_watch(&report);
        Ok(!report.stuck.is_empty() || report.changed)
    }

    fn publish_watch(&self, r: &WatchReport) {
        self.metrics.emit(InputsWatched {
            task: &self.label,
            unconsumed: r.unconsumed,
            longest_wait_ms: r.longest_wait_ms,
        });
    }
}

/// True when the cluster refused the principal somewhere in `e`'s chain.
fn refused(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<KafkaError>())
        .any(|k| errors::classify(k) == ErrorClass::Refused)
}

/// True when `e` comes from a Kafka call (a store failure does not).
fn is_kafka(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<KafkaError>().is_some())
}
