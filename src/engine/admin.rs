//! Startup checks of the topics a topology uses, and creation of its changelog topics.

use super::{clients, errors};
use crate::topology::Topology;
use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, ConfigResource, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// How long a metadata, configuration or topic-creation request may take.
pub const METADATA_TIMEOUT: Duration = Duration::from_secs(15);

/// Checks every source topic exists and creates missing internal topics (compacted changelogs,
/// repartition topics) with the source's partition count. Returns the partition count of each
/// topic the stream threads consume: sources, repartition topics, the trace topic the reconciler
/// reads in this process.
///
/// Blocking: call it from a blocking thread; `rt` drives the admin futures.
pub fn prepare_topics(t: &Topology, rt: &Handle) -> Result<BTreeMap<String, i32>> {
    let admin: AdminClient<DefaultClientContext> = clients::base(t)
        // A metadata request must not create the topic it asks about.
        .set("allow.auto.create.topics", "false")
        .create()
        .context("cannot create the Kafka admin client; check `kafka.properties`")?;
    let mut partitions = BTreeMap::new();
    for p in &t.pipelines {
        let n = partition_count(&admin, &p.input_topic)?.with_context(|| {
            format!(
                "source topic `{}` of pipeline `{}` does not exist on {}; create it (its partition count fixes the task count)",
                p.input_topic, p.name, t.kafka.bootstrap_servers
            )
        })?;
        partitions.insert(p.input_topic.clone(), n);
        for store in p.store_names() {
            ensure_internal(
                &admin,
                rt,
                &t.changelog_topic(&store),
                n,
                &[("cleanup.policy", "compact")],
            )?;
        }
        if let Some(r) = &p.repartition {
            // Kept until consumed: tally deletes records below the committed offsets.
            ensure_internal(
                &admin,
                rt,
                &r.topic,
                n,
                &[("cleanup.policy", "delete"), ("retention.ms", "-1")],
            )?;
            partitions.insert(r.topic.clone(), n);
        }
    }
    if let Some(trace_topic) = t.reconciled_topic() {
        let n = partition_count(&admin, trace_topic)?.with_context(|| {
            format!(
                "the trace topic `{trace_topic}` the reconciler reads does not exist on {}; create it",
                t.kafka.bootstrap_servers
            )
        })?;
        partitions.insert(trace_topic.to_string(), n);
        for store in t.reconciler_stores() {
            ensure_internal(
                &admin,
                rt,
                &t.changelog_topic(&store),
                n,
                &[("cleanup.policy", "compact")],
            )?;
        }
    }
    if let Some(m) = &t.id_mapping {
        ensure_internal(&admin, rt, &m.topic, m.partitions, &[("cleanup.policy", "compact")])?;
    }
    if super::routing::has_state(t) {
        ensure_internal(&admin, rt, &t.routing_topic(), 1, &[("cleanup.policy", "compact")])?;
    }
    // Sink topics are the user's: tally checks them rather than let a transaction fail later.
    let mut sinks: Vec<(&str, String)> = t
        .pipelines
        .iter()
        .map(|p| {
            (
                p.output.topic.as_str(),
                format!("output topic of pipeline `{}`", p.name),
            )
        })
        .collect();
    sinks.push((&t.dead_letter_topic, "dead-letter topic".to_string()));
    if let Some(tr) = &t.trace {
        sinks.push((&tr.topic, "trace topic".to_string()));
    }
    if let Some(r) = &t.reconcile {
        sinks.push((&r.alerts_topic, "reconciler's alerts topic".to_string()));
    }
    for (topic, what) in sinks {
        if partition_count(&admin, topic)?.is_none() {
            bail!(
                "the {what} `{topic}` does not exist on {}; create it",
                t.kafka.bootstrap_servers
            );
        }
    }
    Ok(partitions)
}

fn partition_count(admin: &AdminClient<DefaultClientContext>, topic: &str) -> Result<Option<i32>> {
    let md = admin
        .inner()
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .with_context(|| format!("cannot read metadata of topic `{topic}`: is the broker reachable?"))?;
    let Some(tm) = md.topics().iter().find(|tm| tm.name() == topic) else {
        return Ok(None);
    };
    match tm.error() {
        None if !tm.partitions().is_empty() => Ok(Some(tm.partitions().len() as i32)),
        None => Ok(None),
        Some(e) if RDKafkaErrorCode::from(e) == RDKafkaErrorCode::UnknownTopicOrPartition => Ok(None),
        Some(e) => bail!(
            "metadata of topic `{topic}`: {}{}",
            RDKafkaErrorCode::from(e),
            fix(e.into())
        ),
    }
}

/// librdkafka's default `message.max.bytes`, when `kafka.properties` does not set it.
const PRODUCER_DEFAULT_MAX_BYTES: usize = 1_000_000;

/// The smallest write limit tally starts with. What a refused record leaves (its dead letter
/// with the reason, a detail of up to 1,024 characters, the source's coordinates and a
/// correlation id of up to `correlation::MAX_CARRIED_BYTES`; its trace records) stays under
/// 9 KiB, and so does a reconciler's alert (four texts of at most that many bytes as JSON), so
/// they always fit: a record that cannot be written is dead-lettered instead of being retried
/// forever.
pub const MIN_WRITE_LIMIT: usize = 16 * 1024;

/// Refuses a write limit under [`MIN_WRITE_LIMIT`], naming what sets it.
pub fn check_write_limit(limit: usize, by: &str) -> Result<()> {
    if limit < MIN_WRITE_LIMIT {
        bail!(
            "the largest record tally can write is {limit} bytes, set by {by}; tally needs at least \
             {MIN_WRITE_LIMIT} so that a record it refuses always fits a dead letter; raise {by}"
        );
    }
    Ok(())
}

/// The largest record the producer sends, and what sets it: `kafka.properties`'
/// `message.max.bytes` or librdkafka's default. The topics' own limits come on top (see
/// [`write_limit`]).
pub fn producer_limit(t: &Topology) -> Result<(usize, String)> {
    let producer = match t.kafka.properties.get("message.max.bytes") {
        Some(v) => v
            .parse::<usize>()
            .with_context(|| format!("`kafka.properties.message.max.bytes` is `{v}`, not a number of bytes"))?,
        None => PRODUCER_DEFAULT_MAX_BYTES,
    };
    Ok((producer, "the producer's `message.max.bytes`".to_string()))
}

/// The largest record tally can write, and what sets it: the producer's `message.max.bytes`
/// or the smallest `max.message.bytes` of the topics tally writes (outputs, dead letters,
/// trace, alerts, changelogs, repartition and mappings topics). Call after `prepare_topics`.
/// Fails when a topic that keeps state (a changelog, the mappings topic) is not compacted.
pub fn write_limit(t: &Topology, rt: &Handle) -> Result<(usize, String)> {
    let mut limit = producer_limit(t)?;
    let mut topics: Vec<String> = vec![t.dead_letter_topic.clone()];
    for p in &t.pipelines {
        topics.push(p.output.topic.clone());
        topics.extend(p.store_names().iter().map(|s| t.changelog_topic(s)));
        topics.extend(p.repartition.as_ref().map(|r| r.topic.clone()));
    }
    topics.extend(t.trace.as_ref().map(|tr| tr.topic.clone()));
    if let (Some(r), Some(_)) = (&t.reconcile, t.reconciled_topic()) {
        topics.push(r.alerts_topic.clone());
        topics.extend(t.reconciler_stores().iter().map(|s| t.changelog_topic(s)));
    }
    topics.extend(t.id_mapping.as_ref().map(|m| m.topic.clone()));
    topics.sort();
    topics.dedup();
    let configs = topic_configs(t, rt, &topics)?;
    let mut compacted = t.changelog_topics();
    compacted.extend(t.id_mapping.as_ref().map(|m| m.topic.clone()));
    for (topic, config) in topics.iter().zip(configs) {
        // A changelog whose old records are deleted by age restores a store without them: the
        // keys it forgot come out again as new events.
        let policy = config.get("cleanup.policy").and_then(|e| e.value.as_deref());
        if let (true, Some(policy)) = (compacted.contains(topic), policy) {
            if !policy.split(',').any(|p| p.trim() == "compact") {
                bail!(
                    "topic `{topic}` keeps state for tally but has `cleanup.policy={policy}`, so its old records \
                     would be deleted and a restore would forget them; set it to `compact` \
                     (kafka-configs.sh --alter --entity-type topics --entity-name {topic} \
                     --add-config cleanup.policy=compact)"
                );
            }
        }
        if let Some(bytes) = max_message_bytes(&config).filter(|b| *b < limit.0) {
            limit = (bytes, format!("topic `{topic}`'s `max.message.bytes`"));
        }
    }
    Ok(limit)
}

/// The largest record tally can write to `topic` (which it does not otherwise write: the
/// destination of `tally redrive --to`), and what sets it: the producer's `message.max.bytes`
/// or the topic's `max.message.bytes`.
pub fn message_limit(t: &Topology, rt: &Handle, topic: &str) -> Result<(usize, String)> {
    let producer = producer_limit(t)?;
    let config = topic_configs(t, rt, &[topic.to_string()])?;
    Ok(match config.first().and_then(max_message_bytes) {
        Some(bytes) if bytes < producer.0 => (bytes, format!("topic `{topic}`'s `max.message.bytes`")),
        _ => producer,
    })
}

/// The configuration of each of `topics`, in their order.
fn topic_configs(t: &Topology, rt: &Handle, topics: &[String]) -> Result<Vec<ConfigResource>> {
    let admin: AdminClient<DefaultClientContext> = clients::base(t)
        .create()
        .context("cannot create the Kafka admin client; check `kafka.properties`")?;
    let specifiers: Vec<ResourceSpecifier<'_>> = topics.iter().map(|n| ResourceSpecifier::Topic(n)).collect();
    let results = rt
        .block_on(admin.describe_configs(
            &specifiers,
            &AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT)),
        ))
        .context("cannot read the configuration of the topics tally writes")?;
    topics
        .iter()
        .zip(results)
        .map(|(topic, result)| {
            result.map_err(|code| {
                anyhow::anyhow!("cannot read the configuration of topic `{topic}`: {code}{}", fix(code))
            })
        })
        .collect()
}

/// A topic's `max.message.bytes`, when its configuration gives one.
fn max_message_bytes(config: &ConfigResource) -> Option<usize> {
    config
        .get("max.message.bytes")
        .and_then(|e| e.value.as_deref())
        .and_then(|v| v.parse::<usize>().ok())
}

/// Creates the compacted internal topic `topic` with `partitions` unless it exists (tools such
/// as `tally redrive` keep their own log in one).
pub fn ensure_compacted(t: &Topology, rt: &Handle, topic: &str, partitions: i32) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> =
        clients::base(t)
            .set("allow.auto.create.topics", "false")
            .create()
            .context("cannot create the Kafka admin client; check `kafka.properties`")?;
    ensure_internal(&admin, rt, topic, partitions, &[("cleanup.policy", "compact")])
}

/// Creates an internal topic unless it exists, then waits until metadata shows it with
/// `partitions` partitions.
fn ensure_internal(
    admin: &AdminClient<DefaultClientContext>,
    rt: &Handle,
    topic: &str,
    partitions: i32,
    config: &[(&str, &str)],
) -> Result<()> {
    let mut requested = false;
    let deadline = Instant::now() + METADATA_TIMEOUT;
    loop {
        match partition_count(admin, topic)? {
            Some(existing) if existing == partitions => return Ok(()),
            Some(existing) => bail!(
                "internal topic `{topic}` has {existing} partitions but its source has {partitions}; \
                 they must match: stop every instance, delete the topic and the state directory to rebuild"
            ),
            None if !requested => {
                let new = config.iter().fold(
                    NewTopic::new(topic, partitions, TopicReplication::Fixed(-1)),
                    |t, (k, v)| t.set(k, v),
                );
                create(admin, rt, &new)?;
                requested = true;
            }
            // The controller answers once the topic is created, but a broker's metadata shows it
            // a moment later: a check right after (another instance's, or this one's sink
            // check) would find no such topic.
            None if Instant::now() >= deadline => bail!(
                "internal topic `{topic}` was created but the broker's metadata still does not show it after {METADATA_TIMEOUT:?}"
            ),
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Asks the controller for `new`; one another instance created first counts as created.
fn create(admin: &AdminClient<DefaultClientContext>, rt: &Handle, new: &NewTopic<'_>) -> Result<()> {
    let topic = new.name;
    let results = rt
        .block_on(admin.create_topics([new], &AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT))))
        .with_context(|| format!("cannot create internal topic `{topic}`"))?;
    for r in results {
        match r {
            Ok(_) => tracing::info!(topic, partitions = new.num_partitions, "created internal topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => bail!("cannot create internal topic `{name}`: {code}{}", fix(code)),
        }
    }
    Ok(())
}

/// For an authorization failure, `; ` and what to grant; else nothing.
fn fix(code: RDKafkaErrorCode) -> String {
    match errors::classify(&KafkaError::AdminOp(code)) {
        errors::ErrorClass::Refused => format!("; {}", errors::refusal_fix(code)),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_authorization_failure_gets_the_acl_to_grant_and_other_errors_nothing() {
        assert!(fix(RDKafkaErrorCode::TopicAuthorizationFailed).contains("topic ACLs"));
        assert!(fix(RDKafkaErrorCode::ClusterAuthorizationFailed).contains("authorizer log"));
        assert_eq!(fix(RDKafkaErrorCode::TopicAlreadyExists), "");
    }
}
