//! Batch-invariant weight products (`StepOptions::batch_invariant`): one cuBLASLt algorithm
//! per product shape, chosen once and used for every row count. `Gpu::gemm_cublas` lets
//! cuBLAS's heuristic choose per call, and BENCHMARKS.md §3.6 measured it changing a row's
//! sums from 64 rows on (llama-8b). Here the algorithm is the heuristic's for `PIN_ROWS`
//! rows, forced to one K split and no split reduction, so a row's dot products run the same
//! tiles in the same K order whatever the batch; it must also run a single row.

use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::{result as lt, sys as lt_sys};

use super::device::Product;
use crate::gpu::BackendError;

/// The row count whose heuristic picks the algorithm: the largest decode batch we measure.
const PIN_ROWS: u64 = 128;
/// Algorithms the heuristic is asked for; the first that takes every row count wins.
const CANDIDATES: usize = 16;

fn lt_err(what: &'static str) -> impl Fn(cudarc::cublaslt::result::CublasError) -> BackendError {
    move |e| BackendError::Failed(format!("{what}: {e:?}"))
}

/// A product's shape as the step issues it (`Gpu::gemm`'s arguments minus the pointers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    out: usize,
    inp: usize,
    y_f32: bool,
}

pub(crate) struct PinnedGemms {
    handle: lt_sys::cublasLtHandle_t,
    /// Pinned on first use; a step has five shapes, so a list.
    shapes: Mutex<Vec<Pinned>>,
    workspace: u64,
    workspace_bytes: usize,
}

/// A shape's pinned algorithm and its descriptors for each row count seen (at most the
/// largest decode pass's rows), so an eager step makes no descriptor calls.
struct Pinned {
    key: Key,
    algo: lt_sys::cublasLtMatmulAlgo_t,
    by_rows: Vec<(u64, Descs)>,
}

// SAFETY: the handle is only used from the thread that holds the `Gpu` (one decode thread);
// the algorithm list is behind a mutex.
unsafe impl Send for PinnedGemms {}
// SAFETY: as above.
unsafe impl Sync for PinnedGemms {}

/// Descriptors of one product at `rows` rows, destroyed on drop (those created so far, when
/// a creation fails).
struct Descs {
    op: lt_sys::cublasLtMatmulDesc_t,
    a: lt_sys::cublasLtMatrixLayout_t,
    b: lt_sys::cublasLtMatrixLayout_t,
    d: lt_sys::cublasLtMatrixLayout_t,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each non-null one was created in `Descs::new` and is destroyed once, here.
        unsafe {
            for l in [self.a, self.b, self.d] {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            if !self.op.is_null() {
                let _ = lt::destroy_matmul_desc(self.op);
            }
        }
    }
}

impl Descs {
    /// y[rows, out] = x[rows, inp] · W[out, inp]ᵀ in cuBLAS's column-major view, as
    /// `Gpu::gemm_cublas` issues it: Wᵀ is (inp × out) with ld inp, taken transposed.
    fn new(k: Key, rows: u64) -> Result<Self, BackendError> {
        let bf = lt_sys::cudaDataType::CUDA_R_16BF;
        let yt = if k.y_f32 {
            lt_sys::cudaDataType::CUDA_R_32F
        } else {
            bf
        };
        // Null until created: an early return drops (destroys) only what exists.
        let mut descs = Descs {
            op: std::ptr::null_mut(),
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
        };
        descs.op = lt::create_matmul_desc(
            lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lt_sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(lt_err("cuBLASLt matmul descriptor"))?;
        let (inp, out) = (k.inp as u64, k.out as u64);
        let layout = |t, rows, cols, ld| {
            lt::create_matrix_layout(t, rows, cols, ld).map_err(lt_err("cuBLASLt layout"))
        };
        descs.a = layout(bf, inp, out, inp as i64)?;
        descs.b = layout(bf, inp, rows, inp as i64)?;
        descs.d = layout(yt, out, rows, out as i64)?;
        // cublasOperation_t's CUBLAS_OP_T, as the attribute's int32.
        let t = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T as i32;
        // SAFETY: a live descriptor and a value of the attribute's type.
        unsafe {
            lt::set_matmul_desc_attribute(
                descs.op,
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &t as *const _ as *const c_void,
                std::mem::size_of_val(&t),
            )
        }
        .map_err(lt_err("cuBLASLt transpose"))?;
        Ok(descs)
    }

    /// Whether `algo` runs this product.
    fn takes(&self, h: lt_sys::cublasLtHandle_t, algo: &lt_sys::cublasLtMatmulAlgo_t) -> bool {
        let mut r = std::mem::MaybeUninit::<lt_sys::cublasLtMatmulHeuristicResult_t>::uninit();
        // SAFETY: live descriptors; `r` is written by the call.
        let s = unsafe {
            lt_sys::cublasLtMatmulAlgoCheck(
                h,
                self.op,
                self.a,
                self.b,
                self.d,
                self.d,
                algo,
                r.as_mut_ptr(),
            )
        };
        s == lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
    }
}

impl PinnedGemms {
    pub fn new(workspace: u64, workspace_bytes: usize) -> Result<Self, BackendError> {
        Ok(PinnedGemms {
            handle: lt::create_handle().map_err(lt_err("cuBLASLt handle"))?,
            shapes: Mutex::new(Vec::new()),
            workspace,
            workspace_bytes,
        })
    }

    /// The pinned algorithm of `k`: the heuristic's candidates for `PIN_ROWS` rows, each
    /// forced to one K split and no reduction, the first that also runs one row.
    fn pin(&self, k: Key) -> Result<lt_sys::cublasLtMatmulAlgo_t, BackendError> {
        let big = Descs::new(k, PIN_ROWS)?;
        let one = Descs::new(k, 1)?;
        let pref = lt::create_matmul_pref().map_err(lt_err("cuBLASLt preference"))?;
        let ws = self.workspace_bytes as u64;
        // SAFETY: a live preference and a value of the attribute's type.
        let set = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                8,
            )
        };
        let mut found = [std::mem::MaybeUninit::<lt_sys::cublasLtMatmulHeuristicResult_t>::zeroed();
            CANDIDATES];
        let mut n = 0i32;
        // SAFETY: live descriptors; `found` has room for CANDIDATES results.
        let got = set.and_then(|_| unsafe {
            lt_sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                big.op,
                big.a,
                big.b,
                big.d,
                big.d,
                pref,
                CANDIDATES as i32,
                found.as_mut_ptr() as *mut _,
                &mut n,
            )
            .result()
        });
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        got.map_err(lt_err("cuBLASLt heuristic"))?;
        let one_split: u32 = 1;
        let no_reduction = lt_sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
        for r in found.iter().take(n.max(0) as usize) {
            // SAFETY: the first `n` results were written by the heuristic.
            let mut algo = unsafe { r.assume_init() }.algo;
            fn config(
                algo: &mut lt_sys::cublasLtMatmulAlgo_t,
                attr: lt_sys::cublasLtMatmulAlgoConfigAttributes_t,
                v: u32,
            ) -> bool {
                // SAFETY: a live algorithm and a u32 value, the attribute's type.
                unsafe {
                    lt_sys::cublasLtMatmulAlgoConfigSetAttribute(
                        algo,
                        attr,
                        &v as *const u32 as *const c_void,
                        4,
                    )
                }
                .result()
                .is_ok()
            }
            use lt_sys::cublasLtMatmulAlgoConfigAttributes_t as C;
            if config(&mut algo, C::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, one_split)
                && config(
                    &mut algo,
                    C::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                    no_reduction,
                )
                && big.takes(self.handle, &algo)
                && one.takes(self.handle, &algo)
            {
                return Ok(algo);
            }
        }
        Err(BackendError::Failed(format!(
            "batch-invariant launch: no cuBLASLt algorithm of {n} candidates runs the \
             {} x {} product with one K split at both 1 and {PIN_ROWS} rows",
            k.out, k.inp
        )))
    }

    /// `Gpu::gemm`'s product on the pinned algorithm of its shape, on `stream`.
    pub fn gemm(&self, stream: lt_sys::cudaStream_t, p: &Product) -> Result<(), BackendError> {
        let k = Key {
            out: p.out,
            inp: p.inp,
            y_f32: p.y_f32(),
        };
        let rows = p.rows as u64;
        let mut shapes = self.shapes.lock().unwrap_or_else(|e| e.into_inner());
        let at = match shapes.iter().position(|s| s.key == k) {
            Some(i) => i,
            None => {
                let algo = self.pin(k)?;
                shapes.push(Pinned {
                    key: k,
                    algo,
                    by_rows: Vec::new(),
                });
                shapes.len() - 1
            }
        };
        let shape = &mut shapes[at];
        let di = match shape.by_rows.iter().position(|(r, _)| *r == rows) {
            Some(i) => i,
            None => {
                shape.by_rows.push((rows, Descs::new(k, rows)?));
                shape.by_rows.len() - 1
            }
        };
        let d = &shape.by_rows[di].1;
        let alpha = 1.0f32;
        let beta = if p.accumulate() { 1.0f32 } else { 0.0 };
        // SAFETY: pointers are live device buffers of the sizes the shape implies; the
        // workspace belongs to this stream's products only.
        unsafe {
            lt::matmul(
                self.handle,
                d.op,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                p.weight as *const c_void,
                d.a,
                p.x as *const c_void,
                d.b,
                p.y as *const c_void,
                d.d,
                p.y as *mut c_void,
                d.d,
                &shape.algo,
                self.workspace as *mut c_void,
                self.workspace_bytes,
                stream,
            )
        }
        .map_err(lt_err("cuBLASLt matmul"))
    }
}

impl Drop for PinnedGemms {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}
