//! `genslot-gpu sampler`: the device sampler (sample.cu) alone, on seeded Gaussian logits of a
//! chosen spread, at each sampling mode and row count. A decode step's sampler sees the
//! lm_head's logits, and how many tokens top-p keeps decides which path a row takes: the
//! bench's random weights are one case, a trained model's usually far fewer tokens. The
//! spread (standard deviation of the logits before the temperature) sets it, and the report
//! gives the nucleus it made. Each launch is timed back to back on the same logits (the first pass
//! of a launch finds the rows in L2 where they fit, as the lm_head leaves them in a step),
//! and every row's token is checked against `sampling::sample_row`.

use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::device::{Gpu, Which};
use super::shape::ModelShape;
use super::step_options::StepOptions;
use crate::gpu::BackendError;
use crate::sampling::{row_key, sample_row, SampleRow};

/// The temperature of the sampled modes and the top-p of those that cut a nucleus (also the
/// nucleus `SpreadNucleus` reports).
const TEMPERATURE: f32 = 0.8;
const TOP_P: f32 = 0.95;

/// The modes timed: (name, temperature, top-p, top-k).
pub const MODES: [(&str, f32, f32, i32); 5] = [
    ("greedy", 0.0, 1.0, 0),
    ("temperature 0.8", TEMPERATURE, 1.0, 0),
    ("top-p 0.95", TEMPERATURE, TOP_P, 0),
    ("top-k 50", TEMPERATURE, 1.0, 50),
    ("top-k 50 + top-p 0.95", TEMPERATURE, TOP_P, 50),
];

#[derive(Debug, Clone, Serialize)]
pub struct SamplerPoint {
    /// Standard deviation of the logits.
    pub spread: f32,
    pub mode: &'static str,
    pub rows: usize,
    /// One launch, all rows.
    pub us: f64,
    /// Rows whose token equals `sampling::sample_row`'s.
    pub agree: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct SpreadNucleus {
    pub spread: f32,
    /// The tokens top-p 0.95 keeps at temperature 0.8, over the rows: median and largest.
    pub median: usize,
    pub max: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct SamplerReport {
    pub device: String,
    pub vocab: usize,
    pub launch: String,
    pub nucleus: Vec<SpreadNucleus>,
    pub points: Vec<SamplerPoint>,
}

/// Times the sampler at each spread, mode and row count (`iters` launches each).
pub fn run(
    s: &ModelShape,
    opts: StepOptions,
    spreads: &[f32],
    batches: &[usize],
    iters: usize,
) -> Result<SamplerReport, BackendError> {
    let vocab = s.vocab;
    let max_rows = batches.iter().copied().max().unwrap_or(1).max(1);
    let gpu = Gpu::new(0, (s.head_dim, s.group()), opts)?;
    let w = Which::Decode;
    let logits_d = gpu.alloc(max_rows * vocab * 4, w)?;
    let params_d = gpu.alloc(max_rows * std::mem::size_of::<SampleRow>(), w)?;
    let out_d = gpu.alloc(max_rows * 4, w)?;
    let (mut nucleus, mut points) = (Vec::new(), Vec::new());
    for (si, &spread) in spreads.iter().enumerate() {
        let logits = gaussian_logits(max_rows * vocab, spread, si as u64);
        gpu.htod(w, logits_d.ptr, &logits)?;
        let mut kept: Vec<usize> = logits
            .chunks(vocab)
            .map(|row| nucleus_size(row, TEMPERATURE, f64::from(TOP_P)))
            .collect();
        kept.sort_unstable();
        nucleus.push(SpreadNucleus {
            spread,
            median: kept[kept.len() / 2],
            max: kept[kept.len() - 1],
        });
        for &(mode, temperature, top_p, top_k) in &MODES {
            let params: Vec<SampleRow> = (0..max_rows)
                .map(|r| SampleRow {
                    temperature,
                    top_p,
                    top_k,
                    banned: -1,
                    key: row_key(r as u64, 1000 + si as u64),
                })
                .collect();
            gpu.htod(w, params_d.ptr, &params)?;
            // The host's draw of each row, once: every batch size launches the first rows.
            let want: Vec<u32> = logits
                .chunks(vocab)
                .zip(&params)
                .map(|(row, p)| sample_row(row, p))
                .collect();
            for &rows in batches {
                let launch =
                    || gpu.sample_rows(w, logits_d.ptr, vocab, params_d.ptr, out_d.ptr, rows);
                launch()?;
                gpu.sync(w)?;
                let t0 = Instant::now();
                for _ in 0..iters {
                    launch()?;
                }
                gpu.sync(w)?;
                let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
                let mut toks = vec![0i32; rows];
                gpu.dtoh(w, &mut toks, out_d.ptr)?;
                let agree = toks
                    .iter()
                    .zip(&want)
                    .filter(|(&t, &h)| t as i64 == i64::from(h))
                    .count();
                // Without top-p no float sum enters a draw: the device must agree exactly.
                if top_p >= 1.0 && agree != rows {
                    return Err(BackendError::Failed(format!(
                        "{mode} at spread {spread}: {agree} of {rows} rows drew the host's token"
                    )));
                }
                points.push(SamplerPoint {
                    spread,
                    mode,
                    rows,
                    us,
                    agree,
                });
            }
        }
    }
    Ok(SamplerReport {
        device: gpu.name.clone(),
        vocab,
        launch: opts.describe(),
        nucleus,
        points,
    })
}

/// `n` seeded normal values of standard deviation `spread` (Box–Muller).
fn gaussian_logits(n: usize, spread: f32, seed: u64) -> Vec<f32> {
    let mut rng = SmallRng::seed_from_u64(0x5a3d_1e00 ^ seed);
    (0..n)
        .map(|_| {
            let u1: f64 = 1.0 - rng.random::<f64>();
            let u2: f64 = rng.random();
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            (z * f64::from(spread)) as f32
        })
        .collect()
}

/// The tokens top-p `top_p` keeps of `row` at `temperature`: the fewest largest whose
/// probabilities reach `top_p`.
fn nucleus_size(row: &[f32], temperature: f32, top_p: f64) -> usize {
    let mut x: Vec<f64> = row
        .iter()
        .map(|&v| f64::from(v) / f64::from(temperature))
        .collect();
    x.sort_unstable_by(|a, b| b.total_cmp(a));
    let m = x[0];
    let z: f64 = x.iter().map(|v| (v - m).exp()).sum();
    let mut acc = 0.0;
    for (i, v) in x.iter().enumerate() {
        acc += (v - m).exp() / z;
        if acc >= top_p {
            return i + 1;
        }
    }
    x.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wider_spread_keeps_a_smaller_nucleus() {
        let flat = gaussian_logits(50_000, 0.5, 1);
        let peaked = gaussian_logits(50_000, 4.0, 1);
        let (a, b) = (
            nucleus_size(&flat, 0.8, 0.95),
            nucleus_size(&peaked, 0.8, 0.95),
        );
        assert!(a > 20_000, "flat logits keep most of the row: {a}");
        assert!(b < 200, "peaked logits keep a few: {b}");
    }

    #[test]
    fn the_nucleus_of_one_dominant_token_is_that_token() {
        let mut row = vec![0.0f32; 1000];
        row[7] = 40.0;
        assert_eq!(nucleus_size(&row, 1.0, 0.95), 1);
    }
}
