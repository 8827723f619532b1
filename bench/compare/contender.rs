//! The three contenders and how to start and stop each as its own process.

use crate::kafka;
use crate::workload::Topology;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Who drains the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contender {
    /// Raw rdkafka consume → produce, no state, at least once (`bench/passthrough.rs`).
    Ceiling,
    /// The same passthrough doing two hops (input → middle topic → output) in one thread, as
    /// tally and Kafka Streams do with their repartition topic.
    CeilingTwoHop,
    /// `tally run` on the example topology, exactly once.
    Tally,
    /// The Kafka Streams app of `bench/kstreams`, exactly_once_v2.
    KStreams,
}

impl Contender {
    /// Name used in tables and topic names.
    pub fn name(self) -> &'static str {
        match self {
            Contender::Ceiling => "ceiling",
            Contender::CeilingTwoHop => "ceiling-2hop",
            Contender::Tally => "tally",
            Contender::KStreams => "kstreams",
        }
    }

    /// True for the raw passthroughs (no state, every record copied).
    pub fn is_ceiling(self) -> bool {
        matches!(self, Contender::Ceiling | Contender::CeilingTwoHop)
    }

    /// Parses a name from `TALLY_BENCH_CONTENDERS`.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Contender::Ceiling,
            Contender::CeilingTwoHop,
            Contender::Tally,
            Contender::KStreams,
        ]
        .into_iter()
        .find(|c| c.name() == s)
    }
}

/// Where the contenders' programs are.
#[derive(Debug, Clone)]
pub struct Programs {
    /// The repository (example topologies, broker script, Kafka Streams app).
    pub repo: PathBuf,
    /// `tally` in the Cargo output directory the harness runs (`TALLY_BENCH_BUILD`).
    pub tally: PathBuf,
    /// `examples/passthrough` in the same directory.
    pub passthrough: PathBuf,
    /// JVM options of the Kafka Streams app.
    pub java_opts: Vec<String>,
    /// Log filter (`RUST_LOG`) of tally runs.
    pub tally_log: String,
}

impl Programs {
    fn kstreams_classpath(&self) -> String {
        let t = self.repo.join("bench/kstreams/target");
        format!("{}:{}/lib/*", t.join("tally-kstreams-bench.jar").display(), t.display())
    }

    /// Fails early, saying how to build whatever is missing.
    pub fn check(&self, contenders: &[Contender]) -> Result<()> {
        let need = |c: Contender, path: PathBuf, how: &str| -> Result<()> {
            if contenders.contains(&c) && !path.exists() {
                bail!(
                    "{} is missing; build it with `{how}` (scripts/bench does)",
                    path.display()
                );
            }
            Ok(())
        };
        // A Cargo output directory is named for its profile.
        let profile = self
            .tally
            .parent()
            .and_then(|d| d.file_name())
            .map_or_else(|| "release".into(), |n| n.to_string_lossy());
        need(
            Contender::Tally,
            self.tally.clone(),
            &format!("cargo build --locked --profile {profile} --bin tally"),
        )?;
        for c in [Contender::Ceiling, Contender::CeilingTwoHop] {
            need(
                c,
                self.passthrough.clone(),
                &format!("cargo build --locked --profile {profile} --example passthrough"),
            )?;
        }
        need(
            Contender::KStreams,
            self.repo.join("bench/kstreams/target/tally-kstreams-bench.jar"),
            "mvn -q -B -f bench/kstreams/pom.xml package",
        )
    }
}

/// Topic and group names of one run; every topic starts with `app`.
#[derive(Debug, Clone)]
pub struct RunNames {
    /// Application id / consumer group, and the prefix of every topic of the run.
    pub app: String,
    /// The preloaded (or paced) input topic.
    pub input: String,
    /// Output topic.
    pub output: String,
    /// Dead-letter topic.
    pub dlq: String,
    /// The two-hop ceiling's middle topic.
    pub middle: String,
}

impl RunNames {
    /// Names for run `id` reading `input`.
    pub fn new(id: &str, input: &str) -> Self {
        let app = format!("bench-{id}");
        Self {
            output: format!("{app}-out"),
            dlq: format!("{app}-dlq"),
            middle: format!("{app}-mid"),
            input: input.to_string(),
            app,
        }
    }
}

/// A started contender; killed when dropped unless stopped.
pub struct Running {
    child: Child,
    /// Its process id.
    pub pid: u32,
    /// Its log file.
    pub log: PathBuf,
    /// Its state directory, removed with it.
    state: tempfile::TempDir,
}

/// How often a ceiling reads its input: `count` passes over `records` input records.
#[derive(Debug, Clone, Copy)]
pub struct Passes {
    /// Passes over the input.
    pub count: usize,
    /// Input records per pass.
    pub records: usize,
}

impl Passes {
    /// One pass, for inputs that are not preloaded (or contenders that read once).
    pub const ONE: Passes = Passes { count: 1, records: 0 };

    fn args(self) -> Vec<String> {
        if self.count <= 1 {
            return Vec::new();
        }
        vec![
            "--passes".into(),
            self.count.to_string(),
            "--input-records".into(),
            self.records.to_string(),
        ]
    }
}

/// Starts `c` on `topology` with `partitions` input partitions; a ceiling reads its input
/// `passes` times. Logs go to `log_dir`.
pub fn start(
    c: Contender,
    topology: Topology,
    names: &RunNames,
    partitions: i32,
    passes: Passes,
    programs: &Programs,
    log_dir: &Path,
) -> Result<Running> {
    let state = tempfile::tempdir().context("creating a state directory")?;
    let log = log_dir.join(format!("{}.log", names.app));
    let cmd = match c {
        Contender::Ceiling => {
            let mut cmd = Command::new(&programs.passthrough);
            cmd.args(passes.args())
                .args([&kafka::bootstrap(), &names.app, &names.input, &names.output]);
            cmd
        }
        Contender::CeilingTwoHop => {
            let mut cmd = Command::new(&programs.passthrough);
            cmd.args(passes.args()).args([
                &kafka::bootstrap(),
                &names.app,
                &names.input,
                &names.output,
                &names.middle,
            ]);
            cmd
        }
        Contender::Tally => tally_command(programs, &example(topology, programs), "bench", names, state.path()),
        Contender::KStreams => {
            let mode = match topology {
                Topology::Payments => "payments",
                Topology::Entities => "entities",
                Topology::PaymentsKeyed => "payments-keyed",
            };
            let mut cmd = Command::new("java");
            cmd.args(&programs.java_opts)
                .args(["-cp", &programs.kstreams_classpath(), "tally.bench.Main"])
                .env("KS_MODE", mode)
                .env("KAFKA_BOOTSTRAP", kafka::bootstrap())
                .env("KS_APP_ID", &names.app)
                .env("KS_INPUT", &names.input)
                .env("KS_OUTPUT", &names.output)
                .env("KS_DLQ", &names.dlq)
                .env("KS_STATE_DIR", state.path())
                .env("KS_PARTITIONS", partitions.to_string());
            cmd
        }
    };
    spawn(cmd, c.name(), &log, state)
}

/// The example topology file tally runs for `topology`.
pub fn example(topology: Topology, programs: &Programs) -> PathBuf {
    let file = match topology {
        Topology::Payments => "payments.yaml",
        Topology::Entities => "entity-sync.yaml",
        Topology::PaymentsKeyed => "payments-keyed.yaml",
    };
    programs.repo.join("topologies").join(file)
}

/// `tally run` of `topology_file` as instance `instance` on the run's topics, state in `state`.
fn tally_command(programs: &Programs, topology_file: &Path, instance: &str, names: &RunNames, state: &Path) -> Command {
    let mut cmd = Command::new(&programs.tally);
    cmd.args(["--log-json", "run"])
        .arg(topology_file)
        .args(["--instance-id", instance])
        .env("KAFKA_BOOTSTRAP", kafka::bootstrap())
        .env("TALLY_APP_ID", &names.app)
        .env("TALLY_STATE_DIR", state)
        .env("TALLY_INPUT_TOPIC", &names.input)
        .env("TALLY_OUTPUT_TOPIC", &names.output)
        .env("TALLY_DLQ_TOPIC", &names.dlq)
        .env("RUST_LOG", &programs.tally_log);
    cmd
}

/// Starts one tally instance `instance` of `topology_file` (a group member of the run `names`).
pub fn start_tally(
    topology_file: &Path,
    instance: &str,
    names: &RunNames,
    programs: &Programs,
    log_dir: &Path,
) -> Result<Running> {
    let state = tempfile::tempdir().context("creating a state directory")?;
    let cmd = tally_command(programs, topology_file, instance, names, state.path());
    spawn(
        cmd,
        "tally",
        &log_dir.join(format!("{}-{instance}.log", names.app)),
        state,
    )
}

/// Runs `cmd` with its output in `log`.
fn spawn(mut cmd: Command, what: &str, log: &Path, state: tempfile::TempDir) -> Result<Running> {
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let child = cmd
        .stdout(Stdio::from(file.try_clone()?))
        .stderr(Stdio::from(file))
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    Ok(Running {
        pid: child.id(),
        child,
        log: log.to_path_buf(),
        state,
    })
}

impl Running {
    /// Bytes the process's state directory holds now.
    pub fn state_bytes(&self) -> u64 {
        fn size(dir: &Path) -> u64 {
            std::fs::read_dir(dir).map_or(0, |entries| {
                entries
                    .flatten()
                    .map(|e| match e.file_type() {
                        Ok(t) if t.is_dir() => size(&e.path()),
                        _ => e.metadata().map_or(0, |m| m.len()),
                    })
                    .sum()
            })
        }
        size(self.state.path())
    }

    /// Fails, with the log's tail, if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("exited early with {status}; log tail:\n{}", self.log_tail());
        }
        Ok(())
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// SIGTERM, then SIGKILL if it has not exited after 60 s.
    pub fn stop(mut self) -> Result<ExitStatus> {
        let pid = self.pid.to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                self.child.kill()?;
                return Ok(self.child.wait()?);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
