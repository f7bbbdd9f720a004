// Weight products of decode batches on Hopper's warpgroup MMA (wgmma, sm_90a), for the rows
// between the GEMV's and 128 (`StepOptions::wg_rows`): y[m, n] (+)= sum_k x[m, k] W[n, k],
// W row-major [N, K] bf16, x [M, K] bf16 with M <= 64 * MT, f32 accumulation. Compiled as a
// module of its own (with common.cuh) for sm_90a.
//
// At these row counts a product is a stream of its weight, and what cuBLAS loses to the HBM
// roofline is the ramp at each end of each product (its kernels wait for the one before) and
// tiles that do not fill the chip. Here:
// - MT warpgroups a block, warpgroup g multiplying the batch's rows 64g..64g+63; a unit is
//   a 64-wide k tile of a WG_BN-row n tile: WG_BN x 64 weights and the batch's 64 * MT x 64
//   inputs, copied with cp.async into an S-deep ring in the 128-byte swizzled layout wgmma
//   reads from shared memory.
// - A persistent grid (every block resident at once) cuts the product's units evenly
//   (stream-K): block b takes units [b U / G, (b + 1) U / G) in (n tile, k) order, its copies
//   running on across tile boundaries. An n tile whose whole k range is one block's is
//   written at once; one shared by blocks is written by the last of them to finish (a
//   counter a tile), which adds all their f32 partials in block order, so its sums do not
//   depend on which block finished last.
// - Launched programmatically (PDL), a block copies its first weight tiles before
//   griddepcontrol.wait (weights do not change in a step); x, y, the partials and the
//   counters are touched only after it (a test checks).
#define WG_BN 128
#define WG_BK 64
#define WG_THREADS 128  // a warpgroup

// Output modes (the same constants as the GEMV's in device.rs; a test checks).
#define WG_OUT_BF16 0
#define WG_OUT_F32 1
#define WG_OUT_F32_ADD 2

__device__ __forceinline__ unsigned wg_smem(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void wg_copy16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void wg_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wg_copies_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The shared-memory matrix descriptor of a K-major tile in the 128-byte swizzle: rows of 64
// bf16 (128 bytes), eight rows a 1024-byte atom (the stride between atoms), the tile
// 1024-byte aligned; a k step of 16 moves the start 32 bytes along the row.
__device__ __forceinline__ u64 wg_desc(unsigned addr) {
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) |
           ((u64)1 << 62);
}

// D[64 x 128] (+)= A[64 x 16] B[16 x 128], both from shared memory; `add` 0 overwrites D.
__device__ __forceinline__ void wg_mma(float (&d)[64], u64 da, u64 db, int add) {
#define WG_D8(i)                                                                          \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),          \
        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
        : "l"(da), "l"(db), "r"(add));
#undef WG_D8
}

// Keeps the compiler from moving accumulator reads and writes across the asynchronous MMAs.
__device__ __forceinline__ void wg_fence_acc(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The block whose units include unit x, for U units over G blocks.
__device__ __forceinline__ int wg_owner(int x, int U, int G) {
    return (int)(((long long)(x + 1) * G - 1) / U);
}
__device__ __forceinline__ int wg_lo(int b, int U, int G) { return (int)((long long)U * b / G); }

// Writes (mode) the tile's sums this thread holds: rows 64 * (its warpgroup) + 16 * (its warp
// in it) + lane / 4 (+ 8), columns t * WG_BN + 8i + 2 (lane % 4) (+ 1), as the wgmma
// accumulator lays them out.
__device__ __forceinline__ void wg_write(const float (&d)[64], void* Y, int t, int M, int N,
                                         int mode) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int m = warp * 16 + (lane >> 2) + 8 * h;
        if (m >= M) continue;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int n = t * WG_BN + i * 8 + (lane & 3) * 2;
            if (n >= N) continue;
            const float a = d[4 * i + 2 * h], c = d[4 * i + 2 * h + 1];
            const u64 o = (u64)m * N + n;
            if (mode == WG_OUT_BF16) {
                *(unsigned*)((bf16_t*)Y + o) = (unsigned)f2bf(a) | ((unsigned)f2bf(c) << 16);
            } else if (mode == WG_OUT_F32) {
                *(float2*)((float*)Y + o) = make_float2(a, c);
            } else {
                // This thread is the one writer of these two outputs, so the add is exact and
                // in no order with another; a reduction has no round trip to wait for (a
                // load-add-store here made the stores wait for 32 loads one after another).
                atomicAdd((float*)Y + o, a);
                atomicAdd((float*)Y + o + 1, c);
            }
        }
    }
}

// A block's partial of a shared tile: slot 2b for its first tile, 2b + 1 for its last.
__device__ __forceinline__ int wg_slot(int b, int t, int KT, int U, int G) {
    return 2 * b + (wg_lo(b, U, G) / KT == t ? 0 : 1);
}

template <int MT, int S>
__device__ __forceinline__ void gemm_wg(const bf16_t* __restrict__ W, const bf16_t* X, void* Y,
                                        int M, int N, int K, int mode, float* part, int* count) {
    extern __shared__ unsigned char wg_raw[];
    __shared__ int wg_last;
    constexpr int THREADS = MT * WG_THREADS;
    constexpr int B_BYTES = WG_BN * WG_BK * 2;
    constexpr int A_BYTES = 64 * WG_BK * 2;
    constexpr int STAGE = B_BYTES + MT * A_BYTES;
    constexpr int SLOT = MT * 64 * WG_BN;  // floats of a partial
    const unsigned base = (wg_smem(wg_raw) + 1023u) & ~1023u;
    const int tid = threadIdx.x, g = tid / WG_THREADS;
    const int KT = K / WG_BK, NT = (N + WG_BN - 1) / WG_BN;
    const int U = NT * KT, G = gridDim.x, b = blockIdx.x;
    const int lo = wg_lo(b, U, G), n_units = wg_lo(b + 1, U, G) - lo;

    // Unit lo + i's weight rows (past N clamped to N - 1: read, never written out).
    auto copy_w = [&](int i) {
        if (i >= n_units) return;
        const int u = lo + i, t = u / KT, k = u - t * KT;
        const unsigned dst = base + (i % S) * STAGE;
#pragma unroll
        for (int j = 0; j < WG_BN * 8 / THREADS; ++j) {
            const int q = tid + j * THREADS, r = q >> 3, c = q & 7;
            const int n = min(t * WG_BN + r, N - 1);
            wg_copy16(dst + r * 128 + ((c ^ (r & 7)) << 4), W + (u64)n * K + k * WG_BK + c * 8);
        }
    };
    // Unit lo + i's inputs: the batch's rows (the tile's rows past M keep stale values: an
    // MMA row depends on its own input row only, and those rows are never written out).
    auto copy_x = [&](int i) {
        if (i >= n_units) return;
        const int k = (lo + i) % KT;
        const unsigned dst = base + (i % S) * STAGE + B_BYTES;
#pragma unroll
        for (int j = 0; j < 64 * 8 / WG_THREADS; ++j) {
            const int q = tid + j * THREADS, r = q >> 3, c = q & 7;
            if (r < M) {
                wg_copy16(dst + r * 128 + ((c ^ (r & 7)) << 4), X + (u64)r * K + k * WG_BK + c * 8);
            }
        }
    };

    // The ring's first weight tiles, then the wait, then their inputs: S - 1 groups of
    // weights and S - 1 of inputs, so that waiting for all but the newest S - 2 groups at
    // unit 0 covers both its weights and its inputs (and at unit i, those of unit i).
#pragma unroll
    for (int i = 0; i < S - 1; ++i) {
        copy_w(i);
        wg_commit();
    }
    PDL_BEGIN();
#pragma unroll
    for (int i = 0; i < S - 1; ++i) {
        copy_x(i);
        wg_commit();
    }

    // This warpgroup's rows of the tile's sums.
    float d[64];
#pragma unroll
    for (int e = 0; e < 64; ++e) d[e] = 0.0f;
    int add = 0;  // 0: the next MMA starts a tile's sum
    for (int i = 0; i < n_units; ++i) {
        wg_copies_wait<S - 2>();
        // The copies wrote through the generic proxy; the MMA reads through the async one.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        // Every thread's copies of unit i have landed, and every thread is past unit i - 1's
        // MMA, whose stage the next copies refill.
        __syncthreads();
        copy_w(i + S - 1);
        copy_x(i + S - 1);
        wg_commit();
        const unsigned st = base + (i % S) * STAGE;
        wg_fence_acc(d);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; ++kk) {
            wg_mma(d, wg_desc(st + B_BYTES + g * A_BYTES + kk * 32), wg_desc(st + kk * 32),
                   add | (kk > 0));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        wg_fence_acc(d);
        add = 1;

        const int u = lo + i, t = u / KT;
        if (u + 1 != (t + 1) * KT && i + 1 != n_units) continue;
        // The block's part of tile t ends here.
        add = 0;
        const int t0 = t * KT;
        if (lo <= t0 && lo + n_units >= t0 + KT) {
            wg_write(d, Y, t, M, N, mode);
            continue;
        }
        float4* mine = (float4*)(part + (u64)wg_slot(b, t, KT, U, G) * SLOT);
#pragma unroll
        for (int e = 0; e < 16; ++e) {
            mine[e * THREADS + tid] = make_float4(d[4 * e], d[4 * e + 1], d[4 * e + 2], d[4 * e + 3]);
        }
        __threadfence();
        __syncthreads();
        const int first = wg_owner(t0, U, G), last = wg_owner(t0 + KT - 1, U, G);
        if (tid == 0) wg_last = atomicAdd(count + t, 1) == last - first;
        __syncthreads();
        if (!wg_last) continue;
        __threadfence();
        // The last block of the tile: every partial, in block order, the next one's loads
        // in flight while this one is added.
        float4 next[16];
        auto load = [&](int bb) {
            const float4* p = (const float4*)(part + (u64)wg_slot(bb, t, KT, U, G) * SLOT);
#pragma unroll
            for (int e = 0; e < 16; ++e) next[e] = __ldcg(p + e * THREADS + tid);
        };
        load(first);
        for (int bb = first; bb <= last; ++bb) {
            float4 cur[16];
#pragma unroll
            for (int e = 0; e < 16; ++e) cur[e] = next[e];
            if (bb < last) load(bb + 1);
#pragma unroll
            for (int e = 0; e < 16; ++e) {
                const float4 v = cur[e];
                d[4 * e] = bb == first ? v.x : d[4 * e] + v.x;
                d[4 * e + 1] = bb == first ? v.y : d[4 * e + 1] + v.y;
                d[4 * e + 2] = bb == first ? v.z : d[4 * e + 2] + v.z;
                d[4 * e + 3] = bb == first ? v.w : d[4 * e + 3] + v.w;
            }
        }
        wg_write(d, Y, t, M, N, mode);
        // Ready for the next product (which reads it only after its griddepcontrol.wait).
        if (tid == 0) count[t] = 0;
    }
    wg_copies_wait<0>();
}

#define GEMM_WG_INSTANCE(MT, S)                                                              \
    extern "C" __global__ void __launch_bounds__(MT * WG_THREADS)                           \
        gemm_wg_m##MT##_s##S(const bf16_t* __restrict__ W, const bf16_t* X, void* Y, int M,  \
                             int N, int K, int mode, float* part, int* count) {              \
        gemm_wg<MT, S>(W, X, Y, M, N, K, mode, part, count);                                 \
    }
GEMM_WG_INSTANCE(1, 4)
GEMM_WG_INSTANCE(1, 6)
GEMM_WG_INSTANCE(2, 4)
GEMM_WG_INSTANCE(2, 6)
