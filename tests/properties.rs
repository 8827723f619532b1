//! Property tests against small in-memory models: the task store's overlay/commit/abort
//! protocol, the `overwrite` version gate (through the pipeline, as the engine calls it) and the
//! `ignore` strategy's admit/expire. No broker needed. Case counts keep the file to seconds;
//! `PROPTEST_CASES=5000 cargo test --release --test properties` searches longer.

use proptest::prelude::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tally::processors::dedup::{self, Admission};
use tally::processors::state;
use tally::processors::version_gate::{parse_version, VersionEntry};
use tally::processors::{Decision, Input, PipelineProcessor};
use tally::store::{GlobalMappings, StoreEnv, TaskStore};
use tally::topology::{KeyTemplate, StoreKind};

const STORES: usize = 2;
/// Keys 0..KEYS; key 0 is the empty key, which RocksDB and the overlay must handle too.
const KEYS: u8 = 6;

fn key(k: u8) -> Vec<u8> {
    if k == 0 {
        Vec::new()
    } else {
        vec![b'k', k]
    }
}

/// `cases` unless `PROPTEST_CASES` asks for another number.
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(cases);
    ProptestConfig::with_cases(cases)
}

fn store_names() -> Vec<String> {
    (0..STORES).map(|i| format!("s{i}")).collect()
}

#[derive(Debug, Clone)]
enum StoreOp {
    Put {
        store: usize,
        key: u8,
        value: Vec<u8>,
    },
    Delete {
        store: usize,
        key: u8,
    },
    TakeChanges,
    Commit {
        offsets: Vec<(usize, i64)>,
    },
    Abort,
    /// Close the database (as a crash or restart does) and open it again.
    Reopen,
    /// Reopen, then restore one store from changelog records as the engine does at start.
    Restore {
        store: usize,
        wipe: bool,
        records: Vec<(u8, Option<Vec<u8>>)>,
        last_offset: i64,
    },
}

fn store_op() -> impl Strategy<Value = StoreOp> {
    let store = 0..STORES;
    let k = 0..KEYS;
    let value = prop::collection::vec(any::<u8>(), 0..4);
    prop_oneof![
        6 => (store.clone(), k.clone(), value.clone()).prop_map(|(store, key, value)| StoreOp::Put { store, key, value }),
        3 => (store.clone(), k.clone()).prop_map(|(store, key)| StoreOp::Delete { store, key }),
        2 => Just(StoreOp::TakeChanges),
        // Kafka offsets: a store refuses any other as corrupt.
        3 => prop::collection::vec((store.clone(), 0..i64::MAX), 0..3).prop_map(|offsets| StoreOp::Commit { offsets }),
        2 => Just(StoreOp::Abort),
        1 => Just(StoreOp::Reopen),
        1 => (
            store,
            any::<bool>(),
            prop::collection::vec((k, prop::option::of(value)), 0..5),
            0..i64::MAX
        )
            .prop_map(|(store, wipe, records, last_offset)| StoreOp::Restore {
                store,
                wipe,
                records,
                last_offset
            }),
    ]
}

/// What the store should hold: committed state, recorded offsets, the open transaction.
#[derive(Default)]
struct StoreModel {
    committed: [BTreeMap<Vec<u8>, Vec<u8>>; STORES],
    offsets: [Option<i64>; STORES],
    overlay: [BTreeMap<Vec<u8>, Option<Vec<u8>>>; STORES],
    /// What the changelog has not been sent yet: the last write of each key.
    changes: Changes,
}

/// Changelog records by (store, key): the value, `None` a tombstone.
type Changes = BTreeMap<(usize, Vec<u8>), Option<Vec<u8>>>;

/// The store's writes not yet sent to the changelog, owned; they count as sent after this.
fn take_changes(store: &mut TaskStore) -> Changes {
    store
        .unlogged()
        .map(|c| ((c.store, c.key.to_vec()), c.value.map(<[u8]>::to_vec)))
        .collect()
}

impl StoreModel {
    fn read(&self, store: usize, key: &[u8]) -> Option<Vec<u8>> {
        match self.overlay[store].get(key) {
            Some(pending) => pending.clone(),
            None => self.committed[store].get(key).cloned(),
        }
    }

    fn write(&mut self, store: usize, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.overlay[store].insert(key.clone(), value.clone());
        self.changes.insert((store, key), value);
    }

    fn drop_transaction(&mut self) {
        self.overlay.iter_mut().for_each(BTreeMap::clear);
        self.changes.clear();
    }

    fn commit(&mut self, offsets: &[(usize, i64)]) {
        for (store, overlay) in self.overlay.iter_mut().enumerate() {
            for (key, value) in std::mem::take(overlay) {
                match value {
                    Some(v) => self.committed[store].insert(key, v),
                    None => self.committed[store].remove(&key),
                };
            }
        }
        for &(store, offset) in offsets {
            self.offsets[store] = Some(offset);
        }
        self.changes.clear();
    }
}

fn open_store(dir: &std::path::Path, env: &StoreEnv) -> TaskStore {
    TaskStore::open(dir, &store_names(), env).expect("the store opens")
}

/// Compares every observable of the store with the model.
fn check_store(s: &TaskStore, m: &StoreModel) -> Result<(), TestCaseError> {
    for store in 0..STORES {
        let scanned: BTreeMap<Vec<u8>, Vec<u8>> = s
            .scan(store)
            .expect("scan")
            .map(|e| e.map(|(k, v)| (k.into_vec(), v.into_vec())))
            .collect::<Result<_, _>>()
            .expect("scan reads");
        prop_assert_eq!(&scanned, &m.committed[store], "committed state of store {}", store);
        prop_assert_eq!(s.changelog_offset(store).expect("offset reads"), m.offsets[store]);
        prop_assert_eq!(s.has_data(store).expect("reads"), !m.committed[store].is_empty());
        for k in 0..KEYS {
            let k = key(k);
            prop_assert_eq!(
                s.get(store, &k).expect("get"),
                m.read(store, &k),
                "read of {:?} in store {}",
                k,
                store
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(40))]

    /// Reads see the open transaction; a commit makes exactly it durable with the given
    /// offsets; an abort or a restart drops it; a restore writes records and offset together.
    #[test]
    fn store_follows_the_overlay_commit_abort_protocol(ops in prop::collection::vec(store_op(), 1..40)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = StoreEnv::new(1 << 20, 1 << 20, 1 << 20);
        let mut s = Some(open_store(dir.path(), &env));
        let mut m = StoreModel::default();
        for op in ops {
            let store = s.as_mut().expect("open");
            match op {
                StoreOp::Put { store: i, key: k, value } => {
                    store.put(i, &key(k), value.clone());
                    m.write(i, key(k), Some(value));
                }
                StoreOp::Delete { store: i, key: k } => {
                    store.delete(i, &key(k));
                    m.write(i, key(k), None);
                }
                StoreOp::TakeChanges => {
                    prop_assert_eq!(take_changes(store), std::mem::take(&mut m.changes));
                }
                StoreOp::Commit { offsets } if m.changes.is_empty() => {
                    store.commit(&offsets).expect("commits");
                    m.commit(&offsets);
                    prop_assert!(take_changes(store).is_empty(), "a commit leaves no queued changes");
                }
                StoreOp::Commit { offsets } => {
                    prop_assert!(
                        matches!(store.commit(&offsets), Err(tally::store::StoreError::Unlogged(..))),
                        "writes never taken for the changelog are refused, and nothing is written"
                    );
                }
                StoreOp::Abort => {
                    store.abort();
                    m.drop_transaction();
                    prop_assert!(take_changes(store).is_empty(), "an abort leaves no queued changes");
                }
                StoreOp::Reopen => {
                    drop(s.take());
                    s = Some(open_store(dir.path(), &env));
                    m.drop_transaction();
                }
                StoreOp::Restore { store: i, wipe, records, last_offset } => {
                    drop(s.take());
                    let mut reopened = open_store(dir.path(), &env);
                    m.drop_transaction();
                    if wipe {
                        reopened.wipe(i).expect("wipes");
                        m.committed[i].clear();
                        m.offsets[i] = None;
                    }
                    let records: Vec<_> = records.into_iter().map(|(k, v)| (key(k), v)).collect();
                    reopened.apply_restored(i, &records, last_offset).expect("applies");
                    for (k, v) in records {
                        match v {
                            Some(v) => m.committed[i].insert(k, v),
                            None => m.committed[i].remove(&k),
                        };
                    }
                    m.offsets[i] = Some(last_offset);
                    s = Some(reopened);
                }
            }
            check_store(s.as_ref().expect("open"), &m)?;
        }
    }
}

const ENTITY_TYPES: [&str; 2] = ["customer", "order"];
const ENTITY_IDS: [&str; 2] = ["1", "2"];

/// How a record writes its version.
#[derive(Debug, Clone)]
enum VersionText {
    Number(i64),
    /// An integer in a string, padded with spaces.
    Text(i64, usize),
    /// Not an integer: dead-lettered as `invalid_version`.
    Invalid(String),
}

#[derive(Debug, Clone)]
enum GateOp {
    Record {
        entity: (usize, usize),
        version: VersionText,
    },
    Commit,
    Abort,
    Reopen,
}

fn version_value() -> impl Strategy<Value = i64> {
    prop_oneof![8 => -3i64..12, 1 => Just(i64::MIN), 1 => Just(i64::MAX)]
}

fn gate_op() -> impl Strategy<Value = GateOp> {
    let version = prop_oneof![
        4 => version_value().prop_map(VersionText::Number),
        2 => (version_value(), 0usize..3).prop_map(|(v, pad)| VersionText::Text(v, pad)),
        1 => prop_oneof![Just("1.5"), Just("v3"), Just(""), Just("9223372036854775808")]
            .prop_map(|s| VersionText::Invalid(s.to_string())),
    ];
    prop_oneof![
        10 => ((0..ENTITY_TYPES.len(), 0..ENTITY_IDS.len()), version)
            .prop_map(|(entity, version)| GateOp::Record { entity, version }),
        2 => Just(GateOp::Commit),
        1 => Just(GateOp::Abort),
        1 => Just(GateOp::Reopen),
    ]
}

fn entity_sync() -> (PipelineProcessor, Vec<String>, usize) {
    let text = include_str!("../topologies/entity-sync.yaml");
    let topology = tally::config::load_str("entity-sync.yaml", text, |_| None).expect("valid example");
    let pipeline = topology.pipelines[0].clone();
    let names = pipeline.store_names();
    let index = pipeline
        .store_kinds()
        .iter()
        .position(|k| *k == StoreKind::Versions)
        .expect("an overwrite pipeline has a versions store");
    let processor = PipelineProcessor::new(
        Arc::new(pipeline),
        topology.processing.max_record_bytes,
        Arc::new(GlobalMappings::in_memory().expect("opens")),
    );
    (processor, names, index)
}

/// Per-entity results of the transactions that committed.
#[derive(Default, Clone)]
struct GateLog {
    emitted: BTreeMap<String, Vec<i64>>,
    stale: u64,
}

proptest! {
    #![proptest_config(config(48))]

    /// Through the pipeline, with transactions that commit, abort or die: per entity the
    /// committed outputs have strictly increasing versions (each above every earlier one),
    /// the stored version is the highest committed version seen, and the stale drops match
    /// the model's.
    #[test]
    fn version_gate_emits_strictly_increasing_versions(ops in prop::collection::vec(gate_op(), 1..50)) {
        let (processor, names, index) = entity_sync();
        let entity_template: KeyTemplate = "{entity_type}:{entity_id}".parse().expect("the example's entity template");
        let dir = tempfile::tempdir().expect("tempdir");
        let env = StoreEnv::new(1 << 20, 1 << 20, 1 << 20);
        let mut s = Some(TaskStore::open(dir.path(), &names, &env).expect("opens"));
        // The model: highest version per entity, committed and in the open transaction.
        let mut model_committed: BTreeMap<String, i64> = BTreeMap::new();
        let mut model_open = model_committed.clone();
        let mut model_stale = (0u64, 0u64);
        // What tally decided, committed and in the open transaction.
        let mut committed = GateLog::default();
        let mut open = GateLog::default();
        for (offset, op) in (0i64..).zip(ops) {
            let store = s.as_mut().expect("open");
            match op {
                GateOp::Record { entity: (t, i), version } => {
                    let (raw, parsed) = match &version {
                        VersionText::Number(v) => (json!(v), Some(*v)),
                        VersionText::Text(v, pad) => (json!(format!("{:pad$}{v}{:pad$}", "", "")), Some(*v)),
                        VersionText::Invalid(text) => (json!(text), None),
                    };
                    let payload = json!({
                        "event_type": "entity.updated",
                        "entity_type": ENTITY_TYPES[t],
                        "entity_id": ENTITY_IDS[i],
                        "version": raw,
                    })
                    .to_string();
                    let input = Input {
                        payload: Some(payload.as_bytes()),
                        correlation_header: None,
                        coordinates: ("entities", 0, offset),
                        now_ms: 1_700_000_000_000,
                    };
                    let decision = processor.process(&input, store).expect("no store error").decision;
                    let entity = format!("{}:{}", ENTITY_TYPES[t], ENTITY_IDS[i]);
                    let Some(v) = parsed else {
                        prop_assert!(matches!(decision, Decision::Reject(_)), "invalid version {:?}: {:?}", version, decision);
                        continue;
                    };
                    match model_open.get(&entity) {
                        Some(&current) if v <= current => {
                            model_stale.1 += 1;
                            prop_assert!(
                                matches!(decision, Decision::Stale { version, current: c, .. } if version == v && c == current),
                                "{} v{} after v{}: {:?}", entity, v, current, decision
                            );
                        }
                        _ => {
                            model_open.insert(entity.clone(), v);
                            let Decision::Emit { output_key, .. } = &decision else {
                                return Err(TestCaseError::fail(format!("{entity} v{v} should pass: {decision:?}")));
                            };
                            prop_assert_eq!(output_key, &entity, "outputs are keyed by entity");
                        }
                    }
                    match decision {
                        Decision::Emit { .. } => open.emitted.entry(entity).or_default().push(v),
                        Decision::Stale { .. } => open.stale += 1,
                        _ => {}
                    }
                }
                GateOp::Commit => {
                    take_changes(store);
                    store.commit(&[(index, offset)]).expect("commits");
                    model_committed = model_open.clone();
                    model_stale = (model_stale.0 + model_stale.1, 0);
                    for (entity, versions) in std::mem::take(&mut open.emitted) {
                        committed.emitted.entry(entity).or_default().extend(versions);
                    }
                    committed.stale += std::mem::take(&mut open.stale);
                }
                GateOp::Abort | GateOp::Reopen => {
                    if matches!(op, GateOp::Abort) {
                        store.abort();
                    } else {
                        drop(s.take());
                        s = Some(TaskStore::open(dir.path(), &names, &env).expect("reopens"));
                    }
                    model_open = model_committed.clone();
                    model_stale.1 = 0;
                    open = GateLog::default();
                }
            }
        }
        let store = s.as_mut().expect("open");
        store.abort();
        prop_assert_eq!(committed.stale, model_stale.0, "stale drops");
        for (entity, versions) in &committed.emitted {
            prop_assert!(
                versions.windows(2).all(|w| w[0] < w[1]),
                "{}: committed outputs {:?} are not strictly increasing", entity, versions
            );
        }
        for t in ENTITY_TYPES {
            for i in ENTITY_IDS {
                let entity = format!("{t}:{i}");
                let at = entity_template
                    .render_key(&json!({"entity_type": t, "entity_id": i}).as_object().cloned().unwrap_or_default())
                    .expect("renders")
                    .stored;
                let stored = state::read::<VersionEntry>(store, index, &at).expect("reads").map(|e| e.version);
                prop_assert_eq!(stored, model_committed.get(&entity).copied(), "stored version of {}", entity);
                let last = committed.emitted.get(&entity).and_then(|v| v.last()).copied();
                prop_assert_eq!(last, stored, "the last output of {} carries the stored version", entity);
            }
        }
    }

    /// Versions are exactly the integers, written as numbers or as strings with spaces.
    #[test]
    fn versions_parse_exactly_the_integers(v in any::<i64>(), pad in 0usize..3, junk in "[a-z.]{1,3}") {
        prop_assert_eq!(parse_version(&v.to_string()), Some(v));
        prop_assert_eq!(parse_version(&format!("{:pad$}{v}{:pad$}", "", "")), Some(v));
        prop_assert_eq!(parse_version(&format!("{v}{junk}")), None);
    }
}

const RETENTION: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
enum DedupOp {
    Admit { key: u8, advance_ms: i64 },
    Expire { batch: usize, advance_ms: i64 },
    Commit,
    Abort,
}

fn dedup_op() -> impl Strategy<Value = DedupOp> {
    prop_oneof![
        8 => (1..KEYS, 0i64..70).prop_map(|(key, advance_ms)| DedupOp::Admit { key, advance_ms }),
        2 => (1usize..4, 0i64..70).prop_map(|(batch, advance_ms)| DedupOp::Expire { batch, advance_ms }),
        3 => Just(DedupOp::Commit),
        1 => Just(DedupOp::Abort),
    ]
}

proptest! {
    #![proptest_config(config(64))]

    /// `ignore` with expiry passes inside open transactions, as the engine runs them: each
    /// decision matches the model, and no key is admitted twice within its retention.
    #[test]
    fn dedup_admits_a_key_once_per_retention(ops in prop::collection::vec(dedup_op(), 1..60)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(dir.path(), &["dedup".to_string()], &StoreEnv::new(1 << 20, 1 << 20, 1 << 20)).expect("opens");
        let mut now = 1_000i64;
        // The model: first-seen time per key, committed and in the open transaction.
        let mut committed: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
        let mut overlay: BTreeMap<Vec<u8>, Option<i64>> = BTreeMap::new();
        // Admission times of committed transactions, and of the open one.
        let mut admitted: BTreeMap<Vec<u8>, Vec<i64>> = BTreeMap::new();
        let mut admitted_open: Vec<(Vec<u8>, i64)> = Vec::new();
        let retention_ms = i64::try_from(RETENTION.as_millis()).expect("small");
        // Where the expiry pass under way resumes.
        let mut cursor: Option<Vec<u8>> = None;
        for op in ops {
            match op {
                DedupOp::Admit { key: k, advance_ms } => {
                    now += advance_ms;
                    let k = key(k);
                    let name = String::from_utf8(k.clone()).expect("ascii keys");
                    let visible = overlay.get(&k).copied().unwrap_or_else(|| committed.get(&k).copied());
                    let expected = match visible {
                        Some(first_seen) if now - first_seen < retention_ms => Admission::Duplicate,
                        _ => Admission::First,
                    };
                    prop_assert_eq!(dedup::admit(&mut s, 0, state::StoreKey { stored: &name, legacy: None }, now, RETENTION).expect("admits"), expected);
                    if expected == Admission::First {
                        overlay.insert(k.clone(), Some(now));
                        admitted_open.push((k, now));
                    }
                }
                DedupOp::Expire { batch, advance_ms } => {
                    now += advance_ms;
                    let cutoff = now - retention_ms;
                    // The next `batch` committed keys after the cursor, in key order; of those,
                    // the ones whose current entry (the open transaction's write, if any) is
                    // expired are deleted.
                    let examined: Vec<Vec<u8>> = committed
                        .keys()
                        .filter(|k| cursor.as_ref().is_none_or(|c| *k > c))
                        .take(batch)
                        .cloned()
                        .collect();
                    let expired: Vec<Vec<u8>> = examined
                        .iter()
                        .filter(|k| match overlay.get(*k) {
                            Some(pending) => pending.is_some_and(|t| t <= cutoff),
                            None => committed[*k] <= cutoff,
                        })
                        .cloned()
                        .collect();
                    let resume = if examined.len() == batch { examined.last().cloned() } else { None };
                    let step = dedup::expire(&mut s, 0, now, RETENTION, cursor.as_deref(), batch, usize::MAX).expect("expires");
                    prop_assert_eq!(step, dedup::ExpiryStep { deleted: expired.len(), resume_after: resume.clone(), unreadable: 0, unwritable: 0, clamped: 0 });
                    cursor = resume;
                    for k in expired {
                        overlay.insert(k, None);
                    }
                }
                DedupOp::Commit => {
                    take_changes(&mut s);
                    s.commit(&[]).expect("commits");
                    for (k, v) in std::mem::take(&mut overlay) {
                        match v {
                            Some(t) => committed.insert(k, t),
                            None => committed.remove(&k),
                        };
                    }
                    for (k, t) in admitted_open.drain(..) {
                        admitted.entry(k).or_default().push(t);
                    }
                }
                DedupOp::Abort => {
                    s.abort();
                    overlay.clear();
                    admitted_open.clear();
                }
            }
        }
        for (k, times) in &admitted {
            prop_assert!(
                times.windows(2).all(|w| w[1] - w[0] >= retention_ms),
                "key {:?} admitted at {:?}, retention {} ms", k, times, retention_ms
            );
        }
    }
}

/// A key field's value, drawn to hit separators, braces, escapes, NUL and non-ASCII often.
fn key_field() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        4 => "[:{}\\\\\u{0}aé7-]{0,5}".prop_map(serde_json::Value::String),
        1 => any::<i64>().prop_map(serde_json::Value::from),
    ]
}

proptest! {
    #![proptest_config(config(256))]

    /// Distinct field tuples never share a stored key, whatever the separators inside the values
    /// (`WH:A`+`7` and `WH`+`A:7` share the text `WH:A:7`); equal tuples always do.
    #[test]
    fn distinct_field_tuples_give_distinct_stored_keys(
        a in key_field(), b in key_field(), c in key_field(), d in key_field()
    ) {
        let template: KeyTemplate = "{x}:{y}".parse().expect("valid");
        let render = |x: &serde_json::Value, y: &serde_json::Value| {
            template.render_key(&json!({"x": x, "y": y}).as_object().cloned().unwrap_or_default())
        };
        let (Ok(first), Ok(second)) = (render(&a, &b), render(&c, &d)) else {
            return Ok(());
        };
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let same_tuple = (text(&a), text(&b)) == (text(&c), text(&d));
        prop_assert_eq!(first.stored == second.stored, same_tuple, "{:?} vs {:?}", first, second);
    }

    /// The separator moved from one field into the other: the same text, never the same key.
    #[test]
    fn a_separator_inside_a_field_never_merges_two_keys(
        x in "[:a\\\\é]{1,4}", y in "[:a\\\\é]{0,4}", z in "[:a\\\\é]{1,4}"
    ) {
        let template: KeyTemplate = "{x}:{y}".parse().expect("valid");
        let render = |x: String, y: String| {
            template
                .render_key(&json!({"x": x, "y": y}).as_object().cloned().unwrap_or_default())
                .expect("non-empty fields render")
        };
        let left = render(format!("{x}:{y}"), z.clone());
        let right = render(x.clone(), format!("{y}:{z}"));
        prop_assert_eq!(&left.text, &right.text, "the readable forms coincide");
        prop_assert_ne!(left.stored, right.stored);
    }

    /// A number keys by its value, exactly, at any size: another spelling of the same value
    /// gives the same key, two values (beyond 64 bits too) never share one.
    #[test]
    fn a_number_keys_by_its_value_at_any_size(
        a in "[1-9][0-9]{0,39}", b in "[1-9][0-9]{0,39}", zeros in 0usize..4, shift in 0usize..4
    ) {
        let template: KeyTemplate = "{x}".parse().expect("valid");
        let render = |spelling: &str| {
            let doc: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&format!(r#"{{"x": {spelling}}}"#)).expect("valid JSON");
            template.render(&doc).expect("renders")
        };
        // Trailing zeros after the point, and the point moved into an exponent.
        let respelled = if shift > 0 && shift < a.len() {
            let (int, frac) = a.split_at(a.len() - shift);
            format!("{int}.{frac}{}e{shift}", "0".repeat(zeros))
        } else {
            format!("{a}.{}", "0".repeat(zeros + 1))
        };
        prop_assert_eq!(render(&a), render(&respelled), "{} and {}", a, respelled);
        prop_assert_eq!(render(&a) == render(&b), a == b, "{} and {}", a, b);
    }
}
