//! An f32 CPU reference of the Llama decoder the CUDA backend runs (RMSNorm, RoPE, GQA,
//! SwiGLU), with a contiguous per-request KV cache. Weights are the exact bf16 values the
//! device holds; activations stay in f32, so the GPU must match it within bf16 tolerance.
//! RoPE is HF rotate-half by default; GGUF files converted by llama.cpp permute Q and K and
//! need the interleaved layout. Products go through an f32 GEMM, fast enough for a 135M
//! model in debug tests; the KV cache makes each decode step one token's work. Hybrid shapes
//! run their recurrent layers (`shape::LayerMix`) over a per-request f32 state instead of KV.

use super::init::{init_tensor_f32, Tensor};
use super::shape::ModelShape;

/// Which rotary pairs RoPE rotates within a head of width D.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RopeLayout {
    /// Hugging Face `rotate_half`: pairs (i, i + D/2).
    #[default]
    RotateHalf,
    /// GPT-J / llama.cpp-converted weights: pairs (2i, 2i + 1).
    Interleaved,
}

/// Why a tensor source could not build the model.
#[derive(Debug, thiserror::Error)]
pub enum CpuLoadError {
    #[error("tensor {tensor:?}: {source}")]
    Source {
        tensor: Tensor,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("tensor {tensor:?} has {got} values, the shape needs {need}")]
    Size {
        tensor: Tensor,
        got: usize,
        need: usize,
    },
}

/// One layer's weights, HF layout ([out, in] row-major).
struct Layer {
    attn_norm: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    /// A recurrent layer's decay projection [kv_heads, hidden] and bias [kv_heads].
    decay: Option<(Vec<f32>, Vec<f32>)>,
}

/// The reference model.
pub struct CpuModel {
    pub shape: ModelShape,
    pub rope: RopeLayout,
    /// `shape.inv_freq()`, the table the kernels read too.
    inv_freq: Vec<f32>,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    /// `None`: tied to `embed` (one copy, not two).
    lm_head: Option<Vec<f32>>,
}

/// One request's KV cache: per attention layer, `len` rows of kv_heads * head_dim; per
/// recurrent layer, its state (kv_heads x head_dim x head_dim, row i = key dimension).
#[derive(Default, Clone)]
pub struct CpuCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    state: Vec<Vec<f32>>,
    pub len: usize,
}

impl CpuCache {
    /// Forgets every position from `len` on (rejected draft tokens). A recurrent state
    /// cannot be rolled back, so a cache that holds one refuses (and is left unchanged).
    pub fn truncate(&mut self, len: usize) -> bool {
        if len > self.len || self.state.iter().any(|s| !s.is_empty()) {
            return len == self.len;
        }
        for (k, v) in self.k.iter_mut().zip(&mut self.v) {
            let row = k.len() / self.len.max(1);
            k.truncate(len * row);
            v.truncate(len * row);
        }
        self.len = len;
        true
    }

    /// The recurrent layers' states, layer after layer (empty for attention-only models).
    pub fn states(&self) -> impl Iterator<Item = &[f32]> {
        self.state
            .iter()
            .map(Vec::as_slice)
            .filter(|s| !s.is_empty())
    }
}

impl CpuModel {
    /// The weights `init_uniform_bf16` puts on the device for `seed`.
    pub fn seeded(shape: &ModelShape, seed: u32) -> Self {
        Self::from_fn(shape, |t| init_tensor_f32(shape, seed, t))
    }

    /// Builds the model from a tensor source (f32 values in the HF layout, of the sizes
    /// `Tensor::dims` gives; see `try_from_fn` for a source that can fail).
    pub fn from_fn(shape: &ModelShape, mut get: impl FnMut(Tensor) -> Vec<f32>) -> Self {
        match Self::build(shape, |t| Ok::<_, std::convert::Infallible>(get(t))) {
            Ok(m) => m,
            Err(never) => match never {},
        }
    }

    /// Like `from_fn` for a fallible source; also checks every tensor's size.
    pub fn try_from_fn<E>(
        shape: &ModelShape,
        mut get: impl FnMut(Tensor) -> Result<Vec<f32>, E>,
    ) -> Result<Self, CpuLoadError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        Self::build(shape, |t| {
            let v = get(t).map_err(|e| CpuLoadError::Source {
                tensor: t,
                source: Box::new(e),
            })?;
            let (r, c) = t.dims(shape);
            if v.len() != r * c {
                return Err(CpuLoadError::Size {
                    tensor: t,
                    got: v.len(),
                    need: r * c,
                });
            }
            Ok(v)
        })
    }

    fn build<E>(
        shape: &ModelShape,
        mut get: impl FnMut(Tensor) -> Result<Vec<f32>, E>,
    ) -> Result<Self, E> {
        let layers = (0..shape.layers)
            .map(|i| {
                Ok(Layer {
                    attn_norm: get(Tensor::AttnNorm(i))?,
                    q: get(Tensor::Q(i))?,
                    k: get(Tensor::K(i))?,
                    v: get(Tensor::V(i))?,
                    o: get(Tensor::O(i))?,
                    ffn_norm: get(Tensor::FfnNorm(i))?,
                    gate: get(Tensor::Gate(i))?,
                    up: get(Tensor::Up(i))?,
                    down: get(Tensor::Down(i))?,
                    decay: match shape.is_recurrent(i) {
                        true => Some((get(Tensor::Decay(i))?, get(Tensor::DecayBias(i))?)),
                        false => None,
                    },
                })
            })
            .collect::<Result<Vec<_>, E>>()?;
        let embed = get(Tensor::Embed)?;
        let lm_head = if shape.tied_embeddings {
            None
        } else {
            Some(get(Tensor::LmHead)?)
        };
        Ok(CpuModel {
            shape: shape.clone(),
            rope: RopeLayout::default(),
            inv_freq: shape.inv_freq(),
            embed,
            layers,
            final_norm: get(Tensor::FinalNorm)?,
            lm_head,
        })
    }

    /// The same weights with another RoPE layout.
    pub fn with_rope(mut self, rope: RopeLayout) -> Self {
        self.rope = rope;
        self
    }

    pub fn new_cache(&self) -> CpuCache {
        let s = &self.shape;
        CpuCache {
            k: vec![Vec::new(); s.layers],
            v: vec![Vec::new(); s.layers],
            state: (0..s.layers)
                .map(|l| match s.is_recurrent(l) {
                    true => vec![0.0; s.state_elems_per_layer()],
                    false => Vec::new(),
                })
                .collect(),
            len: 0,
        }
    }

    /// Greedy decoding of `prompt` (argmax each step) until `eos` or `max_new` tokens: the
    /// generated ids, without the end token.
    pub fn greedy(&self, prompt: &[u32], eos: u32, max_new: usize) -> Vec<u32> {
        let mut cache = self.new_cache();
        let mut logits = self.forward(&mut cache, prompt);
        let mut out = Vec::new();
        while out.len() < max_new {
            let Some(last) = logits.last() else { break };
            let next = argmax(last);
            if next == eos {
                break;
            }
            out.push(next);
            logits = self.forward(&mut cache, &[next]);
        }
        out
    }

    /// Runs `tokens` after what `cache` holds and returns the logits of every position.
    /// All positions go through the layers together (causal attention within the chunk).
    pub fn forward(&self, cache: &mut CpuCache, tokens: &[u32]) -> Vec<Vec<f32>> {
        let s = &self.shape;
        let (h, hd, nh, nkv) = (s.hidden, s.head_dim, s.heads, s.kv_heads);
        let (n, base) = (tokens.len(), cache.len);
        let mut x: Vec<f32> = Vec::with_capacity(n * h);
        for &t in tokens {
            let t = (t as usize).min(s.vocab - 1);
            x.extend_from_slice(&self.embed[t * h..(t + 1) * h]);
        }
        for (li, l) in self.layers.iter().enumerate() {
            let hn = rmsnorm_rows(&x, &l.attn_norm, s.rms_eps);
            let mut q = matmul(&hn, n, &l.q, nh * hd);
            let mut k = matmul(&hn, n, &l.k, nkv * hd);
            let v = matmul(&hn, n, &l.v, nkv * hd);
            if let Some((w_a, b_a)) = &l.decay {
                let att = self.recur(&mut cache.state[li], &hn, &q, &k, &v, w_a, b_a);
                self.mlp(&mut x, l, n, &att);
                continue;
            }
            for i in 0..n {
                let pos = base + i;
                self.rope_row(&mut q[i * nh * hd..(i + 1) * nh * hd], pos);
                self.rope_row(&mut k[i * nkv * hd..(i + 1) * nkv * hd], pos);
            }
            cache.k[li].extend_from_slice(&k);
            cache.v[li].extend_from_slice(&v);
            let mut att = Vec::with_capacity(n * nh * hd);
            for (i, qi) in q.chunks_exact(nh * hd).enumerate() {
                let keys = base + i + 1; // causal: keys 0..=pos
                att.extend(attend(qi, &cache.k[li], &cache.v[li], keys, nh, nkv, hd));
            }
            self.mlp(&mut x, l, n, &att);
        }
        cache.len += n;
        let head = self.lm_head.as_deref().unwrap_or(&self.embed);
        let logits = matmul(
            &rmsnorm_rows(&x, &self.final_norm, s.rms_eps),
            n,
            head,
            s.vocab,
        );
        logits.chunks_exact(s.vocab).map(<[f32]>::to_vec).collect()
    }

    /// o_proj of the mixer's output into the residual, then the SwiGLU MLP.
    fn mlp(&self, x: &mut [f32], l: &Layer, n: usize, att: &[f32]) {
        let s = &self.shape;
        let h = s.hidden;
        add_into(x, &matmul(att, n, &l.o, h));
        let hn = rmsnorm_rows(x, &l.ffn_norm, s.rms_eps);
        let g = matmul(&hn, n, &l.gate, s.ffn);
        let u = matmul(&hn, n, &l.up, s.ffn);
        let a: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        add_into(x, &matmul(&a, n, &l.down, h));
    }

    /// The gated linear-attention recurrence (`shape::LayerMix`) over the `n` rows, token
    /// after token, updating `state`; returns the mixer's output rows (heads * head_dim).
    #[allow(clippy::too_many_arguments)]
    fn recur(
        &self,
        state: &mut [f32],
        hn: &[f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        w_a: &[f32],
        b_a: &[f32],
    ) -> Vec<f32> {
        let s = &self.shape;
        let (h, hd, nh, nkv) = (s.hidden, s.head_dim, s.heads, s.kv_heads);
        let g = nh / nkv;
        let n = hn.len() / h;
        let mut out = vec![0f32; n * nh * hd];
        for t in 0..n {
            let x = &hn[t * h..(t + 1) * h];
            for kh in 0..nkv {
                let a = decay(dot(x, &w_a[kh * h..(kh + 1) * h]) + b_a[kh]);
                let kv = |m: &[f32]| l2_normalized(&m[(t * nkv + kh) * hd..][..hd]);
                let kn = kv(k);
                let vr = &v[(t * nkv + kh) * hd..][..hd];
                let st = &mut state[kh * hd * hd..(kh + 1) * hd * hd];
                for (i, row) in st.chunks_exact_mut(hd).enumerate() {
                    for (sij, &vj) in row.iter_mut().zip(vr) {
                        *sij = a * *sij + kn[i] * vj;
                    }
                }
                for qh in kh * g..(kh + 1) * g {
                    let qn = l2_normalized(&q[(t * nh + qh) * hd..][..hd]);
                    let o = &mut out[(t * nh + qh) * hd..][..hd];
                    for (row, &qi) in st.chunks_exact(hd).zip(&qn) {
                        for (oj, &sij) in o.iter_mut().zip(row) {
                            *oj += qi * sij;
                        }
                    }
                }
            }
        }
        out
    }

    fn rope_row(&self, x: &mut [f32], pos: usize) {
        match self.rope {
            RopeLayout::RotateHalf => rope_table(x, pos, &self.inv_freq),
            RopeLayout::Interleaved => rope_interleaved_table(x, pos, &self.inv_freq),
        }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The recurrence's decay from its pre-activation: exp(-softplus(z)), in (0, 1).
pub fn decay(z: f32) -> f32 {
    let softplus = if z > 20.0 { z } else { z.exp().ln_1p() };
    (-softplus).exp()
}

/// `x / max(|x|, 1e-6)`.
pub fn l2_normalized(x: &[f32]) -> Vec<f32> {
    let n = dot(x, x).sqrt().max(1e-6);
    x.iter().map(|v| v / n).collect()
}

/// First index of the maximum (torch.argmax's rule).
pub use crate::sampling::argmax;

fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * inv * w).collect()
}

/// RMSNorm of every row of `x` (rows of `w.len()`).
fn rmsnorm_rows(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    x.chunks_exact(w.len())
        .flat_map(|r| rmsnorm(r, w, eps))
        .collect()
}

/// y = x Wᵀ for x [t, n] and W [out, n], both row-major: y is [t, out]. Large products
/// split W's rows over threads (a Llama-1B check on a many-core host).
fn matmul(x: &[f32], t: usize, w: &[f32], out: usize) -> Vec<f32> {
    let n = w.len() / out.max(1);
    assert!(
        x.len() == t * n && w.len() == out * n,
        "matmul: x has {} values for {t} rows, W {} for {out} rows",
        x.len(),
        w.len()
    );
    let threads = std::thread::available_parallelism().map_or(1, |c| c.get());
    if out * n < (1 << 22) || threads == 1 || t == 0 {
        let mut y = vec![0f32; t * out];
        gemm(x, t, n, w, out, &mut y);
        return y;
    }
    let per = out.div_ceil(threads);
    let parts: Vec<Vec<f32>> = std::thread::scope(|sc| {
        let handles: Vec<_> = w
            .chunks(per * n)
            .map(|wc| {
                sc.spawn(move || {
                    let o = wc.len() / n;
                    let mut y = vec![0f32; t * o];
                    gemm(x, t, n, wc, o, &mut y);
                    y
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut y = Vec::with_capacity(t * out);
    for r in 0..t {
        for p in &parts {
            let o = p.len() / t;
            y.extend_from_slice(&p[r * o..(r + 1) * o]);
        }
    }
    y
}

/// y[t, out] = x[t, n] · w[out, n]ᵀ, all row-major and of exactly these sizes.
fn gemm(x: &[f32], t: usize, n: usize, w: &[f32], out: usize, y: &mut [f32]) {
    assert!(x.len() == t * n && w.len() == out * n && y.len() == t * out);
    if t == 0 || out == 0 {
        return;
    }
    // SAFETY: the sizes were checked above; every index sgemm forms from these dims and
    // strides is inside its slice, and `y` is exclusively borrowed.
    unsafe {
        matrixmultiply::sgemm(
            t,
            n,
            out,
            1.0,
            x.as_ptr(),
            n as isize,
            1,
            w.as_ptr(),
            1,
            n as isize,
            0.0,
            y.as_mut_ptr(),
            out as isize,
            1,
        );
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// HF rotate-half RoPE over every head of `x` (heads of `2 * inv_freq.len()`): pairs
/// (i, i + D/2), angle `pos * inv_freq[i]` in f32 as the kernel forms it.
pub fn rope_table(x: &mut [f32], pos: usize, inv_freq: &[f32]) {
    let half = inv_freq.len();
    for head in x.chunks_mut(2 * half) {
        for (i, &f) in inv_freq.iter().enumerate() {
            let (s, c) = (pos as f32 * f).sin_cos();
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * c - b * s;
            head[i + half] = b * c + a * s;
        }
    }
}

/// Interleaved RoPE over every head of `x`: pairs (2i, 2i + 1), same frequencies.
pub fn rope_interleaved_table(x: &mut [f32], pos: usize, inv_freq: &[f32]) {
    for head in x.chunks_mut(2 * inv_freq.len()) {
        for (pair, &f) in head.chunks_exact_mut(2).zip(inv_freq) {
            let (s, c) = (pos as f32 * f).sin_cos();
            let (a, b) = (pair[0], pair[1]);
            pair[0] = a * c - b * s;
            pair[1] = b * c + a * s;
        }
    }
}

/// [`rope_table`] with the plain frequencies `theta^(-2i/hd)` (no scaling).
pub fn rope(x: &mut [f32], hd: usize, pos: usize, theta: f32) {
    rope_table(x, pos, &plain_inv_freq(hd, theta));
}

/// [`rope_interleaved_table`] with the plain frequencies.
pub fn rope_interleaved(x: &mut [f32], hd: usize, pos: usize, theta: f32) {
    rope_interleaved_table(x, pos, &plain_inv_freq(hd, theta));
}

/// The plain frequencies `theta^(-2i/D)` of a head of width `hd` (tests and tools).
pub fn plain_inv_freq(hd: usize, theta: f32) -> Vec<f32> {
    super::shape::inv_freq_table(hd, theta, &super::shape::RopeScaling::None)
}

/// Softmax attention of one query row over the first `n` cached positions, GQA.
fn attend(q: &[f32], k: &[f32], v: &[f32], n: usize, nh: usize, nkv: usize, hd: usize) -> Vec<f32> {
    let g = nh / nkv;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0.0f32; nh * hd];
    for h in 0..nh {
        let kh = h / g;
        let qh = &q[h * hd..(h + 1) * hd];
        let scores: Vec<f32> = (0..n)
            .map(|t| {
                let kr = &k[(t * nkv + kh) * hd..(t * nkv + kh + 1) * hd];
                qh.iter().zip(kr).map(|(a, b)| a * b).sum::<f32>() * scale
            })
            .collect();
        let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
        let z: f32 = e.iter().sum();
        for (t, p) in e.iter().enumerate() {
            let vr = &v[(t * nkv + kh) * hd..(t * nkv + kh + 1) * hd];
            for d in 0..hd {
                out[h * hd + d] += p / z * vr[d];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::cuda::gguf_llama::test_support::llama_cpp_permute;

    fn tiny() -> CpuModel {
        CpuModel::seeded(&ModelShape::named("tiny").unwrap(), 1)
    }

    fn max_rel(a: &[f32], b: &[f32]) -> f32 {
        let m = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        a.iter()
            .zip(b)
            .fold(0.0f32, |e, (x, y)| e.max((x - y).abs()))
            / m
    }

    #[test]
    fn prefill_in_one_chunk_matches_token_by_token_decode() {
        let m = tiny();
        let prompt = [5u32, 900, 17, 3, 256, 1000, 42];
        let mut c1 = m.new_cache();
        let all = m.forward(&mut c1, &prompt);
        let mut c2 = m.new_cache();
        for (i, &t) in prompt.iter().enumerate() {
            let l = m.forward(&mut c2, &[t]);
            assert!(max_rel(&l[0], &all[i]) < 1e-5, "position {i}");
        }
        assert_eq!(c1.len, prompt.len());
    }

    #[test]
    fn context_changes_the_next_token_logits() {
        let m = tiny();
        let mut a = m.new_cache();
        let mut b = m.new_cache();
        let la = m.forward(&mut a, &[1, 2, 3, 4]);
        let lb = m.forward(&mut b, &[9, 2, 3, 4]);
        assert!(
            max_rel(&la[3], &lb[3]) > 1e-3,
            "attention must see earlier tokens"
        );
        assert!(la[3].iter().all(|v| v.is_finite()));
    }

    #[test]
    fn rope_is_identity_at_position_zero_and_preserves_norm() {
        let mut x: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        let orig = x.clone();
        rope(&mut x, 64, 0, 10000.0);
        assert_eq!(x, orig);
        rope(&mut x, 64, 123, 10000.0);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() / n0 < 1e-5);
        assert_ne!(x, orig);
    }

    #[test]
    fn interleaved_rope_on_permuted_heads_equals_rotate_half() {
        let hd = 64;
        let x: Vec<f32> = (0..2 * hd).map(|i| (i as f32 * 0.91).cos()).collect();
        let mut hf = x.clone();
        rope(&mut hf, hd, 17, 100_000.0);
        let mut gg = llama_cpp_permute(&x, hd, 1);
        rope_interleaved(&mut gg, hd, 17, 100_000.0);
        assert_eq!(gg, llama_cpp_permute(&hf, hd, 1));
        let mut same = x.clone();
        rope_interleaved(&mut same, hd, 0, 100_000.0);
        assert_eq!(same, x, "position 0 is the identity");
    }

    #[test]
    fn permuted_q_k_with_interleaved_rope_give_the_same_logits_and_without_it_do_not() {
        let shape = ModelShape::named("tiny").unwrap();
        let hf = tiny();
        let perm = |t: Tensor| {
            let w = init_tensor_f32(&shape, 1, t);
            match t {
                Tensor::Q(_) | Tensor::K(_) => llama_cpp_permute(&w, shape.head_dim, shape.hidden),
                _ => w,
            }
        };
        let gg = CpuModel::from_fn(&shape, perm).with_rope(RopeLayout::Interleaved);
        let prompt = [3u32, 77, 500, 12, 9];
        let want = hf.forward(&mut hf.new_cache(), &prompt);
        let got = gg.forward(&mut gg.new_cache(), &prompt);
        for (w, g) in want.iter().zip(&got) {
            assert!(max_rel(g, w) < 1e-5);
        }
        let wrong = CpuModel::from_fn(&shape, perm);
        let bad = wrong.forward(&mut wrong.new_cache(), &prompt);
        assert!(max_rel(&bad[4], &want[4]) > 1e-3);
    }

    /// Grouped-query attention with 3 query heads per kv head (SmolLM2's ratio) is plain
    /// multi-head attention with each kv head's K and V rows repeated for its 3 query heads:
    /// query head h reads kv head h / 3.
    #[test]
    fn gqa_with_three_heads_per_kv_head_equals_mha_with_repeated_kv_heads() {
        let gqa = ModelShape {
            heads: 9,
            kv_heads: 3,
            ..ModelShape::named("tiny").unwrap()
        };
        let mha = ModelShape {
            kv_heads: 9,
            ..gqa.clone()
        };
        let hd = gqa.head_dim;
        let repeat = |w: Vec<f32>| -> Vec<f32> {
            w.chunks(hd * gqa.hidden)
                .flat_map(|head| head.repeat(3))
                .collect()
        };
        let a = CpuModel::from_fn(&gqa, |t| init_tensor_f32(&gqa, 3, t));
        let b = CpuModel::from_fn(&mha, |t| match t {
            Tensor::K(_) | Tensor::V(_) => repeat(init_tensor_f32(&gqa, 3, t)),
            _ => init_tensor_f32(&gqa, 3, t),
        });
        let prompt = [7u32, 300, 12, 999, 5, 64, 64, 1];
        let (la, lb) = (
            a.forward(&mut a.new_cache(), &prompt),
            b.forward(&mut b.new_cache(), &prompt),
        );
        for (x, y) in la.iter().zip(&lb) {
            assert!(max_rel(x, y) < 1e-5);
        }
        // Each query head really reads its own kv head: the ungrouped layout differs.
        let wrong = CpuModel::from_fn(&mha, |t| match t {
            Tensor::K(_) | Tensor::V(_) => {
                let w = init_tensor_f32(&gqa, 3, t);
                let n = w.len();
                w.into_iter().cycle().take(3 * n).collect()
            }
            _ => init_tensor_f32(&gqa, 3, t),
        });
        let lw = wrong.forward(&mut wrong.new_cache(), &prompt);
        assert!(max_rel(&lw[7], &la[7]) > 1e-3);
    }

    /// The paged attention kernels' arithmetic, mirrored: split the context as
    /// `split_range` does (whole 64-token tiles, at least 256 tokens a split), walk each
    /// split's 16-token tiles round-robin over 4 warps with an online softmax in log2 units,
    /// merge the warps (attention_tc.cu), then merge the splits (`attn_combine`).
    fn flash_decode(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n: usize,
        g: usize,
        hd: usize,
        splits: usize,
    ) -> Vec<f32> {
        const TILE: usize = 16;
        const WARPS: usize = 4;
        let (log2e, scale) = (std::f32::consts::LOG2_E, 1.0 / (hd as f32).sqrt());
        let per = n.div_ceil(splits).max(256);
        let chunk = per.div_ceil(64) * 64;
        let mut out = vec![0f32; g * hd];
        for h in 0..g {
            // (m in natural log units, l, o) per split, as part_ml / part_o hold them.
            let mut parts: Vec<(f32, f32, Vec<f32>)> = Vec::new();
            for s in 0..splits {
                let (start, end) = (s * chunk, ((s + 1) * chunk).min(n));
                if start >= end {
                    continue;
                }
                let tiles = (end - start).div_ceil(TILE);
                let mut warps = Vec::new();
                for w in 0..WARPS {
                    let (mut m, mut l, mut o) = (f32::NEG_INFINITY, 0f32, vec![0f32; hd]);
                    for t in (w..tiles).step_by(WARPS) {
                        let toks: Vec<usize> =
                            (start + t * TILE..(start + (t + 1) * TILE).min(end)).collect();
                        let sc: Vec<f32> = toks
                            .iter()
                            .map(|&j| {
                                let kr = &k[j * hd..(j + 1) * hd];
                                q[h * hd..(h + 1) * hd]
                                    .iter()
                                    .zip(kr)
                                    .map(|(a, b)| a * b)
                                    .sum::<f32>()
                                    * scale
                                    * log2e
                            })
                            .collect();
                        let m_new = sc.iter().copied().fold(m, f32::max);
                        let alpha = if m == f32::NEG_INFINITY {
                            0.0
                        } else {
                            (m - m_new).exp2()
                        };
                        let p: Vec<f32> = sc.iter().map(|x| (x - m_new).exp2()).collect();
                        l = l * alpha + p.iter().sum::<f32>();
                        m = m_new;
                        o.iter_mut().for_each(|x| *x *= alpha);
                        for (pj, &j) in p.iter().zip(&toks) {
                            for d in 0..hd {
                                o[d] += pj * v[j * hd + d];
                            }
                        }
                    }
                    warps.push((m, l, o));
                }
                let m = warps.iter().map(|w| w.0).fold(f32::NEG_INFINITY, f32::max);
                let (mut den, mut num) = (0f32, vec![0f32; hd]);
                for (wm, wl, wo) in &warps {
                    if *wl > 0.0 {
                        let f = (wm - m).exp2();
                        den += f * wl;
                        num.iter_mut().zip(wo).for_each(|(a, b)| *a += f * b);
                    }
                }
                parts.push((
                    m * std::f32::consts::LN_2,
                    den,
                    num.iter().map(|x| x / den).collect(),
                ));
            }
            let mx = parts.iter().map(|p| p.0).fold(f32::NEG_INFINITY, f32::max);
            let mut den = 0f32;
            for (pm, pl, po) in &parts {
                let w = pl * (pm - mx).exp();
                den += w;
                for d in 0..hd {
                    out[h * hd + d] += w * po[d];
                }
            }
            out[h * hd..(h + 1) * hd].iter_mut().for_each(|x| *x /= den);
        }
        out
    }

    #[test]
    fn the_kernels_split_and_merge_arithmetic_equals_plain_attention_for_three_heads_per_kv() {
        let (g, hd) = (3, 64);
        for (n, splits) in [
            (1, 1),
            (15, 4),
            (16, 1),
            (17, 128),
            (300, 2),
            (1000, 3),
            (4099, 5),
        ] {
            let val =
                |i: usize, salt: usize| (((i * 7919 + salt * 104_729) % 1000) as f32 / 500.0) - 1.0;
            let q: Vec<f32> = (0..g * hd).map(|i| val(i, 1)).collect();
            let k: Vec<f32> = (0..n * hd).map(|i| val(i, 2)).collect();
            let v: Vec<f32> = (0..n * hd).map(|i| val(i, 3)).collect();
            let want = attend(&q, &k, &v, n, g, 1, hd);
            let got = flash_decode(&q, &k, &v, n, g, hd, splits);
            assert!(
                max_rel(&got, &want) < 1e-5,
                "n {n} splits {splits}: {}",
                max_rel(&got, &want)
            );
        }
    }

    #[test]
    fn a_source_of_the_wrong_size_or_failing_is_an_error_naming_the_tensor() {
        let shape = ModelShape::named("tiny").unwrap();
        let short = CpuModel::try_from_fn(&shape, |t| {
            let mut v = init_tensor_f32(&shape, 1, t);
            if t == Tensor::V(1) {
                v.pop();
            }
            Ok::<_, std::io::Error>(v)
        });
        let e = short.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("V(1)") && e.contains("32767 values"), "{e}");
        let failing = CpuModel::try_from_fn(&shape, |t| match t {
            Tensor::FinalNorm => Err(std::io::Error::other("gone")),
            t => Ok(init_tensor_f32(&shape, 1, t)),
        });
        let e = failing.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(e, "tensor FinalNorm: gone");
    }

    #[test]
    fn matmul_matches_row_dot_products_on_the_single_and_threaded_paths() {
        for (t, n, out) in [(3, 40, 7), (2, 2048, 2048)] {
            let x: Vec<f32> = (0..t * n).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
            let w: Vec<f32> = (0..out * n).map(|i| ((i * 5) % 11) as f32 * 0.25).collect();
            let y = matmul(&x, t, &w, out);
            for r in 0..t {
                for o in [0, out / 2, out - 1] {
                    let dot: f32 = (0..n).map(|k| x[r * n + k] * w[o * n + k]).sum();
                    assert_eq!(y[r * out + o], dot, "row {r} col {o}");
                }
            }
        }
    }

    #[test]
    fn greedy_follows_the_argmax_chain_and_stops_at_eos_or_the_limit() {
        let m = tiny();
        let prompt = [5u32, 17, 3];
        let six = m.greedy(&prompt, u32::MAX, 6);
        assert_eq!(six.len(), 6);
        // Step by step, each token is the argmax after the ones before it.
        let mut cache = m.new_cache();
        let mut logits = m.forward(&mut cache, &prompt);
        for &t in &six {
            assert_eq!(argmax(logits.last().unwrap()), t);
            logits = m.forward(&mut cache, &[t]);
        }
        // The end token ends it, and is left out.
        assert_eq!(m.greedy(&prompt, six[2], 6), six[..2]);
        assert!(m.greedy(&prompt, six[0], 6).is_empty());
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, 0.0]), 1);
    }
}
