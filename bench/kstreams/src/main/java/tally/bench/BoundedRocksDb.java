package tally.bench;

import java.util.Map;
import org.apache.kafka.streams.state.RocksDBConfigSetter;
import org.rocksdb.BlockBasedTableConfig;
import org.rocksdb.Cache;
import org.rocksdb.CompressionType;
import org.rocksdb.LRUCache;
import org.rocksdb.Options;
import org.rocksdb.WriteBufferManager;

/**
 * The bounded-memory RocksDB setup the Kafka Streams documentation recommends, sized like tally's
 * StoreEnv: one block cache and one write-buffer budget shared by every store instance of the
 * process, LZ4 like tally. Without it each task's store would get its own cache and memtables.
 */
public final class BoundedRocksDb implements RocksDBConfigSetter {
  private static final long BLOCK_CACHE_BYTES =
      Long.parseLong(Main.env("KS_BLOCK_CACHE_BYTES", String.valueOf(64L << 20)));
  private static final long WRITE_BUFFER_BYTES =
      Long.parseLong(Main.env("KS_WRITE_BUFFER_BYTES", String.valueOf(16L << 20)));
  private static final Cache CACHE = new LRUCache(BLOCK_CACHE_BYTES);
  private static final WriteBufferManager WRITE_BUFFERS = new WriteBufferManager(WRITE_BUFFER_BYTES, CACHE);

  @Override
  public void setConfig(String storeName, Options options, Map<String, Object> configs) {
    BlockBasedTableConfig table = (BlockBasedTableConfig) options.tableFormatConfig();
    table.setBlockCache(CACHE);
    table.setCacheIndexAndFilterBlocks(true);
    options.setTableFormatConfig(table);
    options.setWriteBufferManager(WRITE_BUFFERS);
    options.setCompressionType(CompressionType.LZ4_COMPRESSION);
  }

  @Override
  public void close(String storeName, Options options) {
    // The cache and write-buffer manager are shared by every store: they live as long as the JVM.
  }
}
