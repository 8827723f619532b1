//! The scale section (`TALLY_BENCH_SCALE=1`): tally as a group of 3 instances × 2 stream threads
//! over 6 partitions beside 1 instance × 1 thread on the same input, and tally's memory with
//! 1M and 10M distinct entities in its version store. tally only: these rows are about tally
//! growing, not about the peers.

use crate::contender::{self, Programs, RunNames, Running};
use crate::drain::{self, Watched};
use crate::kafka;
use crate::options::Options;
use crate::workload::{self, Topology};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::time::{Duration, Instant};

/// Partitions of the group runs' topics.
pub const GROUP_PARTITIONS: i32 = 6;
/// The group shapes run: (instances, stream threads each).
pub const SHAPES: [(usize, usize); 2] = [(1, 1), (3, 2)];
/// Value size of the entity runs.
pub const ENTITY_VALUE_BYTES: usize = 256;
/// The workload of the group runs.
pub const GROUP_WORKLOAD: &str = "payments-256B-dup10";
/// Records produced per chunk of an entity run's input, so 10M never sit in memory at once.
const CHUNK: usize = 500_000;

/// One run of a group shape.
pub struct GroupRun {
    /// Instances in the consumer group.
    pub instances: usize,
    /// Stream threads per instance.
    pub threads: usize,
    /// Input records per second, first to last expected output.
    pub throughput: f64,
    /// CPU seconds per 1M input records, all instances together.
    pub cpu_s_per_m: f64,
    /// Peak RSS of each instance, MiB.
    pub peak_rss_mib: Vec<f64>,
    /// Outputs read (the run fails unless they are the expected count).
    pub outputs: usize,
    /// Outputs a correct run makes.
    pub expected: usize,
}

/// One run with `distinct` entities.
pub struct EntityRun {
    /// Distinct entities, one record each.
    pub distinct: usize,
    /// Input records per second.
    pub throughput: f64,
    /// CPU seconds per 1M input records.
    pub cpu_s_per_m: f64,
    /// Peak RSS, MiB.
    pub peak_rss_mib: f64,
    /// Bytes in tally's state directory at the end.
    pub state_bytes: u64,
}

/// Everything the scale section measured.
#[derive(Default)]
pub struct ScaleResults {
    /// Group runs, in [`SHAPES`] order.
    pub groups: Vec<GroupRun>,
    /// Entity runs, in `TALLY_BENCH_SCALE_ENTITIES` order.
    pub entities: Vec<EntityRun>,
}

/// Runs the scale section; failed runs go to `failures`.
pub fn run(o: &Options, tag: &str, programs: &Programs, log_dir: &Path, failures: &mut Vec<String>) -> ScaleResults {
    let mut results = ScaleResults::default();
    if let Err(e) = groups(o, tag, programs, log_dir, &mut results, failures) {
        failures.push(format!("scale, group runs: {e:#}"));
    }
    for &n in &o.scale_entities {
        eprintln!("bench: scale: {n} distinct entities");
        match entities(o, n, tag, programs, log_dir) {
            Ok(r) => results.entities.push(r),
            Err(e) => failures.push(format!("scale, {n} entities: {e:#}")),
        }
    }
    results
}

fn groups(
    o: &Options,
    tag: &str,
    programs: &Programs,
    log_dir: &Path,
    results: &mut ScaleResults,
    failures: &mut Vec<String>,
) -> Result<()> {
    let w = workload::matrix()
        .into_iter()
        .find(|w| w.name == GROUP_WORKLOAD)
        .context("the group workload is not in the matrix")?;
    let input = format!("bench-{tag}-scale-group-in");
    let generated = w.generate(o.scale_group_records, o.seed);
    kafka::create_topics(&[(&input, GROUP_PARTITIONS)], &[])?;
    kafka::preload(&input, &generated.records, w.topology.input_partitioner())?;
    let expected = generated.expected_outputs;
    drop(generated);
    let example = contender::example(Topology::Payments, programs);
    let yaml = std::fs::read_to_string(&example).with_context(|| format!("reading {}", example.display()))?;
    for (instances, threads) in SHAPES {
        eprintln!("bench: scale: {instances} instance(s) x {threads} thread(s) over {GROUP_PARTITIONS} partitions");
        let id = format!("{tag}-scale-{instances}x{threads}");
        match group(&yaml, (instances, threads), &input, expected, o, &id, programs, log_dir) {
            Ok(r) => results.groups.push(r),
            Err(e) => failures.push(format!("scale, {instances} x {threads}: {e:#}")),
        }
    }
    kafka::delete_prefixed(&input)
}

/// One group run: `instances` tally processes of `yaml` with `threads` stream threads each.
#[allow(clippy::too_many_arguments)]
fn group(
    yaml: &str,
    (instances, threads): (usize, usize),
    input: &str,
    expected: usize,
    o: &Options,
    id: &str,
    programs: &Programs,
    log_dir: &Path,
) -> Result<GroupRun> {
    const ONE_THREAD: &str = "threads: 1\n";
    if !yaml.contains(ONE_THREAD) {
        bail!("topologies/payments.yaml no longer says `{}`", ONE_THREAD.trim());
    }
    let dir = tempfile::tempdir().context("creating a directory for the topology")?;
    let file = dir.path().join("payments.yaml");
    std::fs::write(&file, yaml.replace(ONE_THREAD, &format!("threads: {threads}\n")))
        .with_context(|| format!("writing {}", file.display()))?;
    let names = RunNames::new(id, input);
    kafka::create_topics(&[(&names.output, GROUP_PARTITIONS), (&names.dlq, 1)], &[])?;
    let reader = kafka::committed_reader(&names.output, GROUP_PARTITIONS)?;
    let started = Instant::now();
    let mut procs = (0..instances)
        .map(|i| contender::start_tally(&file, &format!("i{i}"), &names, programs, log_dir))
        .collect::<Result<Vec<Running>>>()?;
    let watched = drain::watch(&reader, expected, &mut procs, &o.broker_pids, started, o.timeout);
    for p in procs {
        p.stop()?;
    }
    kafka::delete_prefixed(&names.app)?;
    let w = watched?;
    exact(&w, expected)?;
    Ok(GroupRun {
        instances,
        threads,
        throughput: o.scale_group_records as f64 / w.window_s,
        cpu_s_per_m: w.cpu_s / o.scale_group_records as f64 * 1e6,
        peak_rss_mib: w.peak_rss_mib,
        outputs: w.outputs,
        expected,
    })
}

/// One entity run: `n` distinct entities through `entity-sync.yaml`, one instance.
fn entities(o: &Options, n: usize, tag: &str, programs: &Programs, log_dir: &Path) -> Result<EntityRun> {
    let input = format!("bench-{tag}-scale-entities-{n}-in");
    kafka::create_topics(&[(&input, o.partitions)], &[])?;
    let t = Instant::now();
    for from in (0..n).step_by(CHUNK) {
        let chunk = workload::distinct_entities(from..(from + CHUNK).min(n), ENTITY_VALUE_BYTES);
        kafka::preload(&input, &chunk, Topology::Entities.input_partitioner())?;
    }
    eprintln!(
        "bench: scale: preloaded {n} records in {:.0}s",
        t.elapsed().as_secs_f64()
    );
    let names = RunNames::new(&format!("{tag}-scale-entities-{n}"), &input);
    kafka::create_topics(&[(&names.output, o.partitions), (&names.dlq, 1)], &[])?;
    let reader = kafka::committed_reader(&names.output, o.partitions)?;
    let started = Instant::now();
    let file = contender::example(Topology::Entities, programs);
    let mut proc = contender::start_tally(&file, "bench", &names, programs, log_dir)?;
    // Ten times the input of a matrix run: the timeout grows with it.
    let timeout = o.timeout.max(Duration::from_secs((n / 10_000) as u64));
    let watched = drain::watch(
        &reader,
        n,
        std::slice::from_mut(&mut proc),
        &o.broker_pids,
        started,
        timeout,
    );
    let state_bytes = proc.state_bytes();
    proc.stop()?;
    kafka::delete_prefixed(&names.app)?;
    kafka::delete_prefixed(&input)?;
    let w = watched?;
    exact(&w, n)?;
    Ok(EntityRun {
        distinct: n,
        throughput: n as f64 / w.window_s,
        cpu_s_per_m: w.cpu_s / n as f64 * 1e6,
        peak_rss_mib: w.peak_rss_mib.first().copied().unwrap_or_default(),
        state_bytes,
    })
}

/// A scale run counts only with exactly the expected outputs.
fn exact(w: &Watched, expected: usize) -> Result<()> {
    if w.outputs != expected {
        bail!("{} outputs, {expected} expected", w.outputs);
    }
    Ok(())
}
