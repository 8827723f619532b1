//! The parts of the statistics JSON librdkafka emits every `statistics.interval.ms` that
//! tally's consumer gauges read.

use serde::Deserialize;
use std::collections::BTreeMap;

/// One statistics document of a consumer.
#[derive(Deserialize)]
pub struct Statistics {
    /// Per topic name.
    #[serde(default)]
    pub topics: BTreeMap<String, TopicStatistics>,
}

impl Statistics {
    /// Parses one document; one that does not parse is skipped (the next comes an interval
    /// later), with a debug line.
    pub fn parse(json: &[u8]) -> Option<Self> {
        serde_json::from_slice(json)
            .map_err(
                |e| tracing::debug!(error = %e, "librdkafka statistics not understood; consumer gauges not updated"),
            )
            .ok()
    }

    /// Every partition the consumer has assigned, with its topic.
    pub fn assigned(&self) -> impl Iterator<Item = (&str, &PartitionStatistics)> {
        self.topics.iter().flat_map(|(topic, t)| {
            t.partitions
                .values()
                .filter(|p| p.partition >= 0 && p.desired)
                .map(move |p| (topic.as_str(), p))
        })
    }
}

/// One topic's partitions, keyed by partition number (`-1` is librdkafka's internal one).
#[derive(Deserialize)]
pub struct TopicStatistics {
    /// Per partition number.
    #[serde(default)]
    pub partitions: BTreeMap<String, PartitionStatistics>,
}

/// librdkafka reports offsets it does not know as negative numbers (-1001).
#[derive(Deserialize)]
pub struct PartitionStatistics {
    /// The partition number.
    pub partition: i32,
    /// True for partitions in the consumer's assignment.
    #[serde(default)]
    pub desired: bool,
    /// Offset after the last record handed to the application (skips transaction markers).
    #[serde(default = "unknown")]
    pub app_offset: i64,
    /// The fetch position, the start position before anything was consumed.
    #[serde(default = "unknown")]
    pub next_offset: i64,
    /// Last stable offset: the end a read_committed consumer can reach.
    #[serde(default = "unknown")]
    pub ls_offset: i64,
    /// High watermark.
    #[serde(default = "unknown")]
    pub hi_offset: i64,
}

fn unknown() -> i64 {
    -1
}
