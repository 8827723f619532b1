//! Why a record goes to the dead-letter topic, as a stable machine-readable reason.

use std::fmt;

/// A dead-letter reason; `as_str` is written to the `tally.error.reason` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// Larger than `processing.max_record_bytes`.
    Oversize,
    /// No value, or a value that is not JSON.
    InvalidJson,
    /// JSON, but not an object.
    NotAnObject,
    /// A field of the key template is absent or null.
    MissingKeyField,
    /// A field of the key template is an object or array.
    NonScalarKeyField,
    /// A key field holds a value that would make two keys read alike (a write-back's system
    /// name with a separator of the mapping keys in it).
    InvalidKeyField,
    /// No route matches the record's `event_type`.
    NoRoute,
    /// The `overwrite` version is not an integer.
    InvalidVersion,
    /// A `merge` increment would grow the entity's state past its bound in bytes, or nests
    /// deeper than a merged state can hold.
    StateTooLarge,
    /// The entity's stored `merge` state cannot be read; the increment is kept here instead of
    /// being merged into an empty state.
    UnreadableState,
    /// What the record becomes on the way out (output, repartition record, trace record,
    /// changelog record) is larger than Kafka accepts.
    OutputTooLarge,
}

impl Reason {
    /// Every reason, for metrics initialisation and reports.
    pub const ALL: [Reason; 11] = [
        Reason::Oversize,
        Reason::InvalidJson,
        Reason::NotAnObject,
        Reason::MissingKeyField,
        Reason::NonScalarKeyField,
        Reason::InvalidKeyField,
        Reason::NoRoute,
        Reason::InvalidVersion,
        Reason::StateTooLarge,
        Reason::UnreadableState,
        Reason::OutputTooLarge,
    ];

    /// The stable name used in headers, metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Oversize => "oversize",
            Reason::InvalidJson => "invalid_json",
            Reason::NotAnObject => "not_an_object",
            Reason::MissingKeyField => "missing_key_field",
            Reason::NonScalarKeyField => "non_scalar_key_field",
            Reason::InvalidKeyField => "invalid_key_field",
            Reason::NoRoute => "no_route",
            Reason::InvalidVersion => "invalid_version",
            Reason::StateTooLarge => "state_too_large",
            Reason::UnreadableState => "unreadable_state",
            Reason::OutputTooLarge => "output_too_large",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rejected record: the reason and a sentence for the `tally.error.detail` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Machine-readable reason.
    pub reason: Reason,
    /// Human-readable detail.
    pub detail: String,
}

impl Rejection {
    /// A rejection with its detail.
    pub fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }
}
