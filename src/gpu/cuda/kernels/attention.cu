// Paged decode attention (flash-decoding). One block per (kv head, row, split): it walks its
// share of the row's context through the page table in tiles of 32 tokens, keeps an online
// softmax for the G query heads that share the kv head, and writes a normalised partial
// output plus (max, sum). `attn_combine` merges the splits. A prefill reuses it with one row
// per prompt token (lens = position + 1) and a shared page table (table_stride 0).
#define ATTN_TILE 32
#define ATTN_THREADS 128
#define ATTN_MIN_CHUNK 256

template <int D, int G>
__device__ __forceinline__ void attn_partial(const bf16_t* __restrict__ q, int q_stride,
                                             const bf16_t* __restrict__ kc,
                                             const bf16_t* __restrict__ vc,
                                             const int* __restrict__ lens,
                                             const int* __restrict__ page_table, int table_stride,
                                             int KV, int P, int S, float scale,
                                             float* __restrict__ part_o,
                                             float* __restrict__ part_ml) {
    __shared__ float qs[G][D];
    __shared__ __align__(16) bf16_t ks[ATTN_TILE][D + 8];
    __shared__ __align__(16) bf16_t vs[ATTN_TILE][D + 8];
    __shared__ float ps[G][ATTN_TILE];
    __shared__ float m_s[G], l_s[G], a_s[G];
    constexpr int OPT = (G * D + ATTN_THREADS - 1) / ATTN_THREADS;
    constexpr int CH = D / 8;

    const int kvh = blockIdx.x, r = blockIdx.y, s = blockIdx.z;
    const int H = KV * G;
    const int tid = threadIdx.x;
    const int len = lens[r];
    const int per = max((len + S - 1) / S, ATTN_MIN_CHUNK);
    const int chunk = (per + ATTN_TILE - 1) / ATTN_TILE * ATTN_TILE;
    const int start = s * chunk;
    const int end = min(len, start + chunk);
    const u64 ob = ((u64)r * H + (u64)kvh * G) * S + s;  // (row, head kvh*G, split)

    if (start >= end) {
        if (tid < G) {
            part_ml[(ob + (u64)tid * S) * 2] = NEG_INF;
            part_ml[(ob + (u64)tid * S) * 2 + 1] = 0.0f;
        }
        return;
    }
    const int* table = page_table + (u64)r * table_stride;
    for (int i = tid; i < G * D; i += ATTN_THREADS) {
        qs[i / D][i % D] = bf2f(q[(u64)r * q_stride + (u64)kvh * G * D + i]) * scale;
    }
    if (tid < G) { m_s[tid] = NEG_INF; l_s[tid] = 0.0f; }
    float acc[OPT];
#pragma unroll
    for (int k = 0; k < OPT; ++k) acc[k] = 0.0f;
    __syncthreads();

    // Each thread holds LD 16-byte pieces of the next K and V tiles in registers, so the
    // global loads of tile i+1 are in flight while tile i is computed.
    constexpr int LD = ATTN_TILE * CH / ATTN_THREADS;
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
        for (int i = tid; i < G * ATTN_TILE; i += ATTN_THREADS) {
            int g = i / ATTN_TILE, t = i % ATTN_TILE;
            float sc = NEG_INF;
            if (t < n) {
                sc = 0.0f;
#pragma unroll
                for (int d = 0; d < D; d += 8) {
                    uint4 kk = *(const uint4*)&ks[t][d];
                    const bf16_t* kb = (const bf16_t*)&kk;
#pragma unroll
                    for (int e = 0; e < 8; ++e) sc += qs[g][d + e] * bf2f(kb[e]);
                }
            }
            ps[g][t] = sc;
        }
        __syncthreads();
        {
            const int lane = tid & 31, warp = tid >> 5;
            for (int g = warp; g < G; g += ATTN_THREADS / 32) {
                float v = ps[g][lane];
                float m_old = m_s[g];
                float m_new = fmaxf(m_old, warp_max(v));
                float p = (lane < n) ? __expf(v - m_new) : 0.0f;
                float sum = warp_sum(p);
                ps[g][lane] = p;
                if (lane == 0) {
                    float a = (m_old == NEG_INF) ? 0.0f : __expf(m_old - m_new);
                    a_s[g] = a;
                    l_s[g] = l_s[g] * a + sum;
                    m_s[g] = m_new;
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < OPT; ++k) {
            int o = tid + k * ATTN_THREADS;
            if (o < G * D) {
                int g = o / D, d = o % D;
                float a = acc[k] * a_s[g];
                for (int t = 0; t < n; ++t) a += ps[g][t] * bf2f(vs[t][d]);
                acc[k] = a;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int k = 0; k < OPT; ++k) {
        int o = tid + k * ATTN_THREADS;
        if (o < G * D) {
            int g = o / D, d = o % D;
            part_o[(ob + (u64)g * S) * D + d] = acc[k] / l_s[g];
        }
    }
    if (tid < G) {
        part_ml[(ob + (u64)tid * S) * 2] = m_s[tid];
        part_ml[(ob + (u64)tid * S) * 2 + 1] = l_s[tid];
    }
}

#define ATTN_INSTANCE(D, G)                                                                    \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS)                                \
        paged_attn_d##D##_g##G(const bf16_t* q, int q_stride, const bf16_t* kc,               \
                               const bf16_t* vc, const int* lens, const int* page_table,      \
                               int table_stride, int KV, int P, int S, float scale,           \
                               float* part_o, float* part_ml) {                               \
        attn_partial<D, G>(q, q_stride, kc, vc, lens, page_table, table_stride, KV, P, S,     \
                           scale, part_o, part_ml);                                           \
    }

ATTN_INSTANCE(64, 1)
ATTN_INSTANCE(64, 2)
ATTN_INSTANCE(64, 4)
ATTN_INSTANCE(64, 8)
ATTN_INSTANCE(128, 1)
ATTN_INSTANCE(128, 2)
ATTN_INSTANCE(128, 4)
ATTN_INSTANCE(128, 8)

// Merges the S partial outputs of each (row, head); block = D threads, grid = (H, rows).
extern "C" __global__ void attn_combine(const float* part_o, const float* part_ml,
                                        const int* lens, bf16_t* out, int H, int D, int S) {
    int h = blockIdx.x, r = blockIdx.y, d = threadIdx.x;
    u64 o = (u64)r * H * D + (u64)h * D + d;
    if (lens[r] <= 0) { out[o] = 0; return; }
    u64 b = ((u64)r * H + h) * S;
    float mx = NEG_INF;
    for (int s = 0; s < S; ++s) {
        if (part_ml[(b + s) * 2 + 1] > 0.0f) mx = fmaxf(mx, part_ml[(b + s) * 2]);
    }
    float num = 0.0f, den = 0.0f;
    for (int s = 0; s < S; ++s) {
        float l = part_ml[(b + s) * 2 + 1];
        if (l > 0.0f) {
            float w = l * __expf(part_ml[(b + s) * 2] - mx);
            num += w * part_o[(b + s) * D + d];
            den += w;
        }
    }
    out[o] = f2bf(den > 0.0f ? num / den : 0.0f);
}
