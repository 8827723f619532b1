//! Broker helpers of the benchmark: topics, preloading, watermarks and on-disk sizes.

use anyhow::{anyhow, bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);

/// The broker address (`KAFKA_BOOTSTRAP`, default the local broker).
pub fn bootstrap() -> String {
    std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_string())
}

fn admin() -> Result<AdminClient<DefaultClientContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .context("creating the admin client")
}

fn block_on<F: std::future::Future>(f: F) -> Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a runtime for admin calls")?;
    Ok(rt.block_on(f))
}

/// Creates topics (name, partitions) with the given topic configs.
pub fn create_topics(topics: &[(&str, i32)], configs: &[(&str, &str)]) -> Result<()> {
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|(name, p)| {
            configs
                .iter()
                .fold(NewTopic::new(name, *p, TopicReplication::Fixed(1)), |t, (k, v)| {
                    t.set(k, v)
                })
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    for r in block_on(admin()?.create_topics(&new, &opts))?.context("creating topics")? {
        r.map_err(|(t, e)| anyhow!("creating topic {t}: {e}"))?;
    }
    Ok(())
}

/// Every topic whose name starts with `prefix`.
pub fn topics_with_prefix(prefix: &str) -> Result<Vec<String>> {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap()).create()?;
    let md = consumer.fetch_metadata(None, TIMEOUT).context("listing topics")?;
    Ok(md
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .filter(|n| n.starts_with(prefix))
        .collect())
}

/// Deletes every topic whose name starts with `prefix` (one benchmark run's topics).
pub fn delete_prefixed(prefix: &str) -> Result<()> {
    let names = topics_with_prefix(prefix)?;
    if names.is_empty() {
        return Ok(());
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    for r in block_on(admin()?.delete_topics(&refs, &opts))?.context("deleting topics")? {
        r.map_err(|(t, e)| anyhow!("deleting topic {t}: {e}"))?;
    }
    Ok(())
}

/// The value of broker setting `name` on the first broker of the cluster, as the broker reports it.
pub fn broker_setting(name: &str) -> Result<Option<String>> {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap()).create()?;
    let md = consumer
        .fetch_metadata(None, TIMEOUT)
        .context("reading the cluster's brokers")?;
    let broker = md.brokers().first().context("the cluster lists no broker")?.id();
    let opts = AdminOptions::new().request_timeout(Some(TIMEOUT));
    let results = block_on(admin()?.describe_configs(&[ResourceSpecifier::Broker(broker)], &opts))?
        .context("describing the broker's configuration")?;
    let mut value = None;
    for r in results {
        let resource = r.map_err(|e| anyhow!("describing broker {broker}'s configuration: {e}"))?;
        value = value.or_else(|| resource.get(name).and_then(|e| e.value.clone()));
    }
    Ok(value)
}

/// A producer for input whose order within a partition matters (not transactional, large
/// batches, idempotent: a retried request must not land behind a later one).
pub fn producer(linger_ms: u32) -> Result<BaseProducer> {
    producer_with(linger_ms, "consistent_random", true)
}

/// A producer for paced input, where order within a partition does not matter (each latency
/// sample is matched by its sequence number): not idempotent. An idempotent producer keeps at most
/// 5 requests in flight per partition, and while 5 were, its broker thread polled without
/// waiting (`perf record -a` over a latency run at 35,790 records/s: 24.7% of all samples, half
/// a core, in the harness's `rdk:broker1` thread), starving the broker on the same 2 cores until
/// its controller fenced it (docs/performance.md).
pub fn paced_producer(linger_ms: u32) -> Result<BaseProducer> {
    producer_with(linger_ms, "consistent_random", false)
}

/// [`producer`] with librdkafka's `partitioner`, idempotent or not.
fn producer_with(linger_ms: u32, partitioner: &str, idempotent: bool) -> Result<BaseProducer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        // Where order matters: the expected outputs of the entity workloads count on each
        // partition holding its records in the order generated (a non-idempotent retry moved the
        // first batch of a preload behind the second once).
        .set("enable.idempotence", idempotent.to_string())
        .set("partitioner", partitioner)
        .set("linger.ms", linger_ms.to_string())
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create()
        .context("creating the input producer")
}

/// Sends one record, serving delivery reports while the local queue is full.
pub fn send(producer: &BaseProducer, topic: &str, key: &[u8], value: &[u8]) -> Result<()> {
    let mut rec = BaseRecord::to(topic).key(key).payload(value);
    loop {
        match producer.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                rec = back;
                producer.poll(Duration::from_millis(5));
            }
            Err((e, _)) => bail!("producing to {topic}: {e}"),
        }
    }
}

/// Writes every record to `topic`, partitioned by `partitioner`, and waits until all are
/// acknowledged.
pub fn preload(topic: &str, records: &[(Vec<u8>, Vec<u8>)], partitioner: &str) -> Result<()> {
    let producer = producer_with(20, partitioner, true)?;
    for (k, v) in records {
        send(&producer, topic, k, v)?;
    }
    producer.flush(Duration::from_secs(120)).context("flushing the preload")
}

/// The next record of `reader` within `wait`; `None` when none came, or when the consumer only
/// reported that its broker connections dropped: librdkafka reconnects by itself, and a reader
/// that stays cut off is caught by its caller's timeout.
pub fn next(reader: &BaseConsumer, wait: Duration) -> Result<Option<BorrowedMessage<'_>>> {
    match reader.poll(wait) {
        None => Ok(None),
        Some(Ok(m)) => Ok(Some(m)),
        Some(Err(KafkaError::MessageConsumption(
            code @ (RDKafkaErrorCode::AllBrokersDown | RDKafkaErrorCode::BrokerTransportFailure),
        ))) => {
            eprintln!("bench: a reader lost its broker connections ({code}); librdkafka reconnects");
            Ok(None)
        }
        Some(Err(e)) => Err(e).context("reading"),
    }
}

/// A read_committed consumer assigned to every partition of `topic` from the beginning.
pub fn committed_reader(topic: &str, partitions: i32) -> Result<BaseConsumer> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", "tally-bench-reader")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .create()
        .context("creating the output reader")?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl).context("assigning the output reader")?;
    Ok(consumer)
}

/// Bytes on the broker's disk of every partition of `topics`, from `kafka-log-dirs`
/// (the `LogDirsCommand` tool of the local broker script).
pub fn log_dir_bytes(repo: &Path, topics: &[String]) -> Result<u64> {
    if topics.is_empty() {
        return Ok(0);
    }
    let out = Command::new(repo.join("deploy/local/kafka"))
        .args([
            "tool",
            "LogDirsCommand",
            "--bootstrap-server",
            &bootstrap(),
            "--describe",
        ])
        .args(["--topic-list", &topics.join(",")])
        .output()
        .context("running the LogDirsCommand tool")?;
    if !out.status.success() {
        bail!("LogDirsCommand failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text
        .lines()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| anyhow!("LogDirsCommand printed no JSON: {text}"))?;
    let v: serde_json::Value = serde_json::from_str(json).context("parsing LogDirsCommand output")?;
    let mut total = 0;
    for broker in v["brokers"].as_array().into_iter().flatten() {
        for dir in broker["logDirs"].as_array().into_iter().flatten() {
            for p in dir["partitions"].as_array().into_iter().flatten() {
                total += p["size"].as_u64().unwrap_or(0);
            }
        }
    }
    Ok(total)
}
