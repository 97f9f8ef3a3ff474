// The linear recurrences' launch plan, host side: tilings, which kernel
// runs for which shapes and addresses, the kernel parameters from the
// argument structs, the scratch (look-back statuses, liquid's sums).
#ifndef FX_CUDA_LINREC_PLAN_CUH
#define FX_CUDA_LINREC_PLAN_CUH

#include "cuda/linrec/step.cuh"
#include "cuda/linrec/stream.cuh"

namespace fx::cuda::linrec {

// ---- the tiling plan (host) ----

struct Plan {
    int vec, group;   // channels per lane, lanes per time row
    int steps, segs;  // a tile is segs * steps steps
    int warps;        // per block
    int64_t htiles, ctiles, ttiles;
};

// Tiles are numbered in 32 bits (and one launch takes up to 2^31 - 1 blocks).
inline bool plan_fits(const Plan &pl) { return pl.ctiles * pl.ttiles <= 0x7fffffff; }

// Tiles of `group * vec` channels. Time tiles of up to kMaxWarps warps of
// segments of `capacity` steps (the kernel's register capacity); a sequence
// that fits one tile gets the shortest segments that cover it (latency);
// fewer, shorter tiles when that leaves the GPU idle. Tests shrink the
// tiles with max_tile_steps to reach the look-back on small inputs.
inline Plan make_plan(const Device *d, const fx_linrec_problem *p, int vec, int group,
                      int capacity, int max_tile_steps)
{
    Plan pl;
    pl.vec = vec;
    pl.group = group;
    const int width = vec * group, per_warp = 32 / group, most = fx::cuda::scan::kMaxWarps * per_warp;
    pl.htiles = (p->hidden + width - 1) / width;
    pl.ctiles = p->batch * pl.htiles;
    const int64_t L = p->seqlen;
    if (max_tile_steps > 0) {
        const int half = max_tile_steps / 2;
        pl.steps = half < 1 ? 1 : half > capacity ? capacity : half;
        const int segs = max_tile_steps / pl.steps;
        pl.segs = segs < 1 ? 1 : segs > most ? most : segs;
    } else if (L <= (int64_t)most * capacity) {
        // One time tile: few steps a thread (latency), but not fewer than
        // kMinSteps, so that the scan across segments stays short.
        const int want = (int)((L + most - 1) / most), least = kMinSteps < capacity ? kMinSteps : capacity;
        pl.steps = want > least ? want : least < L ? least : (int)L;
        pl.segs = (int)((L + pl.steps - 1) / pl.steps);
    } else {
        pl.steps = capacity;
        pl.segs = most;
        if (p->batch * p->seqlen * p->hidden >= (1 << 20)) {
            // A long sequence over few channels: shorter time tiles, so that
            // every SM gets some (small problems stay in one tile: latency).
            auto tiles = [&](int segs) { return pl.ctiles * ((L + (int64_t)segs * pl.steps - 1) / ((int64_t)segs * pl.steps)); };
            while (pl.segs > per_warp && tiles(pl.segs) < 2 * (int64_t)d->sm_count)
                pl.segs /= 2;
        }
    }
    const int64_t span = (int64_t)pl.segs * pl.steps;
    pl.ttiles = (L + span - 1) / span;
    pl.warps = (pl.segs * group + 31) / 32;
    return pl;
}

inline fx::cuda::scan::Tiling make_tiling(const fx_linrec_problem *p, const Plan &pl, int flip)
{
    fx::cuda::scan::Tiling t = {};
    t.batch = p->batch;
    t.seqlen = p->seqlen;
    t.hidden = p->hidden;
    t.htiles = (int)pl.htiles;
    t.ctiles = (int)pl.ctiles;
    t.ttiles = (int)pl.ttiles;
    t.segs = pl.segs;
    t.steps = pl.steps;
    t.flip = flip;
    return t;
}

inline bool aligned16(const void *ptr) { return ((uintptr_t)ptr & 15) == 0; }

// The streaming forward's layout: rows of whole 16-byte pieces (hidden a
// multiple of 16 / sizeof(T)) and 16-byte aligned sequences.
inline bool stream_fits(const fx_linrec_fwd_args *a, int elem_bytes)
{
    // (hidden < 2^31 / kStreamMaxSteps: a stage's row offsets are 32-bit)
    if (a->p.hidden % (16 / elem_bytes) != 0 || a->p.hidden >= INT32_MAX / kStreamMaxSteps || !aligned16(a->h->data))
        return false;
    for (int k = 0; k < a->p.nseq; k++)
        if (!aligned16(a->p.seq[k]->data))
            return false;
    return true;
}

inline bool stream_fits(const fx_linrec_bwd_args *a, int elem_bytes)
{
    if (a->p.hidden % (16 / elem_bytes) != 0 || !aligned16(a->h->data) || !aligned16(a->dh->data))
        return false;
    for (int k = 0; k < a->p.nseq; k++)
        if (!aligned16(a->p.seq[k]->data) || !aligned16(a->dseq[k]->data))
            return false;
    return true;
}

inline int64_t stream_columns(const fx_linrec_problem *p, int elem_bytes)
{
    const int64_t width = 32 * (4 / elem_bytes);
    return (p->hidden + width - 1) / width;
}

// Whether the forward (or the backward: Args) streams: where tests force
// it (and it fits), or on its own for f32 where it fits, the launch is
// large, a sequence has a few stages and there are warps for ~90 % of the
// schedulers (4 per SM). A streaming warp walks every step of its sequence
// in turn, so with fewer warps the GPU idles and each warp's own latency
// sets the pace. Measured on the H200 (bench/RESULTS.md): B16 L1024 H1024
// (512 warps) MinGRU 57 against 61 us tiled, MinLSTM 72-74 against 87,
// Liquid 43 against 47, the scan even; B8 L2048 H1536 (384 warps) 80-84
// against 79 tiled; 16-bit B16 (256 warps) 46 against 37. Backward, B16:
// even to 3 % faster alone, 5-8 % faster after a forward (MinGRU fwd+bwd
// 159.5 against 167.5, Liquid 140 against 151.5).
template <typename Args> inline bool stream_wanted(const Device *d, const Args *a, int elem_bytes)
{
    if (a->max_tile_steps == FX_LINREC_TILES_STREAM)
        return stream_fits(a, elem_bytes);
    if (a->max_tile_steps != 0 || elem_bytes != 4)
        return false;
    return stream_fits(a, elem_bytes) && large_launch(&a->p) && a->p.seqlen >= 4 * kStreamSteps &&
           a->p.batch * stream_columns(&a->p, elem_bytes) >= 7 * (int64_t)d->sm_count / 2;
}

// backward: the walk runs against the forward's direction.
inline StreamTiling make_stream_tiling(const fx_linrec_problem *p, int elem_bytes, bool backward)
{
    StreamTiling s = {};
    s.batch = p->batch;
    s.seqlen = p->seqlen;
    s.hidden = p->hidden;
    s.columns = stream_columns(p, elem_bytes);
    s.flip = backward ? !p->reverse : p->reverse;
    return s;
}

// The vector path (16 bytes a lane) needs whole lanes of channels and
// 16-byte aligned sequences.
inline bool vector_fits(const fx_linrec_problem *p, int vec, const void *const *seqs, int nseqs)
{
    if (p->hidden % vec != 0)
        return false;
    for (int i = 0; i < nseqs; i++)
        if (!aligned16(seqs[i]))
            return false;
    return true;
}

inline OpParams make_op_params(const fx_linrec_problem *p)
{
    OpParams in = {};
    for (int k = 0; k < p->nseq; k++)
        in.seq[k] = p->seq[k]->data;
    if (p->kind == FX_LINREC_LIQUID) {
        in.tau = p->tau->data;
        in.lam = p->lam->data;
        in.dt = p->dt ? p->dt->data : nullptr;
        in.dt_value = (float)p->dt_value;
    }
    return in;
}

inline FwdParams make_fwd_params(const fx_linrec_fwd_args *a)
{
    FwdParams prm = {};
    prm.in = make_op_params(&a->p);
    prm.h0 = a->h0 ? a->h0->data : nullptr;
    prm.h0_f32 = a->h0 && a->h0->dtype == FX_F32;
    prm.h = a->h->data;
    prm.state = a->state ? (float *)a->state->data : nullptr;
    return prm;
}

// Whether the forward's sequences allow the vector path.
inline bool fwd_vector_fits(const fx_linrec_fwd_args *a, int vec)
{
    const void *seqs[FX_LINREC_MAX_SEQ + 1];
    int n = 0;
    for (int k = 0; k < a->p.nseq; k++)
        seqs[n++] = a->p.seq[k]->data;
    seqs[n++] = a->h->data;
    return vector_fits(&a->p, vec, seqs, n);
}

// Liquid's f32 partial sums (sums.cuh): rows of dtau's and of dA's, and
// rows of ddt's, one for each block (or warp) that adds into an element.
// The streaming backward: a batch row's warps for dtau and dA, a column of
// channels for ddt; the tiled one: a (time tile, batch row) for dtau and
// dA, a channel tile for ddt. Each row is written whole by the kernels, so
// nothing needs zeros.
struct LiquidRows {
    int64_t tau, dt;
};

inline LiquidRows liquid_rows_stream(const fx_linrec_problem *p, int elem_bytes)
{
    return {p->batch, stream_columns(p, elem_bytes)};
}

inline LiquidRows liquid_rows_tiled(const fx_linrec_problem *p, const Plan &pl)
{
    return {pl.ttiles * p->batch, pl.htiles};
}

// `sums`: liquid's f32 sums, sum_count(a, rows) floats.
inline BwdParams make_bwd_params(const fx_linrec_bwd_args *a, float *sums, LiquidRows rows)
{
    const fx_linrec_problem *p = &a->p;
    BwdParams prm = {};
    prm.in = make_op_params(p);
    prm.h0 = a->h0 ? a->h0->data : nullptr;
    prm.h0_f32 = a->h0 && a->h0->dtype == FX_F32;
    prm.h = a->h->data;
    prm.dh = a->dh->data;
    prm.dstate = a->dstate ? a->dstate->data : nullptr;
    prm.dstate_f32 = a->dstate && a->dstate->dtype == FX_F32;
    for (int k = 0; k < p->nseq; k++)
        prm.dseq[k] = a->dseq[k]->data;
    prm.dh0 = a->dh0 ? a->dh0->data : nullptr;
    prm.reverse = p->reverse;
    if (sums) {
        prm.sum_tau = sums;
        prm.sum_lam = sums + rows.tau * p->hidden;
        prm.sum_dt = a->ddt ? sums + 2 * rows.tau * p->hidden : nullptr;
    }
    return prm;
}

inline bool bwd_vector_fits(const fx_linrec_bwd_args *a, int vec)
{
    const void *seqs[2 * FX_LINREC_MAX_SEQ + 2];
    int n = 0;
    for (int k = 0; k < a->p.nseq; k++) {
        seqs[n++] = a->p.seq[k]->data;
        seqs[n++] = a->dseq[k]->data;
    }
    seqs[n++] = a->h->data;
    seqs[n++] = a->dh->data;
    return vector_fits(&a->p, vec, seqs, n);
}

// Liquid's sums in floats: [rows.tau][hidden] twice, and [rows.dt][batch *
// seqlen] with a dt tensor. (rows.tau * hidden <= the tiles' count times a
// tile's channels; rows.dt * batch * seqlen: a few columns of [batch,
// seqlen], whose product is a shape's; no overflow in int64.)
inline int64_t sum_count(const fx_linrec_bwd_args *a, LiquidRows rows)
{
    return 2 * rows.tau * a->p.hidden + (a->ddt ? rows.dt * a->p.batch * a->p.seqlen : 0);
}

// The most floats of Liquid's sums a backward of a's shapes takes, over
// the kernels it may run (which one runs depends on the addresses too).
template <int KIND, typename T> inline int64_t liquid_sum_bound(const Device *d, const fx_linrec_bwd_args *a)
{
    int64_t most = sum_count(a, liquid_rows_stream(&a->p, (int)sizeof(T)));
    for (const Plan &pl : {make_plan(d, &a->p, 1, 32, bwd_steps<KIND, T, 1>(), a->max_tile_steps),
                           make_plan(d, &a->p, kVec, vec_group<T>(), bwd_steps<KIND, T, kVec>(), a->max_tile_steps)}) {
        const int64_t n = sum_count(a, liquid_rows_tiled(&a->p, pl));
        most = n > most ? n : most;
    }
    return most;
}

// Liquid's sums (make_bwd_params) as added up into dtau, dA and ddt.
inline SumRegions liquid_sums(const fx_linrec_bwd_args *a, const BwdParams &prm, LiquidRows rows)
{
    SumRegions s = {};
    s.add(prm.sum_tau, a->dtau, a->p.hidden, rows.tau);
    s.add(prm.sum_lam, a->dlam, a->p.hidden, rows.tau);
    s.add(prm.sum_dt, a->ddt, a->p.batch * a->p.seqlen, rows.dt);
    return s;
}

inline StepParams make_step_params(const fx_linrec_step_args *a)
{
    StepParams prm = {};
    prm.in = make_op_params(&a->p);
    prm.state = a->state->data;
    prm.state_f32 = a->state->dtype == FX_F32;
    prm.h = a->h->data;
    prm.batch = a->p.batch;
    prm.hidden = a->p.hidden;
    return prm;
}

// The look-back statuses of a launch: two words per channel and tile.
inline size_t lookback_bytes(const fx::cuda::scan::Tiling &t, int width)
{
    // fx_size_mul saturates (SIZE_MAX, which no allocator gives); a
    // saturated product cast back to int64 is negative, and stays SIZE_MAX.
    const size_t tiles = fx_size_mul(t.ctiles, t.ttiles);
    return fx_size_mul((int64_t)tiles, (int64_t)width * 2 * (int64_t)sizeof(fx::cuda::scan::Word));
}

inline void carve_lookback(char *base, uint32_t epoch, fx::cuda::scan::Tiling &t)
{
    t.lb.status = (fx::cuda::scan::Word *)base;
    t.lb.epoch = epoch;
}

} // namespace fx::cuda::linrec

#endif
