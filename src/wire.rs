//! What tally writes for other programs to read, in one place: the header names of its outputs,
//! dead letters and repartitioned records, and the alert format. The trace record format is
//! `crate::trace`.

/// Header naming the systems whose id an output lacks (pending-create).
pub const PENDING_CREATE_HEADER: &str = "tally.pending_create";
/// Header carrying the business idempotency key on outputs.
pub const IDEMPOTENCY_KEY_HEADER: &str = "tally.idempotency_key";
/// Header carrying the idempotency key's field values as a JSON array of strings, on outputs
/// whose key text alone may not tell them (`X:Y`+`PAID` and `X`+`Y:PAID` both read `X:Y:PAID`).
pub const IDEMPOTENCY_KEY_FIELDS_HEADER: &str = "tally.idempotency_key.fields";
/// Machine-readable dead-letter reason.
pub const REASON_HEADER: &str = "tally.error.reason";
/// Human-readable detail of a dead-letter reason.
pub const DETAIL_HEADER: &str = "tally.error.detail";
/// On a dead letter whose original payload did not fit: the payload's size in bytes (the
/// original stays in the source topic at the `tally.source.*` coordinates).
pub const PAYLOAD_OMITTED_HEADER: &str = "tally.error.payload_omitted";
/// Where an event came from, on records crossing a repartition topic:
/// `<topic>/<partition>/<offset>` (a topic name cannot hold a `/`). One header, not three: each
/// header is a name to write, send, store and parse again for every repartitioned record.
pub const SOURCE_HEADER: &str = "tally.source";
/// Source topic of an event, on dead letters (and on repartitioned records written before
/// [`SOURCE_HEADER`], which are still read).
pub const SOURCE_TOPIC_HEADER: &str = "tally.source.topic";
/// Source partition of an event.
pub const SOURCE_PARTITION_HEADER: &str = "tally.source.partition";
/// Source offset of an event.
pub const SOURCE_OFFSET_HEADER: &str = "tally.source.offset";
/// The source record's own message key, on records crossing a repartition topic (a null value:
/// the source record had none), so a dead letter of the second stage carries the original key.
pub const SOURCE_KEY_HEADER: &str = "tally.source.key";

/// On a record `tally redrive` sent: the dead letter it was copied from.
pub const REDRIVEN_FROM_HEADER: &str = "tally.redriven_from";
/// The header a pipeline reads and writes the correlation id in unless it names another.
pub const DEFAULT_CORRELATION_HEADER: &str = "correlation_id";
/// Format tag of the live reconciler's alert records.
pub const ALERT_FORMAT: &str = "tally.alert/v1";
