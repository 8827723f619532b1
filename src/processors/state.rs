//! Typed reads and writes of versioned values in a task's stores, for the strategies.

use crate::store::codec::{self, CodecError};
use crate::store::{StoreError, TaskStore};
use crate::topology::rendered_key::{readable_key, STORED_KEY_START};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A failure reading or writing strategy state: the task cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// RocksDB failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A strategy's store is not open in this task (a bug in task setup).
    #[error("store `{0}` is not open in this task")]
    MissingStore(&'static str),
    /// A stored value cannot be decoded or encoded.
    #[error("state of key `{key}` in store `{store}`: {source}")]
    Codec {
        /// The store.
        store: String,
        /// The key.
        key: String,
        /// What is wrong with the value.
        source: CodecError,
    },
}

/// Where a record's state lives in a store: its stored key, and its text key when the store may
/// still hold text keys written by an earlier version (see [`legacy_keys_possible`]).
#[derive(Debug, Clone, Copy)]
pub struct StoreKey<'a> {
    /// The unambiguous key ([`crate::topology::RenderedKey::stored`]).
    pub stored: &'a str,
    /// The text key an earlier version would have used, when one may be there.
    pub legacy: Option<&'a str>,
}

/// True when store `index` holds a committed key that does not start like a stored key: a
/// store written by an earlier version, whose text keys are read (and moved) on first use.
pub fn legacy_keys_possible(store: &TaskStore, index: usize) -> Result<bool, StateError> {
    let start = [STORED_KEY_START as u8 + 1];
    let found = store.scan_after(index, Some(&start))?.next().is_some();
    Ok(found)
}

/// Reads and decodes the value under `key`; a value still under its text key is moved to the
/// stored key (a delete and a write, both changelogged), so it is found there from now on.
pub fn read_key<T: DeserializeOwned>(
    store: &mut TaskStore,
    index: usize,
    key: StoreKey<'_>,
) -> Result<Option<T>, StateError> {
    if let Some(bytes) = store.get(index, key.stored.as_bytes())? {
        return decode(store, index, key.stored.as_bytes(), &bytes).map(Some);
    }
    let Some(legacy) = key.legacy else {
        return Ok(None);
    };
    let Some(bytes) = store.get(index, legacy.as_bytes())? else {
        return Ok(None);
    };
    let value = decode(store, index, legacy.as_bytes(), &bytes)?;
    store.delete(index, legacy.as_bytes());
    store.put(index, key.stored.as_bytes(), bytes);
    Ok(Some(value))
}

/// Reads and decodes the value of `key` in store `index`.
pub fn read<T: DeserializeOwned>(store: &TaskStore, index: usize, key: &str) -> Result<Option<T>, StateError> {
    match store.get(index, key.as_bytes())? {
        None => Ok(None),
        Some(bytes) => decode(store, index, key.as_bytes(), &bytes).map(Some),
    }
}

/// Decodes a value read from store `index`, naming the store and key when it is corrupt.
pub fn decode<T: DeserializeOwned>(store: &TaskStore, index: usize, key: &[u8], bytes: &[u8]) -> Result<T, StateError> {
    codec::decode(bytes).map_err(|source| StateError::Codec {
        store: store.name(index).to_string(),
        key: readable_key(&String::from_utf8_lossy(key)),
        source,
    })
}

/// Encodes and writes `value` under `key` in store `index` (overlay + changelog).
pub fn write<T: Serialize>(store: &mut TaskStore, index: usize, key: &str, value: &T) -> Result<(), StateError> {
    let bytes = codec::encode(value).map_err(|source| StateError::Codec {
        store: store.name(index).to_string(),
        key: key.to_string(),
        source,
    })?;
    store.put(index, key.as_bytes(), bytes);
    Ok(())
}
