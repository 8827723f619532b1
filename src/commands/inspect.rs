//! `tally inspect`: where one event went, from the topics, by idempotency key or correlation id.

use crate::config;
use crate::engine::credentials;
use crate::recover::inspect::{self, Query};
use anyhow::{Context, Result};
use std::path::PathBuf;

/// Arguments of `tally inspect`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("query").required(true)))]
pub struct InspectArgs {
    /// The topology YAML file: its trace, output and dead-letter topics and Kafka settings.
    pub topology: PathBuf,
    /// The event's business idempotency key, as outputs and trace records show it (`PAY-1:PAID`).
    #[arg(long, group = "query")]
    pub key: Option<String>,
    /// The event's correlation id.
    #[arg(long, group = "query")]
    pub correlation_id: Option<String>,
    /// An entity key, as an `overwrite` or `merge` route's `entity` template renders it: its
    /// version or merged state.
    #[arg(long, group = "query")]
    pub entity: Option<String>,
    /// One JSON object per record instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Prints every record that names the event, oldest first; true when there was one.
pub fn inspect(args: &InspectArgs) -> Result<bool> {
    let topology = config::load_file(&args.topology)?;
    credentials::probe_topology(&topology, &args.topology)?;
    let query = match (&args.key, &args.correlation_id, &args.entity) {
        (Some(k), _, _) => Query::Key(k.clone()),
        (None, Some(c), _) => Query::Correlation(c.clone()),
        (None, None, Some(e)) => Query::Entity(e.clone()),
        (None, None, None) => anyhow::bail!("give --key, --correlation-id or --entity"),
    };
    let found = inspect::run(&topology, &query)?;
    for s in &found {
        if args.json {
            println!("{}", serde_json::to_string(s).context("writing a record as JSON")?);
        } else {
            println!("{}", s.render());
        }
    }
    if found.is_empty() && !args.json {
        println!("no trace record, output, dead letter, alert or store entry names it");
    }
    Ok(!found.is_empty())
}
