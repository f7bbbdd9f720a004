// Paged decode attention on the tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate).
// Same grid, inputs and partial outputs as `paged_attn_*`, so `attn_combine` merges either.
// Each warp of a block walks its own tiles of TC_TILE tokens (tile i goes to warp i % W)
// through a TC_STAGES-deep cp.async ring in shared memory, with no block-wide barrier until
// the warps merge their online-softmax states at the end. The G query heads of a kv head are
// the rows of the MMA's A operand (rows G..15 are zero): Q·Kᵀ gives a 16 x 16 score tile,
// whose accumulators become P's A fragments for P·V without a trip through shared memory.
// P is rounded to bf16 for the P·V product, as PyTorch's bf16 attention does.
#define TC_TILE 16
#define TC_WARPS 4
#define TC_STAGES 3
#define TC_LOG2E 1.4426950408889634f
#define TC_LN2 0.6931471805599453f

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16-byte async copy; src_bytes 0 zero-fills the destination without reading global memory.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                        unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned addr, unsigned& r0, unsigned& r1,
                                          unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// D += A(16x16, rows 8..15 zero) * B(16x8); only the accumulators of rows 0..7 are kept.
__device__ __forceinline__ void mma_top(float& d0, float& d1, unsigned a0, unsigned a2,
                                        unsigned b0, unsigned b1) {
    float x2, x3;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d0), "=f"(d1), "=f"(x2), "=f"(x3)
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1), "f"(d0), "f"(d1), "f"(0.0f),
          "f"(0.0f));
}

__device__ __forceinline__ unsigned pack_bf2(float lo, float hi) {
    return (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
}

// Shared-memory bytes one block needs (the host asks for the same through attn_tc_smem).
template <int D>
struct TcSmem {
    static constexpr int ROW = D + 8;  // padded row: ldmatrix rows land in distinct banks
    static constexpr int STAGE = 2 * TC_TILE * ROW;  // K tile then V tile, bf16 elements
    static constexpr int BYTES = TC_WARPS * TC_STAGES * STAGE * 2;
};

template <int D, int G>
__device__ __forceinline__ void attn_tc(const bf16_t* __restrict__ q, int q_stride,
                                        const bf16_t* __restrict__ kc,
                                        const bf16_t* __restrict__ vc,
                                        const int* __restrict__ lens,
                                        const int* __restrict__ page_table, int table_stride,
                                        int KV, int P, int S, float scale,
                                        float* __restrict__ part_o, float* __restrict__ part_ml) {
    extern __shared__ __align__(16) unsigned char tc_smem[];
    constexpr int ROW = TcSmem<D>::ROW;
    constexpr int CH = D / 8;   // 16-byte chunks per row
    constexpr int KS = D / 16;  // k-steps of Q·Kᵀ
    constexpr int NT = D / 8;   // n-tiles of P·V

    const int kvh = blockIdx.x, r = blockIdx.y, s = blockIdx.z;
    const int H = KV * G;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int start, end;
    split_range(lens[r], S, s, start, end);
    const u64 ob = ((u64)r * H + (u64)kvh * G) * S + s;

    if (start >= end) {
        empty_split<G>(part_ml, ob, S);
        return;
    }
    const int* table = page_table + (u64)r * table_stride;
    bf16_t* ring = (bf16_t*)tc_smem + warp * TC_STAGES * TcSmem<D>::STAGE;

    // This lane's query row (head kvh*G + lane/4) as A fragments; rows >= G are zero.
    const int qh = lane >> 2, qc = (lane & 3) * 2;
    unsigned qa[KS][2];
#pragma unroll
    for (int k = 0; k < KS; ++k) {
        qa[k][0] = 0u;
        qa[k][1] = 0u;
        if (qh < G) {
            const bf16_t* qr = q + (u64)r * q_stride + (u64)(kvh * G + qh) * D + k * 16 + qc;
            qa[k][0] = *(const unsigned*)qr;
            qa[k][1] = *(const unsigned*)(qr + 8);
        }
    }

    const int tiles = (end - start + TC_TILE - 1) / TC_TILE;
    const int mine = tiles > warp ? (tiles - warp + TC_WARPS - 1) / TC_WARPS : 0;
    auto issue = [&](int k) {
        if (k < mine) {
            const int t0 = start + (warp + k * TC_WARPS) * TC_TILE;
            bf16_t* ks = ring + (k % TC_STAGES) * TcSmem<D>::STAGE;
            bf16_t* vs = ks + TC_TILE * ROW;
#pragma unroll
            for (int c = lane; c < TC_TILE * CH; c += 32) {
                const int row = c / CH, part = c % CH;
                const int j = t0 + row;
                const bool ok = j < end;
                const int jj = ok ? j : start;
                const u64 base =
                    (((u64)table[jj / P] * KV + kvh) * P + (jj % P)) * D + part * 8;
                const int n = ok ? 16 : 0;
                cp_async16(smem_addr(ks + row * ROW + part * 8), kc + base, n);
                cp_async16(smem_addr(vs + row * ROW + part * 8), vc + base, n);
            }
        }
        cp_async_commit();
    };

    float o[NT][2];
#pragma unroll
    for (int n = 0; n < NT; ++n) { o[n][0] = 0.0f; o[n][1] = 0.0f; }
    float m_run = NEG_INF, l_run = 0.0f;  // log2 units, for head qh
    const float sl2 = scale * TC_LOG2E;

#pragma unroll
    for (int k = 0; k < TC_STAGES - 1; ++k) issue(k);
    for (int k = 0; k < mine; ++k) {
        cp_async_wait<TC_STAGES - 2>();
        __syncwarp();
        issue(k + TC_STAGES - 1);
        const bf16_t* ks = ring + (k % TC_STAGES) * TcSmem<D>::STAGE;
        const bf16_t* vs = ks + TC_TILE * ROW;
        const int t0 = start + (warp + k * TC_WARPS) * TC_TILE;

        // Scores of 16 tokens: n-tile 0 = tokens 0..7, n-tile 1 = tokens 8..15.
        float sc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
        {
            const int mi = lane >> 3, rr = lane & 7;
            const unsigned a = smem_addr(ks + ((mi >> 1) * 8 + rr) * ROW + (mi & 1) * 8);
#pragma unroll
            for (int k2 = 0; k2 < KS; ++k2) {
                unsigned b0, b1, b2, b3;
                ldsm_x4(a + k2 * 32, b0, b1, b2, b3);
                mma_top(sc[0][0], sc[0][1], qa[k2][0], qa[k2][1], b0, b1);
                mma_top(sc[1][0], sc[1][1], qa[k2][0], qa[k2][1], b2, b3);
            }
        }
        // Online softmax for head qh over this tile; the 4 lanes of a quad share a head.
        float v[2][2];
        float mx = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int t = t0 + nt * 8 + qc + e;
                v[nt][e] = t < end ? sc[nt][e] * sl2 : NEG_INF;
                mx = fmaxf(mx, v[nt][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run, mx);
        const float alpha = (m_run == NEG_INF) ? 0.0f : exp2f(m_run - m_new);
        float p[2][2], sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                p[nt][e] = exp2f(v[nt][e] - m_new);
                sum += p[nt][e];
            }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l_run = l_run * alpha + sum;
        m_run = m_new;
#pragma unroll
        for (int n = 0; n < NT; ++n) { o[n][0] *= alpha; o[n][1] *= alpha; }

        // O += P·V: P's A fragment comes straight from the score accumulators.
        const unsigned pa0 = pack_bf2(p[0][0], p[0][1]);
        const unsigned pa2 = pack_bf2(p[1][0], p[1][1]);
        {
            const int mi = lane >> 3, rr = lane & 7;
            const unsigned a = smem_addr(vs + ((mi & 1) * 8 + rr) * ROW + (mi >> 1) * 8);
#pragma unroll
            for (int nb = 0; nb < D / 16; ++nb) {
                unsigned b0, b1, b2, b3;
                ldsm_x4_t(a + nb * 32, b0, b1, b2, b3);
                mma_top(o[2 * nb][0], o[2 * nb][1], pa0, pa2, b0, b1);
                mma_top(o[2 * nb + 1][0], o[2 * nb + 1][1], pa0, pa2, b2, b3);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    // Merge the warps' states for each head; the ring is free now.
    float* mw = (float*)tc_smem;           // [W][G]
    float* lw = mw + TC_WARPS * G;         // [W][G]
    float* ow = lw + TC_WARPS * G;         // [W][G][D]
    if (qh < G) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            ow[(warp * G + qh) * D + n * 8 + qc] = o[n][0];
            ow[(warp * G + qh) * D + n * 8 + qc + 1] = o[n][1];
        }
        if ((lane & 3) == 0) {
            mw[warp * G + qh] = m_run;
            lw[warp * G + qh] = l_run;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * D; i += TC_WARPS * 32) {
        const int g = i / D, d = i % D;
        float m = NEG_INF;
#pragma unroll
        for (int w = 0; w < TC_WARPS; ++w) m = fmaxf(m, mw[w * G + g]);
        float num = 0.0f, den = 0.0f;
#pragma unroll
        for (int w = 0; w < TC_WARPS; ++w) {
            const float l = lw[w * G + g];
            if (l > 0.0f) {
                const float f = exp2f(mw[w * G + g] - m);
                num += f * ow[(w * G + g) * D + d];
                den += f * l;
            }
        }
        part_o[(ob + (u64)g * S) * D + d] = num / den;
        if (d == 0) {
            part_ml[(ob + (u64)g * S) * 2] = m * TC_LN2;
            part_ml[(ob + (u64)g * S) * 2 + 1] = den;
        }
    }
}

#define ATTN_TC_INSTANCE(D, G)                                                                 \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32)                               \
        paged_attn_tc_d##D##_g##G(const bf16_t* q, int q_stride, const bf16_t* kc,            \
                                  const bf16_t* vc, const int* lens, const int* page_table,   \
                                  int table_stride, int KV, int P, int S, float scale,        \
                                  float* part_o, float* part_ml) {                            \
        attn_tc<D, G>(q, q_stride, kc, vc, lens, page_table, table_stride, KV, P, S, scale,   \
                      part_o, part_ml);                                                       \
    }

ATTN_TC_INSTANCE(64, 1)
ATTN_TC_INSTANCE(64, 2)
ATTN_TC_INSTANCE(64, 4)
ATTN_TC_INSTANCE(64, 8)
ATTN_TC_INSTANCE(128, 1)
ATTN_TC_INSTANCE(128, 2)
ATTN_TC_INSTANCE(128, 4)
ATTN_TC_INSTANCE(128, 8)
