//! Typed reads and writes of versioned values in a task's stores, for the strategies.

use crate::store::codec::{self, CodecError};
use crate::store::{StoreError, TaskStore};
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
        key: String::from_utf8_lossy(key).into_owned(),
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
