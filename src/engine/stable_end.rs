//! The end a store catches up to: the partition's log end, once no transaction is open below it.
//!
//! A read_committed consumer's end (what `fetch_watermarks` answers it) is the last stable
//! offset: the first offset of the oldest transaction still open. Reading to it is not reading
//! everything committed when that transaction commits afterwards, which happens while a former
//! owner's commit has its markers still being written, and, for good, when the broker lost them
//! (Kafka's coordinator skips the markers of partitions that have no leader when it sends them,
//! as after a whole-cluster crash: see docs/chaos-runs.md, cause 6). A store restored to such an
//! end misses records whose input offsets are committed: the duplicates it was built to stop.
//! So the end is the log end as of the start, and the restore waits until every transaction
//! open below it has finished, committed or aborted.

use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use std::time::{Duration, Instant};

/// How long one offsets query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(15);
/// How often the last stable offset is asked for again while a transaction is open.
const RECHECK: Duration = Duration::from_millis(100);
/// After this long a wait is logged, once.
const WAIT_NOTICE: Duration = Duration::from_secs(5);

/// A partition's bounds as a read_committed reader may use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StableEnd {
    /// The first offset the partition still holds.
    pub low: i64,
    /// The log end as of the call; every transaction with records below it has finished.
    pub high: i64,
}

/// Waits (up to `limit`, calling `progress` while it waits, and giving up as soon as it returns
/// false: the instance is stopping) until no transaction is open below
/// the log end of `topic`/`partition` as of the call, and returns that end. `committed` is a
/// read_committed consumer; `config` its configuration, from which a read_uncommitted one is
/// made to learn the log end.
pub fn wait(
    committed: &BaseConsumer,
    config: &ClientConfig,
    topic: &str,
    partition: i32,
    limit: Duration,
    progress: &dyn Fn() -> bool,
) -> Result<StableEnd> {
    let mut waiting = Waiting::start(config, topic, partition, limit)?;
    loop {
        if let Some(end) = waiting.check(committed)? {
            return Ok(end);
        }
        if !progress() {
            bail!("stopping while waiting for a transaction open on `{topic}` partition {partition}");
        }
        std::thread::sleep(RECHECK);
    }
}

/// A wait for a partition's stable end, advanced one check at a time so that its caller can
/// do other work between checks (a stream thread polls its group consumer).
pub struct Waiting {
    topic: String,
    partition: i32,
    low: i64,
    log_end: i64,
    limit: Duration,
    started: Instant,
    noticed: bool,
    next_check: Instant,
}

impl Waiting {
    /// Reads the log end of `topic`/`partition` (see [`wait`] for the arguments).
    pub fn start(config: &ClientConfig, topic: &str, partition: i32, limit: Duration) -> Result<Self> {
        let mut uncommitted_config = config.clone();
        uncommitted_config.set("isolation.level", "read_uncommitted");
        let uncommitted: BaseConsumer = uncommitted_config
            .create()
            .context("cannot create a consumer to read the log end")?;
        let (low, log_end) = uncommitted
            .fetch_watermarks(topic, partition, QUERY_TIMEOUT)
            .with_context(|| format!("cannot read the log end of `{topic}` partition {partition}"))?;
        let now = Instant::now();
        Ok(Self {
            topic: topic.to_string(),
            partition,
            low,
            log_end,
            limit,
            started: now,
            noticed: false,
            next_check: now,
        })
    }

    /// The end once no transaction is open below it; `None` while one is, or when the last
    /// check was less than a recheck interval ago. Fails once the wait passes its limit.
    pub fn check(&mut self, committed: &BaseConsumer) -> Result<Option<StableEnd>> {
        let now = Instant::now();
        if now < self.next_check {
            return Ok(None);
        }
        self.next_check = now + RECHECK;
        let (topic, partition, log_end) = (self.topic.as_str(), self.partition, self.log_end);
        let (_, stable) = committed
            .fetch_watermarks(topic, partition, QUERY_TIMEOUT)
            .with_context(|| format!("cannot read the last stable offset of `{topic}` partition {partition}"))?;
        let waited = self.started.elapsed();
        if stable >= log_end {
            if self.noticed {
                tracing::info!(
                    topic,
                    partition,
                    waited_ms = waited.as_millis() as u64,
                    "the transactions open on the partition finished"
                );
            }
            return Ok(Some(StableEnd {
                low: self.low,
                high: log_end,
            }));
        }
        if waited >= self.limit {
            bail!(
                "`{topic}` partition {partition} has had a transaction open at offset {stable} \
                 (log end {log_end}) for {}s, longer than any live transaction lasts: a hanging \
                 transaction, whose markers the broker lost. Records past it may belong to \
                 committed work, so tally will not read around it. Find it with \
                 `kafka-transactions.sh --bootstrap-server <broker> find-hanging --broker-id <leader>`; \
                 aborting it drops its records, which docs/chaos-runs.md (cause 6) weighs",
                self.limit.as_secs()
            );
        }
        if !self.noticed && waited >= WAIT_NOTICE {
            self.noticed = true;
            tracing::warn!(
                topic,
                partition,
                last_stable_offset = stable,
                log_end,
                limit_s = self.limit.as_secs(),
                "a transaction is open on the partition; waiting for it to finish before reading to the end"
            );
        }
        Ok(None)
    }
}
