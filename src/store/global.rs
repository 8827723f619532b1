//! The global ID-mapping store: each instance's full copy of the compacted mappings topic, read
//! like a Kafka Streams GlobalKTable, because lookups come from every partition.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

/// Prefix of `<system>/<external id>` → internal id records.
pub const EXTERNAL_PREFIX: &str = "ext/";
/// Prefix of `<internal id>/<system>` → external id records.
pub const INTERNAL_PREFIX: &str = "int/";
/// Prefix of `<system>/<internal id>` → pending-create marker records.
pub const PENDING_PREFIX: &str = "pending/";

/// The mappings known to this instance.
#[derive(Default)]
pub struct GlobalMappings {
    entries: RwLock<HashMap<String, String>>,
    ready: AtomicBool,
}

/// Sizes for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MappingCounts {
    /// Internal id → external id links.
    pub mappings: usize,
    /// Pending-create markers whose mapping has not arrived.
    pub pending: usize,
}

impl GlobalMappings {
    /// Applies one record of the mappings topic (`None` deletes).
    pub fn apply(&self, key: &str, value: Option<&str>) {
        if let Ok(mut e) = self.entries.write() {
            match value {
                Some(v) => e.insert(key.to_string(), v.to_string()),
                None => e.remove(key),
            };
        }
    }

    /// The value of a key.
    pub fn get(&self, key: &str) -> Option<String> {
        self.entries.read().ok()?.get(key).cloned()
    }

    /// Marks the initial catch-up done.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// True once the topic was read up to its end at startup.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Counts links and open pending-create markers (a scan: for periodic metrics).
    pub fn counts(&self) -> MappingCounts {
        let Ok(e) = self.entries.read() else {
            return MappingCounts::default();
        };
        let mut c = MappingCounts::default();
        for key in e.keys() {
            if key.starts_with(INTERNAL_PREFIX) {
                c.mappings += 1;
            } else if let Some(rest) = key.strip_prefix(PENDING_PREFIX) {
                // A marker whose mapping already arrived is not pending any more.
                let resolved = rest
                    .split_once('/')
                    .is_some_and(|(system, internal)| e.contains_key(&format!("{INTERNAL_PREFIX}{internal}/{system}")));
                if !resolved {
                    c.pending += 1;
                }
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_markers_stop_counting_once_the_mapping_exists() {
        let g = GlobalMappings::default();
        g.apply("pending/erp/u1", Some("{}"));
        g.apply("pending/erp/u2", Some("{}"));
        assert_eq!(
            g.counts(),
            MappingCounts {
                mappings: 0,
                pending: 2
            }
        );
        g.apply("int/u1/erp", Some("ERP-1"));
        assert_eq!(
            g.counts(),
            MappingCounts {
                mappings: 1,
                pending: 1
            }
        );
        g.apply("pending/erp/u2", None);
        assert_eq!(
            g.counts(),
            MappingCounts {
                mappings: 1,
                pending: 0
            }
        );
        assert_eq!(g.get("int/u1/erp").as_deref(), Some("ERP-1"));
    }
}
