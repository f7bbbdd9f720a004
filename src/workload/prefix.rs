//! The prefix-block ids an [`Issue`](super::Issue) carries, kept in the trace's compact run
//! form. A ~120k-token Weka prompt is ~2,000 block ids but one to three runs; expanding them
//! for every issued request dominated the simulator, so ids are expanded only on demand
//! (the load generator's prompt builder) and prefixes are compared run by run.

use std::sync::Arc;

use super::types::{HashIds, HashRun};

/// Prefix-block ids: the trace's ids, optionally scoped to one replay instance.
///
/// Closed-loop replays scope every id with [`scoped_hash`] so that concurrent replays of one
/// trace never share a cache; for a fixed instance that map is a bijection, so two prompts
/// of the same instance share exactly as many leading scoped ids as leading trace ids.
#[derive(Debug, Clone, Default)]
pub struct PrefixHashes {
    ids: Arc<HashIds>,
    scope: Option<u64>,
}

impl PrefixHashes {
    /// Ids exactly as recorded (open-loop traces).
    pub fn recorded(ids: Arc<HashIds>) -> Self {
        Self { ids, scope: None }
    }

    /// Ids scoped to replay instance `instance` (closed-loop replays).
    pub fn scoped(ids: Arc<HashIds>, instance: u64) -> Self {
        Self {
            ids,
            scope: Some(instance),
        }
    }

    /// The trace-local ids, before scoping.
    pub fn local(&self) -> &HashIds {
        &self.ids
    }

    /// The replay instance the ids are scoped to, if any.
    pub fn scope(&self) -> Option<u64> {
        self.scope
    }

    /// Number of block ids.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn map(&self, local: u64) -> u64 {
        match self.scope {
            Some(instance) => scoped_hash(instance, local),
            None => local,
        }
    }

    /// The ids in order, scoped.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.ids.iter().map(|h| self.map(h))
    }

    /// The `i`-th id, scoped.
    pub fn get(&self, i: usize) -> Option<u64> {
        let mut left = i as u64;
        for r in self.ids.runs() {
            if left < u64::from(r.len) {
                return Some(self.map(r.start.wrapping_add(left)));
            }
            left -= u64::from(r.len);
        }
        None
    }

    /// Every id, scoped.
    pub fn to_vec(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.len());
        out.extend(self.iter());
        out
    }

    /// How many leading ids `self` and `other` share. O(runs) when both have the same scope.
    pub fn common_prefix_len(&self, other: &Self) -> usize {
        if self.scope == other.scope {
            common_prefix_of_runs(self.ids.runs(), other.ids.runs())
        } else {
            self.iter()
                .zip(other.iter())
                .take_while(|(a, b)| a == b)
                .count()
        }
    }
}

impl PartialEq for PrefixHashes {
    /// Equal when they hold the same ids in the same order.
    fn eq(&self, other: &Self) -> bool {
        let n = self.len();
        n == other.len() && self.common_prefix_len(other) == n
    }
}

impl Eq for PrefixHashes {}

/// Leading ids two run lists share, walking the runs (they need not be merged).
fn common_prefix_of_runs(a: &[HashRun], b: &[HashRun]) -> usize {
    let (mut i, mut j) = (0usize, 0usize);
    // Offsets into the current run of each side.
    let (mut ao, mut bo) = (0u64, 0u64);
    let mut n = 0u64;
    while let (Some(ra), Some(rb)) = (a.get(i), b.get(j)) {
        let (la, lb) = (u64::from(ra.len), u64::from(rb.len));
        if ao >= la {
            i += 1;
            ao = 0;
            continue;
        }
        if bo >= lb {
            j += 1;
            bo = 0;
            continue;
        }
        if ra.start.wrapping_add(ao) != rb.start.wrapping_add(bo) {
            break;
        }
        // Both runs continue one id at a time, so they agree until the shorter one ends.
        let k = (la - ao).min(lb - bo);
        n += k;
        ao += k;
        bo += k;
    }
    n as usize
}

/// Scopes a trace-local hash id to one replay instance (splitmix64 finaliser of a mix).
/// For a fixed instance this is a bijection on `u64` (xor, xor-shifts and odd multipliers).
pub(crate) fn scoped_hash(instance: u64, local: u64) -> u64 {
    let mut z = local ^ instance.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(runs: &[(u64, u32)]) -> Arc<HashIds> {
        Arc::new(HashIds::from_runs(
            runs.iter().map(|&(start, len)| HashRun { start, len }),
        ))
    }

    /// The reference: compare the expanded ids one by one.
    fn naive(a: &PrefixHashes, b: &PrefixHashes) -> usize {
        a.to_vec()
            .iter()
            .zip(b.to_vec().iter())
            .take_while(|(x, y)| x == y)
            .count()
    }

    #[test]
    fn run_walk_matches_the_id_by_id_comparison() {
        type Runs = &'static [(u64, u32)];
        let cases: &[(Runs, Runs)] = &[
            (&[(1, 1112)], &[(1, 1136)]),
            (&[(1, 1523), (1525, 7)], &[(1, 1524)]),
            (&[(1, 1523), (1525, 7)], &[(1, 1523), (1525, 9)]),
            (&[(5, 3)], &[(6, 3)]),
            (&[], &[(1, 4)]),
            (&[(1, 2), (3, 2)], &[(1, 4)]),
            (&[(10, 1), (11, 1), (40, 2)], &[(10, 2), (40, 1), (50, 1)]),
            (&[(7, 1), (3, 1), (9, 1)], &[(7, 1), (3, 1), (8, 1)]),
        ];
        for &(a, b) in cases {
            for scope in [None, Some(0), Some(17)] {
                let mk = |r| match scope {
                    None => PrefixHashes::recorded(ids(r)),
                    Some(i) => PrefixHashes::scoped(ids(r), i),
                };
                let (pa, pb) = (mk(a), mk(b));
                assert_eq!(pa.common_prefix_len(&pb), naive(&pa, &pb), "{a:?} vs {b:?}");
                assert_eq!(pb.common_prefix_len(&pa), naive(&pb, &pa), "{b:?} vs {a:?}");
            }
        }
    }

    #[test]
    fn unmerged_runs_compare_equal_to_merged_ones() {
        // `from_runs` merges, so build the split form by hand through the raw walk.
        let split = [HashRun { start: 1, len: 2 }, HashRun { start: 3, len: 2 }];
        let merged = [HashRun { start: 1, len: 4 }];
        assert_eq!(common_prefix_of_runs(&split, &merged), 4);
        let zero = [HashRun { start: 9, len: 0 }, HashRun { start: 1, len: 3 }];
        assert_eq!(common_prefix_of_runs(&zero, &merged), 3);
    }

    #[test]
    fn different_instances_share_no_prefix() {
        let a = PrefixHashes::scoped(ids(&[(1, 100)]), 3);
        let b = PrefixHashes::scoped(ids(&[(1, 100)]), 4);
        assert_eq!(a.common_prefix_len(&b), 0);
        assert_ne!(a, b);
        assert_eq!(a, PrefixHashes::scoped(ids(&[(1, 50), (51, 50)]), 3));
    }

    #[test]
    fn scoped_ids_expand_through_the_instance_hash() {
        let p = PrefixHashes::scoped(ids(&[(1, 2), (10, 1)]), 5);
        let want: Vec<u64> = [1, 2, 10].iter().map(|&h| scoped_hash(5, h)).collect();
        assert_eq!(p.to_vec(), want);
        assert_eq!(p.len(), 3);
        assert_eq!(p.get(2), Some(want[2]));
        assert_eq!(p.get(3), None);
        let r = PrefixHashes::recorded(ids(&[(1, 2), (10, 1)]));
        assert_eq!(r.to_vec(), vec![1, 2, 10]);
        assert_eq!(r.get(1), Some(2));
    }
}
