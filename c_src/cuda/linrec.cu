// Linear recurrences on CUDA, host side: the look-back scratch, launches
// and dispatch over op and dtype. The kernels and the maths are in
// cuda/linrec_kernels.cuh; the shared scan in cuda/scan.cuh.
#include <mutex>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/families.h"
#include "cuda/launch.cuh"
#include "cuda/linrec_kernels.cuh"

using namespace fxlinrec;


namespace {

// The look-back statuses of one device, shared by every launch on its
// stream (launches run one after another there). Grown on demand; the
// epoch tells this launch's statuses from older ones.
struct lookback_scratch {
    std::mutex lock;
    char *base = nullptr;
    size_t bytes = 0;
    uint32_t epoch = 0;
};

lookback_scratch scratch[FX_CUDA_MAX_DEVICES];

#ifdef FXLR_STATS
__global__ void print_stats(unsigned blocks)
{
    unsigned long long *s = fxscan::stats;
    printf("lookback stats: %u tiles, %llu chained, %llu peek hits, %llu rounds, %llu empty rounds\n", blocks, s[0],
           s[1], s[2], s[3]);
    s[0] = s[1] = s[2] = s[3] = 0;
}
#endif

// With scratch[dev].lock held: room for this launch's statuses, a fresh
// epoch, and the pointers in t.lb.
static int prepare_lookback(fx_cuda_device *d, int dev, fxscan::tiling &t, int width,
                            fx_status *st)
{
    lookback_scratch &s = scratch[dev];
    const size_t need = lookback_bytes(t, width);
    bool clear = false;
    if (need > s.bytes) {
        size_t grow = need + need / 2;
        if (s.base)
            FX_CUDA_TRY(d, cudaFreeAsync(s.base, d->stream), "cudaFreeAsync (linrec scratch)", st);
        s.base = nullptr;
        s.bytes = 0;
        FX_CUDA_TRY(d, cudaMallocAsync((void **)&s.base, grow, d->stream), "cudaMallocAsync (linrec scratch)", st);
        s.bytes = grow;
        clear = true;
    }
    if (++s.epoch >= (1u << 30)) { // wrapped: old tags could match again
        s.epoch = 1;
        clear = true;
    }
    if (clear)
        FX_CUDA_TRY(d, cudaMemsetAsync(s.base, 0, s.bytes, d->stream), "cudaMemsetAsync (linrec scratch)", st);
    carve_lookback(s.base, s.epoch, t);
    return FX_OK;
}

// Launches the kernel for the plan's tiles: the single-tile one (no
// look-back) or the chained one, with the look-back scratch prepared (and
// its lock held through the launch). `stage_bytes`: the staged forward's
// dynamic shared memory (0: none), for which the kernel is opted in
// (fx_cuda_opt_in_smem: the scan's own static part, ~10 KB, counts against
// the 48 KB a block gets without it).
template <auto SINGLE, auto CHAINED, typename Params>
static int launch_tiles(fx_cuda_device *d, int dev, const Params &prm, const plan &pl, fxscan::tiling &t,
                        size_t stage_bytes, const char *what, fx_status *st)
{
    if (!plan_fits(pl))
        return fx_fail(st, FX_EBADARG, "%s: %lld tiles is more than one launch can take", what,
                       (long long)(pl.ctiles * pl.ttiles));
    const int64_t blocks = pl.ctiles * pl.ttiles;
    const int threads = 32 * pl.warps;
    if (pl.ttiles == 1)
        return fx_cuda_launch_opted<SINGLE>(d, blocks, threads, stage_bytes, what, st, prm, t);
    std::lock_guard<std::mutex> held(scratch[dev].lock);
    if (prepare_lookback(d, dev, t, pl.vec * pl.group, st))
        return st->code;
    const int rc = fx_cuda_launch_opted<CHAINED>(d, blocks, threads, stage_bytes, what, st, prm, t);
#ifdef FXLR_STATS
    print_stats<<<1, 1, 0, d->stream>>>((unsigned)blocks);
#endif
    return rc;
}

// The forward with V channels per lane and G lanes per row: inputs staged
// in shared memory or held in registers (fwd_stages).
template <int KIND, typename T, int V, int G, bool CG>
static int forward_with(fx_cuda_device *d, int dev, const fx_linrec_fwd_args *a, fx_status *st)
{
    const fwd_params prm = make_fwd_params(a);
    if constexpr (V > 1 && fwd_stages<KIND, T>()) {
        if (large_launch(&a->p)) {
            constexpr int S = kStagedFwdSteps;
            const plan pl = make_plan(d, &a->p, V, G, S, a->max_tile_steps);
            fxscan::tiling t = make_tiling(&a->p, pl, a->p.reverse);
            return launch_tiles<forward_staged_kernel<KIND, T, V, G, S, CG, false>,
                                forward_staged_kernel<KIND, T, V, G, S, CG, true>>(
                d, dev, prm, pl, t, fwd_stage_bytes<KIND, T, V>(pl.steps, pl.warps), "linrec forward kernel", st);
        }
    }
    constexpr int S = fwd_steps<KIND, T, V>();
    const plan pl = make_plan(d, &a->p, V, G, S, a->max_tile_steps);
    fxscan::tiling t = make_tiling(&a->p, pl, a->p.reverse);
    return launch_tiles<forward_kernel<KIND, T, V, G, S, CG, false>, forward_kernel<KIND, T, V, G, S, CG, true>>(
        d, dev, prm, pl, t, 0, "linrec forward kernel", st);
}

// Launches a streaming kernel (forward or backward): a warp per 128-byte
// column of channels, kStreamWarps to a block, `bytes` of ring a block.
template <auto KERNEL, typename Params>
static int launch_stream(fx_cuda_device *d, const Params &prm, const stream_tiling &s, size_t bytes, const char *what,
                         fx_status *st)
{
    const int64_t blocks = (s.batch * s.columns + kStreamWarps - 1) / kStreamWarps;
    if (blocks > 0x7fffffff)
        return fx_fail(st, FX_EBADARG, "%s: %lld blocks is more than one launch can take", what, (long long)blocks);
    return fx_cuda_launch_opted<KERNEL>(d, blocks, 32 * kStreamWarps, bytes, what, st, prm, s);
}

// The streaming forward: a warp per 128-byte column of channels.
template <int KIND, typename T, bool CG>
static int forward_stream(fx_cuda_device *d, const fx_linrec_fwd_args *a, fx_status *st)
{
    return launch_stream<forward_stream_kernel<KIND, T, CG>>(d, make_fwd_params(a),
                                                             make_stream_tiling(&a->p, (int)sizeof(T), false),
                                                             stream_block_bytes<KIND, false, CG>(),
                                                             "linrec streaming forward kernel", st);
}

template <int KIND, typename T, bool CG>
static int forward_cg(fx_cuda_device *d, int dev, const fx_linrec_fwd_args *a, fx_status *st)
{
    if (stream_wanted(d, a, (int)sizeof(T)))
        return forward_stream<KIND, T, CG>(d, a, st);
    if (fwd_vector_fits(a, kVec))
        return forward_with<KIND, T, kVec, vec_group<T>(), CG>(d, dev, a, st);
    return forward_with<KIND, T, 1, 32, CG>(d, dev, a, st);
}

template <int KIND, typename T>
static int forward_as(fx_cuda_device *d, int dev, const fx_linrec_fwd_args *a, fx_status *st)
{
    if constexpr (has_cand<KIND>())
        if (a->p.candidate_g)
            return forward_cg<KIND, T, true>(d, dev, a, st);
    return forward_cg<KIND, T, false>(d, dev, a, st);
}

template <int KIND, typename T, int V, int G, bool CG>
static int backward_with(fx_cuda_device *d, int dev, const fx_linrec_bwd_args *a, const bwd_params &prm,
                         fx_status *st)
{
    constexpr int S = bwd_steps<KIND, T, V>();
    const plan pl = make_plan(d, &a->p, V, G, S, a->max_tile_steps);
    fxscan::tiling t = make_tiling(&a->p, pl, !a->p.reverse);
    return launch_tiles<backward_kernel<KIND, T, V, G, S, CG, false>, backward_kernel<KIND, T, V, G, S, CG, true>>(
        d, dev, prm, pl, t, 0, "linrec backward kernel", st);
}

// The streaming backward: a warp per 128-byte column, walking back.
template <int KIND, typename T, bool CG>
static int backward_stream(fx_cuda_device *d, const fx_linrec_bwd_args *a, const bwd_params &prm, fx_status *st)
{
    return launch_stream<backward_stream_kernel<KIND, T, CG>>(d, prm, make_stream_tiling(&a->p, (int)sizeof(T), true),
                                                              stream_block_bytes<KIND, true, CG>(),
                                                              "linrec streaming backward kernel", st);
}

template <int KIND, typename T, bool CG>
static int backward_cg(fx_cuda_device *d, int dev, const fx_linrec_bwd_args *a, const bwd_params &prm,
                       bool stream, fx_status *st)
{
    if (stream)
        return backward_stream<KIND, T, CG>(d, a, prm, st);
    if (bwd_vector_fits(a, kVec))
        return backward_with<KIND, T, kVec, vec_group<T>(), CG>(d, dev, a, prm, st);
    return backward_with<KIND, T, 1, 32, CG>(d, dev, a, prm, st);
}

template <int KIND, typename T>
static int backward_as(fx_cuda_device *d, int dev, const fx_linrec_bwd_args *a, fx_status *st)
{
    const fx_linrec_problem *p = &a->p;
    const int elem = (int)sizeof(T);
    const bool stream = stream_wanted(d, a, elem);
    // Liquid's sums: f32, the added-into ones zeroed, written out after the
    // scan.
    float *sums = nullptr;
    if (KIND == FX_LINREC_LIQUID) {
        const int64_t nsum = sum_count(a, stream, elem), nzero = zeroed_sum_count(a, stream, elem);
        FX_CUDA_TRY(d, cudaMallocAsync((void **)&sums, nsum * sizeof(float), d->stream),
                    "cudaMallocAsync (liquid sums)", st);
        cudaError_t err = cudaMemsetAsync(sums, 0, nzero * sizeof(float), d->stream);
        if (err != cudaSuccess) {
            (void)cudaFreeAsync(sums, d->stream);
            return fx_cuda_fail(d, err, "cudaMemsetAsync (liquid sums)", st);
        }
    }
    const bwd_params prm = make_bwd_params(a, sums);
    int rc;
    if (has_cand<KIND>() && p->candidate_g)
        rc = backward_cg<KIND, T, has_cand<KIND>()>(d, dev, a, prm, stream, st);
    else
        rc = backward_cg<KIND, T, false>(d, dev, a, prm, stream, st);
    if (sums) {
        if (rc == FX_OK)
            rc = fx_launch_sums(d, liquid_sums(a, prm, stream, elem), "liquid sums kernel", st);
        (void)cudaFreeAsync(sums, d->stream);
    }
    return rc;
}

template <int KIND, typename T>
static int step_as(fx_cuda_device *d, const fx_linrec_step_args *a, fx_status *st)
{
    const step_params prm = make_step_params(a);
    const int64_t n = a->p.batch * a->p.hidden;
    const unsigned grid = fx_cuda_grid(d, n, 256);
    if (has_cand<KIND>() && a->p.candidate_g)
        step_kernel<KIND, T, has_cand<KIND>()><<<grid, 256, 0, d->stream>>>(prm);
    else
        step_kernel<KIND, T, false><<<grid, 256, 0, d->stream>>>(prm);
    return fx_cuda_launched(d, "linrec step kernel", st);
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

int cuda_forward(int dev, const fx_linrec_fwd_args *a, fx_status *st)
{
    fx_cuda_device *d = fx_cuda_enter(dev, st);
    if (!d)
        return st->code;
    int rc = dispatch(&a->p, [&](auto kind, auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        return forward_as<decltype(kind)::value, T>(d, dev, a, st);
    });
    return rc == FX_EINTERNAL && st->code == FX_OK
               ? fx_fail(st, FX_EINTERNAL, "linrec forward: no kernel for op %d, %d", a->p.kind, a->p.dtype)
               : rc;
}

int cuda_backward(int dev, const fx_linrec_bwd_args *a, fx_status *st)
{
    fx_cuda_device *d = fx_cuda_enter(dev, st);
    if (!d)
        return st->code;
    int rc = dispatch(&a->p, [&](auto kind, auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        return backward_as<decltype(kind)::value, T>(d, dev, a, st);
    });
    return rc == FX_EINTERNAL && st->code == FX_OK
               ? fx_fail(st, FX_EINTERNAL, "linrec backward: no kernel for op %d, %d", a->p.kind, a->p.dtype)
               : rc;
}

int cuda_step(int dev, const fx_linrec_step_args *a, fx_status *st)
{
    fx_cuda_device *d = fx_cuda_enter(dev, st);
    if (!d)
        return st->code;
    int rc = dispatch(&a->p, [&](auto kind, auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        return step_as<decltype(kind)::value, T>(d, a, st);
    });
    return rc == FX_EINTERNAL && st->code == FX_OK
               ? fx_fail(st, FX_EINTERNAL, "linrec step: no kernel for op %d, %d", a->p.kind, a->p.dtype)
               : rc;
}

} // namespace

const struct fx_linrec_ops fx_cuda_linrec_ops = {cuda_forward, cuda_backward, cuda_step};

void fx_cuda_linrec_shutdown(void)
{
    for (int dev = 0; dev < FX_CUDA_MAX_DEVICES; dev++) {
        lookback_scratch &s = scratch[dev];
        std::lock_guard<std::mutex> held(s.lock);
        if (!s.base)
            continue;
        fx_status st;
        fx_status_clear(&st);
        // after the work that used it; the backend's shutdown then waits
        // for every stream once
        if (fx_cuda_device *d = fx_cuda_enter(dev, &st))
            (void)cudaFreeAsync(s.base, d->stream);
        s.base = nullptr;
        s.bytes = 0;
    }
}
