//! The device side: context and streams, the NVRTC-compiled kernels, raw device buffers,
//! kernel launches and cuBLAS GEMMs on raw pointers.
//!
//! Event tracking is off (graph capture needs it so), so buffers are raw pointers and every
//! cross-stream dependency is synchronised by hand.

use std::sync::Arc;

use cudarc::cublas::{result as blas_result, sys as blas_sys, CudaBlas};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use super::pinned_gemm::PinnedGemms;
use super::step_options::{AttnGrid, StepOptions};
use crate::gpu::BackendError;

const COMMON: &str = include_str!("kernels/common.cuh");
const INIT: &str = include_str!("kernels/init.cu");
const LAYERS: &str = include_str!("kernels/layers.cu");
const ATTENTION: &str = include_str!("kernels/attention.cu");
const ATTENTION_TC: &str = include_str!("kernels/attention_tc.cu");
const ATTENTION_BALANCED: &str = include_str!("kernels/attention_balanced.cu");
const SAMPLE: &str = include_str!("kernels/sample.cu");
const DRAFT: &str = include_str!("kernels/draft.cu");
const RECURRENT: &str = include_str!("kernels/recurrent.cu");
const GEMV: &str = include_str!("kernels/gemv.cu");
const PROBE: &str = include_str!("kernels/probe.cu");

/// The most rows the GEMV kernels take (`GEMV_MAX_ROWS` in gemv.cu; a test checks).
pub const GEMV_MAX_ROWS: usize = 4;

/// Name of the GEMV kernel for `rows` rows (1 to `GEMV_MAX_ROWS`).
pub fn gemv_kernel_name(rows: usize) -> String {
    format!("gemv_bf16_m{rows}")
}

/// (head_dim, query heads per kv head) of one attention kernel instance.
pub type AttnShape = (usize, usize);

/// Every attention shape the kernels take: head_dim 64 and 128 with 1 to 16 query heads per
/// kv head (the NVRTC test compiles them all; a backend compiles only its model's).
pub fn all_attn_shapes() -> Vec<AttnShape> {
    [64, 128]
        .into_iter()
        .flat_map(|d| (1..=super::shape::MAX_GROUP).map(move |g| (d, g)))
        .collect()
}

/// The kernel source NVRTC compiles: the shared helpers, every kernel file, both attention
/// kernels instantiated for `attn`, and the recurrent layer's kernel for each head_dim.
pub fn kernel_source(attn: &[AttnShape]) -> String {
    let mut src = [
        COMMON,
        INIT,
        LAYERS,
        ATTENTION,
        ATTENTION_TC,
        ATTENTION_BALANCED,
        SAMPLE,
        DRAFT,
        RECURRENT,
        GEMV,
        PROBE,
    ]
    .join("\n");
    for &(d, g) in attn {
        src.push_str(&format!(
            "ATTN_INSTANCE({d}, {g})\nATTN_TC_INSTANCE({d}, {g})\nATTN_TCB_INSTANCE({d}, {g})\n"
        ));
    }
    for d in head_dims(attn) {
        src.push_str(&format!("RECUR_INSTANCE({d})\n"));
    }
    src
}

/// The distinct head dims of `attn`, in order.
fn head_dims(attn: &[AttnShape]) -> Vec<usize> {
    let mut d: Vec<usize> = attn.iter().map(|a| a.0).collect();
    d.sort_unstable();
    d.dedup();
    d
}

/// Name of the recurrent layer's kernel for head_dim `d`.
pub fn recurrent_kernel_name(d: usize) -> String {
    format!("recurrent_scan_d{d}")
}

/// Name of the attention kernel of `kind` for head_dim `d` and group `g`.
pub fn attn_kernel_name(kind: AttnKernel, d: usize, g: usize) -> String {
    match kind {
        AttnKernel::TensorCore => format!("paged_attn_tc_d{d}_g{g}"),
        AttnKernel::Simt => format!("paged_attn_d{d}_g{g}"),
    }
}

/// Name of the balanced tensor-core attention kernel (`StepOptions::attn_grid`) for
/// head_dim `d` and group `g`.
pub fn attn_balanced_kernel_name(d: usize, g: usize) -> String {
    format!("paged_attn_tcb_d{d}_g{g}")
}

/// Every kernel a module compiled from `kernel_source(attn)` defines.
pub fn kernel_names(attn: &[AttnShape]) -> Vec<String> {
    let mut v: Vec<String> = [
        "init_uniform_bf16",
        "embed_rows",
        "rmsnorm",
        "rope_kv_write",
        "silu_mul",
        "fill_kv_pages",
        "sample_rows",
        "attn_combine",
        "draft_lookup",
        "draft_accept",
        "read_probe",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(head_dims(attn).into_iter().map(recurrent_kernel_name));
    v.extend((1..=GEMV_MAX_ROWS).map(gemv_kernel_name));
    for &(d, g) in attn {
        for kind in [AttnKernel::Simt, AttnKernel::TensorCore] {
            v.push(attn_kernel_name(kind, d, g));
        }
        v.push(attn_balanced_kernel_name(d, g));
    }
    v
}

/// Which decode-attention kernel a backend launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKernel {
    /// `paged_attn_tc_*`: tensor-core MMAs, a per-warp cp.async ring (attention_tc.cu).
    TensorCore,
    /// `paged_attn_*`: CUDA-core dot products, register prefetch (attention.cu).
    Simt,
}

impl AttnKernel {
    /// Dynamic shared memory of one block for head_dim `d` (TcSmem<D>::BYTES in the source).
    pub fn smem_bytes(self, d: usize, ring: TcRing) -> u32 {
        match self {
            AttnKernel::TensorCore => (ring.warps * ring.stages * 2 * TC_TILE * (d + 8) * 2) as u32,
            AttnKernel::Simt => 0,
        }
    }

    /// Threads per block.
    pub fn threads(self, ring: TcRing) -> u32 {
        match self {
            AttnKernel::TensorCore => (ring.warps * 32) as u32,
            AttnKernel::Simt => 128,
        }
    }
}

/// The tensor-core attention kernel's block: warps, and cp.async stages in each warp's ring
/// (TC_WARPS and TC_STAGES in attention_tc.cu, whose defaults a test ties to `Default`; the
/// backend compiles the kernel with these as NVRTC defines).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TcRing {
    pub warps: usize,
    pub stages: usize,
}

impl Default for TcRing {
    fn default() -> Self {
        TcRing {
            warps: 4,
            stages: 3,
        }
    }
}

impl TcRing {
    /// The NVRTC options that set the kernel's constants.
    pub fn defines(self) -> Vec<String> {
        vec![
            format!("-DTC_WARPS={}", self.warps),
            format!("-DTC_STAGES={}", self.stages),
        ]
    }
}

/// Threads of a `sample_rows` block (one block a row). Must equal SAMPLE_THREADS in
/// kernels/sample.cu, which sizes its shared staging by it.
pub(crate) const SAMPLE_THREADS: u32 = 1024;

/// Tokens a tile of the tensor-core attention kernels. Must equal TC_TILE in
/// attention_tc.cu (a test checks).
pub(crate) const TC_TILE: usize = 16;

pub(crate) fn drv(what: &str) -> impl Fn(DriverError) -> BackendError + '_ {
    move |e| BackendError::Failed(format!("{what}: {e:?}"))
}

fn blas_err(what: &str) -> impl Fn(cudarc::cublas::result::CublasError) -> BackendError + '_ {
    move |e| BackendError::Failed(format!("{what}: {e:?}"))
}

/// One launch of the balanced attention (`Gpu::balanced_grid`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BalancedGrid {
    pub blocks: u32,
    pub threads: u32,
    pub smem: u32,
    /// Warps of the grid: the pieces a pass's (row, kv head) pairs may be cut into, beyond
    /// one a pair, are at most this many (the scratch's partial slots).
    pub warps: usize,
}

/// Part of a device allocation that a `DevBuf` beside it owns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DevRange {
    pub ptr: u64,
}

/// A device allocation addressed by raw pointer.
pub(crate) struct DevBuf {
    _slice: CudaSlice<u8>,
    pub ptr: u64,
    pub bytes: usize,
}

impl DevBuf {
    pub fn at(&self, byte_offset: usize) -> u64 {
        debug_assert!(byte_offset <= self.bytes);
        self.ptr + byte_offset as u64
    }
}

/// A kernel argument; all are passed as 8-byte slots (the driver copies the kernel's own
/// parameter size from the front of each slot, which is the low half on little-endian).
#[derive(Clone, Copy)]
pub(crate) enum A {
    P(u64),
    I(i32),
    F(f32),
    U(u32),
    L(u64),
}

impl A {
    fn bits(self) -> u64 {
        match self {
            A::P(p) | A::L(p) => p,
            A::I(i) => i as u32 as u64,
            A::F(f) => f.to_bits() as u64,
            A::U(u) => u as u64,
        }
    }
}

/// The kernels' PTX for `attn`, compiled once per process (NVRTC takes seconds; tests and
/// tools create several backends).
fn compiled(attn: AttnShape, ring: TcRing) -> Result<cudarc::nvrtc::Ptx, BackendError> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Cache = HashMap<(AttnShape, TcRing), cudarc::nvrtc::Ptx>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(p) = cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(attn, ring))
    {
        return Ok(p.clone());
    }
    let mut options = vec!["--std=c++17".to_string()];
    options.extend(ring.defines());
    let ptx = compile_ptx_with_opts(
        kernel_source(&[attn]),
        CompileOptions {
            arch: Some("sm_90"),
            options,
            ..Default::default()
        },
    )
    .map_err(|e| BackendError::Failed(format!("NVRTC compile of the kernels: {e:?}")))?;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((attn, ring), ptx.clone());
    Ok(ptx)
}

/// The kernels that begin with `PDL_BEGIN()` (common.cuh), besides every attention kernel
/// (`paged_attn*`) and the GEMV kernels (`gemv_bf16_m*`, which load only their weights before
/// it): only these may be launched programmatically (`Gpu::launch_dep`).
pub const PDL_KERNELS: &[&str] = &[
    "rmsnorm",
    "rope_kv_write",
    "silu_mul",
    "attn_combine",
    "sample_rows",
];

fn pdl_ready(name: &str) -> bool {
    PDL_KERNELS.contains(&name) || name.starts_with("paged_attn") || name.starts_with("gemv_bf16_m")
}

/// A kernel that waits for its predecessor on the stream itself (`PDL_BEGIN`), so it may be
/// launched while that predecessor drains.
pub(crate) struct DepKernel(CudaFunction);

impl DepKernel {
    fn new(f: CudaFunction, name: &str) -> Result<Self, BackendError> {
        if pdl_ready(name) {
            Ok(DepKernel(f))
        } else {
            Err(BackendError::Failed(format!(
                "kernel {name} does not begin with PDL_BEGIN"
            )))
        }
    }
}

/// Launches `f` on `stream` with `smem` bytes of dynamic shared memory; `programmatic` adds
/// the programmatic-serialization attribute (the kernel must begin with `PDL_BEGIN`).
pub(crate) fn launch_on(
    stream: &CudaStream,
    f: &CudaFunction,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    args: &[A],
    programmatic: bool,
) -> Result<(), BackendError> {
    let mut vals: Vec<u64> = args.iter().map(|a| a.bits()).collect();
    if programmatic {
        return launch_programmatic(stream, f, grid, block, smem, &mut vals);
    }
    let mut b = stream.launch_builder(f);
    for v in &vals {
        b.arg(v);
    }
    let cfg = LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: smem,
    };
    // SAFETY: argument lists match the kernels' signatures in kernels/*.cu, and every
    // pointer comes from a live DevBuf sized by the caller for the launch.
    unsafe { b.launch(cfg) }.map_err(drv("kernel launch"))?;
    Ok(())
}

/// `cuLaunchKernelEx` with `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`; under
/// stream capture it becomes a programmatic edge of the graph.
fn launch_programmatic(
    stream: &CudaStream,
    f: &CudaFunction,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    vals: &mut [u64],
) -> Result<(), BackendError> {
    stream
        .context()
        .bind_to_thread()
        .map_err(drv("binding the context"))?;
    // SAFETY: an all-zero attribute is a valid `CUlaunchAttribute` (a plain C struct and
    // union); its id and value are set next.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    let mut params: Vec<*mut std::ffi::c_void> = vals
        .iter_mut()
        .map(|v| v as *mut u64 as *mut std::ffi::c_void)
        .collect();
    // SAFETY: as in `launch_on`: the argument slots match the kernel's signature; `attr`,
    // `vals` and `params` outlive the call, which copies them.
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(drv("kernel launch (programmatic)"))
}

pub(crate) struct Kernels {
    pub init: CudaFunction,
    pub embed: CudaFunction,
    pub rmsnorm: DepKernel,
    pub rope_kv: DepKernel,
    pub silu_mul: DepKernel,
    pub sample: DepKernel,
    pub fill_pages: CudaFunction,
    /// The bench's read-bandwidth probe (probe.cu).
    pub read_probe: CudaFunction,
    pub combine: DepKernel,
    /// The model's attention kernel of `opts.attn` (its head_dim and group size).
    pub attn: DepKernel,
    /// The balanced tensor-core attention, when `opts.attn_grid` may ask for it.
    pub attn_balanced: Option<DepKernel>,
    /// How passes are launched (`opts.pdl`: whether `launch_dep` launches programmatically).
    pub opts: StepOptions,
    /// Prompt lookup and verification (`draft.cu`).
    pub draft_lookup: CudaFunction,
    pub draft_accept: CudaFunction,
    /// The recurrent layer of the model's head_dim (`recurrent.cu`).
    pub recurrent: CudaFunction,
    /// `gemv[m - 1]` takes products of m rows (`gemv.cu`).
    pub gemv: Vec<DepKernel>,
}

pub(crate) struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub decode: Arc<CudaStream>,
    pub prefill: Arc<CudaStream>,
    /// KV transfers (`context: transfer`), launched from the arrival threads.
    pub transfer: Arc<CudaStream>,
    pub k: Kernels,
    pub blas_decode: CudaBlas,
    pub blas_prefill: CudaBlas,
    /// The decode stream's products in batch-invariant mode (`StepOptions::batch_invariant`).
    pinned: Option<PinnedGemms>,
    _workspaces: Vec<DevBuf>,
    pub sm_count: u32,
    pub name: String,
}

const BLAS_WORKSPACE: usize = 32 << 20;

/// Threads of a GEMV block: `GEMV_WARPS` warps of `GEMV_RPW` weight rows each (gemv.cu).
const GEMV_THREADS: u32 = 128;
const GEMV_ROWS_PER_BLOCK: usize = 8;

fn gemv_blocks(out: usize) -> u32 {
    out.div_ceil(GEMV_ROWS_PER_BLOCK) as u32
}

/// The GEMV kernels' output modes (`GEMV_OUT_*` in gemv.cu; a test checks): bf16 written,
/// f32 written, f32 added to.
const GEMV_OUT_BF16: i32 = 0;
const GEMV_OUT_F32: i32 = 1;
const GEMV_OUT_F32_ADD: i32 = 2;

/// One weight product: y[rows, out] = x[rows, inp] · W[out, inp]ᵀ, bf16 in, f32 compute,
/// written as `output` says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Product {
    pub weight: u64,
    pub out: usize,
    pub inp: usize,
    pub rows: usize,
    pub x: u64,
    pub y: u64,
    pub output: Output,
}

/// How a product writes y.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// bf16 (q|k|v, gate|up: the next kernel reads them).
    Bf16,
    /// f32 (the logits).
    F32,
    /// Added to the f32 y already there (o and down onto the residual stream).
    AddF32,
}

impl Output {
    /// y is f32 (the logits, or the residual stream added to).
    pub fn is_f32(self) -> bool {
        self != Output::Bf16
    }
}

impl Product {
    /// y is f32 (`Output::is_f32`).
    pub fn y_f32(&self) -> bool {
        self.output.is_f32()
    }
    /// y's old value is added to (beta 1).
    pub fn accumulate(&self) -> bool {
        self.output == Output::AddF32
    }
}

/// The GEMV kernels' output mode for a product, or None where cuBLAS takes it: more rows
/// than `max_rows` (`StepOptions::gemv_rows`) or the kernels take, or rows not in whole
/// 16-byte units.
fn gemv_mode(max_rows: usize, p: &Product) -> Option<i32> {
    let aligned = p.inp.is_multiple_of(8) && p.weight.is_multiple_of(16) && p.x.is_multiple_of(16);
    if p.rows == 0 || p.rows > max_rows.min(GEMV_MAX_ROWS) || !aligned {
        return None;
    }
    Some(match p.output {
        Output::Bf16 => GEMV_OUT_BF16,
        Output::F32 => GEMV_OUT_F32,
        Output::AddF32 => GEMV_OUT_F32_ADD,
    })
}

impl Gpu {
    /// Creates the context (event tracking off before any allocation), three non-default
    /// streams (decode, prefill, KV transfer), compiles the kernels for sm_90 with the
    /// attention kernels of `attn` = (head_dim, group), and sets up one cuBLAS handle per
    /// compute stream.
    pub fn new(ordinal: usize, attn: AttnShape, opts: StepOptions) -> Result<Self, BackendError> {
        super::probe::probe_libraries()?;
        let ctx = CudaContext::new(ordinal).map_err(drv("creating the CUDA context"))?;
        // SAFETY: called before any allocation; we synchronise streams by hand from here on.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().map_err(drv("device name"))?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("multiprocessor count"))? as u32;
        let decode = ctx.new_stream().map_err(drv("decode stream"))?;
        let prefill = ctx.new_stream().map_err(drv("prefill stream"))?;
        let transfer = ctx.new_stream().map_err(drv("transfer stream"))?;
        let ptx = compiled(attn, opts.attn_ring)?;
        let m = ctx
            .load_module(ptx)
            .map_err(drv("loading the kernel module"))?;
        let f = |n: &str| {
            m.load_function(n)
                .map_err(|e| BackendError::Failed(format!("kernel {n}: {e:?}")))
        };
        let attn_kind = opts.attn;
        let (d, g) = attn;
        let attn_name = attn_kernel_name(attn_kind, d, g);
        let attn_fn = f(&attn_name)?;
        let smem = attn_kind.smem_bytes(d, opts.attn_ring);
        // What this device lets a block opt into (227 KiB on sm_90).
        let max_smem = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(drv("shared memory a block may opt into"))? as u32;
        if smem > max_smem {
            return Err(BackendError::Failed(format!(
                "{attn_name}: {} warps x {} stages need {smem} bytes of shared memory a block, \
                 past the {max_smem} a block may have on this device",
                opts.attn_ring.warps, opts.attn_ring.stages
            )));
        }
        if smem > 48 << 10 {
            attn_fn
                .set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
                .map_err(drv("attention shared-memory limit"))?;
        }
        let attn_balanced = match (attn_kind, opts.attn_grid) {
            (AttnKernel::TensorCore, AttnGrid::Balanced | AttnGrid::Auto) => {
                let n = attn_balanced_kernel_name(d, g);
                let bf = f(&n)?;
                // Its ring's bytes and a few more a row (`Gpu::balanced_grid`): all that the
                // block may opt into beside its static shared memory.
                let fixed = bf
                    .get_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
                    .map_err(drv("balanced attention static shared memory"))?;
                bf.set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    max_smem as i32 - fixed,
                )
                .map_err(drv("balanced attention shared-memory limit"))?;
                Some(DepKernel::new(bf, &n)?)
            }
            _ => None,
        };
        let dep = |n: &str| DepKernel::new(f(n)?, n);
        let k = Kernels {
            init: f("init_uniform_bf16")?,
            embed: f("embed_rows")?,
            rmsnorm: dep("rmsnorm")?,
            rope_kv: dep("rope_kv_write")?,
            silu_mul: dep("silu_mul")?,
            sample: dep("sample_rows")?,
            fill_pages: f("fill_kv_pages")?,
            read_probe: f("read_probe")?,
            combine: dep("attn_combine")?,
            attn: DepKernel::new(attn_fn, &attn_name)?,
            attn_balanced,
            opts,
            draft_lookup: f("draft_lookup")?,
            draft_accept: f("draft_accept")?,
            recurrent: f(&recurrent_kernel_name(d))?,
            gemv: (1..=GEMV_MAX_ROWS)
                .map(|m| dep(&gemv_kernel_name(m)))
                .collect::<Result<_, _>>()?,
        };
        let blas_decode = CudaBlas::new(decode.clone()).map_err(blas_err("cuBLAS handle"))?;
        let blas_prefill = CudaBlas::new(prefill.clone()).map_err(blas_err("cuBLAS handle"))?;
        let mut gpu = Gpu {
            ctx,
            decode,
            prefill,
            transfer,
            k,
            blas_decode,
            blas_prefill,
            pinned: None,
            _workspaces: Vec::new(),
            sm_count,
            name,
        };
        // A fixed workspace per handle, so cuBLAS allocates nothing inside graph capture.
        for which in [Which::Decode, Which::Prefill] {
            let ws = gpu.alloc(BLAS_WORKSPACE, which)?;
            let h = *gpu.blas(which).handle();
            // SAFETY: the workspace outlives the handle (both owned by `gpu`).
            unsafe { blas_sys::cublasSetWorkspace_v2(h, ws.ptr as *mut _, ws.bytes) }
                .result()
                .map_err(blas_err("cuBLAS workspace"))?;
            // Keep split-K partial sums in f32 (no bf16 reduction between partials).
            let mode = blas_sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
            // SAFETY: a live handle owned by `gpu`.
            unsafe { blas_sys::cublasSetMathMode(h, mode) }
                .result()
                .map_err(blas_err("cuBLAS math mode"))?;
            gpu._workspaces.push(ws);
        }
        if gpu.k.opts.batch_invariant {
            let ws = gpu.alloc(BLAS_WORKSPACE, Which::Decode)?;
            gpu.pinned = Some(PinnedGemms::new(ws.ptr, ws.bytes)?);
            gpu._workspaces.push(ws);
        }
        Ok(gpu)
    }

    pub fn stream(&self, w: Which) -> &Arc<CudaStream> {
        match w {
            Which::Decode => &self.decode,
            Which::Prefill => &self.prefill,
            Which::Transfer => &self.transfer,
        }
    }

    /// The balanced attention's launch for a pass of `rows` rows: as many blocks as fit on
    /// the chip at once, and each one's shared memory (the ring, then the rows' tile
    /// prefix). None when the option is off.
    pub fn balanced_grid(
        &self,
        rows: usize,
        head_dim: usize,
    ) -> Result<Option<BalancedGrid>, BackendError> {
        let Some(f) = &self.k.attn_balanced else {
            return Ok(None);
        };
        let ring = self.k.opts.attn_ring;
        let threads = AttnKernel::TensorCore.threads(ring);
        let smem = AttnKernel::TensorCore.smem_bytes(head_dim, ring) as usize + 4 * (rows + 1);
        let per_sm =
            f.0.occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)
                .map_err(drv("balanced attention occupancy"))?;
        if per_sm == 0 {
            return Err(BackendError::Failed(format!(
                "balanced attention: no block of {smem} bytes of shared memory fits ({rows} rows)"
            )));
        }
        let blocks = per_sm * self.sm_count;
        Ok(Some(BalancedGrid {
            blocks,
            threads,
            smem: smem as u32,
            warps: blocks as usize * ring.warps,
        }))
    }

    fn blas(&self, w: Which) -> &CudaBlas {
        match w {
            Which::Decode => &self.blas_decode,
            // No GEMM runs on the transfer stream.
            Which::Prefill | Which::Transfer => &self.blas_prefill,
        }
    }

    /// Zeroed device memory.
    pub fn alloc(&self, bytes: usize, w: Which) -> Result<DevBuf, BackendError> {
        let s = self.stream(w);
        let slice = s
            .alloc_zeros::<u8>(bytes.max(256))
            .map_err(|e| BackendError::Failed(format!("allocating {bytes} device bytes: {e:?}")))?;
        let ptr = {
            let (ptr, _sync) = slice.device_ptr(s);
            ptr
        };
        Ok(DevBuf {
            _slice: slice,
            ptr,
            bytes,
        })
    }

    pub fn launch(
        &self,
        w: Which,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        args: &[A],
    ) -> Result<(), BackendError> {
        self.launch_smem(w, f, grid, block, 0, args)
    }

    /// `launch` with `smem` bytes of dynamic shared memory.
    pub fn launch_smem(
        &self,
        w: Which,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[A],
    ) -> Result<(), BackendError> {
        launch_on(self.stream(w), f, grid, block, smem, args, false)
    }

    /// Launches a kernel that waits for its predecessor itself: programmatically when PDL is
    /// on, so its launch overlaps the predecessor's last blocks.
    pub fn launch_dep(
        &self,
        w: Which,
        f: &DepKernel,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[A],
    ) -> Result<(), BackendError> {
        launch_on(
            self.stream(w),
            &f.0,
            grid,
            block,
            smem,
            args,
            self.k.opts.pdl,
        )
    }

    /// The sampler (sample.cu) over `rows` rows of `vocab` float32 logits at `logits`, each
    /// drawn by its `SampleRow` at `params`, tokens (i32) to `out`.
    pub fn sample_rows(
        &self,
        w: Which,
        logits: u64,
        vocab: usize,
        params: u64,
        out: u64,
        rows: usize,
    ) -> Result<(), BackendError> {
        self.launch_dep(
            w,
            &self.k.sample,
            (rows as u32, 1, 1),
            SAMPLE_THREADS,
            0,
            &[A::P(logits), A::I(vocab as i32), A::P(params), A::P(out)],
        )
    }

    /// A weight product: on the pinned cuBLASLt algorithms when the launch is
    /// batch-invariant (decode), on the GEMV kernels when it has few enough rows, else cuBLAS.
    pub fn gemm(&self, w: Which, p: &Product) -> Result<(), BackendError> {
        if let (Some(pinned), Which::Decode) = (&self.pinned, w) {
            return pinned.gemm(self.stream(w).cu_stream() as _, p);
        }
        if let Some(mode) = gemv_mode(self.k.opts.gemv_rows, p) {
            return self.launch_dep(
                w,
                &self.k.gemv[p.rows - 1],
                (gemv_blocks(p.out), 1, 1),
                GEMV_THREADS,
                0,
                &[
                    A::P(p.weight),
                    A::P(p.x),
                    A::P(p.y),
                    A::I(p.out as i32),
                    A::I(p.inp as i32),
                    A::I(mode),
                ],
            );
        }
        self.gemm_cublas(w, p)
    }

    /// `gemm` through cuBLAS whatever the row count.
    pub fn gemm_cublas(&self, w: Which, p: &Product) -> Result<(), BackendError> {
        let alpha = 1.0f32;
        let beta = if p.accumulate() { 1.0f32 } else { 0.0 };
        let bf = blas_sys::cudaDataType::CUDA_R_16BF;
        let yt = if p.y_f32() {
            blas_sys::cudaDataType::CUDA_R_32F
        } else {
            bf
        };
        // Column-major view: W^T is (inp x out) with ld inp; op T gives out x inp.
        // SAFETY: pointers are live device buffers of the sizes the shape implies.
        unsafe {
            blas_result::gemm_ex(
                *self.blas(w).handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                p.out as i32,
                p.rows as i32,
                p.inp as i32,
                &alpha as *const f32 as *const _,
                p.weight as *const _,
                bf,
                p.inp as i32,
                p.x as *const _,
                bf,
                p.inp as i32,
                &beta as *const f32 as *const _,
                p.y as *mut _,
                yt,
                p.out as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(blas_err("cuBLAS GEMM"))
    }

    /// `p` (an f32 product) as `parts` products, one per slice of K, into `parts` f32
    /// outputs `stride_rows` rows apart from `p.y`: one strided-batched cuBLAS call. The
    /// caller sums the parts (`StepOptions::down_splits`).
    pub fn gemm_parts(
        &self,
        w: Which,
        p: &Product,
        parts: usize,
        stride_rows: usize,
    ) -> Result<(), BackendError> {
        let kk = p.inp.checked_div(parts).unwrap_or(0);
        if kk == 0 || kk * parts != p.inp || !p.y_f32() || p.accumulate() || stride_rows < p.rows {
            return Err(BackendError::Failed(format!(
                "{} x {} product in {parts} parts: K must split evenly into f32 parts",
                p.out, p.inp
            )));
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let bf = blas_sys::cudaDataType::CUDA_R_16BF;
        // As `gemm_cublas`, each batch entry a slice of K: W^T's and x's rows kk * s onwards.
        // SAFETY: pointers are live device buffers of the sizes the shape implies; y holds
        // `parts` outputs of stride_rows x out.
        unsafe {
            blas_result::gemm_strided_batched_ex(
                *self.blas(w).handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                p.out as i32,
                p.rows as i32,
                kk as i32,
                &alpha as *const f32 as *const _,
                p.weight as *const _,
                bf,
                p.inp as i32,
                kk as i64,
                p.x as *const _,
                bf,
                p.inp as i32,
                kk as i64,
                &beta as *const f32 as *const _,
                p.y as *mut _,
                blas_sys::cudaDataType::CUDA_R_32F,
                p.out as i32,
                (p.out * stride_rows) as i64,
                parts as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(blas_err("cuBLAS strided-batched GEMM"))
    }

    pub fn htod<T>(&self, w: Which, dst: u64, src: &[T]) -> Result<(), BackendError> {
        // SAFETY: the caller sized `dst` for `src`.
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, self.stream(w).cu_stream()) }
            .map_err(drv("host-to-device copy"))
    }

    pub fn dtoh<T>(&self, w: Which, dst: &mut [T], src: u64) -> Result<(), BackendError> {
        // SAFETY: the caller sized `src` for `dst`; the stream is synchronised below before
        // `dst` is read.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, self.stream(w).cu_stream()) }
            .map_err(drv("device-to-host copy"))?;
        self.sync(w)
    }

    /// Zeroes `bytes` device bytes at `dst`, ordered on `w`'s stream.
    pub fn zero(&self, w: Which, dst: u64, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: the caller's range lies inside one live allocation.
        unsafe {
            cudarc::driver::result::memset_d8_async(dst, 0, bytes, self.stream(w).cu_stream())
        }
        .map_err(drv("zeroing device memory"))
    }

    pub fn sync(&self, w: Which) -> Result<(), BackendError> {
        self.stream(w)
            .synchronize()
            .map_err(drv("stream synchronize"))
    }

    /// Fills `n` bf16 values at `dst` with the seeded uniform init.
    #[allow(clippy::too_many_arguments)]
    pub fn init_uniform(
        &self,
        w: Which,
        dst: u64,
        n: u64,
        seed: u32,
        tensor: u32,
        scale: f32,
        offset: f32,
    ) -> Result<(), BackendError> {
        let blocks = n.div_ceil(256).clamp(1, (self.sm_count as u64) * 32) as u32;
        let args = [
            A::P(dst),
            A::L(n),
            A::U(seed),
            A::U(tensor),
            A::F(scale),
            A::F(offset),
        ];
        self.launch(w, &self.k.init, (blocks, 1, 1), 256, &args)
    }

    /// Reads `bytes` at `src` once, streaming: the bench's read-only bandwidth ceiling, in
    /// address order (`chunk` 0) or in scattered chunks of `chunk` bytes (a power of two of
    /// at least 16; `bytes` then a power of two too). `sink` is 4 device bytes the kernel
    /// practically never writes.
    pub fn read_probe(
        &self,
        w: Which,
        src: u64,
        bytes: usize,
        chunk: usize,
        sink: u64,
    ) -> Result<(), BackendError> {
        let log2 = match chunk {
            0 => 0,
            c if c.is_power_of_two() && c >= 16 && bytes.is_power_of_two() => {
                (c / 16).trailing_zeros()
            }
            c => {
                return Err(BackendError::Failed(format!(
                    "read probe: chunks of {c} bytes over {bytes}: both must be powers of two"
                )))
            }
        };
        // Eight blocks of 256 threads a multiprocessor, four 16-byte loads each in flight.
        let blocks = self.sm_count * 8;
        let args = [A::P(src), A::L((bytes / 16) as u64), A::U(log2), A::P(sink)];
        self.launch(w, &self.k.read_probe, (blocks, 1, 1), 256, &args)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Which {
    Decode,
    Prefill,
    Transfer,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_loaded_kernel_is_defined_in_the_source() {
        let shapes = all_attn_shapes();
        assert_eq!(shapes.len(), 32);
        let src = kernel_source(&shapes);
        for name in kernel_names(&shapes) {
            // `void name(` or, after `__launch_bounds__(...)`, `name(` on its own line.
            let plain = format!("void {name}(");
            let bounded = format!("\n    {name}(");
            // Attention kernels come from ATTN_INSTANCE(D, G) expansions, the recurrent
            // layer's from RECUR_INSTANCE(D), the GEMV kernels from GEMV_INSTANCE(M).
            let recur = name
                .strip_prefix("recurrent_scan_d")
                .map(|d| format!("RECUR_INSTANCE({d})"))
                .or_else(|| {
                    name.strip_prefix("gemv_bf16_m")
                        .map(|m| format!("GEMV_INSTANCE({m})"))
                });
            let inst = name
                .strip_prefix("paged_attn_tc_d")
                .map(|r| ("ATTN_TC_INSTANCE", r))
                .or_else(|| {
                    name.strip_prefix("paged_attn_tcb_d")
                        .map(|r| ("ATTN_TCB_INSTANCE", r))
                })
                .or_else(|| {
                    name.strip_prefix("paged_attn_d")
                        .map(|r| ("ATTN_INSTANCE", r))
                })
                .and_then(|(mac, r)| r.split_once("_g").map(|(d, g)| format!("{mac}({d}, {g})")));
            let found = src.contains(&plain)
                || src.contains(&bounded)
                || inst.is_some_and(|i| src.contains(&i))
                || recur.is_some_and(|i| src.contains(&i));
            assert!(found, "kernel {name} is loaded but not defined");
        }
        // A backend's module holds its model's shape only.
        let one = kernel_source(&[(64, 3)]);
        assert!(
            one.contains("ATTN_TC_INSTANCE(64, 3)") && !one.contains("ATTN_TC_INSTANCE(64, 4)")
        );
        assert!(one.contains("RECUR_INSTANCE(64)") && !one.contains("RECUR_INSTANCE(128)"));
        assert_eq!(
            src.matches("RECUR_INSTANCE(").count(),
            1 + 2,
            "the macro and two dims"
        );
    }

    #[test]
    fn the_device_sample_row_matches_the_kernel_struct() {
        // float, float, int, int, u64: the kernel's `struct SampleRow`.
        assert!(SAMPLE.contains(
            "struct SampleRow {\n    float temperature;  // <= 0: greedy\n    float top_p;        // >= 1: off\n    int top_k;"
        ));
        assert_eq!(std::mem::size_of::<crate::sampling::SampleRow>(), 24);
        assert_eq!(std::mem::align_of::<crate::sampling::SampleRow>(), 8);
        // The block the host launches is the one the kernel's shared staging is sized for.
        assert!(SAMPLE.contains(&format!("#define SAMPLE_THREADS {SAMPLE_THREADS}\n")));
    }

    #[test]
    fn tensor_core_constants_match_the_kernel_source() {
        let ring = TcRing::default();
        for (name, v) in [
            ("TC_WARPS", ring.warps),
            ("TC_STAGES", ring.stages),
            ("TC_TILE", TC_TILE),
        ] {
            let line = format!("#define {name} {v}\n");
            assert!(
                ATTENTION_TC.contains(&line),
                "{name} differs from the kernel"
            );
        }
        // The tensor-core ring for head_dim 128 needs more than the 48 KiB default.
        assert_eq!(AttnKernel::TensorCore.smem_bytes(128, ring), 104_448);
        assert_eq!(AttnKernel::Simt.smem_bytes(128, ring), 0);
        // Two warps of four stages: 128 x 2 x 4 ... as the kernel's TcSmem counts it.
        let two_by_four = TcRing {
            warps: 2,
            stages: 4,
        };
        assert_eq!(
            AttnKernel::TensorCore.smem_bytes(128, two_by_four),
            2 * 4 * 2 * 16 * 136 * 2
        );
        assert_eq!(AttnKernel::TensorCore.threads(two_by_four), 64);
    }

    /// The body of the kernel whose signature starts at `sig`: the text after its first `{`.
    fn body_after<'a>(src: &'a str, sig: &str) -> &'a str {
        let at = src
            .find(sig)
            .unwrap_or_else(|| panic!("{sig} not in the source"));
        let open = src[at..].find('{').expect("a kernel body") + at + 1;
        &src[open..]
    }

    fn first_statement(body: &str) -> &str {
        body.trim_start_matches(|c: char| c.is_whitespace() || c == '\\')
            .split(';')
            .next()
            .unwrap_or("")
    }

    #[test]
    fn every_programmatically_launched_kernel_waits_for_its_predecessor_first() {
        // A kernel launched with the programmatic attribute may start while its predecessor
        // still runs: unless PDL_BEGIN comes before its first read, it reads stale values.
        let src = kernel_source(&[(128, 4)]);
        for name in PDL_KERNELS {
            let body = body_after(&src, &format!("{name}("));
            let skip_decls = body
                .split(';')
                .find(|s| !s.trim_start().starts_with("__shared__"))
                .unwrap_or("");
            assert_eq!(
                skip_decls.trim(),
                "PDL_BEGIN()",
                "{name} does not begin with PDL_BEGIN"
            );
        }
        assert_eq!(
            first_statement(body_after(&src, "paged_attn_d##D##_g##G(")).trim(),
            "PDL_BEGIN()"
        );
        // The rest launch plainly: `DepKernel` refuses them.
        for name in [
            "embed_rows",
            "draft_accept",
            "recurrent_scan_d128",
            "fill_kv_pages",
        ] {
            assert!(!pdl_ready(name), "{name}");
        }
        assert!(pdl_ready(&attn_kernel_name(AttnKernel::TensorCore, 128, 4)));
        assert!(pdl_ready(&attn_kernel_name(AttnKernel::Simt, 64, 1)));
        assert!(pdl_ready(&gemv_kernel_name(GEMV_MAX_ROWS)));
    }

    #[test]
    fn tensor_core_attention_copies_only_settled_kv_before_it_waits() {
        // Before griddepcontrol.wait the kernel before (RoPE + KV write) may still be writing
        // q and the row's last position, and reading nothing the kernel writes; lens and the
        // page table come from the host before the step.
        let src = kernel_source(&[(128, 4)]);
        let body = body_after(&src, "void attn_tc(");
        let body = &body[..body.find("#define ATTN_TC_INSTANCE").expect("attn_tc ends")];
        // The main path's wait: the first after the gated early copies.
        let gate = body
            .find("if (kv_settled && ")
            .expect("the early copies are gated");
        let wait = gate + body[gate..].find("PDL_BEGIN()").expect("attn_tc waits");
        let (before, after) = body.split_at(wait);
        // The words of code, not of comments.
        let words = |t: &str| -> Vec<String> {
            t.lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .flat_map(|l| l.split(|c: char| !(c.is_alphanumeric() || c == '_')))
                .map(str::to_string)
                .collect()
        };
        // An empty split waits first, then writes its partials and returns.
        let e0 = before.find("if (start >= end) {").expect("an empty split");
        let e1 = e0 + before[e0..].find("return;").expect("it returns");
        assert_eq!(
            first_statement(&before[e0 + "if (start >= end) {".len()..]).trim(),
            "PDL_BEGIN()"
        );
        let w = words(&format!("{}{}", &before[..e0], &before[e1..]));
        let has = |n: &str| w.iter().any(|x| x == n);
        assert!(has("issue"), "the early copies are made before the wait");
        for name in ["q", "qa", "out", "part_o", "part_ml"] {
            assert!(!has(name), "{name} is touched before the wait");
        }
        // The early copies stop before the row's last position (what the kernel before writes).
        assert!(before.contains("<= len - 1"));
        assert!(after.contains("if (k >= early) issue(k);"));
    }

    #[test]
    fn only_aligned_products_of_few_enough_rows_take_the_gemv() {
        let p = |rows: usize, inp: usize, weight: u64, x: u64, output: Output| Product {
            weight,
            out: 4096,
            inp,
            rows,
            x,
            y: 3 << 20,
            output,
        };
        let (w, x) = (1 << 20, 2 << 20);
        let bf = |rows, inp, weight, x| p(rows, inp, weight, x, Output::Bf16);
        // bf16 out, f32 out, f32 added to: the three output modes of gemv.cu.
        assert_eq!(gemv_mode(1, &bf(1, 4096, w, x)), Some(GEMV_OUT_BF16));
        assert_eq!(
            gemv_mode(1, &p(1, 4096, w, x, Output::F32)),
            Some(GEMV_OUT_F32)
        );
        assert_eq!(
            gemv_mode(1, &p(1, 4096, w, x, Output::AddF32)),
            Some(GEMV_OUT_F32_ADD)
        );
        // Off (0), more rows than asked for, more than the kernels take.
        assert_eq!(gemv_mode(0, &bf(1, 4096, w, x)), None);
        assert_eq!(gemv_mode(2, &bf(3, 4096, w, x)), None);
        assert_eq!(gemv_mode(64, &bf(GEMV_MAX_ROWS, 4096, w, x)), Some(0));
        assert_eq!(gemv_mode(64, &bf(GEMV_MAX_ROWS + 1, 4096, w, x)), None);
        assert_eq!(gemv_mode(4, &bf(0, 4096, w, x)), None);
        // Rows of whole 16-byte loads only.
        assert_eq!(gemv_mode(1, &bf(1, 4100, w, x)), None);
        assert_eq!(gemv_mode(1, &bf(1, 4096, w + 8, x)), None);
        assert_eq!(gemv_mode(1, &bf(1, 4096, w, x + 2)), None);
        assert_eq!(gemv_mode(1, &bf(1, 576, w, x)), Some(0));
    }

    #[test]
    fn a_gemv_block_reads_only_its_weights_before_it_waits() {
        // The weights are constant through a step; x may still be being written by the
        // kernel before, and y read by it.
        let src = kernel_source(&[(128, 4)]);
        let body = body_after(&src, "void gemv_rows(");
        let before = &body[..body.find("PDL_BEGIN()").expect("gemv_rows waits")];
        let words: Vec<&str> = before
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .collect();
        assert!(words.contains(&"W"), "the prefetch reads W");
        for name in ["X", "Y", "xv", "acc"] {
            assert!(!words.contains(&name), "{name} is touched before PDL_BEGIN");
        }
        for m in 1..=GEMV_MAX_ROWS {
            assert!(src.contains(&format!("GEMV_INSTANCE({m})")), "rows {m}");
        }
        assert!(!src.contains(&format!("GEMV_INSTANCE({})", GEMV_MAX_ROWS + 1)));
        for (name, v) in [
            ("GEMV_MAX_ROWS", GEMV_MAX_ROWS),
            ("GEMV_OUT_BF16", GEMV_OUT_BF16 as usize),
            ("GEMV_OUT_F32", GEMV_OUT_F32 as usize),
            ("GEMV_OUT_F32_ADD", GEMV_OUT_F32_ADD as usize),
            ("GEMV_WARPS", GEMV_THREADS as usize / 32),
            (
                "GEMV_RPW",
                GEMV_ROWS_PER_BLOCK / (GEMV_THREADS as usize / 32),
            ),
        ] {
            assert!(
                GEMV.contains(&format!("#define {name} {v}\n")),
                "{name} differs from the kernel"
            );
        }
    }
}
