//! `tally reconcile ack`: closes failed or stuck events with a recorded reason.

use crate::config;
use crate::engine::credentials;
use crate::recover::acknowledge;
use anyhow::Result;
use std::path::PathBuf;

/// Arguments of `tally reconcile ack`.
#[derive(Debug, clap::Args)]
pub struct AckArgs {
    /// The topology YAML file: its trace topic and Kafka settings.
    pub topology: PathBuf,
    /// The event to close: `event_id` of its alert or of `tally inspect` (repeatable).
    #[arg(long = "event-id", value_name = "ID", required = true)]
    pub event_ids: Vec<String>,
    /// Why it may stay as it is (recorded with the acknowledgement), e.g. a ticket.
    #[arg(long)]
    pub reason: String,
    /// Who acknowledges (recorded); defaults to $USER.
    #[arg(long, env = "USER", default_value = "unknown")]
    pub by: String,
}

/// Writes the acknowledgements and says what was done.
pub fn ack(args: &AckArgs) -> Result<bool> {
    let topology = config::load_file(&args.topology)?;
    credentials::probe_topology(&topology, &args.topology)?;
    acknowledge::acknowledge(&topology, &args.event_ids, &args.reason, &args.by)?;
    println!(
        "acknowledged {} event(s) by {}; the live reconciler closes them as it reads the trace topic",
        args.event_ids.len(),
        args.by
    );
    Ok(true)
}
