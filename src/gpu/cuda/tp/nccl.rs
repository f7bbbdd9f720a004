//! NCCL for the tensor-parallel ranks: one communicator per rank, each rank one GPU driven
//! by its own thread (SPEC §6.1), and the in-place sum the sharded forward needs after
//! its row-parallel O and down projections. The all-reduce is enqueued on a stream by raw
//! device address, like the forward's kernels, so it can sit inside a captured CUDA graph.
//!
//! The library is probed before any NCCL call (cudarc panics on a missing library). On the
//! H200 machine NVLink multicast stays off: run with `NCCL_NVLS_ENABLE=0` in the
//! environment (tools/gpu/run_tp.sh sets it; a process must not set it on itself once
//! threads run).

use std::mem::MaybeUninit;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use cudarc::driver::CudaContext;
use cudarc::nccl::{result, sys};

use crate::gpu::BackendError;

fn nccl(what: &'static str) -> impl Fn(result::NcclError) -> BackendError {
    // `NcclError` is not a `std::error::Error`: format it here.
    move |e| BackendError::Failed(format!("NCCL {what}: {e:?}"))
}

fn driver(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> BackendError {
    move |e| BackendError::Failed(format!("{what}: {e}"))
}

/// The loaded NCCL's version (e.g. 22803 for 2.28.3), or `Unavailable` naming what is missing.
pub fn nccl_version() -> Result<i32, BackendError> {
    super::super::probe_libraries()?;
    // SAFETY: only tries to dlopen the library.
    if !unsafe { sys::is_culib_present() } {
        return Err(BackendError::Unavailable(
            "libnccl not found: it is looked up as libnccl.so (a host with only libnccl.so.2 \
             needs a libnccl.so link to it on LD_LIBRARY_PATH)"
                .into(),
        ));
    }
    result::get_nccl_version().map_err(nccl("version"))
}

/// GPUs the driver sees.
pub fn device_count() -> Result<usize, BackendError> {
    super::super::probe_libraries()?;
    let n = CudaContext::device_count().map_err(driver("counting devices"))?;
    Ok(n.max(0) as usize)
}

/// What every rank of one group joins with (made once, copied to each rank's thread).
#[derive(Clone, Copy)]
pub struct GroupId(sys::ncclUniqueId);

impl GroupId {
    pub fn new() -> Result<Self, BackendError> {
        result::get_uniqueid()
            .map(GroupId)
            .map_err(nccl("unique id"))
    }
}

/// One rank's communicator.
pub struct RankComm {
    comm: sys::ncclComm_t,
    pub rank: usize,
    pub ranks: usize,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; `RankComm`
// is only used through `&self` calls that enqueue work, by the thread owning the rank.
unsafe impl Send for RankComm {}

impl RankComm {
    /// Joins group `id` as `rank` of `ranks`, on the GPU of the calling thread's current
    /// context. Blocks until every rank has joined, so the ranks call it on their own threads.
    pub fn join(id: GroupId, rank: usize, ranks: usize) -> Result<Self, BackendError> {
        let (r, n) = (i32::try_from(rank), i32::try_from(ranks));
        let (Ok(r), Ok(n)) = (r, n) else {
            return Err(BackendError::Failed(format!("rank {rank} of {ranks}")));
        };
        let mut comm = MaybeUninit::uninit();
        // SAFETY: `comm` is a valid out-pointer; NCCL writes it before returning success.
        let comm = unsafe {
            result::comm_init_rank(comm.as_mut_ptr(), n, id.0, r).map_err(nccl("joining"))?;
            comm.assume_init()
        };
        Ok(RankComm { comm, rank, ranks })
    }

    /// Sums `count` f32 values at device address `ptr` over the ranks, in place, enqueued
    /// on `stream`.
    ///
    /// # Safety
    /// `ptr` must address at least `count` f32 on this rank's GPU that stay allocated until
    /// `stream` has run the operation, and `stream` must belong to this rank's context.
    pub unsafe fn all_reduce_sum_f32(
        &self,
        ptr: u64,
        count: usize,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), BackendError> {
        result::all_reduce(
            ptr as *const std::ffi::c_void,
            ptr as *mut std::ffi::c_void,
            count,
            sys::ncclDataType_t::ncclFloat32,
            sys::ncclRedOp_t::ncclSum,
            self.comm,
            stream as sys::cudaStream_t,
        )
        .map(|_| ())
        .map_err(nccl("all-reduce"))
    }
}

impl Drop for RankComm {
    /// Abort, not destroy: a rank whose peer died must not hang in teardown.
    fn drop(&mut self) {
        // SAFETY: `comm` came from `comm_init_rank` and is dropped once.
        let _ = unsafe { result::comm_abort(self.comm) };
    }
}

/// One all-reduce size's timing across `ranks` GPUs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllReduceTiming {
    pub ranks: usize,
    pub bytes: usize,
    /// Mean seconds per all-reduce.
    pub secs: f64,
    /// bytes / secs.
    pub alg_bw: f64,
    /// alg_bw × 2(N−1)/N: the per-link rate, comparable with the interconnect's.
    pub bus_bw: f64,
}

/// Runs `f(rank, ctx)` on one thread per GPU 0..ranks, each with its context bound, and
/// collects the results in rank order.
fn on_every_gpu<T: Send + 'static>(
    ranks: usize,
    f: impl Fn(usize, Arc<CudaContext>) -> Result<T, BackendError> + Send + Sync + 'static,
) -> Result<Vec<T>, BackendError> {
    let f = Arc::new(f);
    let threads: Vec<_> = (0..ranks)
        .map(|rank| {
            let f = f.clone();
            std::thread::spawn(move || {
                let ctx = CudaContext::new(rank).map_err(driver("creating a context"))?;
                // SAFETY: before any allocation on this context (notes/deps.md §2.8).
                unsafe { ctx.disable_event_tracking() };
                ctx.bind_to_thread()
                    .map_err(driver("binding the context"))?;
                f(rank, ctx)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| {
            t.join()
                .unwrap_or_else(|_| Err(BackendError::Failed("a rank thread panicked".into())))
        })
        .collect()
}

/// Each rank r contributes `r + 1 + i / 1000` at index i of `count` f32; returns what each
/// rank holds after one in-place all-reduce (every rank should hold the same sums).
pub fn all_reduce_once(ranks: usize, count: usize) -> Result<Vec<Vec<f32>>, BackendError> {
    let id = GroupId::new()?;
    on_every_gpu(ranks, move |rank, ctx| {
        let stream = ctx.default_stream();
        let host: Vec<f32> = (0..count)
            .map(|i| (rank + 1) as f32 + i as f32 / 1000.0)
            .collect();
        let buf = stream.clone_htod(&host).map_err(driver("upload"))?;
        let comm = RankComm::join(id, rank, ranks)?;
        {
            use cudarc::driver::DevicePtr;
            let (ptr, _sync) = buf.device_ptr(&stream);
            // SAFETY: `buf` holds `count` f32 on this context and outlives the sync below.
            unsafe { comm.all_reduce_sum_f32(ptr, count, stream.cu_stream())? };
        }
        stream.synchronize().map_err(driver("sync"))?;
        stream.clone_dtoh(&buf).map_err(driver("download"))
    })
}

/// Times in-place f32 all-reduces of each of `sizes` bytes over `ranks` GPUs: `iters`
/// back to back after a warm-up, every rank starting together.
pub fn time_all_reduce(
    ranks: usize,
    sizes: &[usize],
    iters: usize,
) -> Result<Vec<AllReduceTiming>, BackendError> {
    let id = GroupId::new()?;
    let sizes = sizes.to_vec();
    let barrier = Arc::new(Barrier::new(ranks));
    let per_rank = on_every_gpu(ranks, move |rank, ctx| {
        let stream = ctx.new_stream().map_err(driver("stream"))?;
        let max = sizes.iter().copied().max().unwrap_or(0).div_ceil(4).max(1);
        let buf = stream.alloc_zeros::<f32>(max).map_err(driver("alloc"))?;
        let comm = RankComm::join(id, rank, ranks)?;
        use cudarc::driver::DevicePtr;
        let (ptr, _sync) = buf.device_ptr(&stream);
        let mut out = Vec::new();
        for &bytes in &sizes {
            let count = bytes.div_ceil(4).max(1);
            let run = |n: usize| -> Result<(), BackendError> {
                for _ in 0..n {
                    // SAFETY: `buf` holds `max` ≥ `count` f32 and lives past the syncs.
                    unsafe { comm.all_reduce_sum_f32(ptr, count, stream.cu_stream())? };
                }
                stream.synchronize().map_err(driver("sync"))
            };
            run(5)?;
            barrier.wait();
            let t0 = Instant::now();
            run(iters.max(1))?;
            let secs = t0.elapsed().as_secs_f64() / iters.max(1) as f64;
            barrier.wait();
            let alg_bw = (count * 4) as f64 / secs;
            out.push(AllReduceTiming {
                ranks,
                bytes: count * 4,
                secs,
                alg_bw,
                bus_bw: alg_bw * 2.0 * (ranks as f64 - 1.0) / ranks as f64,
            });
        }
        Ok(out)
    })?;
    // Rank 0's clock; every rank waited for the slowest at each barrier.
    Ok(per_rank.into_iter().next().unwrap_or_default())
}
