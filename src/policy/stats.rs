//! Running statistics the policy reads: windowed means (D, R0, step time) and the windowed
//! percentile that forms X. Both are O(1) / O(log n) per sample and fully deterministic.

use std::collections::{BTreeSet, VecDeque};

/// An f64 with a total order (`f64::total_cmp`), so it can key ordered sets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OrdF64(pub f64);

impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Mean of the last `window` samples.
#[derive(Debug, Clone)]
pub struct RunningMean {
    window: usize,
    samples: VecDeque<f64>,
    sum: f64,
    /// Inserts since the sum was last recomputed from scratch (bounds rounding drift).
    since_resum: usize,
}

impl RunningMean {
    pub fn new(window: usize) -> Self {
        Self {
            window: window.max(1),
            samples: VecDeque::new(),
            sum: 0.0,
            since_resum: 0,
        }
    }

    pub fn push(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        if self.samples.len() == self.window {
            if let Some(old) = self.samples.pop_front() {
                self.sum -= old;
            }
        }
        self.samples.push_back(x);
        self.sum += x;
        self.since_resum += 1;
        if self.since_resum >= self.window {
            self.sum = self.samples.iter().sum();
            self.since_resum = 0;
        }
    }

    pub fn mean(&self) -> Option<f64> {
        if self.samples.is_empty() {
            None
        } else {
            Some(self.sum / self.samples.len() as f64)
        }
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// The `p`-th percentile (nearest rank) of the last `window` samples, O(log n) per sample.
///
/// Two ordered multisets split the window at the target rank: `low` holds the `k`
/// smallest samples, so the percentile is the largest element of `low`.
#[derive(Debug, Clone)]
pub struct WindowPercentile {
    percentile: f64,
    window: usize,
    order: VecDeque<(OrdF64, u64)>,
    low: BTreeSet<(OrdF64, u64)>,
    high: BTreeSet<(OrdF64, u64)>,
    seq: u64,
}

impl WindowPercentile {
    /// `percentile` in (0, 100].
    pub fn new(percentile: f64, window: usize) -> Self {
        Self {
            percentile: percentile.clamp(f64::MIN_POSITIVE, 100.0),
            window: window.max(1),
            order: VecDeque::new(),
            low: BTreeSet::new(),
            high: BTreeSet::new(),
            seq: 0,
        }
    }

    fn target_rank(&self) -> usize {
        let n = self.order.len();
        if n == 0 {
            return 0;
        }
        ((self.percentile / 100.0 * n as f64).ceil() as usize).clamp(1, n)
    }

    pub fn push(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        if self.order.len() == self.window {
            if let Some(old) = self.order.pop_front() {
                if !self.low.remove(&old) {
                    self.high.remove(&old);
                }
            }
        }
        let item = (OrdF64(x), self.seq);
        self.seq += 1;
        self.order.push_back(item);
        match self.low.last() {
            Some(top) if item > *top => {
                self.high.insert(item);
            }
            _ => {
                self.low.insert(item);
            }
        }
        let k = self.target_rank();
        while self.low.len() > k {
            if let Some(top) = self.low.pop_last() {
                self.high.insert(top);
            }
        }
        while self.low.len() < k {
            match self.high.pop_first() {
                Some(bottom) => {
                    self.low.insert(bottom);
                }
                None => break,
            }
        }
    }

    pub fn value(&self) -> Option<f64> {
        self.low.last().map(|(v, _)| v.0)
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nearest_rank(samples: &[f64], p: f64) -> f64 {
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let k = ((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[k - 1]
    }

    #[test]
    fn running_mean_covers_only_the_window() {
        let mut m = RunningMean::new(3);
        assert_eq!(m.mean(), None);
        for x in [1.0, 2.0, 3.0, 10.0] {
            m.push(x);
        }
        assert_eq!(m.mean(), Some(5.0));
    }

    #[test]
    fn window_percentile_matches_sorting_the_window() {
        let mut w = WindowPercentile::new(90.0, 50);
        let mut all = Vec::new();
        let mut x: u64 = 12345;
        for _ in 0..400 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let v = (x >> 33) as f64 / 1e6;
            all.push(v);
            w.push(v);
            let start = all.len().saturating_sub(50);
            assert_eq!(w.value(), Some(nearest_rank(&all[start..], 90.0)));
        }
    }

    #[test]
    fn window_percentile_handles_duplicates() {
        let mut w = WindowPercentile::new(50.0, 4);
        for _ in 0..10 {
            w.push(2.0);
        }
        w.push(1.0);
        assert_eq!(w.value(), Some(2.0));
    }
}
