//! The per-record work of a stream thread without Kafka: what tally's own code costs per record,
//! measured where the shared machine's broker and librdkafka threads cannot blur it.
//!
//! For each workload of `bench/compare`'s matrix that repartitions, the benchmark's records go
//! through both stages as a stream thread runs them: the source stage re-keys each record
//! (`PipelineProcessor::rekey`), then the repartition stage decides it
//! (`PipelineProcessor::process`) against the task store of its partition (3 partitions, as in
//! the side-by-side benchmark), and every `COMMIT_EVERY` records each store hands out its
//! changelog writes and commits. No record is produced or consumed: librdkafka's share (about
//! a third of tally's CPU in a drain, `docs/performance.md`) is not here.
//!
//! Figures are the thread's CPU time (`/proc/thread-self/schedstat`, in ns) per record, the median
//! of `TALLY_BENCH_PROCESS_ROUNDS` rounds (default 5) of `TALLY_BENCH_PROCESS_RECORDS` records
//! (default 600,000), each round on fresh stores. A round whose outputs are not exactly the
//! workload's expected count fails the benchmark.
//!
//! Run with `cargo bench --locked --bench process` (no broker needed); `TALLY_BENCH_WORKLOADS`
//! (comma-separated names) picks workloads.

#[path = "../bench/compare/workload.rs"]
#[allow(dead_code)] // the side-by-side benchmark uses the rest of the matrix's code
mod workload;

use std::path::Path;
use std::sync::Arc;
use tally::config;
use tally::processors::{Decision, Input, PipelineProcessor};
use tally::store::{GlobalMappings, StoreEnv, TaskStore};
use workload::{Topology, Workload};

/// tally's allocator, as in the binary (`src/allocator.rs`), with mimalloc's default purge delay.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Partitions (tasks, stores) the records are spread over, as in the side-by-side benchmark.
const PARTITIONS: usize = 3;
/// Records between two commits: about one 100 ms commit interval of a drain at 60,000 records/s.
const COMMIT_EVERY: usize = 6_000;

/// CPU time of one round, per stage, in ns.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    rekey: u64,
    process: u64,
    commit: u64,
}

fn main() -> anyhow::Result<()> {
    let records: usize = env("TALLY_BENCH_PROCESS_RECORDS", 600_000)?;
    let rounds: usize = env("TALLY_BENCH_PROCESS_ROUNDS", 5)?.max(1);
    let chosen: Option<Vec<String>> = std::env::var("TALLY_BENCH_WORKLOADS")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    println!("| workload | re-key (stage 1) | decide (stage 2) | commit | total | µs per record, min–max of rounds |");
    println!("|---|---|---|---|---|---|");
    for w in workload::matrix() {
        if w.topology.one_hop() || chosen.as_ref().is_some_and(|c| !c.contains(&w.name)) {
            continue;
        }
        let input = w.generate(records, 42);
        let processor = processor(repo, &w)?;
        let mut all = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            all.push(round(&processor, &input, &w)?);
        }
        let per_record = |ns: u64| ns as f64 / records as f64 / 1000.0;
        let median = |f: fn(&Round) -> u64| {
            let mut v: Vec<u64> = all.iter().map(f).collect();
            v.sort_unstable();
            per_record(v[v.len() / 2])
        };
        let totals: Vec<f64> = all.iter().map(|r| per_record(r.rekey + r.process + r.commit)).collect();
        let (lo, hi) = totals
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &t| (lo.min(t), hi.max(t)));
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {lo:.2}–{hi:.2} |",
            w.name,
            median(|r| r.rekey),
            median(|r| r.process),
            median(|r| r.commit),
            median(|r| r.rekey + r.process + r.commit),
        );
    }
    println!(
        "\n{records} records per round, median of {rounds} rounds, thread CPU time; commits every {COMMIT_EVERY} records \
         over {PARTITIONS} task stores; no Kafka client involved."
    );
    Ok(())
}

/// The processor of the workload's example topology, with its defaults (no environment).
fn processor(repo: &Path, w: &Workload) -> anyhow::Result<PipelineProcessor> {
    let file = match w.topology {
        Topology::Payments => "topologies/payments.yaml",
        Topology::Entities => "topologies/entity-sync.yaml",
        Topology::PaymentsKeyed => "topologies/payments-keyed.yaml",
    };
    let text = std::fs::read_to_string(repo.join(file))?;
    let t = config::load_str(file, &text, |_| None).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
    let pipeline = Arc::new(t.pipelines[0].clone());
    let global = Arc::new(GlobalMappings::in_memory()?);
    Ok(PipelineProcessor::new(pipeline, t.processing.max_record_bytes, global))
}

/// One pass over the input on fresh stores; fails unless the outputs are the expected ones.
fn round(p: &PipelineProcessor, input: &workload::Input, w: &Workload) -> anyhow::Result<Round> {
    let dir = tempfile::tempdir()?;
    let env = StoreEnv::default();
    let names = p.pipeline().store_names();
    let mut stores = (0..PARTITIONS)
        .map(|i| TaskStore::open(&dir.path().join(i.to_string()), &names, &env))
        .collect::<Result<Vec<_>, _>>()?;

    let started = cpu_ns()?;
    let mut keys = Vec::with_capacity(input.records.len());
    for (i, (_, value)) in input.records.iter().enumerate() {
        match p.rekey(&input_of(i, value), false) {
            Ok(r) => keys.push(r.key),
            Err(rejected) => anyhow::bail!("{}: record {i} refused at the hop: {:?}", w.name, rejected.decision),
        }
    }
    let rekeyed = cpu_ns()?;

    let mut outputs = 0;
    let mut commit = 0;
    for (i, (_, value)) in input.records.iter().enumerate() {
        let store = &mut stores[partition(&keys[i])];
        let processed = p.process(&input_of(i, value), store)?;
        match processed.decision {
            Decision::Emit { .. } => outputs += 1,
            Decision::Duplicate { .. } | Decision::Stale { .. } => {}
            other => anyhow::bail!("{}: record {i} decided {other:?}", w.name),
        }
        if (i + 1) % COMMIT_EVERY == 0 || i + 1 == input.records.len() {
            let before = cpu_ns()?;
            for s in &mut stores {
                // Each write's changelog record is built from these at a commit.
                let bytes: usize = s.unlogged().map(|c| c.key.len() + c.value.map_or(0, <[u8]>::len)).sum();
                std::hint::black_box(bytes);
                s.commit(&[])?;
            }
            commit += cpu_ns()? - before;
        }
    }
    let processed = cpu_ns()?;
    if outputs != input.expected_outputs {
        anyhow::bail!("{}: {outputs} outputs, {} expected", w.name, input.expected_outputs);
    }
    Ok(Round {
        rekey: rekeyed - started,
        process: processed - rekeyed - commit,
        commit,
    })
}

/// The `i`-th record as a stream thread hands it to the processor.
fn input_of(i: usize, value: &[u8]) -> Input<'_> {
    Input {
        payload: Some(value),
        correlation_header: None,
        coordinates: ("in", (i % PARTITIONS) as i32, i as i64),
        now_ms: 1_000_000,
    }
}

/// The task a re-keyed record goes to (any stable spread will do: no partitioner is compared).
fn partition(key: &str) -> usize {
    key.bytes()
        .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize))
        % PARTITIONS
}

/// This thread's CPU time so far, in ns (the first field of its schedstat).
fn cpu_ns() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    text.split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("unreadable /proc/thread-self/schedstat: {text:?}"))
}

fn env(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|_| anyhow::anyhow!("{name}={v} is not a number")),
        Err(_) => Ok(default),
    }
}
