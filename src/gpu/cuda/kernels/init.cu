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
