//! `tally reset`: start an application over (see `recover::reset`), or change one key of its
//! stores (see `recover::surgery`).

use crate::config;
use crate::engine::credentials;
use crate::recover::reset;
use crate::recover::surgery::{self, Surgery};
use anyhow::Result;
use std::path::PathBuf;

/// Arguments of `tally reset`.
#[derive(Debug, clap::Args)]
pub struct ResetArgs {
    /// The topology YAML file of the application to reset.
    pub topology: PathBuf,
    /// Delete (or write); without it, only print what would be done.
    #[arg(long)]
    pub execute: bool,
    /// Key surgery instead of a whole reset: the pipeline whose stores change.
    #[arg(long, requires = "surgery")]
    pub pipeline: Option<String>,
    /// Forget this idempotency key (as trace records show it, `PAY-1:PAID`): its next event
    /// passes as new.
    #[arg(long, group = "surgery", requires = "pipeline")]
    pub key: Option<String>,
    /// Forget this entity's version or merged state, or with --version set its version.
    #[arg(long, group = "surgery", requires = "pipeline")]
    pub entity: Option<String>,
    /// With --entity: the version to set (the next version above it passes).
    #[arg(long, requires = "entity", allow_negative_numbers = true)]
    pub version: Option<i64>,
    /// Correct a wrong first write-back of a `record_mapping` pipeline:
    /// `<system>:<wrong id>=<right id>`.
    #[arg(long, group = "surgery", requires = "pipeline", value_name = "SYSTEM:WRONG=RIGHT")]
    pub mapping: Option<String>,
}

/// Prints the plan and, with `--execute`, carries it out.
pub fn reset(args: &ResetArgs) -> Result<bool> {
    let topology = config::load_file(&args.topology)?;
    credentials::probe_topology(&topology, &args.topology)?;
    if let Some(pipeline) = &args.pipeline {
        let op = match (&args.key, &args.entity, args.version, &args.mapping) {
            (Some(k), _, _, _) => Surgery::ForgetKey(k.clone()),
            (None, Some(e), Some(v), _) => Surgery::SetVersion(e.clone(), v),
            (None, Some(e), None, _) => Surgery::ForgetEntity(e.clone()),
            (None, None, _, Some(m)) => mapping_of(m)?,
            (None, None, _, None) => anyhow::bail!("give --key, --entity or --mapping with --pipeline"),
        };
        return key_surgery(&topology, pipeline, &op, args.execute);
    }
    let plan = reset::plan(&topology)?;
    if !args.execute {
        print!("would delete:\n{}", plan.render());
        println!("nothing deleted; run again with --execute");
        return Ok(true);
    }
    reset::execute(&topology, &plan)?;
    print!("deleted:\n{}", plan.render());
    println!(
        "the next start processes the sources from their beginning (auto.offset.reset) with empty \
         state; remove the state directory on every other host, or tally rebuilds it there"
    );
    Ok(true)
}

/// Prints what key surgery writes and, with `execute`, writes it.
fn key_surgery(topology: &crate::topology::Topology, pipeline: &str, op: &Surgery, execute: bool) -> Result<bool> {
    let plan = surgery::plan(topology, pipeline, op)?;
    if !execute {
        print!("would write:\n{}", plan.render());
        println!("nothing written; run again with --execute");
        return Ok(true);
    }
    surgery::execute(topology, &plan)?;
    print!("written:\n{}", plan.render());
    println!(
        "every instance and standby takes the change from the changelog: a restarted instance replays the \
         changelog's tail into its stores"
    );
    Ok(true)
}

/// `<system>:<wrong>=<right>`.
fn mapping_of(text: &str) -> Result<Surgery> {
    let parsed = text.split_once(':').and_then(|(system, ids)| {
        let (wrong, right) = ids.split_once('=')?;
        Some((system, wrong, right))
    });
    match parsed {
        Some((system, wrong, right)) if !system.is_empty() && !wrong.is_empty() && !right.is_empty() => {
            Ok(Surgery::CorrectMapping {
                system: system.to_string(),
                wrong: wrong.to_string(),
                right: right.to_string(),
            })
        }
        _ => anyhow::bail!("--mapping `{text}` is not `<system>:<wrong id>=<right id>`, e.g. `erp:E-17=E-71`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_correction_names_system_wrong_and_right_ids() {
        assert_eq!(
            mapping_of("erp:E-1:x=E-2").expect("parses"),
            Surgery::CorrectMapping {
                system: "erp".into(),
                wrong: "E-1:x".into(),
                right: "E-2".into()
            }
        );
        for bad in ["erp", "erp:E-1", ":a=b", "erp:=b", "erp:a="] {
            assert!(mapping_of(bad).is_err(), "{bad}");
        }
    }
}
