//! The values of a task's last few commits, kept in memory: a key written again soon (an
//! entity's next version, a merge's next increment) is read without RocksDB's memtable search,
//! which a profile of `entities-256B-10k` put at 7% of tally's CPU (docs/performance.md), as
//! Kafka Streams' caching store serves hot keys.
//!
//! A commit hands over its overlay whole (no copy); reads look through the generations newest
//! first. Memory is bounded per instance: every task store charges one shared budget and drops
//! its own oldest generations while the instance is over it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Committed generations one task keeps at most: a read that finds its key in none of them
/// looks in each, so this bounds what a key never written recently costs.
const GENERATIONS: usize = 4;

/// What an entry is charged beyond its key and value bytes (map slot, two allocations).
pub(super) const ENTRY_OVERHEAD: usize = 64;

/// A transaction's write of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Write {
    /// The value; `None` is a delete.
    pub value: Option<Vec<u8>>,
    /// True once the changelog record of this value was sent.
    pub logged: bool,
}

/// One transaction's writes of one store, the last per key.
pub(super) type Writes = HashMap<Vec<u8>, Write>;

/// The bytes every task store of an instance may keep in recent generations together.
#[derive(Debug)]
pub struct RecentBudget {
    limit: usize,
    used: AtomicUsize,
}

impl RecentBudget {
    /// A budget of `limit` bytes (0 keeps nothing).
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes held now, by every task store.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.used() > self.limit
    }
}

struct Generation {
    stores: Vec<Writes>,
    bytes: usize,
}

/// One task store's recent generations.
pub(super) struct Recent {
    generations: VecDeque<Generation>,
    budget: Arc<RecentBudget>,
}

impl Recent {
    /// Nothing kept yet; memory charged to `budget`.
    pub(super) fn new(budget: Arc<RecentBudget>) -> Self {
        Self {
            generations: VecDeque::with_capacity(GENERATIONS + 1),
            budget,
        }
    }

    /// The newest committed value of `key` in store `store` that a recent generation holds:
    /// `Some(None)` is a committed delete, `None` means ask the database.
    pub(super) fn get(&self, store: usize, key: &[u8]) -> Option<Option<&[u8]>> {
        self.generations
            .iter()
            .find_map(|g| g.stores.get(store)?.get(key))
            .map(|w| w.value.as_deref())
    }

    /// Keeps a commit's writes (`bytes` as charged), dropping the oldest generations beyond
    /// [`GENERATIONS`] or while the instance is over its budget.
    pub(super) fn push(&mut self, stores: Vec<Writes>, bytes: usize) {
        self.budget.used.fetch_add(bytes, Ordering::Relaxed);
        self.generations.push_front(Generation { stores, bytes });
        while self.generations.len() > GENERATIONS || (self.budget.over() && !self.generations.is_empty()) {
            self.drop_oldest();
        }
    }

    /// Forgets every recent value of store `store` (its data was replaced underneath: a wipe,
    /// a restore).
    pub(super) fn forget(&mut self, store: usize) {
        for g in &mut self.generations {
            if let Some(writes) = g.stores.get_mut(store) {
                writes.clear();
            }
        }
    }

    fn drop_oldest(&mut self) {
        if let Some(g) = self.generations.pop_back() {
            self.budget.used.fetch_sub(g.bytes, Ordering::Relaxed);
        }
    }
}

impl Drop for Recent {
    fn drop(&mut self) {
        while !self.generations.is_empty() {
            self.drop_oldest();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(entries: &[(&[u8], Option<&[u8]>)]) -> Vec<Writes> {
        vec![entries
            .iter()
            .map(|(k, v)| {
                let value = v.map(<[u8]>::to_vec);
                (k.to_vec(), Write { value, logged: true })
            })
            .collect()]
    }

    #[test]
    fn the_newest_generation_holding_a_key_answers() {
        let mut r = Recent::new(RecentBudget::new(1 << 20));
        r.push(writes(&[(b"a", Some(b"1")), (b"b", Some(b"1"))]), 10);
        r.push(writes(&[(b"a", Some(b"2")), (b"c", None)]), 10);
        assert_eq!(r.get(0, b"a"), Some(Some(&b"2"[..])));
        assert_eq!(r.get(0, b"b"), Some(Some(&b"1"[..])));
        assert_eq!(r.get(0, b"c"), Some(None), "a committed delete answers too");
        assert_eq!(r.get(0, b"d"), None);
        assert_eq!(r.get(1, b"a"), None, "another store");
    }

    #[test]
    fn at_most_four_generations_are_kept() {
        let mut r = Recent::new(RecentBudget::new(1 << 20));
        for i in 0..6u8 {
            r.push(writes(&[(&[i], Some(b"v"))]), 10);
        }
        assert_eq!(r.get(0, &[0]), None);
        assert_eq!(r.get(0, &[1]), None);
        assert!(r.get(0, &[2]).is_some());
        assert!(r.get(0, &[5]).is_some());
        assert_eq!(r.budget.used(), 40);
    }

    #[test]
    fn the_instance_budget_is_shared_and_given_back_on_drop() {
        let budget = RecentBudget::new(100);
        let mut one = Recent::new(budget.clone());
        let mut two = Recent::new(budget.clone());
        one.push(writes(&[(b"a", Some(b"1"))]), 60);
        two.push(writes(&[(b"b", Some(b"1"))]), 30);
        assert_eq!(budget.used(), 90);
        two.push(writes(&[(b"c", Some(b"1"))]), 30);
        assert_eq!(budget.used(), 90, "over the budget, `two` dropped its own oldest");
        assert_eq!(two.get(0, b"b"), None);
        assert!(two.get(0, b"c").is_some());
        assert!(one.get(0, b"a").is_some(), "another store's generations stay");
        drop(one);
        assert_eq!(budget.used(), 30, "a dropped store gives its bytes back");
        let mut none = Recent::new(RecentBudget::new(0));
        none.push(writes(&[(b"a", Some(b"1"))]), 10);
        assert_eq!(none.get(0, b"a"), None, "a zero budget keeps nothing");
    }

    #[test]
    fn forgetting_a_store_leaves_the_others() {
        let mut r = Recent::new(RecentBudget::new(1 << 20));
        let mut stores = writes(&[(b"a", Some(b"1"))]);
        stores.extend(writes(&[(b"a", Some(b"2"))]));
        r.push(stores, 10);
        r.forget(0);
        assert_eq!(r.get(0, b"a"), None);
        assert_eq!(r.get(1, b"a"), Some(Some(&b"2"[..])));
    }
}
