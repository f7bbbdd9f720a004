//! Which kernel multiplies a layer's weights by the batch: the weight-streaming kernel of
//! `kernels/gemm.cu` for decode-sized batches, cuBLAS for the rest (prefill, large batches).
//! The choice is a pure function of the row count, so a captured graph always holds the
//! same kernels for its batch bucket. `genslot-gpu gemm-bench` measures every variant against
//! cuBLAS on the model's weight shapes: the table in `choose` comes from that run
//! (BENCHMARKS.md §3.4).

use crate::gpu::BackendError;

/// Threads per block of every variant (`WG_WARPS * 32` in gemm.cu).
pub const THREADS: u32 = 256;

/// One instance of the kernel: `nt` tiles of 8 input rows against `mt` tiles of 16 weight
/// rows per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Variant {
    pub nt: usize,
    pub mt: usize,
}

/// Every instance gemm.cu defines (`WGEMM_INSTANCE`).
pub const VARIANTS: [Variant; 10] = [
    Variant { nt: 1, mt: 1 },
    Variant { nt: 1, mt: 2 },
    Variant { nt: 2, mt: 1 },
    Variant { nt: 2, mt: 2 },
    Variant { nt: 4, mt: 1 },
    Variant { nt: 4, mt: 2 },
    Variant { nt: 8, mt: 1 },
    Variant { nt: 8, mt: 2 },
    Variant { nt: 16, mt: 1 },
    Variant { nt: 16, mt: 2 },
];

impl Variant {
    pub fn kernel_name(self) -> String {
        format!("wgemm_n{}_m{}", self.nt, self.mt)
    }

    /// The most input rows one launch takes.
    pub fn max_rows(self) -> usize {
        8 * self.nt
    }

    /// Blocks for `out` weight rows.
    pub fn blocks(self, out: usize) -> u32 {
        out.div_ceil(16 * self.mt) as u32
    }

    /// The narrowest instance with `mt` that takes `rows` rows.
    pub fn for_rows(rows: usize, mt: usize) -> Option<Variant> {
        VARIANTS
            .iter()
            .copied()
            .find(|v| v.mt == mt && v.max_rows() >= rows)
    }
}

/// `GENSLOT_GEMM=auto|cublas|stream`: the measured choice (default), cuBLAS for every
/// product (the previous path, for comparisons), or the streaming kernel wherever it fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmPath {
    Auto,
    Cublas,
    Stream,
}

impl GemmPath {
    pub fn from_env() -> Result<Self, BackendError> {
        Self::parse(std::env::var("GENSLOT_GEMM").ok().as_deref())
    }

    pub fn parse(v: Option<&str>) -> Result<Self, BackendError> {
        match v {
            None | Some("auto") => Ok(GemmPath::Auto),
            Some("cublas") => Ok(GemmPath::Cublas),
            Some("stream") => Ok(GemmPath::Stream),
            Some(other) => Err(BackendError::Failed(format!(
                "GENSLOT_GEMM={other}: expected `auto`, `cublas` or `stream`"
            ))),
        }
    }
}

/// Up to this many rows `Auto` streams the weights; above, cuBLAS's tensor-core tiles win.
pub const AUTO_MAX_ROWS: usize = 64;

/// The streaming variant for a product of `rows` rows with `inp` inputs, or None for cuBLAS.
pub fn choose(path: GemmPath, rows: usize, inp: usize) -> Option<Variant> {
    if rows == 0 || !inp.is_multiple_of(32) {
        return None;
    }
    let limit = match path {
        GemmPath::Cublas => return None,
        GemmPath::Auto => AUTO_MAX_ROWS,
        GemmPath::Stream => VARIANTS.iter().map(|v| v.max_rows()).max().unwrap_or(0),
    };
    if rows > limit {
        return None;
    }
    Variant::for_rows(rows, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_is_instantiated_once_in_the_kernel_source() {
        let src = include_str!("kernels/gemm.cu");
        for v in VARIANTS {
            let inst = format!("WGEMM_INSTANCE({}, {})", v.nt, v.mt);
            assert_eq!(src.matches(&inst).count(), 1, "{inst}");
        }
        assert_eq!(src.matches("\nWGEMM_INSTANCE(").count(), VARIANTS.len());
        assert!(src.contains(&format!("#define WG_WARPS {}", THREADS / 32)));
    }

    #[test]
    fn the_chosen_variant_covers_every_row_with_the_fewest_tiles() {
        for rows in 1..=AUTO_MAX_ROWS {
            let v = choose(GemmPath::Auto, rows, 4096).expect("streams decode-sized batches");
            assert!(v.max_rows() >= rows, "{rows} rows on {v:?}");
            assert!(v.nt == 1 || v.max_rows() / 2 < rows, "{rows} rows on {v:?}");
        }
    }

    #[test]
    fn cublas_takes_large_batches_odd_inner_sizes_and_the_cublas_path() {
        assert_eq!(choose(GemmPath::Auto, AUTO_MAX_ROWS + 1, 4096), None);
        assert_eq!(choose(GemmPath::Auto, 4096, 4096), None, "a prefill");
        assert_eq!(
            choose(GemmPath::Auto, 1, 4100),
            None,
            "inp not a multiple of 32"
        );
        assert_eq!(choose(GemmPath::Cublas, 1, 4096), None);
        assert_eq!(choose(GemmPath::Stream, 128, 4096).map(|v| v.nt), Some(16));
        assert_eq!(choose(GemmPath::Stream, 129, 4096), None);
    }

    #[test]
    fn blocks_cover_every_weight_row() {
        for v in VARIANTS {
            for out in [1, 15, 16, 17, 4096, 128_256] {
                assert!(v.blocks(out) as usize * 16 * v.mt >= out);
                assert!((v.blocks(out) as usize - 1) * 16 * v.mt < out);
            }
        }
    }

    #[test]
    fn the_path_is_read_from_its_variable_and_rejects_typos() {
        assert_eq!(GemmPath::parse(None).ok(), Some(GemmPath::Auto));
        assert_eq!(GemmPath::parse(Some("cublas")).ok(), Some(GemmPath::Cublas));
        assert_eq!(GemmPath::parse(Some("stream")).ok(), Some(GemmPath::Stream));
        assert!(GemmPath::parse(Some("cuBLAS")).is_err());
    }
}
