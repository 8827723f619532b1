//! One throughput run: a contender drains a preloaded input; the harness watches its output.

use crate::contender::{self, Contender, Passes, Programs, RunNames};
use crate::host::{CpuTicks, Stalls};
use crate::kafka;
use crate::probe;
use crate::workload::Workload;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::time::{Duration, Instant};

/// What tally logs at the first record of a co-partitioned source that sits on another partition
/// than its key's (src/processors/pipeline.rs); it counts the rest without logging them.
const MISPLACED: &str = "on another partition than its key's";

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Round of the interleaved runs (samples of one round ran back to back).
    pub round: usize,
    /// Who ran.
    pub contender: Contender,
    /// Input records per second between the first and the last committed output.
    pub throughput: f64,
    /// Seconds from process start to the first committed output.
    pub startup_s: f64,
    /// CPU seconds per 1M input records, over the same window as the throughput.
    pub cpu_s_per_m: f64,
    /// The broker's CPU seconds per 1M input records over that window, where its processes are
    /// known (`TALLY_BENCH_BROKER_PIDS`).
    pub broker_cpu_s_per_m: Option<f64>,
    /// Peak RSS (VmHWM) of the process, MiB.
    pub peak_rss_mib: f64,
    /// Changelog bytes on the broker per input record (none for the ceiling).
    pub changelog_bytes_per_record: Option<f64>,
    /// Committed outputs read, including any past the expected count.
    pub outputs: usize,
    /// Outputs a correct run makes.
    pub expected: usize,
    /// Moments the machine did not run the harness, between the contender's start and its last
    /// output.
    pub stalls: Stalls,
    /// Share of the machine's CPU time neither idle nor stolen over the window, in percent.
    pub machine_busy_pct: Option<f64>,
    /// The contender's busiest thread over the window: its name, the cores it ran on and the
    /// cores' worth of time it waited for one.
    pub busiest_thread: Option<(String, f64, f64)>,
}

/// Inputs of a run.
pub struct Drain<'a> {
    /// The workload (its topology).
    pub workload: &'a Workload,
    /// Preloaded input topic and its record count.
    pub input: &'a str,
    /// Records in the input topic.
    pub records: usize,
    /// Outputs a correct dedup / version gate makes.
    pub expected_outputs: usize,
    /// Partitions of input and output.
    pub partitions: i32,
    /// Longest a run may take.
    pub timeout: Duration,
    /// The broker's processes, whose CPU is measured beside the contender's (may be empty).
    pub broker: &'a [u32],
    /// Passes of a ceiling over the input (the stateful contenders read it once).
    pub ceiling_passes: usize,
}

/// Runs `c` once over the preloaded input as run `id`.
pub fn run(c: Contender, d: &Drain<'_>, id: &str, programs: &Programs, log_dir: &Path) -> Result<Sample> {
    let names = RunNames::new(id, d.input);
    let mut topics = vec![(names.output.as_str(), d.partitions), (names.dlq.as_str(), 1)];
    if c == Contender::CeilingTwoHop {
        topics.push((names.middle.as_str(), d.partitions));
    }
    kafka::create_topics(&topics, &[])?;
    let reader = kafka::committed_reader(&names.output, d.partitions)?;
    // The ceiling copies every record of every pass; the stateful contenders read the input once
    // and drop duplicates and stale versions.
    let (passes, expected) = if c.is_ceiling() {
        let passes = Passes {
            count: d.ceiling_passes,
            records: d.records,
        };
        (passes, d.records * d.ceiling_passes)
    } else {
        (Passes::ONE, d.expected_outputs)
    };
    let read = d.records * passes.count;
    let started = Instant::now();
    let mut proc = contender::start(c, d.workload.topology, &names, d.partitions, passes, programs, log_dir)?;
    let watched = watch(
        &reader,
        expected,
        std::slice::from_mut(&mut proc),
        d.broker,
        started,
        d.timeout,
    )
    .with_context(|| c.name())?;
    let stalls = Stalls::between(started, Instant::now());
    let peak_rss_mib = watched.peak_rss_mib.first().copied().unwrap_or_default();
    let log = proc.log.clone();
    proc.stop()?;
    let changelog_bytes_per_record = if c.is_ceiling() {
        None
    } else {
        let changelogs: Vec<String> = kafka::topics_with_prefix(&names.app)?
            .into_iter()
            .filter(|t| t.ends_with("-changelog"))
            .collect();
        let bytes = kafka::log_dir_bytes(&programs.repo, &changelogs)?;
        Some(bytes as f64 / d.records as f64)
    };
    kafka::delete_prefixed(&names.app)?;
    // A partitioner mismatch between the input producer and `co_partitioned` leaves the output
    // count exact (every copy of an event still shares one partition, only not the one tally
    // expects), so tally's own placement check is what must stay silent.
    if c == Contender::Tally && d.workload.topology.one_hop() {
        let text = std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
        if text.contains(MISPLACED) {
            bail!(
                "tally found input records on another partition than their key's ({})",
                log.display()
            );
        }
    }
    Ok(Sample {
        round: 0,
        contender: c,
        throughput: read as f64 / watched.window_s,
        startup_s: watched.startup_s,
        cpu_s_per_m: watched.cpu_s / read as f64 * 1e6,
        broker_cpu_s_per_m: watched.broker_cpu_s.map(|s| s / read as f64 * 1e6),
        peak_rss_mib,
        changelog_bytes_per_record,
        outputs: watched.outputs,
        expected,
        stalls,
        machine_busy_pct: watched.machine_busy_pct,
        busiest_thread: watched.busiest_thread,
    })
}

/// What watching a run's output measured.
pub struct Watched {
    /// Committed outputs read, including any past the expected count.
    pub outputs: usize,
    /// Seconds from the start to the first output.
    pub startup_s: f64,
    /// Seconds between the first and the last expected output.
    pub window_s: f64,
    /// CPU seconds of all the processes over that window.
    pub cpu_s: f64,
    /// CPU seconds of the broker's processes over that window (`None` where none are known or
    /// one vanished).
    pub broker_cpu_s: Option<f64>,
    /// Peak RSS of each process, MiB, in their order.
    pub peak_rss_mib: Vec<f64>,
    /// Share of the machine's CPU time neither idle nor stolen over that window, in percent.
    pub machine_busy_pct: Option<f64>,
    /// The first process's busiest thread over that window (see [`probe::busiest_thread`]).
    pub busiest_thread: Option<(String, f64, f64)>,
}

/// Reads `reader` until `expected` outputs arrived (failing after `timeout` from `started`, or
/// when a process exits), then a second more to catch outputs past the count; measures the
/// processes' CPU, and the `broker` processes', between the first and the last expected output,
/// with how busy the machine was and the first process's busiest thread over that window.
pub fn watch(
    reader: &rdkafka::consumer::BaseConsumer,
    expected: usize,
    procs: &mut [contender::Running],
    broker: &[u32],
    started: Instant,
    timeout: Duration,
) -> Result<Watched> {
    let cpu = |procs: &[contender::Running]| -> f64 {
        procs
            .iter()
            .map(|p| probe::usage(p.pid).unwrap_or_default().cpu_s)
            .sum()
    };
    let mut seen = 0usize;
    let threads = |procs: &[contender::Running]| procs.first().map(|p| probe::thread_times(p.pid));
    let mut first: Option<(Instant, f64, Option<f64>)> = None;
    let mut first_load = None;
    let mut last_check = Instant::now();
    while seen < expected {
        if started.elapsed() > timeout {
            let tails: Vec<String> = procs.iter().map(contender::Running::log_tail).collect();
            bail!(
                "saw {seen} of {expected} outputs after {timeout:?}; log tail:\n{}",
                tails.join("\n---\n")
            );
        }
        if kafka::next(reader, Duration::from_millis(100))
            .context("reading the output")?
            .is_some()
        {
            seen += 1;
            if first.is_none() {
                first = Some((Instant::now(), cpu(procs), probe::cpu_s(broker)));
                first_load = Some((CpuTicks::now(), threads(procs)));
            }
        }
        if last_check.elapsed() > Duration::from_millis(500) {
            for p in procs.iter_mut() {
                p.check_alive()?;
            }
            last_check = Instant::now();
        }
    }
    let done = Instant::now();
    let end_cpu: f64 = procs
        .iter()
        .map(|p| probe::usage(p.pid).map(|u| u.cpu_s))
        .sum::<Option<f64>>()
        .context("a contender vanished")?;
    let end_broker_cpu = probe::cpu_s(broker);
    let end_load = (CpuTicks::now(), threads(procs));
    // A short extra read catches outputs past the expected count (duplicates leaking through).
    let extra_until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < extra_until {
        if kafka::next(reader, Duration::from_millis(100))
            .context("reading the output")?
            .is_some()
        {
            seen += 1;
        }
    }
    let peak_rss_mib = procs
        .iter()
        .map(|p| probe::usage(p.pid).map_or(0.0, |u| u.peak_rss_mib))
        .collect();
    let (first_at, first_cpu, first_broker_cpu) = first.context("no output seen")?;
    let window_s = done.duration_since(first_at).as_secs_f64().max(1e-3);
    let (first_ticks, first_threads) = first_load.unwrap_or_default();
    Ok(Watched {
        outputs: seen,
        startup_s: first_at.duration_since(started).as_secs_f64(),
        window_s,
        cpu_s: end_cpu - first_cpu,
        broker_cpu_s: first_broker_cpu.zip(end_broker_cpu).map(|(a, b)| b - a),
        peak_rss_mib,
        machine_busy_pct: first_ticks.zip(end_load.0).and_then(|(a, b)| b.busy_since(&a)),
        busiest_thread: first_threads
            .zip(end_load.1)
            .and_then(|(a, b)| probe::busiest_thread(&a, &b, window_s)),
    })
}
