//! Text view of a topology: sources → steps → sinks, with stores and their changelog topics.

use super::{MergeEmit, Strategy, Topology};
use std::fmt::Write;

/// Renders the topology as indented text for `tally describe`.
pub fn describe(t: &Topology) -> String {
    let mut s = String::new();
    // Writing to a String cannot fail; the results are ignored on purpose.
    let _ = writeln!(s, "application: {}", t.application_id);
    let _ = writeln!(s, "  consumer group: {}", t.application_id);
    let _ = writeln!(
        s,
        "  exactly-once: commit every {} ms, {} stream thread(s)",
        t.processing.commit_interval.as_millis(),
        t.processing.threads
    );
    let _ = writeln!(s, "  state dir: {}", t.state_dir.display());
    let m = &t.state_memory;
    let _ = writeln!(
        s,
        "  state memory: {} block cache holding {} of memtables, {} of recent values",
        size(m.block_cache_bytes),
        size(m.write_buffer_bytes),
        size(m.recent_values_bytes)
    );
    if t.processing.num_standby_replicas > 0 {
        let _ = writeln!(s, "  standby replicas: {}", t.processing.num_standby_replicas);
    }
    for p in &t.pipelines {
        let _ = writeln!(s, "\npipeline {}", p.name);
        let _ = writeln!(s, "  source  {} (topic {}, json)", p.source, p.input_topic);
        if let Some(r) = &p.repartition {
            let _ = writeln!(s, "    → repartition by {} through topic {}", r.key, r.topic);
        }
        if let Some(c) = &p.co_partitioned {
            let _ = writeln!(
                s,
                "    → co-partitioned by {} ({}): no repartition hop; records on another partition are counted",
                c.key,
                c.partitioner.name()
            );
        }
        let _ = writeln!(s, "    → key      {}", p.key);
        let correlation = match (&p.correlation.header, &p.correlation.field) {
            (Some(h), Some(f)) => format!("header `{h}`, else field `{f}`, else derived"),
            (Some(h), None) => format!("header `{h}`, else derived"),
            (None, Some(f)) => format!("field `{f}`, else derived"),
            (None, None) => "derived from the key".to_string(),
        };
        let _ = writeln!(s, "    → correlation id from {correlation}");
        for (i, r) in p.routes.iter().enumerate() {
            let what = match &r.strategy {
                Strategy::Ignore { retention } => format!(
                    "ignore duplicates (keys kept {})",
                    humantime::format_duration(*retention)
                ),
                Strategy::Overwrite { entity, version } => {
                    format!("overwrite entity {entity} only with a higher version {version}")
                }
                Strategy::Merge {
                    entity,
                    increment_id,
                    into,
                    emit,
                    ..
                } => format!(
                    "merge into entity {entity}.{into}, each increment {increment_id} once, emit {}",
                    match emit {
                        MergeEmit::State => "merged state",
                        MergeEmit::Increment => "accepted increment",
                    }
                ),
                Strategy::RecordMapping => "record write-backs in the ID-mapping store, first write wins".to_string(),
            };
            let _ = writeln!(s, "    → route {}: event_type {} → {what}", i + 1, r.event_type);
        }
        for m in &p.map_ids {
            let _ = writeln!(
                s,
                "    → map {} ({}) to {} id in field {}; pending-create when unknown",
                m.field, m.from_system, m.to_system, m.into
            );
        }
        let out_key = p.output.key.as_ref().map_or_else(
            || "the entity key, else the idempotency key".to_string(),
            ToString::to_string,
        );
        let _ = writeln!(s, "  sink    topic {} (key {})", p.output.topic, out_key);
        let _ = writeln!(s, "  stores");
        for store in p.store_names() {
            let _ = writeln!(
                s,
                "    {store}  (RocksDB, changelog {}, compacted, partitions = {})",
                t.changelog_topic(&store),
                p.input_topic
            );
        }
    }
    if let Some(m) = &t.id_mapping {
        let _ = writeln!(
            s,
            "\nglobal ID-mapping store ← topic {} (compacted, read in full by every instance)",
            m.topic
        );
    }
    if let (Some(r), Some(trace)) = (&t.reconcile, &t.trace) {
        let store = Topology::RECONCILE_STORE;
        let _ = writeln!(s, "\nlive reconciler ← trace topic {}", trace.topic);
        let _ = writeln!(
            s,
            "  every {} report events open longer than {} → alerts topic {}",
            humantime::format_duration(r.scan_interval),
            humantime::format_duration(r.threshold),
            r.alerts_topic
        );
        let _ = writeln!(
            s,
            "  store {store}  (RocksDB, changelog {}, compacted, partitions = {})",
            t.changelog_topic(store),
            trace.topic
        );
    }
    let _ = writeln!(s, "\ndead letters → topic {}", t.dead_letter_topic);
    s
}

/// A byte budget as people set it: whole MiB when it is, bytes otherwise.
fn size(bytes: usize) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn budgets_read_in_mib_unless_they_are_not_whole_mib() {
        assert_eq!(super::size(16 << 20), "16 MiB");
        assert_eq!(super::size(0), "0 MiB");
        assert_eq!(super::size(1_500_000), "1500000 bytes");
    }
}
