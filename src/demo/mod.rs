//! `tally demo`: the payments topology on librdkafka's in-process mock cluster, no broker needed.
//!
//! The mock speaks the Kafka protocol but does not implement transactions faithfully, so the
//! demo shows deduplication and dead-lettering, never exactly-once.

pub mod generator;

use crate::config;
use crate::engine::health::Health;
use crate::engine::{self, Shutdown};
use crate::metrics::{Metrics, Totals};
use anyhow::{bail, Context, Result};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The topology the demo runs: the same file as `topologies/payments.yaml`.
const PAYMENTS_TOPOLOGY: &str = include_str!("../../topologies/payments.yaml");

/// What the demo fed in and what came out.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// Records written to the input topic.
    pub produced: u64,
    /// Distinct valid business events among them.
    pub unique_events: u64,
    /// Poison records among them.
    pub poison: u64,
    /// What tally counted.
    pub totals: Totals,
}

/// Runs the demo with `events` business events generated from `seed`.
pub fn run(events: usize, seed: u64) -> Result<DemoReport> {
    let cluster = MockCluster::new(1).context("starting the mock cluster")?;
    for topic in ["payments.events", "payments.deduped", "payments.dlq"] {
        cluster
            .create_topic(topic, 3, 1)
            .with_context(|| format!("creating {topic} on the mock"))?;
    }
    let bootstrap = cluster.bootstrap_servers();
    let state = tempfile::tempdir().context("creating a state directory for the demo")?;
    let env = |var: &str| match var {
        "KAFKA_BOOTSTRAP" => Some(bootstrap.clone()),
        "TALLY_STATE_DIR" => Some(state.path().display().to_string()),
        _ => None,
    };
    let topology = Arc::new(config::load_str("topologies/payments.yaml", PAYMENTS_TOPOLOGY, env)?);
    // The mock has no CreateTopics API, so the internal topics tally would create are made here.
    for p in &topology.pipelines {
        let changelogs = p.store_names().into_iter().map(|s| topology.changelog_topic(&s));
        for topic in changelogs.chain(p.repartition.as_ref().map(|r| r.topic.clone())) {
            cluster
                .create_topic(&topic, 3, 1)
                .with_context(|| format!("creating {topic} on the mock"))?;
        }
    }
    let routing = topology.routing_topic();
    cluster
        .create_topic(&routing, 1, 1)
        .with_context(|| format!("creating {routing} on the mock"))?;

    let generated = generator::payments(events, 20, topology.processing.max_record_bytes, seed);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .context("creating the demo producer")?;
    for r in &generated.records {
        let headers = r.headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
            h.insert(Header { key: k, value: Some(v) })
        });
        let mut record = BaseRecord::to("payments.events")
            .key(&r.key)
            .payload(&r.payload)
            .headers(headers);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
    }
    producer
        .flush(Duration::from_secs(30))
        .context("flushing the demo input")?;
    let produced = generated.records.len() as u64;

    let metrics = Arc::new(Metrics::new(&topology.application_id)?);
    let names = topology.pipeline_names();
    let shutdown = Shutdown::default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let totals = rt.block_on(async {
        let engine = tokio::spawn(engine::run(
            topology.clone(),
            "demo",
            engine::Cluster::Mock,
            engine::routing::OnChange::Refuse,
            Arc::new(crate::reconcile::live::LiveReconciler),
            metrics.clone(),
            Arc::new(Health::default()),
            Arc::default(),
            shutdown.clone(),
        ));
        let deadline = Instant::now() + Duration::from_secs(120);
        // Done when every input record is accounted for, after the repartition hop too.
        let done = |t: &Totals| {
            t.records_in == produced && t.records_out + t.duplicates + t.stale + t.dead_lettered_total() == produced
        };
        while !done(&metrics.totals(&names)) && Instant::now() < deadline && !engine.is_finished() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        shutdown.trigger();
        engine.await.context("engine task panicked")??;
        Ok::<_, anyhow::Error>(metrics.totals(&names))
    })?;
    if totals.records_in < produced {
        bail!(
            "the demo processed {} of {produced} records within 120 s",
            totals.records_in
        );
    }
    Ok(DemoReport {
        produced,
        unique_events: generated.expected_keys.len() as u64,
        poison: generated.poison.values().sum(),
        totals,
    })
}

/// The demo's printed report.
pub fn render(r: &DemoReport) -> String {
    let t = &r.totals;
    let mut s = String::new();
    s.push_str("tally demo: payments topology on librdkafka's in-process MOCK cluster\n");
    s.push_str("  NOTE: the mock cluster cannot demonstrate exactly-once (it does not filter aborted\n");
    s.push_str("  transactions or store transactional offsets). Exactly-once is shown by the test suite\n");
    s.push_str("  against a real Apache Kafka broker.\n\n");
    s.push_str(&format!(
        "  generated   {:>7} records: {} distinct payment events, each sent 1-5 times, {} poison\n",
        r.produced, r.unique_events, r.poison
    ));
    s.push_str(&format!("  in          {:>7}\n", t.records_in));
    s.push_str(&format!(
        "  out         {:>7}  (expected {})\n",
        t.records_out, r.unique_events
    ));
    s.push_str(&format!("  duplicates  {:>7}\n", t.duplicates));
    s.push_str(&format!("  stale       {:>7}\n", t.stale));
    s.push_str(&format!("  dead-letter {:>7}", t.dead_lettered_total()));
    let reasons: Vec<String> = t
        .dead_lettered
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{k}={n}"))
        .collect();
    if !reasons.is_empty() {
        s.push_str(&format!("  ({})", reasons.join(", ")));
    }
    let balanced = t.records_in == t.records_out + t.duplicates + t.stale + t.dead_lettered_total();
    s.push_str(&format!(
        "\n\n  in = out + duplicates + stale + dead-letter: {}\n",
        if balanced { "yes" } else { "NO" }
    ));
    s
}
