//! Side-by-side benchmark of tally against a raw librdkafka passthrough (the ceiling) and a
//! Kafka Streams implementation of the same topologies, on the same broker and input.
//!
//! Run with `scripts/bench` (it builds the contenders first); settings come from
//! `TALLY_BENCH_*` variables (see `options.rs`); the results go to `bench/RESULTS.md`.

mod contender;
mod drain;
mod host;
mod kafka;
mod latency;
mod options;
mod probe;
mod report;
mod restore;
mod scale;
mod suite;
mod workload;

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

fn main() -> Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let o = options::Options::from_env(&repo)?;
    let build = match &o.build {
        Some(dir) => dir.clone(),
        None => PathBuf::from(env!("CARGO_BIN_EXE_tally"))
            .parent()
            .context("the tally binary has no directory")?
            .to_path_buf(),
    };
    let programs = contender::Programs {
        passthrough: build.join("examples/passthrough"),
        tally: build.join("tally"),
        repo: repo.clone(),
        java_opts: o.java_opts.clone(),
        tally_log: o.tally_log.clone(),
    };
    programs.check(&o.contenders)?;
    let log_dir = std::env::temp_dir().join(format!("tally-bench-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
    eprintln!("bench: contender logs in {}", log_dir.display());
    // Deleted topics' files outlive a run by this long: a broker that deletes them only after
    // a later run started slows it (RESULTS.md's spread note).
    let delete_delay = match kafka::broker_setting(report::DELETE_DELAY) {
        Ok(Some(value)) => value,
        Ok(None) => "not reported by the broker".to_string(),
        Err(e) => format!("not read ({e:#})"),
    };
    host::watch_stalls();
    let started_at = Instant::now();
    let started = utc_now();
    let load_before = loadavg();
    let ticks_before = host::CpuTicks::now();
    let results = suite::run(&o, &programs, &log_dir);
    let ctx = report::Context {
        started,
        minutes: started_at.elapsed().as_secs_f64() / 60.0,
        load: (load_before, loadavg()),
        steal: host::steal_text(ticks_before, host::CpuTicks::now()),
        stalls: host::Stalls::between(started_at, Instant::now()),
        delete_delay,
        build,
    };
    std::fs::write(&o.out, report::render(&o, &results, &ctx, &repo))
        .with_context(|| format!("writing {}", o.out.display()))?;
    eprintln!("bench: wrote {}", o.out.display());
    if !results.failures.is_empty() {
        bail!(
            "{} run(s) failed (listed in {}): {}",
            results.failures.len(),
            o.out.display(),
            results.failures.join("; ")
        );
    }
    Ok(())
}

fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
