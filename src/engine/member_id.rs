//! The consumer's group member id, which rdkafka does not expose.
//!
//! librdkafka 2.12 rejoins a cooperative group under a new member id when its JoinGroup is
//! answered UNKNOWN_MEMBER_ID (the coordinator dropped the member while it was frozen) without
//! treating its assignment as lost (`rd_kafka_cgrp_handle_JoinGroup` revokes everything only
//! for ILLEGAL_GENERATION and MEMBER_ID_REQUIRED). The partitions it held stay assigned at the
//! positions it had reached, and it claims them as owned in the next generation although another
//! member has processed and committed them since. The stream thread compares the member id its
//! tasks were assigned under with the current one (cause 7 of docs/chaos-runs.md).

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use std::ffi::CStr;

/// The consumer's current member id (empty while it has none).
pub fn of<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> String {
    let rk = consumer.client().native_ptr();
    // SAFETY: `rk` is the live client handle behind `consumer`; librdkafka returns a copy of the
    // member id (or null), which is freed below with the handle's allocator.
    let id = unsafe { rdsys::rd_kafka_memberid(rk) };
    if id.is_null() {
        return String::new();
    }
    // SAFETY: a non-null result is a NUL-terminated string owned by the caller.
    let member = unsafe { CStr::from_ptr(id) }.to_string_lossy().into_owned();
    // SAFETY: `id` came from librdkafka for `rk` and is freed once.
    unsafe { rdsys::rd_kafka_mem_free(rk, id.cast()) };
    member
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::mocking::MockCluster;
    use rdkafka::ClientConfig;
    use std::time::{Duration, Instant};

    // librdkafka's mock cluster runs the group protocol, which is all this needs.
    #[test]
    fn a_member_id_is_empty_before_joining_and_the_coordinators_after() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("t", 1, 1).expect("topic");
        let bootstrap = cluster.bootstrap_servers();
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", "g")
            .create()
            .expect("consumer");
        assert_eq!(of(&consumer), "");
        consumer.subscribe(&["t"]).expect("subscribe");
        let deadline = Instant::now() + Duration::from_secs(20);
        while consumer.assignment().map_or(0, |a| a.count()) == 0 {
            assert!(Instant::now() < deadline, "joined the group");
            consumer.poll(Duration::from_millis(100));
        }
        let member = of(&consumer);
        assert!(!member.is_empty(), "a member id once in the group");
        assert_eq!(of(&consumer), member, "stable while the membership lasts");
    }
}
