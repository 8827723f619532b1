//! The size gauges of one task's stores, refreshed at most every few seconds and removed when
//! the task closes, so a task that moved to another instance is not counted twice.

use super::Metrics;
use crate::store::StoreSize;
use prometheus::IntGaugeVec;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Shortest time between two reads of the RocksDB properties of one task.
const REFRESH: Duration = Duration::from_secs(5);

/// `tally_store_keys` and `tally_store_size_bytes` of one task.
pub struct StoreGauges {
    keys: IntGaugeVec,
    bytes: IntGaugeVec,
    task: String,
    stores: BTreeSet<String>,
    last: Option<Instant>,
}

impl StoreGauges {
    /// Gauges for task `task`.
    pub fn new(metrics: &Metrics, task: String) -> Self {
        Self {
            keys: metrics.store_keys.clone(),
            bytes: metrics.store_size.clone(),
            task,
            stores: BTreeSet::new(),
            last: None,
        }
    }

    /// True when the sizes have not been read for a while.
    pub fn due(&self) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= REFRESH)
    }

    /// Publishes freshly read sizes.
    pub fn set(&mut self, sizes: &[StoreSize]) {
        for s in sizes {
            let labels = [s.name.as_str(), self.task.as_str()];
            self.keys.with_label_values(&labels).set(clamp(s.keys));
            self.bytes.with_label_values(&labels).set(clamp(s.bytes));
            self.stores.insert(s.name.clone());
        }
        self.last = Some(Instant::now());
    }
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Drop for StoreGauges {
    fn drop(&mut self) {
        for store in &self.stores {
            let labels = [store.as_str(), self.task.as_str()];
            let _ = self.keys.remove_label_values(&labels);
            let _ = self.bytes.remove_label_values(&labels);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::core::Collector;

    #[test]
    fn sizes_are_published_per_store_and_task_and_removed_with_the_task() {
        let m = Metrics::new("app").expect("metrics");
        let mut g = StoreGauges::new(&m, "payments-3".into());
        assert!(g.due(), "never read yet");
        g.set(&[StoreSize {
            name: "payments-dedup".into(),
            keys: 42,
            bytes: 4096,
        }]);
        assert!(!g.due(), "just read");
        assert_eq!(
            m.store_keys.with_label_values(&["payments-dedup", "payments-3"]).get(),
            42
        );
        assert_eq!(
            m.store_size.with_label_values(&["payments-dedup", "payments-3"]).get(),
            4096
        );
        drop(g);
        let left: usize = m.store_keys.collect().iter().map(|f| f.get_metric().len()).sum();
        assert_eq!(left, 0, "a closed task leaves no series");
    }
}
