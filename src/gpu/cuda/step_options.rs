//! How a forward pass is launched: which attention kernel, programmatic dependent launch,
//! how finely attention splits a row's context (or deals a pass's tiles out evenly), whether
//! a single-split pass skips the split merge, up to how many rows the weight products run on
//! the GEMV kernels, whether qkv, o_proj and down_proj run in K slices summed by the kernel
//! that reads their output, and whether a row's sums must not depend on its batch
//! (`batch_invariant`). The defaults are what BENCHMARKS.md §3.5–3.12 measured best on the
//! H200; the environment overrides each one so that `tools/gpu/run.sh` can time them side by
//! side from one binary, and `StepOptions::plain` (every option off) is the launch the GPU
//! tests check them against.

use super::device::{AttnKernel, TcRing, GEMV_MAX_ROWS};
use crate::gpu::BackendError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepOptions {
    /// `GENSLOT_ATTN_KERNEL=tc|simt`.
    pub attn: AttnKernel,
    /// `GENSLOT_PDL=0|1`: launch the kernels that begin with `PDL_BEGIN` programmatically,
    /// so each one's blocks are scheduled while the kernel before it drains.
    pub pdl: bool,
    /// `GENSLOT_ATTN_BLOCKS_PER_SM=N`: the attention blocks per multiprocessor that the split
    /// count aims for (`forward::splits_for`). More splits overlap more loads but add
    /// per-block start and merge work.
    pub attn_blocks_per_sm: usize,
    /// `GENSLOT_ATTN_DIRECT=0|1`: a pass whose attention has one split writes its bf16 output
    /// from the attention kernel, with no `attn_combine` launch.
    pub direct_single_split: bool,
    /// `GENSLOT_GEMV_ROWS=N`: weight products of at most N rows (0 to `GEMV_MAX_ROWS`) run
    /// on the GEMV kernels (gemv.cu) instead of cuBLAS; 0 sends every product to cuBLAS.
    pub gemv_rows: usize,
    /// `GENSLOT_BATCH_INVARIANT=0|1`: every decode pass adds each row's numbers in the same
    /// order whatever the batch, so a request's tokens do not depend on the batch it runs in
    /// (paused or not, alone or not): attention splits each row by its own length only
    /// (`forward::invariant_splits`) and every decode product runs on one pinned cuBLASLt
    /// algorithm per shape (`pinned_gemm.rs`; no GEMV).
    pub batch_invariant: bool,
    /// `GENSLOT_ATTN_WARPS=N`, `GENSLOT_ATTN_STAGES=N`: the tensor-core attention block's
    /// warps and each warp's cp.async stages (how many bytes a multiprocessor has in flight,
    /// against how many blocks fit in its shared memory).
    pub attn_ring: TcRing,
    /// `GENSLOT_ATTN_BALANCED=0|1|auto`: the grid of a decode pass of one attention split a
    /// row (`AttnGrid`). Not with `batch_invariant` (where a row's pieces fall depends on the
    /// batch).
    pub attn_grid: AttnGrid,
    /// `GENSLOT_EARLY_KV=0|1`: in a decode step the tensor-core attention kernel copies its
    /// first tiles of K and V before it waits for the kernel before it (with PDL).
    pub early_kv: bool,
    /// `GENSLOT_DOWN_SPLITS=N`: a decode pass of more rows than the GEMV takes runs down_proj
    /// as N slices of its K (one strided-batched cuBLAS product into N float32 parts), and the
    /// next RMSNorm adds the parts into the residual (layers.cu), instead of cuBLAS adding
    /// its own K splits with a reduction launch; 0 (or a K that N does not divide) leaves
    /// down_proj to cuBLAS. Not with `batch_invariant`.
    pub down_splits: usize,
    /// `GENSLOT_O_SPLITS=N`: o_proj as `down_splits` runs down_proj, its parts added by the
    /// RMSNorm before the MLP. At batch 64 cuBLAS's o_proj reads its weight at 2.6 TB/s (ncu,
    /// BENCHMARKS.md §3.11), but in 2 slices the step was no faster (§3.12).
    pub o_splits: usize,
    /// `GENSLOT_QKV_SPLITS=N`: an attention layer's qkv product in N K slices, its parts
    /// summed (and rounded to bf16, as cuBLAS rounds its output) by RoPE + KV write
    /// (`rope_kv_write` in layers.cu). A recurrent layer's qkv keeps the plain product. In 2
    /// or 4 slices the step was 0.5-1.8 % slower (BENCHMARKS.md §3.12).
    pub qkv_splits: usize,
    /// `GENSLOT_LONGEST_FIRST=0|1`: a decode step's rows go to the GPU longest context first
    /// (`row_order.rs`), so the attention blocks of the longest rows start first instead of
    /// trailing the kernel; the step's tokens come back in the batch's order. Rows are
    /// independent, so the order changes no row's numbers. A drafter's verify passes keep
    /// the batch's order.
    pub longest_first: bool,
}

/// The grid a decode pass of one attention split a row (as many (row, kv head) pairs as block
/// slots, or more) runs the tensor-core attention on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnGrid {
    /// A block per (row, kv head) pair, in waves over the multiprocessors.
    Split,
    /// The blocks that fit on the chip at once, each warp taking an equal run of the pass's
    /// tiles (attention_balanced.cu). Pages must hold whole tiles of 16 tokens; other passes
    /// keep the split grid. On uniform rows it reads KV more slowly than the split grid (batch
    /// 64 at 4k 2.2 % slower on the H200, BENCHMARKS.md §3.13; 1.773k 3.2 % on the H100,
    /// §3.26); on a mix whose longest row's block holds more than about 5/4 of a slot's mean
    /// tokens it is faster (§3.26–3.27).
    Balanced,
    /// Per pass: the balanced grid when the rows' lengths are uneven enough that the split
    /// grid's end waits on its longest blocks longer than the balanced grid's slower stream
    /// costs (`forward::uneven_rows`), else the split grid. A CUDA graph is captured for
    /// each grid.
    Auto,
}

impl Default for StepOptions {
    /// Measured on the H200 (BENCHMARKS.md §3.5–3.6, §3.11–3.12): PDL, two attention blocks
    /// per multiprocessor (batch 64 and 128 at 4k then run one split, written directly), the
    /// one-row GEMV (batch 1 from 1.33-1.40x to 1.25-1.27x the roofline) and down_proj in 4 K
    /// slices (batch 64 0.2-0.7 % faster on four machine starts); the balanced attention grid
    /// on passes whose rows' lengths are uneven (§3.26: on the H100 a pooled served mix's
    /// batch 64 17 % and batch 128 4.3 % faster, even rows unchanged). Not batch-invariant:
    /// both the split count and the one-row GEMV change a row's sums with the batch size
    /// (§3.6 measured a row's logits moving by about 1e-2); `invariant()` is the launch that
    /// keeps them.
    fn default() -> Self {
        StepOptions {
            attn: AttnKernel::TensorCore,
            pdl: true,
            attn_blocks_per_sm: 2,
            direct_single_split: true,
            gemv_rows: 1,
            batch_invariant: false,
            attn_ring: TcRing::default(),
            attn_grid: AttnGrid::Auto,
            early_kv: true,
            down_splits: 4,
            o_splits: 0,
            qkv_splits: 0,
            longest_first: true,
        }
    }
}

/// The most attention blocks per multiprocessor a split policy may ask for.
const MAX_BLOCKS_PER_SM: usize = 64;
/// The most K slices a product may be cut into (`StepOptions::down_splits`, `o_splits`,
/// `qkv_splits`).
const MAX_K_SLICES: usize = 8;

impl StepOptions {
    /// Every option off: plain launches, cuBLAS for every product, 8 attention blocks per
    /// multiprocessor merged by `attn_combine` (the step before these options existed).
    pub fn plain() -> Self {
        StepOptions {
            attn: AttnKernel::TensorCore,
            pdl: false,
            attn_blocks_per_sm: 8,
            direct_single_split: false,
            gemv_rows: 0,
            batch_invariant: false,
            attn_ring: TcRing::default(),
            attn_grid: AttnGrid::Split,
            early_kv: false,
            down_splits: 0,
            o_splits: 0,
            qkv_splits: 0,
            longest_first: false,
        }
    }

    /// The defaults made batch-invariant (`GENSLOT_BATCH_INVARIANT=1`): no GEMV, decode
    /// products on pinned cuBLASLt algorithms, attention split by each row's own length.
    pub fn invariant() -> Self {
        StepOptions {
            gemv_rows: 0,
            batch_invariant: true,
            attn_grid: AttnGrid::Split,
            down_splits: 0,
            o_splits: 0,
            qkv_splits: 0,
            ..StepOptions::default()
        }
    }

    pub fn from_env() -> Result<Self, BackendError> {
        Self::parse(|k| std::env::var(k).ok())
    }

    /// `from_env`, batch-invariant when `batch_invariant` (the config's key of that name)
    /// whatever `GENSLOT_BATCH_INVARIANT` says.
    pub fn from_env_with(batch_invariant: bool) -> Result<Self, BackendError> {
        Self::parse(|k| match k {
            "GENSLOT_BATCH_INVARIANT" if batch_invariant => Some("1".into()),
            _ => std::env::var(k).ok(),
        })
    }

    /// The options from the variables `get` returns; unset ones keep their value in
    /// `GENSLOT_LAUNCH` (`default`, or `plain`: every option off).
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Self, BackendError> {
        let bad = |k: &str, v: &str, want: &str| {
            BackendError::Failed(format!("{k}={v}: expected {want}"))
        };
        let flag = |k: &str, default: bool| match get(k).as_deref() {
            None => Ok(default),
            Some("0") => Ok(false),
            Some("1") => Ok(true),
            Some(v) => Err(bad(k, v, "0 or 1")),
        };
        // A bounded count; `bad` names the range.
        let count = |k: &str, default: usize, lo: usize, hi: usize| match get(k) {
            None => Ok(default),
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (lo..=hi).contains(&n) => Ok(n),
                _ => Err(bad(k, &v, &format!("{lo} to {hi}"))),
            },
        };
        let d = match get("GENSLOT_LAUNCH").as_deref() {
            None | Some("default") => StepOptions::default(),
            Some("plain") => StepOptions::plain(),
            Some(v) => return Err(bad("GENSLOT_LAUNCH", v, "`default` or `plain`")),
        };
        let attn = match get("GENSLOT_ATTN_KERNEL").as_deref() {
            None => d.attn,
            Some("tc") => AttnKernel::TensorCore,
            Some("simt") => AttnKernel::Simt,
            Some(v) => return Err(bad("GENSLOT_ATTN_KERNEL", v, "`tc` or `simt`")),
        };
        let attn_blocks_per_sm = count(
            "GENSLOT_ATTN_BLOCKS_PER_SM",
            d.attn_blocks_per_sm,
            1,
            MAX_BLOCKS_PER_SM,
        )?;
        let batch_invariant = flag("GENSLOT_BATCH_INVARIANT", d.batch_invariant)?;
        // A count the batch-invariant launch holds at 0 (it would change a row's order of
        // sums); asked for there, an error saying `why`.
        let invariant_zero =
            |k: &str, default: usize, hi: usize, why: &str| match (batch_invariant, get(k)) {
                (true, Some(v)) if v != "0" => Err(bad(
                    k,
                    &v,
                    &format!("0 with GENSLOT_BATCH_INVARIANT=1 ({why})"),
                )),
                (true, _) => Ok(0),
                (false, _) => count(k, default, 0, hi),
            };
        let gemv_rows = invariant_zero(
            "GENSLOT_GEMV_ROWS",
            d.gemv_rows,
            GEMV_MAX_ROWS,
            "the GEMV adds a row's products in another order than cuBLAS adds a batch's",
        )?;
        let slices = |k: &str, default: usize| {
            invariant_zero(
                k,
                default,
                MAX_K_SLICES,
                "the pinned products keep one K split",
            )
        };
        let attn_grid = match (batch_invariant, get("GENSLOT_ATTN_BALANCED").as_deref()) {
            (true, None) => AttnGrid::Split,
            (false, None) => d.attn_grid,
            (_, Some("0")) => AttnGrid::Split,
            (true, Some(v)) => {
                return Err(bad(
                    "GENSLOT_ATTN_BALANCED",
                    v,
                    "0 with GENSLOT_BATCH_INVARIANT=1 (a row's pieces would fall where the \
                     batch puts them)",
                ))
            }
            (false, Some("1")) => AttnGrid::Balanced,
            (false, Some("auto")) => AttnGrid::Auto,
            (false, Some(v)) => return Err(bad("GENSLOT_ATTN_BALANCED", v, "`0`, `1` or `auto`")),
        };
        let down_splits = slices("GENSLOT_DOWN_SPLITS", d.down_splits)?;
        let o_splits = slices("GENSLOT_O_SPLITS", d.o_splits)?;
        let qkv_splits = slices("GENSLOT_QKV_SPLITS", d.qkv_splits)?;
        Ok(StepOptions {
            attn,
            pdl: flag("GENSLOT_PDL", d.pdl)?,
            attn_blocks_per_sm,
            direct_single_split: flag("GENSLOT_ATTN_DIRECT", d.direct_single_split)?,
            gemv_rows,
            batch_invariant,
            attn_ring: TcRing {
                warps: count("GENSLOT_ATTN_WARPS", d.attn_ring.warps, 1, 16)?,
                stages: count("GENSLOT_ATTN_STAGES", d.attn_ring.stages, 2, 8)?,
            },
            attn_grid,
            early_kv: flag("GENSLOT_EARLY_KV", d.early_kv)?,
            down_splits,
            o_splits,
            qkv_splits,
            longest_first: flag("GENSLOT_LONGEST_FIRST", d.longest_first)?,
        })
    }

    /// One line for bench reports and logs.
    pub fn describe(&self) -> String {
        let on = |b: bool| if b { "on" } else { "off" };
        let attn = match self.attn {
            AttnKernel::TensorCore => "tc",
            AttnKernel::Simt => "simt",
        };
        let gemv = match self.gemv_rows {
            0 => "off".to_string(),
            1 => "for 1 row".to_string(),
            n => format!("up to {n} rows"),
        };
        let splits = match self.batch_invariant {
            true => "splits by row length (batch-invariant)".to_string(),
            false => format!("{} blocks/SM", self.attn_blocks_per_sm),
        };
        // The balanced grid is the tensor-core kernel's.
        let balanced = match (self.attn, self.attn_grid) {
            (AttnKernel::TensorCore, AttnGrid::Balanced) => ", balanced",
            (AttnKernel::TensorCore, AttnGrid::Auto) => ", balanced when rows are uneven",
            _ => "",
        };
        // The ring shapes the tensor-core kernel only.
        let ring = match self.attn == AttnKernel::Simt || self.attn_ring == TcRing::default() {
            true => String::new(),
            false => format!(
                " ({} warps x {} stages)",
                self.attn_ring.warps, self.attn_ring.stages
            ),
        };
        let slices: String = [
            ("qkv", self.qkv_splits),
            ("o_proj", self.o_splits),
            ("down_proj", self.down_splits),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!(", {name} in {n} K slices"))
        .collect();
        format!(
            "attention {attn}{ring}, {splits}{balanced}, direct single split {}, early KV {}, PDL {}, \
             GEMV {gemv}{slices}, longest rows first {}",
            on(self.direct_single_split),
            on(self.early_kv && self.attn == AttnKernel::TensorCore),
            on(self.pdl),
            on(self.longest_first)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn unset_variables_give_the_measured_defaults() {
        let o = StepOptions::parse(env(&[])).unwrap();
        assert_eq!(o, StepOptions::default());
        assert_eq!(o.attn, AttnKernel::TensorCore);
        assert!(o.pdl && o.direct_single_split && o.early_kv && !o.batch_invariant);
        assert_eq!(o.attn_blocks_per_sm, 2);
        assert_eq!(o.gemv_rows, 1);
        assert_eq!((o.qkv_splits, o.o_splits, o.down_splits), (0, 0, 4));
        assert_eq!(o.attn_grid, AttnGrid::Auto);
        assert_eq!(StepOptions::invariant().attn_grid, AttnGrid::Split);
        assert_eq!(StepOptions::plain().attn_grid, AttnGrid::Split);
    }

    #[test]
    fn each_variable_sets_its_option() {
        let o = StepOptions::parse(env(&[
            ("GENSLOT_ATTN_KERNEL", "simt"),
            ("GENSLOT_PDL", "1"),
            ("GENSLOT_ATTN_BLOCKS_PER_SM", "2"),
            ("GENSLOT_ATTN_DIRECT", "1"),
            ("GENSLOT_GEMV_ROWS", "4"),
            ("GENSLOT_ATTN_WARPS", "2"),
            ("GENSLOT_ATTN_STAGES", "5"),
            ("GENSLOT_EARLY_KV", "0"),
            ("GENSLOT_DOWN_SPLITS", "4"),
            ("GENSLOT_O_SPLITS", "2"),
            ("GENSLOT_QKV_SPLITS", "8"),
            ("GENSLOT_ATTN_BALANCED", "1"),
            ("GENSLOT_LONGEST_FIRST", "0"),
        ]))
        .unwrap();
        assert_eq!(
            o,
            StepOptions {
                attn: AttnKernel::Simt,
                pdl: true,
                attn_blocks_per_sm: 2,
                direct_single_split: true,
                gemv_rows: 4,
                batch_invariant: false,
                attn_ring: TcRing {
                    warps: 2,
                    stages: 5
                },
                attn_grid: AttnGrid::Balanced,
                early_kv: false,
                down_splits: 4,
                o_splits: 2,
                qkv_splits: 8,
                longest_first: false,
            }
        );
        assert_eq!(
            o.describe(),
            "attention simt, 2 blocks/SM, direct single split on, early KV off, PDL on, GEMV up \
             to 4 rows, qkv in 8 K slices, o_proj in 2 K slices, down_proj in 4 K slices, longest rows \
             first off"
        );
        // The ring shapes (and is named for) the tensor-core kernel only.
        let tc = StepOptions {
            attn: AttnKernel::TensorCore,
            ..o
        };
        assert!(tc
            .describe()
            .starts_with("attention tc (2 warps x 5 stages), 2 blocks/SM, balanced, direct"));
        assert_eq!(
            StepOptions::default().describe(),
            "attention tc, 2 blocks/SM, balanced when rows are uneven, direct single split on, \
             early KV on, PDL on, GEMV for 1 row, down_proj in 4 K slices, longest rows first on"
        );
        // Early copies are the tensor-core kernel's: the SIMT kernel is never said to make them.
        let simt = StepOptions {
            attn: AttnKernel::Simt,
            ..StepOptions::default()
        };
        assert!(simt.describe().contains("early KV off"));
    }

    #[test]
    fn the_plain_launch_turns_every_option_off_and_variables_still_apply_on_top() {
        let o = StepOptions::parse(env(&[("GENSLOT_LAUNCH", "plain")])).unwrap();
        assert_eq!(o, StepOptions::plain());
        assert!(!o.pdl && !o.direct_single_split && !o.early_kv);
        assert_eq!((o.attn_blocks_per_sm, o.gemv_rows), (8, 0));
        assert!(!o.batch_invariant);
        let o =
            StepOptions::parse(env(&[("GENSLOT_LAUNCH", "plain"), ("GENSLOT_PDL", "1")])).unwrap();
        assert_eq!(
            o,
            StepOptions {
                pdl: true,
                ..StepOptions::plain()
            }
        );
        let o = StepOptions::parse(env(&[("GENSLOT_LAUNCH", "default")])).unwrap();
        assert_eq!(o, StepOptions::default());
    }

    #[test]
    fn the_batch_invariant_launch_takes_every_product_off_the_gemv() {
        let o = StepOptions::parse(env(&[("GENSLOT_BATCH_INVARIANT", "1")])).unwrap();
        assert_eq!(o, StepOptions::invariant());
        assert!(o.batch_invariant && o.pdl);
        assert_eq!(o.gemv_rows, 0);
        assert!(o.describe().contains("batch-invariant"), "{}", o.describe());
        let o = StepOptions::parse(env(&[
            ("GENSLOT_BATCH_INVARIANT", "1"),
            ("GENSLOT_GEMV_ROWS", "0"),
        ]))
        .unwrap();
        assert_eq!(o, StepOptions::invariant());
        // Asking for both is a contradiction, not a silent choice.
        let e = StepOptions::parse(env(&[
            ("GENSLOT_BATCH_INVARIANT", "1"),
            ("GENSLOT_GEMV_ROWS", "1"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("GENSLOT_GEMV_ROWS=1") && e.contains("BATCH_INVARIANT"),
            "{e}"
        );
        // So is cutting a product into K slices: another order of sums.
        for k in [
            "GENSLOT_DOWN_SPLITS",
            "GENSLOT_O_SPLITS",
            "GENSLOT_QKV_SPLITS",
        ] {
            let e = StepOptions::parse(env(&[("GENSLOT_BATCH_INVARIANT", "1"), (k, "4")]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("{k}=4")), "{e}");
        }
        // And the balanced attention grid, always or by pass: where a row's pieces fall
        // depends on the batch.
        for v in ["1", "auto"] {
            let e = StepOptions::parse(env(&[
                ("GENSLOT_BATCH_INVARIANT", "1"),
                ("GENSLOT_ATTN_BALANCED", v),
            ]))
            .unwrap_err()
            .to_string();
            assert!(e.contains(&format!("GENSLOT_ATTN_BALANCED={v}")), "{e}");
        }
    }

    #[test]
    fn the_attention_grid_is_split_balanced_or_chosen_per_pass() {
        for (v, grid, says) in [
            ("0", AttnGrid::Split, None),
            ("1", AttnGrid::Balanced, Some(", balanced,")),
            (
                "auto",
                AttnGrid::Auto,
                Some(", balanced when rows are uneven,"),
            ),
        ] {
            let o = StepOptions::parse(env(&[("GENSLOT_ATTN_BALANCED", v)])).unwrap();
            assert_eq!(o.attn_grid, grid, "{v}");
            let line = o.describe();
            match says {
                Some(s) => assert!(line.contains(s), "{v}: {line}"),
                None => assert!(!line.contains("balanced"), "{v}: {line}"),
            }
        }
        // The balanced grid is the tensor-core kernel's: the SIMT kernel's line names none.
        let simt = StepOptions::parse(env(&[
            ("GENSLOT_ATTN_BALANCED", "auto"),
            ("GENSLOT_ATTN_KERNEL", "simt"),
        ]))
        .unwrap();
        assert!(!simt.describe().contains("balanced"), "{}", simt.describe());
    }

    #[test]
    fn bad_values_are_errors_that_name_the_variable() {
        for (k, v) in [
            ("GENSLOT_PDL", "on"),
            ("GENSLOT_ATTN_DIRECT", "yes"),
            ("GENSLOT_EARLY_KV", "2"),
            ("GENSLOT_ATTN_KERNEL", "flash"),
            ("GENSLOT_ATTN_BLOCKS_PER_SM", "0"),
            ("GENSLOT_ATTN_BLOCKS_PER_SM", "65"),
            ("GENSLOT_ATTN_BLOCKS_PER_SM", "eight"),
            ("GENSLOT_GEMV_ROWS", "5"),
            ("GENSLOT_GEMV_ROWS", "-1"),
            ("GENSLOT_LAUNCH", "fast"),
            ("GENSLOT_BATCH_INVARIANT", "yes"),
            ("GENSLOT_ATTN_WARPS", "0"),
            ("GENSLOT_ATTN_STAGES", "1"),
            ("GENSLOT_ATTN_STAGES", "9"),
            ("GENSLOT_DOWN_SPLITS", "9"),
            ("GENSLOT_O_SPLITS", "two"),
            ("GENSLOT_QKV_SPLITS", "9"),
            ("GENSLOT_ATTN_BALANCED", "2"),
        ] {
            let e = StepOptions::parse(env(&[(k, v)])).unwrap_err().to_string();
            assert!(e.contains(&format!("{k}={v}")), "{e}");
        }
    }
}
