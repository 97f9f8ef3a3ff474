// The general path of the GRU and LSTM layers, for any hidden size: per
// time step a GEMM (h_{t-1} W_hh^T forward, dah_t W_hh backward, through
// blas.cuh) and one of these pointwise kernels; and the small kernels both
// paths share (states in and out, rows gathered for a GEMM, the bias
// gradients' column sums).
#ifndef FX_CUDA_RNN_STEPWISE_CUH
#define FX_CUDA_RNN_STEPWISE_CUH

#include "cuda/common.cuh"
#include "cuda/rnn/cells.cuh"

namespace fx::cuda::rnn {

// One forward step of one layer, after the GEMM that formed gh.
struct GateStep {
    int cell;
    int64_t batch, seqlen, hidden, t;
    const float *gx; // [batch, seqlen, G*hidden]: x W_ih^T (no bias)
    const float *gh; // [batch, G*hidden]: h_{t-1} W_hh^T (no bias)
    const void *b_ih, *b_hh; // [G*hidden] or nullptr
    int b_ih_type, b_hh_type;
    float *h;        // [batch, hidden]: h_{t-1} in, h_t out
    void *h_ab;      // the same in T for the next GEMM (nullptr for f32: it reads h)
    float *c;        // [batch, hidden] (LSTM): in place
    void *out;       // [batch, seqlen, hidden] of T, or nullptr
    float *saved;    // the layer's [batch, seqlen, saved width], or nullptr
    float *h_n, *c_n; // [batch, hidden] written at the last step, or nullptr
};

template <typename T> __global__ void gate_step(const GateStep p)
{
    const int64_t H = p.hidden, G = gates_of(p.cell), n = p.batch * H;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / H, j = i % H, row = b * p.seqlen + p.t;
        float ax[kMaxGates], ah[kMaxGates];
        for (int q = 0; q < G; q++) {
            ax[q] = p.gx[row * G * H + q * H + j] + (p.b_ih ? load_any(p.b_ih, p.b_ih_type, q * H + j) : 0.f);
            ah[q] = p.gh[b * G * H + q * H + j] + (p.b_hh ? load_any(p.b_hh, p.b_hh_type, q * H + j) : 0.f);
        }
        const int64_t S = saved_width(p.cell, H);
        float *save = p.saved ? p.saved + row * S + j : nullptr;
        float c = p.cell == FX_RNN_LSTM ? p.c[i] : 0.f;
        const float h = cell_forward(p.cell, ax, ah, p.h[i], c, save, H);
        p.h[i] = h;
        if (p.h_ab)
            static_cast<T *>(p.h_ab)[i] = Elem<T>::store(h);
        if (p.cell == FX_RNN_LSTM)
            p.c[i] = c;
        if (save)
            save[S - H] = h;
        if (p.out)
            static_cast<T *>(p.out)[row * H + j] = Elem<T>::store(h);
        if (p.t == p.seqlen - 1) {
            if (p.h_n)
                p.h_n[i] = h;
            if (p.c_n)
                p.c_n[i] = c;
        }
    }
}

// One backward step of one layer, before the GEMM dhc += dah_t W_hh.
struct GradStep {
    int cell;
    int64_t batch, seqlen, hidden, t;
    const float *saved;       // the layer's [batch, seqlen, saved width]
    const void *h0, *c0;      // the layer's [batch, hidden], or nullptr
    int h0_type, c0_type;
    const void *dout;         // the layer output's gradient [batch, seqlen, hidden], or nullptr
    int dout_type;            // FX_F32 (a buffer of the layer above) or T's (dy)
    float *dhc;               // [batch, hidden]: what reaches h_t from later; out: h_{t-1}'s direct part
    float *dcc;               // [batch, hidden] (LSTM): dL/dc carried
    void *dax, *dah;          // [batch, seqlen, G*hidden] of T (dah nullptr for the LSTM: it is dax)
    void *hprev;              // [batch, seqlen, hidden] of T: h_{t-1}, for dW_hh
    // [batch, G*hidden]: dah_t in f32 for the recurrent GEMM of a 16-bit T
    // (whose gradients, shrinking over the steps back, would flush to zero
    // in f16), or nullptr (f32: the GEMM reads dah)
    float *dah32;
};

template <typename T> __global__ void grad_step(const GradStep p)
{
    const int64_t H = p.hidden, G = gates_of(p.cell), n = p.batch * H, S = saved_width(p.cell, H);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / H, j = i % H, row = b * p.seqlen + p.t;
        const float g = p.dhc[i] + (p.dout ? load_any(p.dout, p.dout_type, row * H + j) : 0.f);
        const float *saved = p.saved + row * S + j;
        const float hp = p.t > 0 ? saved[-S + S - H] : p.h0 ? load_any(p.h0, p.h0_type, i) : 0.f;
        float cp = 0.f, dc = 0.f;
        if (p.cell == FX_RNN_LSTM) {
            cp = p.t > 0 ? saved[-S + 4 * H] : p.c0 ? load_any(p.c0, p.c0_type, i) : 0.f;
            dc = p.dcc[i];
        }
        float dax[kMaxGates], dah[kMaxGates];
        const float direct = cell_backward(p.cell, g, saved, H, hp, cp, dc, dax, dah);
        T *dx = static_cast<T *>(p.dax) + row * G * H + j;
        T *dh = p.dah ? static_cast<T *>(p.dah) + row * G * H + j : nullptr;
        for (int q = 0; q < G; q++) {
            dx[q * H] = Elem<T>::store(dax[q]);
            if (dh)
                dh[q * H] = Elem<T>::store(dah[q]);
            if (p.dah32)
                p.dah32[b * G * H + q * H + j] = dah[q];
        }
        static_cast<T *>(p.hprev)[row * H + j] = Elem<T>::store(hp);
        p.dhc[i] = direct;
        if (p.cell == FX_RNN_LSTM)
            p.dcc[i] = dc;
    }
}

// dst[i] = src[i] (any float type) or 0, as f32; `ab` (or nullptr) gets
// the same in T.
template <typename T>
__global__ void load_state(float *dst, void *ab, const void *src, int src_type, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = src ? load_any(src, src_type, i) : 0.f;
        if (dst)
            dst[i] = v;
        if (ab)
            static_cast<T *>(ab)[i] = Elem<T>::store(v);
    }
}

// dst[i] = src[i] of T, as f32.
template <typename T> __global__ void widen(float *dst, const T *src, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = Elem<T>::load(src[i]);
}

// dst[i] (any float type) = src[i].
template <int = 0> __global__ void store_state(void *dst, int dst_type, const float *src, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        store_any(dst, dst_type, i, src[i]);
}

// rows of `width` f32 values `ld` apart, gathered into [rows][width] of T.
template <typename T>
__global__ void gather_rows(T *dst, const float *src, int64_t rows, int64_t width, int64_t ld)
{
    const int64_t n = rows * width;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = Elem<T>::store(src[i / width * ld + i % width]);
}

} // namespace fx::cuda::rnn

#endif
