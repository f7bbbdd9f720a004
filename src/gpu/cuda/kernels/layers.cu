// Row-wise layers of the Llama decoder: embedding gather (into the float32 residual),
// RMSNorm, RoPE + paged KV write, SwiGLU; the KV transfer stand-in. One block per row unless
// noted. Sampling is in sample.cu.

// Eight elements a thread through one 16-byte load and two 16-byte stores, all of a
// thread's loads issued before the first store: hidden is a multiple of 8
// (`ModelShape::validate`), so rows of the table and of the residual are 16-byte aligned.
// One scalar element at a time took 15 us a step at batch 64 for 512 KiB.
extern "C" __global__ void embed_rows(const bf16_t* table, const int* tokens, float* out,
                                      int hidden, int vocab) {
    int r = blockIdx.x;
    int tok = tokens[r];
    if (tok < 0 || tok >= vocab) tok = 0;
    const uint4* src = (const uint4*)(table + (u64)tok * hidden);
    float4* dst = (float4*)(out + (u64)r * hidden);
    const int n8 = hidden / 8;
    for (int base = 0; base < n8; base += 4 * blockDim.x) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = base + u * blockDim.x + threadIdx.x;
            if (i < n8) v[u] = src[i];
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = base + u * blockDim.x + threadIdx.x;
            if (i < n8) {
                const unsigned w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
                float f[8];
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    f[2 * k] = bf2f((bf16_t)(w[k] & 0xffffu));
                    f[2 * k + 1] = bf2f((bf16_t)(w[k] >> 16));
                }
                dst[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
                dst[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
            }
        }
    }
}

// RMSNorm of the float32 residual stream, rounded to bf16 once (the GEMMs' input).
// The residual stays in float32 for the whole pass: a bf16 residual loses about 2^-9 of |x|
// at each of the 2 x layers additions, which dominated our error against float32.
// One block per row, sized so that each thread holds at most RMS_VEC float4s of the row in
// registers between the sum and the scaling: every load of a row is in flight at once, one
// trip to memory instead of a loop of dependent ones (a decode step runs this 2 x layers
// times, and at batch 1 its latency is all it costs).
//
// With nparts > 0 the row first takes the sum of its nparts float32 parts (parts + s *
// part_stride, s in order) into the residual and writes it back: the K slices of a weight
// product that adds into the residual (StepOptions::down_splits), summed here rather than by
// a reduction launch of their own.
#define RMS_VEC 4
extern "C" __global__ void rmsnorm(float* x, const float* parts, int nparts, long long part_stride,
                                   const bf16_t* w, bf16_t* out, int hidden, float eps) {
    PDL_BEGIN();
    float* xr = x + (u64)blockIdx.x * hidden;
    const float* pr = parts + (u64)blockIdx.x * hidden;
    bf16_t* yr = out + (u64)blockIdx.x * hidden;
    const int n4 = hidden >> 2;
    float ss = 0.0f;
    if ((hidden & 3) == 0 && n4 <= RMS_VEC * (int)blockDim.x) {
        float4 v[RMS_VEC];
#pragma unroll
        for (int k = 0; k < RMS_VEC; k++) {
            int i = threadIdx.x + k * blockDim.x;
            v[k] = i < n4 ? ((const float4*)xr)[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (nparts > 0 && i < n4) {
                for (int s = 0; s < nparts; s++) {
                    float4 p = ((const float4*)(pr + (u64)s * part_stride))[i];
                    v[k].x += p.x;
                    v[k].y += p.y;
                    v[k].z += p.z;
                    v[k].w += p.w;
                }
                ((float4*)xr)[i] = v[k];
            }
            ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
        }
        ss = block_sum(ss);
        const float inv = rsqrtf(ss / (float)hidden + eps);
#pragma unroll
        for (int k = 0; k < RMS_VEC; k++) {
            int i = threadIdx.x + k * blockDim.x;
            if (i < n4) {
                uint2 wv = ((const uint2*)w)[i];
                unsigned lo = (unsigned)f2bf(v[k].x * inv * bf2f((bf16_t)(wv.x & 0xffffu))) |
                              ((unsigned)f2bf(v[k].y * inv * bf2f((bf16_t)(wv.x >> 16))) << 16);
                unsigned hi = (unsigned)f2bf(v[k].z * inv * bf2f((bf16_t)(wv.y & 0xffffu))) |
                              ((unsigned)f2bf(v[k].w * inv * bf2f((bf16_t)(wv.y >> 16))) << 16);
                ((uint2*)yr)[i] = make_uint2(lo, hi);
            }
        }
        return;
    }
    // Each thread reads back only the elements it wrote.
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = xr[i];
        for (int s = 0; s < nparts; s++) v += pr[(u64)s * part_stride + i];
        if (nparts > 0) xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss);
    float inv = rsqrtf(ss / (float)hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        yr[i] = f2bf(xr[i] * inv * bf2f(w[i]));
    }
}

// Element e of row r's q|k|v: the GEMM's bf16 output, or (nparts > 0) its nparts K-slice
// parts, f32 `part_stride` apart, summed and rounded to bf16 as the GEMM rounds its output.
__device__ __forceinline__ float qkv_elem(const bf16_t* row, const float* pr, int nparts,
                                          long long part_stride, int e) {
    if (nparts == 0) return bf2f(row[e]);
    float v = 0.0f;
    for (int s = 0; s < nparts; s++) v += pr[(u64)s * part_stride + e];
    return bf2f(f2bf(v));
}

// Rotates q and k of one token in place (HF rotate-half layout) and writes its k and v into
// the paged cache. qkv row: [H*D q | KV*D k | KV*D v]. Cache layout per layer:
// [page][kv_head][slot][D]. Rows with lens[r] <= 0 are padding and are skipped.
// table_stride 0 lets all rows of one prefill share one page table. inv_freq[D/2] holds the
// rotary frequencies (base and scaling applied on the host, `ModelShape::inv_freq`).
// Grid (rows, blocks): one thread per rotated pair or copied v element, so a row's work is
// spread over (H + KV) * D / 2 + KV * D threads instead of looping in one block. With
// nparts > 0 the row is read from qkv's K-slice parts (`qkv_elem`; `StepOptions::qkv_splits`)
// and written back whole, so it ends as it would after the plain product.
extern "C" __global__ void rope_kv_write(bf16_t* qkv, const float* parts, int nparts,
                                         long long part_stride, const int* pos, const int* lens,
                                         const int* page_table, int table_stride, bf16_t* kc,
                                         bf16_t* vc, int H, int KV, int D, int P,
                                         const float* inv_freq) {
    PDL_BEGIN();
    int r = blockIdx.x;
    if (lens[r] <= 0) return;
    int p = pos[r];
    const int width = (H + 2 * KV) * D;
    bf16_t* row = qkv + (u64)r * width;
    const float* pr = nparts > 0 ? parts + (u64)r * width : nullptr;
    const int* table = page_table + (u64)r * table_stride;
    u64 page = (u64)table[p / P];
    int slot = p % P;
    int half = D / 2;
    int idx = blockIdx.y * blockDim.x + threadIdx.x;
    int pairs = (H + KV) * half;
    if (idx < pairs) {
        int head = idx / half, i = idx % half;
        float s, c;
        sincosf((float)p * inv_freq[i], &s, &c);
        int e0 = head * D + i;
        float x0 = qkv_elem(row, pr, nparts, part_stride, e0);
        float x1 = qkv_elem(row, pr, nparts, part_stride, e0 + half);
        bf16_t y0 = f2bf(x0 * c - x1 * s), y1 = f2bf(x1 * c + x0 * s);
        row[e0] = y0;
        row[e0 + half] = y1;
        if (head >= H) {
            u64 base = ((page * KV + (head - H)) * P + slot) * D;
            kc[base + i] = y0;
            kc[base + i + half] = y1;
        }
    } else if (idx < pairs + KV * D) {
        int e = idx - pairs, kh = e / D, d = e % D;
        int ev = (H + KV) * D + e;
        // Without parts qkv_elem reads the bf16 element, which f2bf gives back unchanged.
        bf16_t v = f2bf(qkv_elem(row, pr, nparts, part_stride, ev));
        if (nparts > 0) row[ev] = v;
        vc[((page * KV + kh) * P + slot) * D + d] = v;
    }
}

// SwiGLU: gu row is [gate | up]; silu(gate) is rounded to bf16 before the product, as in HF.
__device__ __forceinline__ bf16_t swiglu(bf16_t g, bf16_t u) {
    float x = bf2f(g);
    float sg = bf2f(f2bf(x / (1.0f + __expf(-x))));
    return f2bf(sg * bf2f(u));
}

// Grid (blocks, rows). Eight elements a thread through 16-byte loads and stores: ffn is a
// multiple of 8 (`ModelShape::validate` refuses other shapes).
extern "C" __global__ void silu_mul(const bf16_t* gu, bf16_t* out, int ffn) {
    PDL_BEGIN();
    int r = blockIdx.y;
    const bf16_t* g = gu + (u64)r * 2 * ffn;
    bf16_t* y = out + (u64)r * ffn;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < ffn / 8; i += gridDim.x * blockDim.x) {
        uint4 gv = ((const uint4*)g)[i], uv = ((const uint4*)(g + ffn))[i];
        unsigned gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w}, yw[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            yw[k] = (unsigned)swiglu((bf16_t)(gw[k] & 0xffffu), (bf16_t)(uw[k] & 0xffffu)) |
                    ((unsigned)swiglu((bf16_t)(gw[k] >> 16), (bf16_t)(uw[k] >> 16)) << 16);
        }
        ((uint4*)y)[i] = make_uint4(yw[0], yw[1], yw[2], yw[3]);
    }
}

// KV transfer stand-in (`context: transfer`): fills whole pages of the cache with seeded
// values, as a context server's KV would land in them. Block (i, region) writes page
// pages[i] of region `region` (layer l's K is region 2l, its V 2l + 1); each region holds
// region_elems elements, each page page_elems.
extern "C" __global__ void fill_kv_pages(bf16_t* kv, const int* pages, u64 region_elems,
                                         int page_elems, unsigned seed) {
    const u64 page = (u64)pages[blockIdx.x];
    const u64 base = (u64)blockIdx.y * region_elems + page * page_elems;
    for (int i = threadIdx.x; i < page_elems; i += blockDim.x) {
        u64 z = splitmix64(((u64)seed << 48) ^ (base + i));
        float u = (float)(unsigned)(z >> 40) * 5.9604644775390625e-8f;
        kv[base + i] = f2bf(2.0f * u - 1.0f);
    }
}
