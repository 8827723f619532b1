//! The memory an instance's stores share, set under `state:`.

/// Budgets shared by every store of an instance, its task stores and its ID-mapping store
/// (Kafka Streams users set the same with `statestore.cache.max.bytes` and a bounded-memory
/// `rocksdb.config.setter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateMemory {
    /// RocksDB block cache; the memtables are charged to it.
    pub block_cache_bytes: usize,
    /// RocksDB memtables of all the stores; reaching it flushes memtables to disk.
    pub write_buffer_bytes: usize,
    /// Values of each task's last few commits kept in memory and read before RocksDB (0: none).
    pub recent_values_bytes: usize,
}

impl StateMemory {
    /// The smallest block cache or memtable budget accepted: a floor that catches a budget
    /// written in MiB where bytes are meant.
    pub const MIN_BYTES: usize = 1 << 20;
}

impl Default for StateMemory {
    /// 16 MiB of memtables rather than 32: the recent values serve the reads a larger memtable
    /// would, and 600k-record drains (interleaved A/B, 3 rounds) peaked at 80-87 against 87-99
    /// MiB on `entities-256B-10k`, CPU per record within the runs' noise (docs/performance.md).
    fn default() -> Self {
        Self {
            block_cache_bytes: 64 << 20,
            write_buffer_bytes: 16 << 20,
            recent_values_bytes: 8 << 20,
        }
    }
}
