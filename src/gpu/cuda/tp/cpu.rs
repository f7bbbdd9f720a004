//! The tensor-parallel forward on the CPU, f32: each rank runs its shard (its query and KV
//! heads, its MLP slice, its own KV cache) and the partial sums of O and down go through an
//! emulated all-reduce (an element-wise sum over the ranks). It proves the sharding of
//! `shard.rs` against the unsharded reference (`cpu_ref::CpuModel`): the same logits within
//! f32 rounding, so the GPU path only has to reproduce this arrangement with NCCL.

use super::shard::{Shard, ShardError};
use crate::gpu::cuda::cpu_ref::rope;
use crate::gpu::cuda::init::{init_tensor_f32, Tensor};
use crate::gpu::cuda::ModelShape;

/// One layer of one rank (HF layout, its rows or columns only).
struct RankLayer {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

struct Rank {
    shard: Shard,
    layers: Vec<RankLayer>,
}

/// The model split over ranks; the whole tensors (embedding, norms, LM head) kept once, as
/// every rank holds the same copy.
pub struct TpCpuModel {
    pub shape: ModelShape,
    ranks: Vec<Rank>,
    embed: Vec<f32>,
    attn_norm: Vec<Vec<f32>>,
    ffn_norm: Vec<Vec<f32>>,
    final_norm: Vec<f32>,
    lm_head: Option<Vec<f32>>,
}

/// Each rank's KV cache for one request: per rank, per layer, rows of its KV heads.
pub struct TpCache {
    k: Vec<Vec<Vec<f32>>>,
    v: Vec<Vec<Vec<f32>>>,
    pub len: usize,
}

impl TpCpuModel {
    /// The seeded weights (`init_tensor_f32`) over `ranks` ranks.
    pub fn seeded(shape: &ModelShape, seed: u32, ranks: usize) -> Result<Self, ShardError> {
        let shards = Shard::all(shape, ranks)?;
        Ok(Self::from_shards(shape, shards, |t| {
            init_tensor_f32(shape, seed, t)
        }))
    }

    /// Reads each whole tensor once from `get` and gives every shard its part.
    pub fn from_shards(
        shape: &ModelShape,
        shards: Vec<Shard>,
        mut get: impl FnMut(Tensor) -> Vec<f32>,
    ) -> Self {
        let mut ranks: Vec<Rank> = shards
            .into_iter()
            .map(|shard| Rank {
                shard,
                layers: Vec::new(),
            })
            .collect();
        let (mut attn_norm, mut ffn_norm) = (Vec::new(), Vec::new());
        for i in 0..shape.layers {
            attn_norm.push(get(Tensor::AttnNorm(i)));
            ffn_norm.push(get(Tensor::FfnNorm(i)));
            let whole = [
                Tensor::Q(i),
                Tensor::K(i),
                Tensor::V(i),
                Tensor::O(i),
                Tensor::Gate(i),
                Tensor::Up(i),
                Tensor::Down(i),
            ]
            .map(|t| (t, get(t)));
            for r in &mut ranks {
                let [q, k, v, o, gate, up, down] =
                    whole.each_ref().map(|(t, w)| r.shard.take(*t, shape, w));
                r.layers.push(RankLayer {
                    q,
                    k,
                    v,
                    o,
                    gate,
                    up,
                    down,
                });
            }
        }
        TpCpuModel {
            shape: shape.clone(),
            ranks,
            embed: get(Tensor::Embed),
            attn_norm,
            ffn_norm,
            final_norm: get(Tensor::FinalNorm),
            lm_head: (!shape.tied_embeddings).then(|| get(Tensor::LmHead)),
        }
    }

    pub fn ranks(&self) -> usize {
        self.ranks.len()
    }

    pub fn new_cache(&self) -> TpCache {
        let per_rank = || vec![Vec::new(); self.shape.layers];
        TpCache {
            k: self.ranks.iter().map(|_| per_rank()).collect(),
            v: self.ranks.iter().map(|_| per_rank()).collect(),
            len: 0,
        }
    }

    /// Runs `tokens` after what `cache` holds; the logits of every position.
    pub fn forward(&self, cache: &mut TpCache, tokens: &[u32]) -> Vec<Vec<f32>> {
        let s = &self.shape;
        let (h, n, base) = (s.hidden, tokens.len(), cache.len);
        let mut x: Vec<f32> = Vec::with_capacity(n * h);
        for &t in tokens {
            let t = (t as usize).min(s.vocab - 1);
            x.extend_from_slice(&self.embed[t * h..(t + 1) * h]);
        }
        for li in 0..s.layers {
            let hn = rmsnorm_rows(&x, &self.attn_norm[li], s.rms_eps);
            let parts: Vec<Vec<f32>> = (self.ranks.iter().enumerate())
                .map(|(r, rank)| {
                    let kv = (&mut cache.k[r][li], &mut cache.v[r][li]);
                    rank.attention(s, li, &hn, n, base, kv)
                })
                .collect();
            add_into(&mut x, &all_reduce(parts));
            let hn = rmsnorm_rows(&x, &self.ffn_norm[li], s.rms_eps);
            let parts = self.ranks.iter().map(|r| r.mlp(li, &hn, n)).collect();
            add_into(&mut x, &all_reduce(parts));
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
}

impl Rank {
    /// This rank's partial sum of the attention block's output (before the all-reduce).
    fn attention(
        &self,
        s: &ModelShape,
        li: usize,
        hn: &[f32],
        n: usize,
        base: usize,
        (kc, vc): (&mut Vec<f32>, &mut Vec<f32>),
    ) -> Vec<f32> {
        let l = &self.layers[li];
        let hd = s.head_dim;
        let (nq, nkv) = (self.shard.q_heads.len(), self.shard.kv_heads.len());
        let mut q = matmul(hn, n, &l.q, nq * hd);
        let mut k = matmul(hn, n, &l.k, nkv * hd);
        let v = matmul(hn, n, &l.v, nkv * hd);
        for i in 0..n {
            rope(
                &mut q[i * nq * hd..(i + 1) * nq * hd],
                hd,
                base + i,
                s.rope_theta,
            );
            rope(
                &mut k[i * nkv * hd..(i + 1) * nkv * hd],
                hd,
                base + i,
                s.rope_theta,
            );
        }
        kc.extend_from_slice(&k);
        vc.extend_from_slice(&v);
        let mut att = Vec::with_capacity(n * nq * hd);
        for (i, qi) in q.chunks_exact(nq * hd).enumerate() {
            att.extend(attend(qi, kc, vc, base + i + 1, nq, nkv, hd));
        }
        matmul(&att, n, &l.o, s.hidden)
    }

    /// This rank's partial sum of the MLP's output.
    fn mlp(&self, li: usize, hn: &[f32], n: usize) -> Vec<f32> {
        let l = &self.layers[li];
        let f = self.shard.ffn.len();
        let g = matmul(hn, n, &l.gate, f);
        let u = matmul(hn, n, &l.up, f);
        let a: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        matmul(&a, n, &l.down, l.down.len() / f)
    }
}

/// The all-reduce (sum) every rank would receive, summed in rank order.
fn all_reduce(parts: Vec<Vec<f32>>) -> Vec<f32> {
    let mut it = parts.into_iter();
    let mut sum = it.next().unwrap_or_default();
    for p in it {
        add_into(&mut sum, &p);
    }
    sum
}

fn add_into(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

fn rmsnorm_rows(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    x.chunks_exact(w.len())
        .flat_map(|r| {
            let ms = r.iter().map(|v| v * v).sum::<f32>() / r.len() as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            r.iter().zip(w).map(move |(v, w)| v * inv * w)
        })
        .collect()
}

/// y = x Wᵀ for x [t, k] and W [out, k], row-major: y is [t, out].
fn matmul(x: &[f32], t: usize, w: &[f32], out: usize) -> Vec<f32> {
    let k = w.len() / out.max(1);
    assert!(x.len() == t * k && w.len() == out * k, "matmul sizes");
    let mut y = vec![0f32; t * out];
    if t == 0 || out == 0 {
        return y;
    }
    // SAFETY: the sizes were checked above; every index sgemm forms from these dims and
    // strides is inside its slice, and `y` is exclusively borrowed.
    unsafe {
        matrixmultiply::sgemm(
            t,
            k,
            out,
            1.0,
            x.as_ptr(),
            k as isize,
            1,
            w.as_ptr(),
            1,
            k as isize,
            0.0,
            y.as_mut_ptr(),
            out as isize,
            1,
        );
    }
    y
}

/// Softmax attention of one query row over the first `n` cached positions; local query
/// head j reads local KV head j / (nh / nkv).
fn attend(q: &[f32], k: &[f32], v: &[f32], n: usize, nh: usize, nkv: usize, hd: usize) -> Vec<f32> {
    let g = nh / nkv;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0.0f32; nh * hd];
    for h in 0..nh {
        let kh = h / g;
        let qh = &q[h * hd..(h + 1) * hd];
        let row = |t: usize| (t * nkv + kh) * hd..(t * nkv + kh + 1) * hd;
        let scores: Vec<f32> = (0..n)
            .map(|t| qh.iter().zip(&k[row(t)]).map(|(a, b)| a * b).sum::<f32>() * scale)
            .collect();
        let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
        let z: f32 = e.iter().sum();
        for (t, p) in e.iter().enumerate() {
            for (o, vv) in out[h * hd..(h + 1) * hd].iter_mut().zip(&v[row(t)]) {
                *o += p / z * vv;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::cuda::cpu_ref::{argmax, CpuModel};

    fn max_rel(a: &[f32], b: &[f32]) -> f32 {
        let m = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        a.iter()
            .zip(b)
            .fold(0.0f32, |e, (x, y)| e.max((x - y).abs()))
            / m
    }

    /// A prefill and `steps` greedy decode steps on both models: the largest relative
    /// logit error and whether the greedy tokens agreed.
    fn compare(tp: &TpCpuModel, whole: &CpuModel, steps: usize) -> (f32, bool) {
        let prompt = [5u32, 900, 17, 3, 256, 1000, 42];
        let (mut c, mut tc) = (whole.new_cache(), tp.new_cache());
        let want = whole.forward(&mut c, &prompt);
        let got = tp.forward(&mut tc, &prompt);
        let mut err = want
            .iter()
            .zip(&got)
            .fold(0.0f32, |e, (w, g)| e.max(max_rel(g, w)));
        let (mut next, mut same) = (argmax(&want[6]), argmax(&got[6]) == argmax(&want[6]));
        for _ in 0..steps {
            let w = whole.forward(&mut c, &[next]);
            let g = tp.forward(&mut tc, &[next]);
            err = err.max(max_rel(&g[0], &w[0]));
            same &= argmax(&g[0]) == argmax(&w[0]);
            next = argmax(&w[0]);
        }
        assert_eq!(tc.len, prompt.len() + steps);
        (err, same)
    }

    #[test]
    fn a_sharded_forward_with_a_summing_all_reduce_equals_the_whole_model() {
        let shape = ModelShape::named("tiny").unwrap();
        let whole = CpuModel::seeded(&shape, 1);
        // 1: the plain split; 2: KV heads split; 4 and 8: each KV head on 2 and 4 ranks.
        for ranks in [1, 2, 4, 8] {
            let tp = TpCpuModel::seeded(&shape, 1, ranks).unwrap();
            assert_eq!(tp.ranks(), ranks);
            let (err, same) = compare(&tp, &whole, 12);
            assert!(err < 1e-4, "{ranks} ranks: relative logit error {err}");
            assert!(same, "{ranks} ranks: the greedy tokens differ");
        }
    }

    #[test]
    fn a_rank_attending_over_the_wrong_kv_head_or_a_missing_all_reduce_shows() {
        let shape = ModelShape::named("tiny").unwrap();
        let whole = CpuModel::seeded(&shape, 1);
        let mut shards = Shard::all(&shape, 2).unwrap();
        let (kv0, kv1) = (shards[0].kv_heads.clone(), shards[1].kv_heads.clone());
        // Each rank keeps its query heads but takes the other rank's KV heads.
        shards[0].kv_heads = kv1;
        shards[1].kv_heads = kv0;
        let wrong = TpCpuModel::from_shards(&shape, shards, |t| init_tensor_f32(&shape, 1, t));
        assert!(compare(&wrong, &whole, 2).0 > 1e-2);
        // Only rank 0's partial sums: what skipping the all-reduce would compute.
        let half = TpCpuModel::from_shards(&shape, vec![Shard::new(&shape, 0, 2).unwrap()], |t| {
            init_tensor_f32(&shape, 1, t)
        });
        assert!(compare(&half, &whole, 2).0 > 1e-2);
    }
}
