//! What every task's RocksDB of an instance shares: memory, so memory is bounded by
//! configuration, not partitions; and the registry of databases open to queries.

use super::published::Published;
use super::recent::RecentBudget;
use crate::topology::StateMemory;
use rocksdb::{BlockBasedIndexType, BlockBasedOptions, Cache, Options, WriteBufferManager};
use std::sync::Arc;

/// Block cache and write-buffer budget shared by all stores of an instance, and where their
/// tasks publish their databases for queries.
pub struct StoreEnv {
    cache: Cache,
    write_buffers: WriteBufferManager,
    write_buffer_bytes: usize,
    recent: Arc<RecentBudget>,
    published: Arc<Published>,
}

impl StoreEnv {
    /// A shared budget: `cache_bytes` of block cache, `write_buffer_bytes` of memtables
    /// (charged to the same cache) and `recent_bytes` of recently committed values.
    pub fn new(cache_bytes: usize, write_buffer_bytes: usize, recent_bytes: usize) -> Self {
        let cache = Cache::new_lru_cache(cache_bytes);
        let write_buffers =
            WriteBufferManager::new_write_buffer_manager_with_cache(write_buffer_bytes, false, cache.clone());
        Self {
            cache,
            write_buffers,
            write_buffer_bytes,
            recent: RecentBudget::new(recent_bytes),
            published: Arc::default(),
        }
    }

    /// The budgets a topology's `state:` section sets.
    pub fn with(memory: &StateMemory) -> Self {
        Self::new(
            memory.block_cache_bytes,
            memory.write_buffer_bytes,
            memory.recent_values_bytes,
        )
    }

    /// The same budget, publishing task databases to `published` (read by the query API).
    pub fn publishing_to(self, published: Arc<Published>) -> Self {
        Self { published, ..self }
    }

    /// What every task store's recently committed values are charged to.
    pub fn recent_budget(&self) -> &Arc<RecentBudget> {
        &self.recent
    }

    /// Where tasks publish their databases for queries.
    pub fn published(&self) -> &Arc<Published> {
        &self.published
    }

    /// RocksDB options for one task database using the shared budget.
    pub fn db_options(&self) -> Options {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_write_buffer_manager(&self.write_buffers);
        // The shared budget decides flushes. Setting this to the budget shrank the arena blocks
        // RocksDB sizes from it, and a store then went on committing on a full filesystem
        // (docs/performance.md), so it stays at RocksDB's default.
        opts.set_write_buffer_size(MEMTABLE_SIZE);
        // Data and the changelog offset share one WriteBatch; with several column families
        // atomic flush keeps them together on disk too.
        opts.set_atomic_flush(true);
        opts.set_max_background_jobs(2);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&self.cache);
        // Most lookups are for keys never seen (a first event, a new entity): a bloom filter
        // answers them without reading data blocks. Index and filter blocks live in the shared
        // cache, so they count against its budget instead of growing with the data.
        table.set_bloom_filter(10.0, false);
        table.set_cache_index_and_filter_blocks(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        // Partitioned: a whole-file filter of a large table (2.5 MB for 2M keys) is bigger than
        // a shard of the cache (64 MB splits into 64 shards of 1 MB), so it was never kept and
        // every lookup read and checksummed it from disk: loading 2M ID mappings slowed from
        // 220k to 5k records/s once the first table was flushed (benches/mappings.rs). Filter
        // and index partitions of 4 KiB are cached like data blocks; the top level stays pinned.
        table.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_partition_filters(true);
        table.set_metadata_block_size(4096);
        table.set_pin_top_level_index_and_filter(true);
        opts.set_block_based_table_factory(&table);
        opts
    }

    /// Options of a task store's data column family: [`StoreEnv::db_options`] with a bloom filter
    /// over each memtable's keys. Most lookups are of keys the memtable lacks (new payments,
    /// entities flushed or never seen), and the filter spares them the skip-list search, which
    /// fell from 13% to 5% of the samples of `cargo bench --bench process` on `entities-256B-1M`
    /// (docs/performance.md).
    pub fn data_cf_options(&self) -> Options {
        let mut opts = self.db_options();
        // RocksDB takes the filter's size as a share of `write_buffer_size` (fixed in
        // `db_options`), so the share carries the budget: 33 KiB per memtable at the default
        // 16 MiB, 2 KiB at the smallest (1 MiB).
        opts.set_memtable_whole_key_filtering(true);
        opts.set_memtable_prefix_bloom_ratio(
            MEMTABLE_FILTER_SHARE * self.write_buffer_bytes as f64 / MEMTABLE_SIZE as f64,
        );
        opts
    }
}

/// The memtable bloom filter's share of the write-buffer budget, per data memtable.
const MEMTABLE_FILTER_SHARE: f64 = 0.002;
/// Each memtable's `write_buffer_size`: RocksDB's default (`options.h`), set explicitly because
/// the memtable filter is sized as a share of it.
const MEMTABLE_SIZE: usize = 64 << 20;

impl Default for StoreEnv {
    fn default() -> Self {
        Self::with(&StateMemory::default())
    }
}
