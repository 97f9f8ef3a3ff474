// Linear recurrences on CUDA, device side: the ops' maths, the forward,
// backward and step kernels, and the tiling plan. c_src/cuda/linrec.cu
// launches them; tools/cuda_emu runs the same code on the CPU (one thread
// per CUDA thread) to check the tiling and look-back logic without a GPU.
//
// Every forward is one kernel: each thread loads its steps' inputs, turns
// them into (a, b) with the op's coefficient function below, and the shared
// tile scan (cuda/scan.cuh) supplies the carry-in; the thread then rescans
// its steps from it and writes h. The backward is the same machinery run
// from the last step to the first over the adjoint u_t = a_t * g_t (what
// reaches h_{t-1}): g_t = dh_t + u_{t+1} with u after the last step =
// dstate, so its per-step map is (a_t, a_t * dh_t). It reads h_{t-1} from
// the forward's output and turns g_t into the inputs' gradients with the
// op's gradient function. Sums over channels or steps (liquid's tau, A and
// a dt tensor) go through f32 atomics into scratch and are written out by a
// small second kernel.
#ifndef FX_CUDA_LINREC_KERNELS_CUH
#define FX_CUDA_LINREC_KERNELS_CUH

#include "cuda/common.cuh"
#include "cuda/scan.cuh"
#include "fusex_linrec.h"

namespace fxlinrec {

using fxscan::affine;

// Elements per thread held in registers (steps * channels per lane):
// forward, backward.
constexpr int kFwdSteps = 16;
constexpr int kBwdSteps = 8;

template <int KIND> constexpr int nseq()
{
    return KIND == FX_LINREC_MINLSTM ? 3 : KIND == FX_LINREC_LIQUID ? 1 : 2;
}

// ---- the ops' maths, f32 ----

// sigmoid(x) and sigmoid(-x), finite for any x.
__device__ __forceinline__ void sigmoid2(float x, float &pos, float &neg)
{
    float e = __expf(-fabsf(x));
    float big = __frcp_rn(1.f + e), small = e * big;
    pos = x >= 0.f ? big : small;
    neg = x >= 0.f ? small : big;
}

__device__ __forceinline__ float softplus(float x) { return fmaxf(x, 0.f) + __logf(1.f + __expf(-fabsf(x))); }

// The candidate c~ = cand, or g(cand) = cand + 1/2 (cand >= 0), sigmoid(cand).
__device__ __forceinline__ float cand_value(int use_g, float x)
{
    if (!use_g)
        return x;
    float s, n;
    sigmoid2(x, s, n);
    return x >= 0.f ? x + 0.5f : s;
}

__device__ __forceinline__ float cand_slope(int use_g, float x)
{
    if (!use_g || x >= 0.f)
        return 1.f;
    float s, n;
    sigmoid2(x, s, n);
    return s * n;
}

// Per-channel parameters (liquid's 1/tau and A).
struct chan {
    float inv_tau, lam;
};

struct op_params {
    const void *seq[FX_LINREC_MAX_SEQ];
    const void *tau, *lam, *dt; // liquid; dt NULL: dt_value
    float dt_value;
    int cand_g;
};

template <int KIND>
__device__ __forceinline__ affine coeff(const float (&x)[3], chan c, float dt, int cand_g)
{
    if constexpr (KIND == FX_LINREC_SCAN) {
        return {x[0], x[1]};
    } else if constexpr (KIND == FX_LINREC_MINGRU) {
        float z, keep;
        sigmoid2(x[0], z, keep);
        return {keep, z * cand_value(cand_g, x[1])};
    } else if constexpr (KIND == FX_LINREC_MINLSTM) {
        // f' = f / (f + i) = sigmoid(log f - log i), log sigmoid(x) = -softplus(-x)
        float fp, ip;
        sigmoid2(softplus(-x[1]) - softplus(-x[0]), fp, ip);
        return {fp, ip * cand_value(cand_g, x[2])};
    } else {
        float f, nf;
        sigmoid2(x[0], f, nf);
        float inv_den = __frcp_rn(fmaf(dt, c.inv_tau + f, 1.f));
        return {inv_den, dt * f * c.lam * inv_den};
    }
}

// Gradients of one step's inputs from g = dL/dh_t (in total) and h_{t-1}:
// dx for the sequence inputs; liquid also adds to dtau, dlam and ddt.
template <int KIND>
__device__ __forceinline__ void step_grad(const float (&x)[3], chan c, float dt, int cand_g,
                                          float hprev, float g, float (&dx)[3], float &dtau,
                                          float &dlam, float &ddt)
{
    if constexpr (KIND == FX_LINREC_SCAN) {
        dx[0] = g * hprev;
        dx[1] = g;
    } else if constexpr (KIND == FX_LINREC_MINGRU) {
        float z, keep;
        sigmoid2(x[0], z, keep);
        dx[0] = g * (cand_value(cand_g, x[1]) - hprev) * z * keep;
        dx[1] = g * z * cand_slope(cand_g, x[1]);
    } else if constexpr (KIND == FX_LINREC_MINLSTM) {
        float fp, ip, sf, nf, si, ni;
        sigmoid2(softplus(-x[1]) - softplus(-x[0]), fp, ip);
        sigmoid2(x[0], sf, nf);
        sigmoid2(x[1], si, ni);
        float dd = g * (hprev - cand_value(cand_g, x[2])) * fp * ip;
        dx[0] = dd * nf;  // d/dfl of the log-ratio is 1 - sigmoid(fl)
        dx[1] = -dd * ni; // d/dil is -(1 - sigmoid(il))
        dx[2] = g * ip * cand_slope(cand_g, x[2]);
    } else {
        float f, nf;
        sigmoid2(x[0], f, nf);
        float inv_den = __frcp_rn(fmaf(dt, c.inv_tau + f, 1.f));
        float h = (hprev + dt * f * c.lam) * inv_den;
        float gd = g * inv_den;
        dx[0] = gd * dt * (c.lam - h) * f * nf;
        dtau += gd * h * dt * c.inv_tau * c.inv_tau;
        dlam += gd * dt * f;
        ddt += gd * (f * c.lam - h * (c.inv_tau + f));
    }
}

template <int KIND, typename T, int V>
__device__ __forceinline__ void load_chan(const op_params &in, int64_t h, bool live, chan (&c)[V])
{
#pragma unroll
    for (int v = 0; v < V; v++) {
        c[v] = {0.f, 0.f};
        if constexpr (KIND == FX_LINREC_LIQUID) {
            if (live) {
                c[v].inv_tau = 1.f / fx_elem<T>::load(static_cast<const T *>(in.tau)[h + v]);
                c[v].lam = fx_elem<T>::load(static_cast<const T *>(in.lam)[h + v]);
            }
        }
    }
}

// The dt of a time row (liquid).
template <int KIND, typename T>
__device__ __forceinline__ float load_dt(const op_params &in, int64_t index)
{
    if constexpr (KIND == FX_LINREC_LIQUID)
        return in.dt ? fx_elem<T>::load(static_cast<const T *>(in.dt)[index]) : in.dt_value;
    else
        return 0.f;
}

// Where a thread's tile, channels and steps are.
struct place {
    int64_t tt, ct, b, h, p0;
    int lane, warp;
    bool live;
};

template <int V>
__device__ __forceinline__ place locate(const fxscan::tiling &t, int64_t tile)
{
    place at;
    at.lane = threadIdx.x & 31;
    at.warp = threadIdx.x >> 5;
    at.tt = tile / t.ctiles;
    at.ct = tile - at.tt * t.ctiles;
    at.b = at.ct / t.htiles;
    at.h = (at.ct - at.b * t.htiles) * (32 * V) + at.lane * V;
    at.live = at.h < t.hidden; // hidden % V == 0 when V > 1
    at.p0 = (at.tt * t.warps + at.warp) * (int64_t)t.steps;
    return at;
}

// ---- forward ----

struct fwd_params {
    op_params in;
    const void *h0; // NULL: zeros
    int h0_f32;
    void *h;
    float *state; // NULL: not wanted
};

template <int KIND, typename T, int V, int C>
__global__ void __launch_bounds__(32 * fxscan::kMaxWarps, 2)
    forward_kernel(const fwd_params p, const fxscan::tiling t)
{
    constexpr int N = nseq<KIND>();
    FXSCAN_SHARED(fxscan::smem<V>, sm);
    const place at = locate<V>(t, blockIdx.x);
    const int64_t L = t.seqlen, H = t.hidden;
    const int64_t row0 = t.flip ? L - 1 - at.p0 : at.p0;
    const int64_t off0 = (at.b * L + row0) * H + at.h, stride = t.flip ? -H : H;

    chan ch[V];
    load_chan<KIND, T, V>(p.in, at.h, at.live, ch);

    // Every load first, so that they are all in flight together.
    float x[C][N][V], dt[C];
#pragma unroll
    for (int c = 0; c < C; c++) {
        const bool ok = at.live && c < t.steps && at.p0 + c < L;
#pragma unroll
        for (int k = 0; k < N; k++) {
            if (ok)
                fxscan::load_stream<T, V>(static_cast<const T *>(p.in.seq[k]) + off0 + c * stride, x[c][k]);
            else
#pragma unroll
                for (int v = 0; v < V; v++)
                    x[c][k][v] = 0.f;
        }
        dt[c] = ok ? load_dt<KIND, T>(p.in, at.b * L + row0 + (t.flip ? -c : c)) : 0.f;
    }
    float peek_h[V];
    const bool peeked = fxscan::peek<V>(t, at.ct, at.tt, peek_h);

    affine m[C][V], mine[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        mine[v] = fxscan::identity();
#pragma unroll
    for (int c = 0; c < C; c++) {
        const bool ok = at.live && c < t.steps && at.p0 + c < L;
#pragma unroll
        for (int v = 0; v < V; v++) {
            float xs[3] = {x[c][0][v], N > 1 ? x[c][N > 1 ? 1 : 0][v] : 0.f,
                           N > 2 ? x[c][N > 2 ? 2 : 0][v] : 0.f};
            m[c][v] = ok ? coeff<KIND>(xs, ch[v], dt[c], p.in.cand_g) : fxscan::identity();
            mine[v] = fxscan::compose(mine[v], m[c][v]);
        }
    }

    float init[V], hv[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        init[v] = at.tt == 0 && at.warp == 0 && at.live && p.h0
                      ? fxscan::load_state<T>(p.h0, p.h0_f32, at.b * H + at.h + v)
                      : 0.f;
    fxscan::scan_tile<V>(t, at.ct, at.tt, mine, init, peeked, peek_h, sm, hv);

#pragma unroll
    for (int c = 0; c < C; c++) {
        const bool ok = at.live && c < t.steps && at.p0 + c < L;
#pragma unroll
        for (int v = 0; v < V; v++)
            hv[v] = fxscan::apply(m[c][v], hv[v]);
        if (ok)
            fxscan::store_stream<T, V>(static_cast<T *>(p.h) + off0 + c * stride, hv);
    }
    // The last warp of the last tile ends on the final state (steps past
    // the end are identities).
    if (p.state && at.live && at.tt == t.ttiles - 1 && at.warp == t.warps - 1)
#pragma unroll
        for (int v = 0; v < V; v++)
            p.state[at.b * H + at.h + v] = hv[v];
}

// ---- backward ----

struct bwd_params {
    op_params in;
    const void *h0; // the forward's; NULL: zeros
    int h0_f32;
    const void *h;  // the forward's output
    const void *dh;
    const void *dstate; // NULL: zeros
    int dstate_f32;
    void *dseq[FX_LINREC_MAX_SEQ];
    void *dh0; // NULL: not wanted (dtype: h0's)
    float *sum_tau, *sum_lam, *sum_dt; // liquid: f32 accumulators ([hidden], [batch*seqlen])
    int reverse; // of the forward
};

template <int KIND, typename T, int V, int C>
__global__ void __launch_bounds__(32 * fxscan::kMaxWarps, 2)
    backward_kernel(const bwd_params p, const fxscan::tiling t)
{
    constexpr int N = nseq<KIND>();
    FXSCAN_SHARED(fxscan::smem<V>, sm);
    const place at = locate<V>(t, blockIdx.x);
    const int64_t L = t.seqlen, H = t.hidden;
    // Backward step p is forward step L-1-p; t.flip = !reverse maps it to its row.
    const int64_t row0 = t.flip ? L - 1 - at.p0 : at.p0;
    const int64_t off0 = (at.b * L + row0) * H + at.h, stride = t.flip ? -H : H;
    // h_{t-1} (forward order) sits one row towards the forward's start.
    const int64_t prev = p.reverse ? H : -H;

    chan ch[V];
    load_chan<KIND, T, V>(p.in, at.h, at.live, ch);

    float x[C][N][V], dh[C][V], hp[C][V], dt[C];
#pragma unroll
    for (int c = 0; c < C; c++) {
        const bool ok = at.live && c < t.steps && at.p0 + c < L;
        const int64_t off = off0 + c * stride;
#pragma unroll
        for (int k = 0; k < N; k++) {
            if (ok)
                fxscan::load_stream<T, V>(static_cast<const T *>(p.in.seq[k]) + off, x[c][k]);
            else
#pragma unroll
                for (int v = 0; v < V; v++)
                    x[c][k][v] = 0.f;
        }
        if (ok) {
            fxscan::load_stream<T, V>(static_cast<const T *>(p.dh) + off, dh[c]);
            if (at.p0 + c < L - 1) {
                fxscan::load_stream<T, V>(static_cast<const T *>(p.h) + off + prev, hp[c]);
            } else {
#pragma unroll
                for (int v = 0; v < V; v++)
                    hp[c][v] = p.h0 ? fxscan::load_state<T>(p.h0, p.h0_f32, at.b * H + at.h + v) : 0.f;
            }
        } else {
#pragma unroll
            for (int v = 0; v < V; v++)
                dh[c][v] = hp[c][v] = 0.f;
        }
        dt[c] = ok ? load_dt<KIND, T>(p.in, at.b * L + row0 + (t.flip ? -c : c)) : 0.f;
    }
    float peek_u[V];
    const bool peeked = fxscan::peek<V>(t, at.ct, at.tt, peek_u);

    // The adjoint's map per step: u -> a * (dh + u).
    float a[C][V];
    affine mine[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        mine[v] = fxscan::identity();
#pragma unroll
    for (int c = 0; c < C; c++) {
        const bool ok = at.live && c < t.steps && at.p0 + c < L;
#pragma unroll
        for (int v = 0; v < V; v++) {
            float xs[3] = {x[c][0][v], N > 1 ? x[c][N > 1 ? 1 : 0][v] : 0.f,
                           N > 2 ? x[c][N > 2 ? 2 : 0][v] : 0.f};
            a[c][v] = ok ? coeff<KIND>(xs, ch[v], dt[c], p.in.cand_g).a : 1.f;
            mine[v] = fxscan::compose(mine[v], affine{a[c][v], a[c][v] * dh[c][v]});
        }
    }

    float init[V], u[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        init[v] = at.tt == 0 && at.warp == 0 && at.live && p.dstate
                      ? fxscan::load_state<T>(p.dstate, p.dstate_f32, at.b * H + at.h + v)
                      : 0.f;
    fxscan::scan_tile<V>(t, at.ct, at.tt, mine, init, peeked, peek_u, sm, u);

    float sum_tau[V] = {}, sum_lam[V] = {};
#pragma unroll
    for (int c = 0; c < C; c++) {
        const bool step_ok = c < t.steps && at.p0 + c < L; // the same for the whole warp
        const bool ok = at.live && step_ok;
        float dx[3][V], row_dt = 0.f;
#pragma unroll
        for (int v = 0; v < V; v++) {
            float g = dh[c][v] + u[v];
            float xs[3] = {x[c][0][v], N > 1 ? x[c][N > 1 ? 1 : 0][v] : 0.f,
                           N > 2 ? x[c][N > 2 ? 2 : 0][v] : 0.f};
            float d3[3] = {0.f, 0.f, 0.f}, dtau = 0.f, dlam = 0.f, ddt = 0.f;
            if (ok)
                step_grad<KIND>(xs, ch[v], dt[c], p.in.cand_g, hp[c][v], g, d3, dtau, dlam, ddt);
#pragma unroll
            for (int k = 0; k < 3; k++)
                dx[k][v] = d3[k];
            sum_tau[v] += dtau;
            sum_lam[v] += dlam;
            row_dt += ddt;
            u[v] = a[c][v] * g;
        }
        if (ok)
#pragma unroll
            for (int k = 0; k < N; k++)
                fxscan::store_stream<T, V>(static_cast<T *>(p.dseq[k]) + off0 + c * stride, dx[k]);
        if constexpr (KIND == FX_LINREC_LIQUID) {
            if (p.sum_dt && step_ok) { // one atomic per warp and row
#pragma unroll
                for (int s = 16; s > 0; s >>= 1)
                    row_dt += __shfl_xor_sync(0xffffffffu, row_dt, s);
                if (at.lane == 0)
                    atomicAdd(p.sum_dt + at.b * L + row0 + (t.flip ? -c : c), row_dt);
            }
        }
    }
    if (p.dh0 && at.live && at.tt == t.ttiles - 1 && at.warp == t.warps - 1)
#pragma unroll
        for (int v = 0; v < V; v++)
            fxscan::store_state<T>(p.dh0, p.h0_f32, at.b * H + at.h + v, u[v]);

    if constexpr (KIND == FX_LINREC_LIQUID) {
        // The block's tau and A sums, one atomic per channel. The scan is
        // done with xa/xb (scan_tile ends on a barrier).
#pragma unroll
        for (int v = 0; v < V; v++) {
            sm.xa[at.warp][at.lane * V + v] = sum_tau[v];
            sm.xb[at.warp][at.lane * V + v] = sum_lam[v];
        }
        __syncthreads();
        if (at.warp == 0 && at.live) {
#pragma unroll
            for (int v = 0; v < V; v++) {
                float st = 0.f, sl = 0.f;
                for (int w = 0; w < t.warps; w++) {
                    st += sm.xa[w][at.lane * V + v];
                    sl += sm.xb[w][at.lane * V + v];
                }
                atomicAdd(p.sum_tau + at.h + v, st);
                atomicAdd(p.sum_lam + at.h + v, sl);
            }
        }
    }
}

template <typename T> __global__ void write_sums(const float *__restrict__ sums, T *__restrict__ out, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = fx_elem<T>::store(sums[i]);
}

// ---- step: one frame, elementwise ----

struct step_params {
    op_params in; // seq [batch, hidden]; dt [batch, 1]
    void *state;
    int state_f32;
    void *h;
    int64_t batch, hidden;
};

template <int KIND, typename T>
__global__ void step_kernel(const step_params p)
{
    constexpr int N = nseq<KIND>();
    const int64_t n = p.batch * p.hidden;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / p.hidden, hc = i - b * p.hidden;
        float xs[3] = {0.f, 0.f, 0.f};
#pragma unroll
        for (int k = 0; k < N; k++)
            xs[k] = fx_elem<T>::load(static_cast<const T *>(p.in.seq[k])[i]);
        chan c[1];
        load_chan<KIND, T, 1>(p.in, hc, true, c);
        affine m = coeff<KIND>(xs, c[0], load_dt<KIND, T>(p.in, b), p.in.cand_g);
        float h = fxscan::apply(m, fxscan::load_state<T>(p.state, p.state_f32, i));
        fxscan::store_state<T>(p.state, p.state_f32, i, h);
        static_cast<T *>(p.h)[i] = fx_elem<T>::store(h);
    }
}

// ---- the tiling plan (host) ----

struct plan {
    int vec, warps, steps;
    int64_t htiles, ctiles, ttiles;
};

// Two channels per lane for 16-bit types (one 32-bit access) when hidden
// is even; one otherwise. Time tiles of up to kMaxWarps warps * `steps`;
// fewer, shorter tiles when that leaves the GPU idle. Tests shrink the
// tiles with max_tile_steps to reach the look-back on small inputs.
// `force_vec` (tools/cuda_emu only): 1 or 2 channels per lane whatever the
// dtype.
inline plan make_plan(const fx_cuda_device *d, const fx_linrec_problem *p, int elements,
                      int max_tile_steps, int force_vec = 0)
{
    plan pl;
    bool half = p->dtype == FX_BF16 || p->dtype == FX_F16;
    pl.vec = force_vec ? force_vec : half && p->hidden % 2 == 0 ? 2 : 1;
    const int capacity = elements / pl.vec; // the kernel's steps per thread
    pl.htiles = (p->hidden + 32 * pl.vec - 1) / (32 * pl.vec);
    pl.ctiles = p->batch * pl.htiles;
    const int64_t L = p->seqlen;
    pl.steps = (int)(L < capacity ? L : capacity);
    const int64_t warps = (L + pl.steps - 1) / pl.steps;
    pl.warps = (int)(warps < fxscan::kMaxWarps ? warps : fxscan::kMaxWarps);
    if (max_tile_steps > 0) {
        const int half_tile = max_tile_steps / 2;
        pl.steps = half_tile < 1 ? 1 : half_tile > capacity ? capacity : half_tile;
        const int w = max_tile_steps / pl.steps;
        pl.warps = w < 1 ? 1 : w > fxscan::kMaxWarps ? fxscan::kMaxWarps : w;
    } else if (p->batch * p->seqlen * p->hidden >= (1 << 20)) {
        // A long sequence over few channels: shorter time tiles, so that
        // every SM gets some (small problems stay in one tile: latency).
        auto tiles = [&](int w) { return pl.ctiles * ((L + (int64_t)w * pl.steps - 1) / ((int64_t)w * pl.steps)); };
        while (pl.warps > 2 && tiles(pl.warps) < 2 * (int64_t)d->sm_count)
            pl.warps /= 2;
    }
    const int64_t span = (int64_t)pl.warps * pl.steps;
    pl.ttiles = (L + span - 1) / span;
    return pl;
}

inline fxscan::tiling make_tiling(const fx_linrec_problem *p, const plan &pl, int flip)
{
    fxscan::tiling t = {};
    t.batch = p->batch;
    t.seqlen = p->seqlen;
    t.hidden = p->hidden;
    t.htiles = pl.htiles;
    t.ctiles = pl.ctiles;
    t.ttiles = pl.ttiles;
    t.warps = pl.warps;
    t.steps = pl.steps;
    t.flip = flip;
    return t;
}

inline op_params make_op_params(const fx_linrec_problem *p)
{
    op_params in = {};
    for (int k = 0; k < p->nseq; k++)
        in.seq[k] = p->seq[k]->data;
    if (p->kind == FX_LINREC_LIQUID) {
        in.tau = p->tau->data;
        in.lam = p->lam->data;
        in.dt = p->dt ? p->dt->data : nullptr;
        in.dt_value = (float)p->dt_value;
    }
    in.cand_g = p->candidate_g;
    return in;
}

inline fwd_params make_fwd_params(const fx_linrec_fwd_args *a)
{
    fwd_params prm = {};
    prm.in = make_op_params(&a->p);
    prm.h0 = a->h0 ? a->h0->data : nullptr;
    prm.h0_f32 = a->h0 && a->h0->dtype == FX_F32;
    prm.h = a->h->data;
    prm.state = a->state ? (float *)a->state->data : nullptr;
    return prm;
}

// `sums`: liquid's f32 accumulators, zeroed: 2 * hidden (+ batch * seqlen
// with a dt tensor) floats.
inline bwd_params make_bwd_params(const fx_linrec_bwd_args *a, float *sums)
{
    const fx_linrec_problem *p = &a->p;
    bwd_params prm = {};
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
        prm.sum_lam = sums + p->hidden;
        prm.sum_dt = a->ddt ? sums + 2 * p->hidden : nullptr;
    }
    return prm;
}

inline int64_t sum_count(const fx_linrec_bwd_args *a)
{
    return 2 * a->p.hidden + (a->ddt ? a->p.batch * a->p.seqlen : 0);
}

inline step_params make_step_params(const fx_linrec_step_args *a)
{
    step_params prm = {};
    prm.in = make_op_params(&a->p);
    prm.state = a->state->data;
    prm.state_f32 = a->state->dtype == FX_F32;
    prm.h = a->h->data;
    prm.batch = a->p.batch;
    prm.hidden = a->p.hidden;
    return prm;
}

// The look-back scratch of a launch: flags, then three value arrays, each
// 256-byte aligned.
constexpr size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

inline size_t lookback_bytes(const fxscan::tiling &t, int width)
{
    const size_t tiles = (size_t)(t.ctiles * t.ttiles);
    return align256(tiles * sizeof(uint32_t)) + 3 * align256(tiles * width * sizeof(float));
}

inline void carve_lookback(char *base, int width, uint32_t epoch, fxscan::tiling &t)
{
    const size_t tiles = (size_t)(t.ctiles * t.ttiles);
    const size_t flags = align256(tiles * sizeof(uint32_t)), values = align256(tiles * width * sizeof(float));
    t.lb.flags = (uint32_t *)base;
    t.lb.agg_a = (float *)(base + flags);
    t.lb.agg_b = (float *)(base + flags + values);
    t.lb.incl = (float *)(base + flags + 2 * values);
    t.lb.epoch = epoch;
}

} // namespace fxlinrec

#endif
