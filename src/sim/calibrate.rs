//! `sim --replay --step-scale auto`: the step-time factor at which the replayed control
//! decodes at the served run's own mean TPOT.
//!
//! A replay sends the recorded arrivals open loop, and near saturation its queue is very
//! sensitive to the plant's speed: on an H200 recording of docs/results.md §4.3 a step fit 2 %
//! short of the card's served step gave a replayed TTFT p50 of 0.06 s against the served
//! 5.3 s. A step model fitted on one machine start is a few percent off on another (the
//! card's clock under its power cap), so
//! the replay takes one scalar from the recording itself: the factor on every step term that
//! makes the replayed control's mean TPOT the served control's. The arms are then predicted
//! on that plant, and their own recordings check the prediction.
//!
//! The search is plain bisection over a bracket, pure: the caller's closure runs the replay.

/// Where the search looks: a card this far off its fit is a different card.
pub const SCALE_RANGE: (f64, f64) = (0.25, 4.0);
/// Done when the replayed TPOT is within this fraction of the served one...
const TOLERANCE: f64 = 5e-4;
/// ...or after this many replays (the bracket is then 2^-30 of its width).
const MAX_RUNS: usize = 32;

/// The factor found, the TPOT the replay gave with it, and the replays it took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleFit {
    pub factor: f64,
    pub tpot_ms: f64,
    pub runs: usize,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalibrateError {
    #[error("the served mean TPOT must be a positive number of ms, got {0}")]
    NoTarget(f64),
    #[error(
        "the served mean TPOT, {target_ms:.3} ms, is outside what the plant gives between \
         step x{lo} ({lo_ms:.3} ms) and x{hi} ({hi_ms:.3} ms): the config does not describe \
         this run's setting"
    )]
    OutOfRange {
        target_ms: f64,
        lo: f64,
        lo_ms: f64,
        hi: f64,
        hi_ms: f64,
    },
    #[error("the replay at step x{factor} gave no mean TPOT (no request decoded two tokens)")]
    NoTpot { factor: f64 },
    #[error("{0}")]
    Run(String),
}

/// The factor in `SCALE_RANGE` at which `tpot_ms(factor)` (the replayed control's mean TPOT,
/// increasing with the factor) equals `target_ms`, by bisection on the factor's logarithm.
pub fn fit_step_scale(
    target_ms: f64,
    mut tpot_ms: impl FnMut(f64) -> Result<f64, String>,
) -> Result<ScaleFit, CalibrateError> {
    if !(target_ms.is_finite() && target_ms > 0.0) {
        return Err(CalibrateError::NoTarget(target_ms));
    }
    let mut runs = 0;
    let mut at = |factor: f64, runs: &mut usize| -> Result<f64, CalibrateError> {
        *runs += 1;
        let t = tpot_ms(factor).map_err(CalibrateError::Run)?;
        if t.is_finite() {
            Ok(t)
        } else {
            Err(CalibrateError::NoTpot { factor })
        }
    };
    let (mut lo, mut hi) = SCALE_RANGE;
    let (lo_ms, hi_ms) = (at(lo, &mut runs)?, at(hi, &mut runs)?);
    if !(lo_ms <= target_ms && target_ms <= hi_ms) {
        return Err(CalibrateError::OutOfRange {
            target_ms,
            lo,
            lo_ms,
            hi,
            hi_ms,
        });
    }
    // The end nearer the target, should the runs end first.
    let mut best = if target_ms - lo_ms < hi_ms - target_ms {
        (lo, lo_ms)
    } else {
        (hi, hi_ms)
    };
    while runs < MAX_RUNS {
        let mid = (lo * hi).sqrt();
        let t = at(mid, &mut runs)?;
        // Ties go to the later run: nearer where the bracket closes.
        if (t - target_ms).abs() <= (best.1 - target_ms).abs() {
            best = (mid, t);
        }
        if (t / target_ms - 1.0).abs() <= TOLERANCE {
            break;
        }
        if t < target_ms {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(ScaleFit {
        factor: best.0,
        tpot_ms: best.1,
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plant_whose_tpot_scales_with_the_step_gets_the_ratio_of_the_two_tpots() {
        // Batch fixed: the TPOT is the step, so the factor is served / modelled.
        let fit = fit_step_scale(23.02, |f| Ok(21.40 * f)).unwrap();
        assert!((fit.factor - 23.02 / 21.40).abs() < 1e-3, "{fit:?}");
        assert!((fit.tpot_ms / 23.02 - 1.0).abs() <= TOLERANCE);
        assert!(fit.runs <= MAX_RUNS);
    }

    #[test]
    fn a_plant_that_saturates_still_meets_the_served_tpot() {
        // Past a knee the batch fills and the TPOT climbs faster than the step.
        let tpot = |f: f64| {
            Ok(if f < 1.0 {
                20.0 * f
            } else {
                20.0 + 60.0 * (f - 1.0)
            })
        };
        let fit = fit_step_scale(23.0, tpot).unwrap();
        assert!((fit.factor - 1.05).abs() < 1e-3, "{fit:?}");
    }

    #[test]
    fn a_served_tpot_the_plant_cannot_reach_is_refused_with_both_ends() {
        let err = fit_step_scale(500.0, |f| Ok(20.0 * f)).unwrap_err();
        assert_eq!(
            err,
            CalibrateError::OutOfRange {
                target_ms: 500.0,
                lo: 0.25,
                lo_ms: 5.0,
                hi: 4.0,
                hi_ms: 80.0
            }
        );
        assert!(err.to_string().contains("500.000 ms"), "{err}");
    }

    #[test]
    fn no_served_tpot_and_a_replay_without_one_are_errors() {
        assert!(matches!(
            fit_step_scale(f64::NAN, Ok),
            Err(CalibrateError::NoTarget(_))
        ));
        assert!(matches!(
            fit_step_scale(0.0, Ok),
            Err(CalibrateError::NoTarget(_))
        ));
        let err = fit_step_scale(20.0, |_| Ok(f64::NAN)).unwrap_err();
        assert_eq!(err, CalibrateError::NoTpot { factor: 0.25 });
        let err = fit_step_scale(20.0, |_| Err("replay failed".into())).unwrap_err();
        assert_eq!(err.to_string(), "replay failed");
    }

    #[test]
    fn a_search_that_does_not_converge_returns_the_closest_factor_it_ran() {
        // A step in the TPOT (a batch boundary): no factor gives 23 exactly; 24 is closest,
        // and the search closes in on where it starts.
        let fit = fit_step_scale(23.0, |f| Ok(if f < 1.1 { 20.0 } else { 24.0 })).unwrap();
        assert_eq!(fit.runs, MAX_RUNS);
        assert!((fit.factor - 1.1).abs() < 1e-6, "{fit:?}");
    }
}
