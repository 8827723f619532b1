//! The `merge` strategy: increments (a note, a cart line) are appended to the entity's state,
//! each increment id once, within a size bound.

use super::state::{self, StateError};
use crate::store::TaskStore;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What the merged store keeps per entity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergedEntry {
    /// Ids of the increments applied, sorted (the inner dedup).
    pub applied: Vec<String>,
    /// The merged state, a JSON object as text.
    pub state: String,
}

/// The outcome of offering an increment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Merge {
    /// Applied; the new merged state (JSON bytes).
    Applied(Vec<u8>),
    /// This increment id was applied before.
    AlreadyApplied,
    /// Applying it would make the state `bytes` long, over the bound; nothing changed.
    TooLarge {
        /// Size the state would have had.
        bytes: usize,
    },
}

/// Where and how to merge.
#[derive(Debug, Clone, Copy)]
pub struct MergeSpec<'a> {
    /// Array field collecting the increments.
    pub into: &'a str,
    /// Largest merged entry (state and applied ids).
    pub max_state_bytes: usize,
}

/// Applies `increment` (identified by `increment_id`) to `entity`'s merged state.
pub fn apply(
    store: &mut TaskStore,
    index: usize,
    entity: &str,
    increment_id: &str,
    increment: &Map<String, Value>,
    spec: MergeSpec<'_>,
) -> Result<Merge, StateError> {
    let mut entry = state::read::<MergedEntry>(store, index, entity)?.unwrap_or_else(|| MergedEntry {
        applied: Vec::new(),
        state: String::new(),
    });
    let slot = match entry.applied.binary_search_by(|id| id.as_str().cmp(increment_id)) {
        Ok(_) => return Ok(Merge::AlreadyApplied),
        Err(slot) => slot,
    };
    let mut doc: Map<String, Value> = serde_json::from_str(&entry.state).unwrap_or_default();
    doc.insert("entity".into(), Value::String(entity.to_string()));
    let items = doc.entry(spec.into).or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = items {
        list.push(Value::Object(increment.clone()));
    }
    let count = doc.get(spec.into).and_then(Value::as_array).map_or(0, Vec::len);
    doc.insert("increments".into(), Value::from(count));
    let text = Value::Object(doc).to_string();
    let size = text.len() + entry.applied.iter().map(String::len).sum::<usize>() + increment_id.len();
    if size > spec.max_state_bytes {
        return Ok(Merge::TooLarge { bytes: size });
    }
    entry.applied.insert(slot, increment_id.to_string());
    entry.state = text;
    state::write(store, index, entity, &entry)?;
    Ok(Merge::Applied(entry.state.into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreEnv;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn each_increment_applies_once_and_state_accumulates() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["m".to_string()], &StoreEnv::default()).expect("opens");
        let spec = MergeSpec {
            into: "lines",
            max_state_bytes: 10_000,
        };
        let a = obj(json!({"line_id": "L1", "sku": "A"}));
        let b = obj(json!({"line_id": "L2", "sku": "B"}));
        assert!(matches!(
            apply(&mut s, 0, "cart-1", "L1", &a, spec).expect("ok"),
            Merge::Applied(_)
        ));
        assert_eq!(
            apply(&mut s, 0, "cart-1", "L1", &a, spec).expect("ok"),
            Merge::AlreadyApplied
        );
        let Merge::Applied(state) = apply(&mut s, 0, "cart-1", "L2", &b, spec).expect("ok") else {
            panic!("second line applies");
        };
        let v: Value = serde_json::from_slice(&state).expect("json state");
        assert_eq!(v["entity"], "cart-1");
        assert_eq!(v["increments"], 2);
        assert_eq!(v["lines"][1]["sku"], "B");
    }

    #[test]
    fn a_state_over_the_bound_is_refused_and_left_unchanged() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["m".to_string()], &StoreEnv::default()).expect("opens");
        let spec = MergeSpec {
            into: "notes",
            max_state_bytes: 120,
        };
        let small = obj(json!({"text": "hi"}));
        let big = obj(json!({"text": "x".repeat(200)}));
        assert!(matches!(
            apply(&mut s, 0, "e", "n1", &small, spec).expect("ok"),
            Merge::Applied(_)
        ));
        assert!(matches!(
            apply(&mut s, 0, "e", "n2", &big, spec).expect("ok"),
            Merge::TooLarge { .. }
        ));
        assert!(matches!(
            apply(&mut s, 0, "e", "n3", &small, spec).expect("ok"),
            Merge::Applied(_)
        ));
        // A refused increment was not recorded, so a smaller retry of it applies once.
        assert!(matches!(
            apply(&mut s, 0, "e", "n2", &small, spec).expect("ok"),
            Merge::Applied(_)
        ));
        assert_eq!(
            apply(&mut s, 0, "e", "n2", &small, spec).expect("ok"),
            Merge::AlreadyApplied
        );
    }
}
