// Linear recurrences on CUDA, host side: the look-back scratch, launches
// and dispatch over op and dtype. The kernels and the maths are in
// cuda/linrec_kernels.cuh; the shared scan in cuda/scan.cuh.
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/families.h"
#include "cuda/launch.cuh"
#include "cuda/linrec_kernels.cuh"

using namespace fxlinrec;


namespace {

#ifdef FXLR_STATS
__global__ void print_stats(unsigned blocks)
{
    unsigned long long *s = fxscan::stats;
    printf("lookback stats: %u tiles, %llu chained, %llu peek hits, %llu rounds, %llu empty rounds\n", blocks, s[0],
           s[1], s[2], s[3]);
    s[0] = s[1] = s[2] = s[3] = 0;
}
#endif

// Launches the kernel for the plan's tiles: the single-tile one (no
// look-back) or the chained one, with its look-back statuses in zeroed
// scratch of this launch (a status is valid when its tag is this launch's
// epoch; zeroed memory holds none). `stage_bytes`: the staged forward's
// dynamic shared memory (0: none), for which the kernel is opted in
// (fx_cuda_opt_in_smem: the scan's own static part, ~10 KB, counts against
// the 48 KB a block gets without it).
template <auto SINGLE, auto CHAINED, typename Params>
static int launch_tiles(const fx_cuda_run &r, const Params &prm, const plan &pl, fxscan::tiling &t,
                        size_t stage_bytes, const char *what, fx_status *st)
{
    if (!plan_fits(pl))
        return fx_fail(st, FX_EBADARG, "%s: %lld tiles is more than one launch can take", what,
                       (long long)(pl.ctiles * pl.ttiles));
    const int64_t blocks = pl.ctiles * pl.ttiles;
    const int threads = 32 * pl.warps;
    if (pl.ttiles == 1)
        return fx_cuda_launch_opted<SINGLE>(r, blocks, threads, stage_bytes, what, st, prm, t);
    void *statuses = nullptr;
    if (fx_cuda_zeroed_scratch(r, lookback_bytes(t, pl.vec * pl.group), "linrec look-back statuses", &statuses, st))
        return st->code;
    carve_lookback(static_cast<char *>(statuses), 1, t);
    const int rc = fx_cuda_launch_opted<CHAINED>(r, blocks, threads, stage_bytes, what, st, prm, t);
#ifdef FXLR_STATS
    print_stats<<<1, 1, 0, r.stream>>>((unsigned)blocks);
#endif
    fx_cuda_release(r, statuses);
    return rc;
}

// The forward with V channels per lane and G lanes per row: inputs staged
// in shared memory or held in registers (fwd_stages).
template <int KIND, typename T, int V, int G, bool CG>
static int forward_with(const fx_cuda_run &r, const fx_linrec_fwd_args *a, fx_status *st)
{
    const fwd_params prm = make_fwd_params(a);
    if constexpr (V > 1 && fwd_stages<KIND, T>()) {
        if (large_launch(&a->p)) {
            constexpr int S = kStagedFwdSteps;
            const plan pl = make_plan(r.d, &a->p, V, G, S, a->max_tile_steps);
            fxscan::tiling t = make_tiling(&a->p, pl, a->p.reverse);
            return launch_tiles<forward_staged_kernel<KIND, T, V, G, S, CG, false>,
                                forward_staged_kernel<KIND, T, V, G, S, CG, true>>(
                r, prm, pl, t, fwd_stage_bytes<KIND, T, V>(pl.steps, pl.warps), "linrec forward kernel", st);
        }
    }
    constexpr int S = fwd_steps<KIND, T, V>();
    const plan pl = make_plan(r.d, &a->p, V, G, S, a->max_tile_steps);
    fxscan::tiling t = make_tiling(&a->p, pl, a->p.reverse);
    return launch_tiles<forward_kernel<KIND, T, V, G, S, CG, false>, forward_kernel<KIND, T, V, G, S, CG, true>>(
        r, prm, pl, t, 0, "linrec forward kernel", st);
}

// Launches a streaming kernel (forward or backward): a warp per 128-byte
// column of channels, kStreamWarps to a block, `bytes` of ring a block.
template <auto KERNEL, typename Params>
static int launch_stream(const fx_cuda_run &r, const Params &prm, const stream_tiling &s, size_t bytes, const char *what,
                         fx_status *st)
{
    const int64_t blocks = (s.batch * s.columns + kStreamWarps - 1) / kStreamWarps;
    if (blocks > 0x7fffffff)
        return fx_fail(st, FX_EBADARG, "%s: %lld blocks is more than one launch can take", what, (long long)blocks);
    return fx_cuda_launch_opted<KERNEL>(r, blocks, 32 * kStreamWarps, bytes, what, st, prm, s);
}

// The streaming forward: a warp per 128-byte column of channels.
template <int KIND, typename T, bool CG>
static int forward_stream(const fx_cuda_run &r, const fx_linrec_fwd_args *a, fx_status *st)
{
    return launch_stream<forward_stream_kernel<KIND, T, CG>>(r, make_fwd_params(a),
                                                             make_stream_tiling(&a->p, (int)sizeof(T), false),
                                                             stream_block_bytes<KIND, false, CG>(),
                                                             "linrec streaming forward kernel", st);
}

template <int KIND, typename T, bool CG>
static int forward_cg(const fx_cuda_run &r, const fx_linrec_fwd_args *a, fx_status *st)
{
    if (stream_wanted(r.d, a, (int)sizeof(T)))
        return forward_stream<KIND, T, CG>(r, a, st);
    if (fwd_vector_fits(a, kVec))
        return forward_with<KIND, T, kVec, vec_group<T>(), CG>(r, a, st);
    return forward_with<KIND, T, 1, 32, CG>(r, a, st);
}

template <int KIND, typename T>
static int forward_as(const fx_cuda_run &r, const fx_linrec_fwd_args *a, fx_status *st)
{
    if constexpr (has_cand<KIND>())
        if (a->p.candidate_g)
            return forward_cg<KIND, T, true>(r, a, st);
    return forward_cg<KIND, T, false>(r, a, st);
}

template <int KIND, typename T, int V, int G, bool CG>
static int backward_with(const fx_cuda_run &r, const fx_linrec_bwd_args *a, const bwd_params &prm,
                         fx_status *st)
{
    constexpr int S = bwd_steps<KIND, T, V>();
    const plan pl = make_plan(r.d, &a->p, V, G, S, a->max_tile_steps);
    fxscan::tiling t = make_tiling(&a->p, pl, !a->p.reverse);
    return launch_tiles<backward_kernel<KIND, T, V, G, S, CG, false>, backward_kernel<KIND, T, V, G, S, CG, true>>(
        r, prm, pl, t, 0, "linrec backward kernel", st);
}

// The streaming backward: a warp per 128-byte column, walking back.
template <int KIND, typename T, bool CG>
static int backward_stream(const fx_cuda_run &r, const fx_linrec_bwd_args *a, const bwd_params &prm, fx_status *st)
{
    return launch_stream<backward_stream_kernel<KIND, T, CG>>(r, prm, make_stream_tiling(&a->p, (int)sizeof(T), true),
                                                              stream_block_bytes<KIND, true, CG>(),
                                                              "linrec streaming backward kernel", st);
}

template <int KIND, typename T, bool CG>
static int backward_cg(const fx_cuda_run &r, const fx_linrec_bwd_args *a, const bwd_params &prm,
                       bool stream, fx_status *st)
{
    if (stream)
        return backward_stream<KIND, T, CG>(r, a, prm, st);
    if (bwd_vector_fits(a, kVec))
        return backward_with<KIND, T, kVec, vec_group<T>(), CG>(r, a, prm, st);
    return backward_with<KIND, T, 1, 32, CG>(r, a, prm, st);
}

template <int KIND, typename T>
static int backward_as(const fx_cuda_run &r, const fx_linrec_bwd_args *a, fx_status *st)
{
    const fx_linrec_problem *p = &a->p;
    const int elem = (int)sizeof(T);
    const bool stream = stream_wanted(r.d, a, elem);
    // Liquid's sums: f32, the added-into ones zeroed, written out after the
    // scan.
    float *sums = nullptr;
    if (KIND == FX_LINREC_LIQUID) {
        const int64_t nsum = sum_count(a, stream, elem), nzero = zeroed_sum_count(a, stream, elem);
        void *mem = nullptr;
        if (fx_cuda_scratch(r, sizeof(float) * (size_t)nsum, "liquid sums", &mem, st))
            return st->code;
        if (fx_cuda_zero(r, mem, sizeof(float) * (size_t)nzero, "cudaMemsetAsync (liquid sums)", st)) {
            fx_cuda_release(r, mem);
            return st->code;
        }
        sums = static_cast<float *>(mem);
    }
    const bwd_params prm = make_bwd_params(a, sums);
    int rc;
    if (has_cand<KIND>() && p->candidate_g)
        rc = backward_cg<KIND, T, has_cand<KIND>()>(r, a, prm, stream, st);
    else
        rc = backward_cg<KIND, T, false>(r, a, prm, stream, st);
    if (sums) {
        if (rc == FX_OK)
            rc = fx_launch_sums(r, liquid_sums(a, prm, stream, elem), "liquid sums kernel", st);
        fx_cuda_release(r, sums);
    }
    return rc;
}

template <int KIND, typename T>
static int step_as(const fx_cuda_run &r, const fx_linrec_step_args *a, fx_status *st)
{
    const step_params prm = make_step_params(a);
    const int64_t n = a->p.batch * a->p.hidden;
    const unsigned grid = fx_cuda_grid(r.d, n, 256);
    if (has_cand<KIND>() && a->p.candidate_g)
        return fx_cuda_launch<step_kernel<KIND, T, has_cand<KIND>()>>(r, grid, 256, "linrec step kernel", st, prm);
    return fx_cuda_launch<step_kernel<KIND, T, false>>(r, grid, 256, "linrec step kernel", st, prm);
}

// Calls body(std::integral_constant<int, KIND>{}, (T *)0).
template <typename F> static int dispatch(const fx_linrec_problem *p, F &&body)
{
    return fx_dispatch_float(p->dtype, [&](auto *tag) {
        switch (p->kind) {
        case FX_LINREC_SCAN: return body(std::integral_constant<int, FX_LINREC_SCAN>{}, tag);
        case FX_LINREC_MINGRU: return body(std::integral_constant<int, FX_LINREC_MINGRU>{}, tag);
        case FX_LINREC_MINLSTM: return body(std::integral_constant<int, FX_LINREC_MINLSTM>{}, tag);
        case FX_LINREC_LIQUID: return body(std::integral_constant<int, FX_LINREC_LIQUID>{}, tag);
        default: return (int)FX_EINTERNAL;
        }
    });
}

int cuda_forward(const fx_exec *ex, const fx_linrec_fwd_args *a, fx_status *st)
{
    fx_cuda_run r;
    if (fx_cuda_enter_exec(ex, &r, st))
        return st->code;
    int rc = dispatch(&a->p, [&](auto kind, auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        return forward_as<decltype(kind)::value, T>(r, a, st);
    });
    return rc == FX_EINTERNAL && st->code == FX_OK
               ? fx_fail(st, FX_EINTERNAL, "linrec forward: no kernel for op %d, %d", a->p.kind, a->p.dtype)
               : rc;
}

int cuda_backward(const fx_exec *ex, const fx_linrec_bwd_args *a, fx_status *st)
{
    fx_cuda_run r;
    if (fx_cuda_enter_exec(ex, &r, st))
        return st->code;
    int rc = dispatch(&a->p, [&](auto kind, auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        return backward_as<decltype(kind)::value, T>(r, a, st);
    });
    return rc == FX_EINTERNAL && st->code == FX_OK
               ? fx_fail(st, FX_EINTERNAL, "linrec backward: no kernel for op %d, %d", a->p.kind, a->p.dtype)
               : rc;
}

int cuda_step(const fx_exec *ex, const fx_linrec_step_args *a, fx_status *st)
{
    fx_cuda_run r;
    if (fx_cuda_enter_exec(ex, &r, st))
        return st->code;
    int rc = dispatch(&a->p, [&](auto kind, auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        return step_as<decltype(kind)::value, T>(r, a, st);
    });
    return rc == FX_EINTERNAL && st->code == FX_OK
               ? fx_fail(st, FX_EINTERNAL, "linrec step: no kernel for op %d, %d", a->p.kind, a->p.dtype)
               : rc;
}

// The look-back statuses of the largest plan a launch of these shapes can
// take, over the register capacities of its kernels: the tiles of the
// scalar path (one channel a lane) and of the vector path. An upper bound:
// which path runs depends on the addresses too.
template <typename T, class Args>
size_t lookback_bound(const fx_cuda_device *d, const Args *a, std::initializer_list<int> capacities)
{
    size_t most = 0;
    for (int steps : capacities)
        for (const plan &pl : {make_plan(d, &a->p, 1, 32, steps, a->max_tile_steps),
                               make_plan(d, &a->p, kVec, vec_group<T>(), steps, a->max_tile_steps)})
            if (pl.ttiles > 1)
                most = std::max(most, lookback_bytes(make_tiling(&a->p, pl, 0), pl.vec * pl.group));
    return most;
}

size_t cuda_forward_scratch(const fx_exec *ex, const fx_linrec_fwd_args *a)
{
    fx_status st;
    fx_status_clear(&st);
    const fx_cuda_device *d = fx_cuda_enter(ex->device, &st);
    if (!d)
        return SIZE_MAX;
    size_t statuses = 0;
    dispatch(&a->p, [&](auto kind, auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        constexpr int KIND = decltype(kind)::value;
        statuses = lookback_bound<T>(d, a, {fwd_steps<KIND, T, 1>(), fwd_steps<KIND, T, kVec>(), kStagedFwdSteps});
        return (int)FX_OK;
    });
    return statuses ? fx_size_add(FX_SCRATCH_ALIGN, fx_scratch_piece(statuses)) : 0;
}

size_t cuda_backward_scratch(const fx_exec *ex, const fx_linrec_bwd_args *a)
{
    fx_status st;
    fx_status_clear(&st);
    const fx_cuda_device *d = fx_cuda_enter(ex->device, &st);
    if (!d)
        return SIZE_MAX;
    size_t total = FX_SCRATCH_ALIGN;
    dispatch(&a->p, [&](auto kind, auto *tag) {
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

const struct fx_linrec_ops fx_cuda_linrec_ops = {
    .forward = cuda_forward,
    .backward = cuda_backward,
    .step = cuda_step,
    .forward_scratch = cuda_forward_scratch,
    .backward_scratch = cuda_backward_scratch,
};
