// Token sampling on the device: greedy, temperature, top-k, top-p, per-request seed. The
// same algorithm runs on the host in `sampling::sample` (src/sampling.rs), which the CPU
// reference and the tests use; keep the two in step.
//
// One block of SAMPLE_THREADS per row. For a sampled row, with x = logit / temperature:
//   1. top-k: the k-th largest x by radix select (4 passes of 8 bits over the order key);
//   2. top-p: each top-k candidate's probability as an integer mass trunc(p * 2^31), and the
//      largest x whose candidates at or above it hold at least ceil(top_p * total) of the mass
//      (radix select again, on mass);
//   3. the Gumbel-max draw among the candidates left: argmax of x_i + g_i, where g_i is a
//      Gumbel variate from a counter-based hash of (row key, token id). The row key hashes the
//      request's seed and the token's position (host side), so a request draws the same
//      numbers whatever batch it runs in and however often it was paused.
// Every reduction runs in a fixed order (integer atomics for the histograms), so a row's
// result depends on its logits alone, run to run.
//
// Each pass over a row (512 KiB of float32 logits at a 128k vocabulary) is one block's
// stream from memory or L2, so its pace is the loads a thread keeps in flight: a pass reads
// SAMPLE_UNROLL float4s a thread before it looks at any (`for_each_logit`). Scalar loads one
// at a time took about 54 us a greedy row (BENCHMARKS.md §3.14).
#define SAMPLE_THREADS 1024
#define SAMPLE_UNROLL 4

// Per-row parameters; the host's `SampleRow` (#[repr(C)], sampling.rs) has this layout.
struct SampleRow {
    float temperature;  // <= 0: greedy
    float top_p;        // >= 1: off
    int top_k;          // <= 0 or >= vocab: off; 1 is greedy
    int banned;         // a token never drawn (EOS under min_tokens), or -1
    u64 key;            // hash of (seed, position)
};

// Larger floats get larger keys (IEEE bits with the sign folded).
__device__ __forceinline__ unsigned order_key(float x) {
    unsigned b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Gumbel variate of token i: u = (n + 0.5) / 2^23 from 23 hashed bits, g = -ln(-ln u).
__device__ __forceinline__ float gumbel_at(u64 key, int i) {
    u64 z = splitmix64(key ^ (u64)(unsigned)i);
    float u = ((float)(unsigned)(z >> 41) + 0.5f) * 1.1920928955078125e-7f;
    return -logf(-logf(u));
}

__device__ float block_max(float v) {
    __shared__ float red_max[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red_max[warp] = v;
    __syncthreads();
    float t = (threadIdx.x < (blockDim.x >> 5)) ? red_max[threadIdx.x] : NEG_INF;
    if (warp == 0) {
        t = warp_max(t);
        if (lane == 0) red_max[0] = t;
    }
    __syncthreads();
    return red_max[0];
}

__device__ unsigned long long block_sum_u64(unsigned long long v) {
    __shared__ unsigned long long red_u64[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) red_u64[warp] = v;
    __syncthreads();
    if (warp == 0) {
        unsigned long long t = (threadIdx.x < (blockDim.x >> 5)) ? red_u64[threadIdx.x] : 0ull;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane == 0) red_u64[0] = t;
    }
    __syncthreads();
    return red_u64[0];
}

// The block's best (value, index): larger value, then smaller index. Every thread gets it.
__device__ int block_argmax(float best, int idx) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { bv[warp] = best; bi[warp] = idx; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) {
            if (bv[w] > best || (bv[w] == best && bi[w] < idx)) { best = bv[w]; idx = bi[w]; }
        }
        bi[0] = idx;
    }
    __syncthreads();
    return bi[0];
}

// A top-k candidate's integer probability mass, trunc(exp(x - m) / z * 2^31).
__device__ __forceinline__ unsigned long long mass_of(float x, float m, float z) {
    return (unsigned long long)(unsigned)(__fmul_rn(__fdiv_rn(expf(x - m), z), 2147483648.0f));
}

// Calls f(i, v, valid) for the row's logits, in index order within each thread: float4
// loads when rows are 16-byte aligned (vocab % 4 == 0), scalar ones otherwise, and
// SAMPLE_UNROLL of them issued before the first is used. Every thread of the block makes the
// same calls (valid false past the row's end), so f may use warp-wide instructions.
template <class F>
__device__ __forceinline__ void for_each_logit(const float* __restrict__ l, int vocab, F f) {
    const int step = blockDim.x;
    if ((vocab & 3) == 0) {
        const float4* l4 = (const float4*)l;
        const int n4 = vocab >> 2;
        for (int base = 0; base < n4; base += SAMPLE_UNROLL * step) {
            float4 v[SAMPLE_UNROLL];
#pragma unroll
            for (int u = 0; u < SAMPLE_UNROLL; ++u) {
                const int j = base + u * step + threadIdx.x;
                v[u] = j < n4 ? l4[j] : make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
            }
#pragma unroll
            for (int u = 0; u < SAMPLE_UNROLL; ++u) {
                const int j = base + u * step + threadIdx.x;
                const bool ok = j < n4;
                f(4 * j, v[u].x, ok);
                f(4 * j + 1, v[u].y, ok);
                f(4 * j + 2, v[u].z, ok);
                f(4 * j + 3, v[u].w, ok);
            }
        }
        return;
    }
    for (int base = 0; base < vocab; base += SAMPLE_UNROLL * step) {
        float v[SAMPLE_UNROLL];
#pragma unroll
        for (int u = 0; u < SAMPLE_UNROLL; ++u) {
            const int i = base + u * step + threadIdx.x;
            v[u] = i < vocab ? l[i] : NEG_INF;
        }
#pragma unroll
        for (int u = 0; u < SAMPLE_UNROLL; ++u) {
            const int i = base + u * step + threadIdx.x;
            f(i, v[u], i < vocab);
        }
    }
}

// Logit v of token i as the sampler sees it: NaN and the banned token are -inf.
__device__ __forceinline__ float seen(float v, int i, int banned) {
    return (i == banned || v != v) ? NEG_INF : v;
}

// The same over the temperature (IEEE division, as on the host).
__device__ __forceinline__ float scaled(float v, int i, int banned, float t) {
    return __fdiv_rn(seen(v, i, banned), t);
}

// Adds w into hist[bin] for each lane of the warp with bin < 256 (called by all 32 lanes
// together). The lanes that share a bin add through one atomic, their lowest lane's: logits
// crowd a few values of the key's top byte, and same-address atomics of a warp serialize.
// stage is this warp's 32 slots of shared memory.
__device__ __forceinline__ void hist_add(unsigned long long* hist, unsigned bin,
                                         unsigned long long w, unsigned long long* stage) {
    const int lane = threadIdx.x & 31;
    const unsigned peers = __match_any_sync(0xffffffffu, bin);
    stage[lane] = w;
    __syncwarp();
    if (bin < 256u && lane == __ffs(peers) - 1) {
        unsigned long long sum = 0ull;
        for (unsigned m = peers; m != 0u; m &= m - 1u) sum += stage[__ffs(m) - 1];
        atomicAdd(&hist[bin], sum);
    }
    __syncwarp();
}

// The largest key t such that the candidates (key >= floor) with key >= t weigh at least
// `target`, where a candidate weighs 1 (MASS false) or its integer mass. Radix select, most
// significant byte first; hist is 256 shared counters.
template <bool MASS>
__device__ unsigned select_key(const float* l, int vocab, int banned, float t, float m, float z,
                               unsigned floor, unsigned long long target,
                               unsigned long long* hist) {
    __shared__ unsigned sel_prefix;
    __shared__ unsigned long long sel_above;
    __shared__ unsigned long long stage[SAMPLE_THREADS];
    unsigned long long* my_stage = stage + (threadIdx.x & ~31);
    if (threadIdx.x == 0) { sel_prefix = 0u; sel_above = 0ull; }
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 24 - 8 * pass;
        const unsigned hi = pass == 0 ? 0u : (0xffffffffu << (32 - 8 * pass));
        for (int d = threadIdx.x; d < 256; d += blockDim.x) hist[d] = 0ull;
        __syncthreads();
        const unsigned prefix = sel_prefix;
        for_each_logit(l, vocab, [&](int i, float v, bool ok) {
            const float x = scaled(v, i, banned, t);
            const unsigned k = order_key(x);
            const bool in = ok && k >= floor && (k & hi) == prefix;
            hist_add(hist, in ? (k >> shift) & 255u : 256u,
                     in ? (MASS ? mass_of(x, m, z) : 1ull) : 0ull, my_stage);
        });
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long acc = sel_above;
            for (int d = 255; d >= 0; --d) {
                if (acc + hist[d] >= target || d == 0) {
                    sel_prefix = prefix | ((unsigned)d << shift);
                    sel_above = acc;
                    break;
                }
                acc += hist[d];
            }
        }
        __syncthreads();
    }
    return sel_prefix;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(const float* logits, int vocab, const SampleRow* rows, int* out) {
    PDL_BEGIN();
    __shared__ unsigned long long hist[256];
    const float* l = logits + (u64)blockIdx.x * vocab;
    const SampleRow p = rows[blockIdx.x];
    const bool greedy = !(p.temperature > 0.0f) || p.top_k == 1;
    if (greedy) {
        // First index of the maximum (torch.argmax's rule); NaN never wins.
        float best = NEG_INF;
        int idx = 0x7fffffff;
        for_each_logit(l, vocab, [&](int i, float v, bool ok) {
            v = seen(v, i, p.banned);
            if (ok && v > best) { best = v; idx = i; }
        });
        idx = block_argmax(best, idx);
        if (threadIdx.x == 0) out[blockIdx.x] = (idx == 0x7fffffff) ? 0 : idx;
        return;
    }
    const float t = p.temperature;
    float mx = NEG_INF;
    for_each_logit(l, vocab, [&](int i, float v, bool ok) {
        if (ok) mx = fmaxf(mx, scaled(v, i, p.banned, t));
    });
    const float m = block_max(mx);
    if (m == NEG_INF) {
        if (threadIdx.x == 0) out[blockIdx.x] = 0;
        return;
    }
    unsigned floor = 0u;
    if (p.top_k > 0 && p.top_k < vocab) {
        floor = select_key<false>(l, vocab, p.banned, t, m, 1.0f, 0u,
                                  (unsigned long long)p.top_k, hist);
    }
    if (p.top_p < 1.0f) {
        float zs = 0.0f;
        for_each_logit(l, vocab, [&](int i, float v, bool ok) {
            const float x = scaled(v, i, p.banned, t);
            if (ok && order_key(x) >= floor) zs += expf(x - m);
        });
        const float z = block_sum(zs);
        unsigned long long ms = 0ull;
        for_each_logit(l, vocab, [&](int i, float v, bool ok) {
            const float x = scaled(v, i, p.banned, t);
            if (ok && order_key(x) >= floor) ms += mass_of(x, m, z);
        });
        const unsigned long long total = block_sum_u64(ms);
        unsigned long long target = (unsigned long long)ceil((double)p.top_p * (double)total);
        if (target < 1ull) target = 1ull;
        floor = select_key<true>(l, vocab, p.banned, t, m, z, floor, target, hist);
    }
    float best = NEG_INF;
    int idx = 0x7fffffff;
    for_each_logit(l, vocab, [&](int i, float v, bool ok) {
        const float x = scaled(v, i, p.banned, t);
        if (ok && order_key(x) >= floor && x != NEG_INF) {
            const float s = x + gumbel_at(p.key, i);
            if (s > best) { best = s; idx = i; }
        }
    });
    idx = block_argmax(best, idx);
    if (threadIdx.x == 0) out[blockIdx.x] = (idx == 0x7fffffff) ? 0 : idx;
}
