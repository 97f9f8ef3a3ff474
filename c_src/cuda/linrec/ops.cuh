// Linear recurrences on CUDA: the ops' maths (the coefficients of each
// recurrence and their gradients), the per-thread register budgets and the
// parameter structs, shared by the kernels in linrec/. c_src/cuda/linrec.cu
// and linrec/launchers.cuh launch them; the emulator (test/emu) runs the
// same code on the CPU to check the tiling and look-back without a GPU.
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
// a dt tensor) are stored as rows of f32 partial sums in scratch, a row per
// block (or warp) that adds into them, and added up in row order by a small
// second kernel (sums.cuh): no float atomics, so a run replays bit for bit.
#ifndef FX_CUDA_LINREC_OPS_CUH
#define FX_CUDA_LINREC_OPS_CUH

#include <type_traits>

#include "cuda/async_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/scan.cuh"
#include "cuda/sfu.cuh"
#include "cuda/sums.cuh"
#include "cuda/linrec/tuning.cuh"
#include "cuda/warp_sum.cuh"
#include "fusex_linrec.h"

namespace fx::cuda::linrec {

using fx::cuda::scan::Affine;

// Candidate g exists for mingru and minlstm only.
template <int KIND> constexpr bool has_cand() { return KIND == FX_LINREC_MINGRU || KIND == FX_LINREC_MINLSTM; }

template <int KIND> constexpr int nseq()
{
    return KIND == FX_LINREC_MINLSTM ? 3 : KIND == FX_LINREC_LIQUID ? 1 : 2;
}

// ---- how much a thread holds (the sizes: linrec/tuning.cuh) ----

template <typename T> constexpr int vec_group()
{
    constexpr int lanes = kRowBytes / (kVec * (int)sizeof(T));
    return lanes < 32 ? lanes : 32; // a row is at most a warp (16-bit rows stop at 256 bytes)
}

template <typename T, int V> constexpr int pack_regs()
{
    return (int)sizeof(T) * V < 4 ? 1 : (int)sizeof(T) * V / 4;
}

constexpr int clamp_steps(int s) { return s < 1 ? 1 : s > 16 ? 16 : s; }

// A forward keeps each step's (a, b) from the first pass to the second.
template <int KIND, typename T, int V> constexpr int fwd_steps()
{
    const int loads = nseq<KIND>() * pack_regs<T, V>() + (KIND == FX_LINREC_LIQUID ? 1 : 0);
    const int maps = 2 * V;
    return clamp_steps(kDataRegs / (loads > maps ? loads : maps));
}

// The backward holds the inputs, dh and h_{t-1} of every step (counted as
// widened to f32: the compiler keeps what it converts for the second pass).
template <int KIND, typename T, int V> constexpr int bwd_steps()
{
    return clamp_steps(kDataRegs / ((nseq<KIND>() + 2) * V + (KIND == FX_LINREC_LIQUID ? 1 : 0)));
}

// Which large forwards stage their inputs. Measured on the H200
// (bench/RESULTS.md, decision L5): the staged MinGRU f32 forward
// runs B16 L1024 H1024 in 61 us against 82 us with its inputs in
// registers; the generic scan, MinLSTM, Liquid and 16-bit inputs are as
// fast or faster in registers (the staged kernel computes (a, b) twice),
// and so is every backward (a staged MinGRU backward: 119 against 111 us).
// Small launches stay in registers (latency: one fewer trip through
// shared memory).
template <int KIND, typename T> constexpr bool fwd_stages()
{
    return KIND == FX_LINREC_MINGRU && sizeof(T) == 4;
}
inline bool large_launch(const fx_linrec_problem *p) { return p->batch * p->seqlen * p->hidden >= (1 << 20); }

// ---- the ops' maths, f32 ----

// sigmoid(x) and sigmoid(-x) = 1 - sigmoid(x): two MUFU operations, exact
// limits at +-inf (0 and 1; NaN stays NaN). 1 - sigmoid(x) keeps absolute
// precision (one f32 ulp of sigmoid), not relative precision where it is
// small, as torch's y (1 - y) sigmoid backward. Relative precision
// (e^-x sigmoid(x) for x > 0, a select) cost 7-10 % in the backward
// kernels (H200 A/B: MinGRU 118.7 against 110.3 us, MinLSTM 175 against
// 158), so the tests allow for that ulp (docs/TESTING.md).
__device__ __forceinline__ void sigmoid2(float x, float &pos, float &neg)
{
    pos = fast_rcp(1.f + fast_exp(-x));
    neg = 1.f - pos;
}

__device__ __forceinline__ float softplus(float x)
{
    return fmaxf(x, 0.f) + fast_log(1.f + fast_exp(-fabsf(x)));
}

// The candidate c~ = cand, or with G, g(cand) = cand + 1/2 (cand >= 0),
// sigmoid(cand). (A template flag: the g path's exp and reciprocal cost
// nothing where it is not used.)
template <bool CG> __device__ __forceinline__ float cand_value(float x)
{
    if (!CG)
        return x;
    float s, n;
    sigmoid2(x, s, n);
    return x >= 0.f ? x + 0.5f : s;
}

template <bool CG> __device__ __forceinline__ float cand_slope(float x)
{
    if (!CG || x >= 0.f)
        return 1.f;
    float s, n;
    sigmoid2(x, s, n);
    return s * n;
}

// Per-channel parameters (liquid's 1/tau and A).
struct Chan {
    float inv_tau, lam;
};

struct OpParams {
    const void *seq[FX_LINREC_MAX_SEQ];
    const void *tau, *lam, *dt; // liquid; dt NULL: dt_value
    float dt_value;
};

template <int KIND, bool CG>
__device__ __forceinline__ Affine coeff(const float (&x)[3], Chan c, float dt)
{
    if constexpr (KIND == FX_LINREC_SCAN) {
        return {x[0], x[1]};
    } else if constexpr (KIND == FX_LINREC_MINGRU) {
        float z, keep;
        sigmoid2(x[0], z, keep);
        return {keep, z * cand_value<CG>(x[1])};
    } else if constexpr (KIND == FX_LINREC_MINLSTM) {
        // f' = f / (f + i) = sigmoid(log f - log i), log sigmoid(x) = -softplus(-x)
        float fp, ip;
        sigmoid2(softplus(-x[1]) - softplus(-x[0]), fp, ip);
        return {fp, ip * cand_value<CG>(x[2])};
    } else {
        float f, nf;
        sigmoid2(x[0], f, nf);
        if (dt == 0.f) // a step that does not exist (or a zero step): whatever tau is
            return fx::cuda::scan::identity();
        float inv_den = fast_rcp(fmaf(dt, c.inv_tau + f, 1.f));
        return {inv_den, dt * f * c.lam * inv_den};
    }
}

// One step of the state where no map is kept (the streaming forward):
// MinGRU as h + z (c~ - h), one instruction fewer a step than
// (1 - z) h + z c~ (with the 32-bit row offsets of forward_stream_kernel,
// MinGRU B16 L1024 H1024 55.3 against 56.0 us on the H200; either change
// alone: within noise. bench/RESULTS.md).
template <int KIND, bool CG>
__device__ __forceinline__ float advance(const float (&x)[3], Chan c, float dt, float h)
{
    if constexpr (KIND == FX_LINREC_MINGRU) {
        float z, keep;
        sigmoid2(x[0], z, keep);
        return fmaf(z, cand_value<CG>(x[1]) - h, h);
    } else {
        return fx::cuda::scan::apply(coeff<KIND, CG>(x, c, dt), h);
    }
}

// Gradients of one step's inputs from g = dL/dh_t (in total) and h_{t-1}:
// dx for the sequence inputs; liquid also adds to dtau, dlam and ddt.
// Returns the step's a (what g_t passes on to h_{t-1}).
template <int KIND, bool CG>
__device__ __forceinline__ float step_grad(const float (&x)[3], Chan c, float dt, float hprev,
                                           float g, float (&dx)[3], float &dtau, float &dlam,
                                           float &ddt)
{
    if constexpr (KIND == FX_LINREC_SCAN) {
        dx[0] = g * hprev;
        dx[1] = g;
        return x[0];
    } else if constexpr (KIND == FX_LINREC_MINGRU) {
        float z, keep;
        sigmoid2(x[0], z, keep);
        dx[0] = g * (cand_value<CG>(x[1]) - hprev) * z * keep;
        dx[1] = g * z * cand_slope<CG>(x[1]);
        return keep;
    } else if constexpr (KIND == FX_LINREC_MINLSTM) {
        float fp, ip, sf, nf, si, ni;
        sigmoid2(softplus(-x[1]) - softplus(-x[0]), fp, ip);
        sigmoid2(x[0], sf, nf);
        sigmoid2(x[1], si, ni);
        float dd = g * (hprev - cand_value<CG>(x[2])) * fp * ip;
        dx[0] = dd * nf;  // d/dfl of the log-ratio is 1 - sigmoid(fl)
        dx[1] = -dd * ni; // d/dil is -(1 - sigmoid(il))
        dx[2] = g * ip * cand_slope<CG>(x[2]);
        return fp;
    } else {
        float f, nf;
        sigmoid2(x[0], f, nf);
        float inv_den = fast_rcp(fmaf(dt, c.inv_tau + f, 1.f));
        float h = (hprev + dt * f * c.lam) * inv_den;
        float gd = g * inv_den;
        dx[0] = gd * dt * (c.lam - h) * f * nf;
        dtau += gd * h * dt * c.inv_tau * c.inv_tau;
        dlam += gd * dt * f;
        ddt += gd * (f * c.lam - h * (c.inv_tau + f));
        return inv_den;
    }
}

template <int KIND, typename T, int V>
__device__ __forceinline__ void load_chan(const OpParams &in, int64_t h, bool live, Chan (&c)[V])
{
#pragma unroll
    for (int v = 0; v < V; v++) {
        c[v] = {0.f, 0.f};
        if constexpr (KIND == FX_LINREC_LIQUID) {
            if (live) {
                c[v].inv_tau = 1.f / Elem<T>::load(static_cast<const T *>(in.tau)[h + v]);
                c[v].lam = Elem<T>::load(static_cast<const T *>(in.lam)[h + v]);
            }
        }
    }
}

// The dt of a time row (liquid).
template <int KIND, typename T>
__device__ __forceinline__ float load_dt(const OpParams &in, int64_t index)
{
    if constexpr (KIND == FX_LINREC_LIQUID)
        return in.dt ? Elem<T>::load(static_cast<const T *>(in.dt)[index]) : in.dt_value;
    else
        return 0.f;
}

// The inputs of one step for one channel, as coeff/step_grad take them:
// the first N of a step's M >= N loaded sequences.
template <int N, typename P, int M>
__device__ __forceinline__ void step_inputs(const P (&x)[M], int v, float (&xs)[3])
{
    static_assert(M >= N, "a step's inputs come first");
#pragma unroll
    for (int k = 0; k < 3; k++)
        xs[k] = k < N ? x[k < N ? k : 0].get(v) : 0.f;
}

// What a step that does not exist (past the sequence's end, or a channel
// past hidden) reads for input k: values whose step is the identity map
// (a = 1, b = 0: z = 0; f' = 1, i' = 0; the scan's a = 1; liquid with
// dt = 0), so the scan needs no test per element. Its dh and h_{t-1} are 0.
template <int KIND> __device__ __forceinline__ float pad_value(int k)
{
    if constexpr (KIND == FX_LINREC_SCAN)
        return k == 0 ? 1.f : 0.f;
    else if constexpr (KIND == FX_LINREC_MINGRU)
        return k == 0 ? -INFINITY : 0.f;
    else if constexpr (KIND == FX_LINREC_MINLSTM)
        return k == 0 ? INFINITY : k == 1 ? -INFINITY : 0.f;
    else
        return 0.f;
}

template <int KIND, typename T, int V> __device__ __forceinline__ fx::cuda::scan::Pack<T, V> pad_pack(int k)
{
    fx::cuda::scan::Pack<T, V> x;
    T *e = reinterpret_cast<T *>(&x.r);
#pragma unroll
    for (int v = 0; v < V; v++)
        e[v] = Elem<T>::store(pad_value<KIND>(k));
    return x;
}

// The dt of step c (liquid; 0 where the step does not exist).
template <int KIND, typename T>
__device__ __forceinline__ float step_dt(const OpParams &in, const fx::cuda::scan::Place &at, const fx::cuda::scan::Rows &r,
                                         const fx::cuda::scan::Tiling &t, int c)
{
    if constexpr (KIND != FX_LINREC_LIQUID)
        return 0.f;
    else
        return c < r.count ? load_dt<KIND, T>(in, at.b * t.seqlen + r.row0 + (t.flip ? -c : c)) : 0.f;
}

// The set-up every tiled kernel (forward_kernel, forward_staged_kernel,
// backward_kernel) does once its loads are issued, in this order: each
// step's dt (liquid), the channels' parameters, the state entering the
// tile where it is the first time tile (`start`: h0 for a forward, dstate
// for the backward; NULL: zeros) and the peek at the previous tile's
// inclusive state (scan::peek, whose answer it returns), so that all of
// their loads are in flight together. `each_channel(v)` runs first in the
// loop over the lane's channels (the backward loads h0 there, beside
// dstate). The kernel's own arrays are filled, so that, forced inline, the
// kernels compile as with the set-up written out in each.
template <int KIND, typename T, int V, int G, int S, bool CHAINED, class F>
__device__ __forceinline__ bool tile_start(const OpParams &in, const fx::cuda::scan::Tiling &t,
                                           const fx::cuda::scan::Place &at, const fx::cuda::scan::Rows &r,
                                           const void *start, int start_f32, F &&each_channel, float (&dt)[S],
                                           Chan (&ch)[V], float (&init)[V], float (&peek_h)[V])
{
#pragma unroll
    for (int c = 0; c < S; c++)
        dt[c] = step_dt<KIND, T>(in, at, r, t, c);
    load_chan<KIND, T, V>(in, at.h, at.live, ch);
#pragma unroll
    for (int v = 0; v < V; v++) {
        each_channel(v);
        init[v] = at.tt == 0 && at.live && start
                      ? fx::cuda::scan::load_state<T>(start, start_f32, at.b * t.hidden + at.h + v)
                      : 0.f;
    }
    return fx::cuda::scan::peek<G, V, CHAINED>(t, at, peek_h);
}

} // namespace fx::cuda::linrec

#endif
