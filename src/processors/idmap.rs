//! Cross-system identity: the `map_ids` step that enriches events with the target system's id
//! (or marks them pending-create), and the `record_mapping` strategy that records write-backs,
//! first write wins.

use super::rejection::{Reason, Rejection};
use super::state::{self, StateError};
use crate::store::global::{EXTERNAL_PREFIX, INTERNAL_PREFIX, PENDING_PREFIX};
use crate::store::{GlobalMappings, StoreError, TaskStore};
use crate::topology::template::canonical_number;
use crate::topology::MapIds;
use serde_json::{Map, Value};
use uuid::Uuid;

/// Namespace of derived internal ids, so every instance and replay derives the same id.
const NAMESPACE: Uuid = Uuid::from_u128(0x3b0e_9a51_4c1d_4f7e_8e2a_51d0_7a1c_1d00);

/// The characters a system name may not hold: the separators of the mapping keys
/// (`ext/<system>/<id>`) and of the seed of derived internal ids (`<system>:<id>`). Ids may
/// hold anything: with these out of the system name, every key reads back one way.
pub const SYSTEM_SEPARATORS: [char; 2] = ['/', ':'];

/// Key of an external id's record: `ext/<system>/<id>` → internal id.
pub fn external_key(system: &str, id: &str) -> String {
    format!("{EXTERNAL_PREFIX}{system}/{id}")
}

/// Key of an internal id's link to a system: `int/<internal>/<system>` → external id.
pub fn internal_key(internal: &str, system: &str) -> String {
    format!("{INTERNAL_PREFIX}{internal}/{system}")
}

/// Key of a pending-create marker: `pending/<system>/<internal>`.
pub fn pending_key(system: &str, internal: &str) -> String {
    format!("{PENDING_PREFIX}{system}/{internal}")
}

/// The internal id of an external id: the recorded one, else derived (UUIDv5 of
/// `<system>:<id>`), so the first external id an entity is seen under names it forever.
pub fn internal_id(global: &GlobalMappings, system: &str, id: &str) -> Result<String, StoreError> {
    Ok(global
        .get(&external_key(system, id))?
        .unwrap_or_else(|| Uuid::new_v5(&NAMESPACE, format!("{system}:{id}").as_bytes()).to_string()))
}

/// A marker that an event went out without the target system's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingCreate {
    /// The target system.
    pub system: String,
    /// The entity's internal id.
    pub internal_id: String,
}

impl PendingCreate {
    /// The marker record on the mappings topic (key, JSON value) that lets every instance count
    /// what still waits for a write-back: who is waiting, since when.
    pub fn marker(&self, correlation_id: &str, idempotency_key: &str, since_ms: i64) -> (String, String) {
        let value = serde_json::json!({
            "correlation_id": correlation_id, "idempotency_key": idempotency_key, "since_ms": since_ms,
        });
        (pending_key(&self.system, &self.internal_id), value.to_string())
    }
}

/// Looks up every `map_ids` entry and writes the target ids into `doc`; unknown ones become
/// `null` and are returned as pending-create. A missing or non-scalar id field rejects; a store
/// that cannot be read is an error of the engine, not of the record.
pub fn enrich(
    global: &GlobalMappings,
    specs: &[MapIds],
    doc: &mut Map<String, Value>,
) -> Result<Result<Vec<PendingCreate>, Rejection>, StoreError> {
    let mut pending = Vec::new();
    for spec in specs {
        let id = match doc.get(&spec.field) {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::Number(n)) => canonical_number(n),
            None | Some(Value::Null) | Some(Value::String(_)) => {
                let detail = format!("map_ids: field `{}` is missing or empty", spec.field);
                return Ok(Err(Rejection::new(Reason::MissingKeyField, detail)));
            }
            Some(_) => {
                let detail = format!("map_ids: field `{}` is not a string or number", spec.field);
                return Ok(Err(Rejection::new(Reason::NonScalarKeyField, detail)));
            }
        };
        let internal = internal_id(global, &spec.from_system, &id)?;
        match global.get(&internal_key(&internal, &spec.to_system))? {
            Some(target) => {
                doc.insert(spec.into.clone(), Value::String(target));
            }
            None => {
                doc.insert(spec.into.clone(), Value::Null);
                pending.push(PendingCreate {
                    system: spec.to_system.clone(),
                    internal_id: internal,
                });
            }
        }
    }
    Ok(Ok(pending))
}

/// A record of the mappings topic: key and value (`None` deletes).
pub type MappingRecord = (String, Option<String>);

/// A "created" confirmation from a target system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteBack {
    /// The system that created the entity.
    pub system: String,
    /// The id it gave it.
    pub external_id: String,
    /// The system the entity came from.
    pub source_system: String,
    /// Its id there.
    pub source_id: String,
}

/// Reads a write-back record's four fields.
pub fn parse_write_back(doc: &Map<String, Value>) -> Result<WriteBack, Rejection> {
    let field = |name: &str| match doc.get(name) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(canonical_number(n)),
        _ => Err(Rejection::new(
            Reason::MissingKeyField,
            format!("write-back: field `{name}` is missing or not a non-empty string"),
        )),
    };
    let system = |name: &str| {
        let value = field(name)?;
        if value.contains(SYSTEM_SEPARATORS) {
            return Err(Rejection::new(
                Reason::InvalidKeyField,
                format!("write-back: field `{name}` names a system with `/` or `:` in it, which mapping keys use as separators"),
            ));
        }
        Ok(value)
    };
    Ok(WriteBack {
        system: system("system")?,
        external_id: field("external_id")?,
        source_system: system("source_system")?,
        source_id: field("source_id")?,
    })
}

/// Records a write-back when it is the first for its entity and system; returns the records
/// for the mappings topic, or `None` for a replay or a later, conflicting write-back.
pub fn record(
    store: &mut TaskStore,
    index: usize,
    global: &GlobalMappings,
    wb: &WriteBack,
) -> Result<Option<Vec<MappingRecord>>, StateError> {
    let internal = internal_id(global, &wb.source_system, &wb.source_id)?;
    let link = internal_key(&internal, &wb.system);
    if let Some(existing) = state::read::<String>(store, index, &link)? {
        if existing != wb.external_id {
            tracing::warn!(
                internal_id = %internal,
                system = %wb.system,
                kept = %existing,
                ignored = %wb.external_id,
                "conflicting write-back ignored: first write wins"
            );
        }
        return Ok(None);
    }
    state::write(store, index, &link, &wb.external_id)?;
    Ok(Some(vec![
        (external_key(&wb.source_system, &wb.source_id), Some(internal.clone())),
        (external_key(&wb.system, &wb.external_id), Some(internal.clone())),
        (link, Some(wb.external_id.clone())),
        (pending_key(&wb.system, &internal), None),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreEnv;
    use serde_json::json;

    fn spec() -> MapIds {
        MapIds {
            field: "customer_id".into(),
            from_system: "crm".into(),
            to_system: "erp".into(),
            into: "erp_customer_id".into(),
        }
    }

    #[test]
    fn unknown_ids_are_pending_then_enriched_after_the_write_back() {
        let g = GlobalMappings::in_memory().expect("opens");
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["links".to_string()], &StoreEnv::default()).expect("opens");
        let mut doc = json!({"customer_id": "CRM-1"}).as_object().cloned().unwrap_or_default();
        let pending = enrich(&g, &[spec()], &mut doc).expect("reads").expect("ok");
        assert_eq!(pending.len(), 1);
        assert_eq!(doc["erp_customer_id"], Value::Null);

        let wb = WriteBack {
            system: "erp".into(),
            external_id: "ERP-9".into(),
            source_system: "crm".into(),
            source_id: "CRM-1".into(),
        };
        let records = record(&mut s, 0, &g, &wb).expect("ok").expect("first write-back wins");
        let applied: Vec<_> = records
            .iter()
            .enumerate()
            .map(|(i, (key, value))| crate::store::global::MappingRecord {
                partition: 0,
                offset: i as i64,
                key,
                value: value.as_deref(),
            })
            .collect();
        g.apply(&applied).expect("applies");
        assert_eq!(
            record(&mut s, 0, &g, &wb).expect("ok"),
            None,
            "a replay changes nothing"
        );
        let conflicting = WriteBack {
            external_id: "ERP-10".into(),
            ..wb.clone()
        };
        assert_eq!(
            record(&mut s, 0, &g, &conflicting).expect("ok"),
            None,
            "first write wins"
        );

        let mut doc = json!({"customer_id": "CRM-1"}).as_object().cloned().unwrap_or_default();
        assert!(enrich(&g, &[spec()], &mut doc).expect("reads").expect("ok").is_empty());
        assert_eq!(doc["erp_customer_id"], "ERP-9");
        assert_eq!(
            internal_id(&g, "erp", "ERP-9").expect("reads"),
            pending[0].internal_id,
            "one internal id for both"
        );
    }

    #[test]
    fn numbers_keep_their_exact_text_through_enrichment() {
        let g = GlobalMappings::in_memory().expect("opens");
        let text = r#"{"customer_id":123456789012345678901234567890,"amount":0.1000000000000000000001}"#;
        let mut doc: Map<String, Value> = serde_json::from_str(text).expect("json");
        let pending = enrich(&g, &[spec()], &mut doc).expect("reads").expect("ok");
        assert_eq!(
            pending[0].internal_id,
            internal_id(&g, "crm", "123456789012345678901234567890").expect("reads")
        );
        let out = serde_json::to_string(&doc).expect("serializes");
        assert!(out.contains(r#""customer_id":123456789012345678901234567890"#), "{out}");
        assert!(out.contains(r#""amount":0.1000000000000000000001"#), "{out}");
    }

    #[test]
    fn internal_ids_are_deterministic() {
        let g = GlobalMappings::in_memory().expect("opens");
        let id = |external| internal_id(&g, "crm", external).expect("reads");
        assert_eq!(id("CRM-1"), id("CRM-1"));
        assert_ne!(id("CRM-1"), id("CRM-2"));
    }

    #[test]
    fn missing_id_fields_are_rejected() {
        let g = GlobalMappings::in_memory().expect("opens");
        let mut doc = json!({"other": 1}).as_object().cloned().unwrap_or_default();
        assert_eq!(
            enrich(&g, &[spec()], &mut doc).expect("reads").map_err(|r| r.reason),
            Err(Reason::MissingKeyField)
        );
        let bad = json!({"system": "erp"}).as_object().cloned().unwrap_or_default();
        assert!(parse_write_back(&bad).is_err());
    }

    #[test]
    fn write_backs_whose_system_holds_a_key_separator_are_rejected_ids_may_hold_anything() {
        let wb = |system: &str, source_system: &str| {
            let doc =
                json!({"system": system, "external_id": "E/1:2", "source_system": source_system, "source_id": "A/1"});
            parse_write_back(doc.as_object().expect("object")).map_err(|r| r.reason)
        };
        // `crm/A` + `1` would share `ext/crm/A/1` with `crm` + `A/1`, and `crm:A` + `1` the
        // derived internal id's seed `crm:A:1` with `crm` + `A:1`.
        for (system, source) in [("erp", "crm/A"), ("erp", "crm:A"), ("erp/x", "crm"), ("e:rp", "crm")] {
            assert_eq!(wb(system, source), Err(Reason::InvalidKeyField), "{system} {source}");
        }
        let ok = wb("erp", "crm").expect("separators in ids are fine");
        assert_eq!((ok.external_id.as_str(), ok.source_id.as_str()), ("E/1:2", "A/1"));
    }
}
