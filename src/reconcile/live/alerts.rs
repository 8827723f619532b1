//! The live reconciler's alert records (`tally.alert/v1` JSON on the alerts topic, keyed by
//! event id) and the warning line that goes with each.

use super::{store_failed, OpenEvent};
use crate::engine::emit::{header, ProcessError};
use crate::engine::producer::{Outgoing, TxnProducer};
use crate::metrics::events::AlertWritten;
use crate::metrics::Metrics;
use crate::processors::correlation;
use crate::reconcile::watch::Unprocessed;
use crate::trace::Status;
use crate::wire::{ALERT_FORMAT, DEFAULT_CORRELATION_HEADER};
use rdkafka::message::OwnedHeaders;
use serde::Serialize;

/// The alert record of a stuck or failed event on the trace topic.
#[derive(Debug, Serialize)]
struct TraceAlert<'a> {
    format: &'static str,
    kind: &'static str,
    event_id: &'a str,
    idempotency_key: Option<&'a str>,
    correlation_id: &'a str,
    node: &'a str,
    status: Status,
    first_seen_ms: i64,
    age_ms: i64,
    threshold_ms: u64,
    detected_ms: i64,
}

/// The alert record of a record tally has not consumed in time.
#[derive(Debug, Serialize)]
struct UnprocessedAlert<'a> {
    format: &'static str,
    kind: &'static str,
    #[serde(flatten)]
    event: &'a Unprocessed,
    age_ms: i64,
    threshold_ms: u64,
    detected_ms: i64,
}

/// Writes alerts into a task's open transaction.
pub(super) struct AlertWriter<'a> {
    /// The alerts topic.
    pub topic: &'a str,
    /// The reconciler's threshold, quoted in every alert.
    pub threshold_ms: u64,
    /// Where `tally_reconcile_alerts_total` is counted.
    pub metrics: &'a Metrics,
}

impl AlertWriter<'_> {
    /// An open event on the trace topic past the threshold, or a failed one: `age_ms` old.
    pub fn stuck(
        &self,
        key: &[u8],
        open: &OpenEvent,
        age_ms: i64,
        now_ms: i64,
        producer: &mut TxnProducer,
    ) -> Result<(), ProcessError> {
        // Trace records are bounded as they are read; entries stored before that may hold texts
        // too long for an alert that repeats them.
        let event_id = String::from_utf8_lossy(key);
        let event_id = correlation::carried(&event_id);
        let correlation_id = correlation::carried(&open.correlation_id);
        let idempotency_key = open.idempotency_key.as_deref().map(correlation::carried);
        let kind = match open.status {
            Status::Failed => "failed_event",
            _ => "stuck_event",
        };
        let alert = TraceAlert {
            format: ALERT_FORMAT,
            kind,
            event_id: &event_id,
            idempotency_key: idempotency_key.as_deref(),
            correlation_id: &correlation_id,
            node: &correlation::carried(&open.node),
            status: open.status,
            first_seen_ms: open.first_seen_ms,
            age_ms,
            threshold_ms: self.threshold_ms,
            detected_ms: now_ms,
        };
        self.send(event_id.as_bytes(), &correlation_id, kind, &alert, producer)?;
        tracing::info_span!("event", correlation_id = %correlation_id, idempotency_key = idempotency_key.as_deref())
            .in_scope(|| match open.status {
                Status::Failed => tracing::warn!(
                    event_id = %event_id,
                    node = %open.node,
                    "event failed (dead-lettered); it stays open until `tally redrive` sends it again or \
                     `tally reconcile ack` records why it may stay failed"
                ),
                _ => tracing::warn!(
                    event_id = %event_id,
                    node = %open.node,
                    age_s = age_ms / 1000,
                    "event received but not completed after the threshold"
                ),
            });
        Ok(())
    }

    /// A record of tally's inputs not consumed in time (the separately run reconciler's watch).
    pub fn unprocessed(&self, u: &Unprocessed, now_ms: i64, producer: &mut TxnProducer) -> Result<(), ProcessError> {
        let kind = "unprocessed_event";
        let alert = UnprocessedAlert {
            format: ALERT_FORMAT,
            kind,
            event: u,
            age_ms: now_ms.saturating_sub(u.appended_ms),
            threshold_ms: self.threshold_ms,
            detected_ms: now_ms,
        };
        self.send(u.event_id.as_bytes(), &u.correlation_id, kind, &alert, producer)?;
        tracing::info_span!("event", correlation_id = %u.correlation_id, idempotency_key = u.idempotency_key.as_deref())
            .in_scope(|| {
                tracing::warn!(
                    event_id = %u.event_id,
                    node = %u.node,
                    topic = %u.topic,
                    partition = u.partition,
                    offset = u.offset,
                    age_s = now_ms.saturating_sub(u.appended_ms) / 1000,
                    "event appended but not consumed by tally after the threshold"
                )
            });
        Ok(())
    }

    fn send(
        &self,
        key: &[u8],
        correlation_id: &str,
        kind: &'static str,
        alert: &impl Serialize,
        producer: &mut TxnProducer,
    ) -> Result<(), ProcessError> {
        let payload = serde_json::to_vec(alert).map_err(|e| store_failed(anyhow::Error::new(e)))?;
        let out = Outgoing {
            topic: self.topic,
            partition: None,
            key: Some(key),
            payload: Some(&payload),
            headers: Some(OwnedHeaders::new().insert(header(DEFAULT_CORRELATION_HEADER, correlation_id))),
        };
        producer.send(out).map_err(ProcessError::Kafka)?;
        self.metrics.emit(AlertWritten { kind });
        Ok(())
    }
}
