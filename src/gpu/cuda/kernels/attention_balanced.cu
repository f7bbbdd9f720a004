// Paged decode attention on the tensor cores with the pass's tiles dealt out evenly
// (`StepOptions::attn_balanced`). attention_tc.cu runs a block per (kv head, row, split): at
// batch 64 on an H200 that is 512 blocks on 264 block slots, two waves with the second 6 %
// short, and every block's start (its ring filling) and end (its warps merging) leave the
// slot's loads idle. Here the grid is as many blocks as fit on the chip at once. The pass's
// tiles, laid out in (row, kv head, tile) order, are cut into one contiguous run per warp of
// equal length (at least TCB_MIN_TILES tiles), and each warp streams its run through the same
// cp.async ring and per-tile arithmetic as attention_tc.cu (`tc_tile`) without a break where
// one (row, kv head) pair ends and the next begins. A warp's run cuts a pair into pieces: a
// pair in one piece is written directly; otherwise each piece writes its (o, max, sum) to
// `part_o` / `part_ml` at slot pair + warp (unique: along the tiles both only grow), and the
// warp that finishes a pair's last piece (a counter per pair, left at zero again) merges them.
// Needs pages of whole tiles (P % TC_TILE == 0); a pass writes every row's output. Measured
// on the H200 it reads KV more slowly than attention_tc.cu's grid at 4k (BENCHMARKS.md §3.13),
// so it is off by default.
#define TCB_MIN_TILES 32

__device__ __forceinline__ int tcb_tiles(int len) { return len > 0 ? (len + TC_TILE - 1) / TC_TILE : 0; }

// pre[r] = the tiles of rows before r (one kv head's), pre[rows] = all: one block-wide scan.
__device__ __forceinline__ void tcb_prefix(const int* __restrict__ lens, int rows, int* pre) {
    __shared__ int warp_total[32];
    const int nt = blockDim.x, t = threadIdx.x, lane = t & 31;
    const int per = (rows + nt - 1) / nt;
    const int r0 = min(rows, t * per), r1 = min(rows, r0 + per);
    int mine = 0;
    for (int r = r0; r < r1; ++r) mine += tcb_tiles(lens[r]);
    int inc = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += v;
    }
    if (lane == 31) warp_total[t >> 5] = inc;
    __syncthreads();
    int acc = inc - mine;
    for (int w = 0; w < (t >> 5); ++w) acc += warp_total[w];
    for (int r = r0; r < r1; ++r) {
        pre[r] = acc;
        acc += tcb_tiles(lens[r]);
    }
    if (t == nt - 1) pre[rows] = acc;
    __syncthreads();
}

// A position in the pass's tiles: row, kv head, tile j of the pair's n, the row's length, and
// the tile's page (index into the row's table) and offset in it.
struct TcbCursor {
    int r, kvh, j, n, len, page, off;
};

// The cursor at tile t (< all tiles): the last row whose first tile is at or before t has
// tiles (a later empty row would start at or before t too).
__device__ __forceinline__ TcbCursor tcb_at(long long t, const int* pre, const int* lens, int rows,
                                            int KV, int P) {
    int lo = 0, hi = rows - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if ((long long)pre[mid] * KV <= t) lo = mid;
        else hi = mid - 1;
    }
    TcbCursor c;
    c.r = lo;
    c.n = pre[lo + 1] - pre[lo];
    const int off = (int)(t - (long long)pre[lo] * KV);
    c.kvh = off / c.n;
    c.j = off % c.n;
    c.len = lens[lo];
    c.page = c.j * TC_TILE / P;
    c.off = c.j * TC_TILE % P;
    return c;
}

// The next tile (there must be one): within the pair, or the next pair's first, skipping
// empty rows.
__device__ __forceinline__ void tcb_next(TcbCursor& c, const int* pre, const int* lens, int KV,
                                         int P) {
    if (++c.j < c.n) {
        c.off += TC_TILE;
        if (c.off == P) {
            c.off = 0;
            ++c.page;
        }
        return;
    }
    c.j = 0;
    c.page = 0;
    c.off = 0;
    if (++c.kvh < KV) return;
    c.kvh = 0;
    do {
        ++c.r;
        c.n = pre[c.r + 1] - pre[c.r];
    } while (c.n == 0);
    c.len = lens[c.r];
}

// Merges a pair's `pieces` partials (slots s0, s0 + 1, ...) into its bf16 output `orow`, one
// piece at a time with a running maximum. A lane takes float4s of the G x D outputs; every
// load of a piece is issued before any is used, so a piece costs one trip to L2 (the merges
// fall at the end of the kernel, where nothing hides them).
template <int D, int G>
__device__ __forceinline__ void tcb_merge(const float* part_o, const float* part_ml, u64 s0,
                                          int pieces, bf16_t* orow, int lane) {
    constexpr int C4 = G * D / 4;          // float4s of a piece
    constexpr int PER = (C4 + 31) / 32;    // a lane's
    float4 acc[PER];
    float den[PER], mx[PER];
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        den[k] = 0.0f;
        mx[k] = NEG_INF;
    }
    for (int w = 0; w < pieces; ++w) {
        const u64 s = s0 + w;
        float4 v[PER];
        float mw[PER], lw[PER];
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int c = lane + 32 * k;
            if (c < C4) {
                const int g = c * 4 / D;
                v[k] = __ldcg((const float4*)(part_o + s * G * D) + c);
                mw[k] = __ldcg(part_ml + (s * G + g) * 2);
                lw[k] = __ldcg(part_ml + (s * G + g) * 2 + 1);
            }
        }
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            if (lane + 32 * k < C4) {
                // Every piece has tokens: m finite, l > 0.
                const float m = fmaxf(mx[k], mw[k]);
                const float a = exp2f(mx[k] - m), f = lw[k] * exp2f(mw[k] - m);
                acc[k].x = acc[k].x * a + f * v[k].x;
                acc[k].y = acc[k].y * a + f * v[k].y;
                acc[k].z = acc[k].z * a + f * v[k].z;
                acc[k].w = acc[k].w * a + f * v[k].w;
                den[k] = den[k] * a + f;
                mx[k] = m;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int c = lane + 32 * k;
        if (c < C4) {
            const float inv = 1.0f / den[k];
            unsigned* dst = (unsigned*)(orow + c * 4);
            dst[0] = pack_bf2(acc[k].x * inv, acc[k].y * inv);
            dst[1] = pack_bf2(acc[k].z * inv, acc[k].w * inv);
        }
    }
}

template <int D, int G>
__device__ __forceinline__ void attn_tcb(const bf16_t* __restrict__ q, int q_stride,
                                         const bf16_t* __restrict__ kc,
                                         const bf16_t* __restrict__ vc,
                                         const int* __restrict__ lens,
                                         const int* __restrict__ page_table, int table_stride,
                                         int KV, int P, int rows, float scale,
                                         float* __restrict__ part_o, float* __restrict__ part_ml,
                                         int* __restrict__ counts, bf16_t* __restrict__ out,
                                         int kv_settled) {
    static_assert(G >= 1 && G <= 16, "1 to 16 query heads per kv head");
    extern __shared__ __align__(16) unsigned char tc_smem[];
    constexpr int R = TcRows<G>::R;
    constexpr int ROW = TcSmem<D>::ROW;
    constexpr int CH = D / 8;   // 16-byte chunks per row
    constexpr int KS = D / 16;  // k-steps of Q·Kᵀ
    constexpr int NT = D / 8;   // n-tiles of P·V
    static_assert(32 % CH == 0, "a warp's 32 copies cover whole rows");
    const int H = KV * G;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int qh = lane >> 2, qc = (lane & 3) * 2;

    // lens and the page table come from the host before the step: readable before the wait.
    int* pre = (int*)(tc_smem + TcSmem<D>::BYTES);
    tcb_prefix(lens, rows, pre);
    const long long N = (long long)pre[rows] * KV;
    const int all_warps = gridDim.x * TC_WARPS;
    const int W = (int)min((long long)all_warps, max(1LL, N / TCB_MIN_TILES));
    const int gw = blockIdx.x * TC_WARPS + warp;
    const long long first = gw < W ? (long long)gw * N / W : 0;
    const int mine = gw < W ? (int)((long long)(gw + 1) * N / W - first) : 0;
    // The warp whose run holds tile t.
    auto warp_of = [&](long long t) { return (int)(((t + 1) * W - 1) / N); };

    bf16_t* ring = (bf16_t*)tc_smem + warp * TC_STAGES * TcSmem<D>::STAGE;
    TcbCursor in = mine > 0 ? tcb_at(first, pre, lens, rows, KV, P) : TcbCursor{};
    TcbCursor at = in;  // the tile being computed; `in` is the next one to copy
    // Copies tile k of the run into stage k % TC_STAGES (a tile lies in one page); called for
    // k = 0, 1, 2, ... in order, as `in` moves along.
    auto issue = [&](int k) {
        if (k < mine) {
            bf16_t* ks = ring + (k % TC_STAGES) * TcSmem<D>::STAGE;
            bf16_t* vs = ks + TC_TILE * ROW;
            const int part = lane % CH, r0 = lane / CH;
            const int t0 = in.j * TC_TILE;
            const int* table = page_table + (u64)in.r * table_stride;
            const u64 base = (((u64)table[in.page] * KV + in.kvh) * P + in.off + r0) * D + part * 8;
            const unsigned ks0 = smem_addr(ks + r0 * ROW + part * 8);
            const unsigned vs0 = smem_addr(vs + r0 * ROW + part * 8);
            tc_copy_tile<D>(ks0, vs0, kc, vc, base, t0, in.len, r0);
            if (k + 1 < mine) tcb_next(in, pre, lens, KV, P);
            return;
        }
        cp_async_commit();  // an empty group, so that the waits count as ever
    };

    // The ring's first tiles, as far as each ends before its row's last position (written by
    // the kernel before), are copied before the wait when the pass settled the others.
    int early = 0;
#pragma unroll
    for (int k = 0; k < TC_STAGES - 1; ++k) {
        if (kv_settled && early == k && k < mine && (in.j + 1) * TC_TILE <= in.len - 1) {
            issue(k);
            ++early;
        }
    }
    PDL_BEGIN();

    // Rows without tokens: a zero output, as `attn_combine` writes them.
    for (int r = gw; r < rows; r += all_warps) {
        if (pre[r + 1] == pre[r]) {
            for (int i = lane; i < H * D; i += 32) out[(u64)r * H * D + i] = 0;
        }
    }
    if (mine == 0) return;

    float o[NT][4];
    float m_run[R], l_run[R];  // log2 units, per head of this lane; l_run over its tokens
    unsigned qa[KS][R][2];
    auto begin_pair = [&]() {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
#pragma unroll
        for (int h = 0; h < R; ++h) {
            m_run[h] = NEG_INF;
            l_run[h] = 0.0f;
        }
        tc_load_q<D, G>(q + (u64)at.r * q_stride + (u64)at.kvh * G * D, qh, qc, qa);
    };
    begin_pair();
    const float sl2 = scale * TC_LOG2E;
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
        tc_tile<D, G>(ks, ks + TC_TILE * ROW, qa, at.j * TC_TILE, at.len, sl2, lane, m_run,
                      l_run, o);
        const bool last = k + 1 == mine;
        if (at.j + 1 < at.n && !last) {
            tcb_next(at, pre, lens, KV, P);
            continue;
        }
        // This warp's piece of the pair ends here.
#pragma unroll
        for (int h = 0; h < R; ++h) {
            l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
            l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
        }
        const int p = at.r * KV + at.kvh;
        const long long t_pair = (long long)pre[at.r] * KV + (long long)at.kvh * at.n;
        const int w0 = warp_of(t_pair), w1 = warp_of(t_pair + at.n - 1);
        bf16_t* orow = out + ((u64)at.r * H + (u64)at.kvh * G) * D;
        if (w0 == w1) {
            // The whole pair: its output.
#pragma unroll
            for (int h = 0; h < R; ++h) {
                const int g = qh + 8 * h;
                if (g < G) {
                    const float inv = 1.0f / l_run[h];
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        *(unsigned*)(orow + g * D + n * 8 + qc) =
                            pack_bf2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
                    }
                }
            }
        } else {
            const u64 slot = (u64)p + gw;
#pragma unroll
            for (int h = 0; h < R; ++h) {
                const int g = qh + 8 * h;
                if (g < G) {
                    float* po = part_o + (slot * G + g) * D;
                    const float inv = 1.0f / l_run[h];
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        *(float2*)(po + n * 8 + qc) =
                            make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
                    }
                    if ((lane & 3) == 0) {
                        part_ml[(slot * G + g) * 2] = m_run[h];
                        part_ml[(slot * G + g) * 2 + 1] = l_run[h];
                    }
                }
            }
            // Release the piece, then count it; the warp that counts the last one merges.
            __threadfence();
            __syncwarp();
            int done = 0;
            if (lane == 0) done = atomicAdd(&counts[p], 1);
            done = __shfl_sync(0xffffffffu, done, 0);
            if (done == w1 - w0) {
                __threadfence();
                tcb_merge<D, G>(part_o, part_ml, (u64)p + w0, w1 - w0 + 1, orow, lane);
                if (lane == 0) counts[p] = 0;  // for the next pass
            }
        }
        if (!last) {
            tcb_next(at, pre, lens, KV, P);
            begin_pair();
        }
    }
    cp_async_wait<0>();
}

#define ATTN_TCB_INSTANCE(D, G)                                                                \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32)                               \
        paged_attn_tcb_d##D##_g##G(const bf16_t* q, int q_stride, const bf16_t* kc,           \
                                   const bf16_t* vc, const int* lens, const int* page_table,  \
                                   int table_stride, int KV, int P, int rows, float scale,    \
                                   float* part_o, float* part_ml, int* counts, bf16_t* out,   \
                                   int kv_settled) {                                          \
        attn_tcb<D, G>(q, q_stride, kc, vc, lens, page_table, table_stride, KV, P, rows,     \
                       scale, part_o, part_ml, counts, out, kv_settled);                     \
    }
