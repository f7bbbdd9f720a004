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
