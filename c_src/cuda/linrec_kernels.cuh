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

#include <type_traits>

#include "cuda/async_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/scan.cuh"
#include "cuda/sfu.cuh"
#include "cuda/sums.cuh"
#include "cuda/warp_sum.cuh"
#include "fusex_linrec.h"

namespace fxlinrec {

using fxscan::affine;

// Candidate g exists for mingru and minlstm only.
template <int KIND> constexpr bool has_cand() { return KIND == FX_LINREC_MINGRU || KIND == FX_LINREC_MINLSTM; }

template <int KIND> constexpr int nseq()
{
    return KIND == FX_LINREC_MINLSTM ? 3 : KIND == FX_LINREC_LIQUID ? 1 : 2;
}

// ---- how much a thread holds ----

// Blocks of up to 256 threads (fxscan::kBlockThreads). Kernels that hold
// their steps' inputs in registers run two blocks per SM (up to 128
// registers a thread, 64 of them the steps' data); the staged forward,
// whose inputs wait in shared memory (cp.async), runs three.
constexpr int kRegBlocks = 2;
constexpr int kStagedBlocks = 3;
constexpr int kDataRegs = 64;
// A single-tile launch gives each thread at least this many steps (the
// scan across segments stays short: latency).
constexpr int kMinSteps = 4;

// The vector path: 4 channels per lane (16 bytes of f32, 8 of bf16/f16),
// groups of lanes covering 128 bytes of a row.
constexpr int kVec = 4;
#ifndef FXLR_ROW_BYTES // bytes of a tile's time row on the vector path (other widths: measured)
#define FXLR_ROW_BYTES 128
#endif
template <typename T> constexpr int vec_group()
{
    constexpr int lanes = FXLR_ROW_BYTES / (kVec * (int)sizeof(T));
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

// The staged forward: steps a thread stages (the slots of three blocks
// fill an SM's shared memory: 3 x 64 KB for MinGRU f32).
constexpr int kStagedFwdSteps = 8;

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
    pos = fx_fast_rcp(1.f + fx_fast_exp(-x));
    neg = 1.f - pos;
}

__device__ __forceinline__ float softplus(float x)
{
    return fmaxf(x, 0.f) + fx_fast_log(1.f + fx_fast_exp(-fabsf(x)));
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
struct chan {
    float inv_tau, lam;
};

struct op_params {
    const void *seq[FX_LINREC_MAX_SEQ];
    const void *tau, *lam, *dt; // liquid; dt NULL: dt_value
    float dt_value;
};

template <int KIND, bool CG>
__device__ __forceinline__ affine coeff(const float (&x)[3], chan c, float dt)
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
            return fxscan::identity();
        float inv_den = fx_fast_rcp(fmaf(dt, c.inv_tau + f, 1.f));
        return {inv_den, dt * f * c.lam * inv_den};
    }
}

// One step of the state where no map is kept (the streaming forward):
// MinGRU as h + z (c~ - h), one instruction fewer a step than
// (1 - z) h + z c~ (with the 32-bit row offsets of forward_stream_kernel,
// MinGRU B16 L1024 H1024 55.3 against 56.0 us on the H200; either change
// alone: within noise. bench/RESULTS.md).
template <int KIND, bool CG>
__device__ __forceinline__ float advance(const float (&x)[3], chan c, float dt, float h)
{
    if constexpr (KIND == FX_LINREC_MINGRU) {
        float z, keep;
        sigmoid2(x[0], z, keep);
        return fmaf(z, cand_value<CG>(x[1]) - h, h);
    } else {
        return fxscan::apply(coeff<KIND, CG>(x, c, dt), h);
    }
}

// Gradients of one step's inputs from g = dL/dh_t (in total) and h_{t-1}:
// dx for the sequence inputs; liquid also adds to dtau, dlam and ddt.
// Returns the step's a (what g_t passes on to h_{t-1}).
template <int KIND, bool CG>
__device__ __forceinline__ float step_grad(const float (&x)[3], chan c, float dt, float hprev,
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
        float inv_den = fx_fast_rcp(fmaf(dt, c.inv_tau + f, 1.f));
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

template <int KIND, typename T, int V> __device__ __forceinline__ fxscan::pack<T, V> pad_pack(int k)
{
    fxscan::pack<T, V> x;
    T *e = reinterpret_cast<T *>(&x.r);
#pragma unroll
    for (int v = 0; v < V; v++)
        e[v] = fx_elem<T>::store(pad_value<KIND>(k));
    return x;
}

// The dt of step c (liquid; 0 where the step does not exist).
template <int KIND, typename T>
__device__ __forceinline__ float step_dt(const op_params &in, const fxscan::place &at, const fxscan::rows &r,
                                         const fxscan::tiling &t, int c)
{
    if constexpr (KIND != FX_LINREC_LIQUID)
        return 0.f;
    else
        return c < r.count ? load_dt<KIND, T>(in, at.b * t.seqlen + r.row0 + (t.flip ? -c : c)) : 0.f;
}

// ---- forward ----

struct fwd_params {
    op_params in;
    const void *h0; // NULL: zeros
    int h0_f32;
    void *h;
    float *state; // NULL: not wanted
};

// S: the steps a thread can hold (t.steps <= S). CG: candidate g.
// CHAINED: more than one time tile (the look-back).
template <int KIND, typename T, int V, int G, int S, bool CG, bool CHAINED>
__global__ void __launch_bounds__(fxscan::kBlockThreads, kRegBlocks)
    forward_kernel(const fwd_params p, const fxscan::tiling t)
{
    constexpr int N = nseq<KIND>();
    typedef fxscan::pack<T, V> pk;
    typedef fxscan::tile_smem<G, V> shared_t;
    FXSCAN_SHARED(shared_t, sm);
    const fxscan::place at = fxscan::locate<G, V, CHAINED>(t);
    const fxscan::rows r = fxscan::rows_of(t, at);
    const int64_t H = t.hidden;

    // Every load first, so that they are all in flight together.
    pk x[S][N];
#pragma unroll
    for (int c = 0; c < S; c++)
#pragma unroll
        for (int k = 0; k < N; k++)
            x[c][k] = c < r.count
                          ? fxscan::load_stream<T, V>(static_cast<const T *>(p.in.seq[k]) + r.off0 + c * r.stride)
                          : pad_pack<KIND, T, V>(k);
    float dt[S];
#pragma unroll
    for (int c = 0; c < S; c++)
        dt[c] = step_dt<KIND, T>(p.in, at, r, t, c);
    chan ch[V];
    load_chan<KIND, T, V>(p.in, at.h, at.live, ch);
    float init[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        init[v] = at.tt == 0 && at.live && p.h0 ? fxscan::load_state<T>(p.h0, p.h0_f32, at.b * H + at.h + v)
                                                : 0.f;
    float peek_h[V];
    const bool peeked = fxscan::peek<G, V, CHAINED>(t, at, peek_h);

    // First pass: each step's map, composed.
    affine mine[V], kept[S][V];
#pragma unroll
    for (int v = 0; v < V; v++)
        mine[v] = fxscan::identity();
#pragma unroll
    for (int c = 0; c < S; c++)
#pragma unroll
        for (int v = 0; v < V; v++) {
            float xs[3];
            step_inputs<N>(x[c], v, xs);
            kept[c][v] = coeff<KIND, CG>(xs, ch[v], dt[c]);
            mine[v] = fxscan::compose(mine[v], kept[c][v]);
        }

    float hv[V];
    fxscan::scan_tile<G, V, CHAINED>(t, at, mine, init, peeked, peek_h, sm, hv);

    // Second pass: from the carry, every step's h.
#pragma unroll
    for (int c = 0; c < S; c++) {
#pragma unroll
        for (int v = 0; v < V; v++)
            hv[v] = fxscan::apply(kept[c][v], hv[v]);
        if (c < r.count)
            fxscan::store_stream<T, V>(static_cast<T *>(p.h) + r.off0 + c * r.stride, hv);
    }
    // The last segment of the last tile ends on the final state (steps
    // past the end are identities).
    if (p.state && at.live && at.tt == t.ttiles - 1 && at.seg == t.segs - 1)
#pragma unroll
        for (int v = 0; v < V; v++)
            p.state[at.b * H + at.h + v] = hv[v];
}

// The forward with the inputs staged in shared memory (cp.async) rather
// than held in registers: a thread holds no step's data, so more blocks
// fit an SM; both passes read the slots and compute (a, b) from them. A
// thread copies its own runs into its own slots and reads them back
// itself, so no barrier is needed: slot s of thread i is stage[s *
// threads + i].
// Its set-up (dt, channel parameters, h0, peek) repeats forward_kernel's on
// purpose: sharing it in one helper moved registers and made MinLSTM B16
// 5 % slower (93.7 -> 98.6 us, A/B twice in one run; bench/RESULTS.md).
template <int KIND, typename T, int V, int G, int S, bool CG, bool CHAINED>
__global__ void __launch_bounds__(fxscan::kBlockThreads, kStagedBlocks)
    forward_staged_kernel(const fwd_params p, const fxscan::tiling t)
{
    constexpr int N = nseq<KIND>();
    typedef fxscan::pack<T, V> pk;
    typedef typename pk::R R;
    typedef fxscan::tile_smem<G, V> shared_t;
    FXSCAN_SHARED(shared_t, sm);
    FXSCAN_STAGE(stage_bytes);
    const R *slots = reinterpret_cast<const R *>(stage_bytes) + threadIdx.x;
    const fxscan::place at = fxscan::locate<G, V, CHAINED>(t);
    const fxscan::rows r = fxscan::rows_of(t, at);
    const int64_t H = t.hidden;
    const unsigned threads = blockDim.x;

#pragma unroll
    for (int c = 0; c < S; c++)
        if (c < r.count)
#pragma unroll
            for (int k = 0; k < N; k++)
                fx_copy_async<sizeof(R)>(reinterpret_cast<R *>(stage_bytes) + (c * N + k) * threads + threadIdx.x,
                                         static_cast<const T *>(p.in.seq[k]) + r.off0 + c * r.stride);
    float dt[S];
#pragma unroll
    for (int c = 0; c < S; c++)
        dt[c] = step_dt<KIND, T>(p.in, at, r, t, c);
    chan ch[V];
    load_chan<KIND, T, V>(p.in, at.h, at.live, ch);
    float init[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        init[v] = at.tt == 0 && at.live && p.h0 ? fxscan::load_state<T>(p.h0, p.h0_f32, at.b * H + at.h + v)
                                                : 0.f;
    float peek_h[V];
    const bool peeked = fxscan::peek<G, V, CHAINED>(t, at, peek_h);
    fx_copy_wait_all();

    auto step_map = [&](int c, int v, const pk (&xc)[N]) {
        float xs[3];
        step_inputs<N>(xc, v, xs);
        return coeff<KIND, CG>(xs, ch[v], dt[c]);
    };
    auto read_step = [&](int c, pk (&xc)[N]) {
#pragma unroll
        for (int k = 0; k < N; k++)
            xc[k] = c < r.count ? pk{slots[(c * N + k) * threads]} : pad_pack<KIND, T, V>(k);
    };

    affine mine[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        mine[v] = fxscan::identity();
#pragma unroll
    for (int c = 0; c < S; c++) {
        pk xc[N];
        read_step(c, xc);
#pragma unroll
        for (int v = 0; v < V; v++)
            mine[v] = fxscan::compose(mine[v], step_map(c, v, xc));
    }

    float hv[V];
    fxscan::scan_tile<G, V, CHAINED>(t, at, mine, init, peeked, peek_h, sm, hv);

#pragma unroll
    for (int c = 0; c < S; c++) {
        pk xc[N];
        read_step(c, xc);
#pragma unroll
        for (int v = 0; v < V; v++)
            hv[v] = fxscan::apply(step_map(c, v, xc), hv[v]);
        if (c < r.count)
            fxscan::store_stream<T, V>(static_cast<T *>(p.h) + r.off0 + c * r.stride, hv);
    }
    if (p.state && at.live && at.tt == t.ttiles - 1 && at.seg == t.segs - 1)
#pragma unroll
        for (int v = 0; v < V; v++)
            p.state[at.b * H + at.h + v] = hv[v];
}

// Shared memory the staged forward's slots take: the inputs of every step.
template <int KIND, typename T, int V> inline size_t fwd_stage_bytes(int steps, int warps)
{
    return (size_t)steps * nseq<KIND>() * 32 * warps * sizeof(typename fxscan::pack<T, V>::R);
}

// ---- the streaming forward ----
//
// Where there are channels enough for a warp on every scheduler, tiles and
// their look-back are not needed: a warp owns a 128-byte column of channels
// (32 lanes of 4 bytes: one f32 channel or two 16-bit ones a lane) of one
// batch element and walks the whole sequence with h in registers. Its
// inputs flow through a ring of stages of steps in shared memory
// (stream_shape), each lane copying 16-byte pieces with cp.async: all
// stages but the one being computed are in flight, so a warp always has its
// next ~80-96 steps' loads outstanding and never waits for a predecessor
// tile.
// (The tiled kernels' block life of load, scan, store leaves memory idle
// between blocks: bench/RESULTS.md, decision L1.) The warps of a block share no
// data, but they walk the neighbouring columns of the same rows in lockstep,
// a stage at a time (stream_ring::lockstep). 16 steps a stage, 6 stages and
// 2-warp blocks measured best of 8 x 6, 8 x 12, 8 x 20, 16 x 6, 16 x 8,
// 32 x 4 and 4-warp blocks (H200) for the kernels that stage two sequences
// (MinGRU's and the scan's forwards); lockstep in 2-warp blocks beat free
// warps, in 4-warp blocks it did not.
#ifndef FXLR_STREAM_STEPS // other stage shapes, measured against this one
#define FXLR_STREAM_STEPS 16
#endif
#ifndef FXLR_STREAM_STAGES
#define FXLR_STREAM_STAGES 6
#endif
#ifndef FXLR_STREAM_WARPS
#define FXLR_STREAM_WARPS 2
#endif
#ifndef FXLR_STREAM_LOCKSTEP // 0: each warp runs free (stream_ring::lockstep)
#define FXLR_STREAM_LOCKSTEP 1
#endif
// The forwards that stage other than two sequences have shapes of their
// own (stream_shape below): 32 x 4 measured best for MinLSTM's with the
// identity candidate (three sequences: 73.6 against 75.9 us at 16 x 6 and
// 74.4 at 8 x 12, B16 L1024 H1024; with the candidate g, 76.7 against 73.3
// at 16 x 6, which it keeps) and for Liquid's (one: 40.4 against 41.2 at
// 16 x 6, 48.0 against 61.3 with a dt tensor; 8 x 12, 32 x 8, 32 x 12 and
// 16 x 12 slower).
#ifndef FXLR_STREAM_MINLSTM_FWD_STEPS
#define FXLR_STREAM_MINLSTM_FWD_STEPS 32
#endif
#ifndef FXLR_STREAM_MINLSTM_FWD_STAGES
#define FXLR_STREAM_MINLSTM_FWD_STAGES 4
#endif
#ifndef FXLR_STREAM_LIQUID_FWD_STEPS
#define FXLR_STREAM_LIQUID_FWD_STEPS 32
#endif
#ifndef FXLR_STREAM_LIQUID_FWD_STAGES
#define FXLR_STREAM_LIQUID_FWD_STAGES 4
#endif
constexpr int kStreamSteps = FXLR_STREAM_STEPS;
constexpr int kStreamWarps = FXLR_STREAM_WARPS;
constexpr int kStreamStages = FXLR_STREAM_STAGES;
constexpr bool kStreamLockstep = FXLR_STREAM_LOCKSTEP;
// The most steps a stage of any streaming kernel: a stage's row offsets
// are 32-bit below hidden * kStreamMaxSteps < 2^31 (stream_fits).
constexpr int kStreamMaxSteps = 32;

template <typename T> constexpr int stream_vec() { return 4 / (int)sizeof(T); }

struct stream_tiling {
    int64_t batch, seqlen, hidden;
    int64_t columns; // 128-byte columns of channels per batch element
    int flip;        // reverse
};

// The threads of this block's live warps (the last block may have fewer).
__device__ __forceinline__ int stream_block_threads(const stream_tiling &s)
{
    const int64_t left = s.batch * s.columns - (int64_t)blockIdx.x * kStreamWarps;
    return 32 * (int)(left < kStreamWarps ? left : kStreamWarps);
}

// A barrier over the block's live warps (a warp of a column past the end
// has returned): named barrier 1 with their count.
__device__ __forceinline__ void stream_bar_sync(int threads)
{
#if defined(__CUDA_ARCH__)
    asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
#elif defined(FXSCAN_EMULATION)
    emu_bar_sync(1, threads);
#else
    (void)threads;
#endif
}

// The ring of one streaming kernel: SEQS sequences (the op's inputs; the
// backward also dh and h of the step before), STEPS steps a stage, STAGES
// stages. kStreamStages of kStreamSteps, fewer stages where a stage holds
// many sequences (MinLSTM's backward, 5), so that two 2-warp blocks fit an
// SM (<= 56 KB a warp); MinLSTM's forward (three sequences, the identity
// candidate: CG false) and Liquid's (one) have shapes of their own.
template <int KIND, bool BACKWARD, bool CG> struct stream_shape {
    static constexpr int SEQS = nseq<KIND>() + (BACKWARD ? 2 : 0);
    static constexpr bool MINLSTM = !BACKWARD && !CG && KIND == FX_LINREC_MINLSTM;
    static constexpr bool LIQUID = !BACKWARD && KIND == FX_LINREC_LIQUID;
    static constexpr int STEPS = MINLSTM  ? FXLR_STREAM_MINLSTM_FWD_STEPS
                                 : LIQUID ? FXLR_STREAM_LIQUID_FWD_STEPS
                                          : kStreamSteps;
    static constexpr int OWN_STAGES = MINLSTM  ? FXLR_STREAM_MINLSTM_FWD_STAGES
                                      : LIQUID ? FXLR_STREAM_LIQUID_FWD_STAGES
                                               : kStreamStages;
    static constexpr int WORDS = SEQS * STEPS * 32; // a stage's 4-byte words: sequence, step, lane
    static constexpr int FIT = 56 * 1024 / (WORDS * 4); // stages in 56 KB: two 2-warp blocks an SM
    static constexpr int STAGES = OWN_STAGES < FIT ? OWN_STAGES : FIT;
    static constexpr size_t BLOCK_BYTES = (size_t)kStreamWarps * STAGES * WORDS * 4;
    static_assert(STEPS % 4 == 0 && STEPS <= kStreamMaxSteps && STAGES >= 2, "a stage is whole groups of 4 rows");
};
template <int KIND, bool BACKWARD, bool CG> inline size_t stream_block_bytes()
{
    return stream_shape<KIND, BACKWARD, CG>::BLOCK_BYTES;
}

// One warp's ring: STAGES stages of K rows of SEQS sequences,
// each row a 128-byte piece (the warp's column) of a [batch, seqlen,
// hidden] tensor, walked from row0 by `stride` elements a step. A lane
// copies piece lane % 8 of the rows of steps 4q + lane / 8 of a stage, for
// every sequence and q: in the ring that is word 4 * lane of row (k, 4q).
// Sequence k's steps from `last[k]` on (and a column's pieces past hidden)
// are zero-filled. All stages but the one being read are in flight.
template <typename T, int SEQS, int K, int STAGES> struct stream_ring {
    static constexpr int Q = K / 4, WORDS = SEQS * K * 32; // words a stage
    static constexpr int PIECE = 16 / (int)sizeof(T);      // elements a copy
    const T *src[SEQS][Q];
    const T *zero[SEQS]; // any valid address of the sequence: the source of a zero fill
    int64_t last[SEQS], whole_to, stride, stages;
    uint32_t *ring, *ring_end, *fill;
    const uint32_t *read;
    int lane, sub;
    int block_threads; // of the block's live warps
    bool piece_live;

    // seq[k] + first[k] + row0: sequence k's row of step 0 (all in elements)
    __device__ __forceinline__ stream_ring(uint32_t *words, const void *const (&seq)[SEQS],
                                           const int64_t (&first)[SEQS], const int64_t (&last_)[SEQS],
                                           int64_t row0, int64_t stride_, int64_t seqlen, int64_t ch0,
                                           int64_t hidden, int lane_, int block_threads_)
        : stride(stride_), ring(words), ring_end(words + STAGES * WORDS), fill(words), lane(lane_),
          block_threads(block_threads_)
    {
        sub = lane >> 3;
        const int64_t piece_ch = ch0 + (lane & 7) * PIECE;
        piece_live = piece_ch < hidden;
        stages = (seqlen + K - 1) / K;
        whole_to = seqlen;
#pragma unroll
        for (int k = 0; k < SEQS; k++) {
            zero[k] = static_cast<const T *>(seq[k]);
            last[k] = last_[k];
            whole_to = last[k] < whole_to ? last[k] : whole_to;
#pragma unroll
            for (int q = 0; q < Q; q++)
                src[k][q] = zero[k] + first[k] + row0 + (4 * q + sub) * stride + piece_ch;
        }
        read = ring + lane;
    }

    template <bool WHOLE> __device__ __forceinline__ void copies(int64_t st)
    {
#pragma unroll
        for (int k = 0; k < SEQS; k++)
#pragma unroll
            for (int q = 0; q < Q; q++) {
                // (a whole stage tests only the lane's piece, once per launch)
                const bool ok = piece_live && (WHOLE || st * K + 4 * q + sub < last[k]);
                fx_copy_async<16, FX_COPY_L2_128>(fill + 4 * lane + (k * K + 4 * q) * 32, ok ? src[k][q] : zero[k],
                                                  ok);
                src[k][q] += K * stride;
            }
    }

    // Starts the copies of stage st into the slot after the last one filled.
    __device__ __forceinline__ void issue(int64_t st)
    {
        if (st < stages) {
            if ((st + 1) * K <= whole_to)
                copies<true>(st);
            else
                copies<false>(st);
            fill = fill + WORDS == ring_end ? ring : fill + WORDS;
        }
        fx_copy_commit(); // an empty group past the end keeps the count
    }

    __device__ __forceinline__ void start()
    {
#pragma unroll
        for (int st = 0; st < STAGES - 1; st++)
            issue(st);
    }

    // Waits for stage st and starts stage st + STAGES - 1 into the slot of
    // stage st - 1.
    __device__ __forceinline__ void advance(int64_t st)
    {
        fx_copy_wait<STAGES - 2>(); // this lane's copies of stage st
        lockstep();                 // everyone's, and stage st - 1 read by all
        issue(st + STAGES - 1);
    }

    // A barrier over the warp or, where the block has more than one live
    // warp, over the block's live warps: they own the neighbouring 128-byte
    // pieces of the same rows, and a row's pieces requested together are read
    // faster than by warps drifting apart (B16 -0.6 to -0.9 us:
    // bench/RESULTS.md). The warps share no data; this barrier is for timing.
    __device__ __forceinline__ void lockstep() const
    {
        if (kStreamLockstep && block_threads > 32)
            stream_bar_sync(block_threads);
        else
            __syncwarp();
    }

    // The rows of the stage advanced to, into x: every read before the
    // caller's first store (the compiler cannot move a shared-memory load
    // above a global store it might alias).
    template <typename P> __device__ __forceinline__ void read_stage(P (&x)[K][SEQS])
    {
#pragma unroll
        for (int j = 0; j < K; j++)
#pragma unroll
            for (int k = 0; k < SEQS; k++)
                x[j][k].r = read[(k * K + j) * 32];
        read = read + WORDS >= ring_end ? ring + lane : read + WORDS;
    }
};

// Where a streaming warp works: batch element b, channels ch0 .. ch0 + 32 V
// (its lane: mine .. mine + V - 1, live when inside hidden), rows walked
// from row0 by stride elements a step (s.flip: towards lower rows).
struct stream_column {
    int64_t b, ch0, mine, stride, row0;
    bool live;
    __device__ __forceinline__ stream_column(const stream_tiling &s, int64_t column, int lane, int vec)
    {
        b = column / s.columns;
        ch0 = (column - b * s.columns) * 32 * vec;
        mine = ch0 + lane * vec;
        live = mine < s.hidden; // hidden is a multiple of vec
        stride = s.flip ? -s.hidden : s.hidden;
        row0 = (b * s.seqlen + (s.flip ? s.seqlen - 1 : 0)) * s.hidden;
    }
};

// Liquid's dt of a walk's steps (0 for the other ops). A scalar dt is a
// constant: nothing is tested per step (the first version tested every
// step of every stage against the sequence's end and selected the scalar,
// which cost the backward 97 against 80 us: bench/RESULTS.md). A dt
// tensor's values are loaded a stage ahead, each lane loading every step's
// (the 32 loads of a stage read one line), long before their use. Passing
// a stage's values through shared memory or by shuffles from one load a
// lane measured ~10 us slower in each direction: those values then come
// from shared-memory loads or shuffles at the stage's start, beside the
// ring's 32 loads of the stage, and ncu put the warp waiting on them (short
// scoreboard, 1.5 cycles an instruction) where it now waits on nothing.
template <int KIND, typename T, int K> struct stream_dt {
    float next[K];

    __device__ __forceinline__ void load(const op_params &in, const stream_tiling &s, int64_t b, int64_t st)
    {
        if (KIND == FX_LINREC_LIQUID && in.dt)
#pragma unroll
            for (int j = 0; j < K; j++) {
                const int64_t step = st * K + j;
                next[j] = step < s.seqlen
                              ? load_dt<KIND, T>(in, b * s.seqlen + (s.flip ? s.seqlen - 1 - step : step))
                              : 0.f;
            }
    }

    // stage st's into dt, and stage st + 1's on their way
    __device__ __forceinline__ void take(const op_params &in, const stream_tiling &s, int64_t b, int64_t st,
                                         float (&dt)[K])
    {
        if constexpr (KIND != FX_LINREC_LIQUID) {
#pragma unroll
            for (int j = 0; j < K; j++)
                dt[j] = 0.f;
        } else if (!in.dt) {
#pragma unroll
            for (int j = 0; j < K; j++)
                dt[j] = in.dt_value;
        } else {
#pragma unroll
            for (int j = 0; j < K; j++)
                dt[j] = next[j];
            load(in, s, b, st + 1);
        }
    }
};

// With one warp per scheduler nothing hides a warp's own latencies, so the
// loop is lean: pointers step by a row, no 64-bit index maths or branch
// per step (a first version spent 42 instructions a step on them and ran
// at half the tiled kernels' speed: bench/RESULTS.md).
template <int KIND, typename T, bool CG>
__global__ void __launch_bounds__(32 * kStreamWarps) forward_stream_kernel(const fwd_params p, const stream_tiling s)
{
    typedef stream_shape<KIND, false, CG> shape;
    constexpr int N = nseq<KIND>(), V = stream_vec<T>(), K = shape::STEPS;
    typedef fxscan::pack<T, V> pk;
    static_assert(sizeof(typename pk::R) == 4, "a lane's part of a row is one 4-byte word");
    FXSCAN_STAGE(stage_bytes);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t column = (int64_t)blockIdx.x * kStreamWarps + warp;
    if (column >= s.batch * s.columns)
        return; // a whole warp: the others never wait for it
    const int64_t L = s.seqlen, H = s.hidden;
    const stream_column col(s, column, lane, V);
    const int64_t b = col.b, mine = col.mine, stride = col.stride, row0 = col.row0;
    const bool live = col.live;
    const void *seqs[N];
    int64_t first[N], last[N];
#pragma unroll
    for (int k = 0; k < N; k++)
        seqs[k] = p.in.seq[k], first[k] = 0, last[k] = L;
    stream_ring<T, N, K, shape::STAGES> ring(reinterpret_cast<uint32_t *>(stage_bytes) +
                                                 warp * shape::STAGES * shape::WORDS,
                                             seqs, first, last, row0, stride, L, col.ch0, H, lane,
                                             stream_block_threads(s));

    chan ch[V];
    load_chan<KIND, T, V>(p.in, mine, live, ch);
    float h[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        h[v] = live && p.h0 ? fxscan::load_state<T>(p.h0, p.h0_f32, b * H + mine + v) : 0.f;
    T *out = static_cast<T *>(p.h) + row0 + mine;
    // A step's row within a stage: one 32-bit multiply-add, not a 64-bit
    // one (|stride| = hidden < 2^31 / K: stream_fits)
    const int row_step = (int)stride;
    stream_dt<KIND, T, K> dts;
    dts.load(p.in, s, b, 0);

    ring.start();
    for (int64_t st = 0; st < ring.stages; st++) {
        ring.advance(st);
        float dt[K];
        dts.take(p.in, s, b, st, dt);
        pk x[K][N];
        ring.read_stage(x);
        const int n = L - st * K < K ? (int)(L - st * K) : K;
        auto steps = [&](auto whole) {
#pragma unroll
            for (int j = 0; j < K; j++) {
                if (!decltype(whole)::value && j >= n)
                    break;
#pragma unroll
                for (int v = 0; v < V; v++) {
                    float xs[3];
                    step_inputs<N>(x[j], v, xs);
                    h[v] = advance<KIND, CG>(xs, ch[v], dt[j], h[v]);
                }
                if (live)
                    fxscan::store_stream<T, V>(out + j * row_step, h);
            }
        };
        if (n == K)
            steps(std::true_type{});
        else
            steps(std::false_type{});
        out += K * stride;
    }
    if (p.state && live)
#pragma unroll
        for (int v = 0; v < V; v++)
            p.state[b * H + mine + v] = h[v];
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
    // liquid: f32 sums, [hidden] each, and [dt_rows(...)][batch * seqlen]
    float *sum_tau, *sum_lam, *sum_dt;
    int reverse; // of the forward
};

template <int KIND, typename T, int V, int G, int S, bool CG, bool CHAINED>
__global__ void __launch_bounds__(fxscan::kBlockThreads, kRegBlocks)
    backward_kernel(const bwd_params p, const fxscan::tiling t)
{
    constexpr int N = nseq<KIND>();
    typedef fxscan::pack<T, V> pk;
    typedef fxscan::tile_smem<G, V> shared_t;
    FXSCAN_SHARED(shared_t, sm);
    const fxscan::place at = fxscan::locate<G, V, CHAINED>(t);
    const fxscan::rows r = fxscan::rows_of(t, at);
    const int64_t L = t.seqlen, H = t.hidden;
    // Backward step p is forward step L-1-p (t.flip = !reverse maps it to
    // its row); h_{t-1} (forward order) sits one row towards the forward's
    // start, and the forward's first step (backward step L-1, the
    // segment's step `first`) starts from h0 instead.
    const int64_t prev = p.reverse ? H : -H;
    const int64_t first = L - 1 - at.p0; // in this segment when 0 <= first < count

    pk x[S][N], dh[S], hp[S];
#pragma unroll
    for (int c = 0; c < S; c++) {
        const int64_t off = r.off0 + c * r.stride;
#pragma unroll
        for (int k = 0; k < N; k++)
            x[c][k] = c < r.count ? fxscan::load_stream<T, V>(static_cast<const T *>(p.in.seq[k]) + off)
                                  : pad_pack<KIND, T, V>(k);
        dh[c] = c < r.count ? fxscan::load_stream<T, V>(static_cast<const T *>(p.dh) + off) : fxscan::zero_pack<T, V>();
        hp[c] = c < r.count && c != first ? fxscan::load_stream<T, V>(static_cast<const T *>(p.h) + off + prev)
                                          : fxscan::zero_pack<T, V>();
    }
    float dt[S];
#pragma unroll
    for (int c = 0; c < S; c++)
        dt[c] = step_dt<KIND, T>(p.in, at, r, t, c);
    chan ch[V];
    load_chan<KIND, T, V>(p.in, at.h, at.live, ch);
    float h0v[V], init[V];
#pragma unroll
    for (int v = 0; v < V; v++) {
        h0v[v] = first >= 0 && first < r.count && p.h0 ? fxscan::load_state<T>(p.h0, p.h0_f32, at.b * H + at.h + v)
                                                      : 0.f;
        init[v] = at.tt == 0 && at.live && p.dstate
                      ? fxscan::load_state<T>(p.dstate, p.dstate_f32, at.b * H + at.h + v)
                      : 0.f;
    }
    float peek_u[V];
    const bool peeked = fxscan::peek<G, V, CHAINED>(t, at, peek_u);

    // The adjoint's map per step: u -> a * (dh + u).
    affine mine[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        mine[v] = fxscan::identity();
#pragma unroll
    for (int c = 0; c < S; c++)
#pragma unroll
        for (int v = 0; v < V; v++) {
            float xs[3];
            step_inputs<N>(x[c], v, xs);
            const float a = coeff<KIND, CG>(xs, ch[v], dt[c]).a;
            mine[v] = fxscan::compose(mine[v], affine{a, a * dh[c].get(v)});
        }

    float u[V];
    fxscan::scan_tile<G, V, CHAINED>(t, at, mine, init, peeked, peek_u, sm, u);

    float sum_tau[V] = {}, sum_lam[V] = {};
#pragma unroll
    for (int c = 0; c < S; c++) {
        float dx[3][V], row_dt = 0.f;
#pragma unroll
        for (int v = 0; v < V; v++) {
            // (a step that does not exist passes u on unchanged and adds
            // nothing to tau's and A's sums: dt = 0)
            const float g = dh[c].get(v) + u[v];
            float xs[3], d3[3] = {0.f, 0.f, 0.f}, dtau = 0.f, dlam = 0.f, ddt = 0.f;
            step_inputs<N>(x[c], v, xs);
            const float a = step_grad<KIND, CG>(xs, ch[v], dt[c], c == first ? h0v[v] : hp[c].get(v), g, d3,
                                                dtau, dlam, ddt);
#pragma unroll
            for (int k = 0; k < 3; k++)
                dx[k][v] = d3[k];
            sum_tau[v] += dtau;
            sum_lam[v] += dlam;
            row_dt += ddt;
            u[v] = a * g;
        }
        if (c < r.count)
#pragma unroll
            for (int k = 0; k < N; k++)
                fxscan::store_stream<T, V>(static_cast<T *>(p.dseq[k]) + r.off0 + c * r.stride, dx[k]);
        if constexpr (KIND == FX_LINREC_LIQUID) {
            if (p.sum_dt) { // one atomic per group and row
                row_dt = fxscan::group_sum<G>(row_dt);
                if (at.q == 0 && c < r.count)
                    atomicAdd(p.sum_dt + at.b * L + r.row0 + (t.flip ? -c : c), row_dt);
            }
        }
    }
    if (p.dh0 && at.live && at.tt == t.ttiles - 1 && at.seg == t.segs - 1)
#pragma unroll
        for (int v = 0; v < V; v++)
            fxscan::store_state<T>(p.dh0, p.h0_f32, at.b * H + at.h + v, u[v]);

    if constexpr (KIND == FX_LINREC_LIQUID) {
        // The block's tau and A sums, one atomic per channel: over the
        // segments of a warp by shuffles, over warps through the warp-total
        // arrays (free once every thread is past the barrier).
#pragma unroll
        for (int v = 0; v < V; v++) {
            sum_tau[v] = fxscan::segment_sum<G>(sum_tau[v]);
            sum_lam[v] = fxscan::segment_sum<G>(sum_lam[v]);
        }
        __syncthreads();
        const int c0 = at.q * V;
        if (at.lane < G)
#pragma unroll
            for (int v = 0; v < V; v++) {
                sm.ta[at.warp][c0 + v] = sum_tau[v];
                sm.tb[at.warp][c0 + v] = sum_lam[v];
            }
        __syncthreads();
        if (at.warp == 0 && at.lane < G && at.h < H) {
            const int warps = (int)(blockDim.x >> 5);
#pragma unroll
            for (int v = 0; v < V; v++) {
                float st = 0.f, sl = 0.f;
                for (int w = 0; w < warps; w++) {
                    st += sm.ta[w][c0 + v];
                    sl += sm.tb[w][c0 + v];
                }
                atomicAdd(p.sum_tau + at.h + v, st);
                atomicAdd(p.sum_lam + at.h + v, sl);
            }
        }
    }
}

// ---- the streaming backward ----
//
// The streaming forward's layout run backwards: a warp owns a 128-byte
// column of one batch element and walks from the forward's last step to its
// first with the adjoint u = dL/dh flowing in from the later steps in
// registers. Its ring carries per step the op's inputs, dh and h of the
// forward step before (the next row of the walk; the walk's last step, the
// forward's first, takes h0 instead), and each step writes the gradients of
// its inputs.

template <int KIND, typename T, bool CG>
__global__ void __launch_bounds__(32 * kStreamWarps) backward_stream_kernel(const bwd_params p, const stream_tiling s)
{
    typedef stream_shape<KIND, true, CG> shape;
    constexpr int N = nseq<KIND>(), SEQS = shape::SEQS, V = stream_vec<T>(), K = shape::STEPS;
    constexpr int STAGES = shape::STAGES;
    typedef fxscan::pack<T, V> pk;
    FXSCAN_STAGE(stage_bytes);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t column = (int64_t)blockIdx.x * kStreamWarps + warp;
    if (column >= s.batch * s.columns)
        return;
    const int64_t L = s.seqlen, H = s.hidden;
    const stream_column col(s, column, lane, V); // s.flip: the forward ran upwards
    const int64_t b = col.b, mine = col.mine, stride = col.stride, row0 = col.row0;
    const bool live = col.live;
    const void *seqs[SEQS];
    int64_t first[SEQS], last[SEQS];
#pragma unroll
    for (int k = 0; k < N; k++)
        seqs[k] = p.in.seq[k], first[k] = 0, last[k] = L;
    seqs[N] = p.dh, first[N] = 0, last[N] = L;
    seqs[N + 1] = p.h, first[N + 1] = stride, last[N + 1] = L - 1; // h_{t-1}: one row on
    stream_ring<T, SEQS, K, STAGES> ring(reinterpret_cast<uint32_t *>(stage_bytes) + warp * STAGES * shape::WORDS,
                                         seqs, first, last, row0, stride, L, col.ch0, H, lane,
                                         stream_block_threads(s));

    chan ch[V];
    load_chan<KIND, T, V>(p.in, mine, live, ch);
    float u[V], h0v[V], sum_tau[V] = {}, sum_lam[V] = {};
#pragma unroll
    for (int v = 0; v < V; v++) {
        u[v] = live && p.dstate ? fxscan::load_state<T>(p.dstate, p.dstate_f32, b * H + mine + v) : 0.f;
        h0v[v] = live && p.h0 ? fxscan::load_state<T>(p.h0, p.h0_f32, b * H + mine + v) : 0.f;
    }
    int64_t out = row0 + mine;                         // the gradients' element of the current step
    // liquid: this column's row of ddt sums, at the stage's first step
    float *dt_sums = p.sum_dt ? p.sum_dt + (column - b * s.columns) * (s.batch * L) + b * L : nullptr;
    stream_dt<KIND, T, K> dts;
    dts.load(p.in, s, b, 0);

    ring.start();
    for (int64_t st = 0; st < ring.stages; st++) {
        ring.advance(st);
        float dt[K];
        dts.take(p.in, s, b, st, dt);
        pk x[K][SEQS];
        ring.read_stage(x);
        const int n = L - st * K < K ? (int)(L - st * K) : K; // steps of this stage
        float lane_dt[K]; // liquid: the lane's part of each step's ddt
        // a whole stage: K steps, none of them the forward's first
        auto steps = [&](auto whole) {
#pragma unroll
            for (int j = 0; j < K; j++) {
                if (!decltype(whole)::value && j >= n)
                    break;
                const bool at_h0 = !decltype(whole)::value && j == n - 1 && st * K + j == L - 1;
                float dx[3][V], row_dt = 0.f;
#pragma unroll
                for (int v = 0; v < V; v++) {
                    float xs[3], d3[3] = {0.f, 0.f, 0.f}, dtau = 0.f, dlam = 0.f, ddt = 0.f;
                    step_inputs<N>(x[j], v, xs);
                    const float g = x[j][N].get(v) + u[v];
                    const float hprev = at_h0 ? h0v[v] : x[j][N + 1].get(v);
                    const float a = step_grad<KIND, CG>(xs, ch[v], dt[j], hprev, g, d3, dtau, dlam, ddt);
#pragma unroll
                    for (int k = 0; k < 3; k++)
                        dx[k][v] = d3[k];
                    sum_tau[v] += dtau;
                    sum_lam[v] += dlam;
                    row_dt += ddt;
                    u[v] = a * g;
                }
                if (live)
#pragma unroll
                    for (int k = 0; k < N; k++)
                        fxscan::store_stream<T, V>(static_cast<T *>(p.dseq[k]) + out, dx[k]);
                if constexpr (KIND == FX_LINREC_LIQUID)
                    lane_dt[j] = live ? row_dt : 0.f;
                out += stride;
            }
        };
        if (n == K && (st + 1) * K < L) {
            steps(std::true_type{});
        } else {
#pragma unroll
            for (int j = 0; j < K; j++)
                lane_dt[j] = 0.f;
            steps(std::false_type{});
        }
        // The stage's ddt parts summed over the warp: one transposing sum a
        // stage (K shuffles), not a 5-shuffle sum a step on a warp alone on
        // its scheduler. A row's warps (one a column) would hit one address
        // at once with atomics (the Liquid fwd+bwd with a dt tensor took 240
        // us against 137 with a scalar), so each column stores its own row
        // of sums (dt_rows), which fx_write_sums adds up.
        if constexpr (KIND == FX_LINREC_LIQUID) {
            if (dt_sums) {
                // one sum a lane: step j's (the 32 / K lanes of a step hold the same)
                const int j = fx_warp::transpose_sum<K, 0>(lane_dt, lane);
                if ((lane & (32 / K - 1)) == 0 && j < n)
                    dt_sums[s.flip ? L - 1 - (st * K + j) : st * K + j] = lane_dt[0];
            }
        }
    }
    if (p.dh0 && live) // after the forward's first step, u is dL/dh0
#pragma unroll
        for (int v = 0; v < V; v++)
            fxscan::store_state<T>(p.dh0, p.h0_f32, b * H + mine + v, u[v]);
    if constexpr (KIND == FX_LINREC_LIQUID) {
        if (live)
#pragma unroll
            for (int v = 0; v < V; v++) {
                atomicAdd(p.sum_tau + mine + v, sum_tau[v]);
                atomicAdd(p.sum_lam + mine + v, sum_lam[v]);
            }
    }
}

// ---- step: one frame, elementwise ----

struct step_params {
    op_params in; // seq [batch, hidden]; dt [batch, 1]
    void *state;
    int state_f32;
    void *h;
    int64_t batch, hidden;
};

template <int KIND, typename T, bool CG>
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
        affine m = coeff<KIND, CG>(xs, c[0], load_dt<KIND, T>(p.in, b));
        float h = fxscan::apply(m, fxscan::load_state<T>(p.state, p.state_f32, i));
        fxscan::store_state<T>(p.state, p.state_f32, i, h);
        static_cast<T *>(p.h)[i] = fx_elem<T>::store(h);
    }
}

// ---- the tiling plan (host) ----

struct plan {
    int vec, group;   // channels per lane, lanes per time row
    int steps, segs;  // a tile is segs * steps steps
    int warps;        // per block
    int64_t htiles, ctiles, ttiles;
};

// Tiles are numbered in 32 bits (and one launch takes up to 2^31 - 1 blocks).
inline bool plan_fits(const plan &pl) { return pl.ctiles * pl.ttiles <= 0x7fffffff; }

// Tiles of `group * vec` channels. Time tiles of up to kMaxWarps warps of
// segments of `capacity` steps (the kernel's register capacity); a sequence
// that fits one tile gets the shortest segments that cover it (latency);
// fewer, shorter tiles when that leaves the GPU idle. Tests shrink the
// tiles with max_tile_steps to reach the look-back on small inputs.
inline plan make_plan(const fx_cuda_device *d, const fx_linrec_problem *p, int vec, int group,
                      int capacity, int max_tile_steps)
{
    plan pl;
    pl.vec = vec;
    pl.group = group;
    const int width = vec * group, per_warp = 32 / group, most = fxscan::kMaxWarps * per_warp;
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

inline fxscan::tiling make_tiling(const fx_linrec_problem *p, const plan &pl, int flip)
{
    fxscan::tiling t = {};
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
template <typename Args> inline bool stream_wanted(const fx_cuda_device *d, const Args *a, int elem_bytes)
{
    if (a->max_tile_steps == FX_LINREC_TILES_STREAM)
        return stream_fits(a, elem_bytes);
    if (a->max_tile_steps != 0 || elem_bytes != 4)
        return false;
    return stream_fits(a, elem_bytes) && large_launch(&a->p) && a->p.seqlen >= 4 * kStreamSteps &&
           a->p.batch * stream_columns(&a->p, elem_bytes) >= 7 * (int64_t)d->sm_count / 2;
}

// backward: the walk runs against the forward's direction.
inline stream_tiling make_stream_tiling(const fx_linrec_problem *p, int elem_bytes, bool backward)
{
    stream_tiling s = {};
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

// `sums`: liquid's f32 sums, sum_count(a, ...) floats.
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

// Rows of Liquid's ddt sums: the streaming backward's columns each store
// a row (no atomics: a row's warps walk the same step together); the tiled
// backward adds into one row.
inline int dt_rows(const fx_linrec_problem *p, bool stream, int elem_bytes)
{
    return stream ? (int)stream_columns(p, elem_bytes) : 1;
}

// Liquid's f32 sums: dtau, dlam, and dt_rows rows of ddt. Only the rows that
// are added into need zeros (zeroed_sum_count).
inline int64_t sum_count(const fx_linrec_bwd_args *a, bool stream, int elem_bytes)
{
    return 2 * a->p.hidden + (a->ddt ? dt_rows(&a->p, stream, elem_bytes) * a->p.batch * a->p.seqlen : 0);
}
inline int64_t zeroed_sum_count(const fx_linrec_bwd_args *a, bool stream, int elem_bytes)
{
    return stream ? 2 * a->p.hidden : sum_count(a, stream, elem_bytes);
}

// Liquid's sums (make_bwd_params) as written out to dtau, dA and ddt.
inline fx_sum_regions liquid_sums(const fx_linrec_bwd_args *a, const bwd_params &prm, bool stream, int elem_bytes)
{
    fx_sum_regions s = {};
    s.add(prm.sum_tau, a->dtau, a->p.hidden);
    s.add(prm.sum_lam, a->dlam, a->p.hidden);
    s.add(prm.sum_dt, a->ddt, a->p.batch * a->p.seqlen, dt_rows(&a->p, stream, elem_bytes));
    return s;
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

// The look-back statuses of a launch: two words per channel and tile.
inline size_t lookback_bytes(const fxscan::tiling &t, int width)
{
    return (size_t)t.ctiles * t.ttiles * width * 2 * sizeof(fxscan::word);
}

inline void carve_lookback(char *base, uint32_t epoch, fxscan::tiling &t)
{
    t.lb.status = (fxscan::word *)base;
    t.lb.epoch = epoch;
}

} // namespace fxlinrec

#endif
