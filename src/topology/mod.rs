//! The validated topology: sources, pipelines with their routes and strategies, sinks, stores.
//!
//! Built only by `config::load`, so everything here has already been checked.

pub mod describe;
pub mod diagram;
pub mod partitioner;
pub mod reconciler;
pub mod rendered_key;
pub mod state;
pub mod template;

use globset::GlobMatcher;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use reconciler::{ReconcileRun, Watch, WatchedTopic};
pub use rendered_key::RenderedKey;
pub use state::StateMemory;
pub use template::KeyTemplate;

/// A whole application: what `tally run` executes.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Consumer group id and prefix of every internal topic and transactional id.
    pub application_id: String,
    /// Connection settings.
    pub kafka: KafkaSettings,
    /// Loop and transaction settings.
    pub processing: Processing,
    /// Root of the local state directory.
    pub state_dir: PathBuf,
    /// How long a task directory no store uses is kept before it is deleted.
    pub state_cleanup_delay: Duration,
    /// Memory shared by the instance's task stores.
    pub state_memory: StateMemory,
    /// Named input topics.
    pub sources: BTreeMap<String, Source>,
    /// Pipelines, each reading one source.
    pub pipelines: Vec<Pipeline>,
    /// Where bad records go.
    pub dead_letter_topic: String,
    /// The global ID-mapping store, when a pipeline maps or records ids.
    pub id_mapping: Option<IdMapping>,
    /// Where trace records go, when tracing.
    pub trace: Option<TraceSettings>,
    /// The live reconciler reading the trace topic, when configured.
    pub reconcile: Option<ReconcileSettings>,
    /// The HTTP query API over the stores, when enabled.
    pub queries: Option<QuerySettings>,
}

/// The read-only HTTP query API over the instances' stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuerySettings {
    /// Where an instance answers, with `{instance}` for its instance id (validated: http or
    /// https, no path).
    pub advertised_url: String,
}

impl QuerySettings {
    /// The base URL of `instance`, or `None` when its id has characters a host name cannot
    /// hold (instance ids come from the consumer group, which any client may join).
    pub fn url_of(&self, instance: &str) -> Option<String> {
        let plain = !instance.is_empty()
            && instance.len() <= 253
            && instance
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
        plain.then(|| {
            self.advertised_url
                .replace(Self::PLACEHOLDER, instance)
                .trim_end_matches('/')
                .to_string()
        })
    }

    /// The placeholder of the instance id in `advertised_url`.
    pub const PLACEHOLDER: &'static str = "{instance}";
}

/// The trace topic and how much is written to it.
#[derive(Debug, Clone)]
pub struct TraceSettings {
    /// The trace topic (shared with other systems' trace writers).
    pub topic: String,
    /// All statuses, or terminal ones only.
    pub level: crate::trace::Level,
}

/// The compacted topic behind the global ID-mapping store.
#[derive(Debug, Clone)]
pub struct IdMapping {
    /// The mappings topic.
    pub topic: String,
    /// Its partition count when tally creates it.
    pub partitions: i32,
}

/// One `map_ids` entry: enrich events from `from_system` with `to_system`'s id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapIds {
    /// Field holding the `from_system` id.
    pub field: String,
    /// The system the event's id belongs to.
    pub from_system: String,
    /// The system whose id the output needs.
    pub to_system: String,
    /// Output field receiving the `to_system` id (null while pending-create).
    pub into: String,
}

/// How to reach Kafka.
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    /// `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// Any librdkafka property, passed through to every client.
    pub properties: BTreeMap<String, String>,
}

/// Stream-thread settings.
#[derive(Debug, Clone)]
pub struct Processing {
    /// How often the open transaction is committed.
    pub commit_interval: Duration,
    /// Stream threads per instance.
    pub threads: usize,
    /// Records larger than this go to the dead-letter topic.
    pub max_record_bytes: usize,
    /// Join the group with `group.instance.id`, so a restart within the session timeout moves
    /// no partition.
    pub static_membership: bool,
    /// How often expired dedup keys are deleted (through the changelog).
    pub expiry_scan_interval: Duration,
    /// Other instances that keep a warm copy of each task's stores.
    pub num_standby_replicas: usize,
    /// The consumer group protocol of the stream threads.
    pub group_protocol: GroupProtocol,
}

/// The consumer group protocol (docs/group-protocol.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupProtocol {
    /// Client-side assignment (`cooperative-sticky`) with JoinGroup/SyncGroup rounds.
    #[default]
    Classic,
    /// KIP-848: the coordinator assigns and reconciles partitions on heartbeats.
    Consumer,
}

/// The live reconciler: events on the trace topic still open after `threshold` are reported.
#[derive(Debug, Clone)]
pub struct ReconcileSettings {
    /// Where alert records go.
    pub alerts_topic: String,
    /// How often open events are scanned.
    pub scan_interval: Duration,
    /// How long an event may stay open before it is reported.
    pub threshold: Duration,
    /// Which process hosts the reconciler's tasks.
    pub run: ReconcileRun,
    /// tally's inputs, watched from outside (only in the separately run reconciler).
    pub watch: Option<Watch>,
}

/// A named input topic.
#[derive(Debug, Clone)]
pub struct Source {
    /// The Kafka topic.
    pub topic: String,
}

/// One input → dedup → output flow.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// Unique name; part of store and changelog names.
    pub name: String,
    /// Name of the source it reads.
    pub source: String,
    /// The source's topic.
    pub input_topic: String,
    /// Business idempotency key template.
    pub key: KeyTemplate,
    /// Where the correlation id is read from.
    pub correlation: CorrelationSpec,
    /// Re-keying through an internal topic before the strategies run.
    pub repartition: Option<Repartition>,
    /// Instead of a repartition hop: the source is declared already partitioned by a key.
    pub co_partitioned: Option<CoPartitioning>,
    /// Ids to map into the output, looked up in the global store.
    pub map_ids: Vec<MapIds>,
    /// Strategy per event type, first match wins.
    pub routes: Vec<Route>,
    /// Output topic and key.
    pub output: Output,
}

/// A source declared partitioned by `key` (`repartition: {key, co_partitioned}`): its producers
/// key every record by the text `key` renders, with `partitioner`, so every copy of a business
/// event is already in one partition and the stateful part reads the source directly. Each
/// record is checked, and one on another partition is counted and logged.
#[derive(Debug, Clone)]
pub struct CoPartitioning {
    /// The key the source is partitioned by.
    pub key: KeyTemplate,
    /// The source producers' partitioner.
    pub partitioner: partitioner::Partitioner,
    /// The repartition topic the pipeline uses without `co_partitioned`: records a former run
    /// with the hop left there unprocessed would be skipped, so a start checks it is drained.
    pub former_hop: String,
}

/// A repartition step: records are re-keyed by `key` and written to `topic`, whose partitions
/// the stateful part of the pipeline reads, so duplicates sent with different message keys meet
/// in one task.
#[derive(Debug, Clone)]
pub struct Repartition {
    /// The new message key.
    pub key: KeyTemplate,
    /// The internal topic `<application_id>-<pipeline>-repartition`.
    pub topic: String,
}

/// Which part of a pipeline a consumed topic feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The source of a repartitioning pipeline: records are only re-keyed and forwarded.
    Repartition,
    /// The input of the stateful part (the source, or the repartition topic).
    Process,
}

/// Where a record's correlation id is found; derived when absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorrelationSpec {
    /// Header to read first.
    pub header: Option<String>,
    /// Payload field to read next.
    pub field: Option<String>,
}

/// A strategy chosen by the record's `event_type`.
#[derive(Debug, Clone)]
pub struct Route {
    /// The glob as written, `*` when the route has no `when`.
    pub event_type: String,
    /// Compiled glob; `None` matches every record, with or without an `event_type`.
    pub matcher: Option<GlobMatcher>,
    /// What to do with duplicates.
    pub strategy: Strategy,
}

/// What a route does with a record whose key has been seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Strategy {
    /// Drop duplicates; keys are remembered for `retention`.
    Ignore {
        /// How long a key is remembered.
        retention: Duration,
    },
    /// Keep the highest source version per entity; only a strictly higher version passes.
    Overwrite {
        /// Entity key template.
        entity: KeyTemplate,
        /// Template rendering the source version (an integer).
        version: KeyTemplate,
    },
    /// Combine increments into the entity's state, applying each increment id once.
    Merge {
        /// Entity key template.
        entity: KeyTemplate,
        /// Template rendering the increment's own id.
        increment_id: KeyTemplate,
        /// Array field of the merged state that collects the increments.
        into: String,
        /// What the output carries.
        emit: MergeEmit,
        /// Largest merged state; an increment that would exceed it is dead-lettered.
        max_state_bytes: usize,
    },
    /// Record "created" write-backs in the ID-mapping store, first write wins.
    RecordMapping,
}

/// Fields a `merge` state sets itself (the entity, the increment count): an `into` array under
/// one of these names would be overwritten by every merge.
pub const MERGE_STATE_FIELDS: [&str; 2] = ["entity", "increments"];

/// What a `merge` route writes to the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeEmit {
    /// The entity's merged state after the increment.
    State,
    /// The accepted increment as it arrived.
    Increment,
}

/// The kinds of state store a pipeline may need, one column family and changelog each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StoreKind {
    /// Idempotency keys seen (`ignore`).
    Dedup,
    /// Highest version per entity (`overwrite`).
    Versions,
    /// Merged state per entity (`merge`).
    Merged,
    /// Recorded id links (`record_mapping`).
    Links,
}

impl StoreKind {
    /// Suffix of the store name.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Dedup => "dedup",
            StoreKind::Versions => "versions",
            StoreKind::Merged => "merged",
            StoreKind::Links => "links",
        }
    }
}

impl Strategy {
    /// The store this strategy keeps its state in.
    pub fn store(&self) -> StoreKind {
        match self {
            Strategy::Ignore { .. } => StoreKind::Dedup,
            Strategy::Overwrite { .. } => StoreKind::Versions,
            Strategy::Merge { .. } => StoreKind::Merged,
            Strategy::RecordMapping => StoreKind::Links,
        }
    }

    /// The entity key template, for strategies that keep per-entity state.
    pub fn entity(&self) -> Option<&KeyTemplate> {
        match self {
            Strategy::Ignore { .. } | Strategy::RecordMapping => None,
            Strategy::Overwrite { entity, .. } | Strategy::Merge { entity, .. } => Some(entity),
        }
    }
}

/// The sink of a pipeline.
#[derive(Debug, Clone)]
pub struct Output {
    /// Output topic.
    pub topic: String,
    /// Message key template; the idempotency key when absent.
    pub key: Option<KeyTemplate>,
}

impl Pipeline {
    /// The header the correlation id is read from and written to (`correlation_id` unless the
    /// pipeline names one).
    pub fn correlation_header(&self) -> &str {
        self.correlation
            .header
            .as_deref()
            .unwrap_or(crate::wire::DEFAULT_CORRELATION_HEADER)
    }

    /// The topic the stateful part reads: the repartition topic or the source.
    pub fn process_topic(&self) -> &str {
        self.repartition.as_ref().map_or(&self.input_topic, |r| &r.topic)
    }

    /// Name of the pipeline's task for `partition` (its state directory and `task` label).
    pub fn task_name(&self, partition: i32) -> String {
        format!("{}-{partition}", self.name)
    }

    /// The longest `ignore` retention of the routes: keys older than this are expired for all.
    pub fn max_retention(&self) -> Option<Duration> {
        self.routes
            .iter()
            .filter_map(|r| match r.strategy {
                Strategy::Ignore { retention } => Some(retention),
                _ => None,
            })
            .max()
    }

    /// The templates whose rendered keys a store of `kind` holds: the idempotency key for the
    /// dedup store, each matching route's entity key for versions and merged state, none for
    /// links (keyed by internal id).
    pub fn key_templates(&self, kind: StoreKind) -> Vec<&KeyTemplate> {
        match kind {
            StoreKind::Dedup => vec![&self.key],
            StoreKind::Versions | StoreKind::Merged => self
                .routes
                .iter()
                .filter(|r| r.strategy.store() == kind)
                .filter_map(|r| r.strategy.entity())
                .collect(),
            StoreKind::Links => Vec::new(),
        }
    }

    /// The stores the routes need, in a fixed order (their index in a task).
    pub fn store_kinds(&self) -> Vec<StoreKind> {
        let mut kinds: Vec<StoreKind> = self.routes.iter().map(|r| r.strategy.store()).collect();
        kinds.sort();
        kinds.dedup();
        kinds
    }

    /// Name of a store (a RocksDB column family; part of its changelog topic's name).
    pub fn store_name(&self, kind: StoreKind) -> String {
        format!("{}-{}", self.name, kind.as_str())
    }

    /// Names of every store the pipeline needs, in `store_kinds` order.
    pub fn store_names(&self) -> Vec<String> {
        self.store_kinds().into_iter().map(|k| self.store_name(k)).collect()
    }

    /// The first route matching a record's event type, if any.
    pub fn route_for(&self, event_type: Option<&str>) -> Option<&Route> {
        self.routes.iter().find(|r| match (&r.matcher, event_type) {
            (None, _) => true,
            (Some(m), Some(t)) => m.is_match(t),
            (Some(_), None) => false,
        })
    }
}

impl Topology {
    /// The names of the pipelines (metric label values).
    pub fn pipeline_names(&self) -> Vec<String> {
        self.pipelines.iter().map(|p| p.name.clone()).collect()
    }

    /// Changelog topic of a store: `<application_id>-<store>-changelog`.
    pub fn changelog_topic(&self, store: &str) -> String {
        format!("{}-{}-changelog", self.application_id, store)
    }

    /// The compacted topic recording how each pipeline routes records to its tasks
    /// (`engine::routing`): `<application_id>-routing`.
    pub fn routing_topic(&self) -> String {
        format!("{}-routing", self.application_id)
    }

    /// Every changelog topic: each pipeline's stores, then the reconciler's.
    pub fn changelog_topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self
            .pipelines
            .iter()
            .flat_map(|p| p.store_names())
            .map(|s| self.changelog_topic(&s))
            .collect();
        topics.extend(self.reconciler_stores().iter().map(|s| self.changelog_topic(s)));
        topics
    }

    /// The pipeline a consumed topic belongs to, and the stage it feeds.
    pub fn stage_for_topic(&self, topic: &str) -> Option<(&Pipeline, Stage)> {
        self.pipelines.iter().find_map(|p| {
            if p.process_topic() == topic {
                Some((p, Stage::Process))
            } else if p.input_topic == topic {
                Some((p, Stage::Repartition))
            } else {
                None
            }
        })
    }

    /// Every topic the stream threads subscribe to.
    pub fn consumed_topics(&self) -> Vec<&str> {
        let mut topics = Vec::new();
        for p in &self.pipelines {
            topics.push(p.input_topic.as_str());
            if let Some(r) = &p.repartition {
                topics.push(r.topic.as_str());
            }
        }
        topics.extend(self.reconciled_topic());
        topics
    }

    /// The trace topic, when this process's stream threads run the live reconciler on it.
    pub fn reconciled_topic(&self) -> Option<&str> {
        self.reconcile.as_ref().filter(|r| r.run == ReconcileRun::InProcess)?;
        self.trace.as_ref().map(|t| t.topic.as_str())
    }

    /// The stores of a reconciler task in this process, in store-index order: the open events,
    /// and the watch positions when it watches tally's inputs.
    pub fn reconciler_stores(&self) -> Vec<String> {
        if self.reconciled_topic().is_none() {
            return Vec::new();
        }
        let mut stores = vec![Self::RECONCILE_STORE.to_string()];
        if self.reconcile.as_ref().is_some_and(|r| r.watch.is_some()) {
            stores.push(Self::WATCH_STORE.to_string());
        }
        stores
    }

    /// Name of the task fed by `topic`/`partition`: its `task` metric label and directory name.
    pub fn task_name(&self, topic: &str, partition: i32) -> Option<String> {
        if self.reconciled_topic() == Some(topic) {
            return Some(format!("reconcile-{partition}"));
        }
        self.stage_for_topic(topic).map(|(p, _)| p.task_name(partition))
    }

    /// The store name of the live reconciler's open events.
    pub const RECONCILE_STORE: &'static str = "reconcile-open";
    /// The store name of the watch positions of the separately run reconciler.
    pub const WATCH_STORE: &'static str = "reconcile-watch";
}
