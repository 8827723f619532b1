//! `tally redrive`: sends dead letters back to their source topic, each exactly once.

use crate::config;
use crate::engine::credentials;
use crate::recover::redrive::{self, Selection};
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Arguments of `tally redrive`.
#[derive(Debug, clap::Args)]
pub struct RedriveArgs {
    /// The topology YAML file: its dead-letter topic, pipelines and Kafka settings.
    pub topology: PathBuf,
    /// Only dead letters of this pipeline (by the source topic they name).
    #[arg(long)]
    pub pipeline: Option<String>,
    /// Only dead letters with this reason, e.g. `oversize` (repeatable).
    #[arg(long = "reason", value_name = "REASON")]
    pub reasons: Vec<String>,
    /// Only dead letters written since: a duration ago (`2h`, `30m`) or a time
    /// (`2026-12-04T08:00:00Z`).
    #[arg(long, value_name = "AGO|TIME")]
    pub since: Option<String>,
    /// Send to this topic instead of each letter's source topic.
    #[arg(long, value_name = "TOPIC")]
    pub to: Option<String>,
    /// Report what would be sent, and send nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs the redrive and prints what it did; true when every selected letter could be sent.
pub fn redrive(args: &RedriveArgs) -> Result<bool> {
    let topology = config::load_file(&args.topology)?;
    credentials::probe_topology(&topology, &args.topology)?;
    let selection = Selection {
        pipeline: args.pipeline.clone(),
        reasons: args.reasons.clone(),
        since_ms: args.since.as_deref().map(since_ms).transpose()?,
        to: args.to.clone(),
    };
    let outcome = redrive::run(&topology, &selection, args.dry_run)?;
    print!("{}", outcome.render(args.dry_run));
    Ok(outcome.unsendable.is_empty())
}

/// `2h` ago or `2026-12-04T08:00:00Z`, in ms since the epoch.
fn since_ms(text: &str) -> Result<i64> {
    let at = match (humantime::parse_duration(text), humantime::parse_rfc3339_weak(text)) {
        (Ok(ago), _) => SystemTime::now().checked_sub(ago).unwrap_or(UNIX_EPOCH),
        (_, Ok(time)) => time,
        _ => bail!("--since `{text}` is neither a duration (`2h`) nor a time (`2026-12-04T08:00:00Z`)"),
    };
    Ok(at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_duration_ago_or_a_time() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as i64;
        let two_hours = since_ms("2h").expect("duration");
        assert!((now - 7_200_000 - two_hours).abs() < 5_000, "{two_hours}");
        assert_eq!(since_ms("2026-12-04T08:00:00Z").expect("time"), 1_796_371_200_000);
        assert!(since_ms("yesterday-ish").is_err());
    }
}
