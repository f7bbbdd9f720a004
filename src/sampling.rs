//! Per-request sampling parameters (SPEC §6, §7) and the sampler itself. The HTTP layer
//! validates and fills the parameters; they travel with the request to the step backend.
//! The CUDA backend samples on the device (`kernels/sample.cu`) with the algorithm
//! [`sample`] writes out on the host, which the CPU reference and the tests use; the
//! timing-model backend has no logits and ignores them.
//!
//! The algorithm, with x = logit / temperature:
//! 1. greedy (temperature 0, or top_k 1): the first index of the largest logit;
//! 2. top-k: keep the tokens whose x is at least the k-th largest (ties kept);
//! 3. top-p: among those, each token's probability as an integer mass
//!    trunc(exp(x - max) / Σ exp(x - max) · 2³¹); keep the tokens whose x is at least the
//!    largest threshold where the kept mass reaches ceil(top_p · total);
//! 4. draw among the kept tokens by Gumbel-max: argmax of x + g, where g is a Gumbel
//!    variate hashed from the request's seed, the token's position in the sequence and the
//!    token id. The draw is exactly a sample of the renormalised distribution, and it
//!    depends on nothing but the logits, the seed and the position: the same request gives
//!    the same tokens run to run, in any batch, paused or not.
//!
//! A `banned` token (the model's EOS while fewer than `min_tokens` were produced) has
//! logit -inf for every step of the algorithm, greedy included; NaN logits count as -inf.

/// How a backend picks the next token from a request's logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy (argmax); otherwise logits are divided by it before the softmax.
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose probability
    /// reaches this; 1 = off.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 = off.
    pub top_k: u32,
    /// Seed of this request's random stream: the same seed, prompt and parameters give the
    /// same tokens run to run. `None`: the backend derives one from the request id.
    pub seed: Option<u64>,
}

impl SamplingParams {
    /// Argmax decoding, what a request gets when it asks for nothing else.
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: None,
    };

    pub fn is_greedy(&self) -> bool {
        // A NaN temperature is greedy too, as in the kernel.
        self.temperature.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) || self.top_k == 1
    }

    /// The seed a request's draws are keyed by: its own, or one derived from `request_id`.
    pub fn seed_for(&self, request_id: u64) -> u64 {
        self.seed
            .unwrap_or_else(|| splitmix64(request_id ^ 0x5EED_0000_0000_0000))
    }

    /// The device's per-row parameters for the token at `position` (the number of tokens
    /// before it in the sequence).
    pub fn device_row(&self, seed: u64, position: u64, banned: Option<u32>) -> SampleRow {
        SampleRow {
            temperature: if self.is_greedy() {
                0.0
            } else {
                self.temperature
            },
            top_p: self.top_p,
            top_k: i32::try_from(self.top_k).unwrap_or(i32::MAX),
            banned: banned.and_then(|b| i32::try_from(b).ok()).unwrap_or(-1),
            key: row_key(seed, position),
        }
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::GREEDY
    }
}

/// One row's sampling parameters as the device kernel reads them (`struct SampleRow` in
/// `kernels/sample.cu`: the same layout, 24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleRow {
    /// ≤ 0: greedy.
    pub temperature: f32,
    /// ≥ 1: off.
    pub top_p: f32,
    /// ≤ 0 or ≥ vocab: off.
    pub top_k: i32,
    /// A token never drawn, or -1.
    pub banned: i32,
    /// [`row_key`] of the request's seed and the token's position.
    pub key: u64,
}

impl SampleRow {
    /// Argmax with nothing banned (padding rows, parity runs).
    pub const GREEDY: SampleRow = SampleRow {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        banned: -1,
        key: 0,
    };
}

/// splitmix64, as in `kernels/init.cu` (the sampler's counter-based hash).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of one draw: the request's seed and the token's position, hashed.
pub fn row_key(seed: u64, position: u64) -> u64 {
    splitmix64(seed ^ splitmix64(position))
}

/// Token `token`'s Gumbel variate under `key`: u = (n + 0.5) / 2²³ from 23 hashed bits
/// (exact in f32, never 0 or 1), g = −ln(−ln u). The kernel's `gumbel_at`.
pub fn gumbel(key: u64, token: u32) -> f32 {
    let z = splitmix64(key ^ u64::from(token));
    let u = (((z >> 41) as u32) as f32 + 0.5) * (1.0 / 8_388_608.0);
    -(-u.ln()).ln()
}

/// Larger floats get larger keys (IEEE bits with the sign folded), the kernel's `order_key`.
pub fn order_key(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// First index of the largest value; NaN never wins; all -inf (or empty) gives 0.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = f32::NEG_INFINITY;
    let mut idx = 0u32;
    for (i, &x) in v.iter().enumerate() {
        if x > best {
            best = x;
            idx = i as u32;
        }
    }
    idx
}

/// Picks the next token from `logits` (see the module docs for the algorithm). `seed` is
/// [`SamplingParams::seed_for`]'s, `position` the number of tokens before this one.
pub fn sample(
    logits: &[f32],
    params: &SamplingParams,
    seed: u64,
    position: u64,
    banned: Option<u32>,
) -> u32 {
    sample_row(logits, &params.device_row(seed, position, banned))
}

/// [`sample`] on the device's row parameters.
pub fn sample_row(logits: &[f32], p: &SampleRow) -> u32 {
    let seen = |i: usize, v: f32| {
        if v.is_nan() || i as i64 == i64::from(p.banned) {
            f32::NEG_INFINITY
        } else {
            v
        }
    };
    let greedy =
        p.temperature.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) || p.top_k == 1;
    if greedy {
        let v: Vec<f32> = logits
            .iter()
            .enumerate()
            .map(|(i, &v)| seen(i, v))
            .collect();
        return argmax(&v);
    }
    let t = p.temperature;
    let x: Vec<f32> = logits
        .iter()
        .enumerate()
        .map(|(i, &v)| seen(i, v) / t)
        .collect();
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return 0;
    }
    let vocab = x.len();
    let mut floor = 0u32;
    if p.top_k > 0 && (p.top_k as usize) < vocab {
        let mut keys: Vec<u32> = x.iter().map(|&v| order_key(v)).collect();
        keys.sort_unstable_by(|a, b| b.cmp(a));
        floor = keys[p.top_k as usize - 1];
    }
    if p.top_p < 1.0 {
        let kept = |v: f32| order_key(v) >= floor;
        let z: f32 = x.iter().filter(|&&v| kept(v)).map(|&v| (v - m).exp()).sum();
        let mass = |v: f32| u64::from(((v - m).exp() / z * 2_147_483_648.0) as u32);
        let mut cands: Vec<(u32, u64)> = x
            .iter()
            .filter(|&&v| kept(v))
            .map(|&v| (order_key(v), mass(v)))
            .collect();
        let total: u64 = cands.iter().map(|c| c.1).sum();
        let target = ((f64::from(p.top_p) * total as f64).ceil() as u64).max(1);
        cands.sort_unstable_by_key(|c| std::cmp::Reverse(c.0));
        let mut acc = 0u64;
        for &(key, w) in &cands {
            acc += w;
            if acc >= target {
                floor = key;
                break;
            }
        }
    }
    let mut best = f32::NEG_INFINITY;
    let mut idx = 0u32;
    for (i, &v) in x.iter().enumerate() {
        if order_key(v) >= floor && v != f32::NEG_INFINITY {
            let s = v + gumbel(p.key, i as u32);
            if s > best {
                best = s;
                idx = i as u32;
            }
        }
    }
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, top_k: u32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            seed: Some(7),
        }
    }

    /// Frequencies of `draws` samples, one seed each, at position 3.
    fn frequencies(logits: &[f32], p: &SamplingParams, draws: u64) -> Vec<f64> {
        let mut n = vec![0u64; logits.len()];
        for seed in 0..draws {
            n[sample(logits, p, seed, 3, None) as usize] += 1;
        }
        n.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    fn softmax(x: &[f64]) -> Vec<f64> {
        let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
        let z: f64 = e.iter().sum();
        e.iter().map(|v| v / z).collect()
    }

    /// Every observed frequency within `tol` of its expected probability.
    fn assert_close(got: &[f64], want: &[f64], tol: f64) {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol,
                "token {i}: {g:.4} vs {w:.4} ({got:?})"
            );
        }
    }

    #[test]
    fn temperature_zero_and_top_k_one_are_argmax_whatever_the_seed() {
        let l = [0.5, 2.0, -1.0, 2.0, 1.9];
        for seed in 0..50 {
            assert_eq!(sample(&l, &params(0.0, 1.0, 0), seed, seed, None), 1);
            assert_eq!(sample(&l, &params(1.3, 0.9, 1), seed, 2, None), 1);
        }
        assert!(SamplingParams::GREEDY.is_greedy());
        assert!(params(f32::NAN, 1.0, 0).is_greedy());
    }

    #[test]
    fn temperature_sampling_follows_the_softmax_of_the_scaled_logits() {
        let l = [1.0f32, 0.0, 2.0, -1.0, 0.5];
        for t in [0.5f32, 1.0, 2.0] {
            let want = softmax(&l.iter().map(|&v| f64::from(v / t)).collect::<Vec<_>>());
            assert_close(&frequencies(&l, &params(t, 1.0, 0), 40_000), &want, 0.012);
        }
    }

    #[test]
    fn seeded_top_p_frequencies_match_the_truncated_renormalised_distribution() {
        // Probabilities 0.4, 0.25, 0.15, 0.1, 0.06, 0.04: top_p 0.7 keeps the first three
        // (0.4 + 0.25 < 0.7 ≤ 0.8), renormalised to 0.5, 0.3125, 0.1875.
        let probs = [0.4f64, 0.25, 0.15, 0.1, 0.06, 0.04];
        let l: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        let got = frequencies(&l, &params(1.0, 0.7, 0), 40_000);
        assert_close(&got, &[0.5, 0.3125, 0.1875, 0.0, 0.0, 0.0], 0.012);
        assert!(got[3..].iter().all(|&f| f == 0.0), "{got:?}");
        // 0.64 is reached by the first two (0.65), not by the first alone.
        let got = frequencies(&l, &params(1.0, 0.64, 0), 20_000);
        assert_close(&got, &[0.4 / 0.65, 0.25 / 0.65, 0.0, 0.0, 0.0, 0.0], 0.015);
        // Shuffled vocabulary order changes nothing but the ids.
        let perm = [4usize, 2, 0, 5, 1, 3];
        let shuffled: Vec<f32> = perm.iter().map(|&i| l[i]).collect();
        let got = frequencies(&shuffled, &params(1.0, 0.7, 0), 40_000);
        let want: Vec<f64> = perm
            .iter()
            .map(|&i| [0.5, 0.3125, 0.1875, 0.0, 0.0, 0.0][i])
            .collect();
        assert_close(&got, &want, 0.012);
    }

    #[test]
    fn top_k_keeps_the_k_most_likely_then_top_p_applies_to_them() {
        let l = [3.0f32, 1.0, 2.0, 0.0, 2.5];
        let ninf = f64::NEG_INFINITY;
        let want_k3 = softmax(&[3.0, ninf, 2.0, ninf, 2.5]);
        let got = frequencies(&l, &params(1.0, 1.0, 3), 30_000);
        assert_close(&got, &want_k3, 0.012);
        assert_eq!(got[1] + got[3], 0.0);
        // top_k 3 then top_p 0.5 of the three: token 0 alone holds 0.506.
        let got = frequencies(&l, &params(1.0, 0.5, 3), 2_000);
        assert_eq!(got[0], 1.0, "{got:?}");
        // k at least the vocabulary is off.
        let all = frequencies(&l, &params(1.0, 1.0, 99), 30_000);
        let want = softmax(&l.map(f64::from));
        assert_close(&all, &want, 0.012);
    }

    #[test]
    fn the_same_seed_and_position_draw_the_same_token_and_others_differ() {
        let l: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32) * 0.01).collect();
        let p = params(1.0, 0.95, 50);
        let a: Vec<u32> = (0..64).map(|pos| sample(&l, &p, 42, pos, None)).collect();
        let b: Vec<u32> = (0..64).map(|pos| sample(&l, &p, 42, pos, None)).collect();
        assert_eq!(a, b, "reproducible");
        let c: Vec<u32> = (0..64).map(|pos| sample(&l, &p, 43, pos, None)).collect();
        assert_ne!(a, c, "another seed draws other tokens");
        let distinct: std::collections::BTreeSet<u32> = a.iter().copied().collect();
        assert!(
            distinct.len() > 10,
            "positions draw independently: {distinct:?}"
        );
    }

    #[test]
    fn a_banned_token_is_never_drawn_and_nan_logits_never_win() {
        let l = [5.0f32, 4.9, f32::NAN, -2.0];
        for seed in 0..500 {
            assert_ne!(sample(&l, &params(2.0, 1.0, 0), seed, 0, Some(0)), 0);
            assert_ne!(sample(&l, &params(2.0, 1.0, 0), seed, 0, None), 2);
        }
        assert_eq!(sample(&l, &SamplingParams::GREEDY, 0, 0, Some(0)), 1);
        // Everything banned or NaN: token 0, never a panic.
        let dead = [f32::NAN, f32::NEG_INFINITY];
        assert_eq!(sample(&dead, &params(1.0, 0.5, 1), 1, 1, None), 0);
        assert_eq!(sample(&dead, &params(1.0, 0.5, 0), 1, 1, None), 0);
        assert_eq!(sample(&[], &SamplingParams::GREEDY, 1, 1, None), 0);
    }

    #[test]
    fn order_keys_sort_like_the_floats_and_gumbels_are_finite() {
        let xs = [
            f32::NEG_INFINITY,
            -3.5,
            -1e-30,
            -0.0,
            0.0,
            1e-30,
            2.0,
            f32::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(order_key(w[0]) <= order_key(w[1]), "{w:?}");
        }
        for tok in 0..10_000 {
            assert!(gumbel(99, tok).is_finite());
        }
    }

    #[test]
    fn device_rows_carry_the_parameters_and_a_position_keyed_hash() {
        let p = params(0.8, 0.9, 40);
        let r = p.device_row(5, 10, Some(2));
        assert_eq!(
            (r.temperature, r.top_p, r.top_k, r.banned),
            (0.8, 0.9, 40, 2)
        );
        assert_eq!(r.key, row_key(5, 10));
        assert_ne!(r.key, p.device_row(5, 11, None).key);
        assert_eq!(
            SamplingParams::GREEDY.device_row(1, 1, None).temperature,
            0.0
        );
        assert_eq!(std::mem::size_of::<SampleRow>(), 24);
        assert_ne!(p.seed_for(3), SamplingParams::GREEDY.seed_for(3));
        assert_ne!(
            SamplingParams::GREEDY.seed_for(3),
            SamplingParams::GREEDY.seed_for(4)
        );
    }
}
