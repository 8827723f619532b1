package tally.bench;

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;

/**
 * Runs one of tally's example topologies as a Kafka Streams application until SIGTERM.
 *
 * <p>Configured by environment (the benchmark harness sets it): KS_MODE (payments | entities |
 * payments-keyed),
 * KAFKA_BOOTSTRAP, KS_APP_ID, KS_INPUT, KS_OUTPUT, KS_DLQ, KS_STATE_DIR, KS_PARTITIONS,
 * KS_COMMIT_MS (100), KS_CACHE_BYTES (record cache, 10 MiB), KS_BLOCK_CACHE_BYTES (64 MiB) and
 * KS_WRITE_BUFFER_BYTES (16 MiB). Prints "state RUNNING" once the tasks run.
 */
public final class Main {
  private Main() {}

  public static void main(String[] args) throws InterruptedException {
    String mode = env("KS_MODE", null);
    Topologies.Names names =
        new Topologies.Names(env("KS_INPUT", null), env("KS_OUTPUT", null), env("KS_DLQ", null));
    int partitions = Integer.parseInt(env("KS_PARTITIONS", "3"));
    Topology topology =
        switch (mode) {
          case "payments" -> Topologies.payments(names, partitions);
          case "entities" -> Topologies.entities(names, partitions);
          case "payments-keyed" -> Topologies.paymentsKeyed(names);
          default ->
              throw new IllegalArgumentException(
                  "KS_MODE must be payments, entities or payments-keyed, not " + mode);
        };

    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, env("KS_APP_ID", null));
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, env("KAFKA_BOOTSTRAP", "127.0.0.1:9092"));
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, env("KS_COMMIT_MS", "100"));
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
    p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, env("KS_CACHE_BYTES", String.valueOf(10 << 20)));
    p.put(StreamsConfig.STATE_DIR_CONFIG, env("KS_STATE_DIR", null));
    p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
    p.put(StreamsConfig.ROCKSDB_CONFIG_SETTER_CLASS_CONFIG, BoundedRocksDb.class);
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    // tally's transactional producer lingers 5 ms; Kafka Streams would otherwise use 100 ms.
    p.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), 5);

    KafkaStreams streams = new KafkaStreams(topology, p);
    CountDownLatch stopped = new CountDownLatch(1);
    AtomicBoolean failed = new AtomicBoolean(false);
    streams.setStateListener(
        (now, before) -> {
          if (now == KafkaStreams.State.RUNNING) {
            System.out.println("state RUNNING");
            System.out.flush();
          }
          if (now == KafkaStreams.State.ERROR) {
            failed.set(true);
            stopped.countDown();
          }
        });
    streams.setUncaughtExceptionHandler(
        e -> {
          e.printStackTrace();
          return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  streams.close(Duration.ofSeconds(30));
                  stopped.countDown();
                }));
    streams.start();
    stopped.await();
    if (failed.get()) {
      streams.close(Duration.ofSeconds(30));
      System.exit(1);
    }
  }

  static String env(String name, String fallback) {
    String v = System.getenv(name);
    if (v != null && !v.isEmpty()) {
      return v;
    }
    if (fallback == null) {
      throw new IllegalArgumentException("environment variable " + name + " is required");
    }
    return fallback;
  }
}
