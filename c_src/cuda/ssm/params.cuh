// The selective scan (Mamba S6) on CUDA: its configurations by dstate,
// the device helpers every kernel uses, and the parameter structs the host
// fills (ssm/plan.cuh). No CUDA API call lives in ssm/: the launchers are
// in ssm/launchers.cuh, so the kernels also compile as plain C++ for the
// emulator that runs them on a CPU (test/emu).
//
// Work split: the dstate states of a channel are spread over LANES
// consecutive lanes, NPL states each, and live in registers for the whole
// sequence, which is walked in order: the recurrence costs one exp per
// state and step and the state never goes to memory. (LANES, NPL) depend on
// dstate only (Cfg below); for dstate 16 it is 4 lanes x 4 states, so a
// warp holds 8 channels and the large benchmark (8 x 1536 channels) ~12
// warps per SM, all resident at once.
//
// The one-warp-a-tile forward and the backward are built from warps that do
// not wait for each other (ssm/forward.cuh, ssm/backward.cuh): with ~3 warps per
// scheduler, a barrier would leave it idle, so each warp stages its own
// inputs (cp.async a chunk ahead), and sums over the lanes of a channel go
// through shared memory, out of the path from one step to the next. For
// dstate 16 the forward is warp-specialized instead (ssm_fwd_ws_kernel):
// scan warps with a lane per channel beside as many staging warps, which
// doubles the warps a scheduler for the same instructions. The step is one
// thread group per (batch, channel), one launch.
#ifndef FX_CUDA_SSM_PARAMS_CUH
#define FX_CUDA_SSM_PARAMS_CUH

#include <limits.h>
#include <string.h>

#include <type_traits>

#include "cuda/async_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/sfu.cuh"
#include "cuda/sums.cuh"
#include "cuda/warp_sum.cuh"
#include "fusex_ssm.h"

namespace fx::cuda::ssm {

constexpr int kThreads = 128;       // step blocks
constexpr int kFwdMaxThreads = 128; // forward blocks: up to 4 warps
constexpr int kFwdMaxSmem = 72 * 1024; // per forward block: 3 blocks fit an SM
constexpr unsigned kFullMask = 0xffffffffu;

__host__ __device__ constexpr int cmin(int a, int b) { return a < b ? a : b; }
__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }

// The shape of the work for one dstate range.
//   LANES  lanes per channel, NPL states per lane (NPAD = LANES * NPL >= dstate)
//   WCH    channels per warp
//   T      forward time chunk: 16 steps (a warp's buffers stay under ~9 KB
//          for dstate 16, so that a mid-size problem's warps all fit at
//          once), fewer where b and c rows are long or a lane would stage
//          more than 8 (step, channel) pairs
//   SAVE   steps between the states the forward saves: the backward's
//          chunk, whose states a lane holds in registers (SAVE * NPL = 64)
//   BW     warps per backward block: their b and c gradient buffer
//          (BW * SAVE * 2 * NPAD floats) within 8 KB
template <int LANES_, int NPL_> struct Cfg {
    static constexpr int LANES = LANES_;
    static constexpr int NPL = NPL_;
    static constexpr int NPAD = LANES * NPL;
    static constexpr int WCH = 32 / LANES;
    static constexpr int T = cmin(cmin(16, 8 * LANES), 1024 / NPAD);
    static constexpr int SAVE = 64 / NPL;
    static constexpr int BW = cmax(1, cmin(4, 8192 / (SAVE * 2 * NPAD * 4)));
    static_assert(NPL % 4 == 0, "states per lane come in float4s");
    static_assert(LANES <= 32 && (LANES & (LANES - 1)) == 0, "a channel's lanes share a warp");
    static_assert(T % 2 == 0 && (T % SAVE == 0 || SAVE % T == 0), "saves fall on chunk steps");
};

// Calls body(Cfg<...>()) for the configuration that covers dstate (<= 256).
// Above dstate 32 a lane holds 8 states: with 4, dstate 64 and 128 ran
// 1.2-1.6x slower (each warp had too little independent work, and twice
// the adds of the b and c gradients to memory; bench/RESULTS.md).
template <typename F> static auto with_cfg(int64_t dstate, F &&body) -> decltype(body(Cfg<4, 4>()))
{
    if (dstate <= 4) return body(Cfg<1, 4>());
    if (dstate <= 8) return body(Cfg<2, 4>());
    if (dstate <= 16) return body(Cfg<4, 4>());
    if (dstate <= 32) return body(Cfg<8, 4>());
    if (dstate <= 64) return body(Cfg<8, 8>());
    if (dstate <= 128) return body(Cfg<16, 8>());
    return body(Cfg<32, 8>());
}

constexpr int64_t kMaxDstate = 256;

// ---- device helpers ----

// log(1 + v) for v in [0, 1]: v * P(v), P of degree 8 fitted for relative
// error (< 2e-7 in f32 arithmetic); no MUFU op.
__device__ __forceinline__ float log1p_unit(float v)
{
    float q = 5.232676398009062e-3f;
    q = fmaf(q, v, -2.9505165293812752e-2f);
    q = fmaf(q, v, 7.822582870721817e-2f);
    q = fmaf(q, v, -1.3663235306739807e-1f);
    q = fmaf(q, v, 1.9106002151966095e-1f);
    q = fmaf(q, v, -2.484298050403595e-1f);
    q = fmaf(q, v, 3.331909775733948e-1f);
    q = fmaf(q, v, -4.999949336051941e-1f);
    q = fmaf(q, v, 9.999999403953552e-1f);
    return v * q;
}

// softplus(u) = max(u, 0) + log(1 + e^-|u|): one MUFU op and ~12 FMAs, as
// accurate as log1pf(expf(u)). Above 20 it is u to the last bit, as with
// PyTorch's threshold.
__device__ __forceinline__ float softplus(float u)
{
    return fmaxf(u, 0.0f) + log1p_unit(fast_exp(-fabsf(u)));
}

// softplus(u) and its derivative sigmoid(u) from one exp.
__device__ __forceinline__ void softplus_and_grad(float u, float &sp, float &grad)
{
    const float v = fast_exp(-fabsf(u)); // e^-|u|
    sp = fmaxf(u, 0.0f) + log1p_unit(v);
    const float r = __fdividef(1.0f, 1.0f + v);
    grad = u >= 0.0f ? r : v * r;
}

// Fast division (reciprocal on the SFU, ~2 ulp): once per (step, channel).
// For x below ~-88 the denominator is inf and the result 0, as it should be.
__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.0f, 1.0f + fast_exp(-x)); }
__device__ __forceinline__ float softplus_grad(float u) { return sigmoid(u); }
__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.0f + fast_exp(-z)); }
__device__ __forceinline__ float silu_grad(float z)
{
    float s = sigmoid(z);
    return s * (1.0f + z * (1.0f - s));
}

template <typename T> __device__ __forceinline__ float ld(const void *p, int64_t i)
{
    return Elem<T>::load(static_cast<const T *>(p)[i]);
}

// Sum over the LANES consecutive lanes of a channel; every lane gets it.
template <int LANES> __device__ __forceinline__ float lane_sum(float v)
{
#pragma unroll
    for (int off = LANES / 2; off > 0; off >>= 1)
        v += __shfl_xor_sync(kFullMask, v, off);
    return v;
}

// NPL floats of shared memory into registers, quad j (16-byte aligned) from
// p + j * STRIDE: consecutive floats (STRIDE 4), or a lane's states of a
// row (lds_states).
template <int NPL, int STRIDE = 4> __device__ __forceinline__ void lds(float (&v)[NPL], const float *p)
{
#pragma unroll
    for (int i = 0; i < NPL; i += 4) {
        const float4 t = *reinterpret_cast<const float4 *>(p + i / 4 * STRIDE);
        v[i] = t.x, v[i + 1] = t.y, v[i + 2] = t.z, v[i + 3] = t.w;
    }
}

// The state that register i of a channel's lane q holds. A lane's states
// come in quads, quad j at j * 4 * LANES + 4 q, so that a channel's lanes
// read a row of b or c (or write one of their gradients) in consecutive
// 16-byte pieces. With 8 consecutive states a lane (dstate 33-256) the
// pieces of a quarter warp were 32 bytes apart, and every read of a row a
// 2-way bank conflict. At 4 states a lane this is q * 4 + i, as before.
template <class C> __host__ __device__ constexpr int quad_offset(int i) { return i / 4 * 4 * C::LANES + i % 4; }
template <class C> __host__ __device__ constexpr int state_of(int q, int i) { return 4 * q + quad_offset<C>(i); }

// Lane q's NPL states of a row of NPAD floats in shared memory; row_q is the
// row plus 4 q (its first quad).
template <class C> __device__ __forceinline__ void lds_states(float (&v)[C::NPL], const float *row_q)
{
    lds<C::NPL, 4 * C::LANES>(v, row_q);
}

// The bit patterns of the 16-bit floats (their _raw structs convert both ways).
template <typename T> struct Raw16;
template <> struct Raw16<__half> {
    typedef __half_raw type;
};
template <> struct Raw16<__nv_bfloat16> {
    typedef __nv_bfloat16_raw type;
};

// Four consecutive elements of an input type, as one load unit.
template <typename T> struct Quad {
    typedef uint2 Raw; // four 16-bit floats, the first in the low half of x
    __device__ __forceinline__ static float elem(uint32_t word, int half)
    {
        typename Raw16<T>::type r;
        r.x = (unsigned short)(half ? word >> 16 : word);
        return Elem<T>::load(T(r));
    }
    __device__ __forceinline__ static float4 to_float(Raw r)
    {
        return make_float4(elem(r.x, 0), elem(r.x, 1), elem(r.y, 0), elem(r.y, 1));
    }
};
template <> struct Quad<float> {
    typedef float4 Raw;
    __device__ __forceinline__ static float4 to_float(float4 r) { return r; }
};

// A float4 of shared memory in one vector load even where only some of its
// floats are used (ptxas would load those alone, which can conflict where
// the whole vector does not).
__device__ __forceinline__ float4 lds_whole(const float *p)
{
#ifdef __CUDA_ARCH__
    float4 v;
    asm volatile("ld.volatile.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
    return v;
#else
    return *reinterpret_cast<const float4 *>(p);
#endif
}

// A step's (delta, delta x, dyp) of the backward's chunk inputs, as a
// float2 and a float: 3 shared-memory wavefronts where the float4 (which
// ptxas would make of two adjacent plain loads) costs 4. Volatile, so that
// the two loads stay two.
__device__ __forceinline__ float4 lds_three(const float *p)
{
#ifdef __CUDA_ARCH__
    float4 v;
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ld.volatile.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(a));
    asm volatile("ld.volatile.shared.f32 %0, [%1+8];" : "=f"(v.z) : "r"(a));
    v.w = 0.0f;
    return v;
#else
    return make_float4(p[0], p[1], p[2], 0.0f);
#endif
}

// The sum of LANES consecutive floats of shared memory (aligned to their size).
template <int LANES> __device__ __forceinline__ float sum_parts(const float *p)
{
    if constexpr (LANES == 1) {
        return p[0];
    } else if constexpr (LANES == 2) {
        const float2 v = *reinterpret_cast<const float2 *>(p);
        return v.x + v.y;
    } else {
        float4 v = *reinterpret_cast<const float4 *>(p);
        float s = (v.x + v.y) + (v.z + v.w);
#pragma unroll
        for (int i = 4; i < LANES; i += 4) {
            v = *reinterpret_cast<const float4 *>(p + i);
            s += (v.x + v.y) + (v.z + v.w);
        }
        return s;
    }
}

// A shared-memory address the compiler cannot recompute: ptxas otherwise
// rebuilds a lane's address from the block's base (S2UR of the CTA's id,
// ULEA) and the lane's bits at each use, 3-6 instructions, rather than keep
// it in a register. Pinned, it is one register, and each access is that
// register plus a constant.
template <typename P> __device__ __forceinline__ P *pinned_shared(P *ptr)
{
#ifdef __CUDA_ARCH__
    unsigned a = (unsigned)__cvta_generic_to_shared(ptr);
    asm volatile("" : "+r"(a));
    return static_cast<P *>(__cvta_shared_to_generic(a));
#else
    return ptr;
#endif
}

// The block's dynamic shared memory; every kernel lays out its own.
__device__ __forceinline__ float *block_smem()
{
#ifdef FX_CUDA_EMULATION
    return static_cast<float *>(fx_emu_dynamic_smem()); // test/emu: the block's
#else
    extern __shared__ __align__(16) float smem[];
    return smem;
#endif
}

// ---- parameters ----

struct ScanParams {
    const void *x, *dt, *z, *b, *c; // the input type (z may be NULL)
    const void *a, *d, *dt_bias, *h0; // any float type; NULL when not given
    int a_type, d_type, bias_type, h0_type;
    int batch, seqlen, dim, dstate, groups;
    int cpg;   // channels per group
    int tiles; // channel tiles per group
    int units; // batch * groups * tiles: warps of the forward, blocks of the backward
    bool softplus;
    void *y;       // forward output, the input type
    float *state;  // forward output, or NULL
    float *saved;  // [batch, nsaved, dim, dstate]: written by the forward, read by the backward
    int nsaved;
    float *ysum;   // the sliced forward's f32 sums of y over each slice's states, [slices][batch, seqlen, dim]
};

struct BwdParams {
    ScanParams f;
    const void *dy;     // the input type
    const void *dstate; // gradient of the final state, or NULL
    int dstate_type;
    void *dx, *ddt, *dz; // the input type (dz NULL without z)
    void *dh0;           // or NULL
    int dh0_type;
    // f32 partial sums (sums.cuh), a row per block that adds into an
    // element: db, dc [channel tile][batch, seqlen, groups, dstate] (rows of
    // bc_row floats), da [batch][dim, dstate], dd, ddt_bias [batch][dim]
    // (sliced: [(batch * seqlen) / kBwdFinishRows, rounded up][dim])
    float *acc_db, *acc_dc, *acc_da, *acc_dd, *acc_dbias;
    int64_t bc_row;
    // the sliced backward's sums over each slice's states,
    // [3][slices][batch * seqlen * dim]: y before d x and the gate, sum g
    // decay h a, sum g b; else NULL
    float *parts;
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

// A work unit's place: batch element, group and the channels of its tile.
struct Tile {
    int b, g;
    int d0;     // first channel
    int nvalid; // channels of the tile inside the group (<= the tile width)
};

// Work unit `index` (a warp of the forward, a block of the backward) of
// tiles of `ch` channels.
__device__ __forceinline__ Tile tile_at(const ScanParams &p, int index, int ch)
{
    Tile t;
    int tile = index % p.tiles, bg = index / p.tiles;
    t.b = bg / p.groups;
    t.g = bg % p.groups;
    t.d0 = t.g * p.cpg + tile * ch;
    t.nvalid = min(ch, p.cpg - tile * ch);
    return t;
}

__device__ __forceinline__ Tile tile_of(const ScanParams &p, int ch) { return tile_at(p, blockIdx.x, ch); }

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

// The copy unit of a row of NPAD values of b or c: 16 bytes, or the whole
// row where it is shorter (cp.async copies 4, 8 or 16 bytes).
template <typename T, int NPAD> struct BcCopy {
    static constexpr int RB = NPAD * (int)sizeof(T); // bytes of a row
    static constexpr int UB = RB < 16 ? RB : 16;
    static constexpr int EPU = UB / (int)sizeof(T); // elements a unit
};

// Whether the b and c rows copy in whole units: every row starts on a unit
// (dstate a multiple of its elements, the tensors aligned to it) and a unit
// is either all states or all padding.
template <typename T, int NPAD> __host__ __device__ inline bool bc_rows_copy(const ScanParams &p)
{
    typedef BcCopy<T, NPAD> K;
    return p.dstate % K::EPU == 0 && (uintptr_t)p.b % K::UB == 0 && (uintptr_t)p.c % K::UB == 0;
}

// The plain (not FAST) load of a chunk of b and c rows: STEPS rows of NPAD
// values from step t0, into raw [STEPS][NPAD] buffers of the input type;
// rows past the end and states past dstate are zeros. By cp.async where
// bc_rows_copy holds (the caller waits, as for the FAST copies), else
// element by element: a load, then a store that waits on it, which made
// the 16-bit plain kernels of dstate 128 2x slower (bench/RESULTS.md).
// HINT: where the copies are cached (FwdStage::BC_HINT).
template <typename T, int NPAD, int STEPS, CopyHint HINT = kCopyL2>
__device__ __forceinline__ void load_bc_rows(const ScanParams &p, const Tile &t, int t0, int lane, T *raw_b,
                                             T *raw_c)
{
    typedef BcCopy<T, NPAD> K;
    const T *b = static_cast<const T *>(p.b), *c = static_cast<const T *>(p.c);
    if (bc_rows_copy<T, NPAD>(p)) {
        constexpr int PER_ROW = NPAD / K::EPU, UNITS = STEPS * PER_ROW;
#pragma unroll 1 // (unrolled, the dstate-256 backward spilled ~100 bytes more)
        for (int k = 0; k < (UNITS + 31) / 32; k++) {
            const int u = lane + 32 * k, tl = u / PER_ROW, n = u % PER_ROW * K::EPU;
            if (UNITS % 32 == 0 || u < UNITS) {
                const bool ok = t0 + tl < p.seqlen && n < p.dstate;
                const int64_t i = ok ? at_btg(p, t.b, t0 + tl, t.g) + n : 0;
                copy_async<K::UB, HINT>(raw_b + u * K::EPU, b + i, ok);
                copy_async<K::UB, HINT>(raw_c + u * K::EPU, c + i, ok);
            }
        }
        return;
    }
    for (int e = lane; e < STEPS * NPAD; e += 32) {
        const int tl = e / NPAD, n = e % NPAD;
        const bool ok = t0 + tl < p.seqlen && n < p.dstate;
        const int64_t i = ok ? at_btg(p, t.b, t0 + tl, t.g) + n : 0;
        raw_b[e] = ok ? b[i] : T(0.0f);
        raw_c[e] = ok ? c[i] : T(0.0f);
    }
}

} // namespace fx::cuda::ssm

#endif
