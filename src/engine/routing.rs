//! The routing guard. A pipeline's state for a key lives in the task its records are routed to:
//! the partition the repartition key hashes to (or the source's own partition). A restart that
//! routes differently (another `partitioner` in `kafka.properties`, another `repartition.key`,
//! a switch to `co_partitioned` with another partitioner, a changed partition count) would
//! send a key's next copies to a task that has never seen it, and duplicates would pass. Each
//! pipeline's routing is recorded in the compacted topic `<application_id>-routing`; a start
//! whose routing differs is refused unless the operator accepts the change. The in-process
//! reconciler's trace records are routed by tally's partitioner too, and recorded alike.

use super::admin::METADATA_TIMEOUT;
use super::clients;
use crate::store::codec;
use crate::topology::partitioner::Partitioner;
use crate::topology::{Pipeline, Topology};
use anyhow::{bail, Context, Result};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest the guard reads the routing topic or waits for its write.
const LIMIT: Duration = Duration::from_secs(60);

/// What a start does when a pipeline's routing differs from the recorded one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnChange {
    /// Refuse to start, saying what changed and how to go on.
    Refuse,
    /// Record the new routing and start (`tally run --accept-routing-change`).
    Accept,
}

/// The record kept per pipeline (key: the pipeline's name).
#[derive(Debug, Serialize, Deserialize)]
struct Recorded {
    /// [`describe`] of the pipeline when it was recorded.
    routing: String,
}

/// How `p`'s records find their task, in words; two routings are the same when the words are.
/// `partitions` is the partition count of the topic its stateful part reads.
pub fn describe(t: &Topology, p: &Pipeline, partitions: i32) -> String {
    let hashed = |key: &dyn std::fmt::Display, by: Partitioner| {
        format!(
            "records keyed by `{key}`, hashed with {} over {partitions} partitions",
            by.name()
        )
    };
    match (&p.co_partitioned, &p.repartition) {
        (Some(co), _) => hashed(&co.key, co.partitioner),
        (None, Some(r)) => hashed(&r.key, Partitioner::of(&t.kafka.properties)),
        (None, None) => format!(
            "the partitions of source topic `{}` as its producers wrote them ({partitions} partitions)",
            p.input_topic
        ),
    }
}

/// How the reconciler's trace records find their task (in process or deployed on its own):
/// tally writes them keyed by event id with its producers' partitioner, and an event's records
/// must meet in one task.
pub fn describe_reconciler(t: &Topology, partitions: i32) -> String {
    format!(
        "trace records keyed by event id, hashed with {} over {partitions} partitions",
        Partitioner::of(&t.kafka.properties).name()
    )
}

/// Every routing of `t` that state depends on, by the name it is recorded under: each stateful
/// pipeline's, and the reconciler's (under `reconcile`, a name no pipeline may take).
/// `partitions` holds the partition count of each topic a stream thread reads (`prepare_topics`).
fn routings(t: &Topology, partitions: &BTreeMap<String, i32>) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = stateful(t)
        .filter_map(|p| {
            let count = partitions.get(&p.input_topic)?;
            Some((p.name.clone(), describe(t, p, *count)))
        })
        .collect();
    let trace = t.reconciled_topic().filter(|_| !t.reconciler_stores().is_empty());
    if let Some(count) = trace.and_then(|topic| partitions.get(topic)) {
        all.push(("reconcile".to_string(), describe_reconciler(t, *count)));
    }
    all
}

/// Compares every routing state depends on with the recorded one and records it where none is.
pub fn check(t: &Topology, partitions: &BTreeMap<String, i32>, on_change: OnChange) -> Result<()> {
    if !has_state(t) {
        return Ok(());
    }
    let topic = t.routing_topic();
    let recorded = read(t, &topic)?;
    let mut to_write = Vec::new();
    let mut changed = Vec::new();
    for (name, now) in routings(t, partitions) {
        match recorded.get(&name) {
            None => to_write.push((name, now)),
            Some(bytes) => {
                let before = match codec::decode::<Recorded>(bytes) {
                    Ok(r) => r.routing,
                    // Not what this tally writes (a newer tally's format, or bytes written by
                    // hand): unknown is not the same, and accepting the change replaces it.
                    Err(e) => format!("a routing this tally cannot read ({e})"),
                };
                if before != now {
                    changed.push(format!(
                        "`{name}`: its state was built from {before}; this configuration routes {now}"
                    ));
                    to_write.push((name, now));
                }
            }
        }
    }
    if !changed.is_empty() {
        if on_change == OnChange::Refuse {
            bail!(
                "the routing of records to tasks changed, so each key's state is in another task than its next \
                 records: their duplicates would pass (and the reconciler's open events would be alerted as \
                 stuck):\n  {}\nUndo the change (`partitioner` in `kafka.properties`, `repartition`, the partition \
                 count); or stop every instance and start one with `--accept-routing-change` (`tally run`, or \
                 `tally reconcile live`): copies of events processed before the change may then pass once more; \
                 or `tally reset` to process the sources again with empty state",
                changed.join("\n  ")
            );
        }
        for c in &changed {
            tracing::warn!(change = %c, "routing change accepted: copies of events processed before it may pass once more");
        }
    }
    write(t, &topic, &to_write)
}

/// True when some pipeline keeps state, so its routing matters (and the routing topic exists).
pub fn has_state(t: &Topology) -> bool {
    stateful(t).next().is_some() || !t.reconciler_stores().is_empty()
}

/// The pipelines that keep state.
fn stateful(t: &Topology) -> impl Iterator<Item = &Pipeline> {
    t.pipelines.iter().filter(|p| !p.store_names().is_empty())
}

/// The last record per key of `topic` (single partition), read to its end.
fn read(t: &Topology, topic: &str) -> Result<BTreeMap<String, Vec<u8>>> {
    let consumer: BaseConsumer = clients::watch_reader(t, &t.application_id)
        .create()
        .context("cannot create a consumer to read the recorded routing")?;
    let mut from = TopicPartitionList::new();
    from.add_partition_offset(topic, 0, Offset::Beginning)
        .with_context(|| format!("cannot read `{topic}`"))?;
    consumer
        .assign(&from)
        .with_context(|| format!("cannot read `{topic}`"))?;
    let mut recorded = BTreeMap::new();
    // Consumer errors pass while the client retries (a topic created a moment ago may have no
    // leader yet); the last one is the cause if the end is not reached in time.
    let mut last_error = None;
    let deadline = Instant::now() + LIMIT;
    loop {
        if Instant::now() > deadline {
            // Without an error of its own, a timeout as the cluster's would be: waited out.
            let cause = last_error.unwrap_or(KafkaError::MessageConsumption(RDKafkaErrorCode::OperationTimedOut));
            return Err(cause)
                .with_context(|| format!("could not read `{topic}` to its end within {} s", LIMIT.as_secs()));
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let Some(key) = m.key().map(|k| String::from_utf8_lossy(k).into_owned()) else {
                    continue;
                };
                match m.payload() {
                    Some(value) => recorded.insert(key, value.to_vec()),
                    None => recorded.remove(&key),
                };
            }
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(recorded),
            Some(Err(e)) => last_error = Some(e),
            None => {}
        }
    }
}

/// Writes each `(name, routing)` to `topic` and waits until every write is acknowledged.
fn write(t: &Topology, topic: &str, routings: &[(String, String)]) -> Result<()> {
    if routings.is_empty() {
        return Ok(());
    }
    let producer: BaseProducer<Deliveries> = clients::base(t)
        .set("enable.idempotence", "true")
        .create_with_context(Deliveries::default())
        .context("cannot create the producer that records the routing; check `kafka.properties`")?;
    for (name, routing) in routings {
        let value = codec::encode(&Recorded {
            routing: routing.clone(),
        })
        .context("encoding a routing record")?;
        producer
            .send(BaseRecord::to(topic).key(name.as_str()).payload(&value))
            .map_err(|(e, _)| e)
            .with_context(|| format!("recording the routing of `{name}` in `{topic}`"))?;
    }
    producer
        .flush(METADATA_TIMEOUT.max(LIMIT))
        .with_context(|| format!("recording the routing in `{topic}`"))?;
    if let Some(e) = producer.context().failed() {
        return Err(e).with_context(|| format!("recording the routing in `{topic}`"));
    }
    Ok(())
}

/// Keeps the first failed delivery of the routing producer.
#[derive(Default)]
struct Deliveries(Mutex<Option<KafkaError>>);

impl Deliveries {
    fn failed(&self) -> Option<KafkaError> {
        self.0.lock().ok().and_then(|mut e| e.take())
    }
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let (Err((e, _)), Ok(mut first)) = (result, self.0.lock()) {
            first.get_or_insert_with(|| e.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_str;

    fn topology(properties: &str, repartition: &str) -> Topology {
        topology_with(properties, repartition, "")
    }

    fn topology_with(properties: &str, repartition: &str, more: &str) -> Topology {
        let yaml = format!(
            "application_id: app\nkafka: {{ bootstrap_servers: b, properties: {{ {properties} }} }}\nsources:\n  \
             p: {{ topic: t }}\npipelines:\n  - name: pay\n    from: p\n    {repartition}\n    \
             key: \"{{payment_id}}:{{status}}\"\n    to: {{ topic: o }}\ndead_letter: {{ topic: d }}\n{more}"
        );
        load_str("t.yaml", &yaml, |_| None).expect("valid topology")
    }

    fn routing(properties: &str, repartition: &str, partitions: i32) -> String {
        let t = topology(properties, repartition);
        describe(&t, &t.pipelines[0], partitions)
    }

    #[test]
    fn a_routing_is_the_key_the_partitioner_and_the_partition_count() {
        let hop = r#"repartition: { key: "{payment_id}" }"#;
        let base = routing("", hop, 3);
        assert_eq!(
            base,
            "records keyed by `{payment_id}`, hashed with crc32 over 3 partitions"
        );
        assert_eq!(routing("partitioner: consistent", hop, 3), base, "the same hash");
        assert_ne!(routing("partitioner: murmur2_random", hop, 3), base);
        assert_ne!(routing("", r#"repartition: { key: "{order_id}" }"#, 3), base);
        assert_ne!(routing("", hop, 6), base);
        assert_ne!(routing("", "", 3), base, "no hop: the source's own partitions");
    }

    #[test]
    fn a_hop_and_a_co_partitioned_source_route_alike_only_with_the_same_partitioner() {
        let co = r#"repartition: { key: "{payment_id}", co_partitioned: murmur2 }"#;
        let hop = r#"repartition: { key: "{payment_id}" }"#;
        assert_eq!(routing("", co, 3), routing("partitioner: murmur2_random", hop, 3));
        assert_ne!(routing("", co, 3), routing("", hop, 3), "crc32 by default");
    }

    #[test]
    fn the_reconciler_is_recorded_where_it_runs_and_its_routing_follows_the_partitioner() {
        let reconciled = "trace: { topic: tr }\nreconcile: { alerts_topic: al }\n";
        let counts = BTreeMap::from([("t".to_string(), 3), ("tr".to_string(), 6)]);
        let names = |t: &Topology| routings(t, &counts).into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        let t = topology_with("", "", reconciled);
        assert_eq!(names(&t), ["pay", "reconcile"]);
        assert_eq!(
            routings(&t, &counts)[1].1,
            "trace records keyed by event id, hashed with crc32 over 6 partitions"
        );
        let murmur = topology_with("partitioner: murmur2", "", reconciled);
        assert_ne!(routings(&murmur, &counts)[1], routings(&t, &counts)[1]);
        assert_eq!(names(&topology("", "")), ["pay"], "no reconciler, no entry");
        let separately = topology_with(
            "",
            "",
            "trace: { topic: tr }\nreconcile: { alerts_topic: al, run: separately }\n",
        );
        assert_eq!(names(&separately), ["pay"], "the separate reconciler records its own");
        let view = separately.reconciler_view().expect("view");
        assert_eq!(names(&view), ["reconcile"]);
        assert!(has_state(&view));
    }
}
