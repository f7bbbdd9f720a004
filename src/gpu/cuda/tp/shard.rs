//! Megatron-style sharding of the Llama decoder over N tensor-parallel ranks, as pure
//! functions: which query heads, KV heads and MLP columns rank r of N holds, which rows or
//! columns of each weight that is, and what it costs per rank.
//!
//! - Q, K, V and gate, up are column-parallel: rank r holds the output rows of its heads
//!   and of its slice of the intermediate dimension.
//! - O and down are row-parallel: rank r holds the input columns that match, so its
//!   product is a partial sum of the full output; an all-reduce (sum) after each makes it
//!   whole, two per layer.
//! - KV heads: split when N divides their count; when their count divides N instead, each
//!   KV head is held by N / kv_heads ranks (the query heads of one group go to several
//!   ranks). A rank's paged KV holds its KV heads for the same page numbers as every other
//!   rank, so the KV pool's page ids index every rank's cache alike.
//! - Embedding, norms and the LM head stay whole on every rank.
//!
//! A rank's weights are therefore those of a Llama model of [`Shard::local_shape`] (fewer
//! heads, a narrower MLP) whose O and down outputs are summed across ranks.

use std::ops::Range;

use crate::gpu::cuda::init::Tensor;
use crate::gpu::cuda::ModelShape;

/// Why a shape cannot be split over N ranks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("rank {rank} of {ranks}: ranks must be at least 1 and rank below them")]
    Rank { rank: usize, ranks: usize },
    #[error("{what} ({n}) does not split over {ranks} ranks")]
    Indivisible {
        what: &'static str,
        n: usize,
        ranks: usize,
    },
}

/// What rank `rank` of `ranks` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub rank: usize,
    pub ranks: usize,
    pub head_dim: usize,
    /// Its query heads (global indices).
    pub q_heads: Range<usize>,
    /// Its KV heads (global indices): every query head above attends to one of these.
    pub kv_heads: Range<usize>,
    /// Its slice of the MLP's intermediate dimension.
    pub ffn: Range<usize>,
}

fn part(
    n: usize,
    ranks: usize,
    rank: usize,
    what: &'static str,
) -> Result<Range<usize>, ShardError> {
    if !n.is_multiple_of(ranks) {
        return Err(ShardError::Indivisible { what, n, ranks });
    }
    let k = n / ranks;
    Ok(rank * k..(rank + 1) * k)
}

impl Shard {
    pub fn new(s: &ModelShape, rank: usize, ranks: usize) -> Result<Self, ShardError> {
        if ranks == 0 || rank >= ranks {
            return Err(ShardError::Rank { rank, ranks });
        }
        let q_heads = part(s.heads, ranks, rank, "query heads")?;
        let kv_heads = if s.kv_heads.is_multiple_of(ranks) {
            part(s.kv_heads, ranks, rank, "kv heads")?
        } else if ranks.is_multiple_of(s.kv_heads) {
            let kv = rank / (ranks / s.kv_heads);
            kv..kv + 1
        } else {
            return Err(ShardError::Indivisible {
                what: "kv heads",
                n: s.kv_heads,
                ranks,
            });
        };
        Ok(Shard {
            rank,
            ranks,
            head_dim: s.head_dim,
            q_heads,
            kv_heads,
            ffn: part(s.ffn, ranks, rank, "intermediate size")?,
        })
    }

    /// Every rank's shard, in rank order.
    pub fn all(s: &ModelShape, ranks: usize) -> Result<Vec<Shard>, ShardError> {
        (0..ranks).map(|r| Shard::new(s, r, ranks)).collect()
    }

    /// Ranks holding each KV head (1 when the heads are split).
    pub fn kv_replicas(&self, s: &ModelShape) -> usize {
        (self.ranks / s.kv_heads).max(1)
    }

    /// The model one rank runs: its heads and MLP slice, everything else whole.
    pub fn local_shape(&self, s: &ModelShape) -> ModelShape {
        ModelShape {
            name: format!("{}-tp{}", s.name, self.ranks),
            heads: self.q_heads.len(),
            kv_heads: self.kv_heads.len(),
            ffn: self.ffn.len(),
            ..s.clone()
        }
    }

    fn rows(&self, heads: &Range<usize>) -> Range<usize> {
        heads.start * self.head_dim..heads.end * self.head_dim
    }

    /// Rows of Q (also the columns of O) this rank holds.
    pub fn q_rows(&self) -> Range<usize> {
        self.rows(&self.q_heads)
    }

    /// Rows of K and of V this rank holds.
    pub fn kv_rows(&self) -> Range<usize> {
        self.rows(&self.kv_heads)
    }

    /// Its part of `t`, as `(rows, columns)` of the whole tensor in the HF layout
    /// ([out, in]); whole tensors (embedding, norms, LM head) give every row and column.
    pub fn part_of(&self, t: Tensor, s: &ModelShape) -> (Range<usize>, Range<usize>) {
        let (r, c) = t.dims(s);
        match t {
            Tensor::Q(_) => (self.q_rows(), 0..c),
            Tensor::K(_) | Tensor::V(_) => (self.kv_rows(), 0..c),
            Tensor::Gate(_) | Tensor::Up(_) => (self.ffn.clone(), 0..c),
            Tensor::O(_) => (0..r, self.q_rows()),
            Tensor::Down(_) => (0..r, self.ffn.clone()),
            _ => (0..r, 0..c),
        }
    }

    /// Takes this rank's part out of `w`, the whole tensor `t` (row-major, HF layout).
    pub fn take<T: Copy>(&self, t: Tensor, s: &ModelShape, w: &[T]) -> Vec<T> {
        let (_, cols) = t.dims(s);
        let (rr, cc) = self.part_of(t, s);
        let mut out = Vec::with_capacity(rr.len() * cc.len());
        for row in w.chunks_exact(cols).skip(rr.start).take(rr.len()) {
            out.extend_from_slice(&row[cc.clone()]);
        }
        out
    }

    /// Bytes of weights on this rank at `elem` bytes a value.
    pub fn weight_bytes(&self, s: &ModelShape, elem: usize) -> u64 {
        let local = self.local_shape(s);
        // The local shape counts exactly the rank's slices plus the whole tensors.
        local.param_count() * elem as u64
    }

    /// KV bytes one token occupies on this rank, all layers, K and V, `elem` bytes a value.
    pub fn kv_bytes_per_token(&self, s: &ModelShape, elem: usize) -> u64 {
        (2 * s.layers * self.kv_heads.len() * self.head_dim * elem) as u64
    }
}

/// Bytes each rank contributes to the all-reduces of one decode step of `tokens` rows: two
/// per layer, each of `tokens × hidden` values.
pub fn allreduce_bytes_per_step(s: &ModelShape, tokens: usize, elem: usize) -> u64 {
    (2 * s.layers * tokens * s.hidden * elem) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn shape(name: &str) -> ModelShape {
        ModelShape::named(name).unwrap()
    }

    #[test]
    fn llama_8b_over_two_ranks_splits_heads_kv_heads_and_the_mlp_in_halves() {
        let s = shape("llama-8b");
        let r1 = Shard::new(&s, 1, 2).unwrap();
        assert_eq!(
            (r1.q_heads.clone(), r1.kv_heads.clone(), r1.ffn.clone()),
            (16..32, 4..8, 7168..14336)
        );
        assert_eq!(r1.q_rows(), 2048..4096);
        assert_eq!(r1.kv_rows(), 512..1024);
        assert_eq!(r1.part_of(Tensor::O(3), &s), (0..4096, 2048..4096));
        assert_eq!(r1.part_of(Tensor::Down(0), &s), (0..4096, 7168..14336));
        assert_eq!(r1.part_of(Tensor::Up(0), &s), (7168..14336, 0..4096));
        assert_eq!(r1.part_of(Tensor::LmHead, &s), (0..128_256, 0..4096));
        assert_eq!(r1.kv_replicas(&s), 1);
        // Half the KV per token on each rank.
        assert_eq!(2 * r1.kv_bytes_per_token(&s, 2), s.kv_bytes_per_token());
        let local = r1.local_shape(&s);
        assert_eq!((local.heads, local.kv_heads, local.ffn), (16, 4, 7168));
        local.validate().unwrap();
    }

    #[test]
    fn more_ranks_than_kv_heads_replicate_each_kv_head_over_its_query_group() {
        let s = shape("tiny"); // 8 query heads, 2 kv heads: groups of 4
        let shards = Shard::all(&s, 4).unwrap();
        let kv: Vec<_> = shards.iter().map(|r| r.kv_heads.clone()).collect();
        assert_eq!(kv, [0..1, 0..1, 1..2, 1..2]);
        assert!(shards.iter().all(|r| r.kv_replicas(&s) == 2));
        for r in &shards {
            r.local_shape(&s).validate().unwrap();
        }
    }

    #[test]
    fn shapes_that_do_not_split_are_errors_naming_what() {
        let s = shape("tiny");
        assert_eq!(
            Shard::new(&s, 0, 3),
            Err(ShardError::Indivisible {
                what: "query heads",
                n: 8,
                ranks: 3
            })
        );
        assert_eq!(
            Shard::new(&s, 2, 2),
            Err(ShardError::Rank { rank: 2, ranks: 2 })
        );
        let mut odd = s.clone();
        odd.ffn = 520;
        assert!(matches!(
            Shard::new(&odd, 0, 16),
            Err(ShardError::Indivisible { .. })
        ));
    }

    #[test]
    fn taking_a_part_reads_the_rows_or_columns_it_names() {
        let s = shape("tiny");
        let r = Shard::new(&s, 1, 2).unwrap();
        let (rows, cols) = Tensor::O(0).dims(&s);
        let w: Vec<u32> = (0..(rows * cols) as u32).collect();
        let part = r.take(Tensor::O(0), &s, &w);
        assert_eq!(part.len(), rows * cols / 2);
        // Row 3 of the part: row 3 of O, columns 256..512.
        let half = cols / 2;
        assert_eq!(part[3 * half], (3 * cols + half) as u32);
        assert_eq!(part[3 * half + half - 1], (4 * cols - 1) as u32);
    }

    #[test]
    fn the_per_rank_weight_and_all_reduce_bytes_add_up() {
        let s = shape("llama-8b");
        let shards = Shard::all(&s, 2).unwrap();
        let whole = |t: Tensor| {
            let (r, c) = t.dims(&s);
            (r * c) as u64
        };
        let replicated = whole(Tensor::Embed)
            + whole(Tensor::LmHead)
            + whole(Tensor::FinalNorm)
            + s.layers as u64 * 2 * whole(Tensor::AttnNorm(0));
        let sum: u64 = shards.iter().map(|r| r.weight_bytes(&s, 2)).sum();
        // Sharded weights counted once over the ranks, whole ones once per rank.
        assert_eq!(sum, s.param_count() * 2 + replicated * 2);
        // 32 layers × 2 all-reduces × 4096 bf16 values per token.
        assert_eq!(allreduce_bytes_per_step(&s, 1, 2), 32 * 2 * 4096 * 2);
    }

    fn shapes() -> impl Strategy<Value = (ModelShape, usize)> {
        // kv heads 1..8, group 1, 2, 4 or 8, ffn a multiple of 64, ranks a power of two.
        (0u32..4, 0u32..4, 1usize..16, 0u32..4).prop_map(|(kv, g, f, r)| {
            let mut s = ModelShape::named("tiny").unwrap();
            s.kv_heads = 1 << kv;
            s.heads = s.kv_heads << g;
            s.ffn = 64 * f;
            (s, 1 << r)
        })
    }

    proptest! {
        #[test]
        fn the_shards_cover_every_head_and_column_once_and_each_query_head_sees_its_kv_head(
            (s, ranks) in shapes()
        ) {
            let Ok(shards) = Shard::all(&s, ranks) else {
                // Only when a count does not split.
                prop_assert!(s.heads % ranks != 0 || s.ffn % ranks != 0
                    || (s.kv_heads % ranks != 0 && ranks % s.kv_heads != 0));
                return Ok(());
            };
            let mut q = vec![0; s.heads];
            let mut f = vec![0; s.ffn];
            let mut kv = vec![0; s.kv_heads];
            for r in &shards {
                r.q_heads.clone().for_each(|h| q[h] += 1);
                r.ffn.clone().for_each(|c| f[c] += 1);
                r.kv_heads.clone().for_each(|h| kv[h] += 1);
                // The rank's own model (its local shape) pairs local query head j with
                // local KV head j / group: the same KV head the whole model pairs it with.
                let local = r.local_shape(&s);
                for (j, h) in r.q_heads.clone().enumerate() {
                    prop_assert!(r.kv_heads.contains(&(h / s.group())));
                    prop_assert_eq!(h / s.group() - r.kv_heads.start, j / local.group());
                }
            }
            prop_assert!(q.iter().all(|&n| n == 1));
            prop_assert!(f.iter().all(|&n| n == 1));
            prop_assert!(kv.iter().all(|&n| n == shards[0].kv_replicas(&s)));
        }
    }
}
