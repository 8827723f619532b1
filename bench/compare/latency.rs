//! End-to-end latency at a fixed share of a contender's capacity: a paced producer writes
//! unique payment events; each output's append time minus its input's append time (both
//! LogAppendTime, read_committed) is one sample.

use crate::contender::{self, Contender, Passes, Programs, RunNames};
use crate::host::{self, CpuTicks, Stalls};
use crate::kafka;
use crate::options::Options;
use crate::probe;
use crate::workload::{self, Topology};
use anyhow::{bail, Context, Result};
use rdkafka::Message;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Records sent (and awaited) before pacing starts, so startup is not measured.
const WARMUP: usize = 200;
/// Share of the paced records that still warm up (JIT, caches) and are not measured.
const WARM_SHARE: f64 = 0.25;

/// The slowest read-back of the inputs' append times the deadline allows for, in records/s.
const READ_BACK_FLOOR_PER_S: f64 = 40_000.0;

/// Latency figures of one contender, in milliseconds.
#[derive(Debug, Clone)]
pub struct Latency {
    /// Who ran.
    pub contender: Contender,
    /// Offered input records per second.
    pub rate: f64,
    /// Measured records.
    pub records: usize,
    /// Input records per second the producer achieved over the measured records.
    pub achieved_rate: f64,
    /// Output append time minus input append time: median, p99, p99.9.
    pub append: [f64; 3],
    /// Time the read_committed reader received the output minus input append time: p50, p99, p99.9.
    pub visible: [f64; 3],
    /// CPU steal on the machine during the run (`–` where unknown).
    pub steal: String,
    /// How loaded the machine was while the input was paced.
    pub load: Load,
    /// The p99 of every run of this contender at this rate; this row is the median one.
    pub p99_of_runs: Vec<(f64, Stalls)>,
}

/// What the machine did while the input was paced (`None`: not readable here).
#[derive(Debug, Clone, Default)]
pub struct Load {
    /// Share of all the machine's CPU time that was busy, in percent.
    pub machine_busy_pct: Option<f64>,
    /// Moments the machine did not run the harness, from the paced input's start to the last
    /// output.
    pub stalls: Stalls,
    /// Cores the contender's process used on average.
    pub contender_cores: Option<f64>,
    /// Cores the broker's processes used on average (`TALLY_BENCH_BROKER_PIDS`).
    pub broker_cores: Option<f64>,
    /// The contender's thread that ran most: its name, the cores it ran on and the cores' worth
    /// of time it waited for one, on average.
    pub busiest_thread: Option<(String, f64, f64)>,
}

/// One output: its seq, its append time and when the reader got it (ms since the epoch).
type Seen = (usize, i64, i64);

/// The run with the median p99 of `runs`, carrying every run's p99; None if there is none.
pub fn median_run(mut runs: Vec<Latency>) -> Option<Latency> {
    runs.sort_by(|a, b| a.append[1].total_cmp(&b.append[1]));
    let p99s = runs.iter().map(|l| (l.append[1], l.load.stalls)).collect();
    let mut median = runs.get(runs.len().saturating_sub(1) / 2)?.clone();
    median.p99_of_runs = p99s;
    Some(median)
}

/// Runs `c` on payments (256 B values, no duplicates) at `rate` records/s for
/// `o.latency_secs`; the first quarter of the paced records is warm-up and not measured.
pub fn run(c: Contender, rate: f64, o: &Options, id: &str, programs: &Programs, log_dir: &Path) -> Result<Latency> {
    let (secs, partitions) = (o.latency_secs, o.partitions);
    let input = format!("bench-{id}-in");
    let names = RunNames::new(id, &input);
    let append_time = [("message.timestamp.type", "LogAppendTime")];
    kafka::create_topics(&[(&input, partitions), (&names.output, partitions)], &append_time)?;
    kafka::create_topics(&[(&names.dlq, 1)], &[])?;
    if c == Contender::CeilingTwoHop {
        kafka::create_topics(&[(&names.middle, partitions)], &[])?;
    }
    let measured = (rate * secs as f64) as usize;
    let total = WARMUP + measured;
    let count = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (output, count, stop) = (names.output.clone(), count.clone(), stop.clone());
        std::thread::spawn(move || watch(&output, partitions, total, &count, &stop))
    };
    let ticks_before = CpuTicks::now();
    let result = drive(
        c,
        &names,
        partitions,
        programs,
        log_dir,
        rate,
        measured,
        &count,
        &o.broker_pids,
    );
    let steal = host::steal_text(ticks_before, CpuTicks::now());
    stop.store(true, Ordering::SeqCst);
    let seen = watcher
        .join()
        .map_err(|_| anyhow::anyhow!("the output watcher panicked"))??;
    let load = result?;
    let appended = input_append_times(&input, partitions, total)?;
    kafka::delete_prefixed(&names.app)?;
    let first_measured = WARMUP + (measured as f64 * WARM_SHARE) as usize;
    let expected = total - first_measured;
    if let Some(dir) = &o.latency_dump {
        dump(&dir.join(format!("{id}.csv")), &seen, &appended)?;
    }
    let mut append = Vec::with_capacity(expected);
    let mut visible = Vec::with_capacity(expected);
    for (seq, out_ts, recv_ms) in seen.into_iter().filter(|s| s.0 >= first_measured) {
        if let Some(in_ts) = appended.get(&seq) {
            append.push((out_ts - in_ts) as f64);
            visible.push((recv_ms - in_ts) as f64);
        }
    }
    if append.len() < expected {
        bail!("{}: only {} of {expected} latency samples", c.name(), append.len());
    }
    let span = |seq: usize| appended.get(&seq).copied().unwrap_or(0);
    let span_s = (span(total - 1) - span(first_measured)) as f64 / 1000.0;
    Ok(Latency {
        contender: c,
        rate,
        records: append.len(),
        achieved_rate: expected as f64 / span_s.max(1e-3),
        append: percentiles(append),
        visible: percentiles(visible),
        steal,
        load,
        p99_of_runs: Vec::new(),
    })
}

/// Writes every sample (warm-up included) as `seq,input_append_ms,output_append_ms,received_ms`.
fn dump(path: &Path, seen: &[Seen], appended: &HashMap<usize, i64>) -> Result<()> {
    let mut csv = String::from("seq,input_append_ms,output_append_ms,received_ms\n");
    for (seq, out_ts, recv_ms) in seen {
        if let Some(in_ts) = appended.get(seq) {
            let _ = writeln!(csv, "{seq},{in_ts},{out_ts},{recv_ms}");
        }
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, csv).with_context(|| format!("writing {}", path.display()))
}

/// Starts the contender, warms it up, paces the input and waits for every output; measures the
/// machine's load while the input is paced.
#[allow(clippy::too_many_arguments)]
fn drive(
    c: Contender,
    names: &RunNames,
    partitions: i32,
    programs: &Programs,
    log_dir: &Path,
    rate: f64,
    measured: usize,
    count: &AtomicUsize,
    broker: &[u32],
) -> Result<Load> {
    let mut proc = contender::start(c, Topology::Payments, names, partitions, Passes::ONE, programs, log_dir)?;
    let producer = kafka::paced_producer(5)?;
    let seed = 7;
    for seq in 0..WARMUP {
        let (k, v) = workload::payment_record(seed, seq, seq, 256);
        kafka::send(&producer, &names.input, k.as_bytes(), &v)?;
    }
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(30))?;
    wait_for(count, WARMUP, Duration::from_secs(180), &mut proc).context("warm-up")?;
    let before = (CpuTicks::now(), probe::cpu_s(&[proc.pid]), probe::cpu_s(broker));
    let threads_before = probe::thread_times(proc.pid);
    let start = Instant::now();
    for i in 0..measured {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        while Instant::now() < due {
            producer.poll(Duration::ZERO);
            std::thread::sleep((due - Instant::now()).min(Duration::from_millis(1)));
        }
        let seq = WARMUP + i;
        let (k, v) = workload::payment_record(seed, seq, seq, 256);
        kafka::send(&producer, &names.input, k.as_bytes(), &v)?;
    }
    let paced_s = start.elapsed().as_secs_f64();
    let cores = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (b - a) / paced_s);
    let paced = Load {
        machine_busy_pct: before.0.zip(CpuTicks::now()).and_then(|(a, b)| b.busy_since(&a)),
        contender_cores: cores(before.1, probe::cpu_s(&[proc.pid])),
        broker_cores: cores(before.2, probe::cpu_s(broker)),
        busiest_thread: probe::busiest_thread(&threads_before, &probe::thread_times(proc.pid), paced_s),
        ..Load::default()
    };
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(30))?;
    wait_for(count, WARMUP + measured, Duration::from_secs(120), &mut proc)?;
    let stalls = Stalls::between(start, Instant::now());
    proc.stop()?;
    Ok(Load { stalls, ..paced })
}

fn wait_for(count: &AtomicUsize, n: usize, timeout: Duration, proc: &mut contender::Running) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while count.load(Ordering::SeqCst) < n {
        proc.check_alive()?;
        if Instant::now() > deadline {
            bail!(
                "{} of {n} outputs after {timeout:?}; log tail:\n{}",
                count.load(Ordering::SeqCst),
                proc.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn watch(topic: &str, partitions: i32, total: usize, count: &AtomicUsize, stop: &AtomicBool) -> Result<Vec<Seen>> {
    let reader = kafka::committed_reader(topic, partitions)?;
    let mut seen = Vec::with_capacity(total);
    while seen.len() < total && !stop.load(Ordering::SeqCst) {
        if let Some(m) = kafka::next(&reader, Duration::from_millis(50)).context("reading the output")? {
            let received = now_ms();
            let seq = m.payload().and_then(workload::seq_of).context("output without a seq")?;
            let ts = m.timestamp().to_millis().context("output without a timestamp")?;
            seen.push((seq, ts, received));
            count.store(seen.len(), Ordering::SeqCst);
        }
    }
    Ok(seen)
}

fn input_append_times(topic: &str, partitions: i32, total: usize) -> Result<HashMap<usize, i64>> {
    let reader = kafka::committed_reader(topic, partitions)?;
    let mut times = HashMap::with_capacity(total);
    // The ceilings are paced at hundreds of thousands of records/s: reading them back takes
    // longer than two minutes (12.3M of 12.9M in 120 s on the 2-core VM).
    let allowed = Duration::from_secs(120).max(Duration::from_secs_f64(total as f64 / READ_BACK_FLOOR_PER_S));
    let deadline = Instant::now() + allowed;
    while times.len() < total && Instant::now() < deadline {
        if let Some(m) = reader.poll(Duration::from_millis(100)) {
            let m = m.context("reading the input back")?;
            if let (Some(seq), Some(ts)) = (m.payload().and_then(workload::seq_of), m.timestamp().to_millis()) {
                times.insert(seq, ts);
            }
        }
    }
    Ok(times)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// p50, p99 and p99.9 (nearest rank).
fn percentiles(mut v: Vec<f64>) -> [f64; 3] {
    v.sort_by(f64::total_cmp);
    let at = |p: f64| {
        let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1]
    };
    [at(0.5), at(0.99), at(0.999)]
}
