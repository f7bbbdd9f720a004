//! An f32 CPU reference of the Llama decoder the CUDA backend runs (RMSNorm, HF rotate-half
//! RoPE, GQA, SwiGLU), with a contiguous per-request KV cache. Weights are the exact bf16
//! values the device holds; activations stay in f32, so the GPU must match it within bf16
//! tolerance. Meant for small shapes (`tiny`) in tests.

use super::init::{init_tensor_f32, Tensor};
use super::shape::ModelShape;

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
}

/// The reference model.
pub struct CpuModel {
    pub shape: ModelShape,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    lm_head: Vec<f32>,
}

/// One request's KV cache: per layer, `len` rows of kv_heads * head_dim.
#[derive(Default, Clone)]
pub struct CpuCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    pub len: usize,
}

impl CpuModel {
    /// The weights `init_uniform_bf16` puts on the device for `seed`.
    pub fn seeded(shape: &ModelShape, seed: u32) -> Self {
        Self::from_fn(shape, |t| init_tensor_f32(shape, seed, t))
    }

    /// Builds the model from a tensor source (f32 values in the HF layout).
    pub fn from_fn(shape: &ModelShape, mut get: impl FnMut(Tensor) -> Vec<f32>) -> Self {
        let layers = (0..shape.layers)
            .map(|i| Layer {
                attn_norm: get(Tensor::AttnNorm(i)),
                q: get(Tensor::Q(i)),
                k: get(Tensor::K(i)),
                v: get(Tensor::V(i)),
                o: get(Tensor::O(i)),
                ffn_norm: get(Tensor::FfnNorm(i)),
                gate: get(Tensor::Gate(i)),
                up: get(Tensor::Up(i)),
                down: get(Tensor::Down(i)),
            })
            .collect();
        let embed = get(Tensor::Embed);
        let lm_head = if shape.tied_embeddings {
            embed.clone()
        } else {
            get(Tensor::LmHead)
        };
        CpuModel {
            shape: shape.clone(),
            embed,
            layers,
            final_norm: get(Tensor::FinalNorm),
            lm_head,
        }
    }

    pub fn new_cache(&self) -> CpuCache {
        CpuCache {
            k: vec![Vec::new(); self.shape.layers],
            v: vec![Vec::new(); self.shape.layers],
            len: 0,
        }
    }

    /// Runs `tokens` after what `cache` holds and returns the logits of every position.
    /// All positions go through the layers together (causal attention within the chunk).
    pub fn forward(&self, cache: &mut CpuCache, tokens: &[u32]) -> Vec<Vec<f32>> {
        let s = &self.shape;
        let (h, hd, nh, nkv) = (s.hidden, s.head_dim, s.heads, s.kv_heads);
        let base = cache.len;
        let mut x: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&t| {
                let t = (t as usize).min(s.vocab - 1);
                self.embed[t * h..(t + 1) * h].to_vec()
            })
            .collect();
        for (li, l) in self.layers.iter().enumerate() {
            let mut qs = Vec::with_capacity(x.len());
            for (i, xi) in x.iter().enumerate() {
                let hn = rmsnorm(xi, &l.attn_norm, s.rms_eps);
                let mut q = matvec(&l.q, &hn, nh * hd);
                let mut k = matvec(&l.k, &hn, nkv * hd);
                let v = matvec(&l.v, &hn, nkv * hd);
                let pos = base + i;
                rope(&mut q, hd, pos, s.rope_theta);
                rope(&mut k, hd, pos, s.rope_theta);
                cache.k[li].extend_from_slice(&k);
                cache.v[li].extend_from_slice(&v);
                qs.push(q);
            }
            for (i, q) in qs.iter().enumerate() {
                let n = base + i + 1; // causal: keys 0..=pos
                let att = attend(q, &cache.k[li], &cache.v[li], n, nh, nkv, hd);
                let o = matvec(&l.o, &att, h);
                add_into(&mut x[i], &o);
            }
            for xi in x.iter_mut() {
                let hn = rmsnorm(xi, &l.ffn_norm, s.rms_eps);
                let g = matvec(&l.gate, &hn, s.ffn);
                let u = matvec(&l.up, &hn, s.ffn);
                let a: Vec<f32> = g
                    .iter()
                    .zip(&u)
                    .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let d = matvec(&l.down, &a, h);
                add_into(xi, &d);
            }
        }
        cache.len += tokens.len();
        x.iter()
            .map(|xi| {
                matvec(
                    &self.lm_head,
                    &rmsnorm(xi, &self.final_norm, s.rms_eps),
                    s.vocab,
                )
            })
            .collect()
    }
}

/// First index of the maximum (torch.argmax's rule).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * inv * w).collect()
}

/// y = W x for W [out, in] row-major. Large products split their rows over threads (a
/// Llama-1B check on a many-core host); each row's sum is the same sequential loop.
fn matvec(w: &[f32], x: &[f32], out: usize) -> Vec<f32> {
    let n = x.len();
    let row = |o: usize| -> f32 {
        w[o * n..(o + 1) * n]
            .iter()
            .zip(x)
            .map(|(a, b)| a * b)
            .sum()
    };
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    if out * n < (1 << 22) || threads == 1 {
        return (0..out).map(row).collect();
    }
    let mut y = vec![0f32; out];
    let per = out.div_ceil(threads);
    std::thread::scope(|sc| {
        for (c, chunk) in y.chunks_mut(per).enumerate() {
            let row = &row;
            sc.spawn(move || {
                for (k, v) in chunk.iter_mut().enumerate() {
                    *v = row(c * per + k);
                }
            });
        }
    });
    y
}

fn add_into(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// HF rotate-half RoPE over every head of `x`: pairs (i, i + D/2).
pub fn rope(x: &mut [f32], hd: usize, pos: usize, theta: f32) {
    let half = hd / 2;
    for head in x.chunks_mut(hd) {
        for i in 0..half {
            let inv_freq = 1.0 / theta.powf((2 * i) as f32 / hd as f32);
            let (s, c) = (pos as f32 * inv_freq).sin_cos();
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * c - b * s;
            head[i + half] = b * c + a * s;
        }
    }
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
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, 0.0]), 1);
    }
}
