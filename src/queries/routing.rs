//! Who answers a query: this instance for the partitions it serves, else the instance the
//! group says owns the next partition still to search (a redirect), else nobody yet (retry).
//! Never "not found" while a partition that may hold the key has not been searched.

use std::collections::{BTreeMap, BTreeSet};

/// What one instance knows when a query arrives.
#[derive(Debug, Clone)]
pub struct Situation<'a> {
    /// Partitions that may hold the key.
    pub candidates: &'a BTreeSet<i32>,
    /// Partitions whose restored task store this instance serves now.
    pub local: &'a BTreeSet<i32>,
    /// Owner instance of each partition, from the group view; `None` without a recent view.
    pub owners: Option<&'a BTreeMap<i32, String>>,
    /// This instance's id.
    pub me: &'a str,
    /// Partitions already searched by the instances that redirected the query here.
    pub searched: &'a BTreeSet<i32>,
    /// True when the query was redirected here.
    pub redirected: bool,
}

/// What to do with a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Candidate partitions to read here, in order.
    pub read_here: Vec<i32>,
    /// What to answer when none of them holds the key.
    pub otherwise: Otherwise,
}

/// The answer when the key is not in a partition read here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Otherwise {
    /// Every candidate partition has been searched: the key is absent.
    NotFound,
    /// Another instance owns a partition still to search.
    Redirect {
        /// The owner.
        instance: String,
        /// The partition it owns.
        partition: i32,
        /// Searched so far, this instance's partitions included.
        searched: BTreeSet<i32>,
    },
    /// A partition still to search has no ready owner now; retry shortly.
    Unavailable(String),
}

/// Decides who answers in situation `s`.
pub fn plan(s: &Situation<'_>) -> Plan {
    let read_here: Vec<i32> = s.candidates.intersection(s.local).copied().collect();
    let mut searched = s.searched.clone();
    searched.extend(&read_here);
    let remaining: Vec<i32> = s.candidates.difference(&searched).copied().collect();
    let otherwise = match remaining.first() {
        None => Otherwise::NotFound,
        // The instance that sent it here thought this one owns a partition it does not serve:
        // the views disagree (a rebalance under way). Sending it on could bounce it back.
        Some(&p) if s.redirected && read_here.is_empty() => Otherwise::Unavailable(format!(
            "this instance does not serve partition {p} (it was redirected here while the group rebalances)"
        )),
        Some(_) => match s.owners {
            None => Otherwise::Unavailable(
                "this instance has no recent view of the consumer group to find the key's owner".to_string(),
            ),
            Some(owners) => {
                let next = remaining
                    .iter()
                    .find_map(|p| owners.get(p).filter(|o| *o != s.me).map(|o| (*p, o.clone())));
                match next {
                    Some((partition, instance)) => Otherwise::Redirect {
                        instance,
                        partition,
                        searched,
                    },
                    None => Otherwise::Unavailable(unready(&remaining, owners, s.me)),
                }
            }
        },
    };
    Plan { read_here, otherwise }
}

/// Why the partitions still to search cannot be searched now.
fn unready(remaining: &[i32], owners: &BTreeMap<i32, String>, me: &str) -> String {
    let list = |ps: Vec<i32>| ps.iter().map(i32::to_string).collect::<Vec<_>>().join(", ");
    let (restoring, unowned): (Vec<i32>, Vec<i32>) = remaining
        .iter()
        .copied()
        .partition(|p| owners.get(p).is_some_and(|o| o == me));
    let mut why = Vec::new();
    if !restoring.is_empty() {
        why.push(format!(
            "partition {} is this instance's but not ready (opening or restoring its store)",
            list(restoring)
        ));
    }
    if !unowned.is_empty() {
        why.push(format!(
            "partition {} has no owner now (the group is rebalancing)",
            list(unowned)
        ));
    }
    why.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ps: &[i32]) -> BTreeSet<i32> {
        ps.iter().copied().collect()
    }

    fn owners(o: &[(i32, &str)]) -> BTreeMap<i32, String> {
        o.iter().map(|(p, i)| (*p, i.to_string())).collect()
    }

    fn plan_of(
        candidates: &[i32],
        local: &[i32],
        own: Option<&BTreeMap<i32, String>>,
        searched: &[i32],
        redirected: bool,
    ) -> Plan {
        plan(&Situation {
            candidates: &set(candidates),
            local: &set(local),
            owners: own,
            me: "a",
            searched: &set(searched),
            redirected,
        })
    }

    #[test]
    fn the_owner_answers_and_others_redirect_to_it() {
        let o = owners(&[(0, "a"), (1, "b")]);
        let here = plan_of(&[0], &[0], Some(&o), &[], false);
        assert_eq!(
            here,
            Plan {
                read_here: vec![0],
                otherwise: Otherwise::NotFound
            }
        );
        let there = plan_of(&[1], &[0], Some(&o), &[], false);
        assert_eq!(
            there.otherwise,
            Otherwise::Redirect {
                instance: "b".into(),
                partition: 1,
                searched: set(&[])
            }
        );
        assert!(there.read_here.is_empty());
    }

    #[test]
    fn a_key_of_unknown_partition_is_searched_instance_by_instance() {
        let o = owners(&[(0, "a"), (1, "b"), (2, "c"), (3, "a")]);
        let first = plan_of(&[0, 1, 2, 3], &[0, 3], Some(&o), &[], false);
        assert_eq!(first.read_here, vec![0, 3]);
        assert_eq!(
            first.otherwise,
            Otherwise::Redirect {
                instance: "b".into(),
                partition: 1,
                searched: set(&[0, 3])
            }
        );
        // At b (as "a" here for the test's sake, serving 1): on to c.
        let o_b = owners(&[(0, "x"), (1, "a"), (2, "c"), (3, "x")]);
        let second = plan_of(&[0, 1, 2, 3], &[1], Some(&o_b), &[0, 3], true);
        assert_eq!(
            second.otherwise,
            Otherwise::Redirect {
                instance: "c".into(),
                partition: 2,
                searched: set(&[0, 1, 3])
            }
        );
        let last = plan_of(&[0, 1, 2, 3], &[2], Some(&o_b), &[0, 1, 3], true);
        assert_eq!(
            last,
            Plan {
                read_here: vec![2],
                otherwise: Otherwise::NotFound
            }
        );
    }

    #[test]
    fn never_not_found_while_a_partition_is_restoring_unowned_or_unknown() {
        let restoring = owners(&[(0, "a")]);
        let p = plan_of(&[0], &[], Some(&restoring), &[], false);
        assert!(
            matches!(&p.otherwise, Otherwise::Unavailable(why) if why.contains("restoring")),
            "{p:?}"
        );
        let unowned = owners(&[]);
        let p = plan_of(&[0], &[], Some(&unowned), &[], false);
        assert!(
            matches!(&p.otherwise, Otherwise::Unavailable(why) if why.contains("no owner")),
            "{p:?}"
        );
        let p = plan_of(&[0], &[], None, &[], false);
        assert!(
            matches!(&p.otherwise, Otherwise::Unavailable(why) if why.contains("view")),
            "{p:?}"
        );
        // Searched here, but partition 1 is unowned: the key may be there.
        let o = owners(&[(0, "a")]);
        let p = plan_of(&[0, 1], &[0], Some(&o), &[], false);
        assert_eq!(p.read_here, vec![0]);
        assert!(matches!(p.otherwise, Otherwise::Unavailable(_)), "{p:?}");
    }

    #[test]
    fn a_redirect_to_an_instance_that_does_not_serve_the_partition_is_not_bounced_back() {
        let stale = owners(&[(1, "b")]);
        let p = plan_of(&[1], &[0], Some(&stale), &[], true);
        assert!(
            matches!(&p.otherwise, Otherwise::Unavailable(why) if why.contains("redirected")),
            "{p:?}"
        );
    }
}
