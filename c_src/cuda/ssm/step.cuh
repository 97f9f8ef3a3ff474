// The selective scan's single step: one frame on a resident state.
#ifndef FX_CUDA_SSM_STEP_CUH
#define FX_CUDA_SSM_STEP_CUH

#include "cuda/ssm/params.cuh"

namespace fx::cuda::ssm {

// ---- single step ----

// One group of LANES lanes per (batch, channel); a block's channels are
// of one batch element (step_grid), so that a lane finds its channel with
// one 32-bit division of the block's index instead of a 64-bit one of its
// own (on the path to the loads: the frame's latency). Every load is
// issued before the first store (the compiler cannot tell that the state
// does not alias the inputs, and would otherwise wait for each load in
// turn).
template <class C> __host__ __device__ inline unsigned step_row_blocks(int dim)
{
    constexpr int per_block = kThreads / C::LANES;
    return ((unsigned)dim + per_block - 1) / per_block;
}

template <typename T, class C>
__global__ void __launch_bounds__(kThreads) ssm_step_kernel(const StepParams p)
{
    constexpr int NPL = C::NPL;
    const int q = threadIdx.x % C::LANES;
    const unsigned row_blocks = step_row_blocks<C>(p.dim), b = blockIdx.x / row_blocks;
    const int d = (int)(blockIdx.x - b * row_blocks) * (kThreads / C::LANES) + (int)threadIdx.x / C::LANES;
    const bool ok = d < p.dim;
    const int64_t ch = (int64_t)b * p.dim + d; // b * dim + d
    const int64_t row = ((int64_t)b * p.groups + (p.groups == 1 ? 0 : d / p.cpg)) * p.dstate;
    const float x = ok ? ld<T>(p.x, ch) : 0.0f;
    const float u = ok ? ld<T>(p.dt, ch) + (p.dt_bias ? load_any(p.dt_bias, p.bias_type, d) : 0.0f) : 0.0f;
    const float zv = ok && p.z ? ld<T>(p.z, ch) : 0.0f;
    const float dskip = ok && p.d ? load_any(p.d, p.d_type, d) : 0.0f;
    float h[NPL], a2[NPL], bv[NPL], cv[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int n = state_of<C>(q, i);
        const bool nok = ok && n < p.dstate;
        h[i] = nok ? p.state[ch * p.dstate + n] : 0.0f;
        a2[i] = nok ? load_any(p.a, p.a_type, (int64_t)d * p.dstate + n) * kLog2e : 0.0f;
        bv[i] = nok ? ld<T>(p.b, row + n) : 0.0f;
        cv[i] = nok ? ld<T>(p.c, row + n) : 0.0f;
    }
    const float delta = ok ? (p.softplus ? softplus(u) : u) : 0.0f, dx = delta * x;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        h[i] = fmaf(fast_exp2(delta * a2[i]), h[i], dx * bv[i]);
        acc = fmaf(cv[i], h[i], acc);
    }
#pragma unroll
    for (int i = 0; i < NPL; i++)
        if (ok && state_of<C>(q, i) < p.dstate)
            p.state[ch * p.dstate + state_of<C>(q, i)] = h[i];
    acc = lane_sum<C::LANES>(acc);
    if (ok && q == 0) {
        const float y = acc + dskip * x;
        static_cast<T *>(p.y)[ch] = Elem<T>::store(p.z ? y * silu(zv) : y);
    }
}

} // namespace fx::cuda::ssm

#endif
