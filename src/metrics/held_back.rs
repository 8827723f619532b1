//! Input partitions an open transaction holds back. A read_committed consumer reads no further
//! than a partition's last stable offset, the first offset of its oldest open transaction. When
//! that offset stands still below the high watermark for longer than a transaction can live,
//! the transaction is hanging: the broker lost its markers (Kafka 4.x skips the markers of a
//! partition that has no leader when it sends them, KAFKA-20734; docs/chaos-runs.md, cause 6),
//! and every reader of the partition is stalled with no error anywhere. This makes the stall
//! seen: `tally_input_held_back_seconds{topic, task}` and one warning per hold.

use super::client_statistics::Statistics;
use super::Metrics;
use crate::topology::Topology;
use prometheus::IntGaugeVec;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One partition whose last stable offset is below its high watermark.
struct Hold {
    /// The last stable offset when the hold was first seen at this value.
    stable: i64,
    since: Instant,
    task: String,
    warned: bool,
}

/// Publishes, per assigned partition, how long its last stable offset has stood still below its
/// high watermark, and warns once a hold outlasts `hanging_after`.
pub struct HeldBack {
    gauge: IntGaugeVec,
    topology: Arc<Topology>,
    hanging_after: Duration,
    holds: Mutex<HashMap<(String, i32), Hold>>,
}

impl HeldBack {
    /// A watch for one stream thread's consumer; holds longer than `hanging_after` are warned.
    pub fn new(metrics: &Metrics, topology: Arc<Topology>, hanging_after: Duration) -> Self {
        Self {
            gauge: metrics.input_held_back.clone(),
            topology,
            hanging_after,
            holds: Mutex::new(HashMap::new()),
        }
    }

    /// Updates the holds from one statistics document taken at `now`.
    pub fn update(&self, stats: &Statistics, now: Instant) {
        let Ok(mut holds) = self.holds.lock() else {
            return;
        };
        let mut held = HashSet::new();
        for (topic, p) in stats.assigned() {
            if p.ls_offset < 0 || p.hi_offset < 0 || p.ls_offset >= p.hi_offset {
                continue;
            }
            let Some(task) = self.topology.task_name(topic, p.partition) else {
                continue;
            };
            let key = (topic.to_string(), p.partition);
            let hold = holds.entry(key.clone()).or_insert_with(|| Hold {
                stable: p.ls_offset,
                since: now,
                task,
                warned: false,
            });
            if hold.stable != p.ls_offset {
                hold.stable = p.ls_offset;
                hold.since = now;
                hold.warned = false;
            }
            let age = now.saturating_duration_since(hold.since);
            self.gauge
                .with_label_values(&[topic, hold.task.as_str()])
                .set(age.as_secs() as i64);
            if age >= self.hanging_after && !hold.warned {
                hold.warned = true;
                tracing::warn!(
                    topic,
                    partition = p.partition,
                    last_stable_offset = p.ls_offset,
                    high_watermark = p.hi_offset,
                    held_s = age.as_secs(),
                    "an open transaction has held this input partition back longer than tally's own transactions \
                     live: unless a producer with a longer transaction.timeout.ms writes here, it is hanging (its \
                     markers lost) and nothing past it will be read. Find it with `kafka-transactions.sh \
                     --bootstrap-server <broker> find-hanging --broker-id <leader>`; aborting it drops its records \
                     (docs/chaos-runs.md, cause 6)"
                );
            }
            held.insert(key);
        }
        holds.retain(|key, hold| {
            let keep = held.contains(key);
            if !keep {
                let _ = self.gauge.remove_label_values(&[key.0.as_str(), hold.task.as_str()]);
            }
            keep
        });
    }
}

impl Drop for HeldBack {
    fn drop(&mut self) {
        if let Ok(holds) = self.holds.lock() {
            for ((topic, _), hold) in holds.iter() {
                let _ = self.gauge.remove_label_values(&[topic, hold.task.as_str()]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::core::Collector;

    fn watch(hanging_after: Duration) -> (Metrics, HeldBack) {
        let (m, t) = crate::metrics::consumer_lag::tests::metrics_and_topology();
        let w = HeldBack::new(&m, t, hanging_after);
        (m, w)
    }

    /// A statistics document with partition 0 of `pay` assigned at these offsets.
    fn stats(ls_offset: i64, hi_offset: i64) -> Statistics {
        let doc = serde_json::json!({"topics": {"pay": {"partitions": {"0": {
            "partition": 0, "desired": true, "app_offset": ls_offset, "next_offset": ls_offset,
            "ls_offset": ls_offset, "hi_offset": hi_offset}}}}});
        serde_json::from_value(doc).expect("statistics")
    }

    fn held(m: &Metrics) -> Vec<(String, i64)> {
        m.input_held_back
            .collect()
            .iter()
            .flat_map(|f| f.get_metric().to_vec())
            .map(|m| {
                let labels: Vec<String> = m.get_label().iter().map(|l| l.value().to_string()).collect();
                (labels.join("/"), m.get_gauge().get_value() as i64)
            })
            .collect()
    }

    #[test]
    fn a_last_stable_offset_that_stands_still_below_the_end_is_held_back_for_as_long() {
        let (m, w) = watch(Duration::from_secs(90));
        let t0 = Instant::now();
        w.update(&stats(10, 20), t0);
        assert_eq!(held(&m), vec![("payments-0/pay".to_string(), 0)]);
        w.update(&stats(10, 25), t0 + Duration::from_secs(100));
        assert_eq!(
            held(&m),
            vec![("payments-0/pay".to_string(), 100)],
            "more records behind it, same hold"
        );
        assert!(
            w.holds.lock().expect("lock").values().all(|h| h.warned),
            "warned past 90 s"
        );
    }

    #[test]
    fn a_moving_last_stable_offset_starts_a_new_hold_and_reaching_the_end_ends_it() {
        let (m, w) = watch(Duration::from_secs(90));
        let t0 = Instant::now();
        w.update(&stats(10, 20), t0);
        w.update(&stats(15, 20), t0 + Duration::from_secs(60));
        assert_eq!(
            held(&m),
            vec![("payments-0/pay".to_string(), 0)],
            "the transaction ahead finished"
        );
        w.update(&stats(20, 20), t0 + Duration::from_secs(120));
        assert!(held(&m).is_empty(), "nothing open: no series");
        w.update(&stats(20, 30), t0 + Duration::from_secs(130));
        drop(w);
        assert!(held(&m).is_empty(), "a closed consumer leaves no series");
    }
}
