//! Trace records: for each event and pipeline node, what happened to it, written to the trace
//! topic inside the same transaction as the outputs, so the trace never disagrees with them.
//!
//! The format is versioned JSON (`docs/trace-format.md`) so upstream senders and downstream
//! sinks can write their own records to the same topic.

use serde::{Deserialize, Serialize};

/// The format tag of every record this version writes.
pub const FORMAT: &str = "tally.trace/v1";

/// Where an event is in a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// The node consumed it.
    Received,
    /// The node started its strategy on it.
    Processing,
    /// The node finished with it (emitted, or dropped for a reason in `outcome`).
    Completed,
    /// The node could not process it (`outcome` says why).
    Failed,
}

impl Status {
    /// True for the statuses that end an event's passage through a node.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed)
    }
}

/// Why an event ended the way it did, where it matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    /// Dropped: its idempotency key (or increment id) was seen before.
    Duplicate,
    /// Dropped: its version was not higher than the entity's.
    Stale,
    /// Sent to the dead-letter topic.
    DeadLetter,
    /// Emitted without a target system's id.
    PendingCreate,
    /// Its dead letter was sent back to the source (`tally redrive`); the copy is a new event.
    Redriven,
    /// An operator acknowledged its failure (`tally reconcile ack`, with a `reason`).
    Acknowledged,
}

/// How many records a node writes per event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// RECEIVED, PROCESSING and the terminal status.
    All,
    /// Only the terminal status.
    Terminal,
}

/// One trace record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceRecord<'a> {
    /// Always `FORMAT`.
    pub format: &'static str,
    /// `<topic>/<partition>/<offset>` of the event in its source topic.
    pub event_id: &'a str,
    /// The business idempotency key, when known at this node.
    pub idempotency_key: Option<&'a str>,
    /// The key's field values, when its text alone may not tell them (two events whose fields
    /// differ only in where a separator falls): what keeps them apart in a reconciliation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key_fields: Option<Vec<String>>,
    /// The correlation id.
    pub correlation_id: &'a str,
    /// `<application_id>/<pipeline>` (`/repartition` for the re-keying node).
    pub node: &'a str,
    /// Where the event is.
    pub status: Status,
    /// Why, for terminal statuses that need a reason.
    pub outcome: Option<Outcome>,
    /// When (ms since the Unix epoch).
    pub timestamp_ms: i64,
    /// An operator's words, on an acknowledgement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'a str>,
}

/// A node's trace settings.
#[derive(Debug, Clone)]
pub struct TraceSink {
    /// The trace topic.
    pub topic: String,
    /// What to write.
    pub level: Level,
    /// This node's name.
    pub node: String,
}

impl TraceSink {
    /// The record's message key and JSON value, or `None` when the level leaves it out. Keyed by
    /// event id so all records of one event share a partition.
    pub fn encode(&self, record: &TraceRecord<'_>) -> Option<(String, Vec<u8>)> {
        if self.level == Level::Terminal && !record.status.is_terminal() {
            return None;
        }
        serde_json::to_vec(record)
            .ok()
            .map(|v| (record.event_id.to_string(), v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: Status, outcome: Option<Outcome>) -> TraceRecord<'static> {
        TraceRecord {
            format: FORMAT,
            event_id: "payments/0/42",
            idempotency_key: Some("PAY-1:PAID"),
            idempotency_key_fields: None,
            correlation_id: "corr-1",
            node: "app/payments",
            status,
            outcome,
            timestamp_ms: 1_700_000_000_000,
            reason: None,
        }
    }

    #[test]
    fn records_are_versioned_json_keyed_by_event() {
        let sink = TraceSink {
            topic: "t".into(),
            level: Level::All,
            node: "app/payments".into(),
        };
        let (key, value) = sink
            .encode(&record(Status::Completed, Some(Outcome::Duplicate)))
            .expect("written");
        assert_eq!(key, "payments/0/42");
        let v: serde_json::Value = serde_json::from_slice(&value).expect("json");
        assert_eq!(v["format"], "tally.trace/v1");
        assert_eq!(v["status"], "COMPLETED");
        assert_eq!(v["outcome"], "DUPLICATE");
        assert_eq!(v["idempotency_key"], "PAY-1:PAID");
    }

    #[test]
    fn terminal_level_writes_only_terminal_statuses() {
        let sink = TraceSink {
            topic: "t".into(),
            level: Level::Terminal,
            node: "n".into(),
        };
        assert!(sink.encode(&record(Status::Received, None)).is_none());
        assert!(sink.encode(&record(Status::Processing, None)).is_none());
        assert!(sink
            .encode(&record(Status::Failed, Some(Outcome::DeadLetter)))
            .is_some());
    }
}
