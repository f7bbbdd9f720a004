// The hybrid shapes' recurrent layer (`shape::LayerMix`), decode and prefill alike: a gated
// linear attention over a fixed-size f32 state per kv head, S (D x D, row i = key dim),
//   a = exp(-softplus(w_a . h + b_a)),  S = a S + k^ v^T,  o_g = S^T q^_g
// with q^ and k^ L2-normalised per head, for each query head g of the kv head's group.
// One block of D threads per (kv head, segment); thread j keeps column j of S in registers.
// A segment is a run of rows of one request (its slot): one row per request in a decode
// step, a chunk of the prompt in a prefill, taken in order; rows with lens <= 0 are padding.
// A state lies at states + slot * slot_stride + layer_offset + kv_head * D * D.

__device__ __forceinline__ float recur_decay(float z) {
    float sp = z > 20.0f ? z : log1pf(expf(z));
    return expf(-sp);
}

template <int D>
__device__ void recurrent_scan(const bf16_t* qkv, const bf16_t* h, const bf16_t* w_a,
                               const bf16_t* b_a, float* states, u64 slot_stride,
                               u64 layer_offset, const int* seg_slot, const int* seg_row0,
                               const int* seg_rows, const int* lens, bf16_t* out, int H, int KV,
                               int hidden) {
    const int kh = blockIdx.x, seg = blockIdx.y, j = threadIdx.x;
    const int slot = seg_slot[seg];
    if (slot < 0) return;
    const int G = H / KV;
    const int width = (H + 2 * KV) * D;
    __shared__ float kn[D];
    __shared__ float qn[16 * D];
    __shared__ float vv[D];
    float* st = states + (u64)slot * slot_stride + layer_offset + (u64)kh * D * D;
    float s[D];
#pragma unroll
    for (int i = 0; i < D; ++i) s[i] = st[i * D + j];
    const int r0 = seg_row0[seg], rn = seg_rows[seg];
    for (int r = r0; r < r0 + rn; ++r) {
        if (lens[r] <= 0) continue;
        const bf16_t* row = qkv + (u64)r * width;
        // Decay of this kv head from the layer's normed input.
        const bf16_t* hr = h + (u64)r * hidden;
        const bf16_t* wr = w_a + (u64)kh * hidden;
        float z = 0.0f;
        for (int e = j; e < hidden; e += D) z += bf2f(hr[e]) * bf2f(wr[e]);
        z = block_sum(z);
        const float a = recur_decay(z + bf2f(b_a[kh]));
        float kx = bf2f(row[(H + kh) * D + j]);
        float kss = block_sum(kx * kx);
        kn[j] = kx / fmaxf(sqrtf(kss), 1e-6f);
        vv[j] = bf2f(row[(H + KV + kh) * D + j]);
        for (int g = 0; g < G; ++g) {
            float qx = bf2f(row[(kh * G + g) * D + j]);
            float qss = block_sum(qx * qx);
            qn[g * D + j] = qx / fmaxf(sqrtf(qss), 1e-6f);
        }
        __syncthreads();
        const float vj = vv[j];
#pragma unroll
        for (int i = 0; i < D; ++i) s[i] = a * s[i] + kn[i] * vj;
        for (int g = 0; g < G; ++g) {
            float o = 0.0f;
#pragma unroll
            for (int i = 0; i < D; ++i) o += qn[g * D + i] * s[i];
            out[(u64)r * H * D + (kh * G + g) * D + j] = f2bf(o);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < D; ++i) st[i * D + j] = s[i];
}

#define RECUR_INSTANCE(D)                                                                      \
    extern "C" __global__ void __launch_bounds__(D) recurrent_scan_d##D(                      \
        const bf16_t* qkv, const bf16_t* h, const bf16_t* w_a, const bf16_t* b_a,             \
        float* states, u64 slot_stride, u64 layer_offset, const int* seg_slot,                 \
        const int* seg_row0, const int* seg_rows, const int* lens, bf16_t* out, int H, int KV, \
        int hidden) {                                                                          \
        recurrent_scan<D>(qkv, h, w_a, b_a, states, slot_stride, layer_offset, seg_slot,       \
                          seg_row0, seg_rows, lens, out, H, KV, hidden);                       \
    }
