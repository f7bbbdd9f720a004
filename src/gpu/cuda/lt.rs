//! cuBLASLt plans for the decode step's weight products. For each product (QKV, O, gate-up,
//! down, LM head) at each row count a captured graph runs, the backend times cuBLAS's default
//! GEMM against the algorithms cuBLASLt's heuristics offer with a workspace (split-K with the
//! reduction in place or none, other tiles) on the model's own weights, before capturing,
//! and keeps the fastest whose output matches the default's. On the H200 the default picks
//! split-K with a separate reduction kernel for O and down at small batches: 64 extra launches
//! a step. `GENSLOT_GEMM=cublas` turns the tuning off (every product through cuBLAS's default).

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::Mutex;

use cudarc::cublaslt::{result as lt, sys as lt_sys};

use super::device::DevBuf;
use crate::gpu::BackendError;

/// Algorithms asked of the heuristic per product.
pub(crate) const CANDIDATES: usize = 8;

/// One product shape: `y (+)= x · Wᵀ`, W [out][inp], x [rows][inp].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub out: usize,
    pub rows: usize,
    pub inp: usize,
    pub y_f32: bool,
}

/// A matmul descriptor with its layouts and the chosen algorithm.
pub(crate) struct Plan {
    desc: lt_sys::cublasLtMatmulDesc_t,
    a: lt_sys::cublasLtMatrixLayout_t,
    b: lt_sys::cublasLtMatrixLayout_t,
    c: lt_sys::cublasLtMatrixLayout_t,
    pub algo: lt_sys::cublasLtMatmulAlgo_t,
}

// SAFETY: the descriptors are plain host objects; a plan is only used under the table's lock
// or by the decode thread that owns the backend.
unsafe impl Send for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created once by `Plan::new` and is destroyed once here.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

fn lt_err(what: &str) -> impl Fn(lt::CublasError) -> BackendError + '_ {
    move |e| BackendError::Failed(format!("{what}: {e:?}"))
}

impl Plan {
    /// The descriptor and layouts of `key` (column-major, as `Gpu::gemm` calls cuBLAS:
    /// op(A) = Wᵀ with A stored inp x out, B = x stored inp x rows, C = y out x rows).
    fn new(key: Key) -> Result<Plan, BackendError> {
        let bf = lt_sys::cudaDataType::CUDA_R_16BF;
        let yt = if key.y_f32 {
            lt_sys::cudaDataType::CUDA_R_32F
        } else {
            bf
        };
        let desc = lt::create_matmul_desc(
            lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lt_sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(lt_err("cuBLASLt matmul descriptor"))?;
        let trans: i32 = 1; // CUBLAS_OP_T
                            // SAFETY: a live descriptor and a 4-byte value, as the attribute takes.
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &trans as *const i32 as *const c_void,
                size_of::<i32>(),
            )
        }
        .map_err(lt_err("cuBLASLt transpose"))?;
        let (o, r, i) = (key.out as u64, key.rows as u64, key.inp as u64);
        let layout = |t, rows, cols, ld| {
            lt::create_matrix_layout(t, rows, cols, ld as i64).map_err(lt_err("cuBLASLt layout"))
        };
        Ok(Plan {
            desc,
            a: layout(bf, i, o, i)?,
            b: layout(bf, i, r, i)?,
            c: layout(yt, o, r, o)?,
            algo: lt_sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        })
    }
}

/// What the tuning chose for a product.
pub(crate) enum Choice {
    /// cuBLAS's default GEMM was fastest (or nothing else matched it).
    Default,
    Lt(Plan),
}

/// The cuBLASLt handle, its workspace on the decode stream, and the tuned table.
pub(crate) struct LtGemm {
    handle: lt_sys::cublasLtHandle_t,
    workspace: DevBuf,
    table: Mutex<HashMap<Key, Choice>>,
}

// SAFETY: the handle is thread-safe per cuBLASLt's documentation; the table is locked.
unsafe impl Send for LtGemm {}
unsafe impl Sync for LtGemm {}

impl Drop for LtGemm {
    fn drop(&mut self) {
        if let Ok(mut t) = self.table.lock() {
            t.clear();
        }
        // SAFETY: created once in `new`, destroyed once here, after the plans.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

impl LtGemm {
    pub fn new(workspace: DevBuf) -> Result<Self, BackendError> {
        Ok(LtGemm {
            handle: lt::create_handle().map_err(lt_err("cuBLASLt handle"))?,
            workspace,
            table: Mutex::new(HashMap::new()),
        })
    }

    /// Up to `CANDIDATES` algorithms for `key` that fit the workspace, best first by the
    /// heuristic's own estimate.
    pub fn candidates(&self, key: Key) -> Result<Vec<Plan>, BackendError> {
        let probe = Plan::new(key)?;
        let pref = lt::create_matmul_pref().map_err(lt_err("cuBLASLt preference"))?;
        let ws = self.workspace.bytes as u64;
        // SAFETY: a live preference and an 8-byte value, as the attribute takes.
        let set = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                size_of::<u64>(),
            )
        };
        let mut results: Vec<lt_sys::cublasLtMatmulHeuristicResult_t> = Vec::new();
        let mut n: i32 = 0;
        let got = set.and_then(|_| {
            results.reserve(CANDIDATES);
            // SAFETY: `results` has room for CANDIDATES entries; cuBLASLt writes `n` of them.
            unsafe {
                let r = lt_sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    probe.desc,
                    probe.a,
                    probe.b,
                    probe.c,
                    probe.c,
                    pref,
                    CANDIDATES as i32,
                    results.as_mut_ptr(),
                    &mut n,
                )
                .result();
                results.set_len((n.max(0) as usize).min(CANDIDATES));
                r
            }
        });
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        got.map_err(lt_err("cuBLASLt heuristic"))?;
        let mut plans = Vec::new();
        for r in results {
            if r.state != lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                || r.workspaceSize > self.workspace.bytes
            {
                continue;
            }
            let mut p = Plan::new(key)?;
            p.algo = r.algo;
            plans.push(p);
        }
        Ok(plans)
    }

    /// Runs `plan` on `stream`: y = x · Wᵀ + beta · y.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        plan: &Plan,
        stream: lt_sys::cudaStream_t,
        weight: u64,
        x: u64,
        y: u64,
        accumulate: bool,
    ) -> Result<(), BackendError> {
        let alpha = 1.0f32;
        let beta = if accumulate { 1.0f32 } else { 0.0 };
        // SAFETY: pointers are live device buffers of the sizes the key implies; the workspace
        // is this handle's own and only used on the decode stream.
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                weight as *const c_void,
                plan.a,
                x as *const c_void,
                plan.b,
                y as *const c_void,
                plan.c,
                y as *mut c_void,
                plan.c,
                &plan.algo,
                self.workspace.ptr as *mut c_void,
                self.workspace.bytes,
                stream,
            )
        }
        .map_err(lt_err("cuBLASLt matmul"))
    }

    pub fn insert(&self, key: Key, choice: Choice) {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, choice);
    }

    pub fn is_tuned(&self, key: Key) -> bool {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&key)
    }

    /// Runs the tuned plan for `key` if one beat the default; false when the caller should
    /// use cuBLAS's default GEMM.
    #[allow(clippy::too_many_arguments)]
    pub fn run_tuned(
        &self,
        key: Key,
        stream: lt_sys::cudaStream_t,
        weight: u64,
        x: u64,
        y: u64,
        accumulate: bool,
    ) -> Result<bool, BackendError> {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        match t.get(&key) {
            Some(Choice::Lt(plan)) => self
                .run(plan, stream, weight, x, y, accumulate)
                .map(|_| true),
            _ => Ok(false),
        }
    }

    /// (products tuned, products on a cuBLASLt plan).
    pub fn summary(&self) -> (usize, usize) {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let lt = t.values().filter(|c| matches!(c, Choice::Lt(_))).count();
        (t.len(), lt)
    }
}
