//! The topology file as written: lenient types with locations, checked by `validate`.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::collections::BTreeMap;

/// A located string.
pub type Text = Spanned<String>;

/// Top level of a topology file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTopology {
    /// Consumer group id, and prefix of every internal topic and transactional id.
    #[schemars(with = "Option<String>")]
    pub application_id: Option<Text>,
    /// How to reach the cluster.
    pub kafka: Option<RawKafka>,
    /// Guarantee, commit interval, threads, limits.
    pub processing: Option<RawProcessing>,
    /// Where the local RocksDB stores live.
    pub state: Option<RawState>,
    /// Input topics by name.
    #[schemars(with = "Option<BTreeMap<String, RawSource>>")]
    pub sources: Option<Spanned<BTreeMap<String, Spanned<RawSource>>>>,
    /// What happens to each source's records.
    #[schemars(with = "Option<Vec<RawPipeline>>")]
    pub pipelines: Option<Spanned<Vec<Spanned<RawPipeline>>>>,
    /// Where records that cannot be processed go, with their bytes and a reason.
    #[schemars(with = "Option<RawDeadLetter>")]
    pub dead_letter: Option<Spanned<RawDeadLetter>>,
    /// The compacted topic of ID mappings between systems.
    #[schemars(with = "Option<RawIdMapping>")]
    pub id_mapping: Option<Spanned<RawIdMapping>>,
    /// The trace topic: RECEIVED/PROCESSING/COMPLETED/FAILED per event.
    #[schemars(with = "Option<RawTrace>")]
    pub trace: Option<Spanned<RawTrace>>,
    /// The live reconciler: alerts on events stuck unfinished.
    #[schemars(with = "Option<RawReconcile>")]
    pub reconcile: Option<Spanned<RawReconcile>>,
    /// Read-only HTTP queries over the instances' stores (off by default).
    #[schemars(with = "Option<RawQueries>")]
    pub queries: Option<Spanned<RawQueries>>,
}

/// `queries:`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawQueries {
    /// Serve `/queries` on the HTTP address (default false).
    #[schemars(with = "Option<bool>")]
    pub enabled: Option<Spanned<bool>>,
    /// The URL other instances redirect a query to, with `{instance}` where the owner's
    /// instance id goes, e.g. `http://{instance}.tally-headless:8080`.
    #[schemars(with = "Option<String>")]
    pub advertised_url: Option<Text>,
}

/// `reconcile:`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawReconcile {
    /// Topic the alerts go to.
    #[schemars(with = "Option<String>")]
    pub alerts_topic: Option<Text>,
    /// How often open events are scanned (a duration, e.g. 1s).
    #[schemars(with = "Option<String>")]
    pub scan_interval: Option<Text>,
    /// How long an event may stay unfinished before it alerts (a duration, e.g. 5m).
    #[schemars(with = "Option<String>")]
    pub threshold: Option<Text>,
    /// `in_process` (default: on `tally run`'s stream threads) or `separately` (its own
    /// deployment, `tally reconcile live`, which also watches the sources).
    #[schemars(with = "Option<String>")]
    pub run: Option<Text>,
}

/// `trace:`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTrace {
    /// The trace topic.
    #[schemars(with = "Option<String>")]
    pub topic: Option<Text>,
    /// `terminal` (COMPLETED/FAILED only) or `all`.
    #[schemars(with = "Option<String>")]
    pub level: Option<Text>,
}

/// `id_mapping:`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawIdMapping {
    /// The compacted mappings topic.
    #[schemars(with = "Option<String>")]
    pub topic: Option<Text>,
    /// Partitions of the mappings topic when tally creates it.
    #[schemars(with = "Option<u64>")]
    pub partitions: Option<Spanned<u64>>,
}

/// One entry of a pipeline's `map_ids:`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawMapIds {
    /// The record field holding the id to map.
    #[schemars(with = "Option<String>")]
    pub field: Option<Text>,
    /// The system the id belongs to.
    #[schemars(with = "Option<String>")]
    pub from_system: Option<Text>,
    /// The system whose id is wanted.
    #[schemars(with = "Option<String>")]
    pub to_system: Option<Text>,
    /// The field the mapped id is written to.
    #[schemars(with = "Option<String>")]
    pub into: Option<Text>,
    /// `pending_create` (the only choice): an unknown id is written as null and marked pending.
    #[schemars(with = "Option<String>")]
    pub on_missing: Option<Text>,
}

/// `kafka:`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawKafka {
    /// Comma-separated host:port list.
    #[schemars(with = "Option<String>")]
    pub bootstrap_servers: Option<Text>,
    /// librdkafka properties (TLS, SASL, ...); those exactly-once depends on are refused.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, Scalar>")]
    pub properties: BTreeMap<String, Spanned<Scalar>>,
}

/// A librdkafka property value: YAML scalars all become strings.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Scalar {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl Scalar {
    /// The value as librdkafka expects it.
    pub fn to_property(&self) -> String {
        match self {
            Scalar::Bool(b) => b.to_string(),
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Str(s) => s.clone(),
        }
    }
}

/// `processing:`
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawProcessing {
    /// `exactly_once`.
    #[schemars(with = "Option<String>")]
    pub guarantee: Option<Text>,
    /// How long a transaction collects records before it commits.
    #[schemars(with = "Option<u64>")]
    pub commit_interval_ms: Option<Spanned<u64>>,
    /// Stream threads per instance.
    #[schemars(with = "Option<u64>")]
    pub threads: Option<Spanned<u64>>,
    /// Largest input record accepted; larger ones are dead-lettered.
    #[schemars(with = "Option<u64>")]
    pub max_record_bytes: Option<Spanned<u64>>,
    /// Join with a group.instance.id, so a quick restart moves nothing.
    #[schemars(with = "Option<bool>")]
    pub static_membership: Option<Spanned<bool>>,
    /// `classic` (default) or `consumer` (KIP-848, server-side assignment).
    #[schemars(with = "Option<String>")]
    pub group_protocol: Option<Text>,
    /// How often expired dedup keys are deleted.
    #[schemars(with = "Option<u64>")]
    pub expiry_scan_interval_ms: Option<Spanned<u64>>,
    /// Warm copies of each task's stores on other instances.
    #[schemars(with = "Option<u64>")]
    pub num_standby_replicas: Option<Spanned<u64>>,
}

/// `state:`
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawState {
    /// Directory of the local stores.
    #[schemars(with = "Option<String>")]
    pub dir: Option<Text>,
    /// Task directories unused this long are deleted.
    #[schemars(with = "Option<u64>")]
    pub cleanup_delay_ms: Option<Spanned<u64>>,
    /// RocksDB block cache shared by the instance's stores.
    #[schemars(with = "Option<u64>")]
    pub block_cache_bytes: Option<Spanned<u64>>,
    /// RocksDB memtables of all the instance's stores, charged to the block cache.
    #[schemars(with = "Option<u64>")]
    pub write_buffer_bytes: Option<Spanned<u64>>,
    /// Values of recent commits kept in memory, read before RocksDB (0: none).
    #[schemars(with = "Option<u64>")]
    pub recent_values_bytes: Option<Spanned<u64>>,
}

/// One entry of `sources:`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawSource {
    /// The Kafka topic.
    #[schemars(with = "Option<String>")]
    pub topic: Option<Text>,
    /// `json`.
    #[schemars(with = "Option<String>")]
    pub format: Option<Text>,
}

/// One entry of `pipelines:`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawPipeline {
    /// The pipeline's name (part of store and task names).
    #[schemars(with = "Option<String>")]
    pub name: Option<Text>,
    /// The source it reads.
    #[schemars(with = "Option<String>")]
    pub from: Option<Text>,
    /// The business idempotency key template, e.g. `{payment_id}:{status}`.
    #[schemars(with = "Option<String>")]
    pub key: Option<Text>,
    /// Where the correlation id is read from.
    pub correlation_id: Option<RawCorrelation>,
    /// Re-key records first so every copy of an event meets in one task.
    #[schemars(with = "Option<RawRepartition>")]
    pub repartition: Option<Spanned<RawRepartition>>,
    /// IDs to map between systems.
    #[schemars(with = "Option<Vec<RawMapIds>>")]
    pub map_ids: Option<Vec<Spanned<RawMapIds>>>,
    /// Strategy per event type: ignore, overwrite or merge.
    #[schemars(with = "Option<Vec<RawRoute>>")]
    pub routes: Option<Spanned<Vec<Spanned<RawRoute>>>>,
    /// The output topic and its key.
    #[schemars(with = "Option<RawOutput>")]
    pub to: Option<Spanned<RawOutput>>,
}

/// `correlation_id:` of a pipeline.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCorrelation {
    /// Header holding the correlation id.
    #[schemars(with = "Option<String>")]
    pub header: Option<Text>,
    /// Record field holding it when the header is absent.
    #[schemars(with = "Option<String>")]
    pub field: Option<Text>,
}

/// `repartition:` of a pipeline.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRepartition {
    /// Template of the repartition key, e.g. `{payment_id}`.
    #[schemars(with = "Option<String>")]
    pub key: Option<Text>,
    /// The partitioner (`murmur2`, `crc32` or `fnv1a`) the source's producers already partition
    /// it by `key` with: the repartition hop is skipped.
    #[schemars(with = "Option<String>")]
    pub co_partitioned: Option<Text>,
}

/// One entry of `routes:`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    /// Which records the route takes (first match wins).
    pub when: Option<RawWhen>,
    /// `ignore` duplicates, `overwrite` with a higher version, `merge` increments, or `record_mapping`.
    #[schemars(with = "Option<String>")]
    pub strategy: Option<Text>,
    /// How long a dedup key is kept (a duration, e.g. 30d).
    #[schemars(with = "Option<String>")]
    pub retention: Option<Text>,
    /// `overwrite`/`merge`: template of the entity key.
    #[schemars(with = "Option<String>")]
    pub entity: Option<Text>,
    /// `overwrite`: template of the source version (an integer).
    #[schemars(with = "Option<String>")]
    pub version: Option<Text>,
    /// `merge`: template of an increment's id (the inner dedup).
    #[schemars(with = "Option<String>")]
    pub increment_id: Option<Text>,
    /// `merge`: the array field of the state the increments go to (default `items`).
    #[schemars(with = "Option<String>")]
    pub into: Option<Text>,
    /// `merge`: emit the whole `state` or the `increment`.
    #[schemars(with = "Option<String>")]
    pub emit: Option<Text>,
    /// `merge`: largest merged state; an increment past it is dead-lettered.
    #[schemars(with = "Option<u64>")]
    pub max_state_bytes: Option<Spanned<u64>>,
}

/// `when:` of a route.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawWhen {
    /// A glob on the record's event type, e.g. `payment.*`.
    #[schemars(with = "Option<String>")]
    pub event_type: Option<Text>,
}

/// `to:` of a pipeline.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawOutput {
    /// The output topic.
    #[schemars(with = "Option<String>")]
    pub topic: Option<Text>,
    /// Template of the output key.
    #[schemars(with = "Option<String>")]
    pub key: Option<Text>,
}

/// `dead_letter:`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawDeadLetter {
    /// The dead-letter topic.
    #[schemars(with = "Option<String>")]
    pub topic: Option<Text>,
}
