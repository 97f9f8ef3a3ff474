// Multi-tensor AdamW and SGD steps. The op layer hands over one table of
// tensor slots and a flat work list (chunk k = FX_OPTIM_CHUNK elements of
// tensor chunk_tensor[k]), both resident in device memory. A step is:
//
//   norm pass (only with clipping or the non-finite check): each block sums
//     the squares (f64) of its chunks' gradients and notes any Inf/NaN; the
//     last block to finish (an atomic counter) adds the per-block partials in
//     block order, so the norm is the same bits on every run, and writes the
//     norm, the skip verdict and the clip factor for the update pass;
//   update pass: each block takes the step count from the device (t = step
//     + 1), derives the bias corrections in f64, updates its chunks (16-byte
//     vectors where every array is aligned, scalars otherwise) and the last
//     block to finish stores t. A skipped step returns before touching
//     anything, so no byte changes.
//
// Nothing is read back to the host: the step only enqueues work.
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/families.h"
#include "cuda/launch.cuh"
#include "fusex_optim.h"

namespace fx::cuda::optim {
namespace {

// Threads and warps a block of both passes.
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// ---- vectors of 4 elements: float4 for f32, 8 bytes for 16-bit types ----

template <typename T> __device__ __forceinline__ void load4(const T *p, float out[4]);
template <typename T> __device__ __forceinline__ void store4(T *p, const float in[4]);

template <> __device__ __forceinline__ void load4<float>(const float *p, float out[4])
{
    float4 v = *reinterpret_cast<const float4 *>(p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
}

template <> __device__ __forceinline__ void store4<float>(float *p, const float in[4])
{
    *reinterpret_cast<float4 *>(p) = make_float4(in[0], in[1], in[2], in[3]);
}

template <typename Pair> __device__ __forceinline__ Pair pair_from_bits(unsigned bits)
{
    Pair pair;
    memcpy(&pair, &bits, sizeof pair);
    return pair;
}

template <typename Pair> __device__ __forceinline__ unsigned bits_of(Pair pair)
{
    unsigned bits;
    memcpy(&bits, &pair, sizeof bits);
    return bits;
}

template <> __device__ __forceinline__ void load4<__nv_bfloat16>(const __nv_bfloat16 *p, float out[4])
{
    uint2 raw = *reinterpret_cast<const uint2 *>(p);
    float2 lo = __bfloat1622float2(pair_from_bits<__nv_bfloat162>(raw.x));
    float2 hi = __bfloat1622float2(pair_from_bits<__nv_bfloat162>(raw.y));
    out[0] = lo.x, out[1] = lo.y, out[2] = hi.x, out[3] = hi.y;
}

template <> __device__ __forceinline__ void store4<__nv_bfloat16>(__nv_bfloat16 *p, const float in[4])
{
    uint2 raw;
    raw.x = bits_of(__floats2bfloat162_rn(in[0], in[1]));
    raw.y = bits_of(__floats2bfloat162_rn(in[2], in[3]));
    *reinterpret_cast<uint2 *>(p) = raw;
}

template <> __device__ __forceinline__ void load4<__half>(const __half *p, float out[4])
{
    uint2 raw = *reinterpret_cast<const uint2 *>(p);
    float2 lo = __half22float2(pair_from_bits<__half2>(raw.x));
    float2 hi = __half22float2(pair_from_bits<__half2>(raw.y));
    out[0] = lo.x, out[1] = lo.y, out[2] = hi.x, out[3] = hi.y;
}

template <> __device__ __forceinline__ void store4<__half>(__half *p, const float in[4])
{
    uint2 raw;
    raw.x = bits_of(__floats2half2_rn(in[0], in[1]));
    raw.y = bits_of(__floats2half2_rn(in[2], in[3]));
    *reinterpret_cast<uint2 *>(p) = raw;
}

// Whether 4-element vectors of T at p are naturally aligned.
template <typename T> __device__ __forceinline__ bool vec_aligned(const T *p)
{
    return ((uintptr_t)p & (4 * sizeof(T) - 1)) == 0;
}

// ---- the work list ----

struct Span {
    const fx_optim_slot *slot;
    int64_t begin; // first element of the chunk in its tensor
    int64_t len;   // 1..FX_OPTIM_CHUNK
};

__device__ __forceinline__ Span chunk_span(const fx_optim_args &a, int64_t chunk)
{
    Span s;
    s.slot = &a.dev_slots[a.dev_chunk_tensor[chunk]];
    s.begin = (chunk - s.slot->chunk_begin) * FX_OPTIM_CHUNK;
    int64_t left = s.slot->numel - s.begin;
    s.len = left < FX_OPTIM_CHUNK ? left : FX_OPTIM_CHUNK;
    return s;
}

// ---- block reductions (deterministic: fixed shuffle and warp order) ----

__device__ __forceinline__ double warp_sum(double v)
{
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}

// The block's sum, valid in thread 0. Every thread must call it; it ends
// with a barrier so the scratch can be reused by the next call.
__device__ double block_sum(double v)
{
    __shared__ double warp_sums[kWarps];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0)
        warp_sums[warp] = v;
    __syncthreads();
    double total = 0;
    if (warp == 0) {
        total = lane < kWarps ? warp_sums[lane] : 0.0;
        total = warp_sum(total);
    }
    __syncthreads();
    return total;
}

// Whether this block is the last of the grid to pass here. `counter` must
// be zero when the pass starts; the last block resets it.
__device__ __forceinline__ bool last_block_done(uint32_t *counter)
{
    __shared__ bool last;
    __syncthreads(); // the whole block is done with its work
    if (threadIdx.x == 0) {
        __threadfence(); // this block's writes are visible before it counts
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last)
        __threadfence(); // and the last block sees every other block's
    return last;
}

// ---- norm pass ----

__device__ __forceinline__ bool not_finite(float x)
{
    return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

template <typename G>
__device__ __forceinline__ void sum_squares(const G *g, int64_t len, double &sum, bool &bad)
{
    int64_t nvec = vec_aligned(g) ? len >> 2 : 0;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
        float x[4];
        load4(g + (v << 2), x);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            bad |= not_finite(x[j]);
            sum += (double)x[j] * (double)x[j];
        }
    }
    for (int64_t i = (nvec << 2) + threadIdx.x; i < len; i += blockDim.x) {
        float x = Elem<G>::load(g[i]);
        bad |= not_finite(x);
        sum += (double)x * (double)x;
    }
}

// torch.nn.utils.clip_grad_norm_: min(1, max_norm / (norm + 1e-6)), and a
// NaN norm gives a NaN factor (torch.clamp keeps NaN).
__device__ __forceinline__ double clip_factor(double max_norm, double norm)
{
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 || isnan(coef) ? coef : 1.0;
}

template <typename G> __global__ void __launch_bounds__(kThreads) norm_kernel(fx_optim_args a)
{
    double sum = 0;
    bool bad = false;
    // Backwards through the work list: the gradients read last are the
    // list's first chunks, which the update pass reads first, while they
    // are still in L2.
    for (int64_t k = blockIdx.x; k < a.nchunks; k += gridDim.x) {
        Span s = chunk_span(a, a.nchunks - 1 - k);
        sum_squares(static_cast<const G *>(s.slot->grad) + s.begin, s.len, sum, bad);
    }
    sum = block_sum(sum);
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0) {
        a.partial_sq[blockIdx.x] = sum;
        a.partial_bad[blockIdx.x] = bad;
    }
    if (!last_block_done(&a.sync->norm_blocks_done))
        return;
    double total = 0;
    bool any_bad = false;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
        total += __ldcg(&a.partial_sq[b]);
        any_bad |= __ldcg(&a.partial_bad[b]) != 0;
    }
    total = block_sum(total);
    any_bad = __syncthreads_or(any_bad);
    if (threadIdx.x == 0) {
        double norm = sqrt(total);
        bool skip = any_bad && a.hyper.skip_nonfinite;
        *a.grad_norm = (float)norm;
        *a.skipped = skip;
        a.sync->skip = skip;
        a.sync->clip_factor = a.hyper.clip ? (float)clip_factor(a.hyper.max_grad_norm, norm) : 1.0f;
        a.sync->norm_blocks_done = 0;
    }
}

// ---- update pass ----

// What one step applies to every element, derived once per block from the
// device step count (f64, then rounded: bias corrections like 1 - 0.999^t
// lose digits in f32).
struct StepCoeffs {
    int64_t t;
    float scale; // clip factor, negated to maximize
    // AdamW
    float decay; // 1 - lr * weight_decay
    float beta1, beta2, one_minus_beta1, one_minus_beta2;
    float step_size; // lr / (1 - beta1^t)
    float bc2_sqrt;  // sqrt(1 - beta2^t)
    float eps;
    // SGD
    float lr, weight_decay, momentum, one_minus_dampening;
    bool amsgrad, has_momentum, nesterov, first;
};

__device__ StepCoeffs coeffs_for(const fx_optim_args &a, int64_t t)
{
    const fx_optim_hyper &h = a.hyper;
    StepCoeffs k;
    k.t = t;
    double clip = a.prepass ? (double)a.sync->clip_factor : 1.0;
    k.scale = (float)(h.maximize ? -clip : clip);
    k.decay = (float)(1.0 - h.lr * h.weight_decay);
    k.beta1 = (float)h.beta1;
    k.beta2 = (float)h.beta2;
    k.one_minus_beta1 = (float)(1.0 - h.beta1);
    k.one_minus_beta2 = (float)(1.0 - h.beta2);
    k.step_size = (float)(h.lr / (1.0 - pow(h.beta1, (double)t)));
    k.bc2_sqrt = (float)sqrt(1.0 - pow(h.beta2, (double)t));
    k.eps = (float)h.eps;
    k.lr = (float)h.lr;
    k.weight_decay = (float)h.weight_decay;
    k.momentum = (float)h.momentum;
    k.one_minus_dampening = (float)(1.0 - h.dampening);
    k.amsgrad = h.amsgrad;
    k.has_momentum = h.momentum != 0;
    k.nesterov = h.nesterov;
    k.first = t == 1;
    return k;
}

// One element. w: the f32 weight (param or master); b0..b2: AdamW m, v,
// vmax / SGD momentum buffer.
template <fx_optim_kind KIND>
__device__ __forceinline__ void apply(const StepCoeffs &k, float g, float &w, float &b0, float &b1,
                                      float &b2)
{
    if (KIND == FX_OPTIM_ADAMW) {
        w *= k.decay;
        b0 = fmaf(k.beta1, b0, k.one_minus_beta1 * g);
        b1 = fmaf(k.beta2, b1, k.one_minus_beta2 * g * g);
        float v = b1;
        if (k.amsgrad) {
            v = b1 > b2 || b1 != b1 ? b1 : b2; // torch.maximum: NaN wins
            b2 = v;
        }
        float denom = sqrtf(v) / k.bc2_sqrt + k.eps;
        w -= k.step_size * (b0 / denom);
    } else {
        g = fmaf(k.weight_decay, w, g);
        if (k.has_momentum) {
            b0 = k.first ? g : fmaf(k.momentum, b0, k.one_minus_dampening * g);
            g = k.nesterov ? fmaf(k.momentum, b0, g) : b0;
        }
        w = fmaf(-k.lr, g, w);
    }
}

template <fx_optim_kind KIND, typename P, typename G>
__device__ void update_span(const StepCoeffs &k, const Span &s)
{
    constexpr bool MASTER = !std::is_same<P, float>::value;
    const fx_optim_slot &slot = *s.slot;
    const G *g = static_cast<const G *>(slot.grad) + s.begin;
    P *param = static_cast<P *>(slot.param) + s.begin;
    float *w = MASTER ? slot.master + s.begin : reinterpret_cast<float *>(param);
    float *b0 = slot.buf0 ? slot.buf0 + s.begin : nullptr;
    float *b1 = slot.buf1 ? slot.buf1 + s.begin : nullptr;
    float *b2 = slot.buf2 ? slot.buf2 + s.begin : nullptr;
    bool vec = vec_aligned(g) && vec_aligned(w) && (!MASTER || vec_aligned(param)) &&
               (!b0 || vec_aligned(b0)) && (!b1 || vec_aligned(b1)) && (!b2 || vec_aligned(b2));
    int64_t nvec = vec ? s.len >> 2 : 0;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
        int64_t i = v << 2;
        float gv[4], wv[4], x0[4] = {0, 0, 0, 0}, x1[4] = {0, 0, 0, 0}, x2[4] = {0, 0, 0, 0};
        load4(g + i, gv);
        load4(w + i, wv);
        if (b0)
            load4(b0 + i, x0);
        if (b1)
            load4(b1 + i, x1);
        if (b2)
            load4(b2 + i, x2);
#pragma unroll
        for (int j = 0; j < 4; j++)
            apply<KIND>(k, gv[j] * k.scale, wv[j], x0[j], x1[j], x2[j]);
        store4(w + i, wv);
        if (MASTER)
            store4(param + i, wv);
        if (b0)
            store4(b0 + i, x0);
        if (b1)
            store4(b1 + i, x1);
        if (b2)
            store4(b2 + i, x2);
    }
    for (int64_t i = (nvec << 2) + threadIdx.x; i < s.len; i += blockDim.x) {
        float x0 = b0 ? b0[i] : 0, x1 = b1 ? b1[i] : 0, x2 = b2 ? b2[i] : 0, wi = w[i];
        apply<KIND>(k, Elem<G>::load(g[i]) * k.scale, wi, x0, x1, x2);
        w[i] = wi;
        if (MASTER)
            param[i] = Elem<P>::store(wi);
        if (b0)
            b0[i] = x0;
        if (b1)
            b1[i] = x1;
        if (b2)
            b2[i] = x2;
    }
}

template <fx_optim_kind KIND, typename P, typename G>
__global__ void __launch_bounds__(kThreads) update_kernel(fx_optim_args a)
{
    // The norm pass's verdict is the same for every block: all return, and
    // nothing (not even the step count) changes.
    if (a.prepass && a.sync->skip)
        return;
    __shared__ StepCoeffs shared_k;
    if (threadIdx.x == 0)
        shared_k = coeffs_for(a, *a.step + 1);
    __syncthreads();
    const StepCoeffs k = shared_k;
    for (int64_t chunk = blockIdx.x; chunk < a.nchunks; chunk += gridDim.x)
        update_span<KIND, P, G>(k, chunk_span(a, chunk));
    // Every block read the old count above; only the last one to finish
    // may store the new one.
    if (!last_block_done(&a.sync->update_blocks_done) || threadIdx.x != 0)
        return;
    *a.step = k.t;
    if (!a.prepass) {
        *a.grad_norm = -1.0f; // not computed this step
        *a.skipped = 0;
    }
    a.sync->update_blocks_done = 0;
}

// ---- launch ----

template <typename P, typename G>
static int launch_update(const Run &r, fx_optim_kind kind, unsigned blocks, const fx_optim_args &a,
                         fx_status *st)
{
    if (kind == FX_OPTIM_ADAMW)
        return launch<update_kernel<FX_OPTIM_ADAMW, P, G>>(r, blocks, kThreads,
                                                                  "optimizer update kernel", st, a);
    return launch<update_kernel<FX_OPTIM_SGD, P, G>>(r, blocks, kThreads, "optimizer update kernel",
                                                            st, a);
}

static int op_step(const fx_exec *ex, const fx_optim_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    const unsigned blocks = (unsigned)a->blocks;
    int rc = FX_OK;
    if (a->prepass)
        rc = FX_DISPATCH_FLOAT(G, a->grad_dtype, "optimizer gradients", st, [&] {
            return launch<norm_kernel<G>>(r, blocks, kThreads, "optimizer norm kernel", st, *a);
        });
    if (rc == FX_OK)
        rc = FX_DISPATCH_FLOAT(P, a->param_dtype, "optimizer parameters", st, [&] {
            return FX_DISPATCH_FLOAT(G, a->grad_dtype, "optimizer gradients", st,
                                     [&] { return launch_update<P, G>(r, a->kind, blocks, *a, st); });
        });
    return rc;
}

} // namespace
} // namespace fx::cuda::optim

namespace fx::cuda {

const struct fx_optim_ops optim_ops = {
    .step = optim::op_step,
};

} // namespace fx::cuda
