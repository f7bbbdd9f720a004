// Prompt-lookup drafting and one-step verification (the device side of `draft.rs`, which
// states the same algorithm for the host). The drafter arena is one buffer of 32-bit words
// (`DrafterLayout`): request slot s at s * stride holds [count pushed, ring of W tokens],
// scratch row b at (request_slots + b) * stride holds [draft length, drafts...].
//
// A verify pass runs K + 1 rows per batch row b: row b(K+1) + i consumes position ctx[b] + i,
// its input is the last token for i = 0 and draft i otherwise. Rows past the draft are
// padding (lens 0: no KV write, no attention). The pass table holds batch row b's page table
// in each of its K + 1 rows.

// Window token i (0 = oldest) of a ring of w words holding len of n pushed tokens.
__device__ __forceinline__ unsigned ring_at(const unsigned* ring, unsigned w, unsigned n,
                                            unsigned len, unsigned i) {
    return ring[(n - len + i) % w];
}

// One block per batch row: find the most recent earlier occurrence of the window's last g
// tokens (g from max_ngram down to 1), draft what followed (reading the draft itself past the
// window's end), write the row's scratch and the verify pass's rows, copy the page table.
extern "C" __global__ void draft_lookup(const unsigned* arena, int stride, int request_slots,
                                        const int* slot, const int* ctx, const int* last,
                                        const int* cap, int max_ngram, int K,
                                        const int* batch_table, int table_width, int* tokens,
                                        int* pos, int* lens, int* pass_table) {
    const int b = blockIdx.x;
    const int rows = K + 1;
    __shared__ int best;
    __shared__ int found_g;
    __shared__ int drafts[16];
    __shared__ int dlen;
    unsigned* scratch = (unsigned*)arena + (u64)(request_slots + b) * stride;
    const int s = slot[b];
    if (threadIdx.x == 0) {
        found_g = 0;
        dlen = 0;
    }
    __syncthreads();
    const unsigned w = (unsigned)(stride - 1);
    unsigned n = 0, len = 0;
    const unsigned* ring = arena;
    if (s >= 0) {
        ring = arena + (u64)s * stride + 1;
        n = arena[(u64)s * stride];
        len = n < w ? n : w;
    }
    const int c = s >= 0 ? min(max(cap[b], 0), K) : 0;
    if (c > 0 && len >= 2) {
        int gmax = max_ngram < (int)len - 1 ? max_ngram : (int)len - 1;
        for (int g = gmax; g >= 1; --g) {
            if (threadIdx.x == 0) best = -1;
            __syncthreads();
            // Candidates j in [0, len - g): thread t tries j = len - g - 1 - t, - blockDim ...
            for (int j = (int)len - g - 1 - (int)threadIdx.x; j >= 0; j -= blockDim.x) {
                if (j <= best) break;
                bool eq = true;
                for (int t = 0; t < g && eq; ++t) {
                    eq = ring_at(ring, w, n, len, j + t) == ring_at(ring, w, n, len, len - g + t);
                }
                if (eq) {
                    atomicMax(&best, j);
                    break;
                }
            }
            __syncthreads();
            if (best >= 0) {
                if (threadIdx.x == 0) found_g = g;
                break;
            }
        }
        __syncthreads();
        if (threadIdx.x == 0 && found_g > 0) {
            for (int i = 0; i < c; ++i) {
                unsigned src = (unsigned)(best + found_g + i);
                drafts[i] = src < len ? (int)ring_at(ring, w, n, len, src) : drafts[src - len];
            }
            dlen = c;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        scratch[0] = (unsigned)dlen;
        for (int i = 0; i < dlen; ++i) scratch[1 + i] = (unsigned)drafts[i];
    }
    for (int i = threadIdx.x; i < rows; i += blockDim.x) {
        const int r = b * rows + i;
        const bool live = s >= 0 && ctx[b] >= 0 && i <= dlen;
        tokens[r] = (i == 0 || i > dlen) ? last[b] : drafts[i - 1];
        pos[r] = live ? ctx[b] + i : 0;
        lens[r] = live ? ctx[b] + i + 1 : 0;
    }
    const int* src = batch_table + (u64)b * table_width;
    for (int i = 0; i < rows; ++i) {
        int* dst = pass_table + (u64)(b * rows + i) * table_width;
        for (int e = threadIdx.x; e < table_width; e += blockDim.x) dst[e] = src[e];
    }
}

// One thread per batch row (after sampling every verify row into out_tok): the accepted
// drafts are the longest prefix equal to the token sampled before each; the row emits
// out_tok[b(K+1) .. b(K+1) + accepted] (n_out[b] tokens), which also go into its window.
extern "C" __global__ void draft_accept(unsigned* arena, int stride, int request_slots,
                                        const int* slot, int batch, int K, const int* out_tok,
                                        int* n_out) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= batch) return;
    const int s = slot[b];
    if (s < 0) {
        n_out[b] = 0;
        return;
    }
    const unsigned* scratch = arena + (u64)(request_slots + b) * stride;
    const int* sampled = out_tok + (u64)b * (K + 1);
    const int dlen = (int)scratch[0];
    int a = 0;
    while (a < dlen && (int)scratch[1 + a] == sampled[a]) ++a;
    n_out[b] = a + 1;
    unsigned* head = arena + (u64)s * stride;
    const unsigned w = (unsigned)(stride - 1);
    unsigned n = head[0];
    for (int i = 0; i <= a; ++i) {
        head[1 + n % w] = (unsigned)sampled[i];
        ++n;
    }
    head[0] = n;
}
