package tally.bench;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.charset.StandardCharsets;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Branched;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Named;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * tally's topologies/payments.yaml, topologies/entity-sync.yaml and topologies/payments-keyed.yaml
 * in the Kafka Streams DSL.
 *
 * <p>The first two re-key the input through a repartition topic, then run a processor over a persistent
 * (RocksDB, changelogged, cached) key-value store. Records tally would dead-letter (not JSON, not
 * an object, a missing or non-scalar key field, no matching event type, a non-integer version)
 * are sent to the DLQ topic before the repartition, with the new (null) key and no reason headers.
 */
final class Topologies {
  static final String IDEMPOTENCY_KEY_HEADER = "tally.idempotency_key";
  /** Route `ignore` of payments.yaml: keys are remembered for 30 days. */
  static final long RETENTION_MS = 30L * 24 * 3600 * 1000;

  record Names(String input, String output, String dlq) {}

  private Topologies() {}

  /** Repartition by payment_id, then pass the first record of each `{payment_id}:{status}`. */
  static Topology payments(Names n, int partitions) {
    StreamsBuilder b = new StreamsBuilder();
    b.addStateStore(
        Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore("dedup"), Serdes.String(), Serdes.Long())
            .withCachingEnabled());
    KStream<String, byte[]> keyed =
        b.stream(n.input(), Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
            .selectKey((k, v) -> paymentId(v));
    route(keyed, n, partitions, "payments", stream -> stream.process(Dedup::new, "dedup"));
    return b.build();
  }

  /**
   * topologies/payments-keyed.yaml: the input is already keyed by payment_id with the default
   * partitioner, so the idiomatic app has no repartition (one hop): invalid records go to the DLQ,
   * the rest through the same dedup processor and store.
   */
  static Topology paymentsKeyed(Names n) {
    StreamsBuilder b = new StreamsBuilder();
    b.addStateStore(
        Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore("dedup"), Serdes.String(), Serdes.Long())
            .withCachingEnabled());
    Produced<String, byte[]> produced = Produced.with(Serdes.String(), Serdes.ByteArray());
    b.stream(n.input(), Consumed.with(Serdes.String(), Serdes.ByteArray()))
        .split(Named.as("payments-"))
        .branch(
            (k, v) -> paymentId(v) == null,
            Branched.withConsumer(bad -> bad.to(n.dlq(), produced), "invalid"))
        .defaultBranch(
            Branched.withConsumer(
                ok -> ok.process(Dedup::new, "dedup").to(n.output(), produced), "valid"));
    return b.build();
  }

  /** Repartition by entity, then pass only a version higher than the entity's last one. */
  static Topology entities(Names n, int partitions) {
    StreamsBuilder b = new StreamsBuilder();
    b.addStateStore(
        Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore("versions"), Serdes.String(), Serdes.Long())
            .withCachingEnabled());
    KStream<String, byte[]> keyed =
        b.stream(n.input(), Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
            .selectKey((k, v) -> entity(v));
    route(keyed, n, partitions, "entities", stream -> stream.process(VersionGate::new, "versions"));
    return b.build();
  }

  private static void route(
      KStream<String, byte[]> keyed,
      Names n,
      int partitions,
      String name,
      java.util.function.Function<KStream<String, byte[]>, KStream<String, byte[]>> stateful) {
    Produced<String, byte[]> produced = Produced.with(Serdes.String(), Serdes.ByteArray());
    keyed
        .split(Named.as(name + "-"))
        .branch((k, v) -> k == null, Branched.withConsumer(bad -> bad.to(n.dlq(), produced), "invalid"))
        .defaultBranch(
            Branched.withConsumer(
                ok ->
                    stateful
                        .apply(
                            ok.repartition(
                                Repartitioned.with(Serdes.String(), Serdes.ByteArray())
                                    .withName(name)
                                    .withNumberOfPartitions(partitions)))
                        .to(n.output(), produced),
                "valid"));
  }

  /** The payment id of a valid payment event, or null when tally would dead-letter it. */
  static String paymentId(byte[] value) {
    JsonNode doc = Json.object(value);
    if (doc == null || !doc.path("event_type").asText("").startsWith("payment.")) {
      return null;
    }
    String id = Json.scalar(doc, "payment_id");
    return id != null && Json.scalar(doc, "status") != null ? id : null;
  }

  /** `{entity_type}:{entity_id}` of a valid entity update, or null when tally would dead-letter it. */
  static String entity(byte[] value) {
    JsonNode doc = Json.object(value);
    if (doc == null || !"entity.updated".equals(doc.path("event_type").asText(null))) {
      return null;
    }
    String type = Json.scalar(doc, "entity_type");
    String id = Json.scalar(doc, "entity_id");
    return type != null && id != null && version(doc) != null ? type + ":" + id : null;
  }

  static Long version(JsonNode doc) {
    String text = Json.scalar(doc, "version");
    if (text == null) {
      return null;
    }
    try {
      return Long.parseLong(text.trim());
    } catch (NumberFormatException e) {
      return null;
    }
  }

  static Record<String, byte[]> withKeyHeader(Record<String, byte[]> r, String key) {
    RecordHeaders headers = new RecordHeaders(r.headers().toArray());
    headers.add(IDEMPOTENCY_KEY_HEADER, key.getBytes(StandardCharsets.UTF_8));
    return r.withHeaders(headers);
  }

  /** The `ignore` strategy: the first record of a business key passes, repeats are dropped. */
  static final class Dedup implements Processor<String, byte[], String, byte[]> {
    private ProcessorContext<String, byte[]> ctx;
    private KeyValueStore<String, Long> seen;

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
      ctx = context;
      seen = context.getStateStore("dedup");
    }

    @Override
    public void process(Record<String, byte[]> r) {
      JsonNode doc = Json.object(r.value());
      String key = r.key() + ":" + Json.scalar(doc, "status");
      long now = System.currentTimeMillis();
      Long first = seen.get(key);
      if (first != null && now - first < RETENTION_MS) {
        return;
      }
      seen.put(key, now);
      ctx.forward(withKeyHeader(r, key));
    }
  }

  /** The `overwrite` strategy: only a strictly higher version per entity passes. */
  static final class VersionGate implements Processor<String, byte[], String, byte[]> {
    private ProcessorContext<String, byte[]> ctx;
    private KeyValueStore<String, Long> versions;

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
      ctx = context;
      versions = context.getStateStore("versions");
    }

    @Override
    public void process(Record<String, byte[]> r) {
      long version = version(Json.object(r.value()));
      Long current = versions.get(r.key());
      if (current != null && version <= current) {
        return;
      }
      versions.put(r.key(), version);
      ctx.forward(withKeyHeader(r, r.key() + ":v" + version));
    }
  }
}
