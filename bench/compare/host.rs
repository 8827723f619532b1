//! The whole machine's CPU time while something ran: the share the hypervisor gave to other
//! guests (steal) explains runs that are slow for no reason of their own, and the busy share
//! says how much of the machine a run really left free.

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
