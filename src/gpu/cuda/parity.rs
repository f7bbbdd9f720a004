//! Parity against a reference run (PyTorch on the H200 machine, or the CPU reference): the
//! same requests share the paged cache with interleaved pages, prefill then teacher-forced
//! greedy decode steps; reports the logits' relative error and greedy-token agreement.
//!
//! Reference directory: `meta.json` = {"prompts": [[ids]], "steps": N, "vocab": V,
//! "tokens": [[t_0 .. t_N]]} (t_0 from the prefill, t_s from decode step s) and
//! `logits.f32` = little-endian f32 [prompts][N + 1][V]; optionally `logits32.f32`, the
//! same positions computed in float32, which separates bf16 rounding from disagreement.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::backend::{CudaBackend, Launch};
use crate::gpu::{BackendError, StepRow};

#[derive(Debug, Clone, Deserialize)]
pub struct RefMeta {
    pub prompts: Vec<Vec<u32>>,
    pub steps: usize,
    pub vocab: usize,
    pub tokens: Vec<Vec<u32>>,
}

/// A reference run loaded from disk.
pub struct Reference {
    pub meta: RefMeta,
    /// [prompt][position (0 = prefill)][vocab]
    pub logits: Vec<f32>,
    /// The float32 run, same layout, when present.
    pub logits32: Option<Vec<f32>>,
}

fn read_f32(path: &Path, n: usize) -> Result<Vec<f32>, BackendError> {
    let raw = std::fs::read(path)
        .map_err(|e| BackendError::Failed(format!("{}: {e}", path.display())))?;
    if raw.len() != n * 4 {
        return Err(BackendError::Failed(format!(
            "{}: {} bytes, meta.json implies {}",
            path.display(),
            raw.len(),
            n * 4
        )));
    }
    Ok(raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

impl Reference {
    pub fn load(dir: &Path) -> Result<Self, BackendError> {
        let bad = |m: String| BackendError::Failed(format!("{}: {m}", dir.display()));
        let text = std::fs::read_to_string(dir.join("meta.json"))
            .map_err(|e| bad(format!("meta.json: {e}")))?;
        let meta: RefMeta = serde_json::from_str(&text).map_err(|e| {
            bad(format!(
                "meta.json line {} column {}: {e}",
                e.line(),
                e.column()
            ))
        })?;
        let n = meta.prompts.len() * (meta.steps + 1) * meta.vocab;
        if meta.tokens.len() != meta.prompts.len()
            || meta.tokens.iter().any(|t| t.len() != meta.steps + 1)
        {
            return Err(bad("meta.json needs steps + 1 tokens per prompt".into()));
        }
        let logits = read_f32(&dir.join("logits.f32"), n)?;
        let p32 = dir.join("logits32.f32");
        let logits32 = if p32.exists() {
            Some(read_f32(&p32, n)?)
        } else {
            None
        };
        Ok(Reference {
            meta,
            logits,
            logits32,
        })
    }

    fn row(&self, prompt: usize, pos: usize) -> &[f32] {
        &self.logits[self.span(prompt, pos)]
    }

    fn span(&self, prompt: usize, pos: usize) -> std::ops::Range<usize> {
        let v = self.meta.vocab;
        let o = (prompt * (self.meta.steps + 1) + pos) * v;
        o..o + v
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ParityReport {
    pub prompts: usize,
    pub steps: usize,
    /// max over positions of max|gpu - ref| / max|ref|.
    pub max_rel_err: f64,
    /// mean over positions of ||gpu - ref||_2 / ||ref||_2.
    pub mean_rel_l2: f64,
    /// Positions where the GPU's greedy token equals the reference's.
    pub greedy_agree: usize,
    pub positions: usize,
    /// (prompt, position, max rel err) of the worst position; position 0 is the prefill.
    pub worst: (usize, usize, f64),
    /// Against the float32 run, when the reference has one.
    pub vs_f32: Option<F32Compare>,
    /// SPEC §6's criterion: our max relative error against float32 is no larger than the
    /// reference's own bf16 run's (`None` without a float32 run).
    pub criterion_met: Option<bool>,
}

/// Errors of our logits and of the reference's bf16 logits, both against float32.
#[derive(Debug, Clone, Serialize)]
pub struct F32Compare {
    pub ours_max_rel_err: f64,
    pub ours_mean_rel_l2: f64,
    pub reference_bf16_max_rel_err: f64,
    pub reference_bf16_mean_rel_l2: f64,
}

#[derive(Default)]
struct Acc {
    max_rel: f64,
    sum_l2: f64,
    n: usize,
}

impl Acc {
    fn add(&mut self, a: &[f32], b: &[f32]) {
        let (m, l2) = rel_errors(a, b);
        self.max_rel = self.max_rel.max(m);
        self.sum_l2 += l2;
        self.n += 1;
    }
    fn mean_l2(&self) -> f64 {
        self.sum_l2 / self.n.max(1) as f64
    }
}

/// max|a-b|/max|b| and ||a-b||/||b||.
pub fn rel_errors(a: &[f32], b: &[f32]) -> (f64, f64) {
    let (mut dmax, mut bmax, mut d2, mut b2) = (0f64, 0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let d = (x as f64 - y as f64).abs();
        dmax = dmax.max(d);
        bmax = bmax.max((y as f64).abs());
        d2 += d * d;
        b2 += (y as f64) * (y as f64);
    }
    (
        dmax / bmax.max(f64::MIN_POSITIVE),
        (d2 / b2.max(f64::MIN_POSITIVE)).sqrt(),
    )
}

/// Runs the reference's requests on `b`; pages interleave across requests (request i's
/// j-th page is j * n + i).
pub fn run(
    b: &mut CudaBackend,
    r: &Reference,
    launch: Launch,
) -> Result<ParityReport, BackendError> {
    let n = r.meta.prompts.len();
    let p = b.capacity_page_size();
    let steps = r.meta.steps;
    if r.meta.vocab != b.shape().vocab {
        return Err(BackendError::Failed(format!(
            "reference vocab {} != model vocab {}",
            r.meta.vocab,
            b.shape().vocab
        )));
    }
    let pages: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            let per = (r.meta.prompts[i].len() + steps + 1).div_ceil(p);
            (0..per).map(|j| (j * n + i) as u32).collect()
        })
        .collect();
    let (mut vs_ref, mut ours32, mut ref32, mut agree) =
        (Acc::default(), Acc::default(), Acc::default(), 0);
    let mut worst = (0, 0, 0f64);
    let mut score = |got: &[f32], i: usize, pos: usize| {
        let before = vs_ref.max_rel;
        vs_ref.add(got, r.row(i, pos));
        if vs_ref.max_rel > before {
            worst = (i, pos, vs_ref.max_rel);
        }
        if let Some(l32) = &r.logits32 {
            ours32.add(got, &l32[r.span(i, pos)]);
            ref32.add(r.row(i, pos), &l32[r.span(i, pos)]);
        }
        agree += (super::cpu_ref::argmax(got) == r.meta.tokens[i][pos]) as usize;
    };
    for (i, (prompt, pg)) in r.meta.prompts.iter().zip(&pages).enumerate() {
        let greedy = crate::sampling::SampleRow::GREEDY;
        let (_, logits) = b.prefill_in(i as u64, Some(i as u32), prompt, pg, greedy)?;
        score(&logits, i, 0);
    }
    for s in 0..steps {
        let rows: Vec<StepRow> = (0..n)
            .map(|i| StepRow {
                id: i as u64,
                slot: i as u32,
                context_len: (r.meta.prompts[i].len() + s) as u32,
                last_token: r.meta.tokens[i][s],
                pages: pages[i].clone(),
            })
            .collect();
        let (_, logits) = b.decode(&rows, launch, true)?;
        for (i, l) in logits.iter().enumerate() {
            score(l, i, s + 1);
        }
    }
    Ok(ParityReport {
        prompts: n,
        steps,
        max_rel_err: vs_ref.max_rel,
        mean_rel_l2: vs_ref.mean_l2(),
        greedy_agree: agree,
        positions: vs_ref.n,
        worst,
        vs_f32: r.logits32.as_ref().map(|_| F32Compare {
            ours_max_rel_err: ours32.max_rel,
            ours_mean_rel_l2: ours32.mean_l2(),
            reference_bf16_max_rel_err: ref32.max_rel,
            reference_bf16_mean_rel_l2: ref32.mean_l2(),
        }),
        criterion_met: r.logits32.as_ref().map(|_| ours32.max_rel <= ref32.max_rel),
    })
}

/// A reference run computed by the f32 CPU model: greedy tokens, teacher-forced like `run`.
pub fn cpu_reference(
    m: &super::cpu_ref::CpuModel,
    prompts: &[Vec<u32>],
    steps: usize,
) -> Reference {
    let vocab = m.shape.vocab;
    let mut logits = Vec::with_capacity(prompts.len() * (steps + 1) * vocab);
    let mut tokens = Vec::new();
    for p in prompts {
        let mut cache = m.new_cache();
        let mut last = m.forward(&mut cache, p).pop().unwrap_or_default();
        let mut toks = Vec::new();
        for _ in 0..=steps {
            let t = super::cpu_ref::argmax(&last);
            toks.push(t);
            logits.extend_from_slice(&last);
            if toks.len() <= steps {
                last = m.forward(&mut cache, &[t]).pop().unwrap_or_default();
            }
        }
        tokens.push(toks);
    }
    Reference {
        meta: RefMeta {
            prompts: prompts.to_vec(),
            steps,
            vocab,
            tokens,
        },
        logits,
        logits32: None,
    }
}

/// The CPU model's logits for the first `prompts` prompts of `meta`, fed the reference's
/// tokens (so they line up with the reference's rows), positions 0..=`steps`.
pub fn cpu_forced(
    m: &super::cpu_ref::CpuModel,
    meta: &RefMeta,
    prompts: usize,
    steps: usize,
) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for (p, toks) in meta.prompts.iter().zip(&meta.tokens).take(prompts) {
        let mut cache = m.new_cache();
        out.push(m.forward(&mut cache, p).pop().unwrap_or_default());
        for &t in toks.iter().take(steps.min(meta.steps)) {
            out.push(m.forward(&mut cache, &[t]).pop().unwrap_or_default());
        }
    }
    out
}

impl Reference {
    /// Row (prompt, position) of the bf16 logits and, when present, of the float32 logits.
    pub fn rows(&self, prompt: usize, pos: usize) -> (&[f32], Option<&[f32]>) {
        let sp = self.span(prompt, pos);
        (
            &self.logits[sp.clone()],
            self.logits32.as_ref().map(|l| &l[sp]),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::cuda::cpu_ref::CpuModel;
    use crate::gpu::cuda::shape::ModelShape;

    #[test]
    fn relative_errors_scale_with_the_reference() {
        let (m, l2) = rel_errors(&[1.0, 2.0, 4.1], &[1.0, 2.0, 4.0]);
        assert!((m - 0.025).abs() < 1e-6 && l2 > 0.0 && l2 < m);
        assert_eq!(rel_errors(&[3.0, -1.0], &[3.0, -1.0]), (0.0, 0.0));
    }

    #[test]
    fn cpu_reference_feeds_its_own_greedy_tokens() {
        let m = CpuModel::seeded(&ModelShape::named("tiny").unwrap(), 3);
        let r = cpu_reference(&m, &[vec![1, 2, 3], vec![7]], 2);
        assert_eq!(r.logits.len(), 2 * 3 * 1024);
        for (i, toks) in r.meta.tokens.iter().enumerate() {
            for (s, &t) in toks.iter().enumerate() {
                assert_eq!(super::super::cpu_ref::argmax(r.row(i, s)), t);
            }
        }
    }
}
