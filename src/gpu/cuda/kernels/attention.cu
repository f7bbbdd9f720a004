// Paged decode attention (flash-decoding). One block per (kv head, row, split): it walks its
// share of the row's context through the page table in tiles of 64 tokens, keeps an online
// softmax for the G query heads that share the kv head, and writes a normalised partial
// output plus (max, sum). `attn_combine` merges the splits. A prefill reuses it with one row
// per prompt token (lens = position + 1) and a shared page table (table_stride 0).
// Instances `ATTN_INSTANCE(D, G)` are appended for the model's head_dim and group size.
#define ATTN_TILE 64
#define ATTN_THREADS 128
#define ATTN_MIN_CHUNK 256

// Tokens per split of a row of `len` tokens over S splits: whole ATTN_TILE tiles, at least
// ATTN_MIN_CHUNK. Both attention kernels split this way.
__device__ __forceinline__ int split_chunk(int len, int S) {
    const int per = max((len + S - 1) / S, ATTN_MIN_CHUNK);
    return (per + ATTN_TILE - 1) / ATTN_TILE * ATTN_TILE;
}

// The context range [start, end) of split s.
__device__ __forceinline__ void split_range(int len, int S, int s, int& start, int& end) {
    const int chunk = split_chunk(len, S);
    start = s * chunk;
    end = min(len, start + chunk);
}

// How many of the S splits get tokens (the rest are empty).
__device__ __forceinline__ int live_splits(int len, int S) {
    if (len <= 0) return 0;
    const int chunk = split_chunk(len, S);
    return min(S, (len + chunk - 1) / chunk);
}

// A pass with one split may write its bf16 output from the attention kernel (`out` non-null:
// `StepOptions::direct_single_split`); there is then no `attn_combine`. With S == 1 the
// (row, head, split) index of head g is ob + g, the output row's head index.
__device__ __forceinline__ bool direct_out(const bf16_t* out, int S) {
    return out != nullptr && S == 1;
}

// An empty split's partials for the G heads at `ob` (the first head's (row, head, split)):
// weight 0, so `attn_combine` skips them. Written directly, an empty row's output is zero
// (as `attn_combine` writes it).
template <int G, int D>
__device__ __forceinline__ void empty_split(float* part_ml, bf16_t* out, u64 ob, int S) {
    if (direct_out(out, S)) {
        for (int i = threadIdx.x; i < G * D; i += blockDim.x) out[ob * D + i] = 0;
        return;
    }
    if (threadIdx.x < G) {
        part_ml[(ob + (u64)threadIdx.x * S) * 2] = NEG_INF;
        part_ml[(ob + (u64)threadIdx.x * S) * 2 + 1] = 0.0f;
    }
}

// Thread roles per tile: for scores, thread = (token, half of the heads), so one K row read
// from shared memory serves several heads; for P.V, thread = (pair of dims, token group) and
// reads a bf16 pair of V per token and four probabilities per float4, keeping the
// shared-memory wavefronts per byte of KV low.
template <int D, int G>
__device__ __forceinline__ void attn_partial(const bf16_t* __restrict__ q, int q_stride,
                                             const bf16_t* __restrict__ kc,
                                             const bf16_t* __restrict__ vc,
                                             const int* __restrict__ lens,
                                             const int* __restrict__ page_table, int table_stride,
                                             int KV, int P, int S, float scale,
                                             float* __restrict__ part_o,
                                             float* __restrict__ part_ml,
                                             bf16_t* __restrict__ out) {
    // K tile in rows [0, ATTN_TILE), V tile after it; one array so the final reduction
    // (NSPLIT x G x D floats) can reuse both.
    __shared__ __align__(16) bf16_t kv_s[2 * ATTN_TILE][D + 8];
    __shared__ __align__(16) float qs[G][D];
    bf16_t (*ks)[D + 8] = kv_s;
    bf16_t (*vs)[D + 8] = kv_s + ATTN_TILE;
    __shared__ __align__(16) float ps[G][ATTN_TILE];
    __shared__ float m_s[G], l_s[G], a_s[G];
    constexpr int CH = D / 8;
    constexpr int LD = ATTN_TILE * CH / ATTN_THREADS;
    constexpr int DP = D / 2;
    constexpr int NSPLIT = ATTN_THREADS / DP;
    constexpr int TPG = ATTN_TILE / NSPLIT;
    constexpr int GH = (G + 1) / 2;
    static_assert(G >= 1 && G <= 16, "1 to 16 query heads per kv head");
    static_assert(NSPLIT * G * D * 4 <= 2 * ATTN_TILE * (D + 8) * 2, "reduction fits");

    const int kvh = blockIdx.x, r = blockIdx.y, s = blockIdx.z;
    const int H = KV * G;
    const int tid = threadIdx.x;
    int start, end;
    split_range(lens[r], S, s, start, end);
    const u64 ob = ((u64)r * H + (u64)kvh * G) * S + s;  // (row, head kvh*G, split)

    if (start >= end) {
        empty_split<G, D>(part_ml, out, ob, S);
        return;
    }
    const int* table = page_table + (u64)r * table_stride;
    for (int i = tid; i < G * D; i += ATTN_THREADS) {
        qs[i / D][i % D] = bf2f(q[(u64)r * q_stride + (u64)kvh * G * D + i]) * scale;
    }
    if (tid < G) { m_s[tid] = NEG_INF; l_s[tid] = 0.0f; }
    float acc[G][2];
#pragma unroll
    for (int g = 0; g < G; ++g) { acc[g][0] = 0.0f; acc[g][1] = 0.0f; }
    const int dp = tid % DP, tg = tid / DP;
    const int lane = tid & 31, warp = tid >> 5;
    __syncthreads();

    // Each thread holds LD 16-byte pieces of the next K and V tiles in registers, so the
    // global loads of tile i+1 are in flight while tile i is computed.
    uint4 kr[LD], vr[LD];
    auto fetch = [&](int t0) {
        const int n = min(ATTN_TILE, end - t0);
#pragma unroll
        for (int k = 0; k < LD; ++k) {
            int c = tid + k * ATTN_THREADS;
            int t = c / CH, part = c % CH;
            kr[k] = make_uint4(0, 0, 0, 0);
            vr[k] = make_uint4(0, 0, 0, 0);
            if (t < n) {
                int j = t0 + t;
                u64 base = (((u64)table[j / P] * KV + kvh) * P + (j % P)) * D + part * 8;
                kr[k] = *(const uint4*)(kc + base);
                vr[k] = *(const uint4*)(vc + base);
            }
        }
    };
    fetch(start);
    for (int t0 = start; t0 < end; t0 += ATTN_TILE) {
        const int n = min(ATTN_TILE, end - t0);
#pragma unroll
        for (int k = 0; k < LD; ++k) {
            int c = tid + k * ATTN_THREADS;
            int t = c / CH, part = c % CH;
            *(uint4*)&ks[t][part * 8] = kr[k];
            *(uint4*)&vs[t][part * 8] = vr[k];
        }
        __syncthreads();
        if (t0 + ATTN_TILE < end) fetch(t0 + ATTN_TILE);
        {
            const int t = tid % ATTN_TILE, h0 = tid / ATTN_TILE;
            float sc[GH];
#pragma unroll
            for (int j = 0; j < GH; ++j) sc[j] = 0.0f;
            if (t < n) {
#pragma unroll 4
                for (int d = 0; d < D; d += 8) {
                    uint4 kk = *(const uint4*)&ks[t][d];
                    const bf16_t* kb = (const bf16_t*)&kk;
                    float kf[8];
#pragma unroll
                    for (int e = 0; e < 8; ++e) kf[e] = bf2f(kb[e]);
#pragma unroll
                    for (int j = 0; j < GH; ++j) {
                        int g = h0 + 2 * j;
                        if (g < G) {
                            float4 qa = *(const float4*)&qs[g][d];
                            float4 qb = *(const float4*)&qs[g][d + 4];
                            sc[j] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] +
                                     qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                        }
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < GH; ++j) {
                int g = h0 + 2 * j;
                if (g < G) ps[g][t] = (t < n) ? sc[j] : NEG_INF;
            }
        }
        __syncthreads();
        for (int g = warp; g < G; g += ATTN_THREADS / 32) {
            float v0 = ps[g][lane], v1 = ps[g][lane + 32];
            float m_old = m_s[g];
            float m_new = fmaxf(m_old, warp_max(fmaxf(v0, v1)));
            float p0 = (lane < n) ? __expf(v0 - m_new) : 0.0f;
            float p1 = (lane + 32 < n) ? __expf(v1 - m_new) : 0.0f;
            float sum = warp_sum(p0 + p1);
            ps[g][lane] = p0;
            ps[g][lane + 32] = p1;
            if (lane == 0) {
                float a = (m_old == NEG_INF) ? 0.0f : __expf(m_old - m_new);
                a_s[g] = a;
                l_s[g] = l_s[g] * a + sum;
                m_s[g] = m_new;
            }
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float a = a_s[g];
            acc[g][0] *= a;
            acc[g][1] *= a;
        }
        // Probabilities past n are 0 and V rows past n are zero-filled, so whole groups of
        // four tokens are safe.
        const int tb = tg * TPG;
        const int te = min(tb + TPG, (n + 3) & ~3);
        for (int t = tb; t < te; t += 4) {
            float4 pg[G];
#pragma unroll
            for (int g = 0; g < G; ++g) pg[g] = *(const float4*)&ps[g][t];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                unsigned v2 = *(const unsigned*)&vs[t + u][2 * dp];
                float va = bf2f((bf16_t)(v2 & 0xffffu)), vb = bf2f((bf16_t)(v2 >> 16));
#pragma unroll
                for (int g = 0; g < G; ++g) {
                    float p = u == 0 ? pg[g].x : u == 1 ? pg[g].y : u == 2 ? pg[g].z : pg[g].w;
                    acc[g][0] += p * va;
                    acc[g][1] += p * vb;
                }
            }
        }
        __syncthreads();
    }
    // Sum the token groups through shared memory (the K and V tiles are free now).
    float* red = (float*)&kv_s[0][0];  // [NSPLIT][G][D]
#pragma unroll
    for (int g = 0; g < G; ++g) {
        red[(tg * G + g) * D + 2 * dp] = acc[g][0];
        red[(tg * G + g) * D + 2 * dp + 1] = acc[g][1];
    }
    __syncthreads();
    for (int o = tid; o < G * D; o += ATTN_THREADS) {
        int g = o / D, d = o % D;
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < NSPLIT; ++k) sum += red[(k * G + g) * D + d];
        if (direct_out(out, S)) {
            out[(ob + g) * D + d] = f2bf(sum / l_s[g]);
        } else {
            part_o[(ob + (u64)g * S) * D + d] = sum / l_s[g];
        }
    }
    if (!direct_out(out, S) && tid < G) {
        part_ml[(ob + (u64)tid * S) * 2] = m_s[tid];
        part_ml[(ob + (u64)tid * S) * 2 + 1] = l_s[tid];
    }
}

#define ATTN_INSTANCE(D, G)                                                                    \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS)                                \
        paged_attn_d##D##_g##G(const bf16_t* q, int q_stride, const bf16_t* kc,               \
                               const bf16_t* vc, const int* lens, const int* page_table,      \
                               int table_stride, int KV, int P, int S, float scale,           \
                               float* part_o, float* part_ml, bf16_t* out,                    \
                               int /* kv_settled: used by the tc kernel alone */) {           \
        PDL_BEGIN();                                                                           \
        attn_partial<D, G>(q, q_stride, kc, vc, lens, page_table, table_stride, KV, P, S,     \
                           scale, part_o, part_ml, out);                                      \
    }

// Merges the S partial outputs of each (row, head); block = D threads, grid = (H, rows).
// Only the splits that `split_range` gave tokens are read (a short row of a small batch has S
// up to 128 but a handful of live ones), each split's (max, sum) once into shared memory by
// as many threads, and the partial outputs four at a time: at batch 1 this kernel's cost is
// its chain of trips to memory. S <= COMBINE_MAX_SPLITS (`forward::MAX_SPLITS`).
#define COMBINE_MAX_SPLITS 128
extern "C" __global__ void attn_combine(const float* part_o, const float* part_ml,
                                        const int* lens, bf16_t* out, int H, int D, int S) {
    PDL_BEGIN();
    __shared__ float m_s[COMBINE_MAX_SPLITS], l_s[COMBINE_MAX_SPLITS];
    int h = blockIdx.x, r = blockIdx.y, d = threadIdx.x;
    u64 o = (u64)r * H * D + (u64)h * D + d;
    const int len = lens[r];
    if (len <= 0) { out[o] = 0; return; }
    const int live = min(live_splits(len, S), COMBINE_MAX_SPLITS);
    u64 b = ((u64)r * H + h) * S;
    if (live == 1) {
        // One split's partial is already its output: written as the attention kernel writes
        // a single-split pass (`direct_out`), bit for bit, so a row's output does not depend
        // on whether its pass had one split or several.
        out[o] = f2bf(part_ml[b * 2 + 1] > 0.0f ? part_o[b * D + d] : 0.0f);
        return;
    }
    for (int s = threadIdx.x; s < live; s += blockDim.x) {
        m_s[s] = part_ml[(b + s) * 2];
        l_s[s] = part_ml[(b + s) * 2 + 1];
    }
    __syncthreads();
    float mx = NEG_INF;
    for (int s = 0; s < live; ++s) {
        if (l_s[s] > 0.0f) mx = fmaxf(mx, m_s[s]);
    }
    float num = 0.0f, den = 0.0f;
#pragma unroll 4
    for (int s = 0; s < live; ++s) {
        float l = l_s[s];
        float w = l > 0.0f ? l * __expf(m_s[s] - mx) : 0.0f;
        num += w * part_o[(b + s) * D + d];
        den += w;
    }
    out[o] = f2bf(den > 0.0f ? num / den : 0.0f);
}
