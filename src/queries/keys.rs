//! From a key as people read it (`PAY-1:PAID`, as trace records, logs and `tally inspect` show
//! it) to what a query reads: the stored keys it may be under, and the partitions of the task
//! input that may hold it.

use crate::topology::partitioner::Partitioner;
use crate::topology::rendered_key::field_values;
use crate::topology::{Pipeline, StoreKind};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// Where to look for one readable key in one store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// Stored keys whose readable form is the key, the legacy text key last.
    pub stored: Vec<Vec<u8>>,
    /// The partitions that may hold it; `None` when that cannot be told from the key (no
    /// repartition hop, or a repartition key the queried key does not determine): all may.
    pub partitions: Option<BTreeSet<i32>>,
}

/// Where `text` may be in `p`'s store of `kind`, given the process topic's `partition_count`
/// and the `partitioner` of tally's producers.
pub fn lookup(p: &Pipeline, kind: StoreKind, text: &str, partitioner: Partitioner, partition_count: i32) -> Lookup {
    let mut stored: Vec<Vec<u8>> = Vec::new();
    let mut partitions = BTreeSet::new();
    // A repartition hop writes with tally's partitioner; a co-partitioned source's producers
    // with theirs.
    let partitioning = match (&p.repartition, &p.co_partitioned) {
        (Some(r), _) => Some((&r.key, partitioner)),
        (None, Some(c)) => Some((&c.key, c.partitioner)),
        (None, None) => None,
    };
    let mut determined = partitioning.is_some();
    let templates = p.key_templates(kind);
    for template in &templates {
        for candidate in template.stored_keys_for(text) {
            let partition = partitioning.and_then(|(by, partitioner)| {
                let paths: Vec<&[String]> = template.field_paths().collect();
                let doc = document(&paths, &field_values(&candidate)?)?;
                let key = by.render(&doc).ok()?;
                partitioner.partition(key.as_bytes(), partition_count)
            });
            match partition {
                Some(partition) => {
                    partitions.insert(partition);
                }
                None => determined = false,
            }
            stored.push(candidate.into_bytes());
        }
    }
    // A store written by an earlier version keys by the readable text; links are keyed by
    // internal id, which is the text as given.
    stored.push(text.as_bytes().to_vec());
    // Nothing parsed (a text no template can render, or links): no partition is known.
    let determined = determined && !templates.is_empty() && !partitions.is_empty();
    Lookup {
        stored,
        partitions: determined.then_some(partitions),
    }
}

/// A JSON object with each field path set to its value (as a string: a number's text in a key is
/// already its one canonical spelling, and renders as itself).
fn document(paths: &[&[String]], values: &[String]) -> Option<Map<String, Value>> {
    if paths.len() != values.len() {
        return None;
    }
    let mut doc = Map::new();
    for (path, value) in paths.iter().zip(values) {
        let (last, parents) = path.split_last()?;
        let mut at = &mut doc;
        for segment in parents {
            let entry = at.entry(segment.clone()).or_insert_with(|| Value::Object(Map::new()));
            at = entry.as_object_mut()?;
        }
        at.insert(last.clone(), Value::String(value.clone()));
    }
    Some(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::KeyTemplate;

    /// A pipeline with `repartition: { <repartition> }` when given.
    fn pipeline(repartition: Option<&str>) -> Pipeline {
        let yaml = format!(
            "application_id: app\nkafka: {{ bootstrap_servers: b }}\nsources:\n  p: {{ topic: t }}\npipelines:\n  \
             - name: pay\n    from: p\n{}    key: \"{{order.id}}:{{status}}\"\n    routes:\n      \
             - when: {{ event_type: \"e.*\" }}\n        strategy: overwrite\n        entity: \"{{order.id}}\"\n        \
             version: \"{{v}}\"\n      - strategy: ignore\n    to: {{ topic: o }}\ndead_letter: {{ topic: d }}\n",
            repartition.map_or(String::new(), |r| format!("    repartition: {{ {r} }}\n"))
        );
        let t = crate::config::load_str("t.yaml", &yaml, |_| None).expect("valid");
        t.pipelines[0].clone()
    }

    #[test]
    fn stored_keys_decode_back_to_their_fields() {
        let t: KeyTemplate = "{a}:{b.c}".parse().expect("template");
        let doc = serde_json::json!({"a": "x\\y\u{0}", "b": {"c": 7}});
        let Value::Object(doc) = doc else { unreachable!() };
        let rendered = t.render_key(&doc).expect("renders");
        let values = field_values(&rendered.stored).expect("decodes");
        assert_eq!(values, vec!["x\\y\u{0}".to_string(), "7".to_string()]);
        let paths: Vec<&[String]> = t.field_paths().collect();
        let again = document(&paths, &values).expect("document");
        assert_eq!(
            t.render_key(&again).expect("renders"),
            rendered,
            "same key from the decoded fields"
        );
        assert_eq!(field_values("no leading nul"), None);
    }

    #[test]
    fn the_repartition_key_decides_the_partition_when_the_queried_key_holds_its_fields() {
        let p = pipeline(Some(r#"key: "{order.id}""#));
        let crc = Partitioner::Crc32;
        let dedup = lookup(&p, StoreKind::Dedup, "O-1:PAID", crc, 6);
        let expected = crc.partition(b"O-1", 6).expect("partition");
        assert_eq!(dedup.partitions, Some(BTreeSet::from([expected])));
        assert_eq!(dedup.stored.len(), 2, "the stored key and the legacy text key");
        assert_eq!(dedup.stored[1], b"O-1:PAID".to_vec());
        let entity = lookup(&p, StoreKind::Versions, "O-1", crc, 6);
        assert_eq!(
            entity.partitions,
            Some(BTreeSet::from([expected])),
            "same task as its events"
        );

        // `a:b:c` splits two ways over `{order.id}:{status}`: both partitions may hold it.
        let two = lookup(&p, StoreKind::Dedup, "a:b:c", crc, 1000);
        let both: BTreeSet<i32> = ["a", "a:b"]
            .iter()
            .filter_map(|k| crc.partition(k.as_bytes(), 1000))
            .collect();
        assert_eq!(two.partitions, Some(both));
        assert_eq!(two.stored.len(), 3);
    }

    #[test]
    fn a_co_partitioned_source_is_looked_up_with_its_producers_partitioner() {
        let p = pipeline(Some(r#"key: "{order.id}", co_partitioned: murmur2"#));
        assert!(p.repartition.is_none(), "no hop");
        let found = lookup(&p, StoreKind::Dedup, "O-1:PAID", Partitioner::Crc32, 6);
        let expected = Partitioner::Murmur2.partition(b"O-1", 6).expect("partition");
        assert_eq!(found.partitions, Some(BTreeSet::from([expected])));
    }

    #[test]
    fn without_a_determining_repartition_key_every_partition_may_hold_it() {
        let crc = Partitioner::Crc32;
        assert_eq!(
            lookup(&pipeline(None), StoreKind::Dedup, "O-1:PAID", crc, 6).partitions,
            None
        );
        let other_field = pipeline(Some(r#"key: "{customer}""#));
        assert_eq!(
            lookup(&other_field, StoreKind::Dedup, "O-1:PAID", crc, 6).partitions,
            None
        );
        let p = pipeline(Some(r#"key: "{order.id}""#));
        assert_eq!(lookup(&p, StoreKind::Links, "x", crc, 6).partitions, None);
        assert_eq!(
            lookup(&p, StoreKind::Dedup, "no-colon", crc, 6).partitions,
            None,
            "no parse"
        );
        assert_eq!(
            lookup(&p, StoreKind::Dedup, "O-1:PAID", Partitioner::Unknown, 6).partitions,
            None
        );
    }
}
