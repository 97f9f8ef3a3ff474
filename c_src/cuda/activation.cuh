// The pointwise activations (include/fusex_activation.h) and their
// derivatives in f32, for the kernels that apply them after a product (the
// blas epilogues, the linear layers' backward) or a convolution.
#ifndef FX_CUDA_ACTIVATION_CUH
#define FX_CUDA_ACTIVATION_CUH

#include "cuda/common.cuh"
#include "fusex_activation.h"

namespace fx::cuda::act {

constexpr float kGeluK0 = 0.7978845608028654f; // sqrt(2 / pi)
constexpr float kGeluK1 = 0.044715f;

__device__ __forceinline__ float sigmoid(float u) { return 1.0f / (1.0f + expf(-u)); }

__device__ __forceinline__ float silu(float u) { return u * sigmoid(u); }

__device__ __forceinline__ float silu_grad(float u)
{
    const float s = sigmoid(u);
    return s * (1.0f + u * (1.0f - s));
}

__device__ __forceinline__ float gelu(float u)
{
    return 0.5f * u * (1.0f + tanhf(kGeluK0 * (u + kGeluK1 * u * u * u)));
}

__device__ __forceinline__ float gelu_grad(float u)
{
    const float t = tanhf(kGeluK0 * (u + kGeluK1 * u * u * u));
    return 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * kGeluK0 * (1.0f + 3.0f * kGeluK1 * u * u);
}

// act(u) for an fx_activation.
__device__ __forceinline__ float apply(int activation, float u)
{
    switch (activation) {
    case FX_ACT_RELU: return u > 0.0f ? u : 0.0f;
    case FX_ACT_GELU: return gelu(u);
    case FX_ACT_SILU: return silu(u);
    case FX_ACT_TANH: return tanhf(u);
    case FX_ACT_SIGMOID: return sigmoid(u);
    default: return u;
    }
}

// Whether act'(u) is a function of act(u) alone (none, relu, tanh,
// sigmoid): a backward then needs only the output, not the pre-activation.
static inline bool grad_from_output(int activation)
{
    return activation != FX_ACT_GELU && activation != FX_ACT_SILU;
}

// act'(u) from the output y = act(u), for grad_from_output activations.
__device__ __forceinline__ float grad_at_output(int activation, float y)
{
    switch (activation) {
    case FX_ACT_RELU: return y > 0.0f ? 1.0f : 0.0f;
    case FX_ACT_TANH: return 1.0f - y * y;
    case FX_ACT_SIGMOID: return y * (1.0f - y);
    default: return 1.0f;
    }
}

// act'(u) from the pre-activation u (every activation).
__device__ __forceinline__ float grad_at_input(int activation, float u)
{
    switch (activation) {
    case FX_ACT_RELU: return u > 0.0f ? 1.0f : 0.0f;
    case FX_ACT_GELU: return gelu_grad(u);
    case FX_ACT_SILU: return silu_grad(u);
    case FX_ACT_TANH: {
        const float t = tanhf(u);
        return 1.0f - t * t;
    }
    case FX_ACT_SIGMOID: {
        const float s = sigmoid(u);
        return s * (1.0f - s);
    }
    default: return 1.0f;
    }
}

} // namespace fx::cuda::act

#endif
