// The norms' entry points and ops table: the launch context entered, the
// call handed to the launchers of the input type (norm/launchers.cuh,
// compiled per type by norm_f32.cu, norm_bf16.cu, norm_f16.cu).
#include "cuda/dispatch.cuh"
#include "cuda/families.h"
#include "cuda/norm/launchers.cuh"

namespace fx::cuda::norm {
namespace {

const char *op_name(int kind, bool backward)
{
    if (kind == FX_NORM_LAYER)
        return backward ? "layer_norm_backward" : "layer_norm";
    return backward ? "rms_norm_backward" : "rms_norm";
}

int op_forward(const fx_exec *ex, const fx_norm_fwd_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    return FX_DISPATCH_FLOAT(T, a->x->dtype, op_name(a->kind, false), st, [&] {
        return forward<T>(r, a, st);
    });
}

int op_backward(const fx_exec *ex, const fx_norm_bwd_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    return FX_DISPATCH_FLOAT(T, a->dy->dtype, op_name(a->kind, true), st, [&] {
        return backward<T>(r, a, st);
    });
}

size_t op_forward_scratch(const fx_exec *, const fx_norm_fwd_args *) { return 0; }

size_t op_backward_scratch(const fx_exec *, const fx_norm_bwd_args *a) { return backward_scratch_bytes(a); }

} // namespace
} // namespace fx::cuda::norm

namespace fx::cuda {

const struct fx_norm_ops norm_ops = {
    .forward = norm::op_forward,
    .backward = norm::op_backward,
    .forward_scratch = norm::op_forward_scratch,
    .backward_scratch = norm::op_backward_scratch,
};

} // namespace fx::cuda
