//! `tally reconcile ack`: an operator closes failed or stuck events that will not be redriven,
//! saying why. The acknowledgement is a `COMPLETED`/`ACKNOWLEDGED` trace record with the reason
//! and who gave it, so it is kept where the event's other records are and any reconciler
//! reading the trace topic closes the event.

use crate::engine::clients;
use crate::engine::emit::now_ms;
use crate::topology::Topology;
use crate::trace::{Outcome, Status, TraceRecord, FORMAT};
use anyhow::{bail, Context, Result};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::time::Duration;

/// How long the acknowledgements may take to be written.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest reason accepted: a sentence or two, not a document.
const MAX_REASON_CHARS: usize = 1_000;

/// Writes one acknowledgement per event id to `t`'s trace topic, by `who`, with `reason`.
pub fn acknowledge(t: &Topology, event_ids: &[String], reason: &str, who: &str) -> Result<()> {
    let Some(trace) = &t.trace else {
        bail!("the topology has no `trace:` section: acknowledgements are trace records");
    };
    if reason.trim().is_empty() {
        bail!("give a --reason: it is recorded with the acknowledgement for whoever looks next");
    }
    if reason.chars().count() > MAX_REASON_CHARS {
        bail!("--reason is longer than {MAX_REASON_CHARS} characters; link to a ticket instead");
    }
    if let Some(bad) = event_ids.iter().find(|e| e.is_empty()) {
        bail!("an empty event id ({bad:?}); copy `event_id` from the alert or `tally inspect`");
    }
    let producer: BaseProducer = clients::base(t)
        .set("enable.idempotence", "true")
        .set("allow.auto.create.topics", "false")
        .create()
        .context("cannot create the producer; check `kafka.properties`")?;
    let node = format!("{}/ack", t.application_id);
    let reason = format!("{who}: {reason}");
    for event_id in event_ids {
        let record = TraceRecord {
            format: FORMAT,
            event_id,
            idempotency_key: None,
            idempotency_key_fields: None,
            correlation_id: "",
            node: &node,
            status: Status::Completed,
            outcome: Some(Outcome::Acknowledged),
            timestamp_ms: now_ms(),
            reason: Some(&reason),
        };
        let value = serde_json::to_vec(&record).context("encoding an acknowledgement")?;
        // Keyed by event id, like every trace record: the event's reconciler task reads it.
        producer
            .send(BaseRecord::to(&trace.topic).key(event_id).payload(&value))
            .map_err(|(e, _)| e)
            .with_context(|| format!("acknowledging {event_id} on `{}`", trace.topic))?;
    }
    producer.flush(WRITE_TIMEOUT).with_context(|| {
        format!(
            "writing the acknowledgements to `{}`; nothing is acknowledged unless this succeeds",
            trace.topic
        )
    })
}
