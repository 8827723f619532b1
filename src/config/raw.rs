//! The topology file as written: lenient types with locations, checked by `validate`.

use serde::Deserialize;
use serde_saphyr::Spanned;
use std::collections::BTreeMap;

/// A located string.
pub type Text = Spanned<String>;

/// Top level of a topology file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTopology {
    pub application_id: Option<Text>,
    pub kafka: Option<RawKafka>,
    pub processing: Option<RawProcessing>,
    pub state: Option<RawState>,
    pub sources: Option<Spanned<BTreeMap<String, Spanned<RawSource>>>>,
    pub pipelines: Option<Spanned<Vec<Spanned<RawPipeline>>>>,
    pub dead_letter: Option<Spanned<RawDeadLetter>>,
    pub id_mapping: Option<Spanned<RawIdMapping>>,
    pub trace: Option<Spanned<RawTrace>>,
    pub reconcile: Option<Spanned<RawReconcile>>,
}

/// `reconcile:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReconcile {
    pub alerts_topic: Option<Text>,
    pub scan_interval: Option<Text>,
    pub threshold: Option<Text>,
}

/// `trace:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTrace {
    pub topic: Option<Text>,
    pub level: Option<Text>,
}

/// `id_mapping:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdMapping {
    pub topic: Option<Text>,
    pub partitions: Option<Spanned<u64>>,
}

/// One entry of a pipeline's `map_ids:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMapIds {
    pub field: Option<Text>,
    pub from_system: Option<Text>,
    pub to_system: Option<Text>,
    pub into: Option<Text>,
    pub on_missing: Option<Text>,
}

/// `kafka:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKafka {
    pub bootstrap_servers: Option<Text>,
    #[serde(default)]
    pub properties: BTreeMap<String, Spanned<Scalar>>,
}

/// A librdkafka property value: YAML scalars all become strings.
#[derive(Debug, Deserialize)]
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
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProcessing {
    pub guarantee: Option<Text>,
    pub commit_interval_ms: Option<Spanned<u64>>,
    pub threads: Option<Spanned<u64>>,
    pub max_record_bytes: Option<Spanned<u64>>,
    pub static_membership: Option<Spanned<bool>>,
    pub expiry_scan_interval_ms: Option<Spanned<u64>>,
    pub num_standby_replicas: Option<Spanned<u64>>,
}

/// `state:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawState {
    pub dir: Option<Text>,
    pub cleanup_delay_ms: Option<Spanned<u64>>,
}

/// One entry of `sources:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSource {
    pub topic: Option<Text>,
    pub format: Option<Text>,
}

/// One entry of `pipelines:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPipeline {
    pub name: Option<Text>,
    pub from: Option<Text>,
    pub key: Option<Text>,
    pub correlation_id: Option<RawCorrelation>,
    pub repartition: Option<Spanned<RawRepartition>>,
    pub map_ids: Option<Vec<Spanned<RawMapIds>>>,
    pub routes: Option<Spanned<Vec<Spanned<RawRoute>>>>,
    pub to: Option<Spanned<RawOutput>>,
}

/// `correlation_id:` of a pipeline.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCorrelation {
    pub header: Option<Text>,
    pub field: Option<Text>,
}

/// `repartition:` of a pipeline.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRepartition {
    pub key: Option<Text>,
}

/// One entry of `routes:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub when: Option<RawWhen>,
    pub strategy: Option<Text>,
    pub retention: Option<Text>,
    pub entity: Option<Text>,
    pub version: Option<Text>,
    pub increment_id: Option<Text>,
    pub into: Option<Text>,
    pub emit: Option<Text>,
    pub max_state_bytes: Option<Spanned<u64>>,
}

/// `when:` of a route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWhen {
    pub event_type: Option<Text>,
}

/// `to:` of a pipeline.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOutput {
    pub topic: Option<Text>,
    pub key: Option<Text>,
}

/// `dead_letter:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDeadLetter {
    pub topic: Option<Text>,
}
