//! A pipeline switched to `co_partitioned` reads its source directly: whatever a former run with
//! the repartition hop left in the repartition topic, unprocessed, would never be processed. A
//! start refuses while that topic holds such records, and says how to drain or give them up.

use super::admin::METADATA_TIMEOUT;
use super::clients;
use crate::topology::{Pipeline, Topology};
use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The longest the check reads a former repartition topic to its end.
const READ_LIMIT: Duration = Duration::from_secs(60);

/// Checks every co-partitioned pipeline's former repartition topic, if it exists: refuses
/// (with the fix) when a record in it lies at or past the consumer group's committed offset.
/// Reads committed records only: a transaction still open there belongs to a former instance
/// of this application, and is aborted when its transactional id starts again.
pub fn check(t: &Topology) -> Result<()> {
    let switched: Vec<&Pipeline> = t.pipelines.iter().filter(|p| p.co_partitioned.is_some()).collect();
    if switched.is_empty() {
        return Ok(());
    }
    let consumer: BaseConsumer = clients::watch_reader(t, &t.application_id)
        .create()
        .context("cannot create a consumer to read the former repartition topics")?;
    for p in switched {
        let Some(co) = &p.co_partitioned else { continue };
        if let Some((partition, offset)) = first_unprocessed(&consumer, &co.former_hop)? {
            bail!(
                "pipeline `{}` is declared `co_partitioned`, but its former repartition topic `{}` still holds \
                 records group `{}` has not processed (the first at partition {partition}, offset {offset}); \
                 with the hop gone nothing would ever process them. Run the topology with the hop (without \
                 `co_partitioned`) until the group's lag on `{}` is 0, then start this one; or, to give those \
                 records up, delete the topic `{}`",
                p.name,
                co.former_hop,
                t.application_id,
                co.former_hop,
                co.former_hop
            );
        }
    }
    Ok(())
}

/// The place of the first committed record of `topic` at or past the group's committed offset
/// (the beginning where it has none), or `None` when the topic does not exist or has none.
fn first_unprocessed(consumer: &BaseConsumer, topic: &str) -> Result<Option<(i32, i64)>> {
    let metadata = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .with_context(|| format!("cannot read metadata of topic `{topic}`"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|m| m.name() == topic && m.error().is_none())
        .flat_map(|m| m.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Ok(None);
    }
    let mut asked = TopicPartitionList::new();
    for &p in &partitions {
        asked.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(asked, METADATA_TIMEOUT)
        .with_context(|| format!("cannot read the committed offsets on `{topic}`"))?;
    let mut from = TopicPartitionList::new();
    for e in committed.elements() {
        let start = match e.offset() {
            Offset::Offset(o) => Offset::Offset(o),
            _ => Offset::Beginning,
        };
        from.add_partition_offset(topic, e.partition(), start)
            .with_context(|| format!("cannot start reading `{topic}` partition {}", e.partition()))?;
    }
    // Replaces the assignment of the previous pipeline's topic, if any.
    consumer
        .assign(&from)
        .with_context(|| format!("cannot read `{topic}`"))?;
    let mut at_end = BTreeSet::new();
    let deadline = Instant::now() + READ_LIMIT;
    while at_end.len() < partitions.len() {
        if Instant::now() > deadline {
            bail!(
                "could not read the former repartition topic `{topic}` to its end within {} s; \
                 check the cluster, or delete the topic if its records may be given up",
                READ_LIMIT.as_secs()
            );
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => return Ok(Some((m.partition(), m.offset()))),
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(e).with_context(|| format!("cannot read `{topic}`")),
            None => {}
        }
    }
    Ok(None)
}
