//! The fault schedule: three tally instances (static membership, a state directory each) that
//! are SIGKILLed, bounced, scaled 3 → 1 → 3, robbed of their state and frozen into zombies, and
//! a broker that is stopped (SIGTERM) or killed (SIGKILL) and started again with its data.

use crate::common::{bootstrap, free_address, http_get, local_broker, local_broker_is_the_test_broker, Tally};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL a random instance, restart it 0.3 s later.
    Kill,
    /// Scale 3 → 1 (clean stops), a clean bounce of the survivor, then back to 3.
    Scale,
    /// Stop the broker with SIGTERM (`true`: SIGKILL), start it again with its data.
    BrokerRestart { sigkill: bool },
    /// SIGKILL a random instance, delete its state directory, restart it: it must rebuild
    /// its stores from the changelogs.
    LoseState,
    /// SIGSTOP a random instance past its session timeout, so the group gives its partitions
    /// to the others, then SIGCONT it: a zombie with an open transaction, which Kafka must fence
    /// (KIP-447: its offsets carry a stale generation) and which must write nothing twice.
    Freeze,
}

/// How long a frozen instance stays stopped: past the chaos topology's 6 s session timeout.
const FROZEN_FOR: Duration = Duration::from_secs(10);

/// How many of each fault; the order comes from the seed.
pub struct Plan {
    /// SIGKILLs of random instances.
    pub kills: u64,
    /// 3 → 1 → 3 cycles.
    pub scales: u64,
    /// Broker restarts; the first is a SIGKILL, then SIGTERM and SIGKILL alternate.
    pub broker_restarts: u64,
    /// Instances that lose their state directory.
    pub state_losses: u64,
    /// Instances frozen (SIGSTOP) past their session timeout and then resumed.
    pub freezes: u64,
}

impl Plan {
    /// The faults in a seeded order; a kill comes first so the instances are up and busy before
    /// the rarer faults.
    pub fn schedule(&self, rng: &mut StdRng) -> Vec<Fault> {
        let mut rest: Vec<Fault> = std::iter::repeat_n(Fault::Kill, self.kills.saturating_sub(1) as usize)
            .chain(std::iter::repeat_n(Fault::Scale, self.scales as usize))
            .chain((0..self.broker_restarts).map(|i| Fault::BrokerRestart { sigkill: i % 2 == 0 }))
            .chain(std::iter::repeat_n(Fault::LoseState, self.state_losses as usize))
            .chain(std::iter::repeat_n(Fault::Freeze, self.freezes as usize))
            .collect();
        rest.shuffle(rng);
        let first = (self.kills > 0).then_some(Fault::Kill);
        first.into_iter().chain(rest).collect()
    }
}

const IDS: [&str; 3] = ["c1", "c2", "c3"];

/// The instances of one run.
pub struct Cluster {
    topology: PathBuf,
    dir: PathBuf,
    running: Vec<Option<Tally>>,
    launches: usize,
    http: Vec<String>,
    /// Instances that exited without being told to, exited badly or hung on SIGTERM.
    pub exits: Vec<String>,
}

impl Cluster {
    /// Starts three instances of `topology`, each with its state directory and HTTP port.
    pub fn start(topology: &Path, dir: &Path) -> Self {
        // Each instance keeps its port across restarts, so it must be one no client connection
        // can take while the instance is down.
        let http = IDS.iter().map(|_| free_address()).collect();
        let mut cluster = Self {
            topology: topology.to_path_buf(),
            dir: dir.to_path_buf(),
            running: IDS.iter().map(|_| None).collect(),
            launches: 0,
            http,
            exits: Vec::new(),
        };
        for i in 0..IDS.len() {
            cluster.launch(i);
        }
        cluster
    }

    /// The reconciler's open-event gauge summed over the instances' `/metrics`, polled until
    /// all `tasks` reconciler tasks report and the sum is 0, or for `stall` neither the sum has
    /// fallen nor `progress` (the group's committed position on the trace topic) has grown: the
    /// reconciler reads the trace topic behind the pipelines and may still be catching up when
    /// they are done, its open count rising while it reads openings. Returns (sum, tasks
    /// reporting).
    pub fn reconciler_open_events(
        &self,
        tasks: usize,
        stall: Duration,
        mut progress: impl FnMut() -> i64,
    ) -> (i64, usize) {
        let (mut lowest, mut deadline) = (i64::MAX, Instant::now() + stall);
        let mut position = progress();
        loop {
            let mut gauges: HashMap<String, i64> = HashMap::new();
            for addr in &self.http {
                let body = http_get(addr, "/metrics").map(|(_, b)| b).unwrap_or_default();
                for line in body.lines().filter(|l| l.starts_with("tally_reconcile_open_events{")) {
                    if let Some((series, value)) = line.rsplit_once(' ') {
                        *gauges.entry(series.to_string()).or_default() +=
                            value.parse::<f64>().unwrap_or(f64::NAN) as i64;
                    }
                }
            }
            let sum = gauges.values().sum();
            if gauges.len() >= tasks && sum < lowest {
                (lowest, deadline) = (sum, Instant::now() + stall);
            }
            let now_at = progress();
            if now_at > position {
                (position, deadline) = (now_at, Instant::now() + stall);
            }
            if (gauges.len() >= tasks && sum == 0) || Instant::now() >= deadline {
                return (sum, gauges.len());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn state_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("state-{}", IDS[i]))
    }

    fn launch(&mut self, i: usize) {
        self.launches += 1;
        // Each instance keeps its state directory across restarts, as on its own host.
        let mut env = vec![
            ("TALLY_STATE_DIR", self.state_dir(i).display().to_string()),
            ("TALLY_HTTP_ADDRESS", self.http[i].clone()),
        ];
        // TALLY_CHAOS_RUST_LOG (e.g. `info,librdkafka=debug` with TALLY_CHAOS_KAFKA_DEBUG=cgrp)
        // shows the group protocol when a run needs diagnosing.
        if let Ok(filter) = std::env::var("TALLY_CHAOS_RUST_LOG") {
            env.push(("RUST_LOG", filter));
        }
        let log = self.dir.join(format!("{}-{}.log", IDS[i], self.launches));
        self.running[i] = Some(Tally::start_with_env(&self.topology, IDS[i], log, &env));
    }

    /// Applies one fault; returns what it did, for the run's log.
    pub fn apply(&mut self, fault: Fault, rng: &mut StdRng) -> String {
        match fault {
            Fault::Kill => {
                let i = rng.random_range(0..IDS.len());
                self.kill(i);
                std::thread::sleep(Duration::from_millis(300));
                self.launch(i);
                format!("SIGKILL {}", IDS[i])
            }
            Fault::LoseState => {
                let i = rng.random_range(0..IDS.len());
                self.kill(i);
                let state = self.state_dir(i);
                std::fs::remove_dir_all(&state).unwrap_or_else(|e| panic!("deleting {}: {e}", state.display()));
                self.launch(i);
                format!("SIGKILL {} and delete its state directory", IDS[i])
            }
            Fault::Freeze => {
                let i = rng.random_range(0..IDS.len());
                match &self.running[i] {
                    Some(t) => {
                        t.signal("STOP");
                        std::thread::sleep(FROZEN_FOR);
                        t.signal("CONT");
                        format!("SIGSTOP {} for {} s, then SIGCONT", IDS[i], FROZEN_FOR.as_secs())
                    }
                    None => format!("{} not running: nothing to freeze", IDS[i]),
                }
            }
            Fault::Scale => {
                for i in 1..IDS.len() {
                    self.stop(i);
                }
                std::thread::sleep(Duration::from_secs(3));
                self.stop(0);
                self.launch(0);
                std::thread::sleep(Duration::from_secs(2));
                for i in 1..IDS.len() {
                    self.launch(i);
                }
                "scaled 3 → 1 (clean stops), bounced c1, back to 3".to_string()
            }
            Fault::BrokerRestart { sigkill } => {
                local_broker(if sigkill { "kill" } else { "down" });
                std::thread::sleep(Duration::from_secs(2));
                local_broker("up");
                self.check_alive();
                format!(
                    "broker {} and up again",
                    if sigkill { "SIGKILLed" } else { "stopped (SIGTERM)" }
                )
            }
        }
    }

    fn kill(&mut self, i: usize) {
        if let Some(t) = self.running[i].take() {
            t.kill();
        }
    }

    /// A clean stop; an instance that exits badly or hangs is noted (and SIGKILLed).
    fn stop(&mut self, i: usize) {
        if let Some(mut t) = self.running[i].take() {
            if let Err(problem) = t.terminate(Duration::from_secs(60)) {
                let first = problem.lines().next().unwrap_or_default().to_string();
                eprintln!("{}: {problem}", IDS[i]);
                self.exits.push(format!("{}: {first}", IDS[i]));
            }
        }
    }

    /// Notes and restarts instances that exited on their own (tally must ride out faults).
    pub fn check_alive(&mut self) {
        for (i, id) in IDS.iter().enumerate() {
            let exited = self.running[i].as_mut().and_then(Tally::exited);
            if let Some(status) = exited {
                let log = self.running[i].take().map(|t| t.log().display().to_string());
                self.exits
                    .push(format!("{id} exited with {status} (log {})", log.unwrap_or_default()));
                self.launch(i);
            }
        }
    }

    /// Stops every instance cleanly.
    pub fn stop_all(&mut self) {
        for i in 0..IDS.len() {
            self.stop(i);
        }
    }
}

/// Refuses to restart a broker the script does not manage at the test's bootstrap address.
pub fn assert_broker_is_ours() {
    assert!(
        local_broker_is_the_test_broker(),
        "the chaos run restarts the broker, but deploy/local/kafka does not manage a running broker at {}; \
         set TALLY_KAFKA_HOME/TALLY_KAFKA_PORT/TALLY_KAFKA_CONTROLLER_PORT for the test's broker, \
         or TALLY_CHAOS_BROKER_RESTARTS=0",
        bootstrap()
    );
}
