//! Fitting the decode step-time model `t(B, ΣL)` (SPEC §8.2) to measured step times, and
//! the KV transfer time to measured transfers, by least squares in relative error (a 5 ms
//! step and a 100 ms step count alike), with every point's residual reported.
//!
//! Step model: `t = base + B·per_request + ΣL·per_kv_token`, and, above a batch size J,
//! `+ jump + (B − J)·per_request_above` (the reference's GPU shows such a step). J is
//! given, or chosen among the measured batch sizes with at least two distinct sizes on each
//! side, and kept only when it at least halves the squared error of the plain model.
//! The fit lives in the local [`StepFit`], converted to the plant's `StepModel` at the edge.

use serde::Serialize;

use crate::timing::StepModel;

/// One measured step: batch size, total context tokens read (ΣL), milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepPoint {
    pub batch: u32,
    pub kv_tokens: u64,
    pub ms: f64,
}

/// One measured KV transfer: context tokens, milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TransferPoint {
    pub context_tokens: u64,
    pub ms: f64,
}

/// The step above a batch size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Jump {
    /// The jump applies to batches larger than this.
    pub above: u32,
    pub jump_ms: f64,
    pub per_request_above_ms: f64,
}

/// A fitted step model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepFit {
    pub base_ms: f64,
    pub per_request_ms: f64,
    pub per_kv_token_ns: f64,
    pub jump: Option<Jump>,
}

impl StepFit {
    pub fn ms(&self, batch: u32, kv_tokens: u64) -> f64 {
        let mut t = self.base_ms
            + f64::from(batch) * self.per_request_ms
            + kv_tokens as f64 * self.per_kv_token_ns * 1e-6;
        if let Some(j) = self.jump.filter(|j| batch > j.above) {
            t += j.jump_ms + f64::from(batch - j.above) * j.per_request_above_ms;
        }
        t
    }

    /// The plant's step model.
    pub fn to_step_model(&self, tokens_per_step: f64) -> StepModel {
        StepModel {
            base_ms: self.base_ms,
            per_request_ms: self.per_request_ms,
            per_kv_token_ns: self.per_kv_token_ns,
            jump_above: self.jump.map(|j| j.above),
            jump_ms: self.jump.map_or(0.0, |j| j.jump_ms),
            per_request_above_ms: self.jump.map_or(0.0, |j| j.per_request_above_ms),
            tokens_per_step,
        }
    }
}

/// A fitted transfer model: `base + context tokens · per_token`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TransferFit {
    pub base_ms: f64,
    pub per_token_us: f64,
}

impl TransferFit {
    pub fn ms(&self, context_tokens: u64) -> f64 {
        self.base_ms + context_tokens as f64 * self.per_token_us * 1e-3
    }
}

/// A point's measured and fitted value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Residual {
    /// Batch size (1 for a transfer).
    pub batch: u32,
    /// ΣL of a step, or the context of a transfer.
    pub tokens: u64,
    pub measured_ms: f64,
    pub fitted_ms: f64,
    /// (fitted − measured) / measured.
    pub rel: f64,
}

/// Residuals and their summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Residuals {
    pub points: Vec<Residual>,
    /// Largest |rel|, and its point.
    pub worst_rel: f64,
    pub worst: Option<Residual>,
    /// Root mean square of rel.
    pub rms_rel: f64,
}

impl Residuals {
    fn of(points: Vec<Residual>) -> Self {
        let worst = points
            .iter()
            .copied()
            .max_by(|a, b| a.rel.abs().total_cmp(&b.rel.abs()));
        let rms =
            (points.iter().map(|r| r.rel * r.rel).sum::<f64>() / points.len().max(1) as f64).sqrt();
        Residuals {
            worst_rel: worst.map_or(0.0, |w| w.rel.abs()),
            worst,
            rms_rel: rms,
            points,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    #[error("{needed} parameters need at least {needed} points with distinct settings; got {got}")]
    TooFewPoints { needed: usize, got: usize },
    #[error("a measured time is not a positive finite number of milliseconds: {0}")]
    BadTime(f64),
    #[error("the points cannot separate the terms (the least-squares system is singular)")]
    Singular,
    #[error("jump above {0}: needs at least two distinct measured batch sizes above it and two at or below")]
    JumpUnsupported(u32),
}

/// Which jump to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JumpChoice {
    None,
    Auto,
    Above(u32),
}

/// Solves `min ‖A x − b‖²` (rows × cols, row-major) by Householder QR on column-scaled A.
fn least_squares(rows: usize, cols: usize, a: &[f64], b: &[f64]) -> Result<Vec<f64>, FitError> {
    let mut m = a.to_vec();
    let mut y = b.to_vec();
    // Scale columns to unit max so ΣL (millions) and 1 are comparable.
    let scale: Vec<f64> = (0..cols)
        .map(|j| {
            let s = (0..rows).map(|i| m[i * cols + j].abs()).fold(0.0, f64::max);
            if s > 0.0 {
                s
            } else {
                1.0
            }
        })
        .collect();
    for i in 0..rows {
        for j in 0..cols {
            m[i * cols + j] /= scale[j];
        }
    }
    for k in 0..cols {
        let norm = (k..rows)
            .map(|i| m[i * cols + k].powi(2))
            .sum::<f64>()
            .sqrt();
        if norm < 1e-12 {
            return Err(FitError::Singular);
        }
        let alpha = if m[k * cols + k] > 0.0 { -norm } else { norm };
        let mut v: Vec<f64> = (k..rows).map(|i| m[i * cols + k]).collect();
        v[0] -= alpha;
        let vnorm2: f64 = v.iter().map(|x| x * x).sum();
        if vnorm2 < 1e-300 {
            continue;
        }
        for j in k..cols {
            let dot: f64 = (k..rows).map(|i| v[i - k] * m[i * cols + j]).sum();
            let f = 2.0 * dot / vnorm2;
            for i in k..rows {
                m[i * cols + j] -= f * v[i - k];
            }
        }
        let dot: f64 = (k..rows).map(|i| v[i - k] * y[i]).sum();
        let f = 2.0 * dot / vnorm2;
        for i in k..rows {
            y[i] -= f * v[i - k];
        }
    }
    let mut x = vec![0.0; cols];
    for k in (0..cols).rev() {
        let d = m[k * cols + k];
        if d.abs() < 1e-10 {
            return Err(FitError::Singular);
        }
        let s: f64 = ((k + 1)..cols).map(|j| m[k * cols + j] * x[j]).sum();
        x[k] = (y[k] - s) / d;
    }
    Ok(x.iter().zip(&scale).map(|(v, s)| v / s).collect())
}

/// Relative least squares: each row divided by its measurement.
fn relative_fit(features: &[Vec<f64>], ms: &[f64]) -> Result<Vec<f64>, FitError> {
    let cols = features.first().map_or(0, Vec::len);
    let rows = features.len();
    let mut a = Vec::with_capacity(rows * cols);
    for (f, &t) in features.iter().zip(ms) {
        a.extend(f.iter().map(|x| x / t));
    }
    least_squares(rows, cols, &a, &vec![1.0; rows])
}

fn step_features(p: &StepPoint, jump: Option<u32>) -> Vec<f64> {
    let b = f64::from(p.batch);
    let mut f = vec![1.0, b, p.kv_tokens as f64];
    if let Some(j) = jump {
        let above = p.batch > j;
        f.push(if above { 1.0 } else { 0.0 });
        f.push(if above { f64::from(p.batch - j) } else { 0.0 });
    }
    f
}

fn distinct_settings(points: &[StepPoint]) -> usize {
    let mut v: Vec<(u32, u64)> = points.iter().map(|p| (p.batch, p.kv_tokens)).collect();
    v.sort_unstable();
    v.dedup();
    v.len()
}

fn fit_with(points: &[StepPoint], jump: Option<u32>) -> Result<(StepFit, f64), FitError> {
    let needed = if jump.is_some() { 5 } else { 3 };
    if distinct_settings(points) < needed {
        return Err(FitError::TooFewPoints {
            needed,
            got: distinct_settings(points),
        });
    }
    let feats: Vec<Vec<f64>> = points.iter().map(|p| step_features(p, jump)).collect();
    let ms: Vec<f64> = points.iter().map(|p| p.ms).collect();
    let x = relative_fit(&feats, &ms)?;
    let fit = StepFit {
        base_ms: x[0],
        per_request_ms: x[1],
        per_kv_token_ns: x[2] * 1e6,
        jump: jump.map(|above| Jump {
            above,
            jump_ms: x[3],
            per_request_above_ms: x[4],
        }),
    };
    let sse = points
        .iter()
        .map(|p| ((fit.ms(p.batch, p.kv_tokens) - p.ms) / p.ms).powi(2))
        .sum();
    Ok((fit, sse))
}

/// Jump candidates: measured batch sizes with ≥ 2 distinct sizes above and ≥ 2 at or below.
fn jump_candidates(points: &[StepPoint]) -> Vec<u32> {
    let mut b: Vec<u32> = points.iter().map(|p| p.batch).collect();
    b.sort_unstable();
    b.dedup();
    b.iter()
        .copied()
        .filter(|&j| {
            b.iter().filter(|&&x| x > j).count() >= 2 && b.iter().filter(|&&x| x <= j).count() >= 2
        })
        .collect()
}

/// Fits the step model to `points`.
pub fn fit_steps(points: &[StepPoint], jump: JumpChoice) -> Result<(StepFit, Residuals), FitError> {
    if let Some(p) = points.iter().find(|p| !(p.ms.is_finite() && p.ms > 0.0)) {
        return Err(FitError::BadTime(p.ms));
    }
    let fit = match jump {
        JumpChoice::None => fit_with(points, None)?.0,
        JumpChoice::Above(j) => {
            if !jump_candidates(points).contains(&j) {
                return Err(FitError::JumpUnsupported(j));
            }
            fit_with(points, Some(j))?.0
        }
        JumpChoice::Auto => {
            let (plain, plain_sse) = fit_with(points, None)?;
            // A jump is a step that grows past a batch size (the reference's above 128): a
            // fit whose jump or slope past it is negative bends a curve, and no config takes it.
            let rises = |f: &StepFit| {
                f.jump
                    .is_some_and(|j| j.jump_ms >= 0.0 && j.per_request_above_ms >= 0.0)
            };
            let best = jump_candidates(points)
                .into_iter()
                .filter_map(|j| fit_with(points, Some(j)).ok())
                .filter(|(f, _)| rises(f))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            match best {
                Some((f, sse)) if sse <= 0.5 * plain_sse => f,
                _ => plain,
            }
        }
    };
    let residuals = points
        .iter()
        .map(|p| {
            let f = fit.ms(p.batch, p.kv_tokens);
            Residual {
                batch: p.batch,
                tokens: p.kv_tokens,
                measured_ms: p.ms,
                fitted_ms: f,
                rel: (f - p.ms) / p.ms,
            }
        })
        .collect();
    Ok((fit, Residuals::of(residuals)))
}

/// Fits the transfer model to `points`.
pub fn fit_transfer(points: &[TransferPoint]) -> Result<(TransferFit, Residuals), FitError> {
    if let Some(p) = points.iter().find(|p| !(p.ms.is_finite() && p.ms > 0.0)) {
        return Err(FitError::BadTime(p.ms));
    }
    let mut distinct: Vec<u64> = points.iter().map(|p| p.context_tokens).collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < 2 {
        return Err(FitError::TooFewPoints {
            needed: 2,
            got: distinct.len(),
        });
    }
    let feats: Vec<Vec<f64>> = points
        .iter()
        .map(|p| vec![1.0, p.context_tokens as f64])
        .collect();
    let ms: Vec<f64> = points.iter().map(|p| p.ms).collect();
    let x = relative_fit(&feats, &ms)?;
    let fit = TransferFit {
        base_ms: x[0],
        per_token_us: x[1] * 1e3,
    };
    let residuals = points
        .iter()
        .map(|p| {
            let f = fit.ms(p.context_tokens);
            Residual {
                batch: 1,
                tokens: p.context_tokens,
                measured_ms: p.ms,
                fitted_ms: f,
                rel: (f - p.ms) / p.ms,
            }
        })
        .collect();
    Ok((fit, Residuals::of(residuals)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthetic grid: batch 1–128 × context 1k–32k from a known model, times `noise(i)`.
    fn grid(truth: &StepFit, noise: impl Fn(usize) -> f64) -> Vec<StepPoint> {
        let mut v = Vec::new();
        for &b in &[1u32, 2, 4, 8, 16, 32, 64, 96, 128] {
            for &c in &[1024u64, 2048, 4096, 8192, 16384, 32768] {
                let kv = u64::from(b) * c;
                let i = v.len();
                v.push(StepPoint {
                    batch: b,
                    kv_tokens: kv,
                    ms: truth.ms(b, kv) * noise(i),
                });
            }
        }
        v
    }

    const TRUTH: StepFit = StepFit {
        base_ms: 5.9,
        per_request_ms: 0.008,
        per_kv_token_ns: 31.0,
        jump: None,
    };

    #[test]
    fn an_exact_grid_gives_back_its_model_with_zero_residuals() {
        let (fit, r) = fit_steps(&grid(&TRUTH, |_| 1.0), JumpChoice::Auto).unwrap();
        assert!((fit.base_ms - 5.9).abs() < 1e-9, "{fit:?}");
        assert!((fit.per_request_ms - 0.008).abs() < 1e-9);
        assert!((fit.per_kv_token_ns - 31.0).abs() < 1e-6);
        assert!(fit.jump.is_none(), "no jump in the data, none fitted");
        assert!(r.worst_rel < 1e-9);
        assert_eq!(r.points.len(), 54);
    }

    /// Steps that climb fast over the first few rows and slower after (the H100's grid) fit a
    /// "jump" falling past batch 4 exactly; auto takes only jumps that rise, as a config does.
    #[test]
    fn auto_never_fits_a_jump_that_falls() {
        let bending = StepFit {
            base_ms: 5.4,
            per_request_ms: 0.15,
            per_kv_token_ns: 42.4,
            jump: Some(Jump {
                above: 4,
                jump_ms: 0.1,
                per_request_above_ms: -0.145,
            }),
        };
        let points = grid(&bending, |_| 1.0);
        let (exact, r) = fit_steps(&points, JumpChoice::Above(4)).unwrap();
        assert!(r.worst_rel < 1e-9 && exact.jump.is_some_and(|j| j.per_request_above_ms < 0.0));
        let (fit, _) = fit_steps(&points, JumpChoice::Auto).unwrap();
        assert!(
            fit.jump
                .is_none_or(|j| j.jump_ms >= 0.0 && j.per_request_above_ms >= 0.0),
            "{fit:?}"
        );
    }

    #[test]
    fn noise_shows_in_the_residuals_and_the_fit_stays_close() {
        // ±3 % alternating noise.
        let noisy = grid(&TRUTH, |i| if i % 2 == 0 { 1.03 } else { 0.97 });
        let (fit, r) = fit_steps(&noisy, JumpChoice::Auto).unwrap();
        assert!((fit.per_kv_token_ns / 31.0 - 1.0).abs() < 0.05, "{fit:?}");
        assert!(r.worst_rel > 0.01 && r.worst_rel < 0.06, "{}", r.worst_rel);
        assert!(r.rms_rel > 0.01);
        let w = r.worst.unwrap();
        assert_eq!(w.rel.abs(), r.worst_rel);
    }

    #[test]
    fn a_jump_in_the_data_is_found_with_its_slope() {
        let truth = StepFit {
            jump: Some(Jump {
                above: 64,
                jump_ms: 4.0,
                per_request_above_ms: 0.05,
            }),
            ..TRUTH
        };
        let (fit, r) = fit_steps(&grid(&truth, |_| 1.0), JumpChoice::Auto).unwrap();
        let j = fit.jump.expect("jump found");
        assert_eq!(j.above, 64);
        assert!((j.jump_ms - 4.0).abs() < 1e-6 && (j.per_request_above_ms - 0.05).abs() < 1e-9);
        assert!(r.worst_rel < 1e-9);
        let model = fit.to_step_model(1.0);
        assert_eq!((model.jump_above, model.jump_ms), (Some(64), j.jump_ms));
        assert_eq!(model.per_request_above_ms, j.per_request_above_ms);
        // The plant's model and the fit agree, below the jump and above it.
        for b in [32, 96] {
            assert!(
                (model.step_s(b, b as u64 * 4096) * 1e3 - fit.ms(b as u32, b as u64 * 4096)).abs()
                    < 1e-9
            );
        }
    }

    #[test]
    fn a_forced_jump_needs_measured_batches_on_both_sides() {
        let g = grid(&TRUTH, |_| 1.0);
        assert_eq!(
            fit_steps(&g, JumpChoice::Above(96)),
            Err(FitError::JumpUnsupported(96))
        );
        assert!(fit_steps(&g, JumpChoice::Above(64)).is_ok());
    }

    #[test]
    fn too_few_or_bad_points_are_errors_not_fits() {
        let g = grid(&TRUTH, |_| 1.0);
        assert!(matches!(
            fit_steps(&g[..2], JumpChoice::None),
            Err(FitError::TooFewPoints { needed: 3, got: 2 })
        ));
        let mut bad = g.clone();
        bad[3].ms = 0.0;
        assert_eq!(
            fit_steps(&bad, JumpChoice::None),
            Err(FitError::BadTime(0.0))
        );
        // One batch size only: the batch and ΣL terms cannot be told from the base.
        let one: Vec<StepPoint> = g.iter().copied().filter(|p| p.batch == 8).collect();
        assert!(fit_steps(&one, JumpChoice::None).is_err());
    }

    #[test]
    fn transfer_fits_a_line_through_its_points() {
        let pts: Vec<TransferPoint> = [1024u64, 4096, 16384]
            .iter()
            .map(|&l| TransferPoint {
                context_tokens: l,
                ms: 0.4 + l as f64 * 0.03e-3 * 1e3 * 1e-3,
            })
            .collect();
        let (fit, r) = fit_transfer(&pts).unwrap();
        assert!((fit.base_ms - 0.4).abs() < 1e-9 && (fit.per_token_us - 0.03).abs() < 1e-9);
        assert!(r.worst_rel < 1e-9);
        assert!(fit_transfer(&pts[..1]).is_err());
    }
}
