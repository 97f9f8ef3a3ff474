// causal_conv1d's entry points and ops table: the launch context entered,
// the call handed to the launchers of the input type (conv/launchers.cuh,
// compiled per type by conv_f32.cu, conv_bf16.cu, conv_f16.cu).
#include "cuda/conv/launchers.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/families.h"

namespace fx::cuda::conv {
namespace {

int op_forward(const fx_exec *ex, const fx_conv_fwd_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    return FX_DISPATCH_FLOAT(T, a->x->dtype, "causal_conv1d", st, [&] {
        return forward<T>(r, a, st);
    });
}

int op_backward(const fx_exec *ex, const fx_conv_bwd_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    return FX_DISPATCH_FLOAT(T, a->fwd.x->dtype, "causal_conv1d_backward", st, [&] {
        return backward<T>(r, a, st);
    });
}

int op_step(const fx_exec *ex, const fx_conv_step_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    return FX_DISPATCH_FLOAT(T, a->x->dtype, "causal_conv1d_step", st, [&] {
        return step<T>(r, a, st);
    });
}

size_t op_forward_scratch(const fx_exec *, const fx_conv_fwd_args *) { return 0; }

size_t op_backward_scratch(const fx_exec *, const fx_conv_bwd_args *a) { return backward_scratch_bytes(a); }

} // namespace
} // namespace fx::cuda::conv

namespace fx::cuda {

const struct fx_conv_ops conv_ops = {
    .forward = conv::op_forward,
    .backward = conv::op_backward,
    .step = conv::op_step,
    .forward_scratch = conv::op_forward_scratch,
    .backward_scratch = conv::op_backward_scratch,
};

} // namespace fx::cuda
