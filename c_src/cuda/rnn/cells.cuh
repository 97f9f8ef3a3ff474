// The GRU's and the LSTM's pointwise maths (include/fusex_rnn.h), forward
// and backward, in f32, shared by the stepwise and the persistent kernels.
// libm's expf and tanhf (a few ulp), not the MUFU approximations: an f32
// recurrence of dozens of steps compounds each step's error, and the f32
// outputs are held to 1e-5 of the f64 oracle.
#ifndef FX_CUDA_RNN_CELLS_CUH
#define FX_CUDA_RNN_CELLS_CUH

#include "cuda/common.cuh"
#include "fusex_rnn.h"

namespace fx::cuda::rnn {

constexpr int kMaxGates = 4;

// fx_rnn_gates and fx_rnn_saved_width (fusex_rnn.h), for device code too.
__host__ __device__ __forceinline__ int gates_of(int cell) { return cell == FX_RNN_LSTM ? 4 : 3; }
__host__ __device__ __forceinline__ int64_t saved_width(int cell, int64_t hidden)
{
    return (cell == FX_RNN_LSTM ? 6 : 5) * hidden;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// One unit of one batch row: ax, ah are the gate pre-activations of the
// input and the hidden side (biases included), in gate order. Gives h_t
// and, for the LSTM, updates c; `save` (or nullptr) gets the saved row's
// values of this unit, one per gate block (fx_rnn_saved_width's layout,
// h_t excluded), at a stride of `stride` floats.
__device__ __forceinline__ float cell_forward(int cell, const float *ax, const float *ah, float hp, float &c,
                                              float *save, int64_t stride)
{
    if (cell == FX_RNN_GRU) {
        const float r = sigmoid(ax[0] + ah[0]);
        const float z = sigmoid(ax[1] + ah[1]);
        const float n = tanhf(ax[2] + r * ah[2]);
        if (save) {
            save[0] = r;
            save[stride] = z;
            save[2 * stride] = n;
            save[3 * stride] = ah[2];
        }
        return (1.f - z) * n + z * hp;
    }
    const float i = sigmoid(ax[0] + ah[0]);
    const float f = sigmoid(ax[1] + ah[1]);
    const float g = tanhf(ax[2] + ah[2]);
    const float o = sigmoid(ax[3] + ah[3]);
    c = f * c + i * g;
    if (save) {
        save[0] = i;
        save[stride] = f;
        save[2 * stride] = g;
        save[3 * stride] = o;
        save[4 * stride] = c;
    }
    return o * tanhf(c);
}

// The backward of one unit at one step. g: dL/dh_t in total; `saved`
// points at the unit's first saved value (gate blocks `stride` apart); hp,
// cp: h_{t-1}, c_{t-1}; dc: the LSTM's dL/dc_t carried from step t + 1,
// updated to dL/dc_{t-1}. Gives the gradients of the input side's
// pre-activations (dax) and of the hidden side's (dah, which W_hh^T turns
// into dh_{t-1}), and returns what reaches h_{t-1} directly (the GRU's
// z g; the LSTM's h_t depends on h_{t-1} through its gates alone).
__device__ __forceinline__ float cell_backward(int cell, float g, const float *saved, int64_t stride, float hp,
                                               float cp, float &dc, float *dax, float *dah)
{
    if (cell == FX_RNN_GRU) {
        const float r = saved[0], z = saved[stride], n = saved[2 * stride], hn = saved[3 * stride];
        const float dn = g * (1.f - z), dz = g * (hp - n);
        const float dan = dn * (1.f - n * n);
        const float dar = dan * hn * r * (1.f - r);
        const float daz = dz * z * (1.f - z);
        dax[0] = dah[0] = dar;
        dax[1] = dah[1] = daz;
        dax[2] = dan;
        dah[2] = dan * r;
        return g * z;
    }
    const float i = saved[0], f = saved[stride], gg = saved[2 * stride], o = saved[3 * stride];
    const float c = saved[4 * stride];
    const float tc = tanhf(c);
    const float dct = dc + g * o * (1.f - tc * tc);
    dax[0] = dct * gg * i * (1.f - i);
    dax[1] = dct * cp * f * (1.f - f);
    dax[2] = dct * i * (1.f - gg * gg);
    dax[3] = g * tc * o * (1.f - o);
    for (int q = 0; q < 4; q++)
        dah[q] = dax[q];
    dc = dct * f;
    return 0.f;
}

} // namespace fx::cuda::rnn

#endif
