//! Deletes repartition-topic records below the committed offsets, as Kafka Streams does, so
//! repartition topics can keep unconsumed records forever without growing forever.

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

const INTERVAL: Duration = Duration::from_secs(30);

/// Collects committed repartition offsets and deletes below them every 30 s.
pub struct Purger {
    admin: Arc<AdminClient<DefaultClientContext>>,
    rt: Handle,
    committed: HashMap<(String, i32), i64>,
    last: Instant,
}

impl Purger {
    /// A purger using its own admin client; `rt` runs the delete requests in the background.
    pub fn new(config: &ClientConfig, rt: Handle) -> anyhow::Result<Self> {
        Ok(Self {
            admin: Arc::new(config.create()?),
            rt,
            committed: HashMap::new(),
            last: Instant::now(),
        })
    }

    /// Notes a committed offset of a repartition partition.
    pub fn committed(&mut self, topic: &str, partition: i32, next_offset: i64) {
        self.committed.insert((topic.to_string(), partition), next_offset);
    }

    /// Sends a delete request for everything noted, at most every 30 s. Failures only delay
    /// the purge, so they are logged, not raised.
    pub fn maybe_purge(&mut self) {
        if self.committed.is_empty() || self.last.elapsed() < INTERVAL {
            return;
        }
        self.last = Instant::now();
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offset) in self.committed.drain() {
            if let Err(e) = tpl.add_partition_offset(&topic, partition, Offset::Offset(offset)) {
                tracing::warn!(error = %e, topic, partition, "cannot purge repartition records");
            }
        }
        let request = self.admin.delete_records(&tpl, &AdminOptions::new());
        self.rt.spawn(async move {
            match request.await {
                Err(e) => tracing::warn!(error = %e, "purging consumed repartition records failed; will retry"),
                // The request succeeds as a whole while each partition may fail on its own (a
                // missing Delete ACL, for one), and the topic then grows for good.
                Ok(done) => {
                    for e in done.elements() {
                        if let Err(err) = e.error() {
                            let fix = match super::errors::code(&err) {
                                Some(RDKafkaErrorCode::TopicAuthorizationFailed) => {
                                    "; grant this principal Delete on the topics prefixed `<application_id>-` \
                                     (README.md, \"Secured clusters\")"
                                }
                                _ => "",
                            };
                            tracing::warn!(
                                topic = e.topic(),
                                partition = e.partition(),
                                error = %err,
                                "purging consumed repartition records failed; will retry{fix}"
                            );
                        }
                    }
                }
            }
        });
    }
}
