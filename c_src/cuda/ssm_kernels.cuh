#ifndef FX_CUDA_SSM_KERNELS_CUH
#define FX_CUDA_SSM_KERNELS_CUH

// The selective scan (Mamba S6) on CUDA: the kernels of forward, backward
// and single step, and the host-side parameter builders. No CUDA API call
// lives here (the launchers are in ssm.cu), so the kernels also compile as
// plain C++ for tests that run them on a CPU.
//
// Work split (all three kernels): a block of 128 threads is one batch
// element x a tile of CH channels of one group; the dstate states of a
// channel are spread over LANES consecutive lanes, NPL states each, and live
// in registers for the whole sequence. The sequence is walked in order, one
// step after the other: the recurrence costs one exp per state and step and
// the state never goes to memory. y's sum over states is LANES-wide
// shuffles. (LANES, NPL) depend on dstate only (Cfg below); for dstate 16
// it is 4 lanes x 4 states, so a block holds 32 channels and the chip
// ~12 warps per SM on the large benchmark.
//
// Forward: time is cut into chunks of T steps. Per chunk, all 128 threads
// stage the chunk's inputs in shared memory with coalesced loads, computing
// delta = softplus(dt + bias) once per (step, channel) (not once per lane),
// while the next chunk's raw inputs are already on their way into
// registers (issued before the scan of this chunk, so their latency hides
// behind it). The scan reads delta, delta*x, b and c from shared memory and
// writes the state sum per step; an epilogue adds d*x, applies the gate and
// writes y coalesced. With save_for_backward it also writes the state
// entering every chunk of SAVE steps.
//
// Backward: chunks of SAVE steps, last to first. Per chunk: stage the
// inputs; pass 1 recomputes the states from the saved one, keeping the
// state entering each sub-chunk of SUB steps (in shared memory, own slot);
// pass 2 takes the sub-chunks last to first, recomputes their SUB states
// and decays into registers and runs the adjoint recurrence backwards
// through them. Gradients of x, dt, z are written per (step, channel); of
// b and c (sums over channels) through a block reduction in shared memory
// and one vector atomic per (step, 4 states, block); of a, d, dt_bias
// (sums over batch and time) from per-thread registers with one atomic per
// element and block at the end. Sums accumulate in f32 scratch that a last
// kernel converts to the gradients' types.
#include <limits.h>

#include "cuda/common.cuh"
#include "fusex_ssm.h"

namespace fx_ssm {

constexpr int kThreads = 128;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__host__ __device__ constexpr int cmin(int a, int b) { return a < b ? a : b; }

// The shape of the work for one dstate range.
//   LANES  lanes per channel, NPL states per lane (NPAD = LANES * NPL >= dstate)
//   CH     channels per block
//   T      forward time chunk: bounded so that the prefetch registers stay
//          <= 8 per tensor for x/dt/z and <= 8 for b/c
//   SAVE   steps between saved states; the backward's chunk (multiple of T)
//   SUB    backward sub-chunk held in registers (SUB * NPL = 32 values)
//   R      steps per block reduction of the b/c gradients
template <int LANES_, int NPL_> struct Cfg {
    static constexpr int LANES = LANES_;
    static constexpr int NPL = NPL_;
    static constexpr int NPAD = LANES * NPL;
    static constexpr int CH = kThreads / LANES;
    static constexpr int T = cmin(cmin(32, 8 * LANES), 1024 / NPAD);
    static constexpr int SAVE = cmin(32, 8 * LANES);
    static constexpr int SUB = 32 / NPL;
    static constexpr int NSUB = SAVE / SUB;
    static constexpr int R = 16 / NPL;
    static_assert(NPL % 4 == 0, "states per lane come in float4s");
    static_assert(LANES <= 32 && (LANES & (LANES - 1)) == 0, "a channel's lanes share a warp");
    static_assert(SAVE % T == 0 && SAVE % SUB == 0 && SUB % R == 0, "chunks nest");
    static_assert(SAVE % LANES == 0, "a backward chunk is whole staging passes");
};

// Calls body(Cfg<...>()) for the configuration that covers dstate (<= 256).
template <typename F> static auto with_cfg(int64_t dstate, F &&body) -> decltype(body(Cfg<4, 4>()))
{
    if (dstate <= 4) return body(Cfg<1, 4>());
    if (dstate <= 8) return body(Cfg<2, 4>());
    if (dstate <= 16) return body(Cfg<4, 4>());
    if (dstate <= 32) return body(Cfg<8, 4>());
    if (dstate <= 64) return body(Cfg<16, 4>());
    if (dstate <= 128) return body(Cfg<32, 4>());
    return body(Cfg<32, 8>());
}

constexpr int64_t kMaxDstate = 256;

// ---- device helpers ----

// 2^x on the special function unit: one MUFU op, ~2 ulp, denormals to 0.
__device__ __forceinline__ float fast_exp2(float x)
{
#ifdef __CUDA_ARCH__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x); // host compilations of this header (tests of the kernels on a CPU)
#endif
}

// Fast division (reciprocal on the SFU, ~2 ulp): once per (step, channel).
// For z below ~-88 the denominator is inf and the result 0, as it should be.
__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }
// PyTorch's softplus: the identity above 20.
__device__ __forceinline__ float softplus(float u) { return u > 20.0f ? u : log1pf(__expf(u)); }
__device__ __forceinline__ float softplus_grad(float u) { return u > 20.0f ? 1.0f : sigmoid(u); }
__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.0f + __expf(-z)); }
__device__ __forceinline__ float silu_grad(float z)
{
    float s = sigmoid(z);
    return s * (1.0f + z * (1.0f - s));
}

// Parameters and states come in any float type; they are read a few
// times per thread, so a switch on the type is cheaper than more kernels.
__device__ __forceinline__ float load_any(const void *p, int type, int64_t i)
{
    switch (type) {
    case FX_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    case FX_F16: return __half2float(static_cast<const __half *>(p)[i]);
    default: return static_cast<const float *>(p)[i];
    }
}

__device__ __forceinline__ void store_any(void *p, int type, int64_t i, float v)
{
    switch (type) {
    case FX_BF16: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v); break;
    case FX_F16: static_cast<__half *>(p)[i] = __float2half_rn(v); break;
    default: static_cast<float *>(p)[i] = v; break;
    }
}

template <typename T> __device__ __forceinline__ float ld(const void *p, int64_t i)
{
    return fx_elem<T>::load(static_cast<const T *>(p)[i]);
}

// Sum over the LANES consecutive lanes of a channel; every lane gets it.
template <int LANES> __device__ __forceinline__ float lane_sum(float v)
{
#pragma unroll
    for (int off = LANES / 2; off > 0; off >>= 1)
        v += __shfl_xor_sync(kFullMask, v, off);
    return v;
}

// NPL consecutive floats of shared memory (16-byte aligned) into registers.
template <int NPL> __device__ __forceinline__ void lds(float (&v)[NPL], const float *p)
{
#pragma unroll
    for (int i = 0; i < NPL; i += 4) {
        float4 t = *reinterpret_cast<const float4 *>(p + i);
        v[i] = t.x, v[i + 1] = t.y, v[i + 2] = t.z, v[i + 3] = t.w;
    }
}

template <int NPL> __device__ __forceinline__ void sts(float *p, const float (&v)[NPL])
{
#pragma unroll
    for (int i = 0; i < NPL; i += 4)
        *reinterpret_cast<float4 *>(p + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
}

// The block's dynamic shared memory; every kernel lays out its own.
__device__ __forceinline__ float *block_smem()
{
    extern __shared__ __align__(16) float smem[];
    return smem;
}

// ---- parameters ----

struct ScanParams {
    const void *x, *dt, *z, *b, *c; // the input type (z may be NULL)
    const void *a, *d, *dt_bias, *h0; // any float type; NULL when not given
    int a_type, d_type, bias_type, h0_type;
    int batch, seqlen, dim, dstate, groups;
    int cpg;   // channels per group
    int tiles; // channel tiles per group
    bool softplus;
    void *y;       // forward output, the input type
    float *state;  // forward output, or NULL
    float *saved;  // [batch, nsaved, dim, dstate]: written by the forward, read by the backward
    int nsaved;
};

struct BwdParams {
    ScanParams f;
    const void *dy;     // the input type
    const void *dstate; // gradient of the final state, or NULL
    int dstate_type;
    void *dx, *ddt, *dz; // the input type (dz NULL without z)
    void *dh0;           // or NULL
    int dh0_type;
    float *acc_db, *acc_dc, *acc_da, *acc_dd, *acc_dbias; // f32 sums, zeroed
};

struct StepParams {
    const void *x, *dt, *z, *b, *c;
    const void *a, *d, *dt_bias;
    int a_type, d_type, bias_type;
    int batch, dim, dstate, groups, cpg;
    bool softplus;
    float *state;
    void *y;
};

// The block's place: batch element, group and the channels of its tile.
struct Tile {
    int b, g;
    int d0;     // first channel
    int nvalid; // channels of the tile inside the group (<= CH)
};

__device__ __forceinline__ Tile tile_of(const ScanParams &p, int ch)
{
    Tile t;
    int tile = blockIdx.x % p.tiles, bg = blockIdx.x / p.tiles;
    t.b = bg / p.groups;
    t.g = bg % p.groups;
    t.d0 = t.g * p.cpg + tile * ch;
    t.nvalid = min(ch, p.cpg - tile * ch);
    return t;
}

__device__ __forceinline__ int64_t at_btd(const ScanParams &p, int b, int t, int d)
{
    return ((int64_t)b * p.seqlen + t) * p.dim + d;
}

__device__ __forceinline__ int64_t at_btg(const ScanParams &p, int b, int t, int g)
{
    return (((int64_t)b * p.seqlen + t) * p.groups + g) * p.dstate;
}

__device__ __forceinline__ int64_t at_state(const ScanParams &p, int b, int d)
{
    return ((int64_t)b * p.dim + d) * p.dstate;
}

// The scan role of a thread: channel c of the tile, lane q of its LANES.
template <class C> struct ScanLane {
    int c, q, d;
    bool ok; // the channel exists
    __device__ ScanLane(const Tile &t)
    {
        c = threadIdx.x / C::LANES;
        q = threadIdx.x % C::LANES;
        ok = c < t.nvalid;
        d = t.d0 + c;
    }
    __device__ int n(int i) const { return q * C::NPL + i; }
};

// a[d, n] * log2(e) for this lane's states (0 where there is no state).
template <class C>
__device__ __forceinline__ void load_a(const ScanParams &p, const ScanLane<C> &l, float (&a)[C::NPL],
                                       float scale)
{
#pragma unroll
    for (int i = 0; i < C::NPL; i++) {
        int n = l.n(i);
        a[i] = l.ok && n < p.dstate ? load_any(p.a, p.a_type, (int64_t)l.d * p.dstate + n) * scale : 0.0f;
    }
}

// ---- forward ----

// One staging thread's share of a chunk: (step, channel) pairs with a fixed
// channel, rows r0, r0 + ROWS, ... and b/c elements tid, tid + 128, ...
template <typename T, class C> struct FwdStage {
    static constexpr int ROWS = kThreads / C::CH; // time rows per pass (= LANES)
    static constexpr int E = (C::T + ROWS - 1) / ROWS;
    static constexpr int EB = (C::T * C::NPAD + kThreads - 1) / kThreads;
    int cs, r0, ds;
    bool cs_ok;
    float bias, dskip;
    T rx[E], rdt[E], rz[E], rb[EB], rc[EB]; // raw inputs of the next chunk
    float xk[E], gate[E];                   // x and silu(z) of the committed chunk

    __device__ FwdStage(const ScanParams &p, const Tile &t)
    {
        cs = threadIdx.x % C::CH;
        r0 = threadIdx.x / C::CH;
        cs_ok = cs < t.nvalid;
        ds = t.d0 + cs;
        bias = cs_ok && p.dt_bias ? load_any(p.dt_bias, p.bias_type, ds) : 0.0f;
        dskip = cs_ok && p.d ? load_any(p.d, p.d_type, ds) : 0.0f;
#pragma unroll
        for (int k = 0; k < E; k++) // rows past the chunk are never committed
            xk[k] = 0.0f, gate[k] = 1.0f;
    }

    __device__ __forceinline__ bool row_ok(const ScanParams &p, int t0, int k) const
    {
        int tl = r0 + k * ROWS;
        return cs_ok && tl < C::T && t0 + tl < p.seqlen;
    }

    // Issues the loads of chunk [t0, t0 + T); they land in registers.
    __device__ __forceinline__ void prefetch(const ScanParams &p, const Tile &t, int t0)
    {
        const T *x = static_cast<const T *>(p.x), *dt = static_cast<const T *>(p.dt);
        const T *z = static_cast<const T *>(p.z);
#pragma unroll
        for (int k = 0; k < E; k++) {
            bool ok = row_ok(p, t0, k);
            int64_t i = ok ? at_btd(p, t.b, t0 + r0 + k * ROWS, ds) : 0;
            rx[k] = ok ? x[i] : T(0.0f);
            rdt[k] = ok ? dt[i] : T(0.0f);
            rz[k] = ok && z ? z[i] : T(0.0f);
        }
        const T *b = static_cast<const T *>(p.b), *c = static_cast<const T *>(p.c);
#pragma unroll
        for (int k = 0; k < EB; k++) {
            int e = threadIdx.x + k * kThreads, tl = e / C::NPAD, n = e % C::NPAD;
            bool ok = e < C::T * C::NPAD && t0 + tl < p.seqlen && n < p.dstate;
            int64_t i = ok ? at_btg(p, t.b, t0 + tl, t.g) + n : 0;
            rb[k] = ok ? b[i] : T(0.0f);
            rc[k] = ok ? c[i] : T(0.0f);
        }
    }

    // Turns the prefetched chunk into what the scan reads: (delta, delta*x)
    // per (step, channel), b and c per (step, state). Steps past the end
    // and channels past the group get delta = 0: their state stays as is.
    __device__ __forceinline__ void commit(const ScanParams &p, int t0, float2 *s_dd, float *s_b,
                                           float *s_c)
    {
#pragma unroll
        for (int k = 0; k < E; k++) {
            int tl = r0 + k * ROWS;
            if (tl >= C::T)
                continue;
            bool ok = row_ok(p, t0, k);
            float x = fx_elem<T>::load(rx[k]);
            float u = fx_elem<T>::load(rdt[k]) + bias;
            float delta = ok ? (p.softplus ? softplus(u) : u) : 0.0f;
            s_dd[tl * C::CH + cs] = make_float2(delta, delta * x);
            xk[k] = x;
            gate[k] = p.z ? silu(fx_elem<T>::load(rz[k])) : 1.0f;
        }
#pragma unroll
        for (int k = 0; k < EB; k++) {
            int e = threadIdx.x + k * kThreads;
            if (e < C::T * C::NPAD) {
                s_b[e] = fx_elem<T>::load(rb[k]);
                s_c[e] = fx_elem<T>::load(rc[k]);
            }
        }
    }

    // y = (sum_n c h + d x) * silu(z) for the committed chunk.
    __device__ __forceinline__ void epilogue(const ScanParams &p, const Tile &t, int t0,
                                             const float *s_y)
    {
        T *y = static_cast<T *>(p.y);
#pragma unroll
        for (int k = 0; k < E; k++) {
            int tl = r0 + k * ROWS;
            if (row_ok(p, t0, k))
                y[at_btd(p, t.b, t0 + tl, ds)] =
                    fx_elem<T>::store((s_y[tl * C::CH + cs] + dskip * xk[k]) * gate[k]);
        }
    }
};

// The scan over one staged chunk: `steps` steps (all T when FULL; the test
// is block-uniform, so the shuffles stay converged).
template <class C, bool FULL>
__device__ __forceinline__ void fwd_scan_chunk(float (&h)[C::NPL], const float (&a2)[C::NPL],
                                               const ScanLane<C> &lane, int steps,
                                               const float2 *s_dd, const float *s_b,
                                               const float *s_c, float *s_y)
{
    constexpr int NPL = C::NPL;
#pragma unroll
    for (int s = 0; s < C::T; s++) {
        if (FULL || s < steps) {
            const float2 dd = s_dd[s * C::CH + lane.c]; // delta, delta * x
            float bv[NPL], cv[NPL];
            lds(bv, s_b + s * C::NPAD + lane.q * NPL);
            lds(cv, s_c + s * C::NPAD + lane.q * NPL);
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < NPL; i++) {
                h[i] = fmaf(fast_exp2(dd.x * a2[i]), h[i], dd.y * bv[i]);
                acc = fmaf(cv[i], h[i], acc);
            }
            acc = lane_sum<C::LANES>(acc);
            if (lane.q == 0)
                s_y[s * C::CH + lane.c] = acc;
        }
    }
}

// The forward's shared memory, in floats: (delta, delta * x) and the
// state sum per (step, channel), b and c per (step, state) of a chunk.
template <class C> struct FwdSmem {
    static constexpr int DD = 0;
    static constexpr int B = DD + 2 * C::T * C::CH;
    static constexpr int CC = B + C::T * C::NPAD;
    static constexpr int Y = CC + C::T * C::NPAD;
    static constexpr int TOTAL = Y + C::T * C::CH;
    static constexpr size_t BYTES = sizeof(float) * TOTAL; // < 48 KB: no opt-in needed
    static_assert(BYTES <= 48 * 1024, "forward shared memory fits the default limit");
};

template <typename T, class C>
__global__ void __launch_bounds__(kThreads, 4) ssm_fwd_kernel(const ScanParams p)
{
    constexpr int NPL = C::NPL, CH = C::CH, TS = C::T;
    using S = FwdSmem<C>;
    float *sm = block_smem();
    float2 *s_dd = reinterpret_cast<float2 *>(sm + S::DD); // delta, delta * x
    float *s_b = sm + S::B, *s_c = sm + S::CC, *s_y = sm + S::Y;

    const Tile tile = tile_of(p, CH);
    const ScanLane<C> lane(tile);
    float a2[NPL], h[NPL];
    load_a<C>(p, lane, a2, kLog2e);
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        int n = lane.n(i);
        h[i] = lane.ok && n < p.dstate && p.h0
                   ? load_any(p.h0, p.h0_type, at_state(p, tile.b, lane.d) + n) : 0.0f;
    }

    FwdStage<T, C> stage(p, tile);
    const int chunks = (p.seqlen + TS - 1) / TS;
    if (chunks > 0) {
        stage.prefetch(p, tile, 0);
        stage.commit(p, 0, s_dd, s_b, s_c);
    }
    __syncthreads();
    for (int k = 0; k < chunks; k++) {
        const int t0 = k * TS, steps = min(TS, p.seqlen - t0);
        if (k + 1 < chunks)
            stage.prefetch(p, tile, t0 + TS); // lands during the scan below
        if (steps == TS) // every chunk but maybe the last: no per-step test
            fwd_scan_chunk<C, true>(h, a2, lane, TS, s_dd, s_b, s_c, s_y);
        else
            fwd_scan_chunk<C, false>(h, a2, lane, steps, s_dd, s_b, s_c, s_y);
        const int t_end = t0 + TS;
        if (p.saved && t_end % C::SAVE == 0 && t_end < p.seqlen && lane.ok) {
            float *out = p.saved + (((int64_t)tile.b * p.nsaved + t_end / C::SAVE - 1) * p.dim + lane.d) * p.dstate;
#pragma unroll
            for (int i = 0; i < NPL; i++)
                if (lane.n(i) < p.dstate)
                    out[lane.n(i)] = h[i];
        }
        __syncthreads(); // s_y complete; s_dd, s_b, s_c free
        stage.epilogue(p, tile, t0, s_y);
        if (k + 1 < chunks)
            stage.commit(p, t0 + TS, s_dd, s_b, s_c);
        __syncthreads(); // the next chunk is staged; s_y free
    }
    if (p.state && lane.ok) {
#pragma unroll
        for (int i = 0; i < NPL; i++)
            if (lane.n(i) < p.dstate)
                p.state[at_state(p, tile.b, lane.d) + lane.n(i)] = h[i];
    }
}

// ---- single step ----

template <typename T, class C>
__global__ void __launch_bounds__(kThreads) ssm_step_kernel(const StepParams p)
{
    constexpr int NPL = C::NPL;
    const int q = threadIdx.x % C::LANES;
    const int64_t ch = (int64_t)blockIdx.x * C::CH + threadIdx.x / C::LANES; // b * dim + d
    const bool ok = ch < (int64_t)p.batch * p.dim;
    const int b = ok ? (int)(ch / p.dim) : 0, d = ok ? (int)(ch % p.dim) : 0;
    const int64_t row = ((int64_t)b * p.groups + d / p.cpg) * p.dstate;
    float x = ok ? ld<T>(p.x, ch) : 0.0f;
    float u = ok ? ld<T>(p.dt, ch) + (p.dt_bias ? load_any(p.dt_bias, p.bias_type, d) : 0.0f) : 0.0f;
    float delta = ok ? (p.softplus ? softplus(u) : u) : 0.0f;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        int n = q * NPL + i;
        bool nok = ok && n < p.dstate;
        float *hp = p.state + ch * p.dstate + n;
        float h = nok ? *hp : 0.0f;
        float a2 = nok ? load_any(p.a, p.a_type, (int64_t)d * p.dstate + n) * kLog2e : 0.0f;
        float bv = nok ? ld<T>(p.b, row + n) : 0.0f, cv = nok ? ld<T>(p.c, row + n) : 0.0f;
        h = fmaf(fast_exp2(delta * a2), h, delta * bv * x);
        if (nok)
            *hp = h;
        acc = fmaf(cv, h, acc);
    }
    acc = lane_sum<C::LANES>(acc);
    if (ok && q == 0) {
        float y = acc + (p.d ? load_any(p.d, p.d_type, d) : 0.0f) * x;
        if (p.z)
            y *= silu(ld<T>(p.z, ch));
        static_cast<T *>(p.y)[ch] = fx_elem<T>::store(y);
    }
}

// ---- backward ----

// The backward's shared memory, in floats (every offset a multiple of 4).
template <class C> struct BwdSmem {
    static constexpr int PLANE = C::SAVE * C::CH; // one value per (step, channel) of a chunk
    // per (step, channel): inputs, then output gradients
    static constexpr int X = 0, DELTA = 1, DYP = 2, DYZ = 3, DSP = 4, DX = 5, DDT = 6, DZ = 7;
    static constexpr int B = 8 * PLANE;
    static constexpr int CC = B + C::SAVE * C::NPAD;
    static constexpr int HSUB = CC + C::SAVE * C::NPAD; // [NSUB][NPL/4][threads] float4
    // b/c partial gradients [2][R][CH][PSTRIDE]; rows padded against bank conflicts
    static constexpr int PSTRIDE = C::NPAD + (C::LANES == 1 ? 0 : C::LANES == 2 ? 4 : 8);
    static constexpr int PART = HSUB + C::NSUB * C::NPL * kThreads;
    // per thread, f64: the sums over time of the a gradient (NPL), d and dt_bias
    static constexpr int SUMS = PART + 2 * C::R * C::CH * PSTRIDE;
    static constexpr int NSUMS = C::NPL + 2;
    static constexpr int TOTAL = SUMS + 2 * kThreads * NSUMS;
    static constexpr size_t BYTES = sizeof(float) * TOTAL;
};

// Stages a backward chunk: per (step, channel) x, delta, dy*silu(z) (the
// gradient reaching the pre-gate output), dy*silu'(z), d delta/d dt; per
// (step, state) b and c. Steps past the end and channels past the group are
// zero everywhere (delta = 0 keeps the state, zero dy adds nothing).
template <typename T, class C>
__device__ __forceinline__ void bwd_stage(const BwdParams &bp, const Tile &t, int t0, float *sm)
{
    using S = BwdSmem<C>;
    const ScanParams &p = bp.f;
    const int cs = threadIdx.x % C::CH, r0 = threadIdx.x / C::CH;
    const bool cs_ok = cs < t.nvalid;
    const int ds = t.d0 + cs;
    const float bias = cs_ok && p.dt_bias ? load_any(p.dt_bias, p.bias_type, ds) : 0.0f;
#pragma unroll
    for (int k = 0; k < C::SAVE / C::LANES; k++) {
        const int tl = r0 + k * C::LANES, at = tl * C::CH + cs;
        const bool ok = cs_ok && t0 + tl < p.seqlen;
        const int64_t i = ok ? at_btd(p, t.b, t0 + tl, ds) : 0;
        float x = ok ? ld<T>(p.x, i) : 0.0f;
        float u = ok ? ld<T>(p.dt, i) + bias : 0.0f;
        float dy = ok ? ld<T>(bp.dy, i) : 0.0f;
        float dyp = dy, dyz = 0.0f;
        if (p.z) {
            float z = ok ? ld<T>(p.z, i) : 0.0f;
            dyp = dy * silu(z);
            dyz = dy * silu_grad(z);
        }
        sm[S::X * S::PLANE + at] = x;
        sm[S::DELTA * S::PLANE + at] = ok ? (p.softplus ? softplus(u) : u) : 0.0f;
        sm[S::DSP * S::PLANE + at] = ok ? (p.softplus ? softplus_grad(u) : 1.0f) : 0.0f;
        sm[S::DYP * S::PLANE + at] = dyp;
        sm[S::DYZ * S::PLANE + at] = dyz;
    }
    for (int e = threadIdx.x; e < C::SAVE * C::NPAD; e += kThreads) {
        const int tl = e / C::NPAD, n = e % C::NPAD;
        const bool ok = t0 + tl < p.seqlen && n < p.dstate;
        const int64_t i = ok ? at_btg(p, t.b, t0 + tl, t.g) + n : 0;
        sm[S::B + e] = ok ? ld<T>(p.b, i) : 0.0f;
        sm[S::CC + e] = ok ? ld<T>(p.c, i) : 0.0f;
    }
}

// Writes a chunk's gradients of x, dt, z from shared memory, coalesced.
template <typename T, class C>
__device__ __forceinline__ void bwd_store(const BwdParams &bp, const Tile &t, int t0, const float *sm)
{
    using S = BwdSmem<C>;
    const ScanParams &p = bp.f;
    const int cs = threadIdx.x % C::CH, r0 = threadIdx.x / C::CH;
    if (cs >= t.nvalid)
        return;
#pragma unroll
    for (int k = 0; k < C::SAVE / C::LANES; k++) {
        const int tl = r0 + k * C::LANES, at = tl * C::CH + cs;
        if (t0 + tl >= p.seqlen)
            continue;
        const int64_t i = at_btd(p, t.b, t0 + tl, t.d0 + cs);
        static_cast<T *>(bp.dx)[i] = fx_elem<T>::store(sm[S::DX * S::PLANE + at]);
        static_cast<T *>(bp.ddt)[i] = fx_elem<T>::store(sm[S::DDT * S::PLANE + at]);
        if (bp.dz)
            static_cast<T *>(bp.dz)[i] = fx_elem<T>::store(sm[S::DZ * S::PLANE + at]);
    }
}

// Adds 4 gradient sums at `dst` (n0..n0+3 of a row of dstate).
__device__ __forceinline__ void add4(float *dst, int n0, int dstate, float4 v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (dstate % 4 == 0) { // row starts are 16-byte aligned: one vector atomic
        atomicAdd(reinterpret_cast<float4 *>(dst), v);
        return;
    }
#endif
    float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (n0 + i < dstate)
            atomicAdd(dst + i, e[i]);
}

// Sums the partial b and c gradients of R steps over the block's channels
// and adds them to the f32 sums: each float4 column (gradient, step, 4
// states) is split over P adjacent lanes, which finish with shuffles; one
// lane per column does the atomic.
template <class C>
__device__ __forceinline__ void bwd_reduce(const BwdParams &bp, const Tile &t, int t_first,
                                           const float *part)
{
    using S = BwdSmem<C>;
    constexpr int N4 = C::NPAD / 4, COLS = 2 * C::R * N4;
    constexpr int P = COLS >= kThreads ? 1 : kThreads / COLS; // lanes per column
    constexpr int PER = COLS >= kThreads ? COLS / kThreads : 1; // columns per thread
    constexpr int S4 = S::PSTRIDE / 4;
    const ScanParams &p = bp.f;
    const float4 *src = reinterpret_cast<const float4 *>(part);
    const int piece = threadIdx.x % P;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int col = threadIdx.x / P + k * (kThreads / P);
        const int n4 = col % N4, r = (col / N4) % C::R, which = col / (N4 * C::R);
        const float4 *base = src + (which * C::R + r) * C::CH * S4 + n4;
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < C::CH / P; j++) {
            float4 v = base[(piece + j * P) * S4];
            sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
#pragma unroll
        for (int off = P / 2; off > 0; off >>= 1) {
            sum.x += __shfl_xor_sync(kFullMask, sum.x, off);
            sum.y += __shfl_xor_sync(kFullMask, sum.y, off);
            sum.z += __shfl_xor_sync(kFullMask, sum.z, off);
            sum.w += __shfl_xor_sync(kFullMask, sum.w, off);
        }
        const int tt = t_first + r, n0 = n4 * 4;
        if (piece == 0 && tt < p.seqlen && n0 < p.dstate) {
            float *acc = which == 0 ? bp.acc_db : bp.acc_dc;
            add4(acc + at_btg(p, t.b, tt, t.g) + n0, n0, p.dstate, sum);
        }
    }
}

template <typename T, class C>
__global__ void __launch_bounds__(kThreads, 3) ssm_bwd_kernel(const BwdParams bp)
{
    constexpr int NPL = C::NPL, NPAD = C::NPAD, CH = C::CH, SUB = C::SUB, R = C::R;
    using S = BwdSmem<C>;
    float *sm = block_smem();
    const ScanParams &p = bp.f;
    const float *s_x = sm + S::X * S::PLANE, *s_delta = sm + S::DELTA * S::PLANE;
    const float *s_dyp = sm + S::DYP * S::PLANE, *s_dyz = sm + S::DYZ * S::PLANE;
    const float *s_dsp = sm + S::DSP * S::PLANE;
    float *s_dx = sm + S::DX * S::PLANE, *s_ddt = sm + S::DDT * S::PLANE, *s_dz = sm + S::DZ * S::PLANE;
    const float *s_b = sm + S::B, *s_c = sm + S::CC;
    float4 *s_hsub = reinterpret_cast<float4 *>(sm + S::HSUB);
    float *s_part = sm + S::PART;

    const Tile tile = tile_of(p, CH);
    const ScanLane<C> lane(tile);
    const int c = lane.c, q = lane.q;
    // Sums over time: f32 within a chunk, then f64 (in this thread's slot of
    // shared memory: touched once per chunk, not worth registers), so that
    // their rounding grows with the chunk length rather than the sequence's.
    double *sums = reinterpret_cast<double *>(sm + S::SUMS) + threadIdx.x * S::NSUMS;
    for (int i = 0; i < S::NSUMS; i++)
        sums[i] = 0.0;
    float a2[NPL], gs[NPL];
    load_a<C>(p, lane, a2, kLog2e);
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        int n = lane.n(i);
        // dL/dh entering the last step from after it: the final state's gradient
        gs[i] = lane.ok && n < p.dstate && bp.dstate
                    ? load_any(bp.dstate, bp.dstate_type, at_state(p, tile.b, lane.d) + n) : 0.0f;
    }
    const float dskip = lane.ok && p.d ? load_any(p.d, p.d_type, lane.d) : 0.0f;

    const int chunks = (p.seqlen + C::SAVE - 1) / C::SAVE;
    for (int k = chunks - 1; k >= 0; k--) {
        const int t0 = k * C::SAVE;
        __syncthreads(); // the previous chunk's gradients are stored
        bwd_stage<T, C>(bp, tile, t0, sm);
        __syncthreads();

        float acc_a[NPL], acc_d = 0.0f, acc_bias = 0.0f;
#pragma unroll
        for (int i = 0; i < NPL; i++)
            acc_a[i] = 0.0f;

        // Pass 1: the state entering each sub-chunk.
        float h[NPL];
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            int n = lane.n(i);
            bool ok = lane.ok && n < p.dstate;
            if (k == 0)
                h[i] = ok && p.h0 ? load_any(p.h0, p.h0_type, at_state(p, tile.b, lane.d) + n) : 0.0f;
            else
                h[i] = ok ? p.saved[(((int64_t)tile.b * p.nsaved + k - 1) * p.dim + lane.d) * p.dstate + n]
                          : 0.0f;
        }
        for (int j = 0; j < C::NSUB; j++) {
#pragma unroll
            for (int i = 0; i < NPL; i += 4)
                s_hsub[(j * (NPL / 4) + i / 4) * kThreads + threadIdx.x] =
                    make_float4(h[i], h[i + 1], h[i + 2], h[i + 3]);
            if (j + 1 == C::NSUB)
                break;
#pragma unroll
            for (int s = 0; s < SUB; s++) {
                const int tl = j * SUB + s;
                const float delta = s_delta[tl * CH + c], dx = delta * s_x[tl * CH + c];
                float bv[NPL];
                lds(bv, s_b + tl * NPAD + q * NPL);
#pragma unroll
                for (int i = 0; i < NPL; i++)
                    h[i] = fmaf(fast_exp2(delta * a2[i]), h[i], dx * bv[i]);
            }
        }

        // Pass 2: sub-chunks last to first; recompute, then the adjoint.
        for (int j = C::NSUB - 1; j >= 0; j--) {
            float h_in[NPL], hs[SUB][NPL], decay[SUB][NPL], ypre[SUB];
#pragma unroll
            for (int i = 0; i < NPL; i += 4) {
                float4 v = s_hsub[(j * (NPL / 4) + i / 4) * kThreads + threadIdx.x];
                h_in[i] = v.x, h_in[i + 1] = v.y, h_in[i + 2] = v.z, h_in[i + 3] = v.w;
            }
#pragma unroll
            for (int s = 0; s < SUB; s++) {
                const int tl = j * SUB + s;
                const float delta = s_delta[tl * CH + c], x = s_x[tl * CH + c];
                float bv[NPL];
                lds(bv, s_b + tl * NPAD + q * NPL);
#pragma unroll
                for (int i = 0; i < NPL; i++) {
                    decay[s][i] = fast_exp2(delta * a2[i]);
                    hs[s][i] = fmaf(decay[s][i], s > 0 ? hs[s - 1][i] : h_in[i], delta * x * bv[i]);
                }
                ypre[s] = 0.0f;
                if (p.z) { // the pre-gate output, for dz
                    float cv[NPL], acc = 0.0f;
                    lds(cv, s_c + tl * NPAD + q * NPL);
#pragma unroll
                    for (int i = 0; i < NPL; i++)
                        acc = fmaf(cv[i], hs[s][i], acc);
                    ypre[s] = lane_sum<C::LANES>(acc) + dskip * x;
                }
            }
#pragma unroll
            for (int s = SUB - 1; s >= 0; s--) {
                const int tl = j * SUB + s, at = tl * CH + c;
                const float delta = s_delta[at], x = s_x[at], dyp = s_dyp[at], dx = delta * x;
                float bv[NPL], cv[NPL], pb[NPL], pc[NPL];
                lds(bv, s_b + tl * NPAD + q * NPL);
                lds(cv, s_c + tl * NPAD + q * NPL);
                // sum_n g*decay*h_prev*a (accumulated with a*log2(e)) and sum_n g*b
                float r_a = 0.0f, r_b = 0.0f;
#pragma unroll
                for (int i = 0; i < NPL; i++) {
                    const float prev = s > 0 ? hs[s - 1][i] : h_in[i];
                    const float g = fmaf(cv[i], dyp, gs[i]); // dL/dh_t
                    const float pr = g * (decay[s][i] * prev);
                    acc_a[i] = fmaf(pr, delta, acc_a[i]);
                    r_a = fmaf(pr, a2[i], r_a);
                    r_b = fmaf(g, bv[i], r_b);
                    pb[i] = g * dx;
                    pc[i] = dyp * hs[s][i];
                    gs[i] = decay[s][i] * g; // dL/dh_{t-1} through h_t
                }
                r_a = lane_sum<C::LANES>(r_a) * kLn2;
                r_b = lane_sum<C::LANES>(r_b);
                if (q == 0) {
                    const float ddt = (r_a + x * r_b) * s_dsp[at];
                    s_dx[at] = fmaf(delta, r_b, dskip * dyp);
                    s_ddt[at] = ddt;
                    s_dz[at] = ypre[s] * s_dyz[at];
                    acc_d = fmaf(dyp, x, acc_d);
                    acc_bias += ddt;
                }
                float *row = s_part + ((s % R) * CH + c) * S::PSTRIDE + q * NPL;
                sts(row, pb);
                sts(row + R * CH * S::PSTRIDE, pc);
                if (s % R == 0) { // partials of steps s .. s + R - 1 complete
                    __syncthreads();
                    bwd_reduce<C>(bp, tile, t0 + j * SUB + s, s_part);
                    __syncthreads();
                }
            }
        }
        // The last reduction's barrier ordered every s_dx/s_ddt/s_dz write.
        bwd_store<T, C>(bp, tile, t0, sm);
#pragma unroll
        for (int i = 0; i < NPL; i++)
            sums[i] += acc_a[i];
        sums[NPL] += acc_d;
        sums[NPL + 1] += acc_bias;
    }

    if (lane.ok) {
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            int n = lane.n(i);
            if (n >= p.dstate)
                continue;
            atomicAdd(bp.acc_da + (int64_t)lane.d * p.dstate + n, (float)sums[i]);
            if (bp.dh0) // after step 0, gs is dL/dh0
                store_any(bp.dh0, bp.dh0_type, at_state(p, tile.b, lane.d) + n, gs[i]);
        }
        if (q == 0) {
            if (p.d)
                atomicAdd(bp.acc_dd + lane.d, (float)sums[NPL]);
            if (p.dt_bias)
                atomicAdd(bp.acc_dbias + lane.d, (float)sums[NPL + 1]);
        }
    }
}

// f32 sums to a gradient's type.
__global__ void ssm_convert_kernel(const float *__restrict__ src, int64_t n, void *dst, int type)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        store_any(dst, type, i, src[i]);
}

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
    return FX_OK;
}

template <class C> inline ScanParams scan_params(const fx_ssm_fwd_args *a)
{
    ScanParams p = {};
    p.x = a->x->data, p.dt = a->dt->data, p.z = data_of(a->z), p.b = a->b->data, p.c = a->c->data;
    p.a = a->a->data, p.d = data_of(a->d), p.dt_bias = data_of(a->dt_bias), p.h0 = data_of(a->h0);
    p.a_type = type_of(a->a), p.d_type = type_of(a->d), p.bias_type = type_of(a->dt_bias);
    p.h0_type = type_of(a->h0);
    p.batch = (int)a->n.batch, p.seqlen = (int)a->n.seqlen, p.dim = (int)a->n.dim;
    p.dstate = (int)a->n.dstate, p.groups = (int)a->n.groups;
    p.cpg = p.dim / p.groups;
    p.tiles = (p.cpg + C::CH - 1) / C::CH;
    p.softplus = a->dt_softplus;
    if (a->saved) {
        p.saved = static_cast<float *>(a->saved->data);
        p.nsaved = (int)a->saved->dims[1];
    }
    return p;
}

inline int64_t grid_of(const ScanParams &p) { return (int64_t)p.batch * p.groups * p.tiles; }

inline int check_saved(const fx_ssm_fwd_args *a, int64_t save, fx_status *st)
{
    if (a->saved && a->save_every != save)
        return fx_fail(st, FX_EINTERNAL, "selective_scan: saved states every %lld steps, expected %lld",
                       (long long)a->save_every, (long long)save);
    return FX_OK;
}

// One f32 scratch for the summed gradients: [db][dc][da][dd][ddt_bias]
// (db first so that its rows are 16-byte aligned for vector atomics).
struct BwdScratch {
    int64_t n_bc, n_a, n_d, total;
    explicit BwdScratch(const fx_ssm_dims &n)
    {
        n_bc = n.batch * n.seqlen * n.groups * n.dstate;
        n_a = n.dim * n.dstate;
        n_d = n.dim;
        total = 2 * n_bc + n_a + 2 * n_d;
    }
};

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
    return ((int64_t)p.batch * p.dim + C::CH - 1) / C::CH;
}

// `scratch`: BwdScratch::total zeroed floats.
template <class C>
inline BwdParams bwd_params(const fx_ssm_bwd_args *a, float *scratch, const BwdScratch &sz)
{
    BwdParams bp = {};
    bp.f = scan_params<C>(&a->fwd);
    bp.dy = a->dy->data;
    bp.dstate = data_of(a->dstate), bp.dstate_type = type_of(a->dstate);
    bp.dx = a->dx->data, bp.ddt = a->ddt->data;
    bp.dz = a->dz ? a->dz->data : nullptr;
    bp.dh0 = a->dh0 ? a->dh0->data : nullptr, bp.dh0_type = type_of(a->dh0);
    bp.acc_db = scratch;
    bp.acc_dc = scratch + sz.n_bc;
    bp.acc_da = bp.acc_dc + sz.n_bc;
    bp.acc_dd = bp.acc_da + sz.n_a;
    bp.acc_dbias = bp.acc_dd + sz.n_d;
    return bp;
}

} // namespace fx_ssm

#endif
