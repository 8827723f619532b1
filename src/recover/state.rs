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
use std::time::{Duration, UNIX_EPOCH};

/// The stores' entries for idempotency keys `keys` (dedup stores) and entity keys `entities`
/// (versions and merged stores), as sightings of kind `state`.
pub fn sightings(t: &Topology, reader: &ClientConfig, keys: &[String], entities: &[String]) -> Result<Vec<Sighting>> {
    let mut found = Vec::new();
    for p in &t.pipelines {
        for kind in p.store_kinds() {
            let wanted = wanted(p, kind, keys, entities);
            if wanted.is_empty() {
                continue;
            }
            let store = p.store_name(kind);
            let topic = t.changelog_topic(&store);
            let mut latest: BTreeMap<Vec<u8>, Sighting> = BTreeMap::new();
            read_to_end(reader, &topic, &mut |m| {
                let Some(text) = m.key().and_then(|k| wanted.get(k)) else {
                    return Ok(());
                };
                let detail = format!("store {store}, key {text}: {}", describe(kind, m.payload()));
                let at = format!("{}/{}/{}", m.topic(), m.partition(), m.offset());
                let timestamp_ms = m.timestamp().to_millis().unwrap_or(0);
                latest.insert(
                    m.key().map(<[u8]>::to_vec).unwrap_or_default(),
                    Sighting {
                        kind: "state",
                        at,
                        timestamp_ms,
                        detail,
                    },
                );
                Ok(())
            })
            .with_context(|| format!("reading the changelog `{topic}` of store {store}"))?;
            found.extend(latest.into_values());
        }
    }
    Ok(found)
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
    match kind {
        StoreKind::Dedup => keys.iter().for_each(|k| add(&p.key, k)),
        StoreKind::Versions | StoreKind::Merged => {
            for route in p.routes.iter().filter(|r| r.strategy.store() == kind) {
                if let Some(entity) = route.strategy.entity() {
                    entities.iter().for_each(|e| add(entity, e));
                }
            }
        }
        StoreKind::Links => {}
    }
    wanted
}

/// One store value in words.
fn describe(kind: StoreKind, value: Option<&[u8]>) -> String {
    let Some(bytes) = value else {
        return "deleted (expired, reset or forgotten)".to_string();
    };
    let decoded = match kind {
        StoreKind::Dedup => codec::decode::<DedupEntry>(bytes).map(|e| {
            let first = UNIX_EPOCH + Duration::from_millis(e.first_seen_ms.max(0) as u64);
            format!("first seen {}", humantime::format_rfc3339_millis(first))
        }),
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
