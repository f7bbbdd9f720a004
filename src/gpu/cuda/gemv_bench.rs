//! `genslot-gpu gemv`: each weight product of a shape at 1 to `GEMV_MAX_ROWS` rows, once
//! through cuBLAS and once through the GEMV kernels (gemv.cu): the two outputs compared, and
//! each timed back to back over copies of the weight that together overflow the L2 cache, so
//! every launch streams its weight from HBM as a decode step does.

use std::time::Instant;

use serde::Serialize;

use super::device::{Gpu, Output, Product, Which, GEMV_MAX_ROWS};
use super::init::bf16_bits_to_f32;
use super::parity::rel_errors;
use super::shape::ModelShape;
use super::step_options::StepOptions;
use crate::gpu::BackendError;

/// Bytes of weight copies each product cycles through: several times the H200's 50 MB L2.
const RING_BYTES: usize = 512 << 20;

#[derive(Debug, Clone, Serialize)]
pub struct GemvRow {
    pub product: &'static str,
    /// Output features (weight rows) and input features.
    pub out: usize,
    pub inp: usize,
    pub rows: usize,
    pub cublas_us: f64,
    pub gemv_us: f64,
    /// Weight bytes over each one's time.
    pub cublas_gbs: f64,
    pub gemv_gbs: f64,
    /// Largest |gemv - cublas| over the largest |cublas|; NaN when the GEMV wrote a
    /// non-finite value.
    pub max_rel_err: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct GemvReport {
    pub device: String,
    pub shape: String,
    pub launch: String,
    pub rows: Vec<GemvRow>,
}

/// One product of a decoder layer (or the lm_head): (name, out, inp, output).
fn products(s: &ModelShape) -> Vec<(&'static str, usize, usize, Output)> {
    let hdim = s.heads * s.head_dim;
    vec![
        ("qkv", s.qkv_dim(), s.hidden, Output::Bf16),
        ("o", s.hidden, hdim, Output::AddF32),
        ("gate_up", 2 * s.ffn, s.hidden, Output::Bf16),
        ("down", s.hidden, s.ffn, Output::AddF32),
        ("lm_head", s.vocab, s.hidden, Output::F32),
    ]
}

/// Runs every product of `s` at every row count; `iters` timed launches each.
pub fn run(s: &ModelShape, opts: StepOptions, iters: usize) -> Result<GemvReport, BackendError> {
    let opts = StepOptions {
        gemv_rows: GEMV_MAX_ROWS,
        ..opts
    };
    let gpu = Gpu::new(0, (s.head_dim, s.group()), opts)?;
    let w = Which::Decode;
    let mut out = Vec::new();
    for (i, (name, n, k, output)) in products(s).into_iter().enumerate() {
        let y_f32 = output.is_f32();
        let bytes = n * k * 2;
        let copies = RING_BYTES.div_ceil(bytes).max(2);
        let ring = (0..copies)
            .map(|_| gpu.alloc(bytes, w))
            .collect::<Result<Vec<_>, _>>()?;
        for (c, wb) in ring.iter().enumerate() {
            gpu.init_uniform(w, wb.ptr, (n * k) as u64, 7, (i * 64 + c) as u32, 0.02, 0.0)?;
        }
        let x = gpu.alloc(GEMV_MAX_ROWS * k * 2, w)?;
        gpu.init_uniform(w, x.ptr, (GEMV_MAX_ROWS * k) as u64, 11, i as u32, 1.0, 0.0)?;
        let ybytes = GEMV_MAX_ROWS * n * if y_f32 { 4 } else { 2 };
        let (y_ref, y_gemv) = (gpu.alloc(ybytes, w)?, gpu.alloc(ybytes, w)?);
        for rows in 1..=GEMV_MAX_ROWS {
            // Added outputs start from zero in both, so one launch each compares the sums.
            for y in [&y_ref, &y_gemv] {
                gpu.zero(w, y.ptr, ybytes)?;
            }
            let product = |weight: u64, y: u64| Product {
                weight,
                out: n,
                inp: k,
                rows,
                x: x.ptr,
                y,
                output,
            };
            let wt = ring[0].ptr;
            gpu.gemm_cublas(w, &product(wt, y_ref.ptr))?;
            gpu.gemm(w, &product(wt, y_gemv.ptr))?;
            let (a, b) = (
                read(&gpu, y_gemv.ptr, rows * n, y_f32)?,
                read(&gpu, y_ref.ptr, rows * n, y_f32)?,
            );
            // rel_errors skips NaN (f64::max does): a non-finite output is reported as NaN.
            let max_rel_err = if a.iter().all(|v| v.is_finite()) {
                rel_errors(&a, &b).0
            } else {
                f64::NAN
            };
            let time = |gemv: bool| -> Result<f64, BackendError> {
                let launch = |j: usize| {
                    let wt = ring[j % copies].ptr;
                    if gemv {
                        gpu.gemm(w, &product(wt, y_gemv.ptr))
                    } else {
                        gpu.gemm_cublas(w, &product(wt, y_ref.ptr))
                    }
                };
                for j in 0..copies {
                    launch(j)?;
                }
                gpu.sync(w)?;
                let t0 = Instant::now();
                for j in 0..iters {
                    launch(j)?;
                }
                gpu.sync(w)?;
                Ok(t0.elapsed().as_secs_f64() * 1e6 / iters as f64)
            };
            let (cublas_us, gemv_us) = (time(false)?, time(true)?);
            let gbs = |us: f64| bytes as f64 / (us * 1e-6) / 1e9;
            out.push(GemvRow {
                product: name,
                out: n,
                inp: k,
                rows,
                cublas_us,
                gemv_us,
                cublas_gbs: gbs(cublas_us),
                gemv_gbs: gbs(gemv_us),
                max_rel_err,
            });
        }
    }
    Ok(GemvReport {
        device: gpu.name.clone(),
        shape: s.name.clone(),
        launch: opts.describe(),
        rows: out,
    })
}

/// `len` outputs at `ptr` as f32 (bf16 unless `f32`).
fn read(gpu: &Gpu, ptr: u64, len: usize, f32: bool) -> Result<Vec<f32>, BackendError> {
    if f32 {
        let mut v = vec![0f32; len];
        gpu.dtoh(Which::Decode, &mut v, ptr)?;
        Ok(v)
    } else {
        let mut v = vec![0u16; len];
        gpu.dtoh(Which::Decode, &mut v, ptr)?;
        Ok(v.into_iter().map(bf16_bits_to_f32).collect())
    }
}
