// Seeded weight init. The same integer hash and the same rounding steps run on the host
// (`init::uniform_value`), so a CPU reference can rebuild the exact device weights.
__device__ __forceinline__ u64 splitmix64(u64 x) {
    u64 z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

extern "C" __global__ void init_uniform_bf16(bf16_t* out, u64 n, unsigned seed, unsigned tensor,
                                             float scale, float offset) {
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        u64 z = splitmix64(((u64)seed << 48) ^ ((u64)tensor << 36) ^ i);
        float u = (float)(unsigned)(z >> 40) * 5.9604644775390625e-8f;
        // _rn intrinsics forbid FMA contraction, so the host computes the same bits.
        float v = __fsub_rn(__fmul_rn(2.0f, u), 1.0f);
        out[i] = f2bf(__fadd_rn(offset, __fmul_rn(scale, v)));
    }
}

// The read-only bandwidth ceiling for the bench: streams n16 16-byte words once, four loads
// in flight a thread, folding them so the loads cannot be dropped; writes only if the fold
// hits a value it practically never does. chunk_log2 > 0 reads in chunks of 2^chunk_log2
// words scattered over the range (an odd multiplier permutes the chunk order; n16 must then
// be a power of two), as paged attention reads pages; 0 reads in address order.
__device__ __forceinline__ u64 probe_word(u64 i, u64 n16, unsigned chunk_log2) {
    if (chunk_log2 == 0) return i;
    const u64 chunks = n16 >> chunk_log2;
    const u64 c = ((i >> chunk_log2) * 0x9E3779B97F4A7C15ull) & (chunks - 1);
    return (c << chunk_log2) | (i & ((1ull << chunk_log2) - 1));
}

extern "C" __global__ void read_probe(const uint4* __restrict__ src, u64 n16,
                                      unsigned chunk_log2, unsigned* __restrict__ sink) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    unsigned acc = 0;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = __ldcs(src + probe_word(i + k * stride, n16, chunk_log2));
#pragma unroll
        for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    for (; i < n16; i += stride) {
        const uint4 v = __ldcs(src + probe_word(i, n16, chunk_log2));
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) sink[0] = acc;
}
