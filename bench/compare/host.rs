//! The whole machine while something ran: the share of CPU time the hypervisor gave to other
//! guests (steal) and the moments the machine did not run the harness at all (stalls) explain
//! runs that are slow for no reason of their own, and the busy share says how much of the
//! machine a run really left free.

use std::fmt;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often the stall watcher wakes.
const STALL_TICK: Duration = Duration::from_millis(10);
/// A wake-up this much later than asked is a stall: far beyond what the scheduler does to a
/// sleeping thread on a loaded machine (tens of ms), and the order of the broker pauses that
/// matter to latency.
pub const STALL_MIN: Duration = Duration::from_millis(250);

/// Every stall seen since `watch_stalls` started: when it began and how long it lasted.
static STALLS: OnceLock<Mutex<Vec<(Instant, Duration)>>> = OnceLock::new();

/// Starts a thread that sleeps `STALL_TICK` at a time and records every wake-up that came
/// `STALL_MIN` or more late: the machine did not run it, because the VM was paused or starved.
/// Such a stall delays every process at once and is no contender's doing; runs without one had
/// the machine throughout, so their slow moments were the contender's or the broker's own.
pub fn watch_stalls() {
    if STALLS.set(Mutex::new(Vec::new())).is_err() {
        return;
    }
    std::thread::spawn(|| loop {
        let before = Instant::now();
        std::thread::sleep(STALL_TICK);
        let late = before.elapsed().saturating_sub(STALL_TICK);
        if late >= STALL_MIN {
            if let Some(stalls) = STALLS.get() {
                stalls.lock().unwrap_or_else(|e| e.into_inner()).push((before, late));
            }
        }
    });
}

/// The stalls that began between two instants.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stalls {
    /// How many.
    pub count: usize,
    /// Their total length, seconds.
    pub total_s: f64,
    /// The longest, seconds.
    pub longest_s: f64,
}

impl Stalls {
    /// The stalls recorded from `from` to `to` (none when the watcher is not running).
    pub fn between(from: Instant, to: Instant) -> Self {
        let Some(stalls) = STALLS.get() else {
            return Self::default();
        };
        let stalls = stalls.lock().unwrap_or_else(|e| e.into_inner());
        stalls
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .fold(Self::default(), |acc, (_, d)| Self {
                count: acc.count + 1,
                total_s: acc.total_s + d.as_secs_f64(),
                longest_s: acc.longest_s.max(d.as_secs_f64()),
            })
    }
}

impl fmt::Display for Stalls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.count {
            0 => f.write_str("none"),
            1 => write!(f, "1 of {:.1} s", self.longest_s),
            n => write!(f, "{n}, {:.1} s in all, longest {:.1} s", self.total_s, self.longest_s),
        }
    }
}

/// Cumulative CPU ticks of the whole machine from `/proc/stat`.
#[derive(Debug, Clone, Copy)]
pub struct CpuTicks {
    steal: u64,
    idle: u64,
    total: u64,
}

impl CpuTicks {
    /// Reads the `cpu` line of `/proc/stat`; `None` where there is none (not Linux).
    pub fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let ticks: Vec<u64> = line.split_whitespace().skip(1).filter_map(|t| t.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal [guest guest_nice, already in user]
        let steal = *ticks.get(7)?;
        let idle = ticks.get(3)? + ticks.get(4)?;
        let total = ticks.iter().take(8).sum();
        Some(Self { steal, idle, total })
    }

    /// Share of the CPU time since `earlier` that was neither idle nor stolen, in percent.
    pub fn busy_since(&self, earlier: &Self) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total).filter(|t| *t > 0)?;
        let idle = self.idle.checked_sub(earlier.idle)?;
        let steal = self.steal.checked_sub(earlier.steal)?;
        Some(100.0 * total.saturating_sub(idle + steal) as f64 / total as f64)
    }

    /// Share of the CPU time since `earlier` that was stolen, in percent.
    pub fn steal_since(&self, earlier: &Self) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total).filter(|t| *t > 0)?;
        let steal = self.steal.checked_sub(earlier.steal)?;
        Some(100.0 * steal as f64 / total as f64)
    }
}

/// Steal over a span, or `–` where it could not be read.
pub fn steal_text(from: Option<CpuTicks>, to: Option<CpuTicks>) -> String {
    match from.zip(to).and_then(|(a, b)| b.steal_since(&a)) {
        Some(p) => format!("{p:.0}%"),
        None => "–".to_string(),
    }
}
