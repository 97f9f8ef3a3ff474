// Causal depthwise conv1d kernels (include/fusex_conv.h says what they
// compute). Memory-bound: each thread owns V channels (a pack of 4 where
// the channels and every row tensor allow it) of one sequence over a chunk
// of time, and walks it keeping the last inputs in registers, so x is read
// once (and a window's worth more at the chunk's start) and y written once.
// Widths up to WMAX (4, or 16) share a kernel: every register array is
// indexed by compile-time positions and the width only switches taps on
// and off (predicated), never an index.
//
//   xh[m]   = x_{t-m}, m < WMAX: the history; tap m of the reversed weights
//             wr[m] = w[d, width-1-m] multiplies it
//   y_t     = act(bias + sum_{m < width} wr[m] * xh[m])
//
// The backward, with g_s = dy_s * act'(pre_s) for s < seqlen (0 after):
//   dx_t    = sum_{m < width} wr[m] * g_{t+m}   (+ the final state's gradient)
//   dw[k]   = sum_s g_s * x_{s-(width-1)+k},  dbias = sum_s g_s
// walks s over its chunk and WMAX - 1 steps past it: slot q of dxw holds
// dx_{s-q}, which g_s adds wr[q] to; the slot leaving at q = WMAX - 1 is
// complete (its last term came width - 1 <= WMAX - 1 steps after it). The
// slots that leave before the chunk are the initial state's gradient (the
// first chunk) or another chunk's (discarded). dw and dbias are summed in
// registers over the chunk and written as one row of partial sums per
// (sequence, chunk); launch_sums adds them in that order.
#ifndef FX_CUDA_CONV_KERNELS_CUH
#define FX_CUDA_CONV_KERNELS_CUH

#include "cuda/activation.cuh"
#include "cuda/common.cuh"
#include "cuda/pack.cuh"

namespace fx::cuda::conv {

constexpr int kThreads = 128;       // channel packs a block
constexpr int64_t kFwdChunk = 32;   // steps a forward thread (a few waves of blocks)
constexpr int64_t kBwdChunk = 128;  // steps a backward thread (its partial sums' row)
constexpr int kFwdUnroll = 8;       // inputs loaded ahead
constexpr int kBwdUnroll = 4;

struct Params {
    const void *x, *w, *bias, *init, *dy, *dfinal;
    void *y, *final_state, *dx, *dinit;
    float *dw_part, *db_part; // [sequence * chunks + chunk][dim][width], [..][dim]
    int w_type, bias_type;
    int64_t batch, seqlen, dim;
    int width;
    int64_t chunk, chunks, chan_blocks;
    bool silu;
};

// Where a block's threads are: sequence b, chunk c, first channel d0.
struct Place {
    int64_t b, c, d0;
};

template <int V> __device__ __forceinline__ Place place_of(const Params &p)
{
    const int64_t blk = blockIdx.x;
    const int64_t cb = blk % p.chan_blocks, rest = blk / p.chan_blocks;
    Place at;
    at.c = rest % p.chunks;
    at.b = rest / p.chunks;
    at.d0 = (cb * kThreads + threadIdx.x) * V;
    return at;
}

template <typename T> __device__ __forceinline__ float state_at(const void *state, int64_t i)
{
    return Elem<T>::load(static_cast<const T *>(state)[i]);
}

// x_t for the V channels from d0 of sequence b (t < 0: the initial state's,
// or zero).
template <typename T, int V> __device__ __forceinline__ void input_at(const Params &p, int64_t b, int64_t t, int64_t d0,
                                                                      float (&out)[V])
{
    if (t >= 0) {
        load_pack<T, V>(static_cast<const T *>(p.x), (b * p.seqlen + t) * p.dim + d0, out);
        return;
    }
#pragma unroll
    for (int v = 0; v < V; v++)
        out[v] = p.init ? state_at<T>(p.init, ((b * p.dim + d0 + v) * (p.width - 1)) + (t + p.width - 1)) : 0.0f;
}

// The reversed taps wr[m] = w[d, width-1-m] (0 past the width) and the bias.
template <int WMAX, int V>
__device__ __forceinline__ void load_taps(const Params &p, int64_t d0, float (&wr)[WMAX][V], float (&bias)[V])
{
#pragma unroll
    for (int m = 0; m < WMAX; m++)
#pragma unroll
        for (int v = 0; v < V; v++)
            wr[m][v] = m < p.width ? load_any(p.w, p.w_type, (d0 + v) * p.width + (p.width - 1 - m)) : 0.0f;
#pragma unroll
    for (int v = 0; v < V; v++)
        bias[v] = p.bias ? load_any(p.bias, p.bias_type, d0 + v) : 0.0f;
}

// The history before t0, placed so that shifting x_{t0} in completes it:
// xh[i] = x_{t0-1-i} for the taps the width uses.
template <typename T, int WMAX, int V>
__device__ __forceinline__ void load_history(const Params &p, int64_t b, int64_t t0, int64_t d0, float (&xh)[WMAX][V])
{
#pragma unroll
    for (int i = 0; i < WMAX; i++) {
        if (i < WMAX - 1 && i < p.width - 1) {
            input_at<T, V>(p, b, t0 - 1 - i, d0, xh[i]);
        } else {
#pragma unroll
            for (int v = 0; v < V; v++)
                xh[i][v] = 0.0f;
        }
    }
}

template <int WMAX, int V> __device__ __forceinline__ void shift_in(float (&xh)[WMAX][V], const float (&x)[V])
{
#pragma unroll
    for (int m = WMAX - 1; m > 0; m--)
#pragma unroll
        for (int v = 0; v < V; v++)
            xh[m][v] = xh[m - 1][v];
#pragma unroll
    for (int v = 0; v < V; v++)
        xh[0][v] = x[v];
}

template <int WMAX, int V>
__device__ __forceinline__ float pre_of(const float (&wr)[WMAX][V], const float (&xh)[WMAX][V], float bias, int width, int v)
{
    float acc = bias;
#pragma unroll
    for (int m = 0; m < WMAX; m++)
        if (m < width)
            acc = fmaf(wr[m][v], xh[m][v], acc);
    return acc;
}

template <typename T, int WMAX, int V> __global__ void __launch_bounds__(kThreads) forward_kernel(const Params p)
{
    const Place at = place_of<V>(p);
    if (at.d0 >= p.dim)
        return;
    float wr[WMAX][V], bias[V], xh[WMAX][V];
    load_taps<WMAX, V>(p, at.d0, wr, bias);
    const int64_t t0 = at.c * p.chunk, t1 = t0 + p.chunk < p.seqlen ? t0 + p.chunk : p.seqlen;
    load_history<T, WMAX, V>(p, at.b, t0, at.d0, xh);
    const int64_t row0 = at.b * p.seqlen;
    for (int64_t tb = t0; tb < t1; tb += kFwdUnroll) {
        float cur[kFwdUnroll][V];
#pragma unroll
        for (int u = 0; u < kFwdUnroll; u++)
            if (tb + u < t1)
                load_pack<T, V>(static_cast<const T *>(p.x), (row0 + tb + u) * p.dim + at.d0, cur[u]);
#pragma unroll
        for (int u = 0; u < kFwdUnroll; u++) {
            if (tb + u >= t1)
                break;
            shift_in<WMAX, V>(xh, cur[u]);
            float out[V];
#pragma unroll
            for (int v = 0; v < V; v++) {
                const float pre = pre_of<WMAX, V>(wr, xh, bias[v], p.width, v);
                out[v] = p.silu ? act::silu(pre) : pre;
            }
            store_pack<T, V>(static_cast<T *>(p.y), (row0 + tb + u) * p.dim + at.d0, out);
        }
    }
    // the last width-1 inputs, oldest first: xh[m] = x_{seqlen-1-m}
    if (p.final_state && t1 == p.seqlen) {
#pragma unroll
        for (int m = 0; m < WMAX - 1; m++)
            if (m <= p.width - 2)
#pragma unroll
                for (int v = 0; v < V; v++)
                    static_cast<T *>(p.final_state)[(at.b * p.dim + at.d0 + v) * (p.width - 1) + (p.width - 2 - m)] =
                        Elem<T>::store(xh[m][v]);
    }
}

// dx_t (or the initial state's gradient, t < 0) out of the window, with
// what reached it through the final state.
template <typename T, int V>
__device__ __forceinline__ void emit_dx(const Params &p, const Place &at, int64_t t, int64_t t0, int64_t t1, float (&dx)[V])
{
    const int W = p.width;
    const bool mine = t >= t0 && t < t1, initial = at.c == 0 && t < 0 && t >= -(W - 1) && p.dinit;
    if (!mine && !initial)
        return;
    const int64_t k = t - (p.seqlen - (W - 1)); // the final state's slot holding x_t
    if (p.dfinal && k >= 0 && k < W - 1)
#pragma unroll
        for (int v = 0; v < V; v++)
            dx[v] += state_at<T>(p.dfinal, (at.b * p.dim + at.d0 + v) * (W - 1) + k);
    if (mine) {
        store_pack<T, V>(static_cast<T *>(p.dx), (at.b * p.seqlen + t) * p.dim + at.d0, dx);
        return;
    }
#pragma unroll
    for (int v = 0; v < V; v++)
        static_cast<T *>(p.dinit)[(at.b * p.dim + at.d0 + v) * (W - 1) + (t + W - 1)] = Elem<T>::store(dx[v]);
}

template <typename T, int WMAX, int V> __global__ void __launch_bounds__(kThreads, 4) backward_kernel(const Params p)
{
    const Place at = place_of<V>(p);
    if (at.d0 >= p.dim)
        return;
    const int W = p.width;
    float wr[WMAX][V], bias[V], xh[WMAX][V], dxw[WMAX][V], dwr[WMAX][V], db[V];
    load_taps<WMAX, V>(p, at.d0, wr, bias);
    const int64_t t0 = at.c * p.chunk, t1 = t0 + p.chunk < p.seqlen ? t0 + p.chunk : p.seqlen;
    load_history<T, WMAX, V>(p, at.b, t0, at.d0, xh);
#pragma unroll
    for (int m = 0; m < WMAX; m++)
#pragma unroll
        for (int v = 0; v < V; v++)
            dxw[m][v] = dwr[m][v] = 0.0f;
#pragma unroll
    for (int v = 0; v < V; v++)
        db[v] = 0.0f;
    const int64_t row0 = at.b * p.seqlen, s_end = t1 + WMAX - 1;
    for (int64_t sb = t0; sb < s_end; sb += kBwdUnroll) {
        float xs[kBwdUnroll][V], dys[kBwdUnroll][V];
#pragma unroll
        for (int u = 0; u < kBwdUnroll; u++) {
            const int64_t s = sb + u;
            if (s < s_end && s < p.seqlen) {
                load_pack<T, V>(static_cast<const T *>(p.x), (row0 + s) * p.dim + at.d0, xs[u]);
                load_pack<T, V>(static_cast<const T *>(p.dy), (row0 + s) * p.dim + at.d0, dys[u]);
            } else {
#pragma unroll
                for (int v = 0; v < V; v++)
                    xs[u][v] = dys[u][v] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < kBwdUnroll; u++) {
            const int64_t s = sb + u;
            if (s >= s_end)
                break;
            shift_in<WMAX, V>(xh, xs[u]);
            float g[V];
#pragma unroll
            for (int v = 0; v < V; v++) {
                g[v] = dys[u][v];
                if (p.silu && s < p.seqlen)
                    g[v] *= act::silu_grad(pre_of<WMAX, V>(wr, xh, bias[v], W, v));
            }
            if (s < t1) {
#pragma unroll
                for (int v = 0; v < V; v++) {
                    db[v] += g[v];
#pragma unroll
                    for (int m = 0; m < WMAX; m++)
                        if (m < W)
                            dwr[m][v] = fmaf(g[v], xh[m][v], dwr[m][v]);
                }
            }
            // slot q holds dx_{s-q}: g_s adds wr[q] to it
#pragma unroll
            for (int q = 0; q < WMAX; q++)
                if (q < W)
#pragma unroll
                    for (int v = 0; v < V; v++)
                        dxw[q][v] = fmaf(wr[q][v], g[v], dxw[q][v]);
            emit_dx<T, V>(p, at, s - (WMAX - 1), t0, t1, dxw[WMAX - 1]);
#pragma unroll
            for (int q = WMAX - 1; q > 0; q--)
#pragma unroll
                for (int v = 0; v < V; v++)
                    dxw[q][v] = dxw[q - 1][v];
#pragma unroll
            for (int v = 0; v < V; v++)
                dxw[0][v] = 0.0f;
        }
    }
    // this (sequence, chunk)'s row of partial sums; dwr[m] is tap width-1-m
    const int64_t part = at.b * p.chunks + at.c;
#pragma unroll
    for (int m = 0; m < WMAX; m++)
        if (m < W)
#pragma unroll
            for (int v = 0; v < V; v++)
                p.dw_part[(part * p.dim + at.d0 + v) * W + (W - 1 - m)] = dwr[m][v];
    if (p.db_part)
#pragma unroll
        for (int v = 0; v < V; v++)
            p.db_part[part * p.dim + at.d0 + v] = db[v];
}

// One step: thread i of batch * dim, state [batch, dim, width-1] in place.
struct StepParams {
    void *state;
    const void *x, *w, *bias;
    void *y;
    int w_type, bias_type;
    int64_t rows, dim;
    int width;
    bool silu;
};

template <typename T> __global__ void step_kernel(const StepParams p)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < p.rows; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t d = i % p.dim, base = i * (p.width - 1);
        T *state = static_cast<T *>(p.state);
        const float x = Elem<T>::load(static_cast<const T *>(p.x)[i]);
        float acc = p.bias ? load_any(p.bias, p.bias_type, d) : 0.0f;
        for (int k = 0; k < p.width - 1; k++)
            acc = fmaf(load_any(p.w, p.w_type, d * p.width + k), Elem<T>::load(state[base + k]), acc);
        acc = fmaf(load_any(p.w, p.w_type, d * p.width + p.width - 1), x, acc);
        static_cast<T *>(p.y)[i] = Elem<T>::store(p.silu ? act::silu(acc) : acc);
        for (int k = 0; k + 1 < p.width - 1; k++)
            state[base + k] = state[base + k + 1];
        if (p.width > 1)
            state[base + p.width - 2] = Elem<T>::store(x);
    }
}

} // namespace fx::cuda::conv

#endif
