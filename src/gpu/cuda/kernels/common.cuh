// Shared helpers for every genslot kernel. bf16 is handled as raw 16-bit storage so the
// kernels compile with NVRTC without the CUDA headers on the include path.
typedef unsigned short bf16_t;
typedef unsigned long long u64;

#define NEG_INF (-__int_as_float(0x7f800000))

// Programmatic dependent launch (sm_90). A kernel that begins with PDL_BEGIN may be launched
// with the programmatic-serialization attribute (`Gpu::launch_dep`): its blocks are then
// scheduled while the previous kernel on the stream drains, and `griddepcontrol.wait` holds
// them until that kernel has finished and its writes are visible, so nothing it reads is
// early. It then lets the next such kernel launch at once. Launched plainly, both are no-ops.
// Every kernel in `device::PDL_KERNELS` must begin with it (a test checks).
#define PDL_BEGIN() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")

__device__ __forceinline__ float bf2f(bf16_t h) { return __uint_as_float(((unsigned)h) << 16); }

// Round to nearest even, the same rule as the host-side `f32_to_bf16_bits`.
__device__ __forceinline__ bf16_t f2bf(float f) {
    unsigned b = __float_as_uint(f);
    if ((b & 0x7f800000u) == 0x7f800000u) {
        return (bf16_t)((b >> 16) | ((b & 0xffffu) ? 0x40u : 0u));
    }
    b += 0x7fffu + ((b >> 16) & 1u);
    return (bf16_t)(b >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block; every thread gets the result. blockDim.x must be a multiple of 32.
__device__ float block_sum(float v) {
    __shared__ float red[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = (threadIdx.x < (blockDim.x >> 5)) ? red[threadIdx.x] : 0.0f;
    if (warp == 0) {
        t = warp_sum(t);
        if (lane == 0) red[0] = t;
    }
    __syncthreads();
    return red[0];
}
