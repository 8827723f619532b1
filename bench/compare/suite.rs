//! The whole benchmark: each workload preloaded once and drained by every contender in turn
//! (A/B interleaved, so slow phases of the shared machine hit all of them), then latency at
//! half of each contender's capacity, then restore.

use crate::contender::{Contender, Programs};
use crate::drain::{self, Drain, Sample};
use crate::kafka;
use crate::latency::{self, Latency};
use crate::options::Options;
use crate::restore::{self, RestoreSample};
use crate::workload::{Topology, Workload};
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
    /// Restore runs.
    pub restore: Vec<RestoreSample>,
    /// Runs that failed, with why.
    pub failures: Vec<String>,
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
        restore: Vec::new(),
        failures: Vec::new(),
    };
    for w in &o.workloads {
        match workload(o, w, &tag, programs, log_dir, &mut results.failures) {
            Ok(r) => results.workloads.push(r),
            Err(e) => results.failures.push(format!("{}: {e:#}", w.name)),
        }
    }
    if o.latency_secs > 0 {
        let source = results
            .workloads
            .iter()
            .find(|r| r.workload.topology == Topology::Payments);
        if let Some(source) = source {
            results.latency_capacity_from = Some(source.workload.name.clone());
            for &c in &o.contenders {
                let Some(capacity) = median(source.of(c).iter().map(|s| s.throughput).collect()) else {
                    continue;
                };
                let rate = (capacity * o.latency_share).round();
                eprintln!("bench: latency of {} at {rate:.0} records/s", c.name());
                let id = format!("{tag}-latency-{}", c.name());
                match latency::run(c, rate, o, &id, programs, log_dir) {
                    Ok(l) => results.latency.push(l),
                    Err(e) => results.failures.push(format!("latency {}: {e:#}", c.name())),
                }
            }
        }
    }
    if o.restore_records > 0 && o.contenders.contains(&Contender::Tally) {
        eprintln!("bench: restore of a {}-record changelog", o.restore_records);
        let id = format!("{tag}-restore");
        match restore::run(o.restore_records, o.runs, &id, programs, log_dir) {
            Ok(r) => results.restore = r,
            Err(e) => results.failures.push(format!("restore: {e:#}")),
        }
    }
    results
}

fn workload(
    o: &Options,
    w: &Workload,
    tag: &str,
    programs: &Programs,
    log_dir: &Path,
    failures: &mut Vec<String>,
) -> anyhow::Result<WorkloadResult> {
    let input = format!("bench-{tag}-{}-in", w.name);
    let generated = w.generate(o.records, o.seed);
    let t = Instant::now();
    kafka::create_topics(&[(&input, o.partitions)], &[])?;
    kafka::preload(&input, &generated.records)?;
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
    };
    drop(generated);
    let mut samples = Vec::new();
    for r in 0..o.runs {
        for &c in &o.contenders {
            let id = format!("{tag}-{}-{}-{r}", w.name, c.name());
            match drain::run(c, &d, &id, programs, log_dir) {
                Ok(mut s) => {
                    s.round = r;
                    eprintln!(
                        "bench: {} run {} {}: {:.0} records/s, {:.1} CPU-s/1M, peak RSS {:.0} MiB, {}/{} outputs",
                        w.name,
                        r + 1,
                        c.name(),
                        s.throughput,
                        s.cpu_s_per_m,
                        s.peak_rss_mib,
                        s.outputs,
                        s.expected
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
    })
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
