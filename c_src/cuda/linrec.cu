// The linear recurrences' entry points and ops table (cuda/entry.cuh): the
// launch context entered, the call handed to the launchers of the input
// type (linrec/launchers.cuh, compiled per type by linrec_f32.cu,
// linrec_bf16.cu, linrec_f16.cu), and the scratch each asks for at most.
#include <algorithm>
#include <initializer_list>

#include "cuda/entry.cuh"
#include "cuda/families.h"
#include "cuda/linrec/launchers.cuh"

namespace fx::cuda::linrec {
namespace {

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

struct Forward : OpEntry<fx_linrec_fwd_args> {
    static constexpr const char *kWhat = "linrec forward";
    static fx_dtype type(const Args *a) { return a->p.dtype; }
    template <typename T> static int launch(const Run &r, const Args *a, fx_status *st) { return forward<T>(r, a, st); }
    template <typename T> static size_t scratch(const fx_exec *ex, const Args *a)
    {
        fx_status st;
        fx_status_clear(&st);
        const Device *d = enter(ex->device, &st);
        if (!d)
            return SIZE_MAX;
        size_t statuses = 0;
        with_kind(&a->p, kWhat, &st, [&](auto kind) {
            constexpr int KIND = decltype(kind)::value;
            statuses = lookback_bound<T>(d, a, {fwd_steps<KIND, T, 1>(), fwd_steps<KIND, T, kVec>(), kStagedFwdSteps});
            return (int)FX_OK;
        });
        return statuses ? fx_size_add(FX_SCRATCH_ALIGN, fx_scratch_piece(statuses)) : 0;
    }
};

struct Backward : OpEntry<fx_linrec_bwd_args> {
    static constexpr const char *kWhat = "linrec backward";
    static fx_dtype type(const Args *a) { return a->p.dtype; }
    template <typename T> static int launch(const Run &r, const Args *a, fx_status *st) { return backward<T>(r, a, st); }
    template <typename T> static size_t scratch(const fx_exec *ex, const Args *a)
    {
        fx_status st;
        fx_status_clear(&st);
        const Device *d = enter(ex->device, &st);
        if (!d)
            return SIZE_MAX;
        size_t total = FX_SCRATCH_ALIGN;
        with_kind(&a->p, kWhat, &st, [&](auto kind) {
            constexpr int KIND = decltype(kind)::value;
            total = fx_size_add(total, fx_scratch_piece(lookback_bound<T>(
                                           d, a, {bwd_steps<KIND, T, 1>(), bwd_steps<KIND, T, kVec>()})));
            if (KIND == FX_LINREC_LIQUID)
                total = fx_size_add(total, fx_scratch_piece(fx_size_mul(liquid_sum_bound<KIND, T>(d, a), sizeof(float))));
            return (int)FX_OK;
        });
        return total;
    }
};

struct Step : OpEntry<fx_linrec_step_args> {
    static constexpr const char *kWhat = "linrec step";
    static fx_dtype type(const Args *a) { return a->p.dtype; }
    template <typename T> static int launch(const Run &r, const Args *a, fx_status *st) { return step<T>(r, a, st); }
};

} // namespace
} // namespace fx::cuda::linrec

namespace fx::cuda {

const struct fx_linrec_ops linrec_ops = {
    .forward = entry<linrec::Forward>,
    .backward = entry<linrec::Backward>,
    .step = entry<linrec::Step>,
    .forward_scratch = scratch_entry<linrec::Forward>,
    .backward_scratch = scratch_entry<linrec::Backward>,
};

} // namespace fx::cuda
