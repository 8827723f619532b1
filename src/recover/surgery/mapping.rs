//! Correcting a wrong first write-back: the `record_mapping` pipeline's link (its store, first
//! write wins, through its changelog) and the mappings topic every instance loads.

use super::Write;
use crate::processors::idmap::{external_key, internal_key};
use crate::reconcile::topic::read_to_end;
use crate::recover::state::Entry;
use crate::store::codec;
use crate::topology::{Pipeline, StoreKind, Topology};
use anyhow::{bail, Context, Result};
use rdkafka::{ClientConfig, Message};

/// The writes that make `system`'s id `right` where `wrong` was recorded first.
pub(super) fn correct(
    t: &Topology,
    reader: &ClientConfig,
    p: &Pipeline,
    system: &str,
    wrong: &str,
    right: &str,
) -> Result<Vec<Write>> {
    let Some(mappings) = &t.id_mapping else {
        bail!("the topology has no ID mappings (`id_mapping:`)");
    };
    if !p.store_kinds().contains(&StoreKind::Links) {
        bail!(
            "pipeline `{}` records no write-backs (no `record_mapping` route)",
            p.name
        );
    }
    if wrong == right {
        bail!("the wrong and the right id are the same");
    }
    let wrong_key = external_key(system, wrong);
    let right_key = external_key(system, right);
    let (mut internal, mut right_owner) = (None, None);
    read_to_end(reader, &mappings.topic, &mut |m| {
        let value = || m.payload().map(|v| String::from_utf8_lossy(v).into_owned());
        if m.key() == Some(wrong_key.as_bytes()) {
            internal = value();
        } else if m.key() == Some(right_key.as_bytes()) {
            right_owner = value();
        }
        Ok(())
    })
    .with_context(|| format!("reading the mappings topic `{}`", mappings.topic))?;
    let Some(internal) = internal else {
        bail!(
            "no mapping `{wrong_key}` on `{}`: `{system}` id `{wrong}` was never recorded",
            mappings.topic
        );
    };
    if let Some(owner) = right_owner.filter(|o| *o != internal) {
        bail!("`{system}` id `{right}` already names another entity (`{owner}`); correct that one first");
    }
    let link = internal_key(&internal, system);
    let store = p.store_name(StoreKind::Links);
    let changelog = t.changelog_topic(&store);
    let mut entry: Option<Entry> = None;
    read_to_end(reader, &changelog, &mut |m| {
        if m.key() == Some(link.as_bytes()) {
            entry = Some(Entry {
                store: store.clone(),
                kind: StoreKind::Links,
                topic: changelog.clone(),
                partition: m.partition(),
                offset: m.offset(),
                timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
                stored: link.as_bytes().to_vec(),
                text: link.clone(),
                value: m.payload().map(<[u8]>::to_vec),
            });
        }
        Ok(())
    })
    .with_context(|| format!("reading the changelog `{changelog}`"))?;
    let Some(entry) = entry.filter(|e| e.value.is_some()) else {
        bail!("pipeline `{}` holds no link `{link}`", p.name);
    };
    let recorded: Option<String> = entry.value.as_deref().and_then(|v| codec::decode(v).ok());
    if recorded.as_deref() != Some(wrong) {
        bail!(
            "the link `{link}` holds `{}`, not `{wrong}`; nothing to correct",
            recorded.unwrap_or_else(|| "an unreadable value".into())
        );
    }
    let mut link_write = Write::of_entry(
        entry,
        Some(codec::encode(&right.to_string()).context("encoding the link")?),
    );
    link_write.change = (wrong.to_string(), right.to_string());
    let topic_write = |key: String, now: &str, value: Option<&str>| Write {
        topic: mappings.topic.clone(),
        partition: None,
        text: key.clone(),
        key: key.into_bytes(),
        change: (now.to_string(), value.unwrap_or("deleted").to_string()),
        value: value.map(|v| v.as_bytes().to_vec()),
    };
    Ok(vec![
        link_write,
        topic_write(link.clone(), wrong, Some(right)),
        topic_write(right_key, "absent", Some(&internal)),
        topic_write(wrong_key, &internal, None),
    ])
}
