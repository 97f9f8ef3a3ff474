// The GRU's and LSTM's entry points and ops table on CUDA: the launch
// context entered, the call handed to the launchers of the input type
// (rnn/launchers.cuh, compiled per type by rnn_f32.cu, rnn_bf16.cu,
// rnn_f16.cu), and the scratch each op asks for at most (rnn/plan.cuh).
#include "cuda/dispatch.cuh"
#include "cuda/families.h"
#include "cuda/rnn/launchers.cuh"

namespace fx::cuda::rnn {
namespace {

int op_forward(const fx_exec *ex, const fx_rnn_fwd_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    return FX_DISPATCH_FLOAT(T, a->x->dtype, "rnn forward", st, [&] {
        return forward<T>(r, a, st);
    });
}

int op_backward(const fx_exec *ex, const fx_rnn_bwd_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    return FX_DISPATCH_FLOAT(T, a->fwd.x->dtype, "rnn backward", st, [&] {
        return backward<T>(r, a, st);
    });
}

int op_step(const fx_exec *ex, const fx_rnn_step_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    return FX_DISPATCH_FLOAT(T, a->x->dtype, "rnn step", st, [&] {
        return step<T>(r, a, st);
    });
}

// The plan's pieces for the device of `ex`; SIZE_MAX where there is no
// plan (a forced path that does not fit, an unknown device).
size_t forward_bytes(const fx_exec *ex, const fx_rnn_dims &n, fx_dtype dtype, int path, bool step)
{
    fx_status st;
    fx_status_clear(&st);
    const Device *d = enter(ex->device, &st);
    ForwardPlan fp;
    if (!d || check_path(path, dtype, &st) || plan_forward(d, n, (int64_t)fx_dtype_size(dtype), path, step, &fp, &st))
        return SIZE_MAX;
    return forward_pieces(n, fp, fx_dtype_size(dtype), step).p.total;
}

size_t op_forward_scratch(const fx_exec *ex, const fx_rnn_fwd_args *a)
{
    return forward_bytes(ex, a->n, a->x->dtype, a->path, false);
}

size_t op_step_scratch(const fx_exec *ex, const fx_rnn_step_args *a)
{
    return forward_bytes(ex, a->n, a->x->dtype, a->path, true);
}

size_t op_backward_scratch(const fx_exec *ex, const fx_rnn_bwd_args *a)
{
    fx_status st;
    fx_status_clear(&st);
    const Device *d = enter(ex->device, &st);
    const fx_dtype dtype = a->fwd.x->dtype;
    BackwardPlan bp;
    if (!d || check_path(a->fwd.path, dtype, &st) ||
        plan_backward(d, a->fwd.n, dtype, a->fwd.path, &bp, &st))
        return SIZE_MAX;
    return backward_pieces(a->fwd.n, bp, fx_dtype_size(dtype)).p.total;
}

} // namespace
} // namespace fx::cuda::rnn

namespace fx::cuda {

const struct fx_rnn_ops rnn_ops = {
    .forward = rnn::op_forward,
    .backward = rnn::op_backward,
    .step = rnn::op_step,
    .forward_scratch = rnn::op_forward_scratch,
    .backward_scratch = rnn::op_backward_scratch,
    .step_scratch = rnn::op_step_scratch,
};

} // namespace fx::cuda
