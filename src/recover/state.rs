//! What tally's stores hold about a key, for `tally inspect`: read from the stores' changelog
//! topics, which every instance restores from, so it answers with every instance down. The
//! latest record of each matching key wins, as in the store after a restore.

use super::inspect::Sighting;
use crate::processors::dedup::DedupEntry;
use crate::processors::merge::MergedEntry;
use crate::processors::version_gate::VersionEntry;
use crate::reconcile::topic::read_to_end;
use crate::store::codec;
use crate::topology::{Pipeline, StoreKind, Topology};
use anyhow::{Context, Result};
use rdkafka::{ClientConfig, Message};
use std::collections::{BTreeMap, HashMap};

/// The stores' entries for idempotency keys `keys` (dedup stores) and entity keys `entities`
/// (versions and merged stores), as sightings of kind `state`.
pub fn sightings(t: &Topology, reader: &ClientConfig, keys: &[String], entities: &[String]) -> Result<Vec<Sighting>> {
    let mut found = Vec::new();
    for p in &t.pipelines {
        for kind in p.store_kinds() {
            for e in entries(t, reader, p, kind, keys, entities)? {
                found.push(Sighting {
                    kind: "state",
                    at: format!("{}/{}/{}", e.topic, e.partition, e.offset),
                    timestamp_ms: e.timestamp_ms,
                    detail: format!(
                        "store {}, key {}: {}",
                        e.store,
                        e.text,
                        describe(kind, e.value.as_deref())
                    ),
                });
            }
        }
    }
    Ok(found)
}

/// The latest changelog record of a store key.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The store.
    pub store: String,
    /// What it holds.
    pub kind: StoreKind,
    /// Its changelog topic.
    pub topic: String,
    /// The changelog partition holding the key (the task's partition).
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
    /// Its timestamp, ms since the epoch.
    pub timestamp_ms: i64,
    /// The key as stored.
    pub stored: Vec<u8>,
    /// The key as trace records and logs show it.
    pub text: String,
    /// The value; `None` for a tombstone (the key deleted).
    pub value: Option<Vec<u8>>,
}

/// The latest changelog records of `p`'s store of `kind` for idempotency keys `keys` or
/// entity keys `entities`, read to the changelog's end: what every instance restores.
pub fn entries(
    t: &Topology,
    reader: &ClientConfig,
    p: &Pipeline,
    kind: StoreKind,
    keys: &[String],
    entities: &[String],
) -> Result<Vec<Entry>> {
    let wanted = wanted(p, kind, keys, entities);
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let store = p.store_name(kind);
    let topic = t.changelog_topic(&store);
    let mut latest: BTreeMap<Vec<u8>, Entry> = BTreeMap::new();
    read_to_end(reader, &topic, &mut |m| {
        let (Some(key), Some(text)) = (m.key(), m.key().and_then(|k| wanted.get(k))) else {
            return Ok(());
        };
        latest.insert(
            key.to_vec(),
            Entry {
                store: store.clone(),
                kind,
                topic: topic.clone(),
                partition: m.partition(),
                offset: m.offset(),
                timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
                stored: key.to_vec(),
                text: text.clone(),
                value: m.payload().map(<[u8]>::to_vec),
            },
        );
        Ok(())
    })
    .with_context(|| format!("reading the changelog `{topic}` of store {store}"))?;
    Ok(latest.into_values().collect())
}

/// The stored keys to look for in `p`'s store of `kind`, with the readable key each stands for.
fn wanted(p: &Pipeline, kind: StoreKind, keys: &[String], entities: &[String]) -> HashMap<Vec<u8>, String> {
    let mut wanted = HashMap::new();
    let mut add = |template: &crate::topology::KeyTemplate, text: &String| {
        for stored in template.stored_keys_for(text) {
            wanted.insert(stored.into_bytes(), text.clone());
        }
        // A store written by an earlier version keys by the readable text.
        wanted.insert(text.clone().into_bytes(), text.clone());
    };
    let texts = match kind {
        StoreKind::Dedup => keys,
        StoreKind::Versions | StoreKind::Merged | StoreKind::Links => entities,
    };
    for template in p.key_templates(kind) {
        texts.iter().for_each(|t| add(template, t));
    }
    wanted
}

/// One store value in words.
pub fn describe(kind: StoreKind, value: Option<&[u8]>) -> String {
    let Some(bytes) = value else {
        return "deleted (expired, reset or forgotten)".to_string();
    };
    let decoded = match kind {
        StoreKind::Dedup => {
            codec::decode::<DedupEntry>(bytes).map(|e| format!("first seen {}", super::timestamp_text(e.first_seen_ms)))
        }
        StoreKind::Versions => codec::decode::<VersionEntry>(bytes).map(|e| format!("version {}", e.version)),
        StoreKind::Merged => codec::decode::<MergedEntry>(bytes).map(|e| {
            format!(
                "{} increments applied ({}), state {}",
                e.applied.len(),
                e.applied.join(", "),
                e.state
            )
        }),
        StoreKind::Links => return format!("{} bytes", bytes.len()),
    };
    decoded.unwrap_or_else(|e| format!("unreadable value: {e}"))
}
