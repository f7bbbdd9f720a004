//! Sampling from a distribution given by its quantiles (an empirical inverse CDF):
//! piecewise log-linear between the knots (linear where a knot is 0).

/// Knots `(probability in [0, 1], value)`, increasing in both.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantileTable {
    knots: Vec<(f64, f64)>,
}

impl QuantileTable {
    /// `None` unless there are ≥ 2 knots, the first at p = 0 and the last at p = 1, with
    /// non-decreasing p and values ≥ 0.
    pub fn new(knots: &[(f64, f64)]) -> Option<Self> {
        let ok = knots.len() >= 2
            && knots[0].0 == 0.0
            && knots[knots.len() - 1].0 == 1.0
            && knots
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1)
            && knots.iter().all(|k| k.1 >= 0.0 && k.1.is_finite());
        ok.then(|| Self {
            knots: knots.to_vec(),
        })
    }

    /// Value at probability `u` in `[0, 1]`.
    pub fn at(&self, u: f64) -> f64 {
        let u = u.clamp(0.0, 1.0);
        let i = self
            .knots
            .windows(2)
            .position(|w| u <= w[1].0)
            .unwrap_or(self.knots.len() - 2);
        let ((p0, a), (p1, b)) = (self.knots[i], self.knots[i + 1]);
        let f = if p1 > p0 { (u - p0) / (p1 - p0) } else { 1.0 };
        if a > 0.0 && b > 0.0 {
            (a.ln() + (b.ln() - a.ln()) * f).exp()
        } else {
            a + (b - a) * f
        }
    }

    pub fn knots(&self) -> &[(f64, f64)] {
        &self.knots
    }
}

/// Standard normal CDF (Abramowitz–Stegun 7.1.26 erf, |error| < 1.5e-7).
pub fn normal_cdf(z: f64) -> f64 {
    let x = z.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-x * x).exp();
    if z >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knots_are_hit_exactly_and_between_is_geometric() {
        let q = QuantileTable::new(&[(0.0, 10.0), (0.5, 100.0), (1.0, 1000.0)]).unwrap();
        assert!((q.at(0.0) - 10.0).abs() < 1e-9);
        assert!((q.at(0.5) - 100.0).abs() < 1e-9);
        assert!((q.at(1.0) - 1000.0).abs() < 1e-9);
        assert!((q.at(0.25) - 31.622_776_6).abs() < 1e-6);
    }

    #[test]
    fn tables_that_are_not_cdfs_are_refused() {
        assert!(QuantileTable::new(&[(0.0, 1.0)]).is_none());
        assert!(QuantileTable::new(&[(0.0, 5.0), (1.0, 1.0)]).is_none());
        assert!(QuantileTable::new(&[(0.1, 1.0), (1.0, 2.0)]).is_none());
    }

    #[test]
    fn normal_cdf_matches_known_values() {
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7);
        assert!((normal_cdf(1.281_551_6) - 0.9).abs() < 1e-6);
        assert!((normal_cdf(-1.959_964) - 0.025).abs() < 1e-6);
    }
}
