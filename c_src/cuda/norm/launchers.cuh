// The norms' launch plan and launchers, one set per input type T
// (instantiated by norm_f32.cu, norm_bf16.cu, norm_f16.cu); norm.cu
// dispatches to them.
#ifndef FX_CUDA_NORM_LAUNCHERS_CUH
#define FX_CUDA_NORM_LAUNCHERS_CUH

#include "cuda/launch.cuh"
#include "cuda/norm/kernels.cuh"
#include "cuda/sums.cuh"
#include "fusex_norm.h"

#include <initializer_list>

namespace fx::cuda::norm {

template <typename T> int forward(const Run &r, const fx_norm_fwd_args *a, fx_status *st);
template <typename T> int backward(const Run &r, const fx_norm_bwd_args *a, fx_status *st);

// Partial-sum rows the backward writes at most: a block's each, as many
// blocks as keep 16 MB a gradient and 1024 at most. From the shape alone.
static inline int64_t max_parts(const fx_norm_dims &n)
{
    int64_t parts = ((int64_t)1 << 22) / n.hidden;
    parts = parts < 1 ? 1 : parts > 1024 ? 1024 : parts;
    return parts < n.rows ? parts : n.rows;
}

static inline size_t backward_scratch_bytes(const fx_norm_bwd_args *a)
{
    const size_t part = fx_scratch_piece(fx_size_mul(fx_size_mul(max_parts(a->n), a->n.hidden), (int64_t)sizeof(float)));
    return fx_size_add(FX_SCRATCH_ALIGN, a->dbias ? fx_size_add(part, part) : part);
}

// Blocks of the long backward: rows are long, so fewer blocks fill the GPU.
constexpr int64_t kLongBlocks = 128;

namespace detail {

// How a call runs: the rows kernel (VEC, NV, TPR) or the long one.
struct Plan {
    bool rows;
    int vec, nv, tpr;
};

inline size_t pack_bytes(const fx_tensor *t, int vec)
{
    const size_t bytes = fx_dtype_size(t->dtype) * (size_t)vec;
    return bytes < 16 ? bytes : 16;
}

// Packs of VEC elements where the row length allows and every tensor the
// packs touch starts on its pack.
template <typename T> int choose_vec(int64_t hidden, std::initializer_list<const fx_tensor *> tensors)
{
    constexpr int native = 16 / (int)sizeof(T);
    if (hidden % native != 0)
        return 1;
    for (const fx_tensor *t : tensors)
        if (t && !aligned_to(t->data, pack_bytes(t, native)))
            return 1;
    return native;
}

// A row of `hidden` held by TPR threads of up to MAX_NV packs of `vec`:
// TPR up to the block of 256 (past that the long kernel), NV 2 where a warp
// holds the row in two packs a lane. The forward holds up to 8 packs a
// thread; the backward, which keeps more for each element (its
// normalised value and gradient, the weight gradients' sums), 16 elements
// (two blocks an SM in registers).
inline Plan plan_for(const fx_norm_dims &n, int vec, int max_nv)
{
    Plan p = {};
    p.vec = vec;
    int tpr = 32;
    while (tpr < kBlockThreads && (int64_t)tpr * vec * max_nv < n.hidden)
        tpr *= 2;
    p.rows = (int64_t)tpr * vec * max_nv >= n.hidden;
    p.tpr = tpr;
    p.nv = tpr == 32 && 32 * vec * 2 >= n.hidden ? 2 : max_nv;
    return p;
}

constexpr int kForwardPacks = 8;
constexpr int kBackwardElems = 16;

template <typename T, int VEC, int NV>
int launch_forward_rows(const Run &r, int64_t blocks, const FwdParams &p, int tpr, fx_status *st)
{
    return launch<forward_rows<T, VEC, NV>>(r, blocks, kBlockThreads, "norm forward", st, p, tpr);
}

template <typename T, int VEC, int NV>
int launch_backward_rows(const Run &r, int64_t blocks, size_t smem, const BwdParams &p, int tpr, fx_status *st)
{
    return launch_opted<backward_rows<T, VEC, NV>>(r, blocks, kBlockThreads, smem, "norm backward", st, p, tpr);
}

} // namespace detail

template <typename T> int forward(const Run &r, const fx_norm_fwd_args *a, fx_status *st)
{
    FwdParams p = {};
    p.x = a->x->data;
    p.residual = a->residual ? a->residual->data : nullptr;
    p.weight = a->weight->data;
    p.bias = a->bias ? a->bias->data : nullptr;
    p.gate = a->gate ? a->gate->data : nullptr;
    p.y = a->y->data;
    p.s = a->residual_out ? a->residual_out->data : nullptr;
    p.mean = a->mean ? static_cast<float *>(a->mean->data) : nullptr;
    p.rstd = a->rstd ? static_cast<float *>(a->rstd->data) : nullptr;
    p.residual_type = a->residual ? (int)a->residual->dtype : FX_F32;
    p.s_type = a->residual_out ? (int)a->residual_out->dtype : FX_F32;
    p.weight_type = (int)a->weight->dtype;
    p.bias_type = a->bias ? (int)a->bias->dtype : FX_F32;
    p.rows = a->n.rows;
    p.hidden = a->n.hidden;
    p.eps = (float)a->eps;
    p.layer = a->kind == FX_NORM_LAYER;
    const int vec = detail::choose_vec<T>(a->n.hidden, {a->x, a->residual, a->weight, a->bias, a->gate, a->y,
                                                        a->residual_out});
    const detail::Plan plan = detail::plan_for(a->n, vec, detail::kForwardPacks);
    if (!plan.rows) {
        const int64_t blocks = a->n.rows < 65536 ? a->n.rows : 65536;
        return launch<forward_long<T>>(r, blocks, kLongThreads, "norm forward (long rows)", st, p);
    }
    const int64_t groups = kBlockThreads / plan.tpr;
    int64_t blocks = (a->n.rows + groups - 1) / groups;
    blocks = blocks < 65536 ? blocks : 65536;
    constexpr int native = 16 / (int)sizeof(T);
    if (plan.vec == 1)
        return plan.nv == 2 ? detail::launch_forward_rows<T, 1, 2>(r, blocks, p, plan.tpr, st)
                            : detail::launch_forward_rows<T, 1, 8>(r, blocks, p, plan.tpr, st);
    return plan.nv == 2 ? detail::launch_forward_rows<T, native, 2>(r, blocks, p, plan.tpr, st)
                        : detail::launch_forward_rows<T, native, 8>(r, blocks, p, plan.tpr, st);
}

template <typename T> int backward(const Run &r, const fx_norm_bwd_args *a, fx_status *st)
{
    BwdParams p = {};
    p.xs = a->xs->data;
    p.weight = a->weight->data;
    p.bias = a->bias ? a->bias->data : nullptr;
    p.gate = a->gate ? a->gate->data : nullptr;
    p.dy = a->dy->data;
    p.dres_out = a->dresidual_out ? a->dresidual_out->data : nullptr;
    p.mean = a->mean ? static_cast<const float *>(a->mean->data) : nullptr;
    p.rstd = static_cast<const float *>(a->rstd->data);
    p.dx = a->dx->data;
    p.dres = a->dresidual ? a->dresidual->data : nullptr;
    p.dgate = a->dgate ? a->dgate->data : nullptr;
    p.xs_type = (int)a->xs->dtype;
    p.weight_type = (int)a->weight->dtype;
    p.bias_type = a->bias ? (int)a->bias->dtype : FX_F32;
    p.dres_out_type = a->dresidual_out ? (int)a->dresidual_out->dtype : FX_F32;
    p.dres_type = a->dresidual ? (int)a->dresidual->dtype : FX_F32;
    p.rows = a->n.rows;
    p.hidden = a->n.hidden;
    p.layer = a->kind == FX_NORM_LAYER;
    const int vec = detail::choose_vec<T>(a->n.hidden, {a->xs, a->weight, a->bias, a->gate, a->dy, a->dresidual_out,
                                                        a->dx, a->dresidual, a->dgate});
    const detail::Plan plan = detail::plan_for(a->n, vec, detail::kBackwardElems / vec);
    const int64_t cap = max_parts(a->n);
    int64_t blocks;
    if (plan.rows) {
        const int64_t groups = kBlockThreads / plan.tpr;
        blocks = (a->n.rows + groups - 1) / groups;
    } else {
        blocks = a->n.rows < kLongBlocks ? a->n.rows : kLongBlocks;
    }
    blocks = blocks < cap ? blocks : cap;
    const size_t part_bytes = fx_size_mul(fx_size_mul(blocks, a->n.hidden), (int64_t)sizeof(float));
    void *dw_part = nullptr, *db_part = nullptr;
    if (take_scratch(r, part_bytes, "the weight gradient's partial sums", &dw_part, st) ||
        (a->dbias && take_scratch(r, part_bytes, "the bias gradient's partial sums", &db_part, st))) {
        give_back(r, dw_part);
        return st->code;
    }
    p.dw_part = static_cast<float *>(dw_part);
    p.db_part = static_cast<float *>(db_part);
    int rc;
    if (!plan.rows) {
        rc = launch<backward_long<T>>(r, blocks, kLongThreads, "norm backward (long rows)", st, p);
    } else {
        // the row groups' column sums meet in shared memory (one group a
        // block needs none)
        const size_t smem = plan.tpr < kBlockThreads ? (size_t)a->n.hidden * sizeof(float) : 0;
        constexpr int native = 16 / (int)sizeof(T), wide = detail::kBackwardElems / native;
        if (plan.vec == 1)
            rc = plan.nv == 2 ? detail::launch_backward_rows<T, 1, 2>(r, blocks, smem, p, plan.tpr, st)
                              : detail::launch_backward_rows<T, 1, detail::kBackwardElems>(r, blocks, smem, p, plan.tpr, st);
        else
            rc = plan.nv == 2 ? detail::launch_backward_rows<T, native, 2>(r, blocks, smem, p, plan.tpr, st)
                              : detail::launch_backward_rows<T, native, wide>(r, blocks, smem, p, plan.tpr, st);
    }
    if (rc == FX_OK) {
        SumRegions sums = {};
        sums.add(p.dw_part, a->dweight, a->n.hidden, (int)blocks);
        sums.add(p.db_part, a->dbias, a->n.hidden, (int)blocks);
        launch_sums(r, sums, "norm weight gradients", st);
    }
    give_back(r, db_part);
    give_back(r, dw_part);
    return st->code;
}

#define FX_NORM_INSTANTIATION(KEYWORD, T)                                                                        \
    KEYWORD template int forward<T>(const Run &, const fx_norm_fwd_args *, fx_status *);                       \
    KEYWORD template int backward<T>(const Run &, const fx_norm_bwd_args *, fx_status *);

FX_NORM_INSTANTIATION(extern, float)
FX_NORM_INSTANTIATION(extern, __nv_bfloat16)
FX_NORM_INSTANTIATION(extern, __half)

} // namespace fx::cuda::norm

#endif
