//! One record through one pipeline: size check, decode, key, route, strategy.

use super::correlation;
use super::dedup::{self, Admission, DedupError};
use super::rejection::{Reason, Rejection};
use crate::store::TaskStore;
use crate::topology::template::RenderError;
use crate::topology::{KeyTemplate, Pipeline, Strategy};
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
    /// First occurrence: write it to the output with this message key.
    Emit {
        /// The business idempotency key.
        idempotency_key: String,
        /// The output message key.
        output_key: String,
    },
    /// Seen before: drop it.
    Duplicate {
        /// The business idempotency key.
        idempotency_key: String,
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

/// Runs records of one pipeline against a task's stores.
pub struct PipelineProcessor {
    pipeline: Arc<Pipeline>,
    max_record_bytes: usize,
    dedup_index: usize,
}

impl PipelineProcessor {
    /// A processor whose dedup store is store `dedup_index` of the task.
    pub fn new(pipeline: Arc<Pipeline>, max_record_bytes: usize, dedup_index: usize) -> Self {
        Self {
            pipeline,
            max_record_bytes,
            dedup_index,
        }
    }

    /// The pipeline this processor runs.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Decides one record, writing dedup state into the task's open transaction.
    pub fn process(
        &self,
        input: &Input<'_>,
        store: &mut TaskStore,
    ) -> Result<Processed, DedupError> {
        let doc = match self.decode(input.payload) {
            Ok(doc) => doc,
            Err(rejection) => return Ok(self.rejected(input, None, rejection)),
        };
        let key = match self.pipeline.key.render(&doc) {
            Ok(k) => k,
            Err(e) => return Ok(self.rejected(input, Some(&doc), key_rejection(e, "key"))),
        };
        let correlation_id = correlation::resolve(
            &self.pipeline.correlation,
            input.correlation_header,
            Some(&doc),
            &key,
        );
        let event_type = doc.get("event_type").and_then(Value::as_str);
        let Some(route) = self.pipeline.route_for(event_type) else {
            let detail = match event_type {
                Some(t) => format!("no route matches event_type `{t}`"),
                None => {
                    "the record has no string `event_type` and every route needs one".to_string()
                }
            };
            return Ok(Processed {
                decision: Decision::Reject(Rejection::new(Reason::NoRoute, detail)),
                correlation_id,
            });
        };
        let output_key = match &self.pipeline.output.key {
            None => key.clone(),
            Some(t) => match t.render(&doc) {
                Ok(k) => k,
                Err(e) => {
                    return Ok(Processed {
                        decision: Decision::Reject(key_rejection(e, "output key")),
                        correlation_id,
                    })
                }
            },
        };
        let decision = match &route.strategy {
            Strategy::Ignore { retention } => {
                match dedup::admit(store, self.dedup_index, &key, input.now_ms, *retention)? {
                    Admission::First => Decision::Emit {
                        idempotency_key: key,
                        output_key,
                    },
                    Admission::Duplicate => Decision::Duplicate {
                        idempotency_key: key,
                    },
                }
            }
        };
        Ok(Processed {
            decision,
            correlation_id,
        })
    }

    /// For a repartition stage: the record's new message key, or its rejection.
    pub fn rekey(&self, template: &KeyTemplate, input: &Input<'_>) -> Result<String, Processed> {
        let doc = self
            .decode(input.payload)
            .map_err(|r| self.rejected(input, None, r))?;
        template
            .render(&doc)
            .map_err(|e| self.rejected(input, Some(&doc), key_rejection(e, "repartition key")))
    }

    fn decode(&self, payload: Option<&[u8]>) -> Result<Map<String, Value>, Rejection> {
        let Some(bytes) = payload else {
            return Err(Rejection::new(
                Reason::InvalidJson,
                "the record has no value",
            ));
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
            Err(e) => Err(Rejection::new(
                Reason::InvalidJson,
                format!("not valid JSON: {e}"),
            )),
        }
    }

    fn rejected(
        &self,
        input: &Input<'_>,
        doc: Option<&Map<String, Value>>,
        rejection: Rejection,
    ) -> Processed {
        let (topic, partition, offset) = input.coordinates;
        let seed = format!("{topic}/{partition}/{offset}");
        Processed {
            correlation_id: correlation::resolve(
                &self.pipeline.correlation,
                input.correlation_header,
                doc,
                &seed,
            ),
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

    fn setup() -> (PipelineProcessor, TaskStore, tempfile::TempDir) {
        let t = config::load_str("t.yaml", YAML, |_| None).expect("valid topology");
        let p = Arc::new(t.pipelines[0].clone());
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = TaskStore::open(tmp.path(), &["d".into()], &StoreEnv::default()).expect("opens");
        (
            PipelineProcessor::new(p, t.processing.max_record_bytes, 0),
            s,
            tmp,
        )
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
                output_key: "P1".into()
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
        assert_eq!(
            reason(&run(&p, &mut s, big.as_bytes())),
            Some(Reason::Oversize)
        );
        assert_eq!(
            reason(&run(&p, &mut s, b"{not json")),
            Some(Reason::InvalidJson)
        );
        assert_eq!(
            reason(&run(&p, &mut s, b"[1,2]")),
            Some(Reason::NotAnObject)
        );
        assert_eq!(
            reason(&run(
                &p,
                &mut s,
                br#"{"event_type":"payment.x","payment_id":"P"}"#
            )),
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
        assert!(
            s.take_changes().is_empty(),
            "rejected records leave no dedup state"
        );
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
            p.rekey(&t, &input(br#"{"payment_id":"P9"}"#)),
            Ok("P9".to_string())
        );
        let rejected = p
            .rekey(&t, &input(br#"{"status":"PAID"}"#))
            .expect_err("no payment_id");
        assert!(matches!(
            rejected.decision,
            Decision::Reject(Rejection {
                reason: Reason::MissingKeyField,
                ..
            })
        ));
    }
}
