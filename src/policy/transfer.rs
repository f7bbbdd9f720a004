//! The s2f estimate (SPEC §4.2): `transfer_estimate(context_tokens) + mean_step_time`.
//! The transfer part is a running least-squares line over observed admit→KV-ready times,
//! falling back to their running mean while the fit is not trustworthy.

use super::stats::RunningMean;

/// Fewest observations before the least-squares line is used.
const MIN_FIT_SAMPLES: u64 = 16;
/// Forgetting factor of the fit: old observations decay so the line follows drift.
const FORGET: f64 = 0.999;

/// Online estimate of admit→KV-ready seconds as a function of context tokens.
#[derive(Debug, Clone)]
pub struct TransferEstimator {
    /// Observations so far.
    samples: u64,
    /// The decayed sums of the fit: weight (count), x, y, x², xy, where x is the context
    /// tokens and y the seconds.
    weight: f64,
    sum_x: f64,
    sum_y: f64,
    sum_xx: f64,
    sum_xy: f64,
    mean: RunningMean,
}

impl Default for TransferEstimator {
    fn default() -> Self {
        Self {
            samples: 0,
            weight: 0.0,
            sum_x: 0.0,
            sum_y: 0.0,
            sum_xx: 0.0,
            sum_xy: 0.0,
            mean: RunningMean::new(500),
        }
    }
}

/// A frozen estimate: `intercept + slope * context_tokens`, never negative.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TransferLine {
    pub intercept: f64,
    pub slope: f64,
}

impl TransferLine {
    pub fn at(&self, context_tokens: u32) -> f64 {
        (self.intercept + self.slope * context_tokens as f64).max(0.0)
    }
}

impl TransferEstimator {
    pub fn observe(&mut self, context_tokens: u32, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let x = context_tokens as f64;
        self.weight = self.weight * FORGET + 1.0;
        self.sum_x = self.sum_x * FORGET + x;
        self.sum_y = self.sum_y * FORGET + seconds;
        self.sum_xx = self.sum_xx * FORGET + x * x;
        self.sum_xy = self.sum_xy * FORGET + x * seconds;
        self.samples += 1;
        self.mean.push(seconds);
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// The current line: the least-squares fit when it is well conditioned and has a
    /// non-negative slope, else a flat line at the running mean (0 before any sample).
    pub fn line(&self) -> TransferLine {
        let flat = TransferLine {
            intercept: self.mean.mean().unwrap_or(0.0),
            slope: 0.0,
        };
        if self.samples < MIN_FIT_SAMPLES {
            return flat;
        }
        // Weighted variance of x and covariance of x and y, each times weight².
        let spread = self.sum_xx * self.weight - self.sum_x * self.sum_x;
        if spread <= 1e-9 * self.weight * self.weight {
            return flat;
        }
        let slope = (self.sum_xy * self.weight - self.sum_x * self.sum_y) / spread;
        if !slope.is_finite() || slope < 0.0 {
            return flat;
        }
        let intercept = (self.sum_y - slope * self.sum_x) / self.weight;
        TransferLine { intercept, slope }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_a_linear_transfer_time() {
        let mut e = TransferEstimator::default();
        for i in 0..200u32 {
            let ctx = 1000 + (i * 7919) % 200_000;
            e.observe(ctx, 0.05 + 2e-6 * ctx as f64);
        }
        let l = e.line();
        assert!((l.slope - 2e-6).abs() < 1e-9, "{l:?}");
        assert!((l.at(100_000) - 0.25).abs() < 1e-6);
    }

    #[test]
    fn falls_back_to_the_mean_when_contexts_do_not_vary() {
        let mut e = TransferEstimator::default();
        for i in 0..100 {
            e.observe(5000, 0.1 + 0.001 * (i % 3) as f64);
        }
        let l = e.line();
        assert_eq!(l.slope, 0.0);
        assert!((l.at(1_000_000) - 0.101).abs() < 1e-3);
    }

    #[test]
    fn no_samples_estimates_zero() {
        assert_eq!(TransferEstimator::default().line().at(10_000), 0.0);
    }
}
