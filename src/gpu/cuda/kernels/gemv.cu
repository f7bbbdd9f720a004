// Weight products of decode batches of 1 to GEMV_MAX_ROWS rows (`StepOptions::gemv_rows`):
// y[m, n] = sum_k x[m, k] W[n, k], W row-major [N, K] bf16, x [M, K] bf16, f32 accumulation.
// At these row counts a product is a stream of its weight through the multiprocessors, and
// what cuBLAS loses to the HBM roofline is the ramp at each end of each product (and, for
// some shapes, a split-K reduction kernel). Here one warp owns GEMV_RPW weight rows and
// reads them 16 bytes a lane, GEMV_UNROLL loads a row in flight, the next chunk's loads
// issued before the current chunk's arithmetic; one warp reduction a row at the end.
//
// Launched programmatically (PDL) a block starts while the kernel before it drains. The
// weights never change during a step, so it loads its first chunk of them before
// griddepcontrol.wait; x and y are touched only after it (a test checks that nothing
// before PDL_BEGIN names them).
#define GEMV_WARPS 4
#define GEMV_RPW 2
#define GEMV_UNROLL 3
#define GEMV_MAX_ROWS 4
#define GEMV_STEP (32 * GEMV_UNROLL)
// Six resident blocks a multiprocessor (at most 80 registers a thread): the q|k|v product of
// llama-8b (768 blocks) then runs in one wave on 132 multiprocessors instead of 1.16.
#define GEMV_MIN_BLOCKS 6

// Output modes (the same constants in device.rs; a test checks).
#define GEMV_OUT_BF16 0
#define GEMV_OUT_F32 1
#define GEMV_OUT_F32_ADD 2

// A streamed weight load: read once a step, so it bypasses L1. Volatile keeps the loads
// issued before PDL_BEGIN in front of it.
__device__ __forceinline__ uint4 ld_weight(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// The two bf16 products of one 32-bit word pair added to acc (a bf16 is the high half of
// its float).
__device__ __forceinline__ float dot2(unsigned a, unsigned b, float acc) {
    acc = fmaf(__uint_as_float(a << 16), __uint_as_float(b << 16), acc);
    return fmaf(__uint_as_float(a & 0xffff0000u), __uint_as_float(b & 0xffff0000u), acc);
}

// Eight bf16 products added to acc.
__device__ __forceinline__ float dot8(uint4 a, uint4 b, float acc) {
    acc = dot2(a.x, b.x, acc);
    acc = dot2(a.y, b.y, acc);
    acc = dot2(a.z, b.z, acc);
    return dot2(a.w, b.w, acc);
}

// The lane's loads of chunk `base` (in 16-byte units) of its warp's rows; past the row's end
// it reads zeros.
__device__ __forceinline__ void gemv_load(uint4 (&w)[GEMV_RPW][GEMV_UNROLL],
                                          const uint4* const (&rows)[GEMV_RPW], int base,
                                          int k8, int lane) {
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
        const int i = base + u * 32 + lane;
#pragma unroll
        for (int r = 0; r < GEMV_RPW; r++) {
            w[r][u] = i < k8 ? ld_weight(rows[r] + i) : make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

template <int M>
__device__ __forceinline__ void gemv_rows(const bf16_t* __restrict__ W, const bf16_t* X,
                                          void* Y, int N, int K, int mode) {
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * GEMV_RPW;
    const int k8 = K >> 3;
    const uint4* rows[GEMV_RPW];
#pragma unroll
    for (int r = 0; r < GEMV_RPW; r++) {
        rows[r] = (const uint4*)(W + (u64)min(row0 + r, N - 1) * K);
    }
    uint4 next[GEMV_RPW][GEMV_UNROLL];
    gemv_load(next, rows, 0, k8, lane);
    PDL_BEGIN();
    const uint4* xv = (const uint4*)X;
    float acc[M][GEMV_RPW];
#pragma unroll
    for (int m = 0; m < M; m++) {
#pragma unroll
        for (int r = 0; r < GEMV_RPW; r++) acc[m][r] = 0.0f;
    }
    for (int base = 0; base < k8; base += GEMV_STEP) {
        uint4 cur[GEMV_RPW][GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
#pragma unroll
            for (int r = 0; r < GEMV_RPW; r++) cur[r][u] = next[r][u];
        }
        if (base + GEMV_STEP < k8) gemv_load(next, rows, base + GEMV_STEP, k8, lane);
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int i = base + u * 32 + lane;
            if (i < k8) {
#pragma unroll
                for (int m = 0; m < M; m++) {
                    const uint4 x = xv[(u64)m * k8 + i];
#pragma unroll
                    for (int r = 0; r < GEMV_RPW; r++) acc[m][r] = dot8(cur[r][u], x, acc[m][r]);
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < M; m++) {
#pragma unroll
        for (int r = 0; r < GEMV_RPW; r++) {
            const float s = warp_sum(acc[m][r]);
            const int n = row0 + r;
            if (lane == 0 && n < N) {
                const u64 o = (u64)m * N + n;
                if (mode == GEMV_OUT_BF16) {
                    ((bf16_t*)Y)[o] = f2bf(s);
                } else if (mode == GEMV_OUT_F32) {
                    ((float*)Y)[o] = s;
                } else {
                    ((float*)Y)[o] += s;
                }
            }
        }
    }
}

#define GEMV_INSTANCE(M)                                                                      \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, GEMV_MIN_BLOCKS)            \
        gemv_bf16_m##M(const bf16_t* __restrict__ W, const bf16_t* X, void* Y, int N, int K,  \
                       int mode) {                                                            \
        gemv_rows<M>(W, X, Y, N, K, mode);                                                    \
    }
GEMV_INSTANCE(1)
GEMV_INSTANCE(2)
GEMV_INSTANCE(3)
GEMV_INSTANCE(4)
