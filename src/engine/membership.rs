//! Who in the consumer group owns which partition, read from the group coordinator: the input
//! to standby placement, which librdkafka's assignors know nothing about.

use std::collections::{BTreeMap, BTreeSet};

/// A topic partition.
pub type Partition = (String, i32);

/// The group's members by instance, and the instance that owns each assigned partition.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GroupView {
    /// Instances with at least one member in the group.
    pub instances: BTreeSet<String>,
    /// Owner instance of each assigned partition.
    pub owners: BTreeMap<Partition, String>,
}

impl GroupView {
    /// Builds the view from `(client_id, assignment bytes)` of each member. Client ids are
    /// `<application_id>-<instance>-<thread>`; members whose id does not have that form (not
    /// tally) or whose assignment cannot be decoded are left out.
    pub fn from_members<'a>(
        application_id: &str,
        members: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
    ) -> Self {
        let mut view = Self::default();
        for (client_id, assignment) in members {
            let Some(instance) = instance_of(application_id, client_id) else {
                continue;
            };
            view.instances.insert(instance.to_string());
            for p in assignment.and_then(decode_assignment).unwrap_or_default() {
                view.owners.insert(p, instance.to_string());
            }
        }
        view
    }

    /// The instances that keep a standby copy of `task`: the `replicas` best-ranked instances
    /// other than its owner. Every instance computes the same answer from the same view.
    pub fn standbys_of(&self, task: &Partition, replicas: usize) -> Vec<&str> {
        let Some(owner) = self.owners.get(task) else {
            return Vec::new();
        };
        let mut ranked: Vec<(u64, &str)> = self
            .instances
            .iter()
            .filter(|i| *i != owner)
            .map(|i| (rank(task, i), i.as_str()))
            .collect();
        ranked.sort_unstable_by(|a, b| b.cmp(a));
        ranked.into_iter().take(replicas).map(|(_, i)| i).collect()
    }
}

/// The instance part of a stream thread's client id `<application_id>-<instance>-<thread>`.
pub fn instance_of<'a>(application_id: &str, client_id: &'a str) -> Option<&'a str> {
    member_of(application_id, client_id).map(|(instance, _)| instance)
}

/// The instance and thread index of a stream thread's client id `<application_id>-<instance>-<thread>`.
pub fn member_of<'a>(application_id: &str, client_id: &'a str) -> Option<(&'a str, usize)> {
    let rest = client_id.strip_prefix(application_id)?.strip_prefix('-')?;
    let (instance, thread) = rest.rsplit_once('-')?;
    if instance.is_empty() || !thread.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((instance, thread.parse().ok()?))
}

/// Rendezvous (highest-random-weight) rank: stable per (task, instance), so adding or removing
/// one instance moves only the standbys it gains or held.
fn rank(task: &Partition, instance: &str) -> u64 {
    // FNV-1a: fixed across processes and Rust versions, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = task
        .0
        .bytes()
        .chain([0])
        .chain(task.1.to_be_bytes())
        .chain(instance.bytes());
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Decodes a consumer-protocol assignment (`version: i16`, `[topic: string, [partition: i32]]`,
/// `user_data: bytes`), the form the group coordinator returns for classic-protocol members.
pub fn decode_assignment(bytes: &[u8]) -> Option<Vec<Partition>> {
    let mut r = Reader(bytes);
    let _version = r.i16()?;
    let topics = r.count()?;
    let mut out = Vec::new();
    for _ in 0..topics {
        let len = usize::try_from(r.i16()?).ok()?;
        let topic = std::str::from_utf8(r.take(len)?).ok()?.to_string();
        let partitions = r.count()?;
        for _ in 0..partitions {
            out.push((topic.clone(), r.i32()?));
        }
    }
    Some(out)
}

/// A bounds-checked big-endian reader.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    /// An array length; a negative (null) array counts as empty. Each element takes at least
    /// 4 bytes, so a length the remaining bytes cannot hold is rejected before any allocation.
    fn count(&mut self) -> Option<usize> {
        let n = usize::try_from(self.i32()?.max(0)).ok()?;
        (n <= self.0.len() / 4 + 1).then_some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(parts: &[(&str, &[i32])]) -> Vec<u8> {
        let mut b = 1i16.to_be_bytes().to_vec();
        b.extend((parts.len() as i32).to_be_bytes());
        for (topic, ps) in parts {
            b.extend((topic.len() as i16).to_be_bytes());
            b.extend(topic.as_bytes());
            b.extend((ps.len() as i32).to_be_bytes());
            ps.iter().for_each(|p| b.extend(p.to_be_bytes()));
        }
        b.extend((-1i32).to_be_bytes());
        b
    }

    #[test]
    fn assignments_decode_and_garbage_does_not() {
        let bytes = encode(&[("in", &[0, 2]), ("app-rep", &[1])]);
        assert_eq!(
            decode_assignment(&bytes),
            Some(vec![("in".into(), 0), ("in".into(), 2), ("app-rep".into(), 1)])
        );
        assert_eq!(decode_assignment(&bytes[..9]), None);
        assert_eq!(
            decode_assignment(&[0, 1, 0x7f, 0xff, 0xff, 0xff]),
            None,
            "huge count rejected"
        );
    }

    #[test]
    fn instance_names_come_from_client_ids() {
        assert_eq!(instance_of("pay", "pay-node-1-0"), Some("node-1"));
        assert_eq!(instance_of("pay", "pay-a-12"), Some("a"));
        assert_eq!(instance_of("pay", "other-a-1"), None);
        assert_eq!(instance_of("pay", "pay-a-x"), None);
        assert_eq!(instance_of("pay", "pay-a-"), None);
        assert_eq!(member_of("pay", "pay-node-1-3"), Some(("node-1", 3)));
    }

    #[test]
    fn standbys_avoid_the_owner_are_stable_and_spread() {
        let a = encode(&[("in", &[0, 1, 2])]);
        let b = encode(&[("in", &[3, 4, 5])]);
        let members = [("app-a-0", Some(&a[..])), ("app-b-0", Some(&b[..])), ("app-c-0", None)];
        let view = GroupView::from_members("app", members);
        assert_eq!(view.instances.len(), 3);
        let mut load: BTreeMap<&str, usize> = BTreeMap::new();
        for p in 0..6 {
            let task = ("in".to_string(), p);
            let owner = view.owners[&task].clone();
            let sb = view.standbys_of(&task, 1);
            assert_eq!(sb.len(), 1);
            assert_ne!(sb[0], owner, "never on the owner");
            assert_eq!(sb, view.standbys_of(&task, 1), "deterministic");
            assert_eq!(view.standbys_of(&task, 5).len(), 2, "at most every other instance");
            *load.entry(sb[0]).or_default() += 1;
        }
        assert!(load.len() >= 2, "standbys spread over instances: {load:?}");
        assert!(
            view.standbys_of(&("in".into(), 9), 1).is_empty(),
            "unassigned task: none"
        );
    }
}
