//! The tier index behind the admission queue: waiters by arrival and by key, plus the
//! late and on-time tiers kept as their own ordered sets. Tier boundaries are key
//! thresholds; when they slide, only the waiters that cross a boundary move.

use std::collections::BTreeSet;
use std::ops::Bound;

use serde::Serialize;

use super::super::stats::OrdF64;
use super::Offers;

/// Key thresholds of the tiers: late is `key < late_below`, on-time is `key ≥ on_time_from`,
/// guard is in between; a late waiter is overdue when `key ≤ overdue_upto`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    pub late_below: f64,
    pub on_time_from: f64,
    pub overdue_upto: f64,
}

impl Thresholds {
    fn overdue(&self, key: f64) -> bool {
        key < self.late_below && key <= self.overdue_upto
    }
}

/// Waiters per tier; the four partition the queue (`late` excludes the overdue).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TierCounts {
    pub overdue: usize,
    pub late: usize,
    pub guard: usize,
    pub on_time: usize,
}

/// Waiters ordered by a value (arrival or key), ties by sequence number.
type WaiterSet = BTreeSet<(OrdF64, u64)>;
/// A range of values in a `WaiterSet`.
type ValueRange = (Bound<(OrdF64, u64)>, Bound<(OrdF64, u64)>);

#[derive(Debug, Clone, Default)]
pub struct TierIndex {
    by_arrival: WaiterSet,
    by_key: WaiterSet,
    late_by_arrival: WaiterSet,
    late_by_key: WaiterSet,
    on_by_arrival: WaiterSet,
    on_by_key: WaiterSet,
    applied: Option<Thresholds>,
}

fn below(x: f64) -> ValueRange {
    (Bound::Unbounded, Bound::Excluded((OrdF64(x), 0)))
}

fn from(x: f64) -> ValueRange {
    (Bound::Included((OrdF64(x), 0)), Bound::Unbounded)
}

fn between(lo: f64, hi: f64) -> ValueRange {
    (
        Bound::Included((OrdF64(lo), 0)),
        Bound::Excluded((OrdF64(hi), 0)),
    )
}

impl TierIndex {
    pub fn insert(&mut self, seq: u64, arrival: f64, key: f64) {
        self.by_arrival.insert((OrdF64(arrival), seq));
        self.by_key.insert((OrdF64(key), seq));
        if let Some(thresholds) = self.applied {
            if key < thresholds.late_below {
                self.late_by_arrival.insert((OrdF64(arrival), seq));
                self.late_by_key.insert((OrdF64(key), seq));
            } else if key >= thresholds.on_time_from {
                self.on_by_arrival.insert((OrdF64(arrival), seq));
                self.on_by_key.insert((OrdF64(key), seq));
            }
        }
    }

    pub fn remove(&mut self, seq: u64, arrival: f64, key: f64) {
        let a = (OrdF64(arrival), seq);
        let k = (OrdF64(key), seq);
        self.by_arrival.remove(&a);
        self.by_key.remove(&k);
        self.late_by_arrival.remove(&a);
        self.late_by_key.remove(&k);
        self.on_by_arrival.remove(&a);
        self.on_by_key.remove(&k);
    }

    /// Move waiters across tier boundaries for the new thresholds.
    pub fn retier(&mut self, new: Option<Thresholds>, arrival_of: impl Fn(u64) -> Option<f64>) {
        let old = self.applied;
        self.applied = new;
        let Some(new) = new else {
            self.late_by_arrival.clear();
            self.late_by_key.clear();
            self.on_by_arrival.clear();
            self.on_by_key.clear();
            return;
        };
        let old = old.unwrap_or(Thresholds {
            late_below: f64::NEG_INFINITY,
            on_time_from: f64::INFINITY,
            overdue_upto: f64::NEG_INFINITY,
        });

        // Late tier: key < late_below.
        if new.late_below > old.late_below {
            let joining: Vec<_> = self
                .by_key
                .range(between(old.late_below, new.late_below))
                .copied()
                .collect();
            for (k, seq) in joining {
                if let Some(a) = arrival_of(seq) {
                    self.late_by_key.insert((k, seq));
                    self.late_by_arrival.insert((OrdF64(a), seq));
                }
            }
        } else if new.late_below < old.late_below {
            let leaving: Vec<_> = self
                .late_by_key
                .range(from(new.late_below))
                .copied()
                .collect();
            for (k, seq) in leaving {
                self.late_by_key.remove(&(k, seq));
                if let Some(a) = arrival_of(seq) {
                    self.late_by_arrival.remove(&(OrdF64(a), seq));
                }
            }
        }

        // On-time tier: key ≥ on_time_from.
        if new.on_time_from > old.on_time_from {
            let leaving: Vec<_> = self
                .on_by_key
                .range(below(new.on_time_from))
                .copied()
                .collect();
            for (k, seq) in leaving {
                self.on_by_key.remove(&(k, seq));
                if let Some(a) = arrival_of(seq) {
                    self.on_by_arrival.remove(&(OrdF64(a), seq));
                }
            }
        } else if new.on_time_from < old.on_time_from {
            let upper = if old.on_time_from.is_finite() {
                old.on_time_from
            } else {
                f64::INFINITY
            };
            let joining: Vec<_> = if upper.is_finite() {
                self.by_key
                    .range(between(new.on_time_from, upper))
                    .copied()
                    .collect()
            } else {
                self.by_key.range(from(new.on_time_from)).copied().collect()
            };
            for (k, seq) in joining {
                if let Some(a) = arrival_of(seq) {
                    self.on_by_key.insert((k, seq));
                    self.on_by_arrival.insert((OrdF64(a), seq));
                }
            }
        }
    }

    /// The tiers' candidates under `thresholds`, each looked up when asked for.
    pub fn offers(&self, thresholds: Option<Thresholds>) -> TierOffers<'_> {
        TierOffers {
            index: self,
            thresholds,
        }
    }

    pub fn count_keys_below(&self, x: f64) -> usize {
        self.by_key.range(below(x)).count()
    }

    /// O(overdue waiters): for the stat line and the debug view, not the pass.
    pub fn tier_counts(&self) -> TierCounts {
        let Some(thresholds) = self.applied else {
            return TierCounts::default();
        };
        let late = self.late_by_key.len();
        let on_time = self.on_by_key.len();
        let overdue = self
            .late_by_key
            .iter()
            .take_while(|(k, _)| thresholds.overdue(k.0))
            .count();
        TierCounts {
            overdue,
            late: late - overdue,
            guard: self.by_key.len() - late - on_time,
            on_time,
        }
    }
}

/// [`TierIndex::offers`]: the candidates, found on demand.
pub struct TierOffers<'a> {
    index: &'a TierIndex,
    thresholds: Option<Thresholds>,
}

fn first(set: &WaiterSet) -> Option<u64> {
    set.first().map(|&(_, seq)| seq)
}

impl Offers for TierOffers<'_> {
    fn oldest(&self) -> Option<u64> {
        first(&self.index.by_arrival)
    }
    fn least_slack(&self) -> Option<u64> {
        first(&self.index.by_key)
    }
    fn overdue(&self) -> Option<u64> {
        let thresholds = self.thresholds?;
        let &(key, seq) = self.index.by_key.first()?;
        thresholds.overdue(key.0).then_some(seq)
    }
    fn guard(&self) -> Option<u64> {
        let thresholds = self.thresholds?;
        self.index
            .by_key
            .range(between(thresholds.late_below, thresholds.on_time_from))
            .next()
            .map(|&(_, seq)| seq)
    }
    fn late(&self) -> Option<u64> {
        self.thresholds
            .and_then(|_| first(&self.index.late_by_arrival))
    }
    fn on_time(&self) -> Option<u64> {
        self.thresholds
            .and_then(|_| first(&self.index.on_by_arrival))
    }
}
