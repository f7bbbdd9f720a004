//! Distribution statistics in AIPerf's export shape.
//!
//! Percentiles use linear interpolation between closest ranks and `std` is the population
//! standard deviation, as numpy computes them by default (AIPerf uses numpy), so the same
//! samples give the same numbers in both tools.

use serde::{Deserialize, Serialize};

/// `{unit, avg, p1 … p99, min, max, std}` over one metric's samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    pub unit: String,
    pub avg: f64,
    pub p1: f64,
    pub p5: f64,
    pub p10: f64,
    pub p25: f64,
    pub p50: f64,
    pub p75: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
    pub std: f64,
}

/// A single aggregate value: `{unit, avg}` (throughputs, counts, durations).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scalar {
    pub unit: String,
    pub avg: f64,
}

impl Scalar {
    pub fn new(unit: &str, avg: f64) -> Self {
        Self {
            unit: unit.to_owned(),
            avg,
        }
    }
}

/// numpy's default (`linear`) percentile of sorted samples; `q` in 0..=100.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let rank = q / 100.0 * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            let frac = rank - lo as f64;
            sorted[lo] + (sorted[hi] - sorted[lo]) * frac
        }
    }
}

impl Stat {
    /// Statistics of `samples`; `None` when there are none (the metric is then left out of
    /// the export, as AIPerf does). Non-finite samples are ignored.
    pub fn of(unit: &str, samples: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = samples.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        let avg = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - avg).powi(2)).sum::<f64>() / n;
        let p = |q| percentile(&v, q);
        Some(Self {
            unit: unit.to_owned(),
            avg,
            p1: p(1.0),
            p5: p(5.0),
            p10: p(10.0),
            p25: p(25.0),
            p50: p(50.0),
            p75: p(75.0),
            p90: p(90.0),
            p95: p(95.0),
            p99: p(99.0),
            min: v[0],
            max: v[v.len() - 1],
            std: var.sqrt(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_linearly_between_ranks_like_numpy() {
        // numpy.percentile([1,2,3,4], [50, 90, 25]) == [2.5, 3.7, 1.75]
        let s = Stat::of("ms", [4.0, 1.0, 3.0, 2.0]).unwrap();
        assert!((s.p50 - 2.5).abs() < 1e-12);
        assert!((s.p90 - 3.7).abs() < 1e-12);
        assert!((s.p25 - 1.75).abs() < 1e-12);
        assert_eq!((s.min, s.max), (1.0, 4.0));
        // population std of 1..4 is sqrt(1.25)
        assert!((s.std - 1.25f64.sqrt()).abs() < 1e-12);
        assert!((s.avg - 2.5).abs() < 1e-12);
    }

    #[test]
    fn no_samples_means_no_statistic() {
        assert!(Stat::of("ms", std::iter::empty()).is_none());
        assert!(Stat::of("ms", [f64::NAN]).is_none());
    }
}
