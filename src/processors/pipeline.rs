//! One record through one pipeline: size check, decode, key, route, strategy.

use super::correlation;
use super::dedup::{self, Admission};
use super::idmap::{self, MappingRecord, PendingCreate};
use super::merge::{self, Merge, MergeSpec};
use super::rejection::{Reason, Rejection};
use super::state::StateError;
use super::version_gate::{self, Gate};
use crate::store::{GlobalMappings, TaskStore};
use crate::topology::template::RenderError;
use crate::topology::{KeyTemplate, MergeEmit, Pipeline, StoreKind, Strategy};
use serde_json::{Map, Value};
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
        idempotency_key: String,
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
        idempotency_key: String,
        /// Mapping records for the mappings topic.
        records: Vec<MappingRecord>,
    },
    /// Seen before: drop it.
    Duplicate {
        /// The business idempotency key.
        idempotency_key: String,
    },
    /// A version not higher than the entity's: drop it.
    Stale {
        /// The business idempotency key.
        idempotency_key: String,
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
    /// The record's correlation id (for its trace record).
    pub correlation_id: String,
}

impl Decision {
    /// The idempotency key the decision was made for, when the record had one.
    pub fn idempotency_key(&self) -> Option<&str> {
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
}

impl PipelineProcessor {
    /// A processor over a task whose stores are `pipeline.store_names()`, in that order;
    /// `global` is the instance's ID-mapping store.
    pub fn new(pipeline: Arc<Pipeline>, max_record_bytes: usize, global: Arc<GlobalMappings>) -> Self {
        let stores = pipeline.store_kinds();
        Self {
            pipeline,
            max_record_bytes,
            stores,
            global,
        }
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
        let key = match self.pipeline.key.render(&doc) {
            Ok(k) => k,
            Err(e) => return Ok(self.rejected(input, Some(&doc), key_rejection(e, "key"))),
        };
        let correlation_id =
            correlation::resolve(&self.pipeline.correlation, input.correlation_header, Some(&doc), &key);
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
            None => key.clone(),
            Some(Ok(k)) => k,
            Some(Err(e)) => {
                return Ok(Processed {
                    decision: Decision::Reject(key_rejection(e, "output key")),
                    correlation_id,
                })
            }
        };
        // Ids are looked up before any state changes, so a rejection leaves none behind.
        let pending = match idmap::enrich(&self.global, &self.pipeline.map_ids, &mut doc) {
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
        key: String,
        output_key: String,
        now_ms: i64,
        store: &mut TaskStore,
    ) -> Result<Result<Decision, Rejection>, StateError> {
        let emit = |key: String, payload: Option<Vec<u8>>| Decision::Emit {
            idempotency_key: key,
            output_key: output_key.clone(),
            payload,
            pending: Vec::new(),
        };
        Ok(Ok(match strategy {
            Strategy::Ignore { retention } => {
                let index = self.store_index(StoreKind::Dedup)?;
                match dedup::admit(store, index, &key, now_ms, *retention)? {
                    Admission::First => emit(key, None),
                    Admission::Duplicate => Decision::Duplicate { idempotency_key: key },
                }
            }
            Strategy::Overwrite { entity, version } => {
                let entity = match entity.render(doc) {
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
                match version_gate::offer(store, index, &entity, v)? {
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
                let (entity, id) = match (entity.render(doc), increment_id.render(doc)) {
                    (Ok(e), Ok(i)) => (e, i),
                    (Err(e), _) => return Ok(Err(key_rejection(e, "entity"))),
                    (_, Err(e)) => return Ok(Err(key_rejection(e, "increment id"))),
                };
                let index = self.store_index(StoreKind::Merged)?;
                let spec = MergeSpec {
                    into,
                    max_state_bytes: *max_state_bytes,
                };
                match merge::apply(store, index, &entity, &id, doc, spec)? {
                    Merge::Applied(state) => match what {
                        MergeEmit::State => emit(key, Some(state)),
                        MergeEmit::Increment => emit(key, None),
                    },
                    Merge::AlreadyApplied => Decision::Duplicate { idempotency_key: key },
                    Merge::TooLarge { bytes } => {
                        // The bound protects memory and the changelog: the increment is refused.
                        let detail = format!(
                            "merged state of `{entity}` would be {bytes} bytes, over max_state_bytes {max_state_bytes}"
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

    /// For a repartition stage: the record's new message key, or its rejection.
    pub fn rekey(&self, template: &KeyTemplate, input: &Input<'_>) -> Result<Rekeyed, Processed> {
        let doc = self.decode(input.payload).map_err(|r| self.rejected(input, None, r))?;
        let key = template
            .render(&doc)
            .map_err(|e| self.rejected(input, Some(&doc), key_rejection(e, "repartition key")))?;
        let (topic, partition, offset) = input.coordinates;
        let seed = match self.pipeline.key.render(&doc) {
            Ok(k) => k,
            Err(_) => format!("{topic}/{partition}/{offset}"),
        };
        let correlation_id =
            correlation::resolve(&self.pipeline.correlation, input.correlation_header, Some(&doc), &seed);
        Ok(Rekeyed { key, correlation_id })
    }

    fn decode(&self, payload: Option<&[u8]>) -> Result<Map<String, Value>, Rejection> {
        let Some(bytes) = payload else {
            return Err(Rejection::new(Reason::InvalidJson, "the record has no value"));
        };
        if bytes.len() > self.max_record_bytes {
            return Err(Rejection::new(
                Reason::Oversize,
                format!(
                    "{} bytes exceeds max_record_bytes {}",
                    bytes.len(),
                    self.max_record_bytes
                ),
            ));
        }
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(_) => Err(Rejection::new(
                Reason::NotAnObject,
                "the value is JSON but not an object",
            )),
            Err(e) => Err(Rejection::new(Reason::InvalidJson, format!("not valid JSON: {e}"))),
        }
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

fn key_rejection(e: RenderError, what: &str) -> Rejection {
    let reason = match e {
        RenderError::Missing(_) => Reason::MissingKeyField,
        RenderError::NonScalar(_) => Reason::NonScalarKeyField,
    };
    Rejection::new(reason, format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::store::StoreEnv;

    const YAML: &str = r#"
application_id: t
kafka: { bootstrap_servers: "localhost:9092" }
processing: { max_record_bytes: 200 }
sources: { in: { topic: in } }
pipelines:
  - name: payments
    from: in
    key: "{payment_id}:{status}"
    routes:
      - when: { event_type: "payment.*" }
        strategy: ignore
    to: { topic: out, key: "{payment_id}" }
dead_letter: { topic: dlq }
"#;

    const ROUTES: &str = r#"
application_id: t
kafka: { bootstrap_servers: "localhost:9092" }
sources: { in: { topic: in } }
pipelines:
  - name: sync
    from: in
    key: "{id}:{v}"
    routes:
      - when: { event_type: "entity.*" }
        strategy: overwrite
        entity: "{type}:{id}"
        version: "{v}"
      - when: { event_type: "cart.*" }
        strategy: merge
        entity: "{id}"
        increment_id: "{line}"
        into: lines
        max_state_bytes: 300
    to: { topic: out }
dead_letter: { topic: dlq }
"#;

    fn setup() -> (PipelineProcessor, TaskStore, tempfile::TempDir) {
        setup_with(YAML)
    }

    fn setup_with(yaml: &str) -> (PipelineProcessor, TaskStore, tempfile::TempDir) {
        let t = config::load_str("t.yaml", yaml, |_| None).expect("valid topology");
        let p = Arc::new(t.pipelines[0].clone());
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = TaskStore::open(tmp.path(), &p.store_names(), &StoreEnv::default()).expect("opens");
        let global = Arc::new(GlobalMappings::default());
        (PipelineProcessor::new(p, t.processing.max_record_bytes, global), s, tmp)
    }

    fn run(p: &PipelineProcessor, s: &mut TaskStore, payload: &[u8]) -> Processed {
        let input = Input {
            payload: Some(payload),
            correlation_header: None,
            coordinates: ("in", 0, 7),
            now_ms: 1_000,
        };
        p.process(&input, s).expect("no store error")
    }

    fn reason(p: &Processed) -> Option<Reason> {
        match &p.decision {
            Decision::Reject(r) => Some(r.reason),
            _ => None,
        }
    }

    #[test]
    fn business_key_decides_not_the_message() {
        let (p, mut s, _tmp) = setup();
        let first = run(
            &p,
            &mut s,
            br#"{"event_type":"payment.completed","payment_id":"P1","status":"PAID"}"#,
        );
        assert_eq!(
            first.decision,
            Decision::Emit {
                idempotency_key: "P1:PAID".into(),
                output_key: "P1".into(),
                payload: None,
                pending: vec![]
            }
        );
        let again = run(
            &p,
            &mut s,
            br#"{"status":"PAID","payment_id":"P1","event_type":"payment.retried","extra":1}"#,
        );
        assert_eq!(
            again.decision,
            Decision::Duplicate {
                idempotency_key: "P1:PAID".into()
            }
        );
        assert_eq!(
            first.correlation_id, again.correlation_id,
            "derived from the business key"
        );
    }

    #[test]
    fn every_kind_of_bad_record_is_rejected_with_its_reason() {
        let (p, mut s, _tmp) = setup();
        let big = format!(
            r#"{{"event_type":"payment.x","payment_id":"P","status":"S","pad":"{}"}}"#,
            "x".repeat(300)
        );
        assert_eq!(reason(&run(&p, &mut s, big.as_bytes())), Some(Reason::Oversize));
        assert_eq!(reason(&run(&p, &mut s, b"{not json")), Some(Reason::InvalidJson));
        assert_eq!(reason(&run(&p, &mut s, b"[1,2]")), Some(Reason::NotAnObject));
        assert_eq!(
            reason(&run(&p, &mut s, br#"{"event_type":"payment.x","payment_id":"P"}"#)),
            Some(Reason::MissingKeyField)
        );
        assert_eq!(
            reason(&run(
                &p,
                &mut s,
                br#"{"event_type":"payment.x","payment_id":{"a":1},"status":"S"}"#
            )),
            Some(Reason::NonScalarKeyField)
        );
        assert_eq!(
            reason(&run(
                &p,
                &mut s,
                br#"{"event_type":"order.x","payment_id":"P","status":"S"}"#
            )),
            Some(Reason::NoRoute)
        );
        assert!(s.take_changes().is_empty(), "rejected records leave no dedup state");
    }

    #[test]
    fn rekey_renders_the_repartition_key_or_rejects() {
        let (p, _s, _tmp) = setup();
        let t: KeyTemplate = "{payment_id}".parse().expect("valid");
        let input = |payload: &'static [u8]| Input {
            payload: Some(payload),
            correlation_header: None,
            coordinates: ("in", 1, 2),
            now_ms: 0,
        };
        assert_eq!(
            p.rekey(&t, &input(br#"{"payment_id":"P9"}"#)).map(|r| r.key),
            Ok("P9".to_string())
        );
        let rejected = p.rekey(&t, &input(br#"{"status":"PAID"}"#)).expect_err("no payment_id");
        assert!(matches!(
            rejected.decision,
            Decision::Reject(Rejection {
                reason: Reason::MissingKeyField,
                ..
            })
        ));
    }

    #[test]
    fn overwrite_passes_higher_versions_keyed_by_entity_and_drops_the_rest() {
        let (p, mut s, _tmp) = setup_with(ROUTES);
        let rec = |v: &str| format!(r#"{{"event_type":"entity.updated","type":"customer","id":"C1","v":{v}}}"#);
        let first = run(&p, &mut s, rec("3").as_bytes());
        assert_eq!(
            first.decision,
            Decision::Emit {
                idempotency_key: "C1:3".into(),
                output_key: "customer:C1".into(),
                payload: None,
                pending: vec![]
            }
        );
        assert!(matches!(
            run(&p, &mut s, rec("\"2\"").as_bytes()).decision,
            Decision::Stale {
                version: 2,
                current: 3,
                ..
            }
        ));
        assert!(matches!(
            run(&p, &mut s, rec("3").as_bytes()).decision,
            Decision::Stale { version: 3, .. }
        ));
        assert!(matches!(
            run(&p, &mut s, rec("\"4\"").as_bytes()).decision,
            Decision::Emit { .. }
        ));
        assert_eq!(
            reason(&run(&p, &mut s, rec("4.5").as_bytes())),
            Some(Reason::InvalidVersion)
        );
        assert_eq!(
            reason(&run(&p, &mut s, rec("\"v5\"").as_bytes())),
            Some(Reason::InvalidVersion)
        );
    }

    #[test]
    fn merge_without_into_keeps_every_increment_and_reserved_names_are_refused() {
        let yaml = ROUTES.replace("        into: lines\n", "");
        let (p, mut s, _tmp) = setup_with(&yaml);
        let rec = |line: &str| format!(r#"{{"event_type":"cart.add","id":"K1","v":1,"line":"{line}"}}"#);
        run(&p, &mut s, rec("L1").as_bytes());
        let Decision::Emit {
            payload: Some(state), ..
        } = run(&p, &mut s, rec("L2").as_bytes()).decision
        else {
            panic!("the second increment emits the merged state");
        };
        let v: Value = serde_json::from_slice(&state).expect("json");
        assert_eq!(v["increments"], 2);
        assert_eq!(v["items"][0]["line"], "L1");
        assert_eq!(v["items"][1]["line"], "L2");
        for reserved in ["increments", "entity"] {
            let yaml = ROUTES.replace("into: lines", &format!("into: {reserved}"));
            let e = config::load_str("t.yaml", &yaml, |_| None).expect_err("a reserved `into` is refused");
            assert!(e.to_string().contains(&format!("`into: {reserved}`")), "{e}");
        }
    }

    #[test]
    fn merge_emits_the_state_applies_each_increment_once_and_bounds_it() {
        let (p, mut s, _tmp) = setup_with(ROUTES);
        let rec = |line: &str, pad: usize| {
            format!(
                r#"{{"event_type":"cart.add","id":"K1","v":1,"line":"{line}","pad":"{}"}}"#,
                "x".repeat(pad)
            )
        };
        let Decision::Emit {
            payload: Some(state),
            output_key,
            ..
        } = run(&p, &mut s, rec("L1", 1).as_bytes()).decision
        else {
            panic!("first increment emits the merged state");
        };
        assert_eq!(output_key, "K1");
        let v: Value = serde_json::from_slice(&state).expect("json");
        assert_eq!(v["lines"][0]["line"], "L1");
        assert!(matches!(
            run(&p, &mut s, rec("L1", 1).as_bytes()).decision,
            Decision::Duplicate { .. }
        ));
        assert_eq!(
            reason(&run(&p, &mut s, rec("L2", 400).as_bytes())),
            Some(Reason::StateTooLarge)
        );
        assert!(matches!(
            run(&p, &mut s, rec("L3", 1).as_bytes()).decision,
            Decision::Emit { .. }
        ));
    }
}
