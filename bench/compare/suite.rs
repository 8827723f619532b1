//! The whole benchmark: each workload preloaded once and drained by every contender in turn
//! (A/B interleaved, so slow phases of the shared machine hit all of them), then latency at
//! half of each contender's capacity, then restore.

use crate::contender::{Contender, Programs};
use crate::drain::{self, Drain, Sample};
use crate::kafka;
use crate::latency::{self, Latency};
use crate::options::Options;
use crate::restore::{self, RestoreSample};
use crate::scale::{self, ScaleResults};
use crate::workload::{Topology, Workload};
use anyhow::Context;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Every run of one workload.
pub struct WorkloadResult {
    /// The workload.
    pub workload: Workload,
    /// Outputs a correct dedup / version gate makes of its input.
    pub expected_outputs: usize,
    /// Every successful run of every contender.
    pub samples: Vec<Sample>,
    /// The uncounted warm-up runs before them, in run order.
    pub warmup: Vec<Sample>,
}

impl WorkloadResult {
    /// The samples of one contender, in run order.
    pub fn of(&self, c: Contender) -> Vec<&Sample> {
        self.samples.iter().filter(|s| s.contender == c).collect()
    }
}

/// Everything measured.
pub struct Results {
    /// Throughput runs per workload.
    pub workloads: Vec<WorkloadResult>,
    /// Latency per contender, and the workload whose capacity set the rate.
    pub latency: Vec<Latency>,
    /// Name of the workload whose measured capacity set the latency rates.
    pub latency_capacity_from: Option<String>,
    /// The contender whose share rate was the lowest, and every contender's latency at that
    /// rate, so they are also compared under one load.
    pub latency_common: Option<(Contender, Vec<Latency>)>,
    /// Restore runs.
    pub restore: Vec<RestoreSample>,
    /// The scale section, when asked for.
    pub scale: Option<ScaleResults>,
    /// Runs that failed, with why.
    pub failures: Vec<String>,
}

/// Latency of each contender at `o.latency_rate`; or of the stream processors at their share
/// of their own capacity, then of every contender at the lowest of those rates.
///
/// The ceilings get no run at their own share: a paced producer on the same 2 cores cannot offer
/// half of their capacity (536,789 of 887,921 records/s achieved), so such a row measured the
/// harness, not them.
fn latency_runs(o: &Options, tag: &str, programs: &Programs, log_dir: &Path, results: &mut Results) {
    let source = results
        .workloads
        .iter()
        .find(|r| r.workload.topology == Topology::Payments);
    results.latency_capacity_from = source.map(|s| s.workload.name.clone());
    let rates: Vec<(Contender, f64)> = o
        .contenders
        .iter()
        .filter(|c| o.latency_rate.is_some() || !c.is_ceiling())
        .filter_map(|&c| {
            let rate = o.latency_rate.or_else(|| {
                let capacity = median(source?.of(c).iter().map(|s| s.throughput).collect())?;
                Some((capacity * o.latency_share).round())
            })?;
            Some((c, rate))
        })
        .collect();
    // Rounds outer, contenders inner: a slow phase of the shared machine hits every contender.
    let mut rounds = |plan: &[(Contender, f64)], label: &str| -> Vec<Latency> {
        let mut runs: Vec<Vec<Latency>> = vec![Vec::new(); plan.len()];
        for round in 1..=o.runs {
            for (&(c, rate), done) in plan.iter().zip(runs.iter_mut()) {
                eprintln!("bench: {label} run {round} of {} at {rate:.0} records/s", c.name());
                let id = format!("{tag}-{label}-{}-{round}", c.name());
                match latency::run(c, rate, o, &id, programs, log_dir) {
                    Ok(l) => done.push(l),
                    Err(e) => results
                        .failures
                        .push(format!("{label} run {round} of {}: {e:#}", c.name())),
                }
            }
        }
        runs.into_iter().filter_map(latency::median_run).collect()
    };
    let own = rounds(&rates, "latency");
    let slowest = rates.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1));
    let common = match slowest {
        Some((slowest, rate)) if o.latency_rate.is_none() && o.contenders.len() > 1 => {
            // The slowest contender's own runs were at this rate already.
            let others: Vec<(Contender, f64)> = o
                .contenders
                .iter()
                .filter(|&&c| c != slowest)
                .map(|&c| (c, rate))
                .collect();
            let mut runs = rounds(&others, "latency-common");
            runs.extend(own.iter().find(|l| l.contender == slowest).cloned());
            runs.sort_by_key(|l| o.contenders.iter().position(|&c| c == l.contender));
            Some((slowest, runs))
        }
        _ => None,
    };
    results.latency = own;
    results.latency_common = common;
}

/// Runs everything `o` asks for; failed runs are recorded, not fatal.
pub fn run(o: &Options, programs: &Programs, log_dir: &Path) -> Results {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let tag = format!("{}-{}", std::process::id(), secs % 1_000_000);
    let mut results = Results {
        workloads: Vec::new(),
        latency: Vec::new(),
        latency_capacity_from: None,
        latency_common: None,
        restore: Vec::new(),
        scale: None,
        failures: Vec::new(),
    };
    for (i, w) in o.workloads.iter().enumerate() {
        let warmup = if i == 0 { o.warmup_rounds } else { 0 };
        match workload(o, w, warmup, &tag, programs, log_dir, &mut results.failures) {
            Ok(r) => results.workloads.push(r),
            Err(e) => results.failures.push(format!("{}: {e:#}", w.name)),
        }
    }
    if o.latency_secs > 0 {
        latency_runs(o, &tag, programs, log_dir, &mut results);
    }
    if o.restore_records > 0 && o.contenders.contains(&Contender::Tally) {
        eprintln!("bench: restore of a {}-record changelog", o.restore_records);
        let id = format!("{tag}-restore");
        match restore::run(o.restore_records, o.runs, &id, programs, log_dir) {
            Ok(r) => results.restore = r,
            Err(e) => results.failures.push(format!("restore: {e:#}")),
        }
    }
    if o.scale {
        results.scale = Some(scale::run(o, &tag, programs, log_dir, &mut results.failures));
    }
    results
}

/// Drains `w` `o.runs` times per contender, interleaved, after `warmup` uncounted rounds.
fn workload(
    o: &Options,
    w: &Workload,
    warmup: usize,
    tag: &str,
    programs: &Programs,
    log_dir: &Path,
    failures: &mut Vec<String>,
) -> anyhow::Result<WorkloadResult> {
    let input = format!("bench-{tag}-{}-in", w.name);
    let generated = w.generate(o.records, o.seed);
    let t = Instant::now();
    kafka::create_topics(&[(&input, o.partitions)], &[])?;
    kafka::preload(&input, &generated.records, w.topology.input_partitioner())?;
    eprintln!(
        "bench: {}: preloaded {} records in {:.1}s; {} outputs expected",
        w.name,
        generated.records.len(),
        t.elapsed().as_secs_f64(),
        generated.expected_outputs
    );
    let d = Drain {
        workload: w,
        input: &input,
        records: generated.records.len(),
        expected_outputs: generated.expected_outputs,
        partitions: o.partitions,
        timeout: o.timeout,
        broker: &o.broker_pids,
        ceiling_passes: o.ceiling_records.div_ceil(generated.records.len().max(1)).max(1),
    };
    drop(generated);
    let mut warmup_samples = Vec::new();
    for r in 0..warmup {
        for &c in &o.contenders {
            let id = format!("{tag}-{}-{}-warmup{r}", w.name, c.name());
            match drain::run(c, &d, &id, programs, log_dir) {
                Ok(s) => {
                    eprintln!(
                        "bench: {} warm-up {} {} (not counted): {:.0} records/s, {}/{} outputs",
                        w.name,
                        r + 1,
                        c.name(),
                        s.throughput,
                        s.outputs,
                        s.expected
                    );
                    warmup_samples.push(s);
                }
                // Reported like a failed run: a contender that cannot drain at all is news.
                Err(e) => failures.push(format!("{} warm-up {} {}: {e:#}", w.name, r + 1, c.name())),
            }
        }
    }
    let mut samples = Vec::new();
    for r in 0..o.runs {
        for &c in &o.contenders {
            let id = format!("{tag}-{}-{}-{r}", w.name, c.name());
            let repeats = if c.is_ceiling() { o.ceiling_repeats } else { 1 };
            let label = format!("{} run {} {}", w.name, r + 1, c.name());
            match best_run(repeats, &label, |i| {
                drain::run(c, &d, &format!("{id}-{i}"), programs, log_dir)
            }) {
                Ok(mut s) => {
                    s.round = r;
                    eprintln!(
                        "bench: {} run {} {}: {:.0} records/s, {:.1} CPU-s/1M, peak RSS {:.0} MiB, {}/{} outputs, machine stalls: {}",
                        w.name,
                        r + 1,
                        c.name(),
                        s.throughput,
                        s.cpu_s_per_m,
                        s.peak_rss_mib,
                        s.outputs,
                        s.expected,
                        s.stalls
                    );
                    samples.push(s);
                }
                Err(e) => {
                    eprintln!("bench: {} run {} {} failed: {e:#}", w.name, r + 1, c.name());
                    failures.push(format!("{} run {} {}: {e:#}", w.name, r + 1, c.name()));
                }
            }
        }
    }
    kafka::delete_prefixed(&input)?;
    Ok(WorkloadResult {
        workload: w.clone(),
        expected_outputs: d.expected_outputs,
        samples,
        warmup: warmup_samples,
    })
}

/// Runs `run` `repeats` times back to back and keeps the fastest run; the first failure ends it.
/// Used for the ceilings: a ceiling is the most the machine does, and what makes one repeat
/// slower than another on the same input (the broker's collector, the other core's work, a
/// smaller batch size that feeds on itself, the writeback of the runs before it) is the
/// machine's state, not the passthrough's. Every repeat is logged under `label`, so the spread
/// within a round stays visible (docs/performance.md reads it).
fn best_run(
    repeats: usize,
    label: &str,
    mut run: impl FnMut(usize) -> anyhow::Result<Sample>,
) -> anyhow::Result<Sample> {
    let mut best: Option<Sample> = None;
    for i in 0..repeats {
        let s = run(i)?;
        if repeats > 1 {
            eprintln!(
                "bench: {label} repeat {}: {:.0} records/s, {:.1} CPU-s/1M",
                i + 1,
                s.throughput,
                s.cpu_s_per_m
            );
        }
        if best.as_ref().is_none_or(|b| s.throughput > b.throughput) {
            best = Some(s);
        }
    }
    best.context("no repeat ran (repeats is at least 1)")
}

/// The median of `v` (mean of the middle two for an even count), `None` if empty.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}
