//! The tensor-parallel decode step's lower bound: each rank reads its weights and its KV
//! heads' cache once per step at the HBM bandwidth, and the ranks then wait for the two
//! all-reduces of every layer (the residual stream, f32, `rows × hidden` values each) at
//! the time NCCL takes for that size. What a measured TP step is compared against.

use serde::Serialize;

use super::shard::{Shard, ShardError};
use crate::gpu::cuda::ModelShape;

/// Bytes of one residual value in the forward's all-reduce (the residual stream is f32).
pub const RESIDUAL_BYTES: usize = 4;

/// One decode step's bound on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TpStep {
    pub ranks: usize,
    pub batch: usize,
    pub context: usize,
    /// bf16 weights one rank reads.
    pub weight_bytes: u64,
    /// bf16 KV one rank reads (its KV heads, `batch × context` tokens).
    pub kv_bytes: u64,
    /// Bytes of one all-reduce, and how many a step makes.
    pub allreduce_bytes: u64,
    pub allreduces: usize,
    /// (weights + KV) / HBM bandwidth.
    pub memory_s: f64,
    /// All-reduces × the time one takes.
    pub allreduce_s: f64,
    pub total_s: f64,
    /// allreduce_s / total_s.
    pub allreduce_share: f64,
}

/// The bound for `batch` rows at `context` tokens each over `ranks` GPUs of `hbm_bw`
/// bytes/s, with `allreduce_s(bytes)` the measured time of one all-reduce of that size.
pub fn tp_step(
    s: &ModelShape,
    ranks: usize,
    batch: usize,
    context: usize,
    hbm_bw: f64,
    allreduce_s: impl Fn(u64) -> f64,
) -> Result<TpStep, ShardError> {
    // Every rank holds the same amount; rank 0 stands for all.
    let r0 = Shard::new(s, 0, ranks)?;
    let weight_bytes = r0.weight_bytes(s, 2);
    let kv_bytes = r0.kv_bytes_per_token(s, 2) * (batch * context) as u64;
    let memory_s = (weight_bytes + kv_bytes) as f64 / hbm_bw;
    let (allreduces, allreduce_bytes) = if ranks > 1 {
        (2 * s.layers, (batch * s.hidden * RESIDUAL_BYTES) as u64)
    } else {
        (0, 0)
    };
    let ar = if allreduces > 0 {
        allreduces as f64 * allreduce_s(allreduce_bytes)
    } else {
        0.0
    };
    let total_s = memory_s + ar;
    Ok(TpStep {
        ranks,
        batch,
        context,
        weight_bytes,
        kv_bytes,
        allreduce_bytes,
        allreduces,
        memory_s,
        allreduce_s: ar,
        total_s,
        allreduce_share: if total_s > 0.0 { ar / total_s } else { 0.0 },
    })
}

/// Time of one all-reduce of `bytes` from timings measured at sizes `points` (bytes,
/// seconds), sorted by size: linear between the two sizes around it, clamped at the ends.
pub fn interpolate(points: &[(u64, f64)], bytes: u64) -> f64 {
    let Some(&(b0, t0)) = points.first() else {
        return 0.0;
    };
    if bytes <= b0 {
        return t0;
    }
    for w in points.windows(2) {
        let ((b1, t1), (b2, t2)) = (w[0], w[1]);
        if bytes <= b2 {
            let f = (bytes - b1) as f64 / (b2 - b1).max(1) as f64;
            return t1 + f * (t2 - t1);
        }
    }
    points.last().map_or(0.0, |&(_, t)| t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_ranks_halve_the_kv_and_add_two_all_reduces_a_layer() {
        let s = ModelShape::named("llama-8b").unwrap();
        let one = tp_step(&s, 1, 64, 4096, 4.0e12, |_| 1.0).unwrap();
        let two = tp_step(&s, 2, 64, 4096, 4.0e12, |_| 10e-6).unwrap();
        assert_eq!(one.allreduces, 0);
        assert_eq!(one.allreduce_s, 0.0);
        assert_eq!(one.kv_bytes, s.kv_bytes_per_token() * 64 * 4096);
        assert_eq!(two.kv_bytes * 2, one.kv_bytes);
        assert_eq!(two.allreduces, 64);
        assert_eq!(two.allreduce_bytes, 64 * 4096 * 4);
        assert!((two.allreduce_s - 64.0 * 10e-6).abs() < 1e-12);
        // Half the sharded weights, the whole embedding and LM head on each rank.
        assert!(two.weight_bytes * 2 > one.weight_bytes);
        assert!(two.weight_bytes < one.weight_bytes);
        assert!((two.allreduce_share - two.allreduce_s / two.total_s).abs() < 1e-12);
    }

    #[test]
    fn interpolation_is_linear_between_points_and_clamped_outside() {
        let p = [(1000, 10e-6), (3000, 30e-6)];
        assert_eq!(interpolate(&p, 10), 10e-6);
        assert!((interpolate(&p, 2000) - 20e-6).abs() < 1e-15);
        assert_eq!(interpolate(&p, 1 << 30), 30e-6);
        assert_eq!(interpolate(&[], 5), 0.0);
    }
}
