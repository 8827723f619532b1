//! Key surgery: forget one dedup key, or reset or forget one entity's version or merged state,
//! written to the store's changelog in one Kafka transaction. Every instance and standby
//! restores its stores from the changelog, so each takes the change when it next reads it: a
//! restarted instance replays the changelog's tail past its store's recorded offset, a standby
//! applies what it tails. Refused while the application's group has live members, whose stores
//! would not see it until their next restore and could write the key back before then.

use super::reset;
use super::state::{self, Entry};
use crate::engine::clients;
use crate::processors::version_gate::VersionEntry;
use crate::reconcile::topic;
use crate::store::codec;
use crate::topology::{StoreKind, Topology};
use anyhow::{bail, Context, Result};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use std::fmt::Write as _;
use std::time::Duration;

const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);

mod mapping;

/// One change an operator asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Surgery {
    /// Forget an idempotency key: its next event passes as new.
    ForgetKey(String),
    /// Forget an entity's version (`overwrite`) or merged state (`merge`).
    ForgetEntity(String),
    /// Set an entity's version (`overwrite`): the next version above it passes.
    SetVersion(String, i64),
    /// Correct a wrong first write-back (`record_mapping`): `system`'s id `wrong` becomes
    /// `right` for the entity it names.
    CorrectMapping {
        /// The target system.
        system: String,
        /// The external id recorded first, wrongly.
        wrong: String,
        /// The external id it should be.
        right: String,
    },
}

/// One record to write.
#[derive(Debug, Clone)]
struct Write {
    topic: String,
    /// The partition holding the key (a changelog's task partition); `None`: the producer's
    /// partitioner, as tally's own writes to that topic use.
    partition: Option<i32>,
    key: Vec<u8>,
    /// The key as an operator reads it.
    text: String,
    /// The value now and the value written, in words.
    change: (String, String),
    /// `None`: a tombstone.
    value: Option<Vec<u8>>,
}

/// What will be written: each key found, its current value and the new one.
#[derive(Debug, Clone)]
pub struct Plan {
    writes: Vec<Write>,
}

impl Plan {
    /// One line per write: topic and partition, key, current value, new value.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for w in &self.writes {
            let partition = w.partition.map_or_else(|| "by key".to_string(), |p| p.to_string());
            let _ = writeln!(
                out,
                "{}[{partition}] key {}: {} -> {}",
                w.topic, w.text, w.change.0, w.change.1
            );
        }
        out
    }
}

impl Write {
    /// A change of a store key found in its changelog.
    fn of_entry(e: Entry, value: Option<Vec<u8>>) -> Self {
        let change = (
            state::describe(e.kind, e.value.as_deref()),
            state::describe(e.kind, value.as_deref()),
        );
        Self {
            topic: e.topic,
            partition: Some(e.partition),
            key: e.stored,
            text: e.text,
            change,
            value,
        }
    }
}

/// Finds the keys `surgery` names in `pipeline`'s stores and what to write to each; refuses
/// while the group has live members and when nothing matches (a typo shows).
pub fn plan(t: &Topology, pipeline: &str, surgery: &Surgery) -> Result<Plan> {
    let Some(p) = t.pipelines.iter().find(|p| p.name == pipeline) else {
        let names: Vec<&str> = t.pipelines.iter().map(|p| p.name.as_str()).collect();
        bail!(
            "the topology has no pipeline `{pipeline}`; it has: {}",
            names.join(", ")
        );
    };
    reset::refuse_live_members(t)?;
    let properties: Vec<(String, String)> = t.kafka.properties.clone().into_iter().collect();
    let reader = topic::client_config(&t.kafka.bootstrap_servers, &properties)?;
    let (kinds, keys, entities): (Vec<StoreKind>, Vec<String>, Vec<String>) = match surgery {
        Surgery::ForgetKey(k) => (vec![StoreKind::Dedup], vec![k.clone()], vec![]),
        Surgery::ForgetEntity(e) => (vec![StoreKind::Versions, StoreKind::Merged], vec![], vec![e.clone()]),
        Surgery::SetVersion(e, _) => (vec![StoreKind::Versions], vec![], vec![e.clone()]),
        Surgery::CorrectMapping { system, wrong, right } => {
            let writes = mapping::correct(t, &reader, p, system, wrong, right)?;
            return Ok(Plan { writes });
        }
    };
    let mut writes = Vec::new();
    for kind in kinds.into_iter().filter(|k| p.store_kinds().contains(k)) {
        for e in state::entries(t, &reader, p, kind, &keys, &entities)? {
            if e.value.is_none() && !matches!(surgery, Surgery::SetVersion(..)) {
                continue; // already forgotten
            }
            let new = match surgery {
                Surgery::SetVersion(_, v) => {
                    Some(codec::encode(&VersionEntry { version: *v }).context("encoding the version")?)
                }
                _ => None,
            };
            writes.push(Write::of_entry(e, new));
        }
    }
    if writes.is_empty() {
        bail!(
            "no such key in the stores of pipeline `{pipeline}` (or it is already forgotten); `tally inspect` shows \
             the keys an event has"
        );
    }
    Ok(Plan { writes })
}

/// Writes the plan to the changelogs in one transaction.
pub fn execute(t: &Topology, plan: &Plan) -> Result<()> {
    let producer: ThreadedProducer<rdkafka::producer::DefaultProducerContext> = clients::base(t)
        .set("transactional.id", format!("{}-surgery", t.application_id))
        .set("enable.idempotence", "true")
        .set("allow.auto.create.topics", "false")
        .create()
        .context("cannot create the producer")?;
    producer
        .init_transactions(KAFKA_TIMEOUT)
        .context("cannot start a transaction (is another `tally reset` writing?)")?;
    producer.begin_transaction().context("beginning the transaction")?;
    for w in &plan.writes {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&w.topic).key(&w.key[..]);
        if let Some(p) = w.partition {
            record = record.partition(p);
        }
        if let Some(v) = &w.value {
            record = record.payload(&v[..]);
        }
        producer
            .send(record)
            .map_err(|(err, _)| err)
            .with_context(|| format!("writing key {} to `{}`", w.text, w.topic))?;
    }
    producer
        .commit_transaction(KAFKA_TIMEOUT)
        .context("committing the changes (nothing was changed unless this succeeds)")
}
