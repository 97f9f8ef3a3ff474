// The linear recurrences' single step: one frame, elementwise.
#ifndef FX_CUDA_LINREC_STEP_CUH
#define FX_CUDA_LINREC_STEP_CUH

#include "cuda/linrec/ops.cuh"

namespace fx::cuda::linrec {

// ---- step: one frame, elementwise ----

struct StepParams {
    OpParams in; // seq [batch, hidden]; dt [batch, 1]
    void *state;
    int state_f32;
    void *h;
    int64_t batch, hidden;
};

template <int KIND, typename T, bool CG>
__global__ void step_kernel(const StepParams p)
{
    constexpr int N = nseq<KIND>();
    const int64_t n = p.batch * p.hidden;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / p.hidden, hc = i - b * p.hidden;
        float xs[3] = {0.f, 0.f, 0.f};
#pragma unroll
        for (int k = 0; k < N; k++)
            xs[k] = Elem<T>::load(static_cast<const T *>(p.in.seq[k])[i]);
        Chan c[1];
        load_chan<KIND, T, 1>(p.in, hc, true, c);
        Affine m = coeff<KIND, CG>(xs, c[0], load_dt<KIND, T>(p.in, b));
        float h = fx::cuda::scan::apply(m, fx::cuda::scan::load_state<T>(p.state, p.state_f32, i));
        fx::cuda::scan::store_state<T>(p.state, p.state_f32, i, h);
        static_cast<T *>(p.h)[i] = Elem<T>::store(h);
    }
}

} // namespace fx::cuda::linrec

#endif
