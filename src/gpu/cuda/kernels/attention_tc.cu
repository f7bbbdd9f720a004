// Paged decode attention on the tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate).
// Instances `ATTN_TC_INSTANCE(D, G)` are appended for the model's head_dim and group size.
// Same grid, inputs and partial outputs as `paged_attn_*`, so `attn_combine` merges either.
// Each warp of a block walks its own tiles of TC_TILE tokens (tile i goes to warp i % W)
// through a TC_STAGES-deep cp.async ring in shared memory, with no block-wide barrier until
// the warps merge their online-softmax states at the end. The G query heads of a kv head are
// the rows of the MMA's A operand (rows G..15 are zero): Q·Kᵀ gives a 16 x 16 score tile,
// whose accumulators become P's A fragments for P·V without a trip through shared memory.
// P is rounded to bf16 for the P·V product, as PyTorch's bf16 attention does.
//
// Launched programmatically (PDL) a block starts while the kernel before it (RoPE + KV
// write) runs. In a pass whose rows write only their own last position (`kv_settled`: a
// plain decode step), every earlier position's K and V is final before the step begins, so
// the ring's first tiles that end before that position are copied before griddepcontrol.wait;
// q, the new position and every output are touched only after it (a test checks).
#define TC_TILE 16
// Warps a block and cp.async stages a warp: the host may set both (NVRTC -D, `TcRing`).
#ifndef TC_WARPS
#define TC_WARPS 4
#endif
#ifndef TC_STAGES
#define TC_STAGES 3
#endif
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
// The same copy of 16 bytes that all exist (no source-size operand).
__device__ __forceinline__ void cp_async16_full(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
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

// D += A(16x16) * B(16x8), all 16 rows.
__device__ __forceinline__ void mma_full(float& d0, float& d1, float& d2, float& d3, unsigned a0,
                                         unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d[4] += A * B, where a[R][2] holds the A fragments of R row halves (rows qh and qh + 8) for
// columns qc and qc + 8. With one half the MMA's rows 8..15 are zero, and so stay d[2], d[3]
// when they start at zero: kept as accumulators, not re-zeroed before every MMA.
template <int R>
__device__ __forceinline__ void mma_rows(float (&d)[4], const unsigned (&a)[R][2], unsigned b0,
                                         unsigned b1) {
    if constexpr (R == 1) {
        mma_full(d[0], d[1], d[2], d[3], a[0][0], 0u, a[0][1], 0u, b0, b1);
    } else {
        mma_full(d[0], d[1], d[2], d[3], a[0][0], a[1][0], a[0][1], a[1][1], b0, b1);
    }
}

// Two floats to bf16 (round to nearest even, as `f2bf` for finite values) in one instruction.
__device__ __forceinline__ unsigned pack_bf2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// 2^x on the SFU alone (exp2f adds range fix-ups around it): x <= 0 here, -inf gives 0.
__device__ __forceinline__ float fast_exp2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

// Shared-memory bytes one block needs (the host asks for the same through attn_tc_smem).
template <int D>
struct TcSmem {
    static constexpr int ROW = D + 8;  // padded row: ldmatrix rows land in distinct banks
    static constexpr int STAGE = 2 * TC_TILE * ROW;  // K tile then V tile, bf16 elements
    static constexpr int BYTES = TC_WARPS * TC_STAGES * STAGE * 2;
};

// Copies this lane's rows of one tile of K and V (a tile within one page) into a ring stage:
// rows r0, r0 + 32 / (D / 8), ... of the tile whose first token t0 and this lane's first row
// sit at `base` in the cache, and the lane's 16-byte column at ks0 / vs0 in shared memory.
// A whole tile (t0 + TC_TILE <= end) is copied with fixed offsets from one address; the
// last one zero-fills its rows at or past `end`, reading nothing there. Commits the group.
template <int D>
__device__ __forceinline__ void tc_copy_tile(unsigned ks0, unsigned vs0,
                                             const bf16_t* __restrict__ kc,
                                             const bf16_t* __restrict__ vc, u64 base, int t0,
                                             int end, int r0) {
    constexpr int ROWS_PER_PASS = 32 / (D / 8);
    constexpr int ROW = TcSmem<D>::ROW;
    if (t0 + TC_TILE <= end) {
        const bf16_t* kb = kc + base;
        const bf16_t* vb = vc + base;
#pragma unroll
        for (int i = 0; i < TC_TILE / ROWS_PER_PASS; ++i) {
            const unsigned dst = i * ROWS_PER_PASS * ROW * 2;
            cp_async16_full(ks0 + dst, kb + i * ROWS_PER_PASS * D);
            cp_async16_full(vs0 + dst, vb + i * ROWS_PER_PASS * D);
        }
        cp_async_commit();
        return;
    }
#pragma unroll
    for (int i = 0; i < TC_TILE / ROWS_PER_PASS; ++i) {
        const int row = r0 + i * ROWS_PER_PASS;
        const bool ok = t0 + row < end;
        const u64 src = base + (ok ? (u64)(row - r0) * D : 0);
        const unsigned dst = i * ROWS_PER_PASS * ROW * 2;
        cp_async16(ks0 + dst, kc + src, ok ? 16 : 0);
        cp_async16(vs0 + dst, vc + src, ok ? 16 : 0);
    }
    cp_async_commit();
}

// Row halves of the MMA's A operand that hold query heads: rows 0..7, and 8..15 when G > 8.
template <int G>
struct TcRows {
    static constexpr int R = G > 8 ? 2 : 1;
};

// This lane's query rows (heads qh + 8h of the G at `qg`, one row's first head of a kv head)
// as A fragments for columns qc, qc + 8 of each k-step; rows >= G are zero.
template <int D, int G>
__device__ __forceinline__ void tc_load_q(const bf16_t* __restrict__ qg, int qh, int qc,
                                          unsigned (&qa)[D / 16][TcRows<G>::R][2]) {
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
#pragma unroll
        for (int h = 0; h < TcRows<G>::R; ++h) {
            qa[k][h][0] = 0u;
            qa[k][h][1] = 0u;
            if (qh + 8 * h < G) {
                const bf16_t* qr = qg + (qh + 8 * h) * D + k * 16 + qc;
                qa[k][h][0] = *(const unsigned*)qr;
                qa[k][h][1] = *(const unsigned*)(qr + 8);
            }
        }
}

// One warp's tile of TC_TILE tokens [t0, t0 + TC_TILE) (those at or past `end` masked), K at
// `ks` and V at `vs` in shared memory: scores Q·Kᵀ, the online softmax of each head, O += P·V.
// m_run is in log2 units; l_run sums this lane's tokens only (its quad adds them at the end).
template <int D, int G>
__device__ __forceinline__ void tc_tile(const bf16_t* ks, const bf16_t* vs,
                                        const unsigned (&qa)[D / 16][TcRows<G>::R][2], int t0,
                                        int end, float sl2, int lane,
                                        float (&m_run)[TcRows<G>::R],
                                        float (&l_run)[TcRows<G>::R], float (&o)[D / 8][4]) {
    constexpr int R = TcRows<G>::R;
    constexpr int ROW = TcSmem<D>::ROW;
    constexpr int KS = D / 16;  // k-steps of Q·Kᵀ
    const int qc = (lane & 3) * 2;

    // Scores of 16 tokens: n-tile 0 = tokens 0..7, n-tile 1 = tokens 8..15;
    // sc[nt][2h + e] is head qh + 8h, token nt*8 + qc + e.
    float sc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] = 0.0f;
    {
        const int mi = lane >> 3, rr = lane & 7;
        const unsigned a = smem_addr(ks + ((mi >> 1) * 8 + rr) * ROW + (mi & 1) * 8);
#pragma unroll
        for (int k2 = 0; k2 < KS; ++k2) {
            unsigned b0, b1, b2, b3;
            ldsm_x4(a + k2 * 32, b0, b1, b2, b3);
            mma_rows<R>(sc[0], qa[k2], b0, b1);
            mma_rows<R>(sc[1], qa[k2], b2, b3);
        }
    }
    // Online softmax for each head over this tile; the 4 lanes of a quad share a head.
    unsigned pa[R][2];
#pragma unroll
    for (int h = 0; h < R; ++h) {
        float v[2][2];
        float mx = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int t = t0 + nt * 8 + qc + e;
                v[nt][e] = t < end ? sc[nt][2 * h + e] * sl2 : NEG_INF;
                mx = fmaxf(mx, v[nt][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[h], mx);
        const float alpha = (m_run[h] == NEG_INF) ? 0.0f : fast_exp2(m_run[h] - m_new);
        float p[2][2], sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                p[nt][e] = fast_exp2(v[nt][e] - m_new);
                sum += p[nt][e];
            }
        // This lane's tokens only: the quad shares m (so alpha), and adds its four
        // partial sums once, after the last tile.
        l_run[h] = l_run[h] * alpha + sum;
        m_run[h] = m_new;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[n][2 * h] *= alpha;
            o[n][2 * h + 1] *= alpha;
        }
        // P's A fragments come straight from the score accumulators: tokens qc, qc+1
        // (k 0..7) and 8 + qc, 8 + qc + 1 (k 8..15) of this head's row.
        pa[h][0] = pack_bf2(p[0][0], p[0][1]);
        pa[h][1] = pack_bf2(p[1][0], p[1][1]);
    }

    // O += P·V.
    {
        const int mi = lane >> 3, rr = lane & 7;
        const unsigned a = smem_addr(vs + ((mi & 1) * 8 + rr) * ROW + (mi >> 1) * 8);
#pragma unroll
        for (int nb = 0; nb < D / 16; ++nb) {
            unsigned b0, b1, b2, b3;
            ldsm_x4_t(a + nb * 32, b0, b1, b2, b3);
            mma_rows<R>(o[2 * nb], pa, b0, b1);
            mma_rows<R>(o[2 * nb + 1], pa, b2, b3);
        }
    }
}

// G query heads (1..16) per kv head. Lane l holds head qh = l / 4 in the MMA's top rows and,
// when G > 8, head qh + 8 in its bottom rows (R = 2 row halves); rows >= G are zero.
template <int D, int G>
__device__ __forceinline__ void attn_tc(const bf16_t* __restrict__ q, int q_stride,
                                        const bf16_t* __restrict__ kc,
                                        const bf16_t* __restrict__ vc,
                                        const int* __restrict__ lens,
                                        const int* __restrict__ page_table, int table_stride,
                                        int KV, int P, int S, float scale,
                                        float* __restrict__ part_o, float* __restrict__ part_ml,
                                        bf16_t* __restrict__ out, int kv_settled) {
    static_assert(G >= 1 && G <= 16, "1 to 16 query heads per kv head");
    extern __shared__ __align__(16) unsigned char tc_smem[];
    constexpr int R = G > 8 ? 2 : 1;
    constexpr int ROW = TcSmem<D>::ROW;
    constexpr int CH = D / 8;   // 16-byte chunks per row
    constexpr int KS = D / 16;  // k-steps of Q·Kᵀ
    constexpr int NT = D / 8;   // n-tiles of P·V
    static_assert(TC_WARPS * G * (D + 2) * 4 <= TcSmem<D>::BYTES, "merge fits in the ring");

    const int kvh = blockIdx.x, r = blockIdx.y, s = blockIdx.z;
    const int H = KV * G;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // lens and the page table come from the host before the step: readable before the wait.
    const int len = lens[r];
    int start, end;
    split_range(len, S, s, start, end);
    const u64 ob = ((u64)r * H + (u64)kvh * G) * S + s;

    if (start >= end) {
        PDL_BEGIN();
        empty_split<G, D>(part_ml, out, ob, S);
        return;
    }
    const int* table = page_table + (u64)r * table_stride;
    bf16_t* ring = (bf16_t*)tc_smem + warp * TC_STAGES * TcSmem<D>::STAGE;
    const int qh = lane >> 2, qc = (lane & 3) * 2;

    const int tiles = (end - start + TC_TILE - 1) / TC_TILE;
    const int mine = tiles > warp ? (tiles - warp + TC_WARPS - 1) / TC_WARPS : 0;
    // Splits start on whole tiles (split_chunk), so with pages of whole tiles a tile's
    // tokens lie in one page: one page-table read a tile, and a lane's copies step through
    // the page by whole rows. Otherwise each 16-byte copy looks up its own token's page.
    const bool tile_in_page = P % TC_TILE == 0;
    static_assert(32 % CH == 0, "a warp's 32 copies cover whole rows");
    // The next tile's page (index into the row's table) and offset in it: divided once, then
    // stepped by the warp's stride of TC_WARPS tiles, as `issue` takes tiles in order.
    constexpr int STRIDE = TC_WARPS * TC_TILE;
    const int step_pages = STRIDE / P, step_off = STRIDE % P;
    int next_page = (start + warp * TC_TILE) / P, next_off = (start + warp * TC_TILE) % P;
    auto issue = [&](int k) {
        if (k < mine) {
            const int t0 = start + (warp + k * TC_WARPS) * TC_TILE;
            bf16_t* ks = ring + (k % TC_STAGES) * TcSmem<D>::STAGE;
            bf16_t* vs = ks + TC_TILE * ROW;
            if (tile_in_page) {
                // This lane's first row in the KV cache.
                const int part = lane % CH, r0 = lane / CH;
                const u64 base =
                    (((u64)table[next_page] * KV + kvh) * P + next_off + r0) * D + part * 8;
                next_off += step_off;
                next_page += step_pages;
                if (next_off >= P) {
                    next_off -= P;
                    ++next_page;
                }
                const unsigned ks0 = smem_addr(ks + r0 * ROW + part * 8);
                const unsigned vs0 = smem_addr(vs + r0 * ROW + part * 8);
                tc_copy_tile<D>(ks0, vs0, kc, vc, base, t0, end, r0);
                return;
            }
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

    // o[n][2h + e]: head qh + 8h, dims n*8 + qc + e (with one half, o[n][2..3] are the
    // MMA's zero rows).
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
    float m_run[R], l_run[R];  // log2 units, per head of this lane; l_run over its tokens
#pragma unroll
    for (int h = 0; h < R; ++h) {
        m_run[h] = NEG_INF;
        l_run[h] = 0.0f;
    }
    const float sl2 = scale * TC_LOG2E;

    // The ring's first tiles, as far as they end before the row's last position (written
    // by the kernel before), are issued before the wait when the pass settled the others.
    // Unrolled, as the loop below: with a runtime stage index the compiler laid out the main
    // loop differently and a step at batch 64 took 0.3 % longer (BENCHMARKS.md §3.9).
    int early = 0;
#pragma unroll
    for (int k = 0; k < TC_STAGES - 1; ++k) {
        if (kv_settled && early == k && k < mine &&
            start + (warp + k * TC_WARPS + 1) * TC_TILE <= len - 1) {
            issue(k);
            ++early;
        }
    }
    PDL_BEGIN();

    unsigned qa[KS][R][2];
    tc_load_q<D, G>(q + (u64)r * q_stride + (u64)kvh * G * D, qh, qc, qa);
#pragma unroll
    for (int k = 0; k < TC_STAGES - 1; ++k) {
        if (k >= early) issue(k);
    }
    for (int k = 0; k < mine; ++k) {
        cp_async_wait<TC_STAGES - 2>();
        // Every lane is done with the stage the next issue refills (read last iteration).
        __syncwarp();
        issue(k + TC_STAGES - 1);
        const bf16_t* ks = ring + (k % TC_STAGES) * TcSmem<D>::STAGE;
        const bf16_t* vs = ks + TC_TILE * ROW;
        const int t0 = start + (warp + k * TC_WARPS) * TC_TILE;
        tc_tile<D, G>(ks, vs, qa, t0, end, sl2, lane, m_run, l_run, o);
    }
    cp_async_wait<0>();
#pragma unroll
    for (int h = 0; h < R; ++h) {
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    }
    __syncthreads();

    // Merge the warps' states for each head; the ring is free now.
    float* mw = (float*)tc_smem;           // [W][G]
    float* lw = mw + TC_WARPS * G;         // [W][G]
    float* ow = lw + TC_WARPS * G;         // [W][G][D]
#pragma unroll
    for (int h = 0; h < R; ++h) {
        const int g = qh + 8 * h;
        if (g < G) {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                ow[(warp * G + g) * D + n * 8 + qc] = o[n][2 * h];
                ow[(warp * G + g) * D + n * 8 + qc + 1] = o[n][2 * h + 1];
            }
            if ((lane & 3) == 0) {
                mw[warp * G + g] = m_run[h];
                lw[warp * G + g] = l_run[h];
            }
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
        if (direct_out(out, S)) {
            out[(ob + g) * D + d] = f2bf(den > 0.0f ? num / den : 0.0f);
            continue;
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
                                  float* part_o, float* part_ml, bf16_t* out,                 \
                                  int kv_settled) {                                           \
        attn_tc<D, G>(q, q_stride, kc, vc, lens, page_table, table_stride, KV, P, S, scale,   \
                      part_o, part_ml, out, kv_settled);                                      \
    }
