//! CPU time and peak resident memory of a running process, from /proc.

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
