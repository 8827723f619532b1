//! The harness's settings, all from `TALLY_BENCH_*` environment variables.

use crate::contender::Contender;
use crate::workload::{self, Workload};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::time::Duration;

/// What to run and where to write the results.
#[derive(Debug, Clone)]
pub struct Options {
    /// Input records per workload (`TALLY_BENCH_RECORDS`, 200000).
    pub records: usize,
    /// Runs per contender and workload, interleaved (`TALLY_BENCH_RUNS`, 3).
    pub runs: usize,
    /// Back-to-back runs of each ceiling per round, the fastest kept
    /// (`TALLY_BENCH_CEILING_REPEATS`, 3), against the jitter of a shared machine.
    pub ceiling_repeats: usize,
    /// Uncounted rounds of the first workload before its measured ones
    /// (`TALLY_BENCH_WARMUP_ROUNDS`, 1): a broker just started runs its first minute slower.
    pub warmup_rounds: usize,
    /// Input records a ceiling run reads at least (`TALLY_BENCH_CEILING_RECORDS`, 1000000): it
    /// reads the preloaded input as many times as that takes, so its window lasts seconds.
    pub ceiling_records: usize,
    /// Partitions of input and output topics (`TALLY_BENCH_PARTITIONS`, 3).
    pub partitions: i32,
    /// Workloads (`TALLY_BENCH_WORKLOADS`: `all`, `none` or comma-separated names, default all).
    pub workloads: Vec<Workload>,
    /// Contenders in run order (`TALLY_BENCH_CONTENDERS`, `ceiling,ceiling-2hop,tally,kstreams`).
    pub contenders: Vec<Contender>,
    /// Seconds of paced input per latency run, 0 skips (`TALLY_BENCH_LATENCY_SECS`, 20).
    pub latency_secs: u64,
    /// Share of a contender's capacity its latency run offers (`TALLY_BENCH_LATENCY_SHARE`, 0.5).
    pub latency_share: f64,
    /// One input rate (records/s) for every contender's latency run instead of a share of its
    /// capacity (`TALLY_BENCH_LATENCY_RATE`, unset); then no throughput workload is needed.
    pub latency_rate: Option<f64>,
    /// Directory for each latency run's samples as CSV, to plot (`TALLY_BENCH_LATENCY_DUMP`).
    pub latency_dump: Option<PathBuf>,
    /// `RUST_LOG` of tally runs (`TALLY_BENCH_TALLY_LOG`, `info,librdkafka=warn`); e.g.
    /// `info,tally::engine::producer=debug` logs each commit's phases.
    pub tally_log: String,
    /// Changelog records of the restore runs, 0 skips (`TALLY_BENCH_RESTORE_RECORDS`, 1000000).
    pub restore_records: usize,
    /// Longest one run may take (`TALLY_BENCH_RUN_TIMEOUT_SECS`, 900).
    pub timeout: Duration,
    /// The results file (`TALLY_BENCH_OUT`, `bench/RESULTS.md`).
    pub out: PathBuf,
    /// JVM options of the Kafka Streams app (`TALLY_BENCH_JAVA_OPTS`, `-Xmx1g`).
    pub java_opts: Vec<String>,
    /// Seed of the generated inputs (`TALLY_BENCH_SEED`, 42).
    pub seed: u64,
    /// Runs the scale section (`TALLY_BENCH_SCALE=1`, off by default): see `scale.rs`.
    pub scale: bool,
    /// Input records of the scale section's group runs (`TALLY_BENCH_SCALE_GROUP_RECORDS`, 600000).
    pub scale_group_records: usize,
    /// Distinct entities of the scale section's state runs, one record each
    /// (`TALLY_BENCH_SCALE_ENTITIES`, `1000000,10000000`).
    pub scale_entities: Vec<usize>,
    /// The broker's processes, whose CPU each run measures beside the contender's
    /// (`TALLY_BENCH_BROKER_PIDS`, space- or comma-separated; scripts/bench sets it for the local
    /// broker). Empty: the broker's CPU is not measured.
    pub broker_pids: Vec<u32>,
    /// A sentence about the conditions of the run, copied into the results (`TALLY_BENCH_NOTE`).
    pub note: Option<String>,
    /// The Cargo output directory whose `tally` and `examples/passthrough` run
    /// (`TALLY_BENCH_BUILD`; scripts/bench sets it to the `profiling` build, what scripts/dist
    /// ships). Unset: the directory of the `tally` built beside this harness.
    pub build: Option<PathBuf>,
    /// The command line that reproduces this run.
    pub command: String,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn number<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match var(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .ok()
            .with_context(|| format!("{name}={v} is not a valid number")),
    }
}

impl Options {
    /// Reads the environment; `repo` is the repository root.
    pub fn from_env(repo: &std::path::Path) -> Result<Self> {
        let all = workload::matrix();
        let workloads = match var("TALLY_BENCH_WORKLOADS").as_deref() {
            None | Some("all") => all,
            Some("none") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|n| {
                    let n = n.trim();
                    all.iter().find(|w| w.name == n).cloned().with_context(|| {
                        let names: Vec<&str> = all.iter().map(|w| w.name.as_str()).collect();
                        format!(
                            "unknown workload `{n}` in TALLY_BENCH_WORKLOADS; known: {}",
                            names.join(", ")
                        )
                    })
                })
                .collect::<Result<_>>()?,
        };
        let contenders = match var("TALLY_BENCH_CONTENDERS") {
            None => vec![
                Contender::Ceiling,
                Contender::CeilingTwoHop,
                Contender::Tally,
                Contender::KStreams,
            ],
            Some(list) => list
                .split(',')
                .map(|n| {
                    Contender::parse(n.trim()).with_context(|| {
                        format!("unknown contender `{n}` in TALLY_BENCH_CONTENDERS (ceiling, ceiling-2hop, tally, kstreams)")
                    })
                })
                .collect::<Result<_>>()?,
        };
        let runs = number("TALLY_BENCH_RUNS", 3)?;
        if runs == 0 {
            bail!("TALLY_BENCH_RUNS must be at least 1");
        }
        let ceiling_repeats = number("TALLY_BENCH_CEILING_REPEATS", 3)?;
        if ceiling_repeats == 0 {
            bail!("TALLY_BENCH_CEILING_REPEATS must be at least 1");
        }
        let latency_share: f64 = number("TALLY_BENCH_LATENCY_SHARE", 0.5)?;
        if !(latency_share > 0.0 && latency_share <= 1.0) {
            bail!("TALLY_BENCH_LATENCY_SHARE must be in (0, 1], not {latency_share}");
        }
        let latency_rate: Option<f64> = var("TALLY_BENCH_LATENCY_RATE")
            .map(|v| {
                v.trim()
                    .parse()
                    .ok()
                    .filter(|r: &f64| *r >= 1.0)
                    .with_context(|| format!("TALLY_BENCH_LATENCY_RATE={v} is not a rate of at least 1 record/s"))
            })
            .transpose()?;
        let scale_entities = match var("TALLY_BENCH_SCALE_ENTITIES") {
            None => vec![1_000_000, 10_000_000],
            Some(list) => list
                .split(',')
                .map(|n| {
                    n.trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|&n| n > 0)
                        .with_context(|| format!("TALLY_BENCH_SCALE_ENTITIES: `{n}` is not a positive count"))
                })
                .collect::<Result<_>>()?,
        };
        let broker_pids = var("TALLY_BENCH_BROKER_PIDS")
            .unwrap_or_default()
            .split([' ', ','])
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.parse::<u32>()
                    .with_context(|| format!("TALLY_BENCH_BROKER_PIDS: `{p}` is not a process id"))
            })
            .collect::<Result<Vec<_>>>()?;
        // scripts/bench sets these two itself (the broker's process ids change with every
        // start): not part of the command to repeat.
        let mut settings: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| {
                k.starts_with("TALLY_BENCH_") && k != "TALLY_BENCH_BROKER_PIDS" && k != "TALLY_BENCH_BUILD"
            })
            .collect();
        settings.sort();
        let mut command: Vec<String> = settings
            .iter()
            .map(|(k, v)| {
                if v.contains(' ') {
                    format!("{k}='{v}'")
                } else {
                    format!("{k}={v}")
                }
            })
            .collect();
        command.push("scripts/bench".to_string());
        Ok(Self {
            records: number("TALLY_BENCH_RECORDS", 200_000)?,
            runs,
            ceiling_repeats,
            warmup_rounds: number("TALLY_BENCH_WARMUP_ROUNDS", 1)?,
            ceiling_records: number("TALLY_BENCH_CEILING_RECORDS", 1_000_000)?,
            partitions: number("TALLY_BENCH_PARTITIONS", 3)?,
            workloads,
            contenders,
            latency_secs: number("TALLY_BENCH_LATENCY_SECS", 20)?,
            latency_share,
            latency_rate,
            latency_dump: var("TALLY_BENCH_LATENCY_DUMP").map(PathBuf::from),
            tally_log: var("TALLY_BENCH_TALLY_LOG").unwrap_or_else(|| "info,librdkafka=warn".to_string()),
            restore_records: number("TALLY_BENCH_RESTORE_RECORDS", 1_000_000)?,
            timeout: Duration::from_secs(number("TALLY_BENCH_RUN_TIMEOUT_SECS", 900)?),
            out: var("TALLY_BENCH_OUT").map_or_else(|| repo.join("bench/RESULTS.md"), PathBuf::from),
            java_opts: var("TALLY_BENCH_JAVA_OPTS")
                .unwrap_or_else(|| "-Xmx1g".to_string())
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            seed: number("TALLY_BENCH_SEED", 42)?,
            scale: var("TALLY_BENCH_SCALE").is_some_and(|v| v != "0"),
            scale_group_records: number("TALLY_BENCH_SCALE_GROUP_RECORDS", 600_000)?,
            scale_entities,
            broker_pids,
            note: var("TALLY_BENCH_NOTE"),
            build: var("TALLY_BENCH_BUILD").map(PathBuf::from),
            command: command.join(" "),
        })
    }
}
