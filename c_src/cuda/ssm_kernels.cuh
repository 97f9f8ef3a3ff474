#ifndef FX_CUDA_SSM_KERNELS_CUH
#define FX_CUDA_SSM_KERNELS_CUH

// The selective scan (Mamba S6) on CUDA: the kernels of forward, backward
// and single step, and the host-side parameter builders. No CUDA API call
// lives here (the launchers are in ssm.cu), so the kernels also compile as
// plain C++ for tests that run them on a CPU.
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
// not wait for each other (see the sections below): with ~3 warps per
// scheduler, a barrier would leave it idle, so each warp stages its own
// inputs (cp.async a chunk ahead), and sums over the lanes of a channel go
// through shared memory, out of the path from one step to the next. For
// dstate 16 the forward is warp-specialized instead (ssm_fwd_ws_kernel):
// scan warps with a lane per channel beside as many staging warps, which
// doubles the warps a scheduler for the same instructions. The step is one
// thread group per (batch, channel), one launch.

#include <limits.h>
#include <string.h>

#include <type_traits>

#include "cuda/async_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/sfu.cuh"
#include "cuda/sums.cuh"
#include "cuda/warp_sum.cuh"
#include "fusex_ssm.h"

namespace fx_ssm {

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
// the atomics of the b and c gradients; bench/RESULTS.md).
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
    return fmaxf(u, 0.0f) + log1p_unit(fx_fast_exp(-fabsf(u)));
}

// softplus(u) and its derivative sigmoid(u) from one exp.
__device__ __forceinline__ void softplus_and_grad(float u, float &sp, float &grad)
{
    const float v = fx_fast_exp(-fabsf(u)); // e^-|u|
    sp = fmaxf(u, 0.0f) + log1p_unit(v);
    const float r = __fdividef(1.0f, 1.0f + v);
    grad = u >= 0.0f ? r : v * r;
}

// Fast division (reciprocal on the SFU, ~2 ulp): once per (step, channel).
// For x below ~-88 the denominator is inf and the result 0, as it should be.
__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.0f, 1.0f + fx_fast_exp(-x)); }
__device__ __forceinline__ float softplus_grad(float u) { return sigmoid(u); }
__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.0f + fx_fast_exp(-z)); }
__device__ __forceinline__ float silu_grad(float z)
{
    float s = sigmoid(z);
    return s * (1.0f + z * (1.0f - s));
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
    typedef uint2 raw; // four 16-bit floats, the first in the low half of x
    __device__ __forceinline__ static float elem(uint32_t word, int half)
    {
        typename Raw16<T>::type r;
        r.x = (unsigned short)(half ? word >> 16 : word);
        return fx_elem<T>::load(T(r));
    }
    __device__ __forceinline__ static float4 to_float(raw r)
    {
        return make_float4(elem(r.x, 0), elem(r.x, 1), elem(r.y, 0), elem(r.y, 1));
    }
};
template <> struct Quad<float> {
    typedef float4 raw;
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
    int units; // batch * groups * tiles: warps of the forward, blocks of the backward
    bool softplus;
    void *y;       // forward output, the input type
    float *state;  // forward output, or NULL
    float *saved;  // [batch, nsaved, dim, dstate]: written by the forward, read by the backward
    int nsaved;
    float *ysum;   // the sliced forward's f32 sums of y over states, [batch, seqlen, dim], zeroed
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
    // the sliced backward's sums over states, [3][batch * seqlen * dim]: y
    // before d x and the gate, sum g decay h a, sum g b (zeroed); else NULL
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
template <typename T, int NPAD, int STEPS, fx_copy_hint HINT = FX_COPY_L2>
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
                fx_copy_async<K::UB, HINT>(raw_b + u * K::EPU, b + i, ok);
                fx_copy_async<K::UB, HINT>(raw_c + u * K::EPU, c + i, ok);
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

// ---- forward ----
//
// One warp is one batch element x a tile of WCH = 32 / LANES channels of one
// group, and never waits for another warp: a block is W warps side by side,
// each with its own FwdSmem words of shared memory, so the only
// synchronisation is __syncwarp. Per chunk of TS steps:
//   load     the chunk's x, dt, z, b, c as they are (input type) into the
//            warp's raw buffers: cp.async, issued a chunk ahead so that the
//            copies land while the previous chunk is scanned (FAST: tiles
//            full and rows aligned, which the launcher checks; each lane
//            copies whole 16-byte pieces of one row, at offsets that advance
//            by a chunk), or plain loads and stores for odd shapes;
//   commit   lane l takes CV consecutive channels of a row (rows l / LPR,
//            + RPP, ...): delta, delta * x for the scan; x and silu(z) kept
//            in registers for the epilogue; 16-bit b and c rows converted to
//            f32 (f32 rows are read where they land: two raw buffers);
//   scan     lanes (channel l / LANES, states state_of(l % LANES, i)) walk
//            the TS steps: per state one exp and three FMAs, the exps LOOK
//            steps ahead of the FMAs that use them (the only dependency from
//            a step to the next is one FMA per state); per step one store of
//            the lane's part of y's sum over states, so no shuffle sits
//            between a step and the next;
//   epilogue the staging lane adds the LANES parts of each of its channels,
//            adds d * x, applies the gate and writes its CV values of y with
//            one store. It shares a phase (no barrier between) with the next
//            chunk's commit.

// Knobs of the forward kernel (tools/ssm_bench times other values): LOOK,
// the steps between a decay's exp and the FMA that uses it; FENCE, a
// scheduling fence after every FENCE steps of the scan (0: none), without
// which ptxas sinks each exp to just above its first use; TF, the steps
// per chunk (0: the configuration's T).
template <int LOOK_ = 2, int FENCE_ = 1, int TF_ = 0, int MINB_ = 4> struct FwdTune {
    static constexpr int LOOK = LOOK_, FENCE = FENCE_, TF = TF_, MINB = MINB_;
};
typedef FwdTune<> FwdDefault;

template <typename T, class C, class U = FwdDefault> struct FwdSmem {
    static constexpr int TS = U::TF ? U::TF : C::T; // steps per chunk
    static constexpr int LOOK = cmin(U::LOOK, TS - 1);
    static constexpr bool F32 = sizeof(T) == 4; // b, c read where they land
    // staging: CV consecutive channels of one row per lane and pass; LPR
    // lanes per row, RPP rows per pass, NP passes per chunk
    static constexpr int CV = cmax(1, cmin(cmin(4, C::WCH), C::WCH * TS / 32));
    static constexpr int LPR = C::WCH / CV, RPP = 32 / LPR, NP = (TS + RPP - 1) / RPP;
    static constexpr bool ALL_ROWS = RPP * NP == TS; // every lane has a row in every pass
    // in 4-byte words; every region starts 16-byte aligned
    static constexpr int words(int elems) { return (elems * (int)sizeof(T) + 15) / 16 * 4; }
    static constexpr int XR = 0;                     // raw x [TS][WCH], input type
    static constexpr int DTR = XR + words(TS * C::WCH); // raw dt
    static constexpr int ZR = DTR + words(TS * C::WCH); // raw z
    static constexpr int NBUF = F32 ? 2 : 1;            // raw b, c: chunk k in buffer k % NBUF
    static constexpr int BCW = words(TS * C::NPAD);     // one raw b or c chunk [TS][NPAD]
    static constexpr int BR = ZR + words(TS * C::WCH);  // raw b
    static constexpr int CR = BR + NBUF * BCW;          // raw c
    // per channel: (delta, delta * x) per step; +4 floats puts the channels
    // of a warp's float4 loads in different banks
    static constexpr int DDS = 2 * TS + 4;
    static constexpr int DD = CR + NBUF * BCW;
    static constexpr int B = DD + C::WCH * DDS;            // f32 b [TS][NPAD] (16-bit inputs)
    static constexpr int CC = B + (F32 ? 0 : TS * C::NPAD); // f32 c
    // parts of y [TS][PS]: a row per step, padded so that the staging lanes'
    // float4 reads of different rows fall in different banks
    static constexpr int PS = 36;
    static constexpr int P = CC + (F32 ? 0 : TS * C::NPAD);
    static constexpr int WORDS = P + TS * PS; // per warp
    static constexpr size_t BYTES = sizeof(float) * WORDS;
    static_assert(DDS % 4 == 0 && TS % 2 == 0, "float4 rows of two steps");
    static_assert(TS % C::SAVE == 0 || C::SAVE % TS == 0, "saves fall on chunk steps");
};

// What the FAST load needs: full tiles, and rows of x, dt, z, b, c that
// split into aligned copies of UX (x, dt, z) and UB (b, c) bytes.
template <typename T, class C> struct FwdCopy {
    static constexpr int RX = C::WCH * (int)sizeof(T);  // bytes of a tile's row of x
    static constexpr int UX = RX < 16 ? RX : 16;
    static constexpr int RB = BcCopy<T, C::NPAD>::RB;   // bytes of a row of b
    static constexpr int UB = BcCopy<T, C::NPAD>::UB;
    static constexpr bool POSSIBLE = RX >= 4; // cp.async copies 4, 8 or 16 bytes
};

// Whether every row of x, dt, z, y starts on a multiple of ux bytes, and
// every row of b, c on one of ub (what the cp.async paths copy in units of).
template <typename T> inline bool rows_aligned(const ScanParams &p, int ux, int ub)
{
    auto aligned = [](const void *ptr, int unit) { return ptr == nullptr || (uintptr_t)ptr % unit == 0; };
    return (int64_t)p.dim * sizeof(T) % ux == 0 && aligned(p.x, ux) && aligned(p.dt, ux) && aligned(p.z, ux) &&
           aligned(p.y, ux) && (int64_t)p.groups * p.dstate * sizeof(T) % ub == 0 && aligned(p.b, ub) &&
           aligned(p.c, ub);
}

template <typename T, class C> inline bool fwd_fast(const ScanParams &p)
{
    typedef FwdCopy<T, C> K;
    return K::POSSIBLE && p.cpg % C::WCH == 0 && p.dstate == C::NPAD && rows_aligned<T>(p, K::UX, K::UB);
}

// A scheduling fence: ptxas keeps every instruction on its side of a read
// of the clock. Its list scheduler would otherwise sink each exp to just
// above its first use (its static latency model allows it), where the warp
// waits whenever the SFU is shared with the other warps. The reads are
// folded into `clocks`, which the caller stores, so that they are kept.
__device__ __forceinline__ void sched_fence(unsigned &clocks)
{
#ifdef __CUDA_ARCH__
    unsigned c;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c));
    clocks ^= c;
#else
    (void)clocks;
#endif
}

// Adds v to the 4 floats at dst (16-byte aligned): one vector atomic on
// sm_90, four before it (and in the emulator).
__device__ __forceinline__ void red_add4(float *dst, float4 v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4 *>(dst), v);
#else
    atomicAdd(dst, v.x), atomicAdd(dst + 1, v.y), atomicAdd(dst + 2, v.z), atomicAdd(dst + 3, v.w);
#endif
}

// CV consecutive elements of the input type (aligned to their size) as floats.
template <typename T, int CV> __device__ __forceinline__ void ld_vec(float (&v)[CV], const T *p)
{
    if constexpr (CV == 4) {
        const float4 f = Quad<T>::to_float(*reinterpret_cast<const typename Quad<T>::raw *>(p));
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else if constexpr (CV == 2 && sizeof(T) == 4) {
        const float2 f = *reinterpret_cast<const float2 *>(p);
        v[0] = f.x, v[1] = f.y;
    } else if constexpr (CV == 2) {
        const uint32_t w = *reinterpret_cast<const uint32_t *>(p);
        v[0] = Quad<T>::elem(w, 0), v[1] = Quad<T>::elem(w, 1);
    } else {
        v[0] = fx_elem<T>::load(p[0]);
    }
}

template <typename T> __device__ __forceinline__ uint32_t bits16(float v)
{
    const typename Raw16<T>::type r = fx_elem<T>::store(v);
    return r.x;
}

// CV floats to CV consecutive elements of the input type (aligned to their size).
template <typename T, int CV> __device__ __forceinline__ void st_vec(T *p, const float (&v)[CV])
{
    if constexpr (sizeof(T) == 4 && CV == 4) {
        *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
    } else if constexpr (sizeof(T) == 4 && CV == 2) {
        *reinterpret_cast<float2 *>(p) = make_float2(v[0], v[1]);
    } else if constexpr (CV == 4) {
        *reinterpret_cast<uint2 *>(p) =
            make_uint2(bits16<T>(v[0]) | bits16<T>(v[1]) << 16, bits16<T>(v[2]) | bits16<T>(v[3]) << 16);
    } else if constexpr (CV == 2) {
        *reinterpret_cast<uint32_t *>(p) = bits16<T>(v[0]) | bits16<T>(v[1]) << 16;
    } else {
        p[0] = fx_elem<T>::store(v[0]);
    }
}

// y of 4 channels, (their sums over states + d x) silu(z), stored as the
// input type; x and z (read only with Z) as 4 elements of it.
template <typename T, bool Z>
__device__ __forceinline__ void store_y4(T *y, float4 sum, const float (&dskip)[4], const T *x, const T *z)
{
    const float s4[4] = {sum.x, sum.y, sum.z, sum.w};
    float xv[4], out[4];
    ld_vec<T, 4>(xv, x);
#pragma unroll
    for (int v = 0; v < 4; v++)
        out[v] = s4[v] + dskip[v] * xv[v];
    if constexpr (Z) {
        float zv[4];
        ld_vec<T, 4>(zv, z);
#pragma unroll
        for (int v = 0; v < 4; v++)
            out[v] *= silu(zv[v]);
    }
    st_vec<T, 4>(y, out);
}

template <typename T, class C, class U, bool FAST> struct FwdStage {
    using S = FwdSmem<T, C, U>;
    typedef FwdCopy<T, C> K;
    static constexpr int TS = S::TS, CV = S::CV, NP = S::NP;
    // FAST loads: of x (dt, z), each lane copies NUX consecutive units of UX
    // bytes, all in one row; of b (c), units lane, lane + 32, ... of UB
    // bytes, so that a copy's lanes write consecutive units of shared memory
    // (a lane's consecutive units had NUB-way bank conflicts on every copy:
    // 8-way at dstate 64-256, bench/RESULTS.md)
    static constexpr int PER_ROW = K::RX / K::UX, UNITS = TS * PER_ROW, NUX = (UNITS + 31) / 32;
    static constexpr int EPU = K::UX / (int)sizeof(T);
    static constexpr int BPR = K::RB / K::UB, BUNITS = TS * BPR, NUB = (BUNITS + 31) / 32;
    static constexpr int EPB = BcCopy<T, C::NPAD>::EPU;
    // Copies of b and c kept in L1 as well where a warp is one channel
    // (dstate > 128): then every warp of an SM copies the same rows of its
    // batch element's steps, and from L2 (cp.async.cg) those copies were
    // the forward's limit (dstate 256 f32 -47 %; dstate 128, while it was
    // one channel a warp, -34 %). Where a warp is 2-4 channels they made
    // the forward 6-7 % slower, and the backward slower at every dstate
    // (bench/RESULTS.md).
    static constexpr fx_copy_hint BC_HINT = C::WCH == 1 ? FX_COPY_L1 : FX_COPY_L2;
    static_assert(PER_ROW % NUX == 0, "a lane's copies of x lie in one row");
    static_assert(BPR % 32 == 0 || 32 % BPR == 0, "unit lane + 32 k is the lane's unit moved by 32 k");
    int lane, r0, c0; // staging: rows r0, r0 + RPP, ...; channels c0 .. c0 + CV - 1 of the tile
    const T *src[5];  // FAST: the lane's first element of x, dt, z, b, c in the next chunk to load
    int64_t oy;       // its first element of y in the next chunk to write
    float bias[CV], dskip[CV];
    float xk[NP][CV], gate[NP][CV]; // x and silu(z) of the committed chunk, for the epilogue

    __device__ FwdStage(const ScanParams &p, const Tile &t, int lane_) : lane(lane_)
    {
        r0 = lane / S::LPR;
        c0 = lane % S::LPR * CV;
#pragma unroll
        for (int v = 0; v < CV; v++) {
            const bool cok = c0 + v < t.nvalid;
            bias[v] = cok && p.dt_bias ? fx_load_any(p.dt_bias, p.bias_type, t.d0 + c0 + v) : 0.0f;
            dskip[v] = cok && p.d ? fx_load_any(p.d, p.d_type, t.d0 + c0 + v) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < NP; k++)
#pragma unroll
            for (int v = 0; v < CV; v++)
                xk[k][v] = 0.0f, gate[k][v] = 1.0f;
        if constexpr (FAST) {
            const int ux = lane * NUX;
            const int64_t ox = at_btd(p, t.b, ux / PER_ROW, t.d0) + ux % PER_ROW * EPU;
            const int64_t ob = at_btg(p, t.b, lane / BPR, t.g) + lane % BPR * EPB;
            src[0] = static_cast<const T *>(p.x) + ox, src[1] = static_cast<const T *>(p.dt) + ox;
            src[2] = p.z ? static_cast<const T *>(p.z) + ox : nullptr;
            src[3] = static_cast<const T *>(p.b) + ob, src[4] = static_cast<const T *>(p.c) + ob;
        }
        oy = at_btd(p, t.b, r0, t.d0 + c0);
    }

    // The FAST copies of the next chunk, rows from t0 (FULL: all inside the
    // sequence; else rows past the end are zeros, read from the tensors'
    // first element).
    template <bool FULL> __device__ __forceinline__ void copy(const ScanParams &p, int t0, float *sm, int buf)
    {
        const int ux = lane * NUX; // a unit's place in the raw buffer is its place in the rows
        if (UNITS % 32 == 0 || ux < UNITS) {
            const bool ok = FULL || t0 + ux / PER_ROW < p.seqlen;
            const void *base[3] = {p.x, p.dt, p.z};
            const int at[3] = {S::XR, S::DTR, S::ZR};
#pragma unroll
            for (int j = 0; j < 3; j++)
#pragma unroll
                for (int k = 0; k < NUX; k++)
                    if (j < 2 || src[2])
                        fx_copy_async<K::UX>(reinterpret_cast<T *>(sm + at[j]) + (ux + k) * EPU,
                                        ok ? src[j] + k * EPU : static_cast<const T *>(base[j]), ok);
        }
        const int64_t row = (int64_t)p.groups * p.dstate; // elements from a step's b row to the next
        const void *base[2] = {p.b, p.c};
        const int at[2] = {S::BR, S::CR};
#pragma unroll
        for (int k = 0; k < NUB; k++) {
            const int ub = lane + 32 * k;
            if (BUNITS % 32 == 0 || ub < BUNITS) {
                const bool ok = FULL || t0 + ub / BPR < p.seqlen;
                const int64_t from = 32 * k / BPR * row + 32 * k % BPR * EPB; // unit ub from unit lane
#pragma unroll
                for (int j = 0; j < 2; j++)
                    fx_copy_async<K::UB, BC_HINT>(reinterpret_cast<T *>(sm + at[j] + buf * S::BCW) + ub * EPB,
                                         ok ? src[3 + j] + from : static_cast<const T *>(base[j]), ok);
            }
        }
    }

    // Starts (FAST) or does the loads of chunk [t0, t0 + TS) into the raw
    // buffers (b and c into buffer `buf`); rows past the end and channels
    // past the group are zeros.
    __device__ __forceinline__ void load(const ScanParams &p, const Tile &t, int t0, float *sm, int buf)
    {
        if constexpr (FAST && K::POSSIBLE) { // (fwd_fast is false when not POSSIBLE)
            if (t0 + TS <= p.seqlen)
                copy<true>(p, t0, sm, buf);
            else
                copy<false>(p, t0, sm, buf);
            const int64_t rows = (int64_t)TS * p.dim, rows_bc = (int64_t)TS * p.groups * p.dstate;
            src[0] += rows, src[1] += rows, src[3] += rows_bc, src[4] += rows_bc;
            if (src[2])
                src[2] += rows;
        } else {
            T *raw[3] = {reinterpret_cast<T *>(sm + S::XR), reinterpret_cast<T *>(sm + S::DTR),
                         reinterpret_cast<T *>(sm + S::ZR)};
            const T *in[3] = {static_cast<const T *>(p.x), static_cast<const T *>(p.dt),
                              static_cast<const T *>(p.z)};
            for (int e = lane; e < TS * C::WCH; e += 32) {
                const int tl = e / C::WCH, cc = e % C::WCH;
                const bool ok = t0 + tl < p.seqlen && cc < t.nvalid;
                const int64_t i = ok ? at_btd(p, t.b, t0 + tl, t.d0 + cc) : 0;
#pragma unroll
                for (int j = 0; j < 3; j++)
                    raw[j][e] = ok && in[j] ? in[j][i] : T(0.0f);
            }
            load_bc_rows<T, C::NPAD, TS, BC_HINT>(p, t, t0, lane, reinterpret_cast<T *>(sm + S::BR + buf * S::BCW),
                                         reinterpret_cast<T *>(sm + S::CR + buf * S::BCW));
        }
    }

    __device__ __forceinline__ static void softplus_all(float (&delta)[NP][CV])
    {
#pragma unroll
        for (int k = 0; k < NP; k++)
#pragma unroll
            for (int v = 0; v < CV; v++)
                delta[k][v] = softplus(delta[k][v]);
    }

    __device__ __forceinline__ void gates(const T *rz)
    {
#pragma unroll
        for (int k = 0; k < NP; k++) {
            float zv[CV];
            ld_vec<T, CV>(zv, rz + cmin(r0 + k * S::RPP, TS - 1) * C::WCH + c0);
#pragma unroll
            for (int v = 0; v < CV; v++)
                gate[k][v] = silu(zv[v]);
        }
    }

    // Turns the loaded chunk into what the scan reads. Steps past the end
    // and channels past the group get delta = 0: their state stays. The
    // options are tested once per chunk, so that the exps and polynomials
    // of a lane's values interleave.
    __device__ __forceinline__ void commit(const ScanParams &p, const Tile &t, int t0, float *sm, int buf)
    {
        const T *rx = reinterpret_cast<const T *>(sm + S::XR), *rdt = reinterpret_cast<const T *>(sm + S::DTR);
        const T *rz = reinterpret_cast<const T *>(sm + S::ZR);
        float delta[NP][CV];
#pragma unroll
        for (int k = 0; k < NP; k++) {
            const int at = cmin(r0 + k * S::RPP, TS - 1) * C::WCH + c0; // rows past TS: not used
            ld_vec<T, CV>(xk[k], rx + at);
            ld_vec<T, CV>(delta[k], rdt + at);
#pragma unroll
            for (int v = 0; v < CV; v++)
                delta[k][v] += bias[v];
        }
        // both options (Mamba's case) in one block, so that the gate's exps
        // and reciprocals interleave with softplus's polynomials
        if (p.softplus && p.z) {
            softplus_all(delta);
            gates(rz);
        } else {
            if (p.softplus)
                softplus_all(delta);
            if (p.z)
                gates(rz);
        }
        const int rows = p.seqlen - t0;
#pragma unroll
        for (int k = 0; k < NP; k++) {
            const int r = r0 + k * S::RPP;
            if (S::ALL_ROWS || r < TS) {
#pragma unroll
                for (int v = 0; v < CV; v++) {
                    const bool ok = r < rows && (FAST || c0 + v < t.nvalid);
                    const float dk = ok ? delta[k][v] : 0.0f;
                    *reinterpret_cast<float2 *>(sm + S::DD + (c0 + v) * S::DDS + 2 * r) = make_float2(dk, dk * xk[k][v]);
                }
            }
        }
        if constexpr (!S::F32) {
            typedef typename Quad<T>::raw Raw;
            constexpr int Q4 = C::NPAD / 4; // quads per b row
            const Raw *rb = reinterpret_cast<const Raw *>(sm + S::BR + buf * S::BCW);
            const Raw *rc = reinterpret_cast<const Raw *>(sm + S::CR + buf * S::BCW);
#pragma unroll
            for (int k = 0; k < (TS * Q4 + 31) / 32; k++) {
                const int s = lane + 32 * k;
                if ((TS * Q4) % 32 == 0 || s < TS * Q4) {
                    *reinterpret_cast<float4 *>(sm + S::B + 4 * s) = Quad<T>::to_float(rb[s]);
                    *reinterpret_cast<float4 *>(sm + S::CC + 4 * s) = Quad<T>::to_float(rc[s]);
                }
            }
        }
    }

    // y = (sum of the lanes' parts + d x) * silu(z) for the committed chunk.
    __device__ __forceinline__ void epilogue(const ScanParams &p, const Tile &t, int t0, const float *sm)
    {
        const int rows = p.seqlen - t0;
#pragma unroll
        for (int k = 0; k < NP; k++) {
            const int r = r0 + k * S::RPP;
            if ((S::ALL_ROWS || r < TS) && r < rows) {
                float yv[CV];
#pragma unroll
                for (int v = 0; v < CV; v++) {
                    const float sum = sum_parts<C::LANES>(sm + S::P + r * S::PS + (c0 + v) * C::LANES);
                    yv[v] = (sum + dskip[v] * xk[k][v]) * gate[k][v];
                }
                T *y = static_cast<T *>(p.y) + oy + (int64_t)(k * S::RPP) * p.dim;
                if constexpr (FAST) {
                    st_vec<T, CV>(y, yv);
                } else {
#pragma unroll
                    for (int v = 0; v < CV; v++)
                        if (c0 + v < t.nvalid)
                            y[v] = fx_elem<T>::store(yv[v]);
                }
            }
        }
        oy += (int64_t)TS * p.dim;
    }
};

// The scan over one staged chunk (all TS steps: padded steps have delta 0).
// Step s's chain (h = decay h + delta x b, y's part c . h) uses the decays
// and increments computed LOOK steps earlier, from operands read from
// shared memory a step before that; c is read a step ahead. Every load is
// issued before the store of the current step's part of y: a load after a
// store to shared memory cannot be moved above it, and would stall the step
// it feeds.
template <typename T, class C, class U>
__device__ __forceinline__ void fwd_scan(const ScanParams &p, const Tile &t, int c, int q, bool ok, int t0,
                                         float (&h)[C::NPL], const float (&a2)[C::NPL], const float *bsrc,
                                         const float *csrc, float *sm)
{
    using S = FwdSmem<T, C, U>;
    constexpr int NPL = C::NPL, TS = S::TS, LOOK = S::LOOK;
    const int lane = c * C::LANES + q;
    const float *dd_row = sm + S::DD + c * S::DDS, *b_row = bsrc + 4 * q, *c_row = csrc + 4 * q;
    float4 dd[TS / 2];                // (delta, delta x) of steps 2i, 2i + 1
    float bv[TS][NPL], cv[TS][NPL];   // b and c of a step
    float dec[TS][NPL], inc[TS][NPL]; // exp(delta a) and delta x b of a step
    unsigned clocks = 0; // the fences' clock reads (kept by a store to a pad word of P)
#pragma unroll
    for (int s = -LOOK - 1; s < TS; s++) {
        const int so = s + LOOK + 1; // the operands of step so's exps
        if (so >= 0 && so < TS) {
            if (so % 2 == 0)
                dd[so / 2] = *reinterpret_cast<const float4 *>(dd_row + 2 * so);
            lds_states<C>(bv[so], b_row + so * C::NPAD);
        }
        if (s + 1 >= 0 && s + 1 < TS)
            lds_states<C>(cv[s + 1], c_row + (s + 1) * C::NPAD);
        const int se = s + LOOK; // step se's exps and increments
        if (se >= 0 && se < TS) {
            const float delta = se % 2 ? dd[se / 2].z : dd[se / 2].x, dx = se % 2 ? dd[se / 2].w : dd[se / 2].y;
#pragma unroll
            for (int i = 0; i < NPL; i++) {
                dec[se][i] = fx_fast_exp2(delta * a2[i]);
                inc[se][i] = dx * bv[se][i];
            }
        }
        if (s < 0)
            continue;
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            h[i] = fmaf(dec[s][i], h[i], inc[s][i]);
            acc = fmaf(cv[s][i], h[i], acc);
        }
        sm[S::P + s * S::PS + lane] = acc;
        if (U::FENCE && s % U::FENCE == U::FENCE - 1)
            sched_fence(clocks);
        // the state entering every SAVE-step chunk, for the backward
        if ((s + 1) % cmin(TS, C::SAVE) == 0 && p.saved && ok) {
            const int te = t0 + s + 1;
            if (te % C::SAVE == 0 && te < p.seqlen) {
                float *out = p.saved + (((int64_t)t.b * p.nsaved + te / C::SAVE - 1) * p.dim + t.d0 + c) * p.dstate;
#pragma unroll
                for (int i = 0; i < NPL; i++)
                    if (state_of<C>(q, i) < p.dstate)
                        out[state_of<C>(q, i)] = h[i];
            }
        }
    }
    if (U::FENCE && lane == 0)
        reinterpret_cast<unsigned *>(sm)[S::P + S::PS - 1] = clocks;
}

template <typename T, class C, bool FAST, class U = FwdDefault>
__global__ void __launch_bounds__(kFwdMaxThreads, U::MINB) ssm_fwd_kernel(const ScanParams p)
{
    using S = FwdSmem<T, C, U>;
    constexpr int NPL = C::NPL;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int index = blockIdx.x * (blockDim.x / 32) + warp;
    if (index >= p.units)
        return; // a whole warp: no barrier waits for it
    float *sm = block_smem() + warp * S::WORDS;
    const Tile tile = tile_at(p, index, C::WCH);
    const int c = lane / C::LANES, q = lane % C::LANES, d = tile.d0 + c;
    const bool ok = c < tile.nvalid;
    float a2[NPL], h[NPL]; // a2 = a log2(e): a decay is one ex2 of delta * a2
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int n = state_of<C>(q, i);
        const bool nok = ok && n < p.dstate;
        a2[i] = nok ? fx_load_any(p.a, p.a_type, (int64_t)d * p.dstate + n) * fx_log2e : 0.0f;
        h[i] = nok && p.h0 ? fx_load_any(p.h0, p.h0_type, at_state(p, tile.b, d) + n) : 0.0f;
    }

    FwdStage<T, C, U, FAST> stage(p, tile, lane);
    const int chunks = (p.seqlen + S::TS - 1) / S::TS;
    if (chunks > 0) {
        stage.load(p, tile, 0, sm, 0);
        fx_copy_wait_all();
        __syncwarp();
        stage.commit(p, tile, 0, sm, 0);
        __syncwarp();
    }
    for (int k = 0; k < chunks; k++) {
        const int t0 = k * S::TS, buf = k % S::NBUF, next = (k + 1) % S::NBUF;
        if (k + 1 < chunks)
            stage.load(p, tile, t0 + S::TS, sm, next); // lands during the scan
        const float *bsrc = S::F32 ? sm + S::BR + buf * S::BCW : sm + S::B;
        const float *csrc = S::F32 ? sm + S::CR + buf * S::BCW : sm + S::CC;
        fwd_scan<T, C, U>(p, tile, c, q, ok, t0, h, a2, bsrc, csrc, sm);
        fx_copy_wait_all();
        __syncwarp(); // the parts of y are written; the next chunk's inputs are in
        stage.epilogue(p, tile, t0, sm);
        if (k + 1 < chunks)
            stage.commit(p, tile, t0 + S::TS, sm, next);
        __syncwarp(); // staged; the raw x, dt, z buffer is free
    }
    if (p.state && ok) {
#pragma unroll
        for (int i = 0; i < NPL; i++)
            if (state_of<C>(q, i) < p.dstate)
                p.state[at_state(p, tile.b, d) + state_of<C>(q, i)] = h[i];
    }
}

// ---- forward, warp-specialized (dstate 16) ----
//
// The forward above gives each warp its own staging, so a warp does
// everything for its 8 channels and the large case has ~3 warps a
// scheduler: each warp then waits on its own latencies (bench/RESULTS.md:
// fewer warps measured slower, every other lever moved it little). Here a
// block of 32 channels of one (batch, group) is 8 warps with two jobs:
//   scan warps 0-3: lane = channel, warp w holds states 4w .. 4w + 3, so
//     every lane of a warp reads the same b and c values (a broadcast, not
//     4 wavefronts); per step one (delta, delta x) load, 4 exps, 12 FMAs
//     and one store of the warp's part of y's sum over states;
//   staging warps 4-7: warp k owns rows k, k + 4, ... of every chunk, a lane
//     4 consecutive channels of one of them: the cp.async copies (three
//     chunks ahead; b and c by rows of their own, WsStaging::bc_row), the
//     commit (softplus, delta x; 16-bit b and c to f32) and the epilogue
//     (the 4 parts added, d x, the gate recomputed from the raw z, one
//     vector store of y). A staging warp touches no other's rows, so the
//     staging needs no barrier of its own.
// One block barrier a chunk (ws_block_sync): the scan of chunk j runs
// beside the epilogue of j - 1 and the commit of j + 1 (mbarrier hand-overs
// that let the scan warps run on measured slower). 24 warps an SM (3
// blocks of 56 KB of shared memory for f32), all resident for the large
// case: 214-221 -> 180-182 us (bench/RESULTS.md), the small cases faster too.
constexpr int kWsChannels = 32, kWsScanWarps = 4, kWsStageWarps = 4, kWsSteps = 16, kWsStates = 16;
constexpr int kWsThreads = 32 * (kWsScanWarps + kWsStageWarps);
constexpr int kWsRing = 4; // raw chunks: j (b, c being scanned) .. j + 3 (landing)
constexpr int kWsLook = 2; // a decay's exp this many steps before its FMA (3: slower)

template <typename T> struct WsSmem {
    static constexpr int CH = kWsChannels, N = kWsStates, TS = kWsSteps;
    static constexpr bool F32 = sizeof(T) == 4; // b, c read where they land
    // in floats; the raw regions hold T
    static constexpr int RAWX = TS * CH * (int)sizeof(T) / 4; // one raw x (dt, z) chunk [TS][CH]
    static constexpr int RAWB = TS * N * (int)sizeof(T) / 4;  // one raw b (c) chunk [TS][N]
    static constexpr int RAW = 3 * RAWX + 2 * RAWB;
    static constexpr int BC = 0;                               // 16-bit: f32 b, c [2][2][TS][N]
    static constexpr int DD = BC + (F32 ? 0 : 2 * 2 * TS * N); // (delta, delta x) [2][TS][CH] float2
    static constexpr int P = DD + 2 * TS * CH * 2;             // y's parts [2][scan warp][TS][CH]
    static constexpr int RAWS = P + 2 * kWsScanWarps * TS * CH; // [kWsRing][RAW]
    static constexpr int WORDS = RAWS + kWsRing * RAW;
    static constexpr size_t BYTES = sizeof(float) * WORDS;
    // The sliced kernel's states at chunk ends, [2][CH][N] by the chunk's
    // parity, for their coalesced stores (save_at), after the rest
    static constexpr int SAVES = WORDS;
    static constexpr size_t SLICED_BYTES = BYTES + sizeof(float) * 2 * CH * N;
    // chunk j's channel c's quad q, quads swizzled by (c / 2) % 4 so that
    // both the scan warps' stores (lane = channel) and the reads for the
    // global stores (4 lanes a channel) are free of bank conflicts
    __device__ static constexpr int save_at(unsigned j, int c, int q)
    {
        return SAVES + ((int)(j % 2) * CH + c) * N + 4 * (q ^ (c >> 1 & 3));
    }
    // A chunk's places (in floats from the block's base, or from a lane's
    // pinned place in the region) by its ring slot, j % kWsRing (the double
    // buffers take slot % 2 = j % 2); where the slot is a constant, as in
    // the staging's unrolled loop, so is each offset. The one statement of
    // this layout, for the scan and the staging.
    __device__ static constexpr unsigned raw_at(unsigned slot) { return RAWS + slot * RAW; } // raw inputs
    __device__ static constexpr unsigned bc_at(unsigned slot) { return BC + slot % 2 * 2 * TS * N; } // 16-bit: f32 b, c
    __device__ static constexpr unsigned dd_rows_at(unsigned slot) { return DD + slot % 2 * TS * CH * 2; }
    __device__ static constexpr unsigned parts_at(unsigned slot) { return P + slot % 2 * kWsScanWarps * TS * CH; }
    // chunk j's f32 b rows (its c rows follow, TS * N floats on)
    __device__ static const float *b_rows(float *sm, unsigned j)
    {
        return sm + (F32 ? raw_at(j % kWsRing) + 3 * RAWX : bc_at(j));
    }
    // (delta, delta x) rows: a row of 32 channels is 16 16-byte pairs of
    // channels, the last 8 of them swapped two by two, so that a staging
    // lane's two stores of 4 channels (pairs 2l, 2l + 1) and a scan warp's
    // 8-byte reads are free of bank conflicts; `dd_at(c)` is channel c's
    // place (in floats) in its row
    __device__ static constexpr int dd_at(int c) { return 2 * c ^ (c >> 4) << 2; }
};

// The shapes it takes: dstate 16, whole 32-channel tiles, 16-byte aligned
// rows (the copies and the staging's vector accesses).
template <typename T> inline bool ws_fits(const ScanParams &p)
{
    return p.dstate == kWsStates && p.cpg % kWsChannels == 0 && rows_aligned<T>(p, 16, 16);
}

// The shapes the sliced kernels (WsOpts::SL, ssm_bwd_kernel's SL) take:
// dstate a multiple of 16 from 32, whole 32-channel tiles (the rows of x,
// dt, z, y, b and c are then whole multiples of 16 bytes for every input
// type). The tensors must also start on 16 bytes (rows_aligned); where a
// sliced kernel is required and one does not, the launcher copies it.
template <typename T> inline bool ws_sliced_shape(const ScanParams &p)
{
    return p.dstate > kWsStates && p.dstate % kWsStates == 0 && p.cpg % kWsChannels == 0;
}

// Where the backward is sliced: every such shape but dstate 32 and 64,
// where the configuration's own kernel (8 x 4, 8 x 8) is faster (32: 17-22 %,
// 64: 14-17 %); elsewhere the sliced one measured 28-61 % faster (dstate
// 128 f32 1566 -> 1055 us, B4 L1024 D1024, bench/RESULTS.md). Its chunks
// are 16 steps, so there the forward saves a state every 16 steps: the
// shapes alone decide, never the addresses (fx_ssm_save_every, which
// check_saved holds this rule to).
template <typename T> inline bool bwd_sliced_shape(const ScanParams &p)
{
    return ws_sliced_shape<T>(p) && p.dstate != 32 && p.dstate != 64;
}

// Where the forward is sliced without saved states (and at dstate 32 with
// them): every such shape, its rows 16-byte aligned, but f32 inputs at
// dstate 32 and 64, where the one-warp-a-tile forward's own configuration
// is as fast (32: -2 % sliced, +0.5 % with saved states) or faster (64:
// 3 %). Elsewhere the sliced one measured 12-79 % faster, e.g. dstate 128
// f32 412 -> 230 us, 16-bit at 32 105 -> 74 (B4 L1024 D1024,
// bench/RESULTS.md). Above dstate 32 with saved states their interval
// decides (fwd_launch).
template <typename T> inline bool ws_sliced_fits(const ScanParams &p)
{
    return ws_sliced_shape<T>(p) && rows_aligned<T>(p, 16, 16) &&
           !(sizeof(T) == 4 && (p.dstate == 32 || p.dstate == 64));
}

// The options a chunk of the warp-specialized kernel would otherwise test at
// run time (the gate z, softplus, the saved states): compiled in, since each
// test is a reload of the parameter and a few uniform instructions a chunk
// (bench/RESULTS.md).
// SL: a block is one slice of 16 states of a larger dstate (fwd_launch):
// its part of y's sum goes to the f32 sums p.ysum, which a second kernel
// turns into y (ssm_fwd_finish_kernel), and it saves its states at each
// chunk's end, every 16 steps, the sliced backward's chunk. The gate is the
// second kernel's, so a slice never has Z (nor copies z).
template <bool Z_, bool SP_, bool SAVE_, bool SL_ = false> struct WsOpts {
    static constexpr bool Z = Z_, SP = SP_, SAVE = SAVE_, SL = SL_;
    static_assert(!(Z && SL), "the sliced forward gates y in its second kernel");
};

// body(WsOpts<..., SL>()) for p's options.
template <bool SL = false, class F>
inline auto with_ws_opts(const ScanParams &p, F &&body) -> decltype(body(WsOpts<!SL, true, true, SL>()))
{
    auto save = [&](auto z, auto sp) {
        constexpr bool Z = decltype(z)::value, SP = decltype(sp)::value;
        return p.saved ? body(WsOpts<Z, SP, true, SL>()) : body(WsOpts<Z, SP, false, SL>());
    };
    auto softplus = [&](auto z) {
        return p.softplus ? save(z, std::true_type{}) : save(z, std::false_type{});
    };
    if constexpr (SL)
        return softplus(std::false_type{});
    else
        return p.z ? softplus(std::true_type{}) : softplus(std::false_type{});
}

// The block barrier of the warp-specialized kernel. The scan and staging
// warps reach it at different instructions, which __syncthreads (bar.sync,
// i.e. barrier.sync.aligned) does not allow (compute-sanitizer's synccheck
// reports it); barrier.sync without .aligned does.
__device__ __forceinline__ void ws_block_sync()
{
#ifdef __CUDA_ARCH__
    asm volatile("barrier.sync 1, %0;" ::"n"(kWsThreads) : "memory");
#else
    __syncthreads();
#endif
}

template <typename T, class O> struct WsStaging {
    using S = WsSmem<T>;
    static constexpr int CH = S::CH, N = S::N, TS = S::TS;
    static constexpr int EPU = 16 / (int)sizeof(T);  // elements a 16-byte copy
    static constexpr int XU = CH / EPU, BU = N / EPU; // copies a row of x, of b
    static constexpr int ROWS = TS / kWsStageWarps;   // a staging warp's rows a chunk
    static_assert(ROWS == 4, "a lane takes one row of 8 lanes x 4 channels");
    static_assert(ROWS * XU <= 32 && 2 * ROWS * BU <= 32, "one copy a lane of x (dt, z), of b or c");
    // The rows of b and c a staging warp copies (and for 16-bit inputs
    // converts): 2k, 2k + 1, 2k + 8, 2k + 9, so that a copy's 8 lanes
    // cover two neighbouring rows, all 32 banks. (Its own rows of x, dt, z
    // are k, k + 4, ...: nothing else reads the rows of b and c before the
    // block barrier.) `bc_row_of(k, g)`: the warp's g-th row; piece i of its
    // copies: BU pieces a row, rows by pairs, b's pair then c's.
    __device__ static int bc_row_of(int k, int g) { return 2 * k + g % 2 + 8 * (g / 2); }
    __device__ static int bc_row(int k, int i) { return bc_row_of(k, i / BU % 2 + 2 * (i / (4 * BU))); }
    __device__ static bool bc_is_c(int i) { return i / (2 * BU) % 2; }
    // Everything a chunk touches is a fixed offset from where the previous
    // chunk's was: the sources and y step by pointers, and a shared place is
    // one of the lane's pinned addresses plus a constant for the chunk's slot.
    int r;                       // the lane's row of each chunk
    bool copies_x, copies_bc;    // whether the lane has a piece of x (dt, z), of b or c
    bool of_c;                   // its piece of b or c is c's
    int row_x, row_bc;           // the rows of its pieces
    // the lane's places in shared memory, pinned (each access a constant
    // from one of them): its parts of y in a row, its pieces of a raw x
    // (dt, z) row, its (delta, delta x) stores, its copies' destinations,
    // and for 16-bit inputs its quad of b or c to convert (raw, then f32)
    float *my_parts, *my_raw, *my_dd0, *my_dd1, *my_copy_x, *my_copy_bc, *my_conv_raw, *my_conv;
    const T *src[4];             // x, dt, z, b or c: the lane's pieces of the next chunk to load
    // the lane's y in the next chunk written; sliced: its f32 sums
    typename std::conditional<O::SL, float, T>::type *y;
    int64_t chunk_x, chunk_b;
    float bias[4], dskip[4];

    // `n0`: the block's first state (its slice's, else 0)
    __device__ WsStaging(const ScanParams &p, const Tile &t, int lane, int k, int n0, float *sm)
    {
        r = k + kWsStageWarps * (lane / 8);
        const int c0 = 4 * (lane % 8); // its first channel
#pragma unroll
        for (int v = 0; v < 4; v++) {
            bias[v] = p.dt_bias ? fx_load_any(p.dt_bias, p.bias_type, t.d0 + c0 + v) : 0.0f;
            dskip[v] = p.d && !O::SL ? fx_load_any(p.d, p.d_type, t.d0 + c0 + v) : 0.0f;
        }
        const int64_t x0 = at_btd(p, t.b, 0, t.d0), b0 = at_btg(p, t.b, 0, t.g);
        copies_x = lane < ROWS * XU, copies_bc = lane < 2 * ROWS * BU;
        of_c = bc_is_c(lane);
        row_x = k + kWsStageWarps * (lane / XU), row_bc = bc_row(k, lane);
        // (offsets in T scaled to floats: c0 and the pieces are multiples of 4)
        constexpr int TW = (int)sizeof(T);
        my_parts = pinned_shared(sm + r * CH + c0);
        my_raw = S::F32 ? my_parts : pinned_shared(sm + (r * CH + c0) * TW / 4);
        my_copy_x = S::F32 ? my_parts : pinned_shared(sm + (row_x * CH + (lane % XU) * EPU) * TW / 4);
        my_copy_bc = pinned_shared(sm + ((of_c ? TS * N : 0) + row_bc * N + (lane % BU) * EPU) * TW / 4);
        my_dd0 = pinned_shared(sm + r * CH * 2 + S::dd_at(c0));
        my_dd1 = pinned_shared(sm + r * CH * 2 + S::dd_at(c0 + 2));
        if constexpr (!S::F32) {
            // 2 x ROWS rows of N: one quad a lane (ROWS * N / 2 = 32 quads)
            const int which = lane / (ROWS * N / 4), f = lane % (ROWS * N / 4);
            const int conv = which * TS * N + bc_row_of(k, f / (N / 4)) * N + 4 * (f % (N / 4));
            my_conv_raw = pinned_shared(sm + conv * TW / 4);
            my_conv = pinned_shared(sm + conv);
        }
        const int64_t gx = x0 + (int64_t)row_x * p.dim + (lane % XU) * EPU;
        const int row_b = O::SL ? p.groups * p.dstate : p.groups * N; // (16 where not sliced)
        const int64_t gb = b0 + (int64_t)row_bc * row_b + n0 + (lane % BU) * EPU;
        const T *const in[4] = {static_cast<const T *>(p.x), static_cast<const T *>(p.dt),
                                static_cast<const T *>(p.z), static_cast<const T *>(of_c ? p.c : p.b)};
#pragma unroll
        for (int m = 0; m < 4; m++) // (no z: x's pieces stand in, never copied)
            src[m] = (in[m] ? in[m] : in[0]) + (m < 3 ? gx : gb);
        chunk_x = (int64_t)TS * p.dim, chunk_b = (int64_t)TS * row_b;
        if constexpr (O::SL)
            y = p.ysum + x0 + (int64_t)r * p.dim + c0;
        else
            y = static_cast<T *>(p.y) + x0 + (int64_t)r * p.dim + c0;
    }

    // Starts the copies of chunk j's rows of this warp into its ring slot;
    // called for j = 0, 1, 2, ... in order (the sources step a chunk).
    // Rows past the end are zeros (the scan then keeps its state).
    template <bool FULL> __device__ __forceinline__ void copy(const ScanParams &p, unsigned j, unsigned slot)
    {
        const unsigned raw = S::raw_at(slot);
        const int rows = p.seqlen - (int)j * TS;
        // a row past the end reads nothing; its address is the tensor's start
        // (the constructor's list again: one helper for both changed the
        // loop's code, +4 to +8 instructions)
        const T *const in[4] = {static_cast<const T *>(p.x), static_cast<const T *>(p.dt),
                                static_cast<const T *>(p.z), static_cast<const T *>(of_c ? p.c : p.b)};
        if (copies_x) {
            const bool ok = FULL || row_x < rows;
#pragma unroll
            for (int m = 0; m < 3; m++)
                if (m < 2 || O::Z)
                    fx_copy_async<16>(my_copy_x + raw + m * S::RAWX, ok ? src[m] : in[m], ok);
        }
        if (copies_bc) {
            const bool ok = FULL || row_bc < rows;
            fx_copy_async<16>(my_copy_bc + raw + 3 * S::RAWX, ok ? src[3] : in[3], ok);
        }
#pragma unroll
        for (int m = 0; m < 4; m++)
            src[m] += m < 3 ? chunk_x : chunk_b;
    }
    __device__ __forceinline__ void load(const ScanParams &p, unsigned j, unsigned slot)
    {
        if ((int)(j + 1) * TS <= p.seqlen)
            copy<true>(p, j, slot);
        else
            copy<false>(p, j, slot);
        fx_copy_commit();
    }

    // Chunk j's (delta, delta x) of the lane's row (delta 0 past the end),
    // and for 16-bit inputs the warp's rows of b and c in f32.
    __device__ __forceinline__ void commit(const ScanParams &p, unsigned j, unsigned slot)
    {
        const float *mine = my_raw + S::raw_at(slot);
        float u[4], x[4];
        ld_vec<T, 4>(u, reinterpret_cast<const T *>(mine + S::RAWX));
        ld_vec<T, 4>(x, reinterpret_cast<const T *>(mine));
#pragma unroll
        for (int v = 0; v < 4; v++)
            u[v] += bias[v];
        if constexpr (O::SP)
#pragma unroll
            for (int v = 0; v < 4; v++)
                u[v] = softplus(u[v]);
        const bool ok = r < p.seqlen - (int)j * TS;
        float o[8];
#pragma unroll
        for (int v = 0; v < 4; v++) {
            o[2 * v] = ok ? u[v] : 0.0f;
            o[2 * v + 1] = o[2 * v] * x[v];
        }
        const unsigned dd = S::dd_rows_at(slot);
        *reinterpret_cast<float4 *>(my_dd0 + dd) = make_float4(o[0], o[1], o[2], o[3]);
        *reinterpret_cast<float4 *>(my_dd1 + dd) = make_float4(o[4], o[5], o[6], o[7]);
        if constexpr (!S::F32) {
            float v4[4];
            ld_vec<T, 4>(v4, reinterpret_cast<const T *>(my_conv_raw + S::raw_at(slot) + 3 * S::RAWX));
            *reinterpret_cast<float4 *>(my_conv + S::bc_at(slot)) = make_float4(v4[0], v4[1], v4[2], v4[3]);
        }
    }

    // Makes the warp's copies of a chunk visible to its other lanes. For f32
    // inputs there is nothing to make visible: a lane commits and writes out
    // only the pieces of x, dt and z it copied itself, and the scan warps read
    // b and c after a block barrier.
    __device__ __forceinline__ static void lanes_sync()
    {
        if constexpr (!S::F32)
            __syncwarp();
    }

    // Chunk j of the staging's loop, in ring slot `slot` (j % kWsRing): y of
    // chunk j - 1, the commit of j + 1, the copies of j + 3, the block
    // barrier. Called for j = 0 .. chunks; true at chunks, where only the
    // last y is left to write.
    __device__ __forceinline__ bool step(const ScanParams &p, unsigned j, unsigned slot, int chunks)
    {
        constexpr unsigned M = kWsRing - 1; // slot + M: the slot of chunk j + M, and of j - 1
        if (slot != 0 || j > 0) // (only slot 0 tests j)
            epilogue(p, j - 1, (slot + M) % kWsRing);
        if ((int)j == chunks)
            return true;
        if ((int)j + 1 < chunks) {
            fx_copy_wait<kWsRing - 3>(); // chunk j + 1's
            lanes_sync();
            commit(p, j + 1, (slot + 1) % kWsRing);
        }
        lanes_sync(); // chunk j - 1's raw rows read: chunk j + 3 lands there
        if ((int)j + kWsRing - 1 < chunks)
            load(p, j + M, (slot + M) % kWsRing);
        else
            fx_copy_commit();
        ws_block_sync();
        return false;
    }

    // y of chunk j's row of the lane; called for j = 0, 1, ... in order.
    __device__ __forceinline__ void epilogue(const ScanParams &p, unsigned j, unsigned slot)
    {
        const float *parts = my_parts + S::parts_at(slot);
        auto *out_y = y;
        y += chunk_x;
        if (r >= p.seqlen - (int)j * TS)
            return;
        float4 sum = *reinterpret_cast<const float4 *>(parts);
#pragma unroll
        for (int w = 1; w < kWsScanWarps; w++) {
            const float4 q = *reinterpret_cast<const float4 *>(parts + w * TS * CH);
            sum.x += q.x, sum.y += q.y, sum.z += q.z, sum.w += q.w;
        }
        if constexpr (O::SL) // the slice's part; d x and the gate come after every slice's
            red_add4(out_y, sum);
        else
            write_y(out_y, sum, my_raw + S::raw_at(slot));
    }

    // y of the lane's 4 channels from its raw x and z (`mine`)
    __device__ __forceinline__ void write_y(T *out_y, float4 sum, const float *mine) const
    {
        store_y4<T, O::Z>(out_y, sum, dskip, reinterpret_cast<const T *>(mine),
                          reinterpret_cast<const T *>(mine + 2 * S::RAWX));
    }
};

// Scan warp w over chunk j: lane = channel, states 4w .. 4w + 3. The decays
// and increments are computed kWsLook steps before their FMAs, from
// operands read a step before that; every load is issued before the step's
// store (a shared-memory load cannot move above a store).
template <typename T, int LOOK>
__device__ __forceinline__ void ws_scan_chunk(unsigned j, int w, int lane, float (&h)[4], const float (&a2)[4], float *sm)
{
    using S = WsSmem<T>;
    constexpr int TS = S::TS, CH = S::CH, N = S::N;
    const float *dd_col = sm + S::dd_rows_at(j) + S::dd_at(lane);
    const float *b_rows = S::b_rows(sm, j) + 4 * w, *c_rows = b_rows + TS * N;
    float *parts = sm + S::parts_at(j) + w * TS * CH + lane;
    float2 dd[TS];
    float4 bv[TS], cv[TS];
    float dec[TS][4], inc[TS][4];
#pragma unroll
    for (int s = -LOOK - 1; s < TS; s++) {
        const int so = s + LOOK + 1; // the operands of step so's exps
        if (so >= 0 && so < TS) {
            dd[so] = *reinterpret_cast<const float2 *>(dd_col + so * CH * 2);
            bv[so] = *reinterpret_cast<const float4 *>(b_rows + so * N);
        }
        if (s + 1 >= 0 && s + 1 < TS)
            cv[s + 1] = *reinterpret_cast<const float4 *>(c_rows + (s + 1) * N);
        const int se = s + LOOK; // step se's exps and increments
        if (se >= 0 && se < TS) {
            const float b4[4] = {bv[se].x, bv[se].y, bv[se].z, bv[se].w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                dec[se][i] = fx_fast_exp2(dd[se].x * a2[i]);
                inc[se][i] = dd[se].y * b4[i];
            }
        }
        if (s < 0)
            continue;
        const float c4[4] = {cv[s].x, cv[s].y, cv[s].z, cv[s].w};
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            h[i] = fmaf(dec[s][i], h[i], inc[s][i]);
            acc = fmaf(c4[i], h[i], acc);
        }
        parts[s * CH] = acc;
    }
}

// The sliced kernel's saved states go through shared memory, so that 4
// lanes store a channel's 16 states of the slice as 64 contiguous bytes:
// stored by each lane (16 bytes in each of 32 rows an instruction) they
// cost the kernel 2-3x as much (bench/RESULTS.md). A scan lane puts its 4
// states aside at the end of chunk j (`h`) ...
template <typename T> __device__ __forceinline__ void ws_put_saved(const ScanParams &p, float *sm, unsigned j, const float (&h)[4])
{
    using S = WsSmem<T>;
    if ((int)(j + 1) * S::TS < p.seqlen) // (the state entering chunk j + 1)
        *reinterpret_cast<float4 *>(sm + S::save_at(j, threadIdx.x % 32, threadIdx.x / 32)) =
            make_float4(h[0], h[1], h[2], h[3]);
}

// ... and during chunk j + 1, past the block barrier between them, the
// scan warps store them (called for chunk j + 1 with j + 1 > 0). The buffer
// of j's parity is written again at the end of chunk j + 2, after the next
// block barrier: no other barrier is needed.
template <typename T>
__device__ __forceinline__ void ws_store_saved(const ScanParams &p, const Tile &t, const float *sm, int slice, unsigned j)
{
    using S = WsSmem<T>;
    const int c = threadIdx.x / 4, q = threadIdx.x % 4;
    *reinterpret_cast<float4 *>(p.saved + (((int64_t)t.b * p.nsaved + j) * p.dim + t.d0 + c) * p.dstate +
                                S::N * slice + 4 * q) = *reinterpret_cast<const float4 *>(sm + S::save_at(j, c, q));
}

template <typename T, class O, int LOOK = kWsLook>
__global__ void __launch_bounds__(kWsThreads, 3) ssm_fwd_ws_kernel(const ScanParams p)
{
    using S = WsSmem<T>;
    constexpr int TS = S::TS;
    float *sm = block_smem();
    // sliced: the slices of a tile are neighbouring blocks (their x, dt, z
    // reads meet in L2)
    const int slices = O::SL ? p.dstate / kWsStates : 1;
    const int slice = O::SL ? (int)blockIdx.x % slices : 0;
    const Tile t = tile_at(p, O::SL ? (int)blockIdx.x / slices : (int)blockIdx.x, kWsChannels);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int chunks = (p.seqlen + TS - 1) / TS;
    if (warp < kWsScanWarps) {
        const int d = t.d0 + lane;
        const int n0 = kWsStates * slice + 4 * warp; // the lane's first state
        const int64_t at = at_state(p, t.b, d) + n0;
        const int row = O::SL ? p.dstate : kWsStates; // (16 where not sliced)
        float a2[4], h[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            a2[i] = fx_load_any(p.a, p.a_type, (int64_t)d * row + n0 + i) * fx_log2e;
            h[i] = p.h0 ? fx_load_any(p.h0, p.h0_type, at + i) : 0.0f;
        }
        ws_block_sync(); // chunk 0 committed
        for (unsigned j = 0; (int)j < chunks; j++) {
            if (O::SAVE && O::SL && j > 0) // the state entering chunk j, put aside at j - 1's end
                ws_store_saved<T>(p, t, sm, slice, j - 1);
            ws_scan_chunk<T, LOOK>(j, warp, lane, h, a2, sm);
            // the state entering chunk j + 1, for the backward (SAVE = TS)
            if constexpr (O::SAVE && O::SL)
                ws_put_saved<T>(p, sm, j, h);
            else if (O::SAVE && (int)(j + 1) * TS < p.seqlen)
                *reinterpret_cast<float4 *>(p.saved + (((int64_t)t.b * p.nsaved + j) * p.dim + d) * kWsStates +
                                            4 * warp) = make_float4(h[0], h[1], h[2], h[3]);
            ws_block_sync(); // chunk j's parts written; chunk j + 1 committed
        }
        if (p.state)
            *reinterpret_cast<float4 *>(p.state + at) = make_float4(h[0], h[1], h[2], h[3]);
    } else {
        const int k = warp - kWsScanWarps;
        WsStaging<T, O> st(p, t, lane, k, kWsStates * slice, sm);
#pragma unroll
        for (unsigned j = 0; j < kWsRing - 1; j++)
            if ((int)j < chunks)
                st.load(p, j, j);
            else
                fx_copy_commit(); // empty groups keep the count
        fx_copy_wait<kWsRing - 2>(); // chunk 0's
        st.lanes_sync();
        if (chunks > 0)
            st.commit(p, 0, 0);
        ws_block_sync();
        // unrolled by the ring's length: each chunk's slot is a constant, and
        // with the pinned addresses every shared access is a register plus a
        // constant (f32 staging 252 -> 179 instructions a chunk, bf16 322 ->
        // 228: bench/RESULTS.md)
        static_assert(kWsRing == 4, "four steps a round");
        for (unsigned j = 0; !st.step(p, j, 0, chunks) && !st.step(p, j + 1, 1, chunks) &&
                             !st.step(p, j + 2, 2, chunks) && !st.step(p, j + 3, 3, chunks);
             j += kWsRing)
            ;
    }
}

// y of the sliced forward: (the slices' f32 sums + d x) silu(z), 4
// channels a thread (dim is a multiple of 32 there), in a grid-stride loop.
constexpr int kFinishThreads = 256;
template <typename T, bool Z> __global__ void __launch_bounds__(kFinishThreads) ssm_fwd_finish_kernel(const ScanParams p)
{
    const int64_t quads = (int64_t)p.batch * p.seqlen * p.dim / 4;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const T *x = static_cast<const T *>(p.x), *z = static_cast<const T *>(p.z);
    T *y = static_cast<T *>(p.y);
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < quads; q += stride) {
        const int64_t i = 4 * q;
        const int d = (int)(i % p.dim);
        float dskip[4];
#pragma unroll
        for (int v = 0; v < 4; v++)
            dskip[v] = p.d ? fx_load_any(p.d, p.d_type, d + v) : 0.0f;
        store_y4<T, Z>(y + i, *reinterpret_cast<const float4 *>(p.ysum + i), dskip, x + i, z + i);
    }
}

// The grid of a grid-stride loop over `items` (a thread each), at most 8
// blocks an SM.
inline int64_t finish_grid_of(int64_t items, int sm_count)
{
    const int64_t blocks = (items + kFinishThreads - 1) / kFinishThreads, most = (int64_t)sm_count * 8;
    return blocks < 1 ? 1 : blocks < most ? blocks : most;
}

// The sliced forward's second kernel, y from the sums: its grid.
inline int64_t finish_grid(const ScanParams &p, int sm_count)
{
    return finish_grid_of((int64_t)p.batch * p.seqlen * p.dim / 4, sm_count);
}

// ---- single step ----

// One group of LANES lanes per (batch, channel); a block's channels are
// of one batch element (step_grid), so that a lane finds its channel with
// one 32-bit division of the block's index instead of a 64-bit one of its
// own (on the path to the loads: the frame's latency). Every load is
// issued before the first store (the compiler cannot tell that the state
// does not alias the inputs, and would otherwise wait for each load in
// turn).
template <class C> __host__ __device__ inline unsigned step_row_blocks(int dim)
{
    constexpr int per_block = kThreads / C::LANES;
    return ((unsigned)dim + per_block - 1) / per_block;
}

template <typename T, class C>
__global__ void __launch_bounds__(kThreads) ssm_step_kernel(const StepParams p)
{
    constexpr int NPL = C::NPL;
    const int q = threadIdx.x % C::LANES;
    const unsigned row_blocks = step_row_blocks<C>(p.dim), b = blockIdx.x / row_blocks;
    const int d = (int)(blockIdx.x - b * row_blocks) * (kThreads / C::LANES) + (int)threadIdx.x / C::LANES;
    const bool ok = d < p.dim;
    const int64_t ch = (int64_t)b * p.dim + d; // b * dim + d
    const int64_t row = ((int64_t)b * p.groups + (p.groups == 1 ? 0 : d / p.cpg)) * p.dstate;
    const float x = ok ? ld<T>(p.x, ch) : 0.0f;
    const float u = ok ? ld<T>(p.dt, ch) + (p.dt_bias ? fx_load_any(p.dt_bias, p.bias_type, d) : 0.0f) : 0.0f;
    const float zv = ok && p.z ? ld<T>(p.z, ch) : 0.0f;
    const float dskip = ok && p.d ? fx_load_any(p.d, p.d_type, d) : 0.0f;
    float h[NPL], a2[NPL], bv[NPL], cv[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int n = state_of<C>(q, i);
        const bool nok = ok && n < p.dstate;
        h[i] = nok ? p.state[ch * p.dstate + n] : 0.0f;
        a2[i] = nok ? fx_load_any(p.a, p.a_type, (int64_t)d * p.dstate + n) * fx_log2e : 0.0f;
        bv[i] = nok ? ld<T>(p.b, row + n) : 0.0f;
        cv[i] = nok ? ld<T>(p.c, row + n) : 0.0f;
    }
    const float delta = ok ? (p.softplus ? softplus(u) : u) : 0.0f, dx = delta * x;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        h[i] = fmaf(fx_fast_exp2(delta * a2[i]), h[i], dx * bv[i]);
        acc = fmaf(cv[i], h[i], acc);
    }
#pragma unroll
    for (int i = 0; i < NPL; i++)
        if (ok && state_of<C>(q, i) < p.dstate)
            p.state[ch * p.dstate + state_of<C>(q, i)] = h[i];
    acc = lane_sum<C::LANES>(acc);
    if (ok && q == 0) {
        const float y = acc + dskip * x;
        static_cast<T *>(p.y)[ch] = fx_elem<T>::store(p.z ? y * silu(zv) : y);
    }
}

// ---- backward ----
//
// A block is BW warps over BW * WCH consecutive channels of one batch
// element and group; every warp runs on its own (as in the forward) except
// for one block barrier per chunk, where the warps add up their b and c
// gradients. Chunks of K = SAVE steps, last to first. Per chunk, per warp:
//   load       x, dt, z, dy, b, c of the chunk into the raw buffer and the
//              saved state entering the chunk into the warp's state slot
//              (cp.async a chunk ahead, as in the forward);
//   commit     per (step, channel) pair: delta, delta * x, dyp = dy silu(z)
//              for the scan lanes; x, dy silu'(z), softplus'(u) for the
//              epilogue; b, c rows to f32;
//   recompute  K steps forward from the saved state, the K states kept in
//              registers (one exp per state and step), reading b only;
//   adjoint    K steps backward: the decay again (a second exp: cheaper than
//              K more registers), g = c dyp + decay' g', the lane's parts of
//              c . h (the pre-gate output, for dz) and of the sums over
//              states of g decay h_prev a and g b (for ddt, dx) to shared
//              memory, da summed in registers, and the
//              gradients of b and c summed over the warp's channels by a
//              transposing butterfly (each lane ends with one sum);
//   epilogue   per pair: the parts summed, dx, ddt, dz written;
//   block      the warps' b and c gradients added, one vector atomic per
//              (step, 4 states) and block (a one-warp block's warp adds its
//              own from the adjoint, bwd_direct).
// Nothing of size [batch, seqlen, dim, dstate] exists: the states of a
// chunk live in registers.

// Whether the warps of a backward block add their b and c gradients to
// memory themselves, from the step loop, instead of through a block buffer
// and pass: where a block is one warp (its buffer took a quarter to a third
// of the block's shared memory). The plain path measured slower without
// the buffer only while it loaded b and c element by element
// (bench/RESULTS.md).
template <class C> constexpr bool bwd_direct() { return C::BW == 1; }

template <typename T, class C> struct BwdSmem {
    static constexpr int K = C::SAVE, WCH = C::WCH, NPAD = C::NPAD;
    static constexpr int words(int elems) { return (elems * (int)sizeof(T) + 15) / 16 * 4; }
    // per warp, in 4-byte words; raw inputs in the input type
    static constexpr int XR = 0, DTR = XR + words(K * WCH), ZR = DTR + words(K * WCH);
    static constexpr int DYR = ZR + words(K * WCH), BR = DYR + words(K * WCH);
    static constexpr int CR = BR + words(K * NPAD);
    static constexpr int INS = 4 * K + 4; // per channel: (delta, delta x, dyp, 0) per step
    static constexpr int IN = CR + words(K * NPAD);
    static constexpr int OWN = IN + WCH * INS; // [K][WCH] (x, dy silu'(z), softplus'(u), 0)
    static constexpr int B = OWN + 4 * K * WCH, CC = B + K * NPAD; // f32 [K][NPAD]
    static constexpr int PY = CC + K * NPAD;  // parts of c . h [K][32 lanes]
    static constexpr int PR = PY + 32 * K;    // parts of sum g decay h a, of sum g b [K][2][32]
    static constexpr int HS = PR + 64 * K;    // the state entering a chunk, copied a chunk ahead [32 lanes][NPL]
    static constexpr int WARP = HS + 32 * C::NPL;
    // per block after the warps: b and c gradients per warp [BW][K][2 * NPAD]
    // (none where bwd_direct)
    static constexpr int DBC = C::BW * WARP;
    static constexpr int WORDS = DBC + (bwd_direct<C>() ? 0 : C::BW * K * 2 * NPAD);
    static constexpr size_t BYTES = sizeof(float) * WORDS;
    static_assert(INS % 4 == 0, "float4 rows");
};

// Backward blocks an SM: the 12 warps its registers were tuned for (168 a
// thread), or fewer where the block's shared memory fits at most 8 warps on
// sm_90 (228 KB an SM, 1 KB of it the driver's per block: dstate <= 8 and
// > 128). An SM's registers are split between its 4 schedulers, so only
// there, at 2 warps a scheduler, do the missing warps' registers go to the
// others: at dstate 256 the kernel spilled at 168 (bench/RESULTS.md).
template <typename T, class C> constexpr int bwd_min_blocks()
{
    constexpr int fit = 228 * 1024 / (int)(BwdSmem<T, C>::BYTES + 1024);
    return fit * C::BW <= 8 ? cmax(1, fit) : 12 / C::BW;
}

template <typename T, class C> inline bool bwd_fast(const BwdParams &bp)
{
    typedef FwdCopy<T, C> K;
    const ScanParams &p = bp.f;
    return fwd_fast<T, C>(p) && p.cpg % (C::BW * C::WCH) == 0 &&
           (bp.dy == nullptr || (uintptr_t)bp.dy % K::UX == 0);
}

// A (step, channel) pair's gradient terms of the backward, for the kernel's
// epilogue and, sliced, ssm_bwd_finish_kernel. The gate's: dyp = dy
// silu(z), the gradient of y before the gate, and dyz = dy silu'(z).
__device__ __forceinline__ void gate_grads(float dy, float z, float &dyp, float &dyz)
{
    const float sz = sigmoid(z);
    dyp = dy * z * sz;
    dyz = dy * sz * fmaf(z, 1.0f - sz, 1.0f);
}

// dx, ddt, dz from the pair's sums over states (r_a = sum g decay h a
// log2(e), r_b = sum g b) and ypre = y before the gate; dsp = softplus'(u)
// (1 without softplus).
__device__ __forceinline__ void pair_grads(float r_a, float r_b, float ypre, float x, float delta, float dyp,
                                           float dyz, float dsp, float dskip, float &dx, float &ddt, float &dz)
{
    ddt = fmaf(r_a, fx_ln2, x * r_b) * dsp; // a was scaled by log2(e)
    dx = fmaf(delta, r_b, dskip * dyp);
    dz = ypre * dyz;
}

template <int N> __device__ __forceinline__ constexpr int log2i() { return N <= 1 ? 0 : 1 + log2i<N / 2>(); }

// SL: one slice of 16 states of a larger dstate (Cfg<4, 4>, FAST; see
// ssm_bwd_kernel); n_off its first state.
template <typename T, class C, bool FAST, bool SL = false> struct BwdStage {
    using S = BwdSmem<T, C>;
    typedef FwdCopy<T, C> K;
    static constexpr int KS = C::SAVE;
    static constexpr int E = (KS + C::LANES - 1) / C::LANES; // pairs per lane
    static constexpr int Q4 = C::NPAD / 4;
    int lane, cs, r0, ds, n_off;
    bool cs_ok;
    float bias, dskip;

    __device__ BwdStage(const ScanParams &p, const Tile &t, int lane_, int n_off_ = 0) : lane(lane_), n_off(n_off_)
    {
        cs = lane % C::WCH;
        r0 = lane / C::WCH;
        cs_ok = cs < t.nvalid;
        ds = t.d0 + cs;
        bias = cs_ok && p.dt_bias ? fx_load_any(p.dt_bias, p.bias_type, ds) : 0.0f;
        dskip = cs_ok && p.d ? fx_load_any(p.d, p.d_type, ds) : 0.0f;
    }

    __device__ __forceinline__ bool row_ok(const ScanParams &p, int t0, int k) const
    {
        const int tl = r0 + k * C::LANES;
        return cs_ok && tl < KS && t0 + tl < p.seqlen;
    }

    // The FAST copies of a chunk's rows of J inputs (those of bits of
    // OPTIONAL skipped when NULL), each row RB bytes in units of UB: unit u
    // (lanes take u = lane + 32k) is row u / (RB / UB); row_at(step) is a
    // step's first element in the inputs, `width` a row's elements in the
    // raw buffers. Rows past the end are zeros.
    template <int RB, int UB, unsigned OPTIONAL, int J, typename RowAt>
    __device__ __forceinline__ void copy_rows(T *const (&dst)[J], const T *const (&src)[J], int width, int t0,
                                              int seqlen, RowAt row_at) const
    {
        constexpr int PER_ROW = RB / UB, UNITS = KS * PER_ROW, EPU = UB / (int)sizeof(T);
#pragma unroll
        for (int k = 0; k < (UNITS + 31) / 32; k++) {
            const int u = lane + 32 * k, tl = u / PER_ROW, e = (u % PER_ROW) * EPU;
            const bool ok = t0 + tl < seqlen;
            const int64_t i = row_at(ok ? t0 + tl : 0) + e;
#pragma unroll
            for (int j = 0; j < J; j++)
                if ((UNITS % 32 == 0 || u < UNITS) && (!(OPTIONAL >> j & 1u) || src[j]))
                    fx_copy_async<UB>(dst[j] + tl * width + e, src[j] + i, ok);
        }
    }

    // As FwdStage::load, with dy as a fourth per-channel input.
    __device__ __forceinline__ void load(const BwdParams &bp, const Tile &t, int t0, float *sm)
    {
        const ScanParams &p = bp.f;
        T *raw[4] = {reinterpret_cast<T *>(sm + S::XR), reinterpret_cast<T *>(sm + S::DTR),
                     reinterpret_cast<T *>(sm + S::ZR), reinterpret_cast<T *>(sm + S::DYR)};
        const T *src[4] = {static_cast<const T *>(p.x), static_cast<const T *>(p.dt),
                           static_cast<const T *>(p.z), static_cast<const T *>(bp.dy)};
        T *rawbc[2] = {reinterpret_cast<T *>(sm + S::BR), reinterpret_cast<T *>(sm + S::CR)};
        const T *srcbc[2] = {static_cast<const T *>(p.b), static_cast<const T *>(p.c)};
        if constexpr (FAST && K::POSSIBLE) { // (bwd_fast is false when not POSSIBLE)
            copy_rows<K::RX, K::UX, 1u << 2>(raw, src, C::WCH, t0, p.seqlen, // z may be NULL
                                             [&](int step) { return at_btd(p, t.b, step, t.d0); });
            copy_rows<K::RB, K::UB, 0u>(rawbc, srcbc, C::NPAD, t0, p.seqlen, [&](int step) {
                return at_btg(p, t.b, step, t.g) + (SL ? n_off : 0);
            });
        } else {
#pragma unroll
            for (int k = 0; k < E; k++) {
                const int tl = r0 + k * C::LANES;
                if (tl >= KS)
                    continue;
                const bool ok = row_ok(p, t0, k);
                const int64_t i = ok ? at_btd(p, t.b, t0 + tl, ds) : 0;
#pragma unroll
                for (int j = 0; j < 4; j++)
                    raw[j][tl * C::WCH + cs] = ok && src[j] ? src[j][i] : T(0.0f);
            }
            load_bc_rows<T, C::NPAD, KS>(p, t, t0, lane, rawbc[0], rawbc[1]);
        }
    }

    // Steps past the end and channels past the group: delta = 0 and dy = 0,
    // so the state and g pass through them unchanged and add nothing. The
    // options are tested once per chunk (the pairs' exps interleave).
    __device__ __forceinline__ void commit(const ScanParams &p, int t0, float *sm)
    {
        const T *rx = reinterpret_cast<const T *>(sm + S::XR), *rdt = reinterpret_cast<const T *>(sm + S::DTR);
        const T *rz = reinterpret_cast<const T *>(sm + S::ZR), *rdy = reinterpret_cast<const T *>(sm + S::DYR);
        float x[E], u[E], dy[E], delta[E], dsp[E], dyp[E], dyz[E];
#pragma unroll
        for (int k = 0; k < E; k++) {
            const int at = cmin(r0 + k * C::LANES, KS - 1) * C::WCH + cs; // rows past KS: not used
            x[k] = fx_elem<T>::load(rx[at]);
            u[k] = fx_elem<T>::load(rdt[at]) + bias;
            dy[k] = row_ok(p, t0, k) ? fx_elem<T>::load(rdy[at]) : 0.0f;
            delta[k] = u[k], dsp[k] = 1.0f, dyp[k] = dy[k], dyz[k] = 0.0f;
        }
        if (p.softplus) {
#pragma unroll
            for (int k = 0; k < E; k++)
                softplus_and_grad(u[k], delta[k], dsp[k]);
        }
        if (p.z) {
#pragma unroll
            for (int k = 0; k < E; k++)
                gate_grads(dy[k], fx_elem<T>::load(rz[cmin(r0 + k * C::LANES, KS - 1) * C::WCH + cs]), dyp[k], dyz[k]);
        }
#pragma unroll
        for (int k = 0; k < E; k++) {
            const int tl = r0 + k * C::LANES;
            if (tl >= KS)
                continue;
            const float dk = row_ok(p, t0, k) ? delta[k] : 0.0f;
            *reinterpret_cast<float4 *>(sm + S::IN + cs * S::INS + 4 * tl) = make_float4(dk, dk * x[k], dyp[k], 0.0f);
            if constexpr (!SL) // (sliced, the epilogue's terms are taken after every slice)
                *reinterpret_cast<float4 *>(sm + S::OWN + 4 * (tl * C::WCH + cs)) = make_float4(x[k], dyz[k], dsp[k], 0.0f);
        }
        typedef typename Quad<T>::raw Raw;
        const Raw *rb = reinterpret_cast<const Raw *>(sm + S::BR), *rc = reinterpret_cast<const Raw *>(sm + S::CR);
#pragma unroll
        for (int k = 0; k < (KS * Q4 + 31) / 32; k++) {
            const int s = lane + 32 * k;
            if ((KS * Q4) % 32 == 0 || s < KS * Q4) {
                *reinterpret_cast<float4 *>(sm + S::B + 4 * s) = Quad<T>::to_float(rb[s]);
                *reinterpret_cast<float4 *>(sm + S::CC + 4 * s) = Quad<T>::to_float(rc[s]);
            }
        }
    }

    // dx, ddt, dz of the chunk's pairs from the lanes' parts; the sums of
    // dyp x (dd) and ddt (ddt_bias) of this lane's pairs into acc.
    __device__ __forceinline__ void epilogue(const BwdParams &bp, const Tile &t, int t0, const float *sm,
                                             float &acc_d, float &acc_bias)
    {
        const ScanParams &p = bp.f;
        // row r0 of the chunk; the lane's later rows are LANES rows apart
        const int64_t base = at_btd(p, t.b, min(t0 + r0, p.seqlen - 1), ds);
        T *dx = static_cast<T *>(bp.dx) + base, *ddt_out = static_cast<T *>(bp.ddt) + base;
        T *dz = bp.dz ? static_cast<T *>(bp.dz) + base : nullptr;
#pragma unroll
        for (int k = 0; k < E; k++) {
            const int tl = r0 + k * C::LANES;
            if (!row_ok(p, t0, k))
                continue;
            const int at = tl * C::WCH + cs;
            const int64_t off = (int64_t)(k * C::LANES) * p.dim;
            const float4 in = lds_whole(sm + S::IN + cs * S::INS + 4 * tl);
            const float4 own = *reinterpret_cast<const float4 *>(sm + S::OWN + 4 * at);
            const float ypre = sum_parts<C::LANES>(sm + S::PY + at * C::LANES) + dskip * own.x;
            const float *pr = sm + S::PR + tl * 64 + cs * C::LANES;
            const float r_a = sum_parts<C::LANES>(pr), r_b = sum_parts<C::LANES>(pr + 32);
            float gx, ddt, gz;
            pair_grads(r_a, r_b, ypre, own.x, in.x, in.z, own.y, own.z, dskip, gx, ddt, gz);
            dx[off] = fx_elem<T>::store(gx);
            ddt_out[off] = fx_elem<T>::store(ddt);
            if (dz)
                dz[off] = fx_elem<T>::store(gz);
            acc_d = fmaf(in.z, own.x, acc_d);
            acc_bias += ddt;
        }
    }

    // Sliced: the slice's parts of the chunk's per-channel sums (y before d
    // x and the gate, sum g decay h a, sum g b) added into bp.parts, a lane
    // a step and 4 channels (one vector atomic each); dx, ddt, dz come from
    // the totals (ssm_bwd_finish_kernel).
    __device__ __forceinline__ void epilogue_sliced(const BwdParams &bp, const Tile &t, int t0, const float *sm) const
    {
        static_assert(KS * C::WCH == 4 * 32 && C::LANES == 4, "a lane a step and 4 channels");
        const ScanParams &p = bp.f;
        const int s = lane / (C::WCH / 4), c0 = 4 * (lane % (C::WCH / 4));
        if (t0 + s >= p.seqlen)
            return;
        const float *from[3] = {sm + S::PY + s * 32, sm + S::PR + s * 64, sm + S::PR + s * 64 + 32};
        const int64_t n = (int64_t)p.batch * p.seqlen * p.dim, at = at_btd(p, t.b, t0 + s, t.d0 + c0);
#pragma unroll
        for (int m = 0; m < 3; m++) {
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) { // channel c0 + j's 4 lanes' parts
                const float4 q = *reinterpret_cast<const float4 *>(from[m] + 4 * (c0 + j));
                v[j] = (q.x + q.y) + (q.z + q.w);
            }
            red_add4(bp.parts + m * n + at, make_float4(v[0], v[1], v[2], v[3]));
        }
    }
};

// Adds 4 gradient sums at `dst` (n0..n0+3 of a row of dstate).
__device__ __forceinline__ void add4(float *dst, int n0, int dstate, float4 v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (dstate % 4 == 0) { // row starts are 16-byte aligned: one vector atomic
        red_add4(dst, v);
        return;
    }
#endif
    float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (n0 + i < dstate)
            atomicAdd(dst + i, e[i]);
}

// SL: a block is one slice of 16 states of a larger dstate (C = Cfg<4, 4>,
// FAST; grid: tiles x slices, neighbouring blocks a tile's slices), as in
// the sliced forward, which saved the states every KS steps for it
// (save_interval_of). Its per-channel sums go to bp.parts, and
// ssm_bwd_finish_kernel makes dx, ddt, dz, dd and ddt_bias from them.
template <typename T, class C, bool FAST, bool SL = false>
__global__ void __launch_bounds__(C::BW * 32, bwd_min_blocks<T, C>()) ssm_bwd_kernel(const BwdParams bp)
{
    using S = BwdSmem<T, C>;
    constexpr int NPL = C::NPL, KS = C::SAVE, LO = log2i<C::LANES>();
    constexpr bool DIRECT = bwd_direct<C>();
    static_assert(!SL || (FAST && C::NPAD == kWsStates && !DIRECT), "slices of 16 states on the FAST path");
    const ScanParams &p = bp.f;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *sm = block_smem() + warp * S::WARP;
    float *dbc = block_smem() + S::DBC;
    const int slices = SL ? p.dstate / kWsStates : 1;
    const int n_off = SL ? kWsStates * ((int)blockIdx.x % slices) : 0; // the slice's first state
    Tile tile = tile_at(p, SL ? (int)blockIdx.x / slices : (int)blockIdx.x, C::BW * C::WCH);
    tile.d0 += warp * C::WCH;
    tile.nvalid = max(0, min(C::WCH, tile.nvalid - warp * C::WCH));
    const int c = lane / C::LANES, q = lane % C::LANES, d = tile.d0 + c;
    const bool ok = c < tile.nvalid;

    float a2[NPL], gs[NPL];
    double sum_a[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int n = n_off + state_of<C>(q, i);
        const bool nok = ok && n < p.dstate;
        a2[i] = nok ? fx_load_any(p.a, p.a_type, (int64_t)d * p.dstate + n) * fx_log2e : 0.0f;
        // dL/dh entering the last step from after it: the final state's gradient
        gs[i] = nok && bp.dstate ? fx_load_any(bp.dstate, bp.dstate_type, at_state(p, tile.b, d) + n) : 0.0f;
        sum_a[i] = 0.0;
    }
    double sum_d = 0.0, sum_bias = 0.0;
    BwdStage<T, C, FAST, SL> stage(p, tile, lane, n_off);

    // The state entering chunk k (h0 or zeros for the first, else saved)
    // into the lane's slot of shared memory, where the chunk reads it: a
    // saved one copied with the chunk's inputs (16 bytes a copy where every
    // state is valid, FAST), so that no register holds it while it travels
    // (the kernel is at its register cap); h0 loaded at once.
    float *hslot = sm + S::HS + lane * NPL;
    auto stage_state = [&](int k) {
        if (k > 0) {
            const float *src = p.saved + (((int64_t)tile.b * p.nsaved + k - 1) * p.dim + d) * p.dstate + n_off + 4 * q;
            if constexpr (FAST) {
#pragma unroll
                for (int i = 0; i < NPL; i += 4)
                    fx_copy_async<16>(hslot + i, ok ? src + quad_offset<C>(i) : p.saved, ok);
            } else {
#pragma unroll
                for (int i = 0; i < NPL; i++) {
                    const bool nok = ok && state_of<C>(q, i) < p.dstate;
                    fx_copy_async<4>(hslot + i, nok ? src + quad_offset<C>(i) : p.saved, nok);
                }
            }
            return;
        }
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            const int n = n_off + state_of<C>(q, i);
            hslot[i] = ok && n < p.dstate && p.h0 ? fx_load_any(p.h0, p.h0_type, at_state(p, tile.b, d) + n) : 0.0f;
        }
    };

    const int chunks = (p.seqlen + KS - 1) / KS;
    if (chunks > 0) {
        stage_state(chunks - 1);
        stage.load(bp, tile, (chunks - 1) * KS, sm);
    }
    for (int k = chunks - 1; k >= 0; k--) {
        const int t0 = k * KS;
        float h[NPL], hs[KS][NPL];
        fx_copy_wait_all();
        __syncwarp(); // the chunk's raw inputs and state are in; the last chunk's parts are read
        lds(h, hslot);
        stage.commit(p, t0, sm);
        __syncwarp(); // staged; the raw buffer and the state's slot are free
        if (k > 0) {
            stage_state(k - 1);
            stage.load(bp, tile, t0 - KS, sm); // lands during this chunk
        }

        // recompute: the chunk's states (a step's operands are read before
        // the previous step's store, as in fwd_scan). Only `b` is read here:
        // each lane's part of c . h is taken in the adjoint, which reads `c`
        // anyway (shared memory's data path is the backward's busiest unit).
        const float *in_row = sm + S::IN + c * S::INS, *b_row = sm + S::B + 4 * q, *c_row = sm + S::CC + 4 * q;
        {
            float2 in = *reinterpret_cast<const float2 *>(in_row);
            float bv[NPL];
            lds_states<C>(bv, b_row);
#pragma unroll
            for (int s = 0; s < KS; s++) {
                float2 inn = in;
                float bn[NPL] = {}; // (set where it is used: g++ cannot tell)
                if (s + 1 < KS) {
                    inn = *reinterpret_cast<const float2 *>(in_row + 4 * (s + 1));
                    lds_states<C>(bn, b_row + (s + 1) * C::NPAD);
                }
#pragma unroll
                for (int i = 0; i < NPL; i++)
                    hs[s][i] = fmaf(fx_fast_exp2(in.x * a2[i]), s > 0 ? hs[s - 1][i] : h[i], in.y * bv[i]);
                if (s + 1 < KS) {
                    in = inn;
#pragma unroll
                    for (int i = 0; i < NPL; i++)
                        bv[i] = bn[i];
                }
            }
        }

        // adjoint, last step first
        float acc_a[NPL];
#pragma unroll
        for (int i = 0; i < NPL; i++)
            acc_a[i] = 0.0f;
        {
            float4 in = lds_three(in_row + 4 * (KS - 1));
            float bv[NPL], cv[NPL];
            lds_states<C>(bv, b_row + (KS - 1) * C::NPAD);
            lds_states<C>(cv, c_row + (KS - 1) * C::NPAD);
#pragma unroll
            for (int s = KS - 1; s >= 0; s--) {
                float4 inn = in;
                float bn[NPL], cn[NPL];
                if (s > 0) {
                    inn = lds_three(in_row + 4 * (s - 1));
                    lds_states<C>(bn, b_row + (s - 1) * C::NPAD);
                    lds_states<C>(cn, c_row + (s - 1) * C::NPAD);
                }
                float r_a = 0.0f, r_b = 0.0f, yp = 0.0f, pbc[2 * NPL];
#pragma unroll
                for (int i = 0; i < NPL; i++) {
                    yp = fmaf(cv[i], hs[s][i], yp);
                    const float decay = fx_fast_exp2(in.x * a2[i]);
                    const float prev = s > 0 ? hs[s - 1][i] : h[i];
                    const float g = fmaf(cv[i], in.z, gs[i]); // dL/dh_t
                    const float pr = g * (decay * prev);
                    acc_a[i] = fmaf(pr, in.x, acc_a[i]);
                    r_a = fmaf(pr, a2[i], r_a);
                    r_b = fmaf(g, bv[i], r_b);
                    pbc[i] = g * in.y;             // db: g delta x
                    pbc[NPL + i] = in.z * hs[s][i]; // dc: dyp h
                    gs[i] = decay * g;             // dL/dh_{t-1} through h_t
                }
                sm[S::PY + s * 32 + lane] = yp;
                sm[S::PR + s * 64 + lane] = r_a;
                sm[S::PR + s * 64 + 32 + lane] = r_b;
                // over the warp's channels (lane bits LO..4)
                const int first = fx_warp::transpose_sum<2 * NPL, LO>(pbc, lane);
                constexpr int CNT = (2 * NPL) >> (5 - LO) > 0 ? (2 * NPL) >> (5 - LO) : 1;
                if constexpr (!DIRECT) { // the warp's part of the block's buffer
                    float *dbc_out = dbc + (warp * KS + s) * 2 * C::NPAD;
#pragma unroll
                    for (int j = 0; j < CNT; j++) {
                        const int o = first + j; // which * NPL + i
                        dbc_out[(o / NPL) * C::NPAD + state_of<C>(q, o % NPL)] = pbc[j];
                    }
                } else if (t0 + s < p.seqlen) { // already the block's sums: to memory
                    static_assert(CNT % 4 == 0 && NPL % 4 == 0, "whole quads of one gradient");
#pragma unroll
                    for (int j = 0; j < CNT; j += 4) {
                        const int o = first + j, n0 = state_of<C>(q, o % NPL);
                        float *acc = o / NPL == 0 ? bp.acc_db : bp.acc_dc;
                        if (n0 < p.dstate)
                            add4(acc + at_btg(p, tile.b, t0 + s, tile.g) + n0, n0, p.dstate,
                                 make_float4(pbc[j], pbc[j + 1], pbc[j + 2], pbc[j + 3]));
                    }
                }
                if (s > 0) {
                    in = inn;
#pragma unroll
                    for (int i = 0; i < NPL; i++)
                        bv[i] = bn[i], cv[i] = cn[i];
                }
            }
        }
#pragma unroll
        for (int i = 0; i < NPL; i++)
            sum_a[i] += acc_a[i];
        __syncwarp(); // the parts are written
        if constexpr (SL) {
            stage.epilogue_sliced(bp, tile, t0, sm);
        } else {
            float acc_d = 0.0f, acc_bias = 0.0f;
            stage.epilogue(bp, tile, t0, sm, acc_d, acc_bias);
            sum_d += acc_d;
            sum_bias += acc_bias;
        }

        // the block's b and c gradients: the warps' sums added, one vector
        // atomic per (step, 4 states)
        if constexpr (!DIRECT) {
            __syncthreads();
            const float *src = dbc;
            constexpr int QUADS = KS * 2 * C::NPAD / 4;
            for (int e = threadIdx.x; e < QUADS; e += C::BW * 32) {
                const int tl = e / (2 * C::NPAD / 4), rest = e % (2 * C::NPAD / 4);
                const int which = rest / (C::NPAD / 4), n0 = (rest % (C::NPAD / 4)) * 4;
                if (t0 + tl >= p.seqlen || n0 >= p.dstate)
                    continue;
                float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int w = 0; w < C::BW; w++) {
                    const float4 v = *reinterpret_cast<const float4 *>(src + (w * KS + tl) * 2 * C::NPAD + 4 * rest);
                    sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
                }
                float *acc = which == 0 ? bp.acc_db : bp.acc_dc;
                add4(acc + at_btg(p, tile.b, t0 + tl, tile.g) + n_off + n0, n0, p.dstate, sum);
            }
            __syncthreads(); // the buffer is read
        }
    }

    if (ok) {
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            const int n = n_off + state_of<C>(q, i);
            if (n >= p.dstate)
                continue;
            atomicAdd(bp.acc_da + (int64_t)d * p.dstate + n, (float)sum_a[i]);
            if (bp.dh0) // after step 0, gs is dL/dh0
                fx_store_any(bp.dh0, bp.dh0_type, at_state(p, tile.b, d) + n, gs[i]);
        }
    }
    // dd and ddt_bias (sliced: ssm_bwd_finish_kernel's): the lanes of one
    // staging channel hold its rows' sums
    if constexpr (!SL) {
        float fd = (float)sum_d, fb = (float)sum_bias;
#pragma unroll
        for (int m = C::WCH; m < 32; m *= 2) {
            fd += __shfl_xor_sync(kFullMask, fd, m);
            fb += __shfl_xor_sync(kFullMask, fb, m);
        }
        if (stage.cs_ok && stage.r0 == 0) {
            if (p.d)
                atomicAdd(bp.acc_dd + stage.ds, fd);
            if (p.dt_bias)
                atomicAdd(bp.acc_dbias + stage.ds, fb);
        }
    }
}

// The sliced backward's per-channel gradients from its slices' sums
// (bp.parts): dx, ddt, dz, and the sums of dd and ddt_bias; a thread takes
// 4 channels of kBwdFinishRows (batch, step) rows, in a grid-stride loop.
// The per-pair terms are ssm_bwd_kernel's (gate_grads, pair_grads).
constexpr int kBwdFinishRows = 16;
template <typename T> __global__ void __launch_bounds__(kFinishThreads) ssm_bwd_finish_kernel(const BwdParams bp)
{
    const ScanParams &p = bp.f;
    const int quads = p.dim / 4;
    const int64_t rows = (int64_t)p.batch * p.seqlen, n = rows * p.dim;
    const int64_t items = quads * ((rows + kBwdFinishRows - 1) / kBwdFinishRows);
    const T *xs = static_cast<const T *>(p.x), *dts = static_cast<const T *>(p.dt);
    const T *zs = static_cast<const T *>(p.z), *dys = static_cast<const T *>(bp.dy);
    for (int64_t item = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; item < items;
         item += (int64_t)gridDim.x * blockDim.x) {
        const int d = 4 * (int)(item % quads);
        const int64_t r0 = item / quads * kBwdFinishRows, r1 = min(r0 + kBwdFinishRows, rows);
        float bias[4], dskip[4], acc_d[4] = {}, acc_bias[4] = {};
#pragma unroll
        for (int v = 0; v < 4; v++) {
            bias[v] = p.dt_bias ? fx_load_any(p.dt_bias, p.bias_type, d + v) : 0.0f;
            dskip[v] = p.d ? fx_load_any(p.d, p.d_type, d + v) : 0.0f;
        }
        for (int64_t r = r0; r < r1; r++) {
            const int64_t i = r * p.dim + d;
            float x[4], u[4], dy[4], z[4] = {}, dx[4], ddt[4], dz[4];
            ld_vec<T, 4>(x, xs + i);
            ld_vec<T, 4>(u, dts + i);
            ld_vec<T, 4>(dy, dys + i);
            if (zs)
                ld_vec<T, 4>(z, zs + i);
            const float4 y4 = *reinterpret_cast<const float4 *>(bp.parts + i);
            const float4 ra4 = *reinterpret_cast<const float4 *>(bp.parts + n + i);
            const float4 rb4 = *reinterpret_cast<const float4 *>(bp.parts + 2 * n + i);
            const float ys[4] = {y4.x, y4.y, y4.z, y4.w}, ra[4] = {ra4.x, ra4.y, ra4.z, ra4.w};
            const float rb[4] = {rb4.x, rb4.y, rb4.z, rb4.w};
#pragma unroll
            for (int v = 0; v < 4; v++) {
                float delta = u[v] + bias[v], dsp = 1.0f, dyp = dy[v], dyz = 0.0f;
                if (p.softplus)
                    softplus_and_grad(u[v] + bias[v], delta, dsp);
                if (zs)
                    gate_grads(dy[v], z[v], dyp, dyz);
                pair_grads(ra[v], rb[v], ys[v] + dskip[v] * x[v], x[v], delta, dyp, dyz, dsp, dskip[v], dx[v], ddt[v],
                           dz[v]);
                acc_d[v] = fmaf(dyp, x[v], acc_d[v]);
                acc_bias[v] += ddt[v];
            }
            st_vec<T, 4>(static_cast<T *>(bp.dx) + i, dx);
            st_vec<T, 4>(static_cast<T *>(bp.ddt) + i, ddt);
            if (bp.dz)
                st_vec<T, 4>(static_cast<T *>(bp.dz) + i, dz);
        }
#pragma unroll
        for (int v = 0; v < 4; v++) {
            if (p.d)
                atomicAdd(bp.acc_dd + d + v, acc_d[v]);
            if (p.dt_bias)
                atomicAdd(bp.acc_dbias + d + v, acc_bias[v]);
        }
    }
}

inline int64_t bwd_finish_grid(const ScanParams &p, int sm_count)
{
    const int64_t rows = (int64_t)p.batch * p.seqlen;
    return finish_grid_of((int64_t)(p.dim / 4) * ((rows + kBwdFinishRows - 1) / kBwdFinishRows), sm_count);
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
// shape, as the launcher (ssm.cu) and the CPU emulator (tools/ssm_emu) both
// use them.
struct FwdLaunch {
    ScanParams p;
    FwdKernel kernel;
    int warps;
    size_t smem;
    int64_t grid;
    bool realign; // the sliced kernel is required and a row does not start on 16 bytes
};

// WS_SLICED: the f32 sums of y the launcher provides (p.ysum, zeroed), in floats.
inline int64_t ysum_floats(const ScanParams &p) { return (int64_t)p.batch * p.seqlen * p.dim; }

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

// One f32 scratch for the summed gradients: [db][dc][da][dd][ddt_bias]
// (db first so that its rows are 16-byte aligned for vector atomics).
// Sliced, the per-channel sums over states come first:
// [parts (3 x batch * seqlen * dim)][db]... (dim a multiple of 32 there, so
// that db's rows stay 16-byte aligned).
struct BwdScratch {
    int64_t n_parts, n_bc, n_a, n_d, total;
    explicit BwdScratch(const fx_ssm_dims &n, bool sliced = false)
    {
        n_parts = sliced ? 3 * n.batch * n.seqlen * n.dim : 0;
        n_bc = n.batch * n.seqlen * n.groups * n.dstate;
        n_a = n.dim * n.dstate;
        n_d = n.dim;
        total = n_parts + 2 * n_bc + n_a + 2 * n_d;
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
    return p.dim > 0 ? (int64_t)p.batch * step_row_blocks<C>(p.dim) : 0;
}

// `scratch`: BwdScratch::total zeroed floats.
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
    bp.acc_dc = bp.acc_db + sz.n_bc;
    bp.acc_da = bp.acc_dc + sz.n_bc;
    bp.acc_dd = bp.acc_da + sz.n_a;
    bp.acc_dbias = bp.acc_dd + sz.n_d;
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

// The f32 sums of bwd_params, as written out to the gradients asked for.
inline fx_sum_regions bwd_sums(const fx_ssm_bwd_args *a, const BwdParams &bp, const BwdScratch &sz)
{
    fx_sum_regions s = {};
    s.add(bp.acc_db, a->db, sz.n_bc);
    s.add(bp.acc_dc, a->dc, sz.n_bc);
    s.add(bp.acc_da, a->da, sz.n_a);
    s.add(bp.acc_dd, a->dd, sz.n_d);
    s.add(bp.acc_dbias, a->ddt_bias, sz.n_d);
    return s;
}

} // namespace fx_ssm

#endif
