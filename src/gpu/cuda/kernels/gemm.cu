// Weight-streaming GEMM for decode-sized batches: Y[r][o] (+)= sum_k W[o][k] * X[r][k], W
// [out][inp] and X [rows][inp] bf16, Y [rows][out] float32 or bf16, float32 accumulation.
//
// A decode step reads every weight once and multiplies it by a few rows, so the product is
// bound by reading W: each weight is loaded exactly once, 16 bytes a lane, straight from
// HBM into the tensor cores' A fragments (mma.sync m16n8k16) with no shared-memory stage.
// The dot product is a sum over k, so any permutation of k works when A and B use the same
// one: lane (g, t) loads 8 consecutive k of weight rows g and g + 8 and the same 8 k of input
// row g, and feeds elements 0-3 to one MMA and 4-7 to the next (the fragments' k slots 2t,
// 2t+1, 2t+8, 2t+9). A warp's 32 k of 16 weight rows are then 16 rows x 64 contiguous bytes.
//
// A block holds MT tiles of 16 weight rows against NT tiles of 8 input rows; its 8 warps
// split k (chunk c of 32 goes to warp c % 8, so each warp's loads stay spread over the
// rows) and add their partial sums in shared memory in warp order: the result does not
// depend on timing. Needs inp % 32 == 0; rows past `rows` read as zero and are not written;
// weight rows past `out` are clamped to the last one and not written.
#define WG_WARPS 8

__device__ __forceinline__ uint4 ld_stream16(const void* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

template <int NT, int MT, int U>
__device__ __forceinline__ void wgemm(const bf16_t* __restrict__ W, const bf16_t* __restrict__ X,
                                      void* __restrict__ Y, int out, int rows, int inp,
                                      int accumulate, int y_f32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int o0 = blockIdx.x * 16 * MT;
    const bf16_t* wrow[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int o = min(o0 + 16 * m + 8 * h + g, out - 1);
            wrow[m][h] = W + (u64)o * inp + t * 8;
        }
    }
    // Input row 8j + g of this lane is xg + j * x8 (rows past `rows` read as zero).
    const bf16_t* xg = X + (u64)g * inp + t * 8;
    const u64 x8 = (u64)8 * inp;
    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[m][j][e] = 0.0f;

    const int chunks = inp >> 5;
    for (int c = warp; c < chunks; c += WG_WARPS * U) {
        // All of this iteration's weight loads first, so U x MT x 2 of them are in flight.
        uint4 w[U][MT][2];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int cc = c + u * WG_WARPS;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    w[u][m][h] = cc < chunks ? ld_stream16(wrow[m][h] + cc * 32)
                                             : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int cc = c + u * WG_WARPS;
            if (cc < chunks) {
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    uint4 xv = 8 * j + g < rows ? __ldg((const uint4*)(xg + j * x8 + cc * 32))
                                                : make_uint4(0, 0, 0, 0);
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        mma_full(acc[m][j][0], acc[m][j][1], acc[m][j][2], acc[m][j][3],
                                 w[u][m][0].x, w[u][m][1].x, w[u][m][0].y, w[u][m][1].y, xv.x,
                                 xv.y);
                        mma_full(acc[m][j][0], acc[m][j][1], acc[m][j][2], acc[m][j][3],
                                 w[u][m][0].z, w[u][m][1].z, w[u][m][0].w, w[u][m][1].w, xv.z,
                                 xv.w);
                    }
                }
            }
        }
    }

    // Accumulator e of lane (g, t): weight row g + 8 * (e >> 1), input row 2t + (e & 1).
    __shared__ float4 red[WG_WARPS][32];
#pragma unroll
    for (int m = 0; m < MT; m++) {
#pragma unroll
        for (int j = 0; j < NT; j++) {
            red[warp][lane] = make_float4(acc[m][j][0], acc[m][j][1], acc[m][j][2], acc[m][j][3]);
            __syncthreads();
            if (threadIdx.x < 128) {
                int l = threadIdx.x >> 2, e = threadIdx.x & 3;
                float s = 0.0f;
#pragma unroll
                for (int v = 0; v < WG_WARPS; v++) s += ((const float*)&red[v][l])[e];
                int o = o0 + 16 * m + (l >> 2) + 8 * (e >> 1);
                int r = 8 * j + 2 * (l & 3) + (e & 1);
                if (o < out && r < rows) {
                    u64 i = (u64)r * out + o;
                    if (y_f32) {
                        float* y = (float*)Y;
                        y[i] = accumulate ? y[i] + s : s;
                    } else {
                        bf16_t* y = (bf16_t*)Y;
                        y[i] = f2bf(accumulate ? bf2f(y[i]) + s : s);
                    }
                }
            }
            __syncthreads();
        }
    }
}

// Instances: wgemm_n{NT}_m{MT} for up to 8 x NT input rows. Fewer, wider weight loads in
// flight pay when there is little arithmetic per load (U = 4 for NT * MT <= 2).
#define WGEMM_INSTANCE(NT, MT)                                                                 \
    extern "C" __global__ void __launch_bounds__(WG_WARPS * 32)                                \
        wgemm_n##NT##_m##MT(const bf16_t* W, const bf16_t* X, void* Y, int out, int rows,      \
                            int inp, int accumulate, int y_f32) {                              \
        wgemm<NT, MT, (NT * MT <= 2 ? 4 : 2)>(W, X, Y, out, rows, inp, accumulate, y_f32);     \
    }
WGEMM_INSTANCE(1, 1)
WGEMM_INSTANCE(1, 2)
WGEMM_INSTANCE(2, 1)
WGEMM_INSTANCE(2, 2)
WGEMM_INSTANCE(4, 1)
WGEMM_INSTANCE(4, 2)
WGEMM_INSTANCE(8, 1)
WGEMM_INSTANCE(8, 2)
WGEMM_INSTANCE(16, 1)
WGEMM_INSTANCE(16, 2)
