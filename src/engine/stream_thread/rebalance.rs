//! The stream thread's consumer context: the rebalance callbacks, which run on the stream
//! thread inside `poll`, and the statistics that carry the consumer lag and the holds of open
//! transactions.

use super::opening::Opening;
use super::ThreadState;
use crate::engine::errors::EngineError;
use crate::engine::member_id;
use crate::metrics::client_statistics::Statistics;
use crate::metrics::consumer_lag::ConsumerLag;
use crate::metrics::held_back::HeldBack;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::ClientContext;
use std::sync::Mutex;
use std::time::Instant;

/// Consumer context: rebalance callbacks run on the stream thread, inside `poll`.
pub(super) struct StreamContext {
    pub(super) state: Mutex<ThreadState>,
    pub(super) lag: ConsumerLag,
    pub(super) held_back: HeldBack,
}

impl ClientContext for StreamContext {
    /// librdkafka's statistics (every `statistics.interval.ms`) carry the consumer lag and
    /// each partition's last stable offset.
    fn stats_raw(&self, statistics: &[u8]) {
        if let Some(stats) = Statistics::parse(statistics) {
            self.lag.update(&stats);
            self.held_back.update(&stats, Instant::now());
        }
    }
}

impl ConsumerContext for StreamContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        st.cfg.metrics.rebalances.inc();
        match rebalance {
            Rebalance::Revoke(tpl) => {
                // The revoked tasks' work must be committed (or aborted) before they go. Lost
                // partitions (the member was dropped from the group) may already be processed
                // by their new owner: never commit for them (the protocol's `revoke`).
                if let Err(e) = st.revoke(consumer, consumer.assignment_lost()) {
                    st.membership.end(e);
                }
                for el in tpl.elements() {
                    let key = (el.topic().to_string(), el.partition());
                    if let Some(next) = st.txn.position(&key) {
                        tracing::info!(
                            topic = el.topic(),
                            partition = el.partition(),
                            next,
                            lost = consumer.assignment_lost(),
                            "partition revoked; this thread had read up to here (committed unless lost)"
                        );
                    }
                    st.txn.forget(&key);
                    if st.tasks.remove(&key).is_some() {
                        tracing::info!(topic = el.topic(), partition = el.partition(), "task closed (revoked)");
                    }
                    if let Some(i) = st.opening.iter().position(|o| o.key == key) {
                        let opening = st.opening.swap_remove(i);
                        st.cfg.health.restoring(-1);
                        // librdkafka keeps a partition's pause across assignments: one paused
                        // here would not fetch when assigned again.
                        if opening.skipped_from.is_some() {
                            if let Err(e) = super::set_paused(consumer, &key, false) {
                                tracing::warn!(topic = el.topic(), partition = el.partition(), error = %e, "could not resume a revoked partition paused while its task was opening");
                            }
                        }
                    }
                }
            }
            Rebalance::Assign(tpl) => {
                let member = member_id::of(consumer);
                if member != st.member && (!st.tasks.is_empty() || !st.opening.is_empty()) {
                    // librdkafka kept the partitions over a rejoin under a new member id: the
                    // group may have given them to another member meanwhile (see member_id.rs).
                    tracing::warn!(
                        previous = %st.member,
                        member = %member,
                        "rejoined the group under a new member id with partitions still assigned; treating them as lost"
                    );
                    let lost = EngineError::migrated("member id changed with partitions still assigned");
                    st.poison(consumer, &lost);
                    st.membership.end(lost);
                }
                st.member = member;
                let parts: Vec<String> = tpl
                    .elements()
                    .iter()
                    .map(|e| format!("{}[{}]", e.topic(), e.partition()))
                    .collect();
                tracing::info!(partitions = %parts.join(","), "partitions assigned");
                // Tasks open and restore between the next polls; a partition that hands out a
                // record before its task is ready is paused then (`ThreadState::process`).
                for el in tpl.elements() {
                    let key = (el.topic().to_string(), el.partition());
                    if st.tasks.contains_key(&key) || st.opening.iter().any(|o| o.key == key) {
                        continue;
                    }
                    match Opening::new(&st.cfg, el.topic(), el.partition()) {
                        Ok(opening) => {
                            st.opening.push(opening);
                            st.cfg.health.restoring(1);
                        }
                        Err(e) => {
                            st.membership.end(e);
                        }
                    }
                }
                if st.membership.assigned() {
                    st.joined = true;
                    st.cfg.health.thread_joined(true);
                }
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
        }
    }
}
