//! Interactive queries (Kafka Streams' name): read-only lookups of one key in the stores of the
//! running instances, answered by the instance whose task owns the key's partition or redirected
//! to it. This module holds what the engine shares with the HTTP endpoints (src/http/queries.rs):
//! the task databases it serves and the group's assignment as the group watch last saw it.

pub mod keys;
pub mod routing;

use crate::engine::group_watch::Snapshot;
use crate::engine::membership::{member_of, GroupView, Partition};
use crate::store::Published;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A view of the group older than this is not trusted to route a query (the watch looks every
/// few seconds; an older view means it cannot reach the cluster).
pub const VIEW_MAX_AGE: Duration = Duration::from_secs(30);

/// What the engine shares with the query endpoints.
#[derive(Default)]
pub struct Shared {
    /// The task databases served here.
    pub stores: Arc<Published>,
    group: Mutex<Option<Seen>>,
}

/// The group as the group watch last saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Owner instance of each assigned partition.
    pub view: GroupView,
    /// Partition count of each consumed topic.
    pub partitions: BTreeMap<String, i32>,
    /// When it was seen.
    pub at: Instant,
}

impl Seen {
    /// The owner of each partition of `topic` that has one.
    pub fn owners_of(&self, topic: &str) -> BTreeMap<i32, String> {
        self.view
            .owners
            .iter()
            .filter(|((t, _), _)| t == topic)
            .map(|((_, p), owner)| (*p, owner.clone()))
            .collect()
    }
}

impl Shared {
    /// Records a look at the group (the group watch calls it after each).
    pub fn saw_group(&self, application_id: &str, snap: &Snapshot) {
        let mut view = GroupView::default();
        for (client, owned) in &snap.members {
            let Some((instance, _)) = member_of(application_id, client) else {
                continue;
            };
            view.instances.insert(instance.to_string());
            for p in owned {
                view.owners.insert(p.clone(), instance.to_string());
            }
        }
        let mut partitions: BTreeMap<String, i32> = BTreeMap::new();
        let all: &BTreeSet<Partition> = &snap.partitions;
        for (topic, _) in all {
            *partitions.entry(topic.clone()).or_default() += 1;
        }
        let seen = Seen {
            view,
            partitions,
            at: Instant::now(),
        };
        *self.group.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(seen);
    }

    /// The last view of the group, unless it is older than [`VIEW_MAX_AGE`].
    pub fn group(&self) -> Option<Seen> {
        let seen = self.group.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.as_ref().filter(|s| s.at.elapsed() <= VIEW_MAX_AGE).cloned()
    }
}
