//! Per-record decisions: decode, key, route, deduplicate. No Kafka here, only store access.

pub mod correlation;
pub mod dedup;
pub mod fields;
pub mod idmap;
pub mod merge;
pub mod pipeline;
pub mod rejection;
pub mod state;
pub mod version_gate;

pub use pipeline::{Decision, Input, PipelineProcessor, Processed};
pub use rejection::{Reason, Rejection};
