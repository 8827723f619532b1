//! `tally reset`: start an application over (see `recover::reset`).

use crate::config;
use crate::engine::credentials;
use crate::recover::reset;
use anyhow::Result;
use std::path::PathBuf;

/// Arguments of `tally reset`.
#[derive(Debug, clap::Args)]
pub struct ResetArgs {
    /// The topology YAML file of the application to reset.
    pub topology: PathBuf,
    /// Delete; without it, only print what would be deleted.
    #[arg(long)]
    pub execute: bool,
}

/// Prints the plan and, with `--execute`, carries it out.
pub fn reset(args: &ResetArgs) -> Result<bool> {
    let topology = config::load_file(&args.topology)?;
    credentials::probe_topology(&topology, &args.topology)?;
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
