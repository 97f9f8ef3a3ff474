// The selective scan's launch plan, host side: the kernel parameters from
// the argument structs, which kernel runs for which shapes, block shapes,
// grids and scratch. The launchers (ssm/launchers.cuh) and the emulator
// both go through it.
#ifndef FX_CUDA_SSM_PLAN_CUH
#define FX_CUDA_SSM_PLAN_CUH

#include "cuda/ssm/backward.cuh"
#include "cuda/ssm/step.cuh"

namespace fx::cuda::ssm {

// ---- host side: parameters from the argument structs ----

inline int type_of(const fx_tensor *t) { return t ? (int)t->dtype : (int)FX_F32; }
inline const void *data_of(const fx_tensor *t) { return t ? t->data : nullptr; }

// Every dimension must fit an int (offsets are computed in 64 bits).
inline int check_dims(const fx_ssm_dims &n, const char *op, fx_status *st)
{
    const int64_t dims[5] = {n.batch, n.seqlen, n.dim, n.dstate, n.groups};
    for (int64_t v : dims)
        if (v > INT_MAX)
            return fx_fail(st, FX_EBADARG, "%s: expected every dimension below 2^31 on CUDA, got %lld",
                           op, (long long)v);
    if (n.batch * n.dim > INT_MAX) // work units are counted in ints
        return fx_fail(st, FX_EBADARG, "%s: expected batch * dim below 2^31 on CUDA, got %lld", op,
                       (long long)(n.batch * n.dim));
    return FX_OK;
}

// Parameters of a scan cut into tiles of `ch` channels (WCH per warp for
// the forward, CH per block for the backward).
inline ScanParams scan_params(const fx_ssm_fwd_args *a, int ch)
{
    ScanParams p = {};
    p.x = a->x->data, p.dt = a->dt->data, p.z = data_of(a->z), p.b = a->b->data, p.c = a->c->data;
    p.a = a->a->data, p.d = data_of(a->d), p.dt_bias = data_of(a->dt_bias), p.h0 = data_of(a->h0);
    p.a_type = type_of(a->a), p.d_type = type_of(a->d), p.bias_type = type_of(a->dt_bias);
    p.h0_type = type_of(a->h0);
    p.batch = (int)a->n.batch, p.seqlen = (int)a->n.seqlen, p.dim = (int)a->n.dim;
    p.dstate = (int)a->n.dstate, p.groups = (int)a->n.groups;
    p.cpg = p.dim / p.groups;
    p.tiles = (p.cpg + ch - 1) / ch;
    p.units = p.batch * p.groups * p.tiles;
    p.softplus = a->dt_softplus;
    p.y = a->y ? a->y->data : nullptr; // the outputs (a backward's copy of the arguments has none)
    p.state = a->state ? static_cast<float *>(a->state->data) : nullptr;
    if (a->saved) {
        p.saved = static_cast<float *>(a->saved->data);
        p.nsaved = (int)a->saved->dims[1];
    }
    return p;
}

inline int64_t grid_of(const ScanParams &p) { return p.units; }

// Warps per forward block: 4 when there are enough warps to fill every SM
// twice over (the warps of a block share L1 lines of b and c), else 1 so
// that small problems spread over as many SMs as possible.
template <typename T, class C, class U = FwdDefault> inline int fwd_block_warps(const ScanParams &p, int sm_count)
{
    const int most = cmin(kFwdMaxThreads / 32, (int)(kFwdMaxSmem / FwdSmem<T, C, U>::BYTES));
    return p.units >= 8 * sm_count ? most : 1;
}

// The steps between the states a forward of a saves: the chunk of the
// backward that starts from them, the configuration's (C::SAVE) or, where
// the backward is sliced, its 16 (so that the forward saves no state the
// backward does not read).
template <typename T> inline int64_t save_interval_of(const fx_ssm_fwd_args *a)
{
    if (bwd_sliced_shape<T>(scan_params(a, kWsChannels)))
        return kWsSteps;
    return with_cfg(a->n.dstate < kMaxDstate ? a->n.dstate : kMaxDstate,
                    [](auto cfg) -> int64_t { return decltype(cfg)::SAVE; });
}

// The saved states are laid out by the rule every caller sizes them by
// (fx_ssm_save_every); the kernels' own chunk must agree with it.
template <typename T> inline int check_saved(const fx_ssm_fwd_args *a, fx_status *st)
{
    const int64_t save = save_interval_of<T>(a), rule = fx_ssm_save_every(&a->n, a->x->dtype);
    if (save != rule)
        return fx_fail(st, FX_EINTERNAL, "selective_scan: the kernels save every %lld steps, the layout every %lld",
                       (long long)save, (long long)rule);
    if (a->saved && a->save_every != save)
        return fx_fail(st, FX_EINTERNAL, "selective_scan: saved states every %lld steps, expected %lld",
                       (long long)a->save_every, (long long)save);
    return FX_OK;
}

// Which forward kernel runs: the warp-specialized one (dstate 16 where
// ws_fits), else the one-warp-a-tile kernel with its cp.async path
// (fwd_fast) or without.
enum class FwdKernel { WS, WS_SLICED, TILE_FAST, TILE };

// A forward launch: its parameters (outputs included), kernel and block
// shape, as the launcher (ssm/launchers.cuh) and ssm_bench use them.
struct FwdLaunch {
    ScanParams p;
    FwdKernel kernel;
    int warps;
    size_t smem;
    int64_t grid;
    bool realign; // the sliced kernel is required and a row does not start on 16 bytes
};

// WS_SLICED: the f32 sums of y the launcher provides (p.ysum: a row for
// each slice, every element of it written), in floats. (x's elements, a
// shape's: at most 2^48, times at most 16 slices.)
inline int64_t ysum_floats(const ScanParams &p)
{
    return (int64_t)p.batch * p.seqlen * p.dim * (p.dstate / kWsStates);
}

// l as the sliced warp-specialized launch of p (ws_sliced_shape<T>(p)).
template <typename T> inline void ws_sliced_launch(const ScanParams &p, FwdLaunch *l)
{
    l->p = p;
    l->realign = !rows_aligned<T>(p, 16, 16);
    l->kernel = FwdKernel::WS_SLICED;
    l->warps = kWsThreads / 32;
    l->smem = WsSmem<T>::SLICED_BYTES;
    l->grid = (int64_t)p.units * (p.dstate / kWsStates);
}

template <typename T, class C>
inline int fwd_launch(const fx_ssm_fwd_args *a, int sm_count, FwdLaunch *l, fx_status *st)
{
    if (check_saved<T>(a, st))
        return st->code;
    if constexpr (C::NPAD == kWsStates && C::SAVE == kWsSteps) {
        l->p = scan_params(a, kWsChannels);
        if (ws_fits<T>(l->p)) {
            l->kernel = FwdKernel::WS;
            l->warps = kWsThreads / 32;
            l->smem = WsSmem<T>::BYTES;
            l->grid = l->p.units;
            return FX_OK;
        }
    }
    if constexpr (C::NPAD > kWsStates) { // above dstate 16
        // the sliced forward saves every 16 steps; above dstate 32, where
        // the tile forward saves every 8 (C::SAVE), the saved states'
        // interval (save_interval_of) says which backward will read them
        const ScanParams p = scan_params(a, kWsChannels);
        if (a->saved && C::SAVE != kWsSteps ? a->save_every == kWsSteps : ws_sliced_fits<T>(p)) {
            ws_sliced_launch<T>(p, l);
            return FX_OK;
        }
    }
    l->p = scan_params(a, C::WCH);
    l->kernel = fwd_fast<T, C>(l->p) ? FwdKernel::TILE_FAST : FwdKernel::TILE;
    l->warps = fwd_block_warps<T, C>(l->p, sm_count);
    l->smem = l->warps * FwdSmem<T, C>::BYTES;
    l->grid = (l->p.units + l->warps - 1) / l->warps;
    return FX_OK;
}

// A kernel as a type (KernelIs<k>::value is k), for launchers that take
// it as a template argument.
template <auto KERNEL> struct KernelIs {
    static constexpr auto value = KERNEL;
};

// body(KernelIs<kernel>()) for the forward launch l (whose shared memory is
// l.smem): the one place that maps a launch to its kernel, for the launcher
// (ssm.cu) and the emulator.
template <typename T, class C, class F> inline auto with_fwd_kernel(const FwdLaunch &l, F &&body)
{
    switch (l.kernel) {
    case FwdKernel::WS:
        return with_ws_opts(l.p, [&](auto o) { return body(KernelIs<ssm_fwd_ws_kernel<T, decltype(o)>>()); });
    case FwdKernel::WS_SLICED:
        return with_ws_opts<true>(l.p, [&](auto o) { return body(KernelIs<ssm_fwd_ws_kernel<T, decltype(o)>>()); });
    case FwdKernel::TILE_FAST:
        return body(KernelIs<ssm_fwd_kernel<T, C, true>>());
    case FwdKernel::TILE:
        break;
    }
    return body(KernelIs<ssm_fwd_kernel<T, C, false>>());
}

// body(KernelIs<kernel>()) for the sliced forward's second kernel.
template <typename T, class F> inline auto with_finish_kernel(const ScanParams &p, F &&body)
{
    if (p.z)
        return body(KernelIs<ssm_fwd_finish_kernel<T, true>>());
    return body(KernelIs<ssm_fwd_finish_kernel<T, false>>());
}

// One f32 scratch for the reduced gradients' partial sums (BwdParams:
// their rows), [db][dc][da][dd][ddt_bias], db first so that its rows are
// 16-byte aligned for vector stores. Sliced, the per-channel sums over
// each slice's states come first: [parts (3 x slices x batch * seqlen *
// dim)][db]... (dim a multiple of 32 there, so that db's rows stay 16-byte
// aligned). `ch`: the channels of a backward block (C::BW * C::WCH), whose
// tiles of a group each add a row of db and dc. Every element of every row
// is written by the kernels, so nothing needs zeros. Counts, not bytes
// (the launchers form those with fx_size_mul): each region is at most
// x's elements (a shape: at most 2^48) times 48 (3 x 16 slices) or times
// dstate <= kMaxDstate (256), far inside int64.
struct BwdScratch {
    int64_t tiles, dd_rows;              // rows of db and dc; of dd and ddt_bias
    int64_t n_parts, n_bc, n_a, n_d;     // parts in all; one row of db, of da, of dd
    int64_t total;
    BwdScratch(const fx_ssm_dims &n, int64_t ch, bool sliced)
    {
        const int64_t cpg = n.groups > 0 ? n.dim / n.groups : 0;
        tiles = (cpg + ch - 1) / ch;
        dd_rows = sliced ? (n.batch * n.seqlen + kBwdFinishRows - 1) / kBwdFinishRows : n.batch;
        n_parts = sliced ? 3 * (n.dstate / kWsStates) * n.batch * n.seqlen * n.dim : 0;
        n_bc = n.batch * n.seqlen * n.groups * n.dstate;
        n_a = n.dim * n.dstate;
        n_d = n.dim;
        total = n_parts + 2 * tiles * n_bc + n.batch * n_a + 2 * dd_rows * n_d;
    }
};

// The backward's partial sums for configuration C (SL: sliced).
template <class C, bool SL> inline BwdScratch bwd_scratch(const fx_ssm_dims &n)
{
    return BwdScratch(n, C::BW * C::WCH, SL);
}

inline StepParams step_params(const fx_ssm_step_args *a)
{
    StepParams p = {};
    p.x = a->x->data, p.dt = a->dt->data, p.z = data_of(a->z), p.b = a->b->data, p.c = a->c->data;
    p.a = a->a->data, p.d = data_of(a->d), p.dt_bias = data_of(a->dt_bias);
    p.a_type = type_of(a->a), p.d_type = type_of(a->d), p.bias_type = type_of(a->dt_bias);
    p.batch = (int)a->n.batch, p.dim = (int)a->n.dim, p.dstate = (int)a->n.dstate;
    p.groups = (int)a->n.groups, p.cpg = p.dim / p.groups;
    p.softplus = a->dt_softplus;
    p.state = static_cast<float *>(a->state->data);
    p.y = a->y->data;
    return p;
}

template <class C> inline int64_t step_grid(const StepParams &p)
{
    return p.dim > 0 ? (int64_t)p.batch * step_row_blocks<C>(p.dim) : 0;
}

// `scratch`: BwdScratch::total floats.
template <class C>
inline BwdParams bwd_params(const fx_ssm_bwd_args *a, float *scratch, const BwdScratch &sz)
{
    BwdParams bp = {};
    bp.f = scan_params(&a->fwd, C::BW * C::WCH);
    bp.dy = a->dy->data;
    bp.dstate = data_of(a->dstate), bp.dstate_type = type_of(a->dstate);
    bp.dx = a->dx->data, bp.ddt = a->ddt->data;
    bp.dz = a->dz ? a->dz->data : nullptr;
    bp.dh0 = a->dh0 ? a->dh0->data : nullptr, bp.dh0_type = type_of(a->dh0);
    bp.parts = sz.n_parts ? scratch : nullptr;
    bp.acc_db = scratch + sz.n_parts;
    bp.acc_dc = bp.acc_db + sz.tiles * sz.n_bc;
    bp.acc_da = bp.acc_dc + sz.tiles * sz.n_bc;
    bp.acc_dd = bp.acc_da + a->fwd.n.batch * sz.n_a;
    bp.acc_dbias = bp.acc_dd + sz.dd_rows * sz.n_d;
    bp.bc_row = sz.n_bc;
    return bp;
}

// body(KernelIs<kernel>(), shared memory bytes) for the backward of bp:
// the FAST kernel where bwd_fast allows it; with SL the sliced one.
template <typename T, class C, bool SL = false, class F> inline auto with_bwd_kernel(const BwdParams &bp, F &&body)
{
    constexpr size_t smem = BwdSmem<T, C>::BYTES; // (both paths lay out the same)
    if constexpr (SL)
        return body(KernelIs<ssm_bwd_kernel<T, C, true, true>>(), smem);
    else if (bwd_fast<T, C>(bp))
        return body(KernelIs<ssm_bwd_kernel<T, C, true>>(), smem);
    else
        return body(KernelIs<ssm_bwd_kernel<T, C, false>>(), smem);
}

// The backward's blocks: a tile's (sliced: a slice's of a tile).
template <bool SL> inline int64_t bwd_grid(const BwdParams &bp)
{
    return grid_of(bp.f) * (SL ? bp.f.dstate / kWsStates : 1);
}

// body(cfg, sl) for a's backward, its saved states checked first: the
// sliced kernel (Cfg<4, 4>, sl true) where bwd_sliced_shape, else dstate's
// configuration's. The one place that picks it, for the launcher (ssm.cu)
// and the emulator.
template <typename T, class F> inline int with_bwd_config(const fx_ssm_bwd_args *a, fx_status *st, F &&body)
{
    if (check_saved<T>(&a->fwd, st))
        return st->code;
    if (bwd_sliced_shape<T>(scan_params(&a->fwd, kWsChannels)))
        return body(Cfg<4, 4>(), std::true_type{});
    return with_cfg(a->fwd.n.dstate, [&](auto cfg) { return body(cfg, std::false_type{}); });
}

// The partial sums of bwd_params, as added up into the gradients asked for.
inline SumRegions bwd_sums(const fx_ssm_bwd_args *a, const BwdParams &bp, const BwdScratch &sz)
{
    SumRegions s = {};
    s.add(bp.acc_db, a->db, sz.n_bc, sz.tiles);
    s.add(bp.acc_dc, a->dc, sz.n_bc, sz.tiles);
    s.add(bp.acc_da, a->da, sz.n_a, a->fwd.n.batch);
    s.add(bp.acc_dd, a->dd, sz.n_d, sz.dd_rows);
    s.add(bp.acc_dbias, a->ddt_bias, sz.n_d, sz.dd_rows);
    return s;
}

// The backward's partial sums for a's shapes, as with_bwd_config would
// pick the kernel (for the scratch query: without its check of the saved
// states, which the op itself makes).
template <typename T> inline BwdScratch bwd_scratch_of(const fx_ssm_bwd_args *a)
{
    if (bwd_sliced_shape<T>(scan_params(&a->fwd, kWsChannels)))
        return bwd_scratch<Cfg<4, 4>, true>(a->fwd.n);
    return with_cfg(a->fwd.n.dstate, [&](auto cfg) { return bwd_scratch<decltype(cfg), false>(a->fwd.n); });
}

} // namespace fx::cuda::ssm

#endif
