// The linear recurrences' launchers, one set per input type T
// (instantiated by linrec_f32.cu, linrec_bf16.cu, linrec_f16.cu, which
// nvcc compiles in parallel): for each op, the tiling or the streaming
// kernel as the plan (linrec/plan.cuh) picks it, its scratch (look-back
// statuses, liquid's sums) from the caller's launch context, its launches
// on the context's stream. linrec.cu dispatches to them.
#ifndef FX_CUDA_LINREC_LAUNCHERS_CUH
#define FX_CUDA_LINREC_LAUNCHERS_CUH

#include "cuda/launch.cuh"
#include "cuda/linrec/plan.cuh"

namespace fx::cuda::linrec {

template <typename T> int forward(const Run &r, const fx_linrec_fwd_args *a, fx_status *st);
template <typename T> int backward(const Run &r, const fx_linrec_bwd_args *a, fx_status *st);
template <typename T> int step(const Run &r, const fx_linrec_step_args *a, fx_status *st);

// Calls body(std::integral_constant<int, KIND>{}) for the problem's op; an
// op with no kernel (the op layer lets none through) fails in st.
template <typename F> int with_kind(const fx_linrec_problem *p, const char *what, fx_status *st, F &&body)
{
    switch (p->kind) {
    case FX_LINREC_SCAN: return body(std::integral_constant<int, FX_LINREC_SCAN>{});
    case FX_LINREC_MINGRU: return body(std::integral_constant<int, FX_LINREC_MINGRU>{});
    case FX_LINREC_MINLSTM: return body(std::integral_constant<int, FX_LINREC_MINLSTM>{});
    case FX_LINREC_LIQUID: return body(std::integral_constant<int, FX_LINREC_LIQUID>{});
    default: return fx_fail(st, FX_EINTERNAL, "%s: no CUDA kernel for op %d", what, (int)p->kind);
    }
}

namespace detail {

// After a chained launch: a hook for a diagnostic build (dev/lookback_stats.cuh,
// which prints the look-back events counted there); a no-op otherwise.
#ifndef FX_SCAN_LAUNCHED
#define FX_SCAN_LAUNCHED(run, blocks) ((void)0)
#endif

// Launches the kernel for the plan's tiles: the single-tile one (no
// look-back) or the chained one with its look-back statuses (a status is
// valid when its tag is this launch's epoch): from the stream's cache when
// the context has one (fusex's own stream: no clearing between launches),
// else zeroed scratch of this launch, which holds no tag at all.
// `stage_bytes`: the staged forward's dynamic shared memory (0: none), for
// which the kernel is opted in (opt_in_smem: the scan's own static
// part, ~10 KB, counts against the 48 KB a block gets without it).
template <auto SINGLE, auto CHAINED, typename Params>
inline int launch_tiles(const Run &r, const Params &prm, const Plan &pl, fx::cuda::scan::Tiling &t,
                        size_t stage_bytes, const char *what, fx_status *st)
{
    if (!plan_fits(pl))
        return fx_fail(st, FX_EBADARG, "%s: %lld tiles is more than one launch can take", what,
                       (long long)(pl.ctiles * pl.ttiles));
    const int64_t blocks = pl.ctiles * pl.ttiles;
    const int threads = 32 * pl.warps;
    if (pl.ttiles == 1)
        return launch_opted<SINGLE>(r, blocks, threads, stage_bytes, what, st, prm, t);
    const size_t bytes = lookback_bytes(t, pl.vec * pl.group);
    void *statuses = nullptr;
    uint32_t epoch = 1;
    int rc;
    if (fx_stream_cache *cache = r.ex->cache) {
        pthread_mutex_lock(&cache->lock);
        rc = cached_statuses(r, cache, bytes, &statuses, &epoch, st);
        if (rc == FX_OK) {
            carve_lookback(static_cast<char *>(statuses), epoch, t);
            rc = launch_opted<CHAINED>(r, blocks, threads, stage_bytes, what, st, prm, t);
        }
        pthread_mutex_unlock(&cache->lock);
    } else {
        if (take_zeroed_scratch(r, bytes, "linrec look-back statuses", &statuses, st))
            return st->code;
        carve_lookback(static_cast<char *>(statuses), epoch, t);
        rc = launch_opted<CHAINED>(r, blocks, threads, stage_bytes, what, st, prm, t);
        give_back(r, statuses);
    }
    FX_SCAN_LAUNCHED(r, blocks);
    return rc;
}

// The forward with V channels per lane and G lanes per row: inputs staged
// in shared memory or held in registers (fwd_stages).
template <int KIND, typename T, int V, int G, bool CG>
inline int forward_with(const Run &r, const fx_linrec_fwd_args *a, fx_status *st)
{
    const FwdParams prm = make_fwd_params(a);
    if constexpr (V > 1 && fwd_stages<KIND, T>()) {
        if (large_launch(&a->p)) {
            constexpr int S = kStagedFwdSteps;
            const Plan pl = make_plan(r.d, &a->p, V, G, S, a->max_tile_steps);
            fx::cuda::scan::Tiling t = make_tiling(&a->p, pl, a->p.reverse);
            return launch_tiles<forward_staged_kernel<KIND, T, V, G, S, CG, false>,
                                forward_staged_kernel<KIND, T, V, G, S, CG, true>>(
                r, prm, pl, t, fwd_stage_bytes<KIND, T, V>(pl.steps, pl.warps), "linrec forward kernel", st);
        }
    }
    constexpr int S = fwd_steps<KIND, T, V>();
    const Plan pl = make_plan(r.d, &a->p, V, G, S, a->max_tile_steps);
    fx::cuda::scan::Tiling t = make_tiling(&a->p, pl, a->p.reverse);
    return launch_tiles<forward_kernel<KIND, T, V, G, S, CG, false>, forward_kernel<KIND, T, V, G, S, CG, true>>(
        r, prm, pl, t, 0, "linrec forward kernel", st);
}

// Launches a streaming kernel (forward or backward): a warp per 128-byte
// column of channels, kStreamWarps to a block, `bytes` of ring a block.
template <auto KERNEL, typename Params>
inline int launch_stream(const Run &r, const Params &prm, const StreamTiling &s, size_t bytes, const char *what,
                         fx_status *st)
{
    const int64_t blocks = (s.batch * s.columns + kStreamWarps - 1) / kStreamWarps;
    if (blocks > 0x7fffffff)
        return fx_fail(st, FX_EBADARG, "%s: %lld blocks is more than one launch can take", what, (long long)blocks);
    return launch_opted<KERNEL>(r, blocks, 32 * kStreamWarps, bytes, what, st, prm, s);
}

// The streaming forward: a warp per 128-byte column of channels.
template <int KIND, typename T, bool CG>
inline int forward_stream(const Run &r, const fx_linrec_fwd_args *a, fx_status *st)
{
    return launch_stream<forward_stream_kernel<KIND, T, CG>>(r, make_fwd_params(a),
                                                             make_stream_tiling(&a->p, (int)sizeof(T), false),
                                                             stream_block_bytes<KIND, false, CG>(),
                                                             "linrec streaming forward kernel", st);
}

template <int KIND, typename T, bool CG>
inline int forward_cg(const Run &r, const fx_linrec_fwd_args *a, fx_status *st)
{
    if (stream_wanted(r.d, a, (int)sizeof(T)))
        return forward_stream<KIND, T, CG>(r, a, st);
    if (fwd_vector_fits(a, kVec))
        return forward_with<KIND, T, kVec, vec_group<T>(), CG>(r, a, st);
    return forward_with<KIND, T, 1, 32, CG>(r, a, st);
}

template <int KIND, typename T>
inline int forward_as(const Run &r, const fx_linrec_fwd_args *a, fx_status *st)
{
    if constexpr (has_cand<KIND>())
        if (a->p.candidate_g)
            return forward_cg<KIND, T, true>(r, a, st);
    return forward_cg<KIND, T, false>(r, a, st);
}

// Liquid's partial sums (LiquidRows) from the context, `run(prm)` to
// launch the kernel on parameters pointing at them, then the sums added up
// into dtau, dA and ddt. The other ops take no sums.
template <int KIND, class F>
inline int with_sums(const Run &r, const fx_linrec_bwd_args *a, LiquidRows rows, fx_status *st, F &&run)
{
    float *sums = nullptr;
    if (KIND == FX_LINREC_LIQUID) {
        void *mem = nullptr;
        if (take_scratch(r, fx_size_mul(sum_count(a, rows), sizeof(float)), "liquid sums", &mem, st))
            return st->code;
        sums = static_cast<float *>(mem);
    }
    const BwdParams prm = make_bwd_params(a, sums, rows);
    int rc = run(prm);
    if (sums) {
        if (rc == FX_OK)
            rc = launch_sums(r, liquid_sums(a, prm, rows), "liquid sums kernel", st);
        give_back(r, sums);
    }
    return rc;
}

template <int KIND, typename T, int V, int G, bool CG>
inline int backward_with(const Run &r, const fx_linrec_bwd_args *a, fx_status *st)
{
    constexpr int S = bwd_steps<KIND, T, V>();
    const Plan pl = make_plan(r.d, &a->p, V, G, S, a->max_tile_steps);
    fx::cuda::scan::Tiling t = make_tiling(&a->p, pl, !a->p.reverse);
    return with_sums<KIND>(r, a, liquid_rows_tiled(&a->p, pl), st, [&](const BwdParams &prm) {
        return launch_tiles<backward_kernel<KIND, T, V, G, S, CG, false>, backward_kernel<KIND, T, V, G, S, CG, true>>(
            r, prm, pl, t, 0, "linrec backward kernel", st);
    });
}

// The streaming backward: a warp per 128-byte column, walking back.
template <int KIND, typename T, bool CG>
inline int backward_stream(const Run &r, const fx_linrec_bwd_args *a, fx_status *st)
{
    return with_sums<KIND>(r, a, liquid_rows_stream(&a->p, (int)sizeof(T)), st, [&](const BwdParams &prm) {
        return launch_stream<backward_stream_kernel<KIND, T, CG>>(r, prm, make_stream_tiling(&a->p, (int)sizeof(T), true),
                                                                  stream_block_bytes<KIND, true, CG>(),
                                                                  "linrec streaming backward kernel", st);
    });
}

template <int KIND, typename T, bool CG>
inline int backward_cg(const Run &r, const fx_linrec_bwd_args *a, fx_status *st)
{
    if (stream_wanted(r.d, a, (int)sizeof(T)))
        return backward_stream<KIND, T, CG>(r, a, st);
    if (bwd_vector_fits(a, kVec))
        return backward_with<KIND, T, kVec, vec_group<T>(), CG>(r, a, st);
    return backward_with<KIND, T, 1, 32, CG>(r, a, st);
}

template <int KIND, typename T>
inline int backward_as(const Run &r, const fx_linrec_bwd_args *a, fx_status *st)
{
    if (has_cand<KIND>() && a->p.candidate_g)
        return backward_cg<KIND, T, has_cand<KIND>()>(r, a, st);
    return backward_cg<KIND, T, false>(r, a, st);
}

template <int KIND, typename T>
inline int step_as(const Run &r, const fx_linrec_step_args *a, fx_status *st)
{
    const StepParams prm = make_step_params(a);
    const int64_t n = a->p.batch * a->p.hidden;
    const unsigned grid = grid_for(r.d, n, 256);
    if (has_cand<KIND>() && a->p.candidate_g)
        return launch<step_kernel<KIND, T, has_cand<KIND>()>>(r, grid, 256, "linrec step kernel", st, prm);
    return launch<step_kernel<KIND, T, false>>(r, grid, 256, "linrec step kernel", st, prm);
}

} // namespace detail

template <typename T> int forward(const Run &r, const fx_linrec_fwd_args *a, fx_status *st)
{
    return with_kind(&a->p, "linrec forward", st, [&](auto kind) { return detail::forward_as<decltype(kind)::value, T>(r, a, st); });
}

template <typename T> int backward(const Run &r, const fx_linrec_bwd_args *a, fx_status *st)
{
    return with_kind(&a->p, "linrec backward", st, [&](auto kind) { return detail::backward_as<decltype(kind)::value, T>(r, a, st); });
}

template <typename T> int step(const Run &r, const fx_linrec_step_args *a, fx_status *st)
{
    return with_kind(&a->p, "linrec step", st, [&](auto kind) { return detail::step_as<decltype(kind)::value, T>(r, a, st); });
}

// The launchers of one input type: declared `extern` for every type here,
// so that a file that calls them (linrec.cu) instantiates none, and defined
// by that type's unit (linrec_<type>.cu).
#define FX_LINREC_INSTANTIATION(KEYWORD, T)                                                            \
    KEYWORD template int forward<T>(const Run &, const fx_linrec_fwd_args *, fx_status *);     \
    KEYWORD template int backward<T>(const Run &, const fx_linrec_bwd_args *, fx_status *);    \
    KEYWORD template int step<T>(const Run &, const fx_linrec_step_args *, fx_status *);

FX_LINREC_INSTANTIATION(extern, float)
FX_LINREC_INSTANTIATION(extern, __nv_bfloat16)
FX_LINREC_INSTANTIATION(extern, __half)

} // namespace fx::cuda::linrec

#endif
