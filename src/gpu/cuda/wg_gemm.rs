//! Weight products of decode batches on Hopper's warpgroup MMA (`kernels/gemm_wg.cu`), for
//! the products of more rows than the GEMV takes and at most `StepOptions::wg_rows` (up to
//! 128): a persistent grid that cuts the product's (n tile, k tile) units evenly over every
//! block the chip holds at once and starts streaming its weights before the kernel before it
//! has finished (PDL). The unit arithmetic (`Partition`) mirrors the kernel's `wg_lo`,
//! `wg_owner` and `wg_slot`; its tests are the kernel's invariants, checked on the CPU.

use std::ops::RangeInclusive;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use super::device::{drv, launch_on, DevBuf, Output, Product, A};
use crate::gpu::BackendError;

const COMMON: &str = include_str!("kernels/common.cuh");
pub(crate) const GEMM_WG: &str = include_str!("kernels/gemm_wg.cu");

/// Weight rows (output features) of a tile (`WG_BN`).
pub const BN: usize = 128;
/// Inputs of a k tile (`WG_BK`): one 128-byte swizzled row of bf16.
pub const BK: usize = 64;
/// Threads of a warpgroup (`WG_THREADS`); a block has one for each 64 rows of the batch.
pub const WARPGROUP: usize = 128;
/// The most rows a product may have (two warpgroups of 64).
pub const MAX_ROWS: usize = 128;
/// Tile counters held (ints): products of at most this many tiles of `BN` outputs.
const MAX_TILES: usize = 1 << 16;

/// The output modes (`WG_OUT_*` in gemm_wg.cu; a test checks).
pub(crate) const OUT_BF16: i32 = 0;
pub(crate) const OUT_F32: i32 = 1;
pub(crate) const OUT_F32_ADD: i32 = 2;

/// The kernel instances: (64-row warpgroups a block, ring stages). Two stages deeper
/// (`StepOptions::wg_deep`) is one block a multiprocessor instead of two at 64 rows.
const INSTANCES: [(usize, usize); 4] = [(1, 4), (1, 6), (2, 4), (2, 6)];

pub fn kernel_name(mt: usize, stages: usize) -> String {
    format!("gemm_wg_m{mt}_s{stages}")
}

/// The instance for a product of `rows` rows: one warpgroup up to 64 rows, two above.
pub fn instance(rows: usize, deep: bool) -> (usize, usize) {
    match (rows <= 64, deep) {
        (true, false) => (1, 4),
        (true, true) => (1, 6),
        (false, false) => (2, 4),
        (false, true) => (2, 6),
    }
}

/// Dynamic shared memory of an instance: its ring, and 1 KiB to align it to the swizzle's
/// 1024-byte atoms.
pub fn smem_bytes(mt: usize, stages: usize) -> usize {
    stages * (BN * BK * 2 + mt * 64 * BK * 2) + 1024
}

/// How a product's units (a `BK` slice of a `BN`-row tile, in (tile, k) order) fall on the
/// grid's blocks: block b takes `[lo(b), lo(b + 1))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// k tiles of a tile.
    pub kt: usize,
    pub tiles: usize,
    pub units: usize,
    pub blocks: usize,
}

impl Partition {
    /// The units of a product of `out` outputs and `inp` inputs over at most `blocks` blocks
    /// (never more blocks than units).
    pub fn new(out: usize, inp: usize, blocks: usize) -> Self {
        let (kt, tiles) = (inp / BK, out.div_ceil(BN));
        let units = kt * tiles;
        Partition {
            kt,
            tiles,
            units,
            blocks: blocks.min(units).max(1),
        }
    }

    /// Block b's first unit (`wg_lo`).
    pub fn lo(&self, b: usize) -> usize {
        self.units * b / self.blocks
    }

    /// The block whose units include unit x (`wg_owner`).
    pub fn owner(&self, x: usize) -> usize {
        ((x + 1) * self.blocks - 1) / self.units
    }

    /// The blocks that add into tile t, in the order the last of them sums their partials.
    pub fn contributors(&self, t: usize) -> RangeInclusive<usize> {
        self.owner(t * self.kt)..=self.owner((t + 1) * self.kt - 1)
    }

    /// Where block b leaves its partial of tile t (`wg_slot`): 2b for its first tile, 2b + 1
    /// for its last (a block shares at most those two).
    pub fn slot(&self, b: usize, t: usize) -> usize {
        2 * b + usize::from(self.lo(b) / self.kt != t)
    }

    /// Whether the kernel's int arithmetic holds for this product (`(x + 1) * G` in 64 bits,
    /// units and unit offsets in 32).
    fn fits_int(&self) -> bool {
        self.units.checked_mul(self.blocks).is_some() && self.units < (1 << 30)
    }
}

/// The kernels, their occupancy, and the workspace a shared tile's blocks meet in: one f32
/// partial slot pair a block and one counter a tile (zero between products: the last block
/// of a tile resets its counter).
pub(crate) struct WgGemm {
    /// (mt, stages, kernel, blocks a multiprocessor).
    kernels: Vec<(usize, usize, CudaFunction, u32)>,
    sm_count: u32,
    deep: bool,
    part: DevBuf,
    count: DevBuf,
}

/// The module's source: the shared helpers and the kernels (their own module: wgmma needs
/// sm_90a, the other kernels are compiled for sm_90).
pub fn source() -> String {
    format!("{COMMON}\n{GEMM_WG}")
}

/// Every kernel the module defines.
pub fn kernel_names() -> Vec<String> {
    INSTANCES
        .iter()
        .map(|&(mt, s)| kernel_name(mt, s))
        .collect()
}

/// The module's PTX, compiled once per process for sm_90a (wgmma is sm_90a-only).
fn compiled() -> Result<cudarc::nvrtc::Ptx, BackendError> {
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<Option<cudarc::nvrtc::Ptx>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(None));
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = c.as_ref() {
        return Ok(p.clone());
    }
    let ptx = compile_ptx_with_opts(
        source(),
        CompileOptions {
            arch: Some("sm_90a"),
            options: vec!["--std=c++17".to_string()],
            ..Default::default()
        },
    )
    .map_err(|e| BackendError::Failed(format!("NVRTC compile of gemm_wg.cu for sm_90a: {e:?}")))?;
    *c = Some(ptx.clone());
    Ok(ptx)
}

impl WgGemm {
    /// Loads the kernels into `ctx` and allocates the workspace with `alloc` (zeroed bytes).
    pub fn new(
        ctx: &Arc<CudaContext>,
        sm_count: u32,
        deep: bool,
        alloc: impl Fn(usize) -> Result<DevBuf, BackendError>,
    ) -> Result<Self, BackendError> {
        let (major, minor) = (
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
                .map_err(drv("compute capability"))?,
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
                .map_err(drv("compute capability"))?,
        );
        if (major, minor) != (9, 0) {
            return Err(BackendError::Failed(format!(
                "GENSLOT_WG_ROWS: the wgmma products need an sm_90 GPU (this one is sm_{major}{minor})"
            )));
        }
        let m = ctx
            .load_module(compiled()?)
            .map_err(drv("loading the wgmma module"))?;
        let mut kernels = Vec::new();
        let mut slots_bytes = 0;
        for (mt, stages) in INSTANCES {
            let name = kernel_name(mt, stages);
            let f = m
                .load_function(&name)
                .map_err(|e| BackendError::Failed(format!("kernel {name}: {e:?}")))?;
            let smem = smem_bytes(mt, stages);
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(drv("wgmma shared-memory limit"))?;
            let per_sm = f
                .occupancy_max_active_blocks_per_multiprocessor((mt * WARPGROUP) as u32, smem, None)
                .map_err(drv("wgmma occupancy"))?;
            if per_sm == 0 {
                return Err(BackendError::Failed(format!(
                    "{name}: no block of {smem} bytes of shared memory fits"
                )));
            }
            let grid = (per_sm * sm_count) as usize;
            slots_bytes = usize::max(slots_bytes, 2 * grid * mt * 64 * BN * 4);
            kernels.push((mt, stages, f, per_sm));
        }
        Ok(WgGemm {
            kernels,
            sm_count,
            deep,
            part: alloc(slots_bytes)?,
            count: alloc(MAX_TILES * 4)?,
        })
    }

    /// Whether the kernels take `p` with at most `max_rows` rows: whole k tiles, outputs in
    /// pairs, 16-byte aligned rows, and few enough tiles for the counters.
    pub fn takes(&self, p: &Product, max_rows: usize) -> bool {
        let aligned =
            p.weight.is_multiple_of(16) && p.x.is_multiple_of(16) && p.y.is_multiple_of(8);
        let shape = p.inp.is_multiple_of(BK) && p.out.is_multiple_of(8) && p.inp > 0 && p.out > 0;
        let rows = p.rows > 0 && p.rows <= max_rows.min(MAX_ROWS);
        rows && aligned && shape && p.out.div_ceil(BN) <= MAX_TILES && self.partition(p).fits_int()
    }

    fn kernel(&self, rows: usize) -> &(usize, usize, CudaFunction, u32) {
        let (mt, stages) = instance(rows, self.deep);
        self.kernels
            .iter()
            .find(|k| k.0 == mt && k.1 == stages)
            .unwrap_or(&self.kernels[0])
    }

    /// The product's units over every block of its instance that the chip holds at once.
    pub fn partition(&self, p: &Product) -> Partition {
        let k = self.kernel(p.rows);
        Partition::new(p.out, p.inp, (k.3 * self.sm_count) as usize)
    }

    /// Enqueues `p` (which `takes` accepted) on `stream`, programmatically when `pdl`.
    pub fn launch(&self, stream: &CudaStream, p: &Product, pdl: bool) -> Result<(), BackendError> {
        let (mt, stages, f, _) = self.kernel(p.rows);
        let part = self.partition(p);
        let mode = match p.output {
            Output::Bf16 => OUT_BF16,
            Output::F32 => OUT_F32,
            Output::AddF32 => OUT_F32_ADD,
        };
        launch_on(
            stream,
            f,
            (part.blocks as u32, 1, 1),
            (mt * WARPGROUP) as u32,
            smem_bytes(*mt, *stages) as u32,
            &[
                A::P(p.weight),
                A::P(p.x),
                A::P(p.y),
                A::I(p.rows as i32),
                A::I(p.out as i32),
                A::I(p.inp as i32),
                A::I(mode),
                A::P(self.part.ptr),
                A::P(self.count.ptr),
            ],
            pdl,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every unit belongs to exactly one block, in order, and every block has one.
        #[test]
        fn the_blocks_cut_the_units_into_contiguous_nonempty_runs(
            tiles in 1usize..1100, kt in 1usize..240, blocks in 1usize..600,
        ) {
            let p = Partition::new(tiles * BN - 8, kt * BK, blocks);
            prop_assert_eq!(p.tiles, tiles);
            prop_assert!(p.blocks <= p.units);
            prop_assert_eq!(p.lo(0), 0);
            prop_assert_eq!(p.lo(p.blocks), p.units);
            for b in 0..p.blocks {
                prop_assert!(p.lo(b) < p.lo(b + 1), "block {} is empty", b);
            }
            // The owner of each block's first and last unit is that block.
            for b in 0..p.blocks {
                prop_assert_eq!(p.owner(p.lo(b)), b);
                prop_assert_eq!(p.owner(p.lo(b + 1) - 1), b);
            }
        }

        /// A shared tile's blocks leave their partials in distinct slots, each slot within
        /// the two a block has, and a block shares at most its first and last tile.
        #[test]
        fn a_shared_tiles_partials_land_in_distinct_slots_of_their_own_blocks(
            tiles in 1usize..300, kt in 1usize..240, blocks in 1usize..600,
        ) {
            let p = Partition::new(tiles * BN, kt * BK, blocks);
            let mut used = vec![false; 2 * p.blocks];
            for t in 0..p.tiles {
                let who = p.contributors(t);
                let whole = who.start() == who.end();
                for b in who.clone() {
                    // The block's units on this tile.
                    let lo = p.lo(b).max(t * p.kt);
                    let hi = p.lo(b + 1).min((t + 1) * p.kt);
                    prop_assert!(lo < hi, "block {} listed on tile {} without units", b, t);
                    if whole {
                        continue;
                    }
                    let first = p.lo(b) / p.kt;
                    let last = (p.lo(b + 1) - 1) / p.kt;
                    prop_assert!(t == first || t == last, "a middle tile is shared");
                    let s = p.slot(b, t);
                    prop_assert!(s / 2 == b);
                    prop_assert!(!used[s], "slot {} written twice", s);
                    used[s] = true;
                }
            }
        }
    }

    #[test]
    fn one_block_a_tile_writes_every_tile_itself() {
        let p = Partition::new(32 * BN, 64 * BK, 32);
        for t in 0..32 {
            assert_eq!(p.contributors(t), t..=t);
        }
        // More blocks than units: one unit each.
        let p = Partition::new(BN, 2 * BK, 264);
        assert_eq!((p.blocks, p.units), (2, 2));
        assert_eq!(p.contributors(0), 0..=1);
    }

    #[test]
    fn up_to_64_rows_run_on_one_warpgroup_and_the_rest_on_two() {
        assert_eq!(instance(2, false), (1, 4));
        assert_eq!(instance(64, false), (1, 4));
        assert_eq!(instance(65, false), (2, 4));
        assert_eq!(instance(128, true), (2, 6));
        // Every instance fits the 227 KiB a block may have on sm_90.
        for (mt, s) in INSTANCES {
            assert!(smem_bytes(mt, s) <= 227 << 10, "{}", kernel_name(mt, s));
        }
    }

    #[test]
    fn every_instance_and_constant_is_the_kernels() {
        for (mt, s) in INSTANCES {
            assert_eq!(
                GEMM_WG
                    .matches(&format!("\nGEMM_WG_INSTANCE({mt}, {s})"))
                    .count(),
                1,
                "{}",
                kernel_name(mt, s)
            );
        }
        assert_eq!(
            GEMM_WG.matches("\nGEMM_WG_INSTANCE(").count(),
            INSTANCES.len()
        );
        for (name, v) in [
            ("WG_BN", BN as i32),
            ("WG_BK", BK as i32),
            ("WG_OUT_BF16", OUT_BF16),
            ("WG_OUT_F32", OUT_F32),
            ("WG_OUT_F32_ADD", OUT_F32_ADD),
        ] {
            assert!(
                GEMM_WG.contains(&format!("#define {name} {v}\n")),
                "{name} differs from the kernel"
            );
        }
        assert!(GEMM_WG.contains(&format!("#define WG_THREADS {WARPGROUP} ")));
    }

    #[test]
    fn a_block_copies_only_weights_before_it_waits() {
        // x may still be being written by the kernel before, y, the partials and the
        // counters read or reset by it.
        let body = &GEMM_WG[GEMM_WG.find("void gemm_wg(").expect("gemm_wg")..];
        let start = body
            .find("// The ring's first weight tiles")
            .expect("the prologue");
        let wait = body.find("PDL_BEGIN()").expect("gemm_wg waits");
        let words: Vec<&str> = body[start..wait]
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .collect();
        assert!(words.contains(&"copy_w"), "the weights are prefetched");
        for name in ["copy_x", "X", "Y", "part", "count", "wg_write"] {
            assert!(!words.contains(&name), "{name} is touched before PDL_BEGIN");
        }
        // copy_w itself names no input or output.
        let w = &body[body.find("auto copy_w").expect("copy_w")..];
        let w = &w[..w.find("};").expect("copy_w ends")];
        let words: Vec<&str> = w
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .collect();
        for name in ["X", "Y", "part", "count"] {
            assert!(!words.contains(&name), "copy_w touches {name}");
        }
    }
}
