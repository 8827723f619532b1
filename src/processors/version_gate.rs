//! The `overwrite` strategy: per entity, only a strictly higher source version passes, so the
//! output per entity is version-ordered. tally never invents versions.

use super::state::{self, StateError, StoreKey};
use crate::store::TaskStore;
use serde::{Deserialize, Serialize};

/// What the versions store remembers per entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionEntry {
    /// Highest version accepted so far.
    pub version: i64,
}

/// The outcome of offering a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Higher than anything seen: it passes and becomes the entity's version.
    Newer,
    /// Lower than or equal to `current`: dropped as stale.
    Stale {
        /// The entity's version.
        current: i64,
    },
}

/// Parses a rendered version: an integer, possibly written as a string.
pub fn parse_version(text: &str) -> Option<i64> {
    text.trim().parse().ok()
}

/// Offers `version` for `entity`; records it when it passes.
pub fn offer(store: &mut TaskStore, index: usize, entity: StoreKey<'_>, version: i64) -> Result<Gate, StateError> {
    if let Some(current) = state::read_key::<VersionEntry>(store, index, entity)? {
        if version <= current.version {
            return Ok(Gate::Stale {
                current: current.version,
            });
        }
    }
    state::write(store, index, entity.stored, &VersionEntry { version })?;
    Ok(Gate::Newer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreEnv;

    fn k(stored: &str) -> StoreKey<'_> {
        StoreKey { stored, legacy: None }
    }

    #[test]
    fn only_strictly_higher_versions_pass() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = TaskStore::open(tmp.path(), &["v".to_string()], &StoreEnv::default()).expect("opens");
        assert_eq!(offer(&mut s, 0, k("customer:C-1"), 5).expect("ok"), Gate::Newer);
        assert_eq!(
            offer(&mut s, 0, k("customer:C-1"), 5).expect("ok"),
            Gate::Stale { current: 5 }
        );
        assert_eq!(
            offer(&mut s, 0, k("customer:C-1"), 3).expect("ok"),
            Gate::Stale { current: 5 }
        );
        assert_eq!(offer(&mut s, 0, k("customer:C-2"), 1).expect("ok"), Gate::Newer);
        assert_eq!(offer(&mut s, 0, k("customer:C-1"), 6).expect("ok"), Gate::Newer);
    }

    #[test]
    fn versions_parse_from_integers_and_integer_strings_only() {
        assert_eq!(parse_version("17"), Some(17));
        assert_eq!(parse_version(" 17 "), Some(17));
        assert_eq!(parse_version("-2"), Some(-2));
        assert_eq!(parse_version("17.5"), None);
        assert_eq!(parse_version("v17"), None);
        assert_eq!(parse_version(""), None);
    }
}
