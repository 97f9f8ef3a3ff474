// The linear recurrences' entry points and ops table: the launch context
// entered, the call handed to the launchers of the input type
// (linrec/launchers.cuh, compiled per type by linrec_f32.cu,
// linrec_bf16.cu, linrec_f16.cu), and the scratch each asks for at most.
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "cuda/families.h"
#include "cuda/linrec/launchers.cuh"

namespace fx::cuda::linrec {
namespace {

int op_forward(const fx_exec *ex, const fx_linrec_fwd_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    return with_float(a->p.dtype, "linrec forward", st, [&](auto *tag) {
        return forward<typename std::remove_pointer<decltype(tag)>::type>(r, a, st);
    });
}

int op_backward(const fx_exec *ex, const fx_linrec_bwd_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    return with_float(a->p.dtype, "linrec backward", st, [&](auto *tag) {
        return backward<typename std::remove_pointer<decltype(tag)>::type>(r, a, st);
    });
}

int op_step(const fx_exec *ex, const fx_linrec_step_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    return with_float(a->p.dtype, "linrec step", st, [&](auto *tag) {
        return step<typename std::remove_pointer<decltype(tag)>::type>(r, a, st);
    });
}

// Calls body(std::integral_constant<int, KIND>{}, (T *)0) for the problem.
template <typename F> int dispatch(const fx_linrec_problem *p, const char *what, fx_status *st, F &&body)
{
    return with_float(p->dtype, what, st,
                      [&](auto *tag) { return with_kind(p, what, st, [&](auto kind) { return body(kind, tag); }); });
}

// The look-back statuses of the largest plan a launch of these shapes can
// take, over the register capacities of its kernels: the tiles of the
// scalar path (one channel a lane) and of the vector path. An upper bound:
// which path runs depends on the addresses too.
template <typename T, class Args>
size_t lookback_bound(const Device *d, const Args *a, std::initializer_list<int> capacities)
{
    size_t most = 0;
    for (int steps : capacities)
        for (const Plan &pl : {make_plan(d, &a->p, 1, 32, steps, a->max_tile_steps),
                               make_plan(d, &a->p, kVec, vec_group<T>(), steps, a->max_tile_steps)})
            if (pl.ttiles > 1)
                most = std::max(most, lookback_bytes(make_tiling(&a->p, pl, 0), pl.vec * pl.group));
    return most;
}

size_t op_forward_scratch(const fx_exec *ex, const fx_linrec_fwd_args *a)
{
    fx_status st;
    fx_status_clear(&st);
    const Device *d = enter(ex->device, &st);
    if (!d)
        return SIZE_MAX;
    size_t statuses = 0;
    dispatch(&a->p, "linrec forward", &st, [&](auto kind, auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        constexpr int KIND = decltype(kind)::value;
        statuses = lookback_bound<T>(d, a, {fwd_steps<KIND, T, 1>(), fwd_steps<KIND, T, kVec>(), kStagedFwdSteps});
        return (int)FX_OK;
    });
    return statuses ? fx_size_add(FX_SCRATCH_ALIGN, fx_scratch_piece(statuses)) : 0;
}

size_t op_backward_scratch(const fx_exec *ex, const fx_linrec_bwd_args *a)
{
    fx_status st;
    fx_status_clear(&st);
    const Device *d = enter(ex->device, &st);
    if (!d)
        return SIZE_MAX;
    size_t total = FX_SCRATCH_ALIGN;
    dispatch(&a->p, "linrec backward", &st, [&](auto kind, auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        constexpr int KIND = decltype(kind)::value;
        total = fx_size_add(total, fx_scratch_piece(lookback_bound<T>(
                                       d, a, {bwd_steps<KIND, T, 1>(), bwd_steps<KIND, T, kVec>()})));
        if (KIND == FX_LINREC_LIQUID) {
            const int64_t sums = std::max(sum_count(a, true, (int)sizeof(T)), sum_count(a, false, (int)sizeof(T)));
            total = fx_size_add(total, fx_scratch_piece(fx_size_mul(sums, sizeof(float))));
        }
        return (int)FX_OK;
    });
    return total;
}

} // namespace
} // namespace fx::cuda::linrec

namespace fx::cuda {

const struct fx_linrec_ops linrec_ops = {
    .forward = linrec::op_forward,
    .backward = linrec::op_backward,
    .step = linrec::op_step,
    .forward_scratch = linrec::op_forward_scratch,
    .backward_scratch = linrec::op_backward_scratch,
};

} // namespace fx::cuda
