//! Partitions nobody owns: found in the group coordinator's view, repaired by making one member
//! leave and rejoin the group.
//!
//! Kafka's classic group protocol can strand partitions under cooperative rebalancing. A member
//! that gives partitions up in the first round and dies before its second JoinGroup, then comes
//! back with the same `group.instance.id` within the session timeout, is handed its reduced
//! assignment without a rebalance (static membership), so the follow-up round that would assign
//! the given-up partitions never happens and nothing in the protocol notices. Kafka Streams
//! recovers from such states with periodic probing rebalances; tally looks for them instead: when
//! partitions stay unowned in a stable group for a grace period, the member owning the fewest
//! partitions (the cheapest to move) leaves and rejoins, which makes the coordinator rebalance.

use super::clients;
use super::membership::{decode_assignment, member_of, Partition};
use super::Shutdown;
use crate::metrics::Metrics;
use crate::topology::Topology;
use anyhow::{Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHECK_EVERY: Duration = Duration::from_secs(5);
/// How long partitions must stay unowned in a stable group before a member rejoins: well past
/// the pause between the two rounds of a healthy cooperative rebalance, in which the revoking
/// member commits its transaction and closes its tasks.
const GRACE: Duration = Duration::from_secs(20);
/// After a forced rejoin, time for the rebalances it causes to settle before judging again.
const COOLDOWN: Duration = Duration::from_secs(60);
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// Rejoin requests for this instance's stream threads, by thread index.
pub struct RejoinRequests(Vec<AtomicBool>);

impl RejoinRequests {
    /// No requests, for `threads` stream threads.
    pub fn new(threads: usize) -> Self {
        Self((0..threads).map(|_| AtomicBool::new(false)).collect())
    }

    /// Asks stream thread `thread` to leave and rejoin the group.
    pub fn request(&self, thread: usize) {
        if let Some(flag) = self.0.get(thread) {
            flag.store(true, Ordering::SeqCst);
        }
    }

    /// True (once) when stream thread `thread` was asked to rejoin.
    pub fn take(&self, thread: usize) -> bool {
        self.0.get(thread).is_some_and(|f| f.swap(false, Ordering::SeqCst))
    }
}

/// One look at the group: whether it is stable, what each member owns, what there is to own.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The coordinator reports the group `Stable` (no rebalance under way).
    pub stable: bool,
    /// Client id and assigned partitions of each member.
    pub members: Vec<(String, Vec<Partition>)>,
    /// Every partition of the consumed topics.
    pub partitions: BTreeSet<Partition>,
}

impl Snapshot {
    /// Partitions no member owns.
    pub fn unowned(&self) -> BTreeSet<Partition> {
        let owned: BTreeSet<&Partition> = self.members.iter().flat_map(|(_, ps)| ps).collect();
        self.partitions.iter().filter(|p| !owned.contains(p)).cloned().collect()
    }
}

/// Decides from successive snapshots when which member must rejoin. Every instance judges the
/// same coordinator view the same way, so they agree on the member without talking.
#[derive(Default)]
pub struct Judge {
    /// Partitions unowned in every stable snapshot since the instant.
    stranded: Option<(BTreeSet<Partition>, Instant)>,
    last_rejoin: Option<Instant>,
}

impl Judge {
    /// The client id of the tally member of `application_id` that should rejoin now, if some
    /// partitions have stayed unowned in a stable group for the grace period.
    pub fn observe(&mut self, application_id: &str, snap: &Snapshot, now: Instant) -> Option<String> {
        let unowned = snap.unowned();
        if !snap.stable || unowned.is_empty() {
            self.stranded = None;
            return None;
        }
        let since = match self.stranded.take() {
            Some((before, since)) => {
                let still: BTreeSet<Partition> = before.intersection(&unowned).cloned().collect();
                if still.is_empty() {
                    (unowned, now)
                } else {
                    (still, since)
                }
            }
            None => (unowned, now),
        };
        let waited = now.duration_since(since.1);
        self.stranded = Some(since);
        let cooling = self.last_rejoin.is_some_and(|t| now.duration_since(t) < COOLDOWN);
        if waited < GRACE || cooling {
            return None;
        }
        let chosen = snap
            .members
            .iter()
            .filter(|(client, _)| member_of(application_id, client).is_some())
            .min_by(|a, b| (a.1.len(), &a.0).cmp(&(b.1.len(), &b.0)))
            .map(|(client, _)| client.clone())?;
        self.stranded = None;
        self.last_rejoin = Some(now);
        Some(chosen)
    }

    /// The partitions currently judged stranded, for the log.
    fn stranded(&self) -> Vec<String> {
        self.stranded
            .iter()
            .flat_map(|(ps, _)| ps)
            .map(|(t, p)| format!("{t}[{p}]"))
            .collect()
    }
}

/// What the group watch works with.
pub struct Watch {
    /// The running topology.
    pub topology: Arc<Topology>,
    /// This instance's id.
    pub instance_id: String,
    /// Where it asks this instance's stream threads to rejoin.
    pub requests: Arc<RejoinRequests>,
    /// The unowned-partition gauge and rejoin counter.
    pub metrics: Arc<Metrics>,
    /// Where each look at the group is shared with the query API, which routes by it.
    pub queries: Arc<crate::queries::Shared>,
    /// The instance's stop request.
    pub shutdown: Shutdown,
}

/// Watches the group until shutdown and asks this instance's stream threads to rejoin when the
/// judge picks one of them. A failed look (broker away, group not yet created) is skipped.
pub fn run(w: Watch) {
    let Watch {
        topology,
        instance_id,
        requests,
        metrics,
        queries,
        shutdown,
    } = w;
    let consumer: BaseConsumer = match clients::restore_consumer(&topology).create() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot create the group watch client; unowned partitions will not be repaired");
            return;
        }
    };
    let app = topology.application_id.as_str();
    let mut judge = Judge::default();
    while !shutdown.wait(CHECK_EVERY) {
        let snap = match snapshot(&topology, &consumer) {
            Ok(Some(s)) => s,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(error = %format!("{e:#}"), "group watch: no view of the group this time");
                continue;
            }
        };
        queries.saw_group(app, &snap);
        if snap.stable {
            metrics.unowned_partitions.set(snap.unowned().len() as i64);
        }
        let before = judge.stranded();
        let Some(client) = judge.observe(app, &snap, Instant::now()) else {
            continue;
        };
        if let Some((instance, thread)) = member_of(app, &client) {
            if instance == instance_id {
                tracing::warn!(
                    thread,
                    partitions = %before.join(","),
                    "partitions have had no owner in the stable group for {}s: this thread leaves and rejoins the group to force a rebalance",
                    GRACE.as_secs()
                );
                metrics.forced_rejoins.inc();
                requests.request(thread);
            }
        }
    }
}

/// The coordinator's view of the group and the partitions of the consumed topics; `None` when a
/// member's assignment cannot be read (the view would be incomplete).
fn snapshot(t: &Topology, consumer: &BaseConsumer) -> Result<Option<Snapshot>> {
    let list = consumer
        .fetch_group_list(Some(&t.application_id), KAFKA_TIMEOUT)
        .context("describing the consumer group")?;
    let Some(group) = list.groups().iter().find(|g| g.name() == t.application_id) else {
        return Ok(None);
    };
    let mut snap = Snapshot {
        stable: group.state() == "Stable",
        ..Snapshot::default()
    };
    for m in group.members() {
        let owned = match m.assignment() {
            None | Some([]) => Vec::new(),
            Some(bytes) => match decode_assignment(bytes) {
                Some(ps) => ps,
                None => return Ok(None),
            },
        };
        snap.members.push((m.client_id().to_string(), owned));
    }
    for topic in t.consumed_topics() {
        let md = consumer
            .fetch_metadata(Some(topic), KAFKA_TIMEOUT)
            .with_context(|| format!("reading the metadata of {topic}"))?;
        let Some(tm) = md.topics().iter().find(|m| m.name() == topic && m.error().is_none()) else {
            return Ok(None);
        };
        snap.partitions
            .extend(tm.partitions().iter().map(|p| (topic.to_string(), p.id())));
    }
    Ok(Some(snap))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(ps: &[i32]) -> Vec<Partition> {
        ps.iter().map(|p| ("in".to_string(), *p)).collect()
    }

    fn snap(stable: bool, members: &[(&str, &[i32])]) -> Snapshot {
        Snapshot {
            stable,
            members: members.iter().map(|(c, ps)| (c.to_string(), parts(ps))).collect(),
            partitions: parts(&[0, 1, 2, 3, 4, 5]).into_iter().collect(),
        }
    }

    #[test]
    fn stranded_partitions_make_the_least_loaded_tally_member_rejoin_after_the_grace() {
        let mut j = Judge::default();
        let t0 = Instant::now();
        let s = snap(
            true,
            &[
                ("app-c1-0", &[0, 1, 2]),
                ("app-c2-0", &[]),
                ("app-c3-0", &[]),
                ("other", &[]),
            ],
        );
        assert_eq!(s.unowned().len(), 3);
        assert_eq!(j.observe("app", &s, t0), None, "first sight: wait");
        assert_eq!(j.observe("app", &s, t0 + GRACE / 2), None);
        assert_eq!(
            j.observe("app", &s, t0 + GRACE),
            Some("app-c2-0".to_string()),
            "fewest partitions, then lowest client id; never a non-tally member"
        );
        assert_eq!(
            j.observe("app", &s, t0 + GRACE * 2),
            None,
            "cooling down after a rejoin"
        );
        assert_eq!(
            j.observe("app", &s, t0 + GRACE + COOLDOWN),
            Some("app-c2-0".to_string()),
            "still stranded after the cool-down: again"
        );
    }

    #[test]
    fn rebalancing_owned_or_moving_partitions_are_left_alone() {
        let t0 = Instant::now();
        let mut j = Judge::default();
        let full = snap(true, &[("app-a-0", &[0, 1, 2]), ("app-b-0", &[3, 4, 5])]);
        assert!(full.unowned().is_empty());
        assert_eq!(j.observe("app", &full, t0), None);
        assert_eq!(j.observe("app", &full, t0 + GRACE * 3), None, "nothing unowned");

        let mut j = Judge::default();
        let moving = snap(false, &[("app-a-0", &[0])]);
        assert_eq!(j.observe("app", &moving, t0), None);
        assert_eq!(
            j.observe("app", &moving, t0 + GRACE * 3),
            None,
            "not stable: a rebalance is under way"
        );

        // Different partitions unowned each time (a healthy group moving work): the clock restarts.
        let mut j = Judge::default();
        let a = snap(true, &[("app-a-0", &[0, 1, 2, 3, 4])]);
        let b = snap(true, &[("app-a-0", &[1, 2, 3, 4, 5])]);
        assert_eq!(j.observe("app", &a, t0), None);
        assert_eq!(j.observe("app", &b, t0 + GRACE), None, "partition 5 was owned before");
        assert_eq!(j.observe("app", &b, t0 + GRACE * 2), Some("app-a-0".to_string()));

        let mut j = Judge::default();
        let strangers = snap(true, &[("other-0", &[0])]);
        assert_eq!(j.observe("app", &strangers, t0), None);
        assert_eq!(
            j.observe("app", &strangers, t0 + GRACE),
            None,
            "no tally member to move"
        );
    }

    #[test]
    fn rejoin_requests_are_taken_once_and_ignore_unknown_threads() {
        let r = RejoinRequests::new(2);
        r.request(1);
        r.request(7);
        assert!(!r.take(0));
        assert!(r.take(1));
        assert!(!r.take(1));
        assert!(!r.take(7));
    }
}
