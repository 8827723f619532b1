//! Local state: one RocksDB per task, transactional overlay, recently committed values,
//! changelog offsets, shared memory.

pub mod cleaner;
pub mod codec;
pub mod env;
pub mod error;
pub mod global;
pub mod lock;
pub mod offset;
pub mod published;
pub mod recent;
pub mod task_store;
pub mod write;

pub use env::StoreEnv;
pub use error::StoreError;
pub use global::GlobalMappings;
pub use lock::{LockError, TaskLock};
pub use published::Published;
pub use task_store::{set_aside, Change, StoreSize, TaskStore};
