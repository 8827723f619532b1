//! The `merge` strategy: increments (a note, a cart line) are appended to the entity's state,
//! each increment id once, within a size bound.

use super::state::{self, StateError, StoreKey};
use crate::store::TaskStore;
use crate::topology::rendered_key::STORED_KEY_START;
use crate::topology::RenderedKey;
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
    /// The entity's stored state is not a JSON object (why); nothing changed, and the
    /// increment must not be merged into an empty state in its place.
    Unreadable(String),
    /// The increment nests `depth` levels deep, past [`MAX_INCREMENT_DEPTH`]; nothing changed.
    TooDeep {
        /// Its nesting depth (an object or array holding only scalars is 1).
        depth: usize,
    },
}

/// The deepest increment merged. In the state it sits two levels deeper (in the `into` array of
/// the state object), and the state must stay within the nesting serde_json reads back (128):
/// an increment accepted near that limit would leave a state no later increment could be
/// merged into.
pub const MAX_INCREMENT_DEPTH: usize = 100;

/// How deeply `v` nests objects and arrays (0 for a scalar).
fn depth(v: &Value) -> usize {
    match v {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Where and how to merge.
#[derive(Debug, Clone, Copy)]
pub struct MergeSpec<'a> {
    /// Array field collecting the increments.
    pub into: &'a str,
    /// Largest merged entry (state and applied ids).
    pub max_state_bytes: usize,
}

/// Applies `increment` (identified by `increment_id`) to the merged state of `entity` (stored
/// under `at`).
pub fn apply(
    store: &mut TaskStore,
    index: usize,
    at: StoreKey<'_>,
    entity: &str,
    increment_id: &RenderedKey,
    increment: &Map<String, Value>,
    spec: MergeSpec<'_>,
) -> Result<Merge, StateError> {
    let mut entry = state::read_key::<MergedEntry>(store, index, at)?.unwrap_or_else(|| MergedEntry {
        applied: Vec::new(),
        state: String::new(),
    });
    if already_applied(&entry.applied, increment_id) {
        return Ok(Merge::AlreadyApplied);
    }
    let nesting = 1 + increment.values().map(depth).max().unwrap_or(0);
    if nesting > MAX_INCREMENT_DEPTH {
        return Ok(Merge::TooDeep { depth: nesting });
    }
    let id = increment_id.stored.as_str();
    let slot = entry.applied.partition_point(|applied| applied.as_str() < id);
    let mut doc: Map<String, Value> = if entry.state.is_empty() {
        Map::new()
    } else {
        match serde_json::from_str(&entry.state) {
            Ok(doc) => doc,
            Err(e) => return Ok(Merge::Unreadable(e.to_string())),
        }
    };
    doc.insert("entity".into(), Value::String(entity.to_string()));
    let items = doc.entry(spec.into).or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = items {
        list.push(Value::Object(increment.clone()));
    }
    let count = doc.get(spec.into).and_then(Value::as_array).map_or(0, Vec::len);
    doc.insert("increments".into(), Value::from(count));
    let text = Value::Object(doc).to_string();
    let size = text.len() + entry.applied.iter().map(String::len).sum::<usize>() + id.len();
    if size > spec.max_state_bytes {
        return Ok(Merge::TooLarge { bytes: size });
    }
    entry.applied.insert(slot, id.to_string());
    entry.state = text;
    state::write(store, index, at.stored, &entry)?;
    Ok(Merge::Applied(entry.state.into_bytes()))
}

/// True when the increment is in the sorted `applied` ids: by its stored key, or by its text
/// while the entry still holds text ids of an earlier version (they sort after stored ones).
fn already_applied(applied: &[String], id: &RenderedKey) -> bool {
    let has = |wanted: &str| applied.binary_search_by(|a| a.as_str().cmp(wanted)).is_ok();
    let text_ids = applied.last().is_some_and(|last| !last.starts_with(STORED_KEY_START));
    has(&id.stored) || (text_ids && has(&id.text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreEnv;
    use serde_json::json;

    fn at(stored: &str) -> StoreKey<'_> {
        StoreKey { stored, legacy: None }
    }

    fn id(text: &str) -> RenderedKey {
        RenderedKey {
            text: text.to_string(),
            stored: format!("{STORED_KEY_START}f{text}{STORED_KEY_START}"),
            may_read_alike: false,
        }
    }

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
            apply(&mut s, 0, at("cart-1"), "cart-1", &id("L1"), &a, spec).expect("ok"),
            Merge::Applied(_)
        ));
        assert_eq!(
            apply(&mut s, 0, at("cart-1"), "cart-1", &id("L1"), &a, spec).expect("ok"),
            Merge::AlreadyApplied
        );
        let Merge::Applied(state) = apply(&mut s, 0, at("cart-1"), "cart-1", &id("L2"), &b, spec).expect("ok") else {
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
            apply(&mut s, 0, at("e"), "e", &id("n1"), &small, spec).expect("ok"),
            Merge::Applied(_)
        ));
        assert!(matches!(
            apply(&mut s, 0, at("e"), "e", &id("n2"), &big, spec).expect("ok"),
            Merge::TooLarge { .. }
        ));
        assert!(matches!(
            apply(&mut s, 0, at("e"), "e", &id("n3"), &small, spec).expect("ok"),
            Merge::Applied(_)
        ));
        // A refused increment was not recorded, so a smaller retry of it applies once.
        assert!(matches!(
            apply(&mut s, 0, at("e"), "e", &id("n2"), &small, spec).expect("ok"),
            Merge::Applied(_)
        ));
        assert_eq!(
            apply(&mut s, 0, at("e"), "e", &id("n2"), &small, spec).expect("ok"),
            Merge::AlreadyApplied
        );
    }

    #[test]
    fn an_increment_too_deep_for_the_state_is_refused_and_the_entity_stays_mergeable() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["m".to_string()], &StoreEnv::default()).expect("opens");
        let spec = MergeSpec {
            into: "lines",
            max_state_bytes: 100_000,
        };
        // An increment object nesting `levels` deep: {"n": {"n": ... {"n": 1}}}.
        let nested = |levels: usize| {
            let mut v = json!(1);
            for _ in 1..levels {
                v = json!({ "n": v });
            }
            obj(json!({ "n": v }))
        };
        assert_eq!(
            apply(
                &mut s,
                0,
                at("e"),
                "e",
                &id("deep"),
                &nested(MAX_INCREMENT_DEPTH + 1),
                spec
            )
            .expect("ok"),
            Merge::TooDeep {
                depth: MAX_INCREMENT_DEPTH + 1
            }
        );
        assert!(matches!(
            apply(&mut s, 0, at("e"), "e", &id("max"), &nested(MAX_INCREMENT_DEPTH), spec).expect("ok"),
            Merge::Applied(_)
        ));
        // The state holding the deepest increment allowed reads back: the next one merges.
        assert!(matches!(
            apply(&mut s, 0, at("e"), "e", &id("next"), &obj(json!({"x": 1})), spec).expect("ok"),
            Merge::Applied(_)
        ));
    }

    #[test]
    fn an_unreadable_state_refuses_the_increment_instead_of_starting_over() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["m".to_string()], &StoreEnv::default()).expect("opens");
        let broken = MergedEntry {
            applied: vec![id("L1").stored],
            state: "not json".to_string(),
        };
        state::write(&mut s, 0, "cart-9", &broken).expect("writes");
        let spec = MergeSpec {
            into: "lines",
            max_state_bytes: 4096,
        };
        let line = obj(json!({"line_id": "L2"}));
        assert!(matches!(
            apply(&mut s, 0, at("cart-9"), "cart-9", &id("L2"), &line, spec).expect("ok"),
            Merge::Unreadable(_)
        ));
        let kept: MergedEntry = state::read(&s, 0, "cart-9").expect("reads").expect("still there");
        assert_eq!(kept, broken, "the stored state is left for an operator to look at");
    }

    #[test]
    fn increments_recorded_by_text_id_in_an_earlier_version_are_still_recognised() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["m".to_string()], &StoreEnv::default()).expect("opens");
        let old = MergedEntry {
            applied: vec!["L1".to_string()],
            state: r#"{"lines":[{"line_id":"L1"}],"increments":1}"#.to_string(),
        };
        state::write(&mut s, 0, "cart-1", &old).expect("writes");
        let legacy = StoreKey {
            stored: "\0lcart-1\0",
            legacy: Some("cart-1"),
        };
        let spec = MergeSpec {
            into: "lines",
            max_state_bytes: 4096,
        };
        let line = obj(json!({"line_id": "L1"}));
        assert_eq!(
            apply(&mut s, 0, legacy, "cart-1", &id("L1"), &line, spec).expect("ok"),
            Merge::AlreadyApplied
        );
        let moved: Option<MergedEntry> = state::read(&s, 0, "\0lcart-1\0").expect("reads");
        assert_eq!(moved, Some(old), "the entry moved to its stored key on first use");
        assert_eq!(state::read::<MergedEntry>(&s, 0, "cart-1").expect("reads"), None);
        let Merge::Applied(state) = apply(&mut s, 0, legacy, "cart-1", &id("L2"), &line, spec).expect("ok") else {
            panic!("a new increment applies");
        };
        let state: Value = serde_json::from_slice(&state).expect("json");
        assert_eq!(state["increments"], 2);
    }
}
