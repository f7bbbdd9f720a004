// Token sampling on the device: greedy, temperature, top-k, top-p, per-request seed. The
// same algorithm runs on the host in `sampling::sample` (src/sampling.rs), which the CPU
// reference and the tests use; keep the two in step.
//
// One block of SAMPLE_THREADS per row. For a sampled row, with x = logit / temperature:
//   1. top-k: the k-th largest x by radix select (passes of 8 bits over the order key);
//   2. top-p: each top-k candidate's probability as an integer mass trunc(p * 2^31), and the
//      largest x whose candidates at or above it hold at least ceil(top_p * total) of the mass;
//   3. the Gumbel-max draw among the candidates left: argmax of x_i + g_i, where g_i is a
//      Gumbel variate from a counter-based hash of (row key, token id). The row key hashes the
//      request's seed and the token's position (host side), so a request draws the same
//      numbers whatever batch it runs in and however often it was paused.
// Every reduction runs in a fixed order (integer atomics for the histograms, sorted
// candidates), so a row's result depends on its logits alone, run to run.
//
// Each pass over a row (512 KiB of float32 logits at a 128k vocabulary) is one block's
// stream from memory or L2, so its pace is the loads a thread keeps in flight: a pass reads
// SAMPLE_UNROLL float4s a thread before it looks at any (`for_each_logit`). Scalar loads one
// at a time took about 54 us a greedy row (BENCHMARKS.md §3.14).
//
// With top-k on (k up to SAMPLE_CANDS) a row makes three passes: two radix passes find the
// 16-bit key prefix of the k-th largest x, a third gathers every logit at or above that prefix
// into shared memory (the k largest and the few that share their prefix), and the rest (the
// exact k-th key, top-p, the draw) runs on those candidates, sorted (`sample_top_k`). When
// more than SAMPLE_CANDS share or pass that prefix, the whole-row path continues the select.
// Top-p without top-k makes four passes (`sample_top_p`): the maximum and the sum together,
// two radix passes over the masses that also count the logits (the first one's bins give the
// total mass, so the target), and the gather of the logits at or above the 16-bit prefix where
// the mass reaches the target, when they fit; a flat row, whose nucleus does not, continues
// the select over the whole row (seven passes in all). Temperature alone makes one (the draw).
#define SAMPLE_THREADS 1024
#define SAMPLE_UNROLL 4
// The most top-k candidates a row keeps in shared memory (a power of two).
#define SAMPLE_CANDS 2048

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

// The x whose order key is k (order_key's inverse).
__device__ __forceinline__ float key_x(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
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

// How a radix select weighs a logit: 1 (COUNT), its integer mass (MASS), or both at once
// (BOTH: count << MASS_BITS | mass; a row's masses sum to about 2^31, so they never carry into
// the count).
#define W_COUNT 0
#define W_MASS 1
#define W_BOTH 2
#define MASS_BITS 40

__device__ __forceinline__ unsigned long long mass_part(unsigned long long w) {
    return w & ((1ull << MASS_BITS) - 1ull);
}

// What a select compares with its target: the mass of a BOTH weight, else the weight.
template <int W>
__device__ __forceinline__ unsigned long long weighed(unsigned long long w) {
    return W == W_BOTH ? mass_part(w) : w;
}

// What a radix select found: the key prefix (the bits of its passes), the weight of the
// logits above that prefix, and the weight that shares it.
struct Selected {
    unsigned prefix = 0u;
    unsigned long long above = 0ull, at = 0ull;
};

// ceil(top_p * total), at least 1: the mass top-p keeps of `total`.
__device__ __forceinline__ unsigned long long top_p_target(float top_p, unsigned long long total) {
    const unsigned long long t = (unsigned long long)ceil((double)top_p * (double)total);
    return t < 1ull ? 1ull : t;
}

// A radix pass's shared memory: its 256 bins, and a slot a thread for hist_add.
struct Radix {
    unsigned long long hist[256];
    unsigned long long stage[SAMPLE_THREADS];
};

// One radix pass (pass 0 to 3, most significant byte first): r.hist[d] = the weight of the
// row's logits with key >= floor, whose key shares the passes before this one's bits with
// `prefix` and has d in this pass's byte.
template <int W>
__device__ void radix_hist(const float* l, int vocab, int banned, float t, float m, float z,
                           unsigned floor, int pass, unsigned prefix, Radix& r) {
    unsigned long long* hist = r.hist;
    unsigned long long* my_stage = r.stage + (threadIdx.x & ~31);
    const int shift = 24 - 8 * pass;
    const unsigned hi = pass == 0 ? 0u : (0xffffffffu << (32 - 8 * pass));
    for (int d = threadIdx.x; d < 256; d += blockDim.x) hist[d] = 0ull;
    __syncthreads();
    for_each_logit(l, vocab, [&](int i, float v, bool ok) {
        const float x = scaled(v, i, banned, t);
        const unsigned k = order_key(x);
        const bool in = ok && k >= floor && (k & hi) == prefix;
        // Past the first pass few logits share the prefix: a warp with none skips the
        // histogram (the vote is the warp's, as hist_add's match is).
        if (__any_sync(0xffffffffu, in)) {
            unsigned long long w = 0ull;
            if (in) {
                const unsigned long long mass = W == W_COUNT ? 0ull : mass_of(x, m, z);
                w = W == W_COUNT ? 1ull : W == W_MASS ? mass : (1ull << MASS_BITS) | mass;
            }
            hist_add(hist, in ? (k >> shift) & 255u : 256u, w, my_stage);
        }
    });
    __syncthreads();
}

// Thread 0, after a pass: the largest bin d at which sel.above plus the bins from d up reach
// `target` (bin 0 if none does), appended to the prefix.
template <int W>
__device__ void pick_bin(const unsigned long long* hist, Selected& sel, int pass,
                         unsigned long long target) {
    const int shift = 24 - 8 * pass;
    unsigned long long acc = sel.above;
    for (int d = 255; d >= 0; --d) {
        if (weighed<W>(acc + hist[d]) >= target || d == 0) {
            sel = Selected{sel.prefix | ((unsigned)d << shift), acc, hist[d]};
            return;
        }
        acc += hist[d];
    }
}

// The largest key t such that the logits (key >= floor) with key >= t weigh at least
// `target` (weighed<W>): radix select over the key's bytes, passes `from` to `to` - 1,
// continuing from what the passes before `from` found (`start`; Selected{} for from 0).
template <int W>
__device__ Selected select_key(const float* l, int vocab, int banned, float t, float m, float z,
                               unsigned floor, unsigned long long target, Radix& r,
                               Selected start, int from, int to) {
    __shared__ Selected sel;
    __syncthreads();  // every thread has read the last select's result
    if (threadIdx.x == 0) sel = start;
    for (int pass = from; pass < to; ++pass) {
        __syncthreads();
        radix_hist<W>(l, vocab, banned, t, m, z, floor, pass, sel.prefix, r);
        if (threadIdx.x == 0) pick_bin<W>(r.hist, sel, pass, target);
    }
    __syncthreads();
    return sel;
}

// Bitonic sort of the n candidates (key, id) in shared memory, largest key first, then
// smaller id; the slots from n to the next power of two are filled with keys below any x's.
__device__ void sort_candidates(unsigned* key, int* id, int n) {
    int size = 1;
    while (size < n) size <<= 1;
    for (int j = n + (int)threadIdx.x; j < size; j += blockDim.x) {
        key[j] = 0u;
        id[j] = 0x7fffffff;
    }
    __syncthreads();
    for (int span = 2; span <= size; span <<= 1) {
        for (int stride = span >> 1; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < size / 2; t += blockDim.x) {
                const int lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
                const unsigned ka = key[lo], kb = key[hi];
                const int ia = id[lo], ib = id[hi];
                const bool b_first = kb > ka || (kb == ka && ib < ia);
                // Pairs go in order in every other span and reversed in the rest, so that
                // the next span's merge takes a bitonic sequence; the last span is one.
                if (b_first == ((lo & span) == 0)) {
                    key[lo] = kb; key[hi] = ka;
                    id[lo] = ib; id[hi] = ia;
                }
            }
            __syncthreads();
        }
    }
}

// The candidates of a row in shared memory: its logits whose key is at least `prefix` (n of
// them, at most SAMPLE_CANDS), gathered in one pass and sorted (sort_candidates).
struct Candidates {
    unsigned key[SAMPLE_CANDS];
    int id[SAMPLE_CANDS];
    int count;
};

__device__ void gather_candidates(const float* l, int vocab, const SampleRow& p, unsigned prefix,
                                  int n, Candidates& c) {
    if (threadIdx.x == 0) c.count = 0;
    __syncthreads();
    for_each_logit(l, vocab, [&](int i, float v, bool ok) {
        const unsigned k = order_key(scaled(v, i, p.banned, p.temperature));
        if (ok && k >= prefix) {
            const int at = atomicAdd(&c.count, 1);
            c.key[at] = k;
            c.id[at] = i;
        }
    });
    __syncthreads();
    sort_candidates(c.key, c.id, n);
}

// Top-p on sorted candidates: the first candidate's key (of those with key >= floor) at which
// their running mass reaches `target`, found by one warp in chunks of 32; floor if none does.
// Every thread gets it.
__device__ unsigned nucleus_floor(const Candidates& c, int n, unsigned floor, float m, float z,
                                  unsigned long long target) {
    __shared__ unsigned found_key;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        unsigned long long carry = 0ull;
        unsigned found = floor;
        for (int base = 0; base < n; base += 32) {
            const int j = base + lane;
            const unsigned k = j < n ? c.key[j] : 0u;
            unsigned long long run = k >= floor && j < n ? mass_of(key_x(k), m, z) : 0ull;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned long long u = __shfl_up_sync(0xffffffffu, run, o);
                if (lane >= o) run += u;
            }
            const unsigned hit = __ballot_sync(0xffffffffu, carry + run >= target);
            if (hit != 0u) {
                found = __shfl_sync(0xffffffffu, k, __ffs(hit) - 1);
                break;
            }
            carry += __shfl_sync(0xffffffffu, run, 31);
        }
        if (lane == 0) found_key = found;
    }
    __syncthreads();
    return found_key;
}

// The Gumbel-max draw among the first n sorted candidates with key >= floor.
__device__ void draw_candidates(const Candidates& c, int n, unsigned floor, u64 key, int* out) {
    float best = NEG_INF;
    int idx = 0x7fffffff;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float x = key_x(c.key[j]);
        if (c.key[j] >= floor && x != NEG_INF) {
            const float g = x + gumbel_at(key, c.id[j]);
            if (g > best || (g == best && c.id[j] < idx)) { best = g; idx = c.id[j]; }
        }
    }
    idx = block_argmax(best, idx);
    if (threadIdx.x == 0) out[blockIdx.x] = (idx == 0x7fffffff) ? 0 : idx;
}

// The Gumbel-max draw over the whole row, among the logits with key >= floor (an all -inf
// row finds nothing: token 0).
__device__ void draw_row(const float* l, int vocab, const SampleRow& p, unsigned floor, int* out) {
    float best = NEG_INF;
    int idx = 0x7fffffff;
    for_each_logit(l, vocab, [&](int i, float v, bool ok) {
        const float x = scaled(v, i, p.banned, p.temperature);
        if (ok && order_key(x) >= floor && x != NEG_INF) {
            const float s = x + gumbel_at(p.key, i);
            if (s > best) { best = s; idx = i; }
        }
    });
    idx = block_argmax(best, idx);
    if (threadIdx.x == 0) out[blockIdx.x] = (idx == 0x7fffffff) ? 0 : idx;
}

// The top-k row from its candidates: the n = s.above + s.at (at most SAMPLE_CANDS) logits at
// or above the 16-bit key prefix s that two radix passes found for the k-th largest (see the
// top of this file). Top-p then runs over the k kept, as on the host.
__device__ void sample_top_k(const float* l, int vocab, const SampleRow& p, const Selected& s,
                             Candidates& c, int* out) {
    const int n = (int)(s.above + s.at);
    gather_candidates(l, vocab, p, s.prefix, n, c);
    // The row's maximum is the first candidate; an all -inf row draws token 0.
    const float m = key_x(c.key[0]);
    if (m == NEG_INF) {
        if (threadIdx.x == 0) out[blockIdx.x] = 0;
        return;
    }
    unsigned floor = c.key[p.top_k - 1];
    if (p.top_p < 1.0f) {
        // The kept candidates are the first ones (key >= floor).
        float zs = 0.0f;
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            if (c.key[j] >= floor) zs += expf(key_x(c.key[j]) - m);
        }
        const float z = block_sum(zs);
        unsigned long long ms = 0ull;
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            if (c.key[j] >= floor) ms += mass_of(key_x(c.key[j]), m, z);
        }
        const unsigned long long target = top_p_target(p.top_p, block_sum_u64(ms));
        floor = nucleus_floor(c, n, floor, m, z, target);
    }
    draw_candidates(c, n, floor, p.key, out);
}

// Top-p without top-k (see the top of this file): the maximum and the sum of exp(x - max) in
// one pass, then two radix passes over the masses, counting the logits as well, find the
// 16-bit key prefix where the running mass reaches the target; when at most SAMPLE_CANDS
// logits are at or above it, they are gathered and the rest runs on them, else the select
// goes on over the whole row.
__device__ void sample_top_p(const float* l, int vocab, const SampleRow& p, Radix& r,
                             Candidates& c, int* out) {
    __shared__ Selected first;
    __shared__ unsigned long long target;
    const float t = p.temperature;
    // Online: a thread's sum is rescaled whenever its maximum grows.
    float mt = NEG_INF, zt = 0.0f;
    for_each_logit(l, vocab, [&](int i, float v, bool ok) {
        const float x = scaled(v, i, p.banned, t);
        if (ok && x != NEG_INF) {
            if (x > mt) {
                zt = zt * expf(mt - x) + 1.0f;
                mt = x;
            } else {
                zt += expf(x - mt);
            }
        }
    });
    const float m = block_max(mt);
    if (m == NEG_INF) {
        if (threadIdx.x == 0) out[blockIdx.x] = 0;
        return;
    }
    const float z = block_sum(mt == NEG_INF ? 0.0f : zt * expf(mt - m));
    // The first pass sees every logit, so its bins sum to the row's total mass.
    radix_hist<W_BOTH>(l, vocab, p.banned, t, m, z, 0u, 0, 0u, r);
    if (threadIdx.x == 0) {
        unsigned long long total = 0ull;
        for (int d = 0; d < 256; ++d) total += mass_part(r.hist[d]);
        target = top_p_target(p.top_p, total);
        first = Selected{};
        pick_bin<W_BOTH>(r.hist, first, 0, target);
    }
    __syncthreads();
    const Selected s =
        select_key<W_BOTH>(l, vocab, p.banned, t, m, z, 0u, target, r, first, 1, 2);
    const unsigned long long n = (s.above + s.at) >> MASS_BITS;
    if (n <= SAMPLE_CANDS) {
        gather_candidates(l, vocab, p, s.prefix, (int)n, c);
        draw_candidates(c, (int)n, nucleus_floor(c, (int)n, 0u, m, z, target), p.key, out);
        return;
    }
    const unsigned floor =
        select_key<W_BOTH>(l, vocab, p.banned, t, m, z, 0u, target, r, s, 2, 4).prefix;
    draw_row(l, vocab, p, floor, out);
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(const float* logits, int vocab, const SampleRow* rows, int* out) {
    PDL_BEGIN();
    __shared__ Radix radix;
    __shared__ Candidates cands;
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
    const bool top_k = p.top_k > 0 && p.top_k < vocab;
    if (!top_k && p.top_p < 1.0f) {
        sample_top_p(l, vocab, p, radix, cands, out);
        return;
    }
    // Top-k's first two radix passes; their candidates go to shared memory when they fit, or
    // the whole-row path below continues the same select.
    Selected k16{};
    int k_passes = 0;
    if (top_k && p.top_k <= SAMPLE_CANDS) {
        k16 = select_key<W_COUNT>(l, vocab, p.banned, t, 0.0f, 1.0f, 0u,
                                  (unsigned long long)p.top_k, radix, k16, 0, 2);
        k_passes = 2;
        if (k16.above + k16.at <= SAMPLE_CANDS) {
            sample_top_k(l, vocab, p, k16, cands, out);
            return;
        }
    }
    unsigned floor = 0u;
    if (top_k) {
        floor = select_key<W_COUNT>(l, vocab, p.banned, t, 0.0f, 1.0f, 0u,
                                    (unsigned long long)p.top_k, radix, k16, k_passes, 4)
                    .prefix;
        if (p.top_p < 1.0f) {
            float mx = NEG_INF;
            for_each_logit(l, vocab, [&](int i, float v, bool ok) {
                if (ok) mx = fmaxf(mx, scaled(v, i, p.banned, t));
            });
            const float m = block_max(mx);
            if (m == NEG_INF) {
                if (threadIdx.x == 0) out[blockIdx.x] = 0;
                return;
            }
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
            const unsigned long long target = top_p_target(p.top_p, block_sum_u64(ms));
            floor = select_key<W_MASS>(l, vocab, p.banned, t, m, z, floor, target, radix,
                                       Selected{}, 0, 4)
                        .prefix;
        }
    }
    // Temperature alone draws over the whole row.
    draw_row(l, vocab, p, floor, out);
}
