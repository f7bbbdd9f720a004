//! The retained-state checks, over any step backend (the CPU reference in the tests and the
//! CPU measurements, the CUDA backend in `genslot-gpu check-retained`):
//! - `drafted_vs_plain`: each prompt alone on a plain backend and on a drafting one; the
//!   tokens must be identical; reports tokens per step and the wall time of each;
//! - `paused_vs_solo`: several requests interleaved on one backend, each left out of many
//!   steps as a paused or displaced request is, against each alone on a reference backend.

use std::time::Instant;

use serde::Serialize;

use super::drive::{interleaved, solo, PageFor};
use crate::gpu::{BackendError, ContextArrival, StepBackend};
use crate::sampling::SamplingParams;

/// The sampling mix the paused-vs-solo checks run: every third request sampled (temperature 1,
/// top-p 0.9) with its index as the seed, the others greedy, so both kinds are checked.
pub fn mixed_sampling(i: usize) -> SamplingParams {
    match i % 3 {
        2 => SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            top_k: 0,
            seed: Some(i as u64),
        },
        _ => SamplingParams::GREEDY,
    }
}

/// One prompt set, plain against drafted.
#[derive(Debug, Clone, Serialize)]
pub struct DraftedReport {
    pub set: String,
    pub prompts: usize,
    /// Tokens generated per prompt.
    pub tokens: usize,
    /// Prompts whose drafted tokens equal the plain ones.
    pub identical: usize,
    pub plain_steps: u64,
    pub drafted_steps: u64,
    /// Tokens per drafted step (tokens generated ÷ steps that computed a row).
    pub tokens_per_step: f64,
    /// Wall time of the whole set, plain and drafted (arrivals included).
    pub plain_s: f64,
    pub drafted_s: f64,
    /// The first prompt whose tokens differ: (prompt, first differing index).
    pub first_difference: Option<(usize, usize)>,
}

/// Each of `reqs` alone, `n` tokens, on `plain` and on `drafted`.
pub fn drafted_vs_plain(
    set: &str,
    plain: &mut dyn StepBackend,
    drafted: &mut dyn StepBackend,
    reqs: &[ContextArrival],
    n: usize,
    pages: PageFor<'_>,
) -> Result<DraftedReport, BackendError> {
    let mut r = DraftedReport {
        set: set.to_owned(),
        prompts: reqs.len(),
        tokens: n,
        identical: 0,
        plain_steps: 0,
        drafted_steps: 0,
        tokens_per_step: 0.0,
        plain_s: 0.0,
        drafted_s: 0.0,
        first_difference: None,
    };
    for (i, req) in reqs.iter().enumerate() {
        let t0 = Instant::now();
        let want = solo(plain, req, n, pages)?;
        let t1 = Instant::now();
        let got = solo(drafted, req, n, pages)?;
        r.drafted_s += t1.elapsed().as_secs_f64();
        r.plain_s += (t1 - t0).as_secs_f64();
        r.plain_steps += u64::from(want.steps);
        r.drafted_steps += u64::from(got.steps);
        if got.tokens == want.tokens {
            r.identical += 1;
        } else if r.first_difference.is_none() {
            let at = got
                .tokens
                .iter()
                .zip(&want.tokens)
                .position(|(a, b)| a != b)
                .unwrap_or(n);
            r.first_difference = Some((i, at));
        }
    }
    r.tokens_per_step = (reqs.len() * n) as f64 / r.drafted_steps.max(1) as f64;
    Ok(r)
}

/// Requests interleaved with pauses, against each alone.
#[derive(Debug, Clone, Serialize)]
pub struct PausedReport {
    pub label: String,
    pub requests: usize,
    pub tokens: usize,
    /// Requests whose tokens equal their solo run's.
    pub identical: usize,
    /// Steps a request was left out of while unfinished, summed over requests.
    pub left_out: u64,
}

/// Request i is left out of step s when `(7s + 3i) mod 5 < 2`: two steps in five, in
/// varying company, so every request pauses and resumes many times.
pub fn left_out(step: u32, i: usize) -> bool {
    (step as usize * 7 + i * 3) % 5 < 2
}

/// `reqs` interleaved on `b` (each left out by [`left_out`]) against each alone on
/// `reference`, `n` tokens each.
pub fn paused_vs_solo(
    label: &str,
    b: &mut dyn StepBackend,
    reference: &mut dyn StepBackend,
    reqs: &[ContextArrival],
    n: usize,
    pages: PageFor<'_>,
) -> Result<PausedReport, BackendError> {
    let mut out_steps = 0u64;
    let got = interleaved(b, reqs, n, pages, |s, i| {
        let out = left_out(s, i);
        out_steps += u64::from(out);
        !out
    })?;
    let mut identical = 0;
    for (r, g) in reqs.iter().zip(&got) {
        identical += usize::from(solo(reference, r, n, pages)?.tokens == g.tokens);
    }
    Ok(PausedReport {
        label: label.to_owned(),
        requests: reqs.len(),
        tokens: n,
        identical,
        left_out: out_steps,
    })
}
