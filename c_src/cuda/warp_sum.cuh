// A sum over the lanes of a warp of several values at once, transposing as
// it goes: each round sends half of the values still held to the partner
// lane and keeps the other half, so that V values cost about V shuffles, not
// V per round. Shared by the selective scan's backward (the b and c
// gradients, summed over a warp's channels) and the linrec streaming
// backward (a per-step time constant's gradient, summed over the warp's lanes). Compiled
// for the CPU emulator too (test/emu: its __shfl_xor_sync).
#ifndef FX_CUDA_WARP_SUM_CUH
#define FX_CUDA_WARP_SUM_CUH

#include "cuda/common.cuh"

namespace fx::cuda::warp {

// One round for the lane bit M, COUNT values still held, then the rounds of
// the lower bits down to LOM. Every count is a compile-time constant, so
// that v stays in registers.
template <int COUNT, int M, int LOM, int V>
__device__ __forceinline__ void transpose_rounds(float (&v)[V], int lane, int &index)
{
    if constexpr (COUNT > 1) {
        constexpr int HALF = COUNT / 2;
        const bool upper = (lane & M) != 0;
#pragma unroll
        for (int j = 0; j < HALF; j++) {
            const float send = upper ? v[j] : v[j + HALF], keep = upper ? v[j + HALF] : v[j];
            v[j] = keep + __shfl_xor_sync(0xffffffffu, send, M);
        }
        index += upper ? HALF : 0;
    } else {
        v[0] += __shfl_xor_sync(0xffffffffu, v[0], M);
    }
    if constexpr (M > LOM)
        transpose_rounds<(COUNT > 1 ? COUNT / 2 : 1), M / 2, LOM>(v, lane, index);
}

// Sums each of the V values of a lane (V a power of two <= 32) over the
// lanes that differ from it in lane bits LO..4 (none for LO = 5: a channel
// that fills the warp). Afterwards the lane holds
// max(1, V >> (5 - LO)) sums in v[0], v[1], ...: those of the values
// numbered index, index + 1, ..., which it returns. Lanes that differ only
// in bits below LO hold the same sums.
template <int V, int LO> __device__ __forceinline__ int transpose_sum(float (&v)[V], int lane)
{
    static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0 && LO >= 0 && LO <= 5, "a power of two up to 32");
    int index = 0;
    if constexpr (LO < 5)
        transpose_rounds<V, 16, 1 << LO>(v, lane, index);
    return index;
}

} // namespace fx::cuda::warp

#endif
