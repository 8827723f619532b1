//! One record through one pipeline: size check, decode, key, route, strategy.

use super::correlation;
use super::dedup::{self, Admission};
use super::fields::Fields;
use super::idmap::{self, MappingRecord, PendingCreate};
use super::merge::{self, Merge, MergeSpec};
use super::rejection::{Reason, Rejection};
use super::state::{self, StateError, StoreKey};
use super::version_gate::{self, Gate};
use crate::store::{GlobalMappings, TaskStore};
use crate::topology::template::{KeyTemplate, RenderError};
use crate::topology::{CoPartitioning, MergeEmit, Pipeline, RenderedKey, StoreKind, Strategy};
use serde_json::{Map, Value};
use std::cell::{Cell, OnceCell};
use std::sync::Arc;

/// What the engine knows about a consumed record.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The record value.
    pub payload: Option<&'a [u8]>,
    /// The value of the pipeline's correlation header, if present.
    pub correlation_header: Option<&'a str>,
    /// Source topic, partition and offset: the seed of a derived correlation id for bad records.
    pub coordinates: (&'a str, i32, i64),
    /// Processing time (ms since the Unix epoch).
    pub now_ms: i64,
}

/// What to do with the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Passes: write it to the output with this message key.
    Emit {
        /// The business idempotency key.
        idempotency_key: RenderedKey,
        /// The output message key.
        output_key: String,
        /// The output value when it is not the input's (merged state, mapped ids).
        payload: Option<Vec<u8>>,
        /// Target systems whose id was unknown: the event goes out pending-create.
        pending: Vec<PendingCreate>,
    },
    /// A first write-back for its entity: these records go to the mappings topic.
    Mapping {
        /// The business idempotency key.
        idempotency_key: RenderedKey,
        /// Mapping records for the mappings topic.
        records: Vec<MappingRecord>,
    },
    /// Seen before: drop it.
    Duplicate {
        /// The business idempotency key.
        idempotency_key: RenderedKey,
    },
    /// A version not higher than the entity's: drop it.
    Stale {
        /// The business idempotency key.
        idempotency_key: RenderedKey,
        /// The record's version.
        version: i64,
        /// The entity's version.
        current: i64,
    },
    /// Bad input: send it to the dead-letter topic.
    Reject(Rejection),
}

/// A decision with the record's correlation id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Processed {
    /// What to do.
    pub decision: Decision,
    /// Carried on the output, DLQ record and log lines.
    pub correlation_id: String,
}

/// A record re-keyed for a repartition topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rekeyed {
    /// The new message key.
    pub key: String,
    /// The record's correlation id (for its trace record), when asked for.
    pub correlation_id: Option<String>,
}

impl Decision {
    /// The idempotency key the decision was made for, when the record had one.
    pub fn idempotency_key(&self) -> Option<&RenderedKey> {
        match self {
            Decision::Emit { idempotency_key, .. }
            | Decision::Duplicate { idempotency_key }
            | Decision::Stale { idempotency_key, .. }
            | Decision::Mapping { idempotency_key, .. } => Some(idempotency_key),
            Decision::Reject(_) => None,
        }
    }
}

/// Runs records of one pipeline against a task's stores.
pub struct PipelineProcessor {
    pipeline: Arc<Pipeline>,
    max_record_bytes: usize,
    stores: Vec<StoreKind>,
    global: Arc<GlobalMappings>,
    fields: Fields,
    /// The fields the repartition hop reads when it needs no correlation id: its key's only.
    hop_fields: Fields,
    /// Per store: whether it may still hold text keys of an earlier version, looked up once
    /// (the task's stores are restored before its first record).
    legacy_keys: Vec<OnceCell<bool>>,
    /// A co-partitioned source's partition count, when known: each record's key is checked
    /// against the partition it came from.
    source_partitions: Option<i32>,
    /// Records found on a partition their key does not belong to, not yet taken.
    misplaced: Cell<u64>,
    /// True once a misplaced record was logged (the first one is; the count says the rest).
    misplaced_said: Cell<bool>,
}

impl PipelineProcessor {
    /// A processor over a task whose stores are `pipeline.store_names()`, in that order;
    /// `global` is the instance's ID-mapping store.
    pub fn new(pipeline: Arc<Pipeline>, max_record_bytes: usize, global: Arc<GlobalMappings>) -> Self {
        let stores = pipeline.store_kinds();
        let legacy_keys = stores.iter().map(|_| OnceCell::new()).collect();
        Self {
            legacy_keys,
            fields: Fields::of(&pipeline),
            hop_fields: Fields::of_template(hop_template(&pipeline)),
            pipeline,
            max_record_bytes,
            stores,
            global,
            source_partitions: None,
            misplaced: Cell::new(0),
            misplaced_said: Cell::new(false),
        }
    }

    /// Checks every record of a co-partitioned source of `count` partitions against the
    /// partition its key belongs to.
    pub fn with_source_partitions(mut self, count: i32) -> Self {
        self.source_partitions = Some(count);
        self
    }

    /// Records found on a partition their key does not belong to since the last call.
    pub fn take_misplaced(&self) -> u64 {
        self.misplaced.replace(0)
    }

    /// Counts (and logs the first) record whose co-partitioning `key` belongs to another
    /// partition than the one it was read from: its copies elsewhere are not deduplicated with it.
    fn check_placement(&self, co: &CoPartitioning, key: &str, input: &Input<'_>) {
        let (topic, partition, offset) = input.coordinates;
        let Some(count) = self.source_partitions else {
            return;
        };
        let Some(belongs) = co.partitioner.partition(key.as_bytes(), count) else {
            return;
        };
        if belongs == partition {
            return;
        }
        self.misplaced.set(self.misplaced.get() + 1);
        if !self.misplaced_said.replace(true) {
            tracing::warn!(
                pipeline = %self.pipeline.name,
                topic,
                partition,
                offset,
                key,
                belongs_to = belongs,
                partitioner = co.partitioner.name(),
                consequence = "its copies on other partitions are not deduplicated with it; later ones are \
                               only counted in tally_records_misplaced_total",
                fix = "make every producer key by the `repartition.key` text with this partitioner, or remove \
                       `co_partitioned` to repartition",
                "a record of a co-partitioned source is on another partition than its key's"
            );
        }
    }

    /// Where `key`'s state lives in store `index`.
    fn store_key<'k>(&self, store: &TaskStore, index: usize, key: &'k RenderedKey) -> Result<StoreKey<'k>, StateError> {
        let legacy = match self.legacy_keys.get(index).and_then(OnceCell::get) {
            Some(known) => *known,
            None => {
                let possible = state::legacy_keys_possible(store, index)?;
                if let Some(cell) = self.legacy_keys.get(index) {
                    let _ = cell.set(possible);
                }
                possible
            }
        };
        Ok(StoreKey {
            stored: &key.stored,
            legacy: legacy.then_some(key.text.as_str()),
        })
    }

    fn store_index(&self, kind: StoreKind) -> Result<usize, StateError> {
        self.stores
            .iter()
            .position(|k| *k == kind)
            .ok_or(StateError::MissingStore(kind.as_str()))
    }

    /// The pipeline this processor runs.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Decides one record, writing dedup state into the task's open transaction.
    pub fn process(&self, input: &Input<'_>, store: &mut TaskStore) -> Result<Processed, StateError> {
        let mut doc = match self.decode(input.payload) {
            Ok(doc) => doc,
            Err(rejection) => return Ok(self.rejected(input, None, rejection)),
        };
        // As the repartition hop would, a record without its partitioning key is refused.
        if let Some(co) = &self.pipeline.co_partitioned {
            match co.key.render(&doc) {
                Ok(k) => self.check_placement(co, &k, input),
                Err(e) => return Ok(self.rejected(input, Some(&doc), key_rejection(e, "repartition key"))),
            }
        }
        let key = match self.pipeline.key.render_key(&doc) {
            Ok(k) => k,
            Err(e) => return Ok(self.rejected(input, Some(&doc), key_rejection(e, "key"))),
        };
        let correlation_id = correlation::resolve(
            &self.pipeline.correlation,
            input.correlation_header,
            Some(&doc),
            &key.text,
        );
        let event_type = doc.get("event_type").and_then(Value::as_str);
        let Some(route) = self.pipeline.route_for(event_type) else {
            let detail = match event_type {
                Some(t) => format!("no route matches event_type `{t}`"),
                None => "the record has no string `event_type` and every route needs one".to_string(),
            };
            return Ok(Processed {
                decision: Decision::Reject(Rejection::new(Reason::NoRoute, detail)),
                correlation_id,
            });
        };
        let output_template = self.pipeline.output.key.as_ref().or(route.strategy.entity());
        let output_key = match output_template.map(|t| t.render(&doc)) {
            None => key.text.clone(),
            Some(Ok(k)) => k,
            Some(Err(e)) => {
                return Ok(Processed {
                    decision: Decision::Reject(key_rejection(e, "output key")),
                    correlation_id,
                })
            }
        };
        // Ids are looked up before any state changes, so a rejection leaves none behind.
        let pending = match idmap::enrich(&self.global, &self.pipeline.map_ids, &mut doc)? {
            Ok(p) => p,
            Err(rejection) => {
                return Ok(Processed {
                    decision: Decision::Reject(rejection),
                    correlation_id,
                })
            }
        };
        let mut decision = match self.decide(&route.strategy, &doc, key, output_key, input.now_ms, store)? {
            Ok(decision) => decision,
            Err(rejection) => Decision::Reject(rejection),
        };
        if let Decision::Emit {
            payload, pending: p, ..
        } = &mut decision
        {
            if payload.is_none() && !self.pipeline.map_ids.is_empty() {
                *payload = Some(Value::Object(doc).to_string().into_bytes());
            }
            *p = pending;
        }
        Ok(Processed {
            decision,
            correlation_id,
        })
    }

    /// Applies a route's strategy; an `Err` inside is a rejection of the record.
    fn decide(
        &self,
        strategy: &Strategy,
        doc: &Map<String, Value>,
        key: RenderedKey,
        output_key: String,
        now_ms: i64,
        store: &mut TaskStore,
    ) -> Result<Result<Decision, Rejection>, StateError> {
        let emit = |key: RenderedKey, payload: Option<Vec<u8>>| Decision::Emit {
            idempotency_key: key,
            output_key: output_key.clone(),
            payload,
            pending: Vec::new(),
        };
        Ok(Ok(match strategy {
            Strategy::Ignore { retention } => {
                let index = self.store_index(StoreKind::Dedup)?;
                let at = self.store_key(store, index, &key)?;
                match dedup::admit(store, index, at, now_ms, *retention)? {
                    Admission::First => emit(key, None),
                    Admission::Duplicate => Decision::Duplicate { idempotency_key: key },
                }
            }
            Strategy::Overwrite { entity, version } => {
                let entity = match entity.render_key(doc) {
                    Ok(e) => e,
                    Err(e) => return Ok(Err(key_rejection(e, "entity"))),
                };
                let text = match version.render(doc) {
                    Ok(v) => v,
                    Err(e) => return Ok(Err(key_rejection(e, "version"))),
                };
                let Some(v) = version_gate::parse_version(&text) else {
                    let detail = format!("version `{text}` is not an integer");
                    return Ok(Err(Rejection::new(Reason::InvalidVersion, detail)));
                };
                let index = self.store_index(StoreKind::Versions)?;
                let at = self.store_key(store, index, &entity)?;
                match version_gate::offer(store, index, at, v)? {
                    Gate::Newer => emit(key, None),
                    Gate::Stale { current } => Decision::Stale {
                        idempotency_key: key,
                        version: v,
                        current,
                    },
                }
            }
            Strategy::Merge {
                entity,
                increment_id,
                into,
                emit: what,
                max_state_bytes,
            } => {
                let (entity, id) = match (entity.render_key(doc), increment_id.render_key(doc)) {
                    (Ok(e), Ok(i)) => (e, i),
                    (Err(e), _) => return Ok(Err(key_rejection(e, "entity"))),
                    (_, Err(e)) => return Ok(Err(key_rejection(e, "increment id"))),
                };
                let index = self.store_index(StoreKind::Merged)?;
                let spec = MergeSpec {
                    into,
                    max_state_bytes: *max_state_bytes,
                };
                let at = self.store_key(store, index, &entity)?;
                match merge::apply(store, index, at, &entity.text, &id, doc, spec)? {
                    Merge::Applied(state) => match what {
                        MergeEmit::State => emit(key, Some(state)),
                        MergeEmit::Increment => emit(key, None),
                    },
                    Merge::AlreadyApplied => Decision::Duplicate { idempotency_key: key },
                    Merge::TooLarge { bytes } => {
                        // The bound protects memory and the changelog: the increment is refused.
                        let detail = format!(
                            "merged state of `{}` would be {bytes} bytes, over max_state_bytes {max_state_bytes}",
                            entity.text
                        );
                        return Ok(Err(Rejection::new(Reason::StateTooLarge, detail)));
                    }
                    Merge::Unreadable(why) => {
                        let detail = format!("the merged state of `{}` cannot be read: {why}", entity.text);
                        return Ok(Err(Rejection::new(Reason::UnreadableState, detail)));
                    }
                    Merge::TooDeep { depth } => {
                        let detail = format!(
                            "the increment nests {depth} levels deep, over the {} a merged state can hold",
                            merge::MAX_INCREMENT_DEPTH
                        );
                        return Ok(Err(Rejection::new(Reason::StateTooLarge, detail)));
                    }
                }
            }
            Strategy::RecordMapping => {
                let wb = match idmap::parse_write_back(doc) {
                    Ok(wb) => wb,
                    Err(rejection) => return Ok(Err(rejection)),
                };
                let index = self.store_index(StoreKind::Links)?;
                match idmap::record(store, index, &self.global, &wb)? {
                    Some(records) => Decision::Mapping {
                        idempotency_key: key,
                        records,
                    },
                    None => Decision::Duplicate { idempotency_key: key },
                }
            }
        }))
    }

    /// For a repartition stage: the record's new message key from the pipeline's repartition
    /// template (its business key when it has none), with its correlation id when
    /// `with_correlation` (only trace records need it there), or its rejection (boxed: the
    /// rare case should not size every result).
    pub fn rekey(&self, input: &Input<'_>, with_correlation: bool) -> Result<Rekeyed, Box<Processed>> {
        let template = hop_template(&self.pipeline);
        // Without a correlation id to derive, the hop decodes only its key's fields: the whole
        // value is still checked, but the rest is skipped instead of built.
        let fields = if with_correlation {
            &self.fields
        } else {
            &self.hop_fields
        };
        let doc = fields
            .decode(input.payload, self.max_record_bytes)
            .map_err(|r| Box::new(self.rejected(input, None, r)))?;
        let key = template.render(&doc).map_err(|e| {
            // The dead letter carries the record's correlation id, whose field the hop's
            // decode may have skipped.
            let full = self.decode(input.payload).ok();
            Box::new(self.rejected(input, full.as_ref(), key_rejection(e, "repartition key")))
        })?;
        let correlation_id = with_correlation.then(|| {
            let (topic, partition, offset) = input.coordinates;
            let seed = match self.pipeline.key.render(&doc) {
                Ok(k) => k,
                Err(_) => format!("{topic}/{partition}/{offset}"),
            };
            correlation::resolve(&self.pipeline.correlation, input.correlation_header, Some(&doc), &seed)
        });
        Ok(Rekeyed { key, correlation_id })
    }

    /// Refuses a record the engine cannot write (its output would be too large), with the
    /// correlation id its processing would have carried; no store is touched.
    pub fn refuse(&self, input: &Input<'_>, rejection: Rejection) -> Processed {
        let doc = self.decode(input.payload).ok();
        let (topic, partition, offset) = input.coordinates;
        let seed = doc
            .as_ref()
            .and_then(|d| self.pipeline.key.render(d).ok())
            .unwrap_or_else(|| format!("{topic}/{partition}/{offset}"));
        Processed {
            correlation_id: correlation::resolve(
                &self.pipeline.correlation,
                input.correlation_header,
                doc.as_ref(),
                &seed,
            ),
            decision: Decision::Reject(rejection),
        }
    }

    fn decode(&self, payload: Option<&[u8]>) -> Result<Map<String, Value>, Rejection> {
        self.fields.decode(payload, self.max_record_bytes)
    }

    fn rejected(&self, input: &Input<'_>, doc: Option<&Map<String, Value>>, rejection: Rejection) -> Processed {
        let (topic, partition, offset) = input.coordinates;
        let seed = format!("{topic}/{partition}/{offset}");
        Processed {
            correlation_id: correlation::resolve(&self.pipeline.correlation, input.correlation_header, doc, &seed),
            decision: Decision::Reject(rejection),
        }
    }
}

/// The template a repartition hop keys records by: the pipeline's repartition key, else its
/// business key.
fn hop_template(pipeline: &Pipeline) -> &KeyTemplate {
    pipeline.repartition.as_ref().map_or(&pipeline.key, |r| &r.key)
}

fn key_rejection(e: RenderError, what: &str) -> Rejection {
    let reason = match e {
        RenderError::Missing(_) | RenderError::Empty(_) => Reason::MissingKeyField,
        RenderError::NonScalar(_) => Reason::NonScalarKeyField,
    };
    Rejection::new(reason, format!("{what}: {e}"))
}

#[cfg(test)]
mod tests;
