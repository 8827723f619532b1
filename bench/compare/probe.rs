//! CPU time and peak resident memory of a running process, and its threads' scheduler times, from
//! /proc.

use std::collections::HashMap;
use std::process::Command;
use std::sync::OnceLock;

/// What a process has used so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// User + system CPU seconds of all its threads.
    pub cpu_s: f64,
    /// Peak resident set size (VmHWM), in MiB.
    pub peak_rss_mib: f64,
}

/// Reads the usage of `pid`, or `None` once the process is gone.
pub fn usage(pid: u32) -> Option<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at field 3 (`state`).
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(Usage {
        cpu_s: ticks / clock_ticks(),
        peak_rss_mib: hwm_kib / 1024.0,
    })
}

/// The CPU seconds `pids` used so far, together; `None` for no pids or once one is gone.
pub fn cpu_s(pids: &[u32]) -> Option<f64> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().map(|&pid| usage(pid).map(|u| u.cpu_s)).sum()
}

fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// One thread's scheduler times so far (`/proc/<pid>/task/<tid>/schedstat`).
#[derive(Debug, Clone)]
pub struct ThreadTimes {
    /// Its name (`comm`, at most 15 bytes).
    pub name: String,
    /// Nanoseconds it ran on a core.
    pub ran_ns: u64,
    /// Nanoseconds it was ready to run but waited for a core.
    pub waited_ns: u64,
}

/// The scheduler times of every thread of `pid`, by thread id; empty once the process is gone.
pub fn thread_times(pid: u32) -> HashMap<u32, ThreadTimes> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return HashMap::new();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let tid: u32 = task.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(task.path().join("comm"))
                .ok()?
                .trim()
                .to_string();
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            let mut fields = stat.split_whitespace().map(|f| f.parse::<u64>().ok());
            let (ran_ns, waited_ns) = (fields.next()??, fields.next()??);
            Some((
                tid,
                ThreadTimes {
                    name,
                    ran_ns,
                    waited_ns,
                },
            ))
        })
        .collect()
}

/// The thread that ran most between two [`thread_times`] snapshots, with the cores it ran on
/// and the cores' worth of time it waited for one over `secs` seconds: a thread whose running
/// and waiting add up to about 1 wanted a whole core and got only the running part.
pub fn busiest_thread(
    before: &HashMap<u32, ThreadTimes>,
    after: &HashMap<u32, ThreadTimes>,
    secs: f64,
) -> Option<(String, f64, f64)> {
    after
        .iter()
        .filter_map(|(tid, a)| {
            let b = before.get(tid)?;
            let ran = a.ran_ns.saturating_sub(b.ran_ns);
            let waited = a.waited_ns.saturating_sub(b.waited_ns);
            Some((a.name.clone(), ran, waited))
        })
        .max_by_key(|&(_, ran, _)| ran)
        .filter(|_| secs > 0.0)
        .map(|(name, ran, waited)| (name, ran as f64 / 1e9 / secs, waited as f64 / 1e9 / secs))
}
