//! The pop order of the admission queue: one small function, so the simulator can compare
//! orders (SPEC §4.2, §8) and a researcher can add one here.

use serde::{Deserialize, Serialize};

/// Which waiter the queue pops next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AdmissionPolicy {
    /// The TTFT-percentile queue: overdue waiters by least slack, then the guard tier by least
    /// slack, then the other late waiters oldest first, then on-time oldest first. The only
    /// policy under which preemption runs.
    #[default]
    Auto,
    /// The order of SPEC v1, kept for comparison: guard by least slack, then late oldest
    /// first, then on-time oldest first, with no overdue tier. Under saturation it starves
    /// late waiters behind a guard band that keeps refilling (docs/results.md).
    #[serde(alias = "guard-first")]
    GuardFirst,
    /// Arrival order; never forms X, so nothing is ever at risk.
    Fcfs,
    /// Earliest deadline (least slack) first across all waiters, no tiers.
    Edf,
}

/// What each tier offers, by sequence number in the queue. Asked for one at a time, so an
/// order pays only for the lookups it reads: each is a descent of one of the queue index's
/// trees, and the usual pop reads one or two of them.
pub trait Offers {
    /// Oldest waiter overall.
    fn oldest(&self) -> Option<u64>;
    /// Least slack overall.
    fn least_slack(&self) -> Option<u64>;
    /// Overdue (slack ≤ −W₀), least slack: the least-slack waiter when it is overdue.
    fn overdue(&self) -> Option<u64>;
    /// Guard tier (0 ≤ slack < W₀), least slack.
    fn guard(&self) -> Option<u64>;
    /// Late tier (slack < 0, overdue included), oldest.
    fn late(&self) -> Option<u64>;
    /// On-time tier (slack ≥ W₀), oldest.
    fn on_time(&self) -> Option<u64>;
}

/// The next waiter to pop. Before X is formed every policy is FIFO.
pub fn next(policy: AdmissionPolicy, target_formed: bool, c: &impl Offers) -> Option<u64> {
    if !target_formed {
        return c.oldest();
    }
    match policy {
        // A guard waiter can still make X, so it goes ahead of one that has just missed it;
        // but nobody waits more than W₀ past X behind a guard band that keeps refilling.
        // With no overdue waiter, `late` holds only waiters short of overdue.
        AdmissionPolicy::Auto => c
            .overdue()
            .or_else(|| c.guard())
            .or_else(|| c.late())
            .or_else(|| c.on_time()),
        AdmissionPolicy::GuardFirst => c.guard().or_else(|| c.late()).or_else(|| c.on_time()),
        AdmissionPolicy::Fcfs => c.oldest(),
        AdmissionPolicy::Edf => c.least_slack(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tier's candidate, already looked up.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Candidates {
        pub oldest: Option<u64>,
        pub least_slack: Option<u64>,
        pub overdue: Option<u64>,
        pub guard: Option<u64>,
        pub late: Option<u64>,
        pub on_time: Option<u64>,
    }

    impl Offers for Candidates {
        fn oldest(&self) -> Option<u64> {
            self.oldest
        }
        fn least_slack(&self) -> Option<u64> {
            self.least_slack
        }
        fn overdue(&self) -> Option<u64> {
            self.overdue
        }
        fn guard(&self) -> Option<u64> {
            self.guard
        }
        fn late(&self) -> Option<u64> {
            self.late
        }
        fn on_time(&self) -> Option<u64> {
            self.on_time
        }
    }

    const ALL: Candidates = Candidates {
        oldest: Some(1),
        least_slack: Some(2),
        overdue: Some(6),
        guard: Some(3),
        late: Some(4),
        on_time: Some(5),
    };

    #[test]
    fn auto_pops_overdue_then_guard_then_late_then_on_time() {
        assert_eq!(next(AdmissionPolicy::Auto, true, &ALL), Some(6));
        let no_overdue = Candidates {
            overdue: None,
            ..ALL
        };
        assert_eq!(next(AdmissionPolicy::Auto, true, &no_overdue), Some(3));
        let only_late = Candidates {
            guard: None,
            ..no_overdue
        };
        assert_eq!(next(AdmissionPolicy::Auto, true, &only_late), Some(4));
        let only_on_time = Candidates {
            late: None,
            ..only_late
        };
        assert_eq!(next(AdmissionPolicy::Auto, true, &only_on_time), Some(5));
    }

    #[test]
    fn guard_first_ignores_the_overdue_tier() {
        assert_eq!(next(AdmissionPolicy::GuardFirst, true, &ALL), Some(3));
        let no_guard = Candidates { guard: None, ..ALL };
        assert_eq!(next(AdmissionPolicy::GuardFirst, true, &no_guard), Some(4));
    }

    #[test]
    fn every_policy_is_fifo_before_the_target_forms() {
        for p in crate::policy::names::all::<AdmissionPolicy>() {
            assert_eq!(next(p, false, &ALL), Some(1));
        }
    }

    #[test]
    fn edf_pops_least_slack_and_fcfs_the_oldest() {
        assert_eq!(next(AdmissionPolicy::Edf, true, &ALL), Some(2));
        assert_eq!(next(AdmissionPolicy::Fcfs, true, &ALL), Some(1));
    }
}
