// Row-wise layers of the Llama decoder: embedding gather (into the float32 residual),
// RMSNorm, RoPE + paged KV write, SwiGLU; the KV transfer stand-in. One block per row unless
// noted. Sampling is in sample.cu.

extern "C" __global__ void embed_rows(const bf16_t* table, const int* tokens, float* out,
                                      int hidden, int vocab) {
    int r = blockIdx.x;
    int tok = tokens[r];
    if (tok < 0 || tok >= vocab) tok = 0;
    const bf16_t* src = table + (u64)tok * hidden;
    float* dst = out + (u64)r * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = bf2f(src[i]);
}

// RMSNorm of the float32 residual stream, rounded to bf16 once (the GEMMs' input).
// The residual stays in float32 for the whole pass: a bf16 residual loses about 2^-9 of |x|
// at each of the 2 x layers additions, which dominated our error against float32.
extern "C" __global__ void rmsnorm(const float* x, const bf16_t* w, bf16_t* out, int hidden,
                                   float eps) {
    const float* xr = x + (u64)blockIdx.x * hidden;
    bf16_t* yr = out + (u64)blockIdx.x * hidden;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = xr[i];
        ss += v * v;
    }
    ss = block_sum(ss);
    float inv = rsqrtf(ss / (float)hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        yr[i] = f2bf(xr[i] * inv * bf2f(w[i]));
    }
}

// Rotates q and k of one token in place (HF rotate-half layout) and writes its k and v into
// the paged cache. qkv row: [H*D q | KV*D k | KV*D v]. Cache layout per layer:
// [page][kv_head][slot][D]. Rows with lens[r] <= 0 are padding and are skipped.
// table_stride 0 lets all rows of one prefill share one page table. inv_freq[D/2] holds the
// rotary frequencies (base and scaling applied on the host, `ModelShape::inv_freq`).
extern "C" __global__ void rope_kv_write(bf16_t* qkv, const int* pos, const int* lens,
                                         const int* page_table, int table_stride, bf16_t* kc,
                                         bf16_t* vc, int H, int KV, int D, int P,
                                         const float* inv_freq) {
    int r = blockIdx.x;
    if (lens[r] <= 0) return;
    int p = pos[r];
    bf16_t* row = qkv + (u64)r * (H + 2 * KV) * D;
    const int* table = page_table + (u64)r * table_stride;
    u64 page = (u64)table[p / P];
    int slot = p % P;
    int half = D / 2;
    for (int idx = threadIdx.x; idx < (H + KV) * half; idx += blockDim.x) {
        int head = idx / half, i = idx % half;
        float s, c;
        sincosf((float)p * inv_freq[i], &s, &c);
        bf16_t* h = row + head * D;
        float x0 = bf2f(h[i]), x1 = bf2f(h[i + half]);
        bf16_t y0 = f2bf(x0 * c - x1 * s), y1 = f2bf(x1 * c + x0 * s);
        h[i] = y0;
        h[i + half] = y1;
        if (head >= H) {
            u64 base = ((page * KV + (head - H)) * P + slot) * D;
            kc[base + i] = y0;
            kc[base + i + half] = y1;
        }
    }
    const bf16_t* v = row + (H + KV) * D;
    for (int idx = threadIdx.x; idx < KV * D; idx += blockDim.x) {
        int kh = idx / D, d = idx % D;
        vc[((page * KV + kh) * P + slot) * D + d] = v[idx];
    }
}

// SwiGLU: gu row is [gate | up]; silu(gate) is rounded to bf16 before the product, as in HF.
extern "C" __global__ void silu_mul(const bf16_t* gu, bf16_t* out, int ffn) {
    int r = blockIdx.y;
    const bf16_t* g = gu + (u64)r * 2 * ffn;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < ffn; i += gridDim.x * blockDim.x) {
        float x = bf2f(g[i]);
        float sg = bf2f(f2bf(x / (1.0f + __expf(-x))));
        out[(u64)r * ffn + i] = f2bf(sg * bf2f(g[ffn + i]));
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
