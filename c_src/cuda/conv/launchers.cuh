// causal_conv1d's launchers, one set per input type T (instantiated by
// conv_f32.cu, conv_bf16.cu, conv_f16.cu); conv.cu dispatches to them.
#ifndef FX_CUDA_CONV_LAUNCHERS_CUH
#define FX_CUDA_CONV_LAUNCHERS_CUH

#include "cuda/conv/kernels.cuh"
#include "cuda/launch.cuh"
#include "cuda/sums.cuh"
#include "fusex_conv.h"

#include <initializer_list>

namespace fx::cuda::conv {

template <typename T> int forward(const Run &r, const fx_conv_fwd_args *a, fx_status *st);
template <typename T> int backward(const Run &r, const fx_conv_bwd_args *a, fx_status *st);
template <typename T> int step(const Run &r, const fx_conv_step_args *a, fx_status *st);

// The backward's partial sums: a row of dim * width (and dim) a sequence
// and chunk of kBwdChunk steps, from the shape alone.
static inline int64_t backward_parts(const fx_conv_dims &n)
{
    return n.batch * ((n.seqlen + kBwdChunk - 1) / kBwdChunk);
}

static inline size_t backward_scratch_bytes(const fx_conv_bwd_args *a)
{
    const fx_conv_dims &n = a->fwd.n;
    const int64_t parts = backward_parts(n);
    size_t total = fx_size_add(FX_SCRATCH_ALIGN, fx_scratch_piece(fx_size_mul(fx_size_mul(parts, n.dim * n.width),
                                                                              (int64_t)sizeof(float))));
    if (a->dbias)
        total = fx_size_add(total, fx_scratch_piece(fx_size_mul(fx_size_mul(parts, n.dim), (int64_t)sizeof(float))));
    return total;
}

namespace detail {

// Packs of 4 channels for widths up to 4 where the rows allow it: dim a
// multiple of 4 and every row tensor on its pack.
inline bool packed(const fx_conv_dims &n, std::initializer_list<const fx_tensor *> rows)
{
    if (n.width > 4 || n.dim % 4 != 0)
        return false;
    for (const fx_tensor *t : rows)
        if (t && !aligned_to(t->data, 4 * fx_dtype_size(t->dtype)))
            return false;
    return true;
}

inline Params params_of(const fx_conv_fwd_args *a, int64_t chunk)
{
    Params p = {};
    p.x = a->x->data;
    p.w = a->w->data;
    p.bias = a->bias ? a->bias->data : nullptr;
    p.init = a->initial_state ? a->initial_state->data : nullptr;
    p.w_type = (int)a->w->dtype;
    p.bias_type = a->bias ? (int)a->bias->dtype : FX_F32;
    p.batch = a->n.batch;
    p.seqlen = a->n.seqlen;
    p.dim = a->n.dim;
    p.width = (int)a->n.width;
    p.chunk = chunk;
    p.chunks = (a->n.seqlen + chunk - 1) / chunk;
    p.silu = a->activation == FX_ACT_SILU;
    return p;
}

inline int64_t grid_of(Params &p, int v)
{
    const int64_t packs = (p.dim + v - 1) / v;
    p.chan_blocks = (packs + kThreads - 1) / kThreads;
    return p.chan_blocks * p.chunks * p.batch;
}

} // namespace detail

template <typename T> int forward(const Run &r, const fx_conv_fwd_args *a, fx_status *st)
{
    Params p = detail::params_of(a, kFwdChunk);
    p.y = a->y->data;
    p.final_state = a->final_state ? a->final_state->data : nullptr;
    if (detail::packed(a->n, {a->x, a->y})) {
        const int64_t grid = detail::grid_of(p, 4);
        return launch<forward_kernel<T, 4, 4>>(r, grid, kThreads, "causal_conv1d forward", st, p);
    }
    const int64_t grid = detail::grid_of(p, 1);
    if (a->n.width <= 4)
        return launch<forward_kernel<T, 4, 1>>(r, grid, kThreads, "causal_conv1d forward", st, p);
    return launch<forward_kernel<T, FX_CONV_MAX_WIDTH, 1>>(r, grid, kThreads, "causal_conv1d forward", st, p);
}

template <typename T> int backward(const Run &r, const fx_conv_bwd_args *a, fx_status *st)
{
    const fx_conv_dims &n = a->fwd.n;
    Params p = detail::params_of(&a->fwd, kBwdChunk);
    p.dy = a->dy->data;
    p.dfinal = a->dfinal_state ? a->dfinal_state->data : nullptr;
    p.dx = a->dx->data;
    p.dinit = a->dinitial_state ? a->dinitial_state->data : nullptr;
    const int64_t parts = backward_parts(n);
    void *dw_part = nullptr, *db_part = nullptr;
    if (take_scratch(r, fx_size_mul(fx_size_mul(parts, n.dim * n.width), (int64_t)sizeof(float)),
                     "the weight gradient's partial sums", &dw_part, st) ||
        (a->dbias && take_scratch(r, fx_size_mul(fx_size_mul(parts, n.dim), (int64_t)sizeof(float)),
                                  "the bias gradient's partial sums", &db_part, st))) {
        give_back(r, dw_part);
        return st->code;
    }
    p.dw_part = static_cast<float *>(dw_part);
    p.db_part = static_cast<float *>(db_part);
    int rc;
    if (detail::packed(n, {a->fwd.x, a->dy, a->dx})) {
        const int64_t grid = detail::grid_of(p, 4);
        rc = launch<backward_kernel<T, 4, 4>>(r, grid, kThreads, "causal_conv1d backward", st, p);
    } else {
        const int64_t grid = detail::grid_of(p, 1);
        rc = n.width <= 4 ? launch<backward_kernel<T, 4, 1>>(r, grid, kThreads, "causal_conv1d backward", st, p)
                          : launch<backward_kernel<T, FX_CONV_MAX_WIDTH, 1>>(r, grid, kThreads,
                                                                            "causal_conv1d backward", st, p);
    }
    if (rc == FX_OK) {
        SumRegions sums = {};
        sums.add(p.dw_part, a->dw, n.dim * n.width, (int)parts);
        sums.add(p.db_part, a->dbias, n.dim, (int)parts);
        launch_sums(r, sums, "causal_conv1d weight gradients", st);
    }
    give_back(r, db_part);
    give_back(r, dw_part);
    return st->code;
}

template <typename T> int step(const Run &r, const fx_conv_step_args *a, fx_status *st)
{
    StepParams p = {};
    p.state = a->state->data;
    p.x = a->x->data;
    p.w = a->w->data;
    p.bias = a->bias ? a->bias->data : nullptr;
    p.y = a->y->data;
    p.w_type = (int)a->w->dtype;
    p.bias_type = a->bias ? (int)a->bias->dtype : FX_F32;
    p.rows = a->n.batch * a->n.dim;
    p.dim = a->n.dim;
    p.width = (int)a->n.width;
    p.silu = a->activation == FX_ACT_SILU;
    return launch<step_kernel<T>>(r, grid_for(r.d, p.rows, 128), 128, "causal_conv1d step", st, p);
}

#define FX_CONV_INSTANTIATION(KEYWORD, T)                                                                        \
    KEYWORD template int forward<T>(const Run &, const fx_conv_fwd_args *, fx_status *);                       \
    KEYWORD template int backward<T>(const Run &, const fx_conv_bwd_args *, fx_status *);                      \
    KEYWORD template int step<T>(const Run &, const fx_conv_step_args *, fx_status *);

FX_CONV_INSTANTIATION(extern, float)
FX_CONV_INSTANTIATION(extern, __nv_bfloat16)
FX_CONV_INSTANTIATION(extern, __half)

} // namespace fx::cuda::conv

#endif
