//! Consumer lag per task, read from the statistics librdkafka emits every
//! `statistics.interval.ms` for a stream thread's consumer.

use super::client_statistics::{PartitionStatistics, Statistics};
use super::Metrics;
use crate::topology::Topology;
use prometheus::IntGaugeVec;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// Records the consumer has still to read of an assigned partition, when both ends are known.
fn lag(p: &PartitionStatistics) -> Option<i64> {
    if p.partition < 0 || !p.desired {
        return None;
    }
    let end = if p.ls_offset >= 0 { p.ls_offset } else { p.hi_offset };
    let position = if p.app_offset >= 0 { p.app_offset } else { p.next_offset };
    (end >= 0 && position >= 0).then(|| (end - position).max(0))
}

/// Publishes one consumer's lag as `tally_consumer_lag_records{topic, task}` and removes the
/// series of partitions it no longer holds (also when dropped with its consumer).
pub struct ConsumerLag {
    gauge: IntGaugeVec,
    topology: Arc<Topology>,
    /// (topic, task) series this consumer has set.
    reported: Mutex<HashSet<(String, String)>>,
}

impl ConsumerLag {
    /// A reporter for one stream thread's consumer.
    pub fn new(metrics: &Metrics, topology: Arc<Topology>) -> Self {
        Self {
            gauge: metrics.consumer_lag.clone(),
            topology,
            reported: Mutex::new(HashSet::new()),
        }
    }

    /// Updates the gauges from one statistics document.
    pub fn update(&self, stats: &Statistics) {
        let Ok(mut reported) = self.reported.lock() else {
            return;
        };
        let mut current = HashSet::new();
        for (topic, p) in stats.assigned() {
            let (Some(lag), Some(task)) = (lag(p), self.topology.task_name(topic, p.partition)) else {
                continue;
            };
            self.gauge.with_label_values(&[topic, task.as_str()]).set(lag);
            current.insert((topic.to_string(), task));
        }
        for (topic, task) in reported.difference(&current) {
            let _ = self.gauge.remove_label_values(&[topic, task]);
        }
        *reported = current;
    }
}

impl Drop for ConsumerLag {
    fn drop(&mut self) {
        if let Ok(reported) = self.reported.lock() {
            for (topic, task) in reported.iter() {
                let _ = self.gauge.remove_label_values(&[topic, task]);
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use prometheus::core::Collector;

    use std::collections::BTreeMap;

    fn partition(json: &str) -> PartitionStatistics {
        serde_json::from_str(json).expect("partition statistics")
    }

    #[test]
    fn lag_is_the_last_stable_offset_minus_the_application_position() {
        let p = partition(
            r#"{"partition":0,"desired":true,"app_offset":40,"next_offset":90,"ls_offset":100,"hi_offset":101}"#,
        );
        assert_eq!(lag(&p), Some(60));
    }

    #[test]
    fn before_the_first_record_the_fetch_position_counts() {
        let p = partition(
            r#"{"partition":1,"desired":true,"app_offset":-1001,"next_offset":7,"ls_offset":10,"hi_offset":10}"#,
        );
        assert_eq!(lag(&p), Some(3));
    }

    #[test]
    fn unassigned_unknown_and_internal_partitions_have_no_lag() {
        let unassigned =
            r#"{"partition":0,"desired":false,"app_offset":1,"next_offset":1,"ls_offset":5,"hi_offset":5}"#;
        let unknown =
            r#"{"partition":0,"desired":true,"app_offset":-1001,"next_offset":-1001,"ls_offset":5,"hi_offset":5}"#;
        let internal = r#"{"partition":-1,"desired":true,"app_offset":1,"next_offset":1,"ls_offset":5,"hi_offset":5}"#;
        for json in [unassigned, unknown, internal] {
            assert_eq!(lag(&partition(json)), None, "{json}");
        }
    }

    /// Metrics and a one-pipeline topology reading `pay` (shared with the other gauges' tests).
    pub(in crate::metrics) fn metrics_and_topology() -> (Metrics, Arc<Topology>) {
        let yaml = r#"
application_id: app
kafka: { bootstrap_servers: "k:9092" }
sources: { payments: { topic: pay } }
pipelines:
  - { name: payments, from: payments, key: "{id}", to: { topic: out } }
dead_letter: { topic: dlq }
"#;
        let t = crate::config::load_str("t.yaml", yaml, |_| None).expect("valid topology");
        (Metrics::new("app").expect("metrics"), Arc::new(t))
    }

    fn statistics(partitions: &[(i32, bool)]) -> Statistics {
        let parts: BTreeMap<String, serde_json::Value> = partitions
            .iter()
            .map(|&(p, desired)| {
                let v = serde_json::json!({"partition": p, "desired": desired, "app_offset": 5, "next_offset": 9, "ls_offset": 8, "hi_offset": 9});
                (p.to_string(), v)
            })
            .collect();
        let doc = serde_json::json!({"topics": {"pay": {"partitions": parts}, "other": {"partitions": parts}}});
        serde_json::from_value(doc).expect("statistics")
    }

    fn series(m: &Metrics) -> Vec<(String, i64)> {
        let mut out: Vec<(String, i64)> = m
            .consumer_lag
            .collect()
            .iter()
            .flat_map(|f| f.get_metric().to_vec())
            .map(|m| {
                let labels: Vec<String> = m.get_label().iter().map(|l| l.value().to_string()).collect();
                (labels.join("/"), m.get_gauge().get_value() as i64)
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn assigned_partitions_of_the_topology_are_reported_and_dropped_when_gone() {
        let (m, t) = metrics_and_topology();
        let gauges = ConsumerLag::new(&m, t);
        gauges.update(&statistics(&[(0, true), (1, true), (2, false)]));
        let task_then_topic = |task: &str| (format!("{task}/pay"), 3);
        assert_eq!(
            series(&m),
            vec![task_then_topic("payments-0"), task_then_topic("payments-1")]
        );
        gauges.update(&statistics(&[(1, true)]));
        assert_eq!(
            series(&m),
            vec![task_then_topic("payments-1")],
            "revoked partition removed"
        );
        assert!(Statistics::parse(b"not json").is_none(), "a bad document is skipped");
        drop(gauges);
        assert!(series(&m).is_empty(), "a closed consumer leaves no series");
    }

    #[test]
    fn a_position_past_the_end_is_no_negative_lag() {
        let p = partition(
            r#"{"partition":0,"desired":true,"app_offset":12,"next_offset":12,"ls_offset":10,"hi_offset":12}"#,
        );
        assert_eq!(lag(&p), Some(0));
    }
}
